"""Blind catalogue 2: wrong answers to chapter 16's exercises (written from the book only)."""
# ruff: noqa: E501  (one wrong answer per line in WRONG_ANSWERS)

import math

import torch
import torch.nn.functional as F


# 16.1 sft_labels --------------------------------------------------------------

def labels_marker_labelled(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [role_ids[role], *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_no_end(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, -100]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_shifted(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels[1:] + [-100]


def labels_every_turn(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        labels += [-100, *content, end_id]
    return labels


def labels_zero_ignore(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [0, *content, end_id]
        else:
            labels += [0] * (len(content) + 2)
    return labels


def labels_short_user(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 1)
    return labels


# 16.2 sft_loss ---------------------------------------------------------------

def loss_no_shift(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                           ignore_index=-100)


def loss_reverse_shift(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, 1:].reshape(-1, V),
                           labels[:, :-1].reshape(-1), ignore_index=-100)


def loss_per_row_mean(logits, labels):
    rows = []
    for b in range(logits.shape[0]):
        rows.append(F.cross_entropy(logits[b, :-1], labels[b, 1:],
                                    ignore_index=-100))
    return torch.stack(rows).mean()


def loss_sum(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V),
                           labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")


def loss_item(logits, labels):
    V = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V),
                           labels[:, 1:].reshape(-1), ignore_index=-100)
    return torch.tensor(loss.item())


def loss_mean_over_all_positions(logits, labels):
    V = logits.shape[-1]
    per = F.cross_entropy(logits[:, :-1].reshape(-1, V),
                          labels[:, 1:].reshape(-1), ignore_index=-100,
                          reduction="none")
    return per.mean()


# 16.3 lora_forward -----------------------------------------------------------

def forward_scale_alpha(x, weight, A, B, alpha):
    return x @ weight.T + alpha * (x @ A.T @ B.T)


def forward_scale_r_over_alpha(x, weight, A, B, alpha):
    return x @ weight.T + (A.shape[0] / alpha) * (x @ A.T @ B.T)


def forward_no_base(x, weight, A, B, alpha):
    return (alpha / A.shape[0]) * (x @ A.T @ B.T)


def forward_no_transpose(x, weight, A, B, alpha):
    return x @ weight + (alpha / A.shape[0]) * (x @ A.T @ B.T)


def forward_int_division(x, weight, A, B, alpha):
    return x @ weight.T + (alpha // A.shape[0]) * (x @ A.T @ B.T)


def forward_inplace_weight(x, weight, A, B, alpha):
    weight += (alpha / A.shape[0]) * (B @ A)
    return x @ weight.T


# 16.4 lora_merge -------------------------------------------------------------

def merge_no_scale(weight, A, B, alpha):
    return weight + B @ A


def merge_transposed(weight, A, B, alpha):
    return weight + (alpha / A.shape[0]) * (B @ A).T


def merge_inplace(weight, A, B, alpha):
    weight.add_((alpha / A.shape[0]) * (B @ A))
    return weight


def merge_rank_from_B_rows(weight, A, B, alpha):
    return weight + (alpha / B.shape[0]) * (B @ A)


def merge_delta_only(weight, A, B, alpha):
    return (alpha / A.shape[0]) * (B @ A)


def merge_alpha_times_r(weight, A, B, alpha):
    return weight + (alpha * A.shape[0]) * (B @ A)


# 16.5 lora_init --------------------------------------------------------------

def init_swapped(in_features, out_features, r, generator):
    A = torch.zeros(r, in_features)
    B = torch.randn(out_features, r, generator=generator) / math.sqrt(r)
    return A, B


def init_both_random(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.randn(out_features, r, generator=generator) / math.sqrt(r)
    return A, B


def init_no_scale(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator)
    return A, torch.zeros(out_features, r)


def init_divide_by_in(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / in_features
    return A, torch.zeros(out_features, r)


def init_transposed_shapes(in_features, out_features, r, generator):
    A = torch.randn(in_features, r, generator=generator) / math.sqrt(in_features)
    return A, torch.zeros(r, out_features)


def init_no_generator(in_features, out_features, r, generator):
    A = torch.randn(r, in_features) / math.sqrt(in_features)
    return A, torch.zeros(out_features, r)


# 16.6 lora_parameter_count ---------------------------------------------------

def count_product(shapes, r):
    return sum(r * d_in * d_out for d_out, d_in in shapes)


def count_A_only(shapes, r):
    return sum(r * d_in for d_out, d_in in shapes)


def count_first_layer(shapes, r):
    d_out, d_in = shapes[0]
    return r * (d_in + d_out)


def count_plus_scale(shapes, r):
    return sum(r * (d_in + d_out) + 1 for d_out, d_in in shapes)


def count_with_base(shapes, r):
    return sum(d_in * d_out + r * (d_in + d_out) for d_out, d_in in shapes)


def count_square(shapes, r):
    return sum(2 * r * d_in for d_out, d_in in shapes)


WRONG_ANSWERS = [
    ("16.1", "check_sft_labels", "labels the assistant's role marker too", labels_marker_labelled),
    ("16.1", "check_sft_labels", "leaves the end-of-turn token unlabelled", labels_no_end),
    ("16.1", "check_sft_labels", "shifts the labels by one itself", labels_shifted),
    ("16.1", "check_sft_labels", "labels every turn's content, user's too", labels_every_turn),
    ("16.1", "check_sft_labels", "uses 0 instead of -100 for ignored tokens", labels_zero_ignore),
    ("16.1", "check_sft_labels", "non-assistant turns one label short (forgets marker or end)", labels_short_user),
    ("16.2", "check_sft_loss", "no shift: logits scored on the same position's label", loss_no_shift),
    ("16.2", "check_sft_loss", "shift in the wrong direction", loss_reverse_shift),
    ("16.2", "check_sft_loss", "mean per row, then mean of rows", loss_per_row_mean),
    ("16.2", "check_sft_loss", "sum instead of mean", loss_sum),
    ("16.2", "check_sft_loss", "gradient cut by .item()", loss_item),
    ("16.2", "check_sft_loss", "mean over all positions, ignored ones counted as 0", loss_mean_over_all_positions),
    ("16.3", "check_lora_forward", "scale alpha instead of alpha / r", forward_scale_alpha),
    ("16.3", "check_lora_forward", "scale r / alpha", forward_scale_r_over_alpha),
    ("16.3", "check_lora_forward", "forgets the frozen layer's output", forward_no_base),
    ("16.3", "check_lora_forward", "x @ weight without transpose", forward_no_transpose),
    ("16.3", "check_lora_forward", "integer division alpha // r", forward_int_division),
    ("16.3", "check_lora_forward", "adds the change into weight in place", forward_inplace_weight),
    ("16.4", "check_lora_merge", "forgets the alpha / r scale", merge_no_scale),
    ("16.4", "check_lora_merge", "adds the transposed change (A^T B^T)", merge_transposed),
    ("16.4", "check_lora_merge", "changes weight in place", merge_inplace),
    ("16.4", "check_lora_merge", "takes r from B.shape[0]", merge_rank_from_B_rows),
    ("16.4", "check_lora_merge", "returns only the change, not weight + change", merge_delta_only),
    ("16.4", "check_lora_merge", "scale alpha * r", merge_alpha_times_r),
    ("16.5", "check_lora_init", "A zero and B random (swapped)", init_swapped),
    ("16.5", "check_lora_init", "both random", init_both_random),
    ("16.5", "check_lora_init", "forgets to divide by sqrt(in_features)", init_no_scale),
    ("16.5", "check_lora_init", "divides by in_features, not its square root", init_divide_by_in),
    ("16.5", "check_lora_init", "transposed shapes: A (in, r), B (r, out)", init_transposed_shapes),
    ("16.5", "check_lora_init", "ignores the generator", init_no_generator),
    ("16.6", "check_lora_parameter_count", "r * d_in * d_out", count_product),
    ("16.6", "check_lora_parameter_count", "counts A only", count_A_only),
    ("16.6", "check_lora_parameter_count", "counts only the first layer", count_first_layer),
    ("16.6", "check_lora_parameter_count", "counts a trainable scale per layer", count_plus_scale),
    ("16.6", "check_lora_parameter_count", "counts the frozen weight too", count_with_base),
    ("16.6", "check_lora_parameter_count", "assumes square layers: 2 r d_in", count_square),
]
