"""Wrong answers to the exercises of chapter 16 (instruction tuning), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# 16.1  my_sft_labels(turns, role_ids, end_id)
# ---------------------------------------------------------------------------


def labels_marker_labelled(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":          # the whole turn, marker included
            labels += [role_ids[role], *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_end_not_labelled(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":          # only the content
            labels += [-100, *content, -100]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_every_token(turns, role_ids, end_id):
    labels = []                          # no loss mask at all
    for role, content in turns:
        labels += [role_ids[role], *content, end_id]
    return labels


def labels_shifted(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels[1:] + [-100]           # shifted here already


def labels_non_user_labelled(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role != "user":               # system turns trained too
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_last_turn_only(turns, role_ids, end_id):
    labels = []
    last = max(k for k, (role, _) in enumerate(turns) if role == "assistant") \
        if any(role == "assistant" for role, _ in turns) else -1
    for k, (role, content) in enumerate(turns):
        if k == last:                    # only the final answer
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_marker_forgotten_in_other_turns(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 1)   # forgot the marker
    return labels


def labels_ignore_minus_one(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-1, *content, end_id]
        else:
            labels += [-1] * (len(content) + 2)
    return labels


def labels_first_content_token_masked(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":          # off by one at the start
            labels += [-100, -100, *content[1:], end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_hard_coded_ids(turns, role_ids, end_id):
    # the ids printed in the chapter, <|end|> = 605, instead of the arguments
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, 605]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_mutates_turns(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        content.append(end_id)           # changes the caller's lists
        if role == "assistant":
            labels += [-100, *content]
        else:
            labels += [-100] * (len(content) + 1)
    return labels


def labels_role_by_marker_id(turns, role_ids, end_id):
    # decides by the marker's id, assuming the assistant's is the largest
    biggest = max(role_ids.values())
    labels = []
    for role, content in turns:
        if role_ids[role] == biggest:
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def labels_as_tensor(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return torch.tensor(labels, dtype=torch.float32)   # floats, not ids


def labels_end_of_every_turn(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:                            # every <|end|> is learned
            labels += [-100] * (len(content) + 1) + [end_id]
    return labels


def labels_marker_instead_of_end(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":          # label on the marker, not on <|end|>
            labels += [role_ids[role], *content, -100]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


# ---------------------------------------------------------------------------
# 16.2  my_sft_loss(logits, labels)
# ---------------------------------------------------------------------------


def loss_unshifted(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),
                           ignore_index=-100)


def loss_shift_reversed(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, 1:].reshape(-1, vocab),
                           labels[:, :-1].reshape(-1), ignore_index=-100)


def loss_both_truncated(logits, labels):
    vocab = logits.shape[-1]             # cut both the same way: no shift
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                           labels[:, :-1].reshape(-1), ignore_index=-100)


def loss_flatten_then_shift(logits, labels):
    vocab = logits.shape[-1]             # rows run into each other
    return F.cross_entropy(logits.reshape(-1, vocab)[:-1],
                           labels.reshape(-1)[1:], ignore_index=-100)


def loss_mean_per_sequence(logits, labels):
    per_row = []
    for b in range(logits.shape[0]):
        per_row.append(F.cross_entropy(logits[b, :-1], labels[b, 1:],
                                       ignore_index=-100))
    return torch.stack(per_row).mean()   # each sequence weighs the same


def loss_sum(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                           labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")


def loss_divided_by_all_positions(logits, labels):
    vocab = logits.shape[-1]
    total = F.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                            labels[:, 1:].reshape(-1), ignore_index=-100,
                            reduction="sum")
    return total / labels[:, 1:].numel()   # padding in the denominator


def loss_python_float_loop(logits, labels):
    total, count = 0.0, 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1] - 1):
            y = int(labels[b, t + 1])
            if y != -100:
                total -= torch.log_softmax(logits[b, t], -1)[y].item()
                count += 1
    return torch.tensor(total / count)   # no gradient reaches the logits


def loss_view_on_slice(logits, labels):
    vocab = logits.shape[-1]             # .view: only works when B == 1
    return F.cross_entropy(logits[:, :-1].view(-1, vocab),
                           labels[:, 1:].reshape(-1), ignore_index=-100)


def loss_positive_labels_only(logits, labels):
    vocab = logits.shape[-1]
    target = labels[:, 1:].reshape(-1)
    keep = target > 0                    # token 0 is a real token too
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab)[keep],
                           target[keep])


def loss_nll_on_raw_logits(logits, labels):
    vocab = logits.shape[-1]             # nll_loss wants log-probabilities
    return F.nll_loss(logits[:, :-1].reshape(-1, vocab),
                      labels[:, 1:].reshape(-1), ignore_index=-100)


def loss_mutates_labels(logits, labels):
    mask = labels != -100
    labels[~mask] = 0                    # in place: the caller's labels change
    logp = torch.log_softmax(logits[:, :-1], -1)
    picked = logp.gather(-1, labels[:, 1:, None])[..., 0]
    keep = mask[:, 1:]
    return -(picked * keep).sum() / keep.sum()


def loss_softmax_then_log(logits, labels):
    vocab = logits.shape[-1]             # overflows to inf for large logits
    probs = torch.exp(logits[:, :-1]) / torch.exp(logits[:, :-1]).sum(
        -1, keepdim=True)
    return F.nll_loss(torch.log(probs).reshape(-1, vocab),
                      labels[:, 1:].reshape(-1), ignore_index=-100)


def loss_detached(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].detach().reshape(-1, vocab),
                           labels[:, 1:].reshape(-1), ignore_index=-100)


# ---------------------------------------------------------------------------
# 16.3  my_lora_forward(x, weight, A, B, alpha)
# ---------------------------------------------------------------------------


def forward_alpha_not_divided(x, weight, A, B, alpha):
    return x @ weight.T + alpha * (x @ A.T @ B.T)


def forward_r_over_alpha(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight.T + (r / alpha) * (x @ A.T @ B.T)


def forward_r_from_wrong_axis(x, weight, A, B, alpha):
    r = A.shape[1]                       # in_features, not the rank
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)


def forward_r_from_B_rows(x, weight, A, B, alpha):
    r = B.shape[0]                       # out_features, not the rank
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)


def forward_integer_division(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight.T + (alpha // r) * (x @ A.T @ B.T)


def forward_rslora_scaling(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight.T + (alpha / math.sqrt(r)) * (x @ A.T @ B.T)


def forward_change_only(x, weight, A, B, alpha):
    r = A.shape[0]
    return (alpha / r) * (x @ A.T @ B.T)


def forward_scales_everything(x, weight, A, B, alpha):
    r = A.shape[0]
    return (alpha / r) * (x @ weight.T + x @ A.T @ B.T)


def forward_untransposed_product(x, weight, A, B, alpha):
    r = A.shape[0]                       # B A applied without its transpose
    return x @ weight.T + (alpha / r) * (x @ (B @ A))


def forward_weight_untransposed(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight + (alpha / r) * (x @ A.T @ B.T)


def forward_merges_in_place(x, weight, A, B, alpha):
    r = A.shape[0]
    with torch.no_grad():
        weight += (alpha / r) * (B @ A)  # the frozen weight is changed
    return x @ weight.T


def forward_dropout(x, weight, A, B, alpha):
    r = A.shape[0]                       # PEFT's lora_dropout, always on
    return x @ weight.T + (alpha / r) * (F.dropout(x, 0.1) @ A.T @ B.T)


def forward_hard_coded_scaling(x, weight, A, B, alpha):
    # the chapter's example: r = 2, alpha = 4
    return x @ weight.T + 2.0 * (x @ A.T @ B.T)


def forward_detached_input(x, weight, A, B, alpha):
    r = A.shape[0]
    x = x.detach()
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)


def forward_numpy(x, weight, A, B, alpha):
    r = A.shape[0]
    xn, w, a, b = (t.detach().numpy() for t in (x, weight, A, B))
    return xn @ w.T + (alpha / r) * (xn @ a.T @ b.T)


def forward_float64(x, weight, A, B, alpha):
    r = A.shape[0]
    x, weight, A, B = (t.double() for t in (x, weight, A, B))  # "precision"
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)


# ---------------------------------------------------------------------------
# 16.4  my_lora_merge(weight, A, B, alpha)
# ---------------------------------------------------------------------------


def merge_no_scaling(weight, A, B, alpha):
    return weight + B @ A


def merge_alpha_only(weight, A, B, alpha):
    return weight + alpha * (B @ A)


def merge_transposed_change(weight, A, B, alpha):
    r = A.shape[0]                       # (B A)^T: right only if square
    return weight + (alpha / r) * (B @ A).T


def merge_transposed_result(weight, A, B, alpha):
    r = A.shape[0]                       # returns W^T, the x @ W layout
    return (weight + (alpha / r) * (B @ A)).T


def merge_subtracts(weight, A, B, alpha):
    r = A.shape[0]
    return weight - (alpha / r) * (B @ A)


def merge_in_place(weight, A, B, alpha):
    r = A.shape[0]
    with torch.no_grad():
        weight += (alpha / r) * (B @ A)  # the caller's weight changes
    return weight


def merge_r_from_in_features(weight, A, B, alpha):
    r = A.shape[1]
    return weight + (alpha / r) * (B @ A)


def merge_integer_division(weight, A, B, alpha):
    r = A.shape[0]
    return weight + (alpha // r) * (B @ A)


def merge_rslora(weight, A, B, alpha):
    r = A.shape[0]
    return weight + (alpha / r ** 0.5) * (B @ A)


def merge_returns_linear(weight, A, B, alpha):
    r = A.shape[0]                       # "runs as a plain linear layer"
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(weight + (alpha / r) * (B @ A))
    return layer


def merge_numpy(weight, A, B, alpha):
    r = A.shape[0]
    w, a, b = (t.detach().numpy() for t in (weight, A, B))
    return w + (alpha / r) * (b @ a)


def merge_elementwise_outer(weight, A, B, alpha):
    r = A.shape[0]                       # sum of outer products, first only
    return weight + (alpha / r) * torch.outer(B[:, 0], A[0])


def merge_change_only(weight, A, B, alpha):
    r = A.shape[0]
    return (alpha / r) * (B @ A)


def merge_float64(weight, A, B, alpha):
    r = A.shape[0]
    return weight.double() + (alpha / r) * (B.double() @ A.double())


def merge_scales_weight_too(weight, A, B, alpha):
    r = A.shape[0]
    return (alpha / r) * (weight + B @ A)


# ---------------------------------------------------------------------------
# 16.5  my_lora_init(in_features, out_features, r, generator)
# ---------------------------------------------------------------------------


def init_swapped_zero(in_features, out_features, r, generator):
    A = torch.zeros(r, in_features)      # A zero, B random
    B = torch.randn(out_features, r, generator=generator) / math.sqrt(r)
    return A, B


def init_both_zero(in_features, out_features, r, generator):
    return torch.zeros(r, in_features), torch.zeros(out_features, r)


def init_both_random(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.randn(out_features, r, generator=generator) / math.sqrt(r)
    return A, B


def init_transposed_shapes(in_features, out_features, r, generator):
    A = torch.randn(in_features, r, generator=generator) / math.sqrt(in_features)
    B = torch.zeros(r, out_features)     # the x @ A @ B layout
    return A, B


def init_drawn_transposed(in_features, out_features, r, generator):
    # right shape, but the numbers are drawn in (in, r) order
    A = torch.randn(in_features, r, generator=generator).T / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


def init_without_generator(in_features, out_features, r, generator):
    A = torch.randn(r, in_features) / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


def init_precedence_bug(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / in_features ** 1 / 2
    B = torch.zeros(out_features, r)
    return A, B


def init_divided_by_in(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / in_features
    B = torch.zeros(out_features, r)
    return A, B


def init_divided_by_sqrt_r(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(r)
    B = torch.zeros(out_features, r)
    return A, B


def init_uniform(in_features, out_features, r, generator):
    A = torch.rand(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


def init_returns_B_first(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return B, A


def init_B_drawn_first_then_zeroed(in_features, out_features, r, generator):
    B = torch.randn(out_features, r, generator=generator) * 0   # uses the generator
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    return A, B


def init_reseeds(in_features, out_features, r, generator):
    generator.manual_seed(0)             # "for reproducibility"
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


def init_float64(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator,
                    dtype=torch.float64) / math.sqrt(in_features)
    B = torch.zeros(out_features, r, dtype=torch.float64)
    return A, B


def init_B_tiny_random(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.randn(out_features, r, generator=generator) * 1e-3   # "almost" zero
    return A, B


def init_multiplied_by_sqrt(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) * math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


# ---------------------------------------------------------------------------
# 16.6  my_lora_parameter_count(shapes, r)
# ---------------------------------------------------------------------------


def count_full_matrix(shapes, r):
    return sum(d_out * d_in for d_out, d_in in shapes)


def count_r_times_product(shapes, r):
    return sum(r * d_in * d_out for d_out, d_in in shapes)


def count_A_only(shapes, r):
    return sum(r * d_in for d_out, d_in in shapes)


def count_B_only(shapes, r):
    return sum(r * d_out for d_out, d_in in shapes)


def count_precedence(shapes, r):
    return sum(r * d_in + d_out for d_out, d_in in shapes)


def count_first_shape_times_layers(shapes, r):
    d_out, d_in = shapes[0]              # assumes every layer is alike
    return len(shapes) * r * (d_in + d_out)


def count_unique_shapes(shapes, r):
    return sum(r * (d_in + d_out) for d_out, d_in in set(map(tuple, shapes)))


def count_with_bias(shapes, r):
    return sum(r * (d_in + d_out) + d_out for d_out, d_in in shapes)


def count_plus_frozen(shapes, r):
    return sum(r * (d_in + d_out) + d_in * d_out for d_out, d_in in shapes)


def count_r_squared(shapes, r):
    return sum(r * r * (d_in + d_out) for d_out, d_in in shapes)


def count_twice_the_larger(shapes, r):
    # right for square layers (q, k, v, o), not for the MLP's
    return sum(2 * r * max(d_out, d_in) for d_out, d_in in shapes)


def count_rank_plus_one(shapes, r):
    return sum((r + 1) * (d_in + d_out) for d_out, d_in in shapes)


def count_last_shape_only(shapes, r):
    for d_out, d_in in shapes:
        total = r * (d_in + d_out)       # overwritten, not added
    return total


def count_as_tensor(shapes, r):
    t = torch.tensor([list(s) for s in shapes], dtype=torch.float32)
    return r * t.sum()                   # a float tensor, not an int


def count_mean(shapes, r):
    return int(np.mean([r * (d_in + d_out) for d_out, d_in in shapes]))


def count_in_bytes(shapes, r):
    return sum(4 * r * (d_in + d_out) for d_out, d_in in shapes)   # float32 bytes


WRONG_ANSWERS = [
    ("16.1", "check_sft_labels", "the assistant's role marker labelled too",
     labels_marker_labelled),
    ("16.1", "check_sft_labels", "the assistant's end-of-turn token not labelled",
     labels_end_not_labelled),
    ("16.1", "check_sft_labels", "no loss mask: every token is its own label",
     labels_every_token),
    ("16.1", "check_sft_labels", "labels shifted left by one (shift belongs to the loss)",
     labels_shifted),
    ("16.1", "check_sft_labels", "system turns labelled like the assistant's (role != 'user')",
     labels_non_user_labelled),
    ("16.1", "check_sft_labels", "only the last assistant turn labelled",
     labels_last_turn_only),
    ("16.1", "check_sft_labels", "non-assistant turns one token short (marker forgotten)",
     labels_marker_forgotten_in_other_turns),
    ("16.1", "check_sft_labels", "-1 as the ignored label instead of -100",
     labels_ignore_minus_one),
    ("16.1", "check_sft_labels", "first token of the assistant's content masked (off by one)",
     labels_first_content_token_masked),
    ("16.1", "check_sft_labels", "end-of-turn id hard-coded as 605 from the chapter's print",
     labels_hard_coded_ids),
    ("16.1", "check_sft_labels", "appends end_id to the caller's content lists (mutates input)",
     labels_mutates_turns),
    ("16.1", "check_sft_labels", "assistant found as the role with the largest marker id",
     labels_role_by_marker_id),
    ("16.1", "check_sft_labels", "returns a float32 tensor instead of a list of ints",
     labels_as_tensor),
    ("16.1", "check_sft_labels", "every turn's end-of-turn token labelled",
     labels_end_of_every_turn),
    ("16.1", "check_sft_labels", "assistant marker labelled instead of its end-of-turn",
     labels_marker_instead_of_end),

    ("16.2", "check_sft_loss", "logits not shifted against labels",
     loss_unshifted),
    ("16.2", "check_sft_loss", "shift in the wrong direction (logits[1:] vs labels[:-1])",
     loss_shift_reversed),
    ("16.2", "check_sft_loss", "both truncated at the end: still no shift",
     loss_both_truncated),
    ("16.2", "check_sft_loss", "flattened before shifting: rows run into each other",
     loss_flatten_then_shift),
    ("16.2", "check_sft_loss", "mean per sequence, then mean over the batch",
     loss_mean_per_sequence),
    ("16.2", "check_sft_loss", "sum instead of mean", loss_sum),
    ("16.2", "check_sft_loss", "divided by every position, -100 ones included",
     loss_divided_by_all_positions),
    ("16.2", "check_sft_loss", ".item() loop: a tensor without gradient",
     loss_python_float_loop),
    ("16.2", "check_sft_loss", ".view on a non-contiguous slice: fails when B > 1",
     loss_view_on_slice),
    ("16.2", "check_sft_loss", "labels > 0 as the mask: token id 0 dropped",
     loss_positive_labels_only),
    ("16.2", "check_sft_loss", "nll_loss on raw logits, no log_softmax",
     loss_nll_on_raw_logits),
    ("16.2", "check_sft_loss", "overwrites -100 in the caller's labels (in-place mutation)",
     loss_mutates_labels),
    ("16.2", "check_sft_loss", "softmax by exp then log: inf/nan for large logits",
     loss_softmax_then_log),
    ("16.2", "check_sft_loss", "logits detached: no gradient", loss_detached),

    ("16.3", "check_lora_forward", "scaled by alpha, not alpha / r",
     forward_alpha_not_divided),
    ("16.3", "check_lora_forward", "scaled by r / alpha", forward_r_over_alpha),
    ("16.3", "check_lora_forward", "r read from A.shape[1] (in_features)",
     forward_r_from_wrong_axis),
    ("16.3", "check_lora_forward", "r read from B.shape[0] (out_features)",
     forward_r_from_B_rows),
    ("16.3", "check_lora_forward", "integer division alpha // r",
     forward_integer_division),
    ("16.3", "check_lora_forward", "rsLoRA's alpha / sqrt(r) instead of alpha / r",
     forward_rslora_scaling),
    ("16.3", "check_lora_forward", "returns only the change, not the frozen layer's output",
     forward_change_only),
    ("16.3", "check_lora_forward", "alpha / r scales the frozen output too",
     forward_scales_everything),
    ("16.3", "check_lora_forward", "x @ (B A) without the transpose (right only if square)",
     forward_untransposed_product),
    ("16.3", "check_lora_forward", "x @ W instead of x @ W^T (right only if symmetric)",
     forward_weight_untransposed),
    ("16.3", "check_lora_forward", "merges into the caller's weight in place",
     forward_merges_in_place),
    ("16.3", "check_lora_forward", "dropout on the LoRA branch (random output)",
     forward_dropout),
    ("16.3", "check_lora_forward", "scaling hard-coded as 2 from the example r=2, alpha=4",
     forward_hard_coded_scaling),
    ("16.3", "check_lora_forward", "x detached: no gradient to the input",
     forward_detached_input),
    ("16.3", "check_lora_forward", "computed in numpy, returns an ndarray",
     forward_numpy),
    ("16.3", "check_lora_forward", "converted to float64", forward_float64),

    ("16.4", "check_lora_merge", "change added without alpha / r", merge_no_scaling),
    ("16.4", "check_lora_merge", "change scaled by alpha only", merge_alpha_only),
    ("16.4", "check_lora_merge", "(B A)^T added (right only if square)",
     merge_transposed_change),
    ("16.4", "check_lora_merge", "returns the merged weight transposed",
     merge_transposed_result),
    ("16.4", "check_lora_merge", "change subtracted", merge_subtracts),
    ("16.4", "check_lora_merge", "adds into the caller's weight in place",
     merge_in_place),
    ("16.4", "check_lora_merge", "r read from A.shape[1]", merge_r_from_in_features),
    ("16.4", "check_lora_merge", "integer division alpha // r", merge_integer_division),
    ("16.4", "check_lora_merge", "alpha / sqrt(r)", merge_rslora),
    ("16.4", "check_lora_merge", "returns an nn.Linear, not the weight tensor",
     merge_returns_linear),
    ("16.4", "check_lora_merge", "returns a numpy array", merge_numpy),
    ("16.4", "check_lora_merge", "only the first rank-one term of B A",
     merge_elementwise_outer),
    ("16.4", "check_lora_merge", "returns only the change, without W", merge_change_only),
    ("16.4", "check_lora_merge", "float64 result", merge_float64),
    ("16.4", "check_lora_merge", "alpha / r scales W too", merge_scales_weight_too),

    ("16.5", "check_lora_init", "A zero and B random (the other way round)",
     init_swapped_zero),
    ("16.5", "check_lora_init", "both zero", init_both_zero),
    ("16.5", "check_lora_init", "both random", init_both_random),
    ("16.5", "check_lora_init", "shapes transposed: A (in, r), B (r, out)",
     init_transposed_shapes),
    ("16.5", "check_lora_init", "A drawn as (in, r) then transposed: other numbers",
     init_drawn_transposed),
    ("16.5", "check_lora_init", "generator not used", init_without_generator),
    ("16.5", "check_lora_init", "precedence: / in ** 1 / 2 divides by in / 2",
     init_precedence_bug),
    ("16.5", "check_lora_init", "divided by in_features, not its square root",
     init_divided_by_in),
    ("16.5", "check_lora_init", "divided by sqrt(r)", init_divided_by_sqrt_r),
    ("16.5", "check_lora_init", "uniform torch.rand instead of randn", init_uniform),
    ("16.5", "check_lora_init", "returns (B, A)", init_returns_B_first),
    ("16.5", "check_lora_init", "B drawn from the generator first then zeroed: A differs",
     init_B_drawn_first_then_zeroed),
    ("16.5", "check_lora_init", "reseeds the caller's generator",
     init_reseeds),
    ("16.5", "check_lora_init", "float64 matrices", init_float64),
    ("16.5", "check_lora_init", "B small random instead of zero", init_B_tiny_random),
    ("16.5", "check_lora_init", "multiplied by sqrt(in) instead of divided",
     init_multiplied_by_sqrt),

    ("16.6", "check_lora_parameter_count", "counts the full matrices in * out",
     count_full_matrix),
    ("16.6", "check_lora_parameter_count", "r * in * out", count_r_times_product),
    ("16.6", "check_lora_parameter_count", "only A's numbers", count_A_only),
    ("16.6", "check_lora_parameter_count", "only B's numbers", count_B_only),
    ("16.6", "check_lora_parameter_count", "precedence: r * in + out", count_precedence),
    ("16.6", "check_lora_parameter_count", "every layer assumed the first one's shape",
     count_first_shape_times_layers),
    ("16.6", "check_lora_parameter_count", "repeated shapes counted once (set)",
     count_unique_shapes),
    ("16.6", "check_lora_parameter_count", "a bias counted per layer", count_with_bias),
    ("16.6", "check_lora_parameter_count", "frozen weight counted too", count_plus_frozen),
    ("16.6", "check_lora_parameter_count", "r squared", count_r_squared),
    ("16.6", "check_lora_parameter_count", "2 r max(in, out): right only for square layers",
     count_twice_the_larger),
    ("16.6", "check_lora_parameter_count", "rank plus one", count_rank_plus_one),
    ("16.6", "check_lora_parameter_count", "total overwritten in the loop: last shape only",
     count_last_shape_only),
    ("16.6", "check_lora_parameter_count", "returns a float tensor", count_as_tensor),
    ("16.6", "check_lora_parameter_count", "mean over the layers, not the sum", count_mean),
    ("16.6", "check_lora_parameter_count", "bytes (4 per float32) instead of numbers",
     count_in_bytes),
]
