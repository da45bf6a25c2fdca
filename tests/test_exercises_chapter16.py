"""The checkers of chapter 16: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it (not copied from the
checker's own list of mistakes); the four mistakes the chapter names (the end-of-turn token
masked, alpha instead of alpha / r, A = 0 instead of B = 0, labels not shifted against the
logits) are each asserted to fail with their hint.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import minitransformer as mt
from minitransformer.exercises import chapter16
from minitransformer.exercises.chapter16 import (
    check_lora_forward,
    check_lora_init,
    check_lora_merge,
    check_lora_parameter_count,
    check_sft_labels,
    check_sft_loss,
)
from minitransformer.lora import LoRALinear, add_lora, trainable_parameters
from minitransformer.sft import sft_labels

# --- correct answers ----------------------------------------------------------------------------


def my_sft_labels(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100] + list(content) + [end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels


def my_sft_labels_from_a_mask(turns, role_ids, end_id):
    ids, mask = [], []
    for role, content in turns:
        ids += [role_ids[role], *content, end_id]
        mask += [False] + [role == "assistant"] * (len(content) + 1)
    return [i if m else -100 for i, m in zip(ids, mask)]


def my_sft_labels_with_the_package(turns, role_ids, end_id):
    ids, mask = [], []
    for role, content in turns:
        ids += [role_ids[role], *content, end_id]
        mask += [False] + [role == "assistant"] * (len(content) + 1)
    return sft_labels(ids, mask)


def my_sft_loss(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def my_sft_loss_by_hand(logits, labels):
    targets = labels[:, 1:]
    log_probs = logits[:, :-1].log_softmax(-1)
    keep = targets != -100
    picked = log_probs[keep].gather(-1, targets[keep].unsqueeze(-1))
    return -picked.mean()


def my_lora_forward(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)


def my_lora_forward_with_the_package(x, weight, A, B, alpha):
    base = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer = LoRALinear(base, A.shape[0], alpha=alpha)
    weights = {"base_layer.weight": weight, "lora_A.weight": A, "lora_B.weight": B}
    return torch.func.functional_call(layer, weights, (x,))     # the arguments, in the graph


def my_lora_merge(weight, A, B, alpha):
    return weight + alpha / A.shape[0] * B @ A


def my_lora_merge_with_the_package(weight, A, B, alpha):
    base = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer = LoRALinear(base, A.shape[0], alpha=alpha)
    with torch.no_grad():
        base.weight.copy_(weight)
        layer.lora_A.weight.copy_(A)
        layer.lora_B.weight.copy_(B)
    layer.merge()
    return layer.weight.detach()


def my_lora_init(in_features, out_features, r, generator):
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    B = torch.zeros(out_features, r)
    return A, B


def my_lora_parameter_count(shapes, r):
    return sum(r * (d_in + d_out) for d_out, d_in in shapes)


CORRECT = {
    "labels": (check_sft_labels, my_sft_labels),
    "labels_mask": (check_sft_labels, my_sft_labels_from_a_mask),
    "labels_package": (check_sft_labels, my_sft_labels_with_the_package),
    "loss": (check_sft_loss, my_sft_loss),
    "loss_by_hand": (check_sft_loss, my_sft_loss_by_hand),
    "forward": (check_lora_forward, my_lora_forward),
    "forward_package": (check_lora_forward, my_lora_forward_with_the_package),
    "merge": (check_lora_merge, my_lora_merge),
    "merge_package": (check_lora_merge, my_lora_merge_with_the_package),
    "init": (check_lora_init, my_lora_init),
    "count": (check_lora_parameter_count, my_lora_parameter_count),
}


def test_module_exports_every_checker():
    assert sorted(chapter16.__all__) == [
        "check_lora_forward", "check_lora_init", "check_lora_merge",
        "check_lora_parameter_count", "check_sft_labels", "check_sft_loss"]


@pytest.mark.parametrize("name", CORRECT)
def test_accepts_correct_answers(name, capsys):
    checker, solution = CORRECT[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_the_loss_reference_is_the_packages_sft_loss():
    """The checker's loss equals the model's own loss on sft_batch's shifted targets."""
    for logits, labels in check_sft_loss.cases:
        shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        expected = F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)
        torch.testing.assert_close(check_sft_loss.reference(logits, labels), expected)


def test_the_lora_references_are_the_packages_layer():
    for case in check_lora_forward.cases:
        torch.testing.assert_close(check_lora_forward.reference(*case),
                                   my_lora_forward_with_the_package(*case))


def test_the_count_matches_trainable_parameters():
    model = mt.Llama(mt.LlamaConfig(vocab_size=50, context_length=8, num_layers=2,
                                    num_heads=4, d_model=16))
    add_lora(model, r=3, alpha=6, targets=("q_proj", "v_proj", "down_proj"))
    shapes = [tuple(layer.weight.shape) for layer in model.modules()
              if isinstance(layer, LoRALinear)]
    assert check_lora_parameter_count.reference(shapes, 3) \
        == trainable_parameters(model)[0]


def _hint(checker, function, capsys):
    assert not checker(function)
    out = capsys.readouterr().out
    assert out.startswith("✗"), out
    assert "Hint: " in out, out
    return out.rstrip("\n").split("Hint: ", 1)[1]


# --- the label mask -----------------------------------------------------------------------------

def test_the_end_of_turn_token_masked_out(capsys):
    def labels(turns, role_ids, end_id):
        out = []
        for role, content in turns:
            out += [-100] + (list(content) if role == "assistant" else [-100] * len(content))
            out += [-100]
        return out
    assert "end-of-turn token" in _hint(check_sft_labels, labels, capsys)


def test_the_assistant_marker_learned(capsys):
    def labels(turns, role_ids, end_id):
        out = []
        for role, content in turns:
            ids = [role_ids[role], *content, end_id]
            out += ids if role == "assistant" else [-100] * len(ids)
        return out
    assert "role marker" in _hint(check_sft_labels, labels, capsys)


def test_no_mask_at_all(capsys):
    def labels(turns, role_ids, end_id):
        return [i for role, content in turns for i in (role_ids[role], *content, end_id)]
    assert "users' turns" in _hint(check_sft_labels, labels, capsys)


def test_labels_shifted_in_advance(capsys):
    def labels(turns, role_ids, end_id):
        return my_sft_labels(turns, role_ids, end_id)[1:] + [-100]
    assert "do not shift here" in _hint(check_sft_labels, labels, capsys)


def test_labels_with_zero_for_ignored(capsys):
    def labels(turns, role_ids, end_id):
        return [0 if x == -100 else x for x in my_sft_labels(turns, role_ids, end_id)]
    assert "not 0" in _hint(check_sft_labels, labels, capsys)


def test_only_the_last_answer(capsys):
    def labels(turns, role_ids, end_id):
        last = max(k for k, (role, _) in enumerate(turns) if role == "assistant")
        out = []
        for k, (role, content) in enumerate(turns):
            out += ([-100, *content, end_id] if k == last
                    else [-100] * (len(content) + 2))
        return out
    assert "every assistant turn" in _hint(check_sft_labels, labels, capsys)


def test_mask_inverted(capsys):
    def labels(turns, role_ids, end_id):
        return [i if role != "assistant" else -100 for role, content in turns
                for i in (role_ids[role], *content, end_id)]
    assert "wrong way round" in _hint(check_sft_labels, labels, capsys)


# --- the loss -----------------------------------------------------------------------------------

def test_loss_without_the_shift(capsys):
    def loss(logits, labels):
        return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100)
    assert "logits at position t predict token t + 1" in _hint(check_sft_loss, loss, capsys)


def test_loss_shifted_the_wrong_way(capsys):
    def loss(logits, labels):
        return F.cross_entropy(logits[:, 1:].transpose(1, 2), labels[:, :-1],
                               ignore_index=-100)
    assert "other way" in _hint(check_sft_loss, loss, capsys)


def test_loss_mean_of_means(capsys):
    def loss(logits, labels):
        return torch.stack([my_sft_loss(logits[b:b + 1], labels[b:b + 1])
                            for b in range(len(logits))]).mean()
    assert "each sequence's mean" in _hint(check_sft_loss, loss, capsys)


def test_loss_summed(capsys):
    def loss(logits, labels):
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:],
                               ignore_index=-100, reduction="sum")
    assert "not the sum" in _hint(check_sft_loss, loss, capsys)


def test_loss_over_every_position(capsys):
    def loss(logits, labels):
        per = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:],
                              ignore_index=-100, reduction="none")
        return per.sum() / per.numel()
    assert "positions with -100" in _hint(check_sft_loss, loss, capsys)


# --- LoRA's forward, merge, start and size ------------------------------------------------------

def test_forward_scaled_by_alpha(capsys):
    def forward(x, weight, A, B, alpha):
        return x @ weight.T + alpha * (x @ A.T @ B.T)
    assert "alpha / r, not alpha" in _hint(check_lora_forward, forward, capsys)


def test_forward_scaled_by_the_root(capsys):
    def forward(x, weight, A, B, alpha):
        return x @ weight.T + alpha / A.shape[0] ** 0.5 * (x @ A.T @ B.T)
    assert "rsLoRA" in _hint(check_lora_forward, forward, capsys)


def test_forward_with_r_from_the_wrong_axis(capsys):
    def forward(x, weight, A, B, alpha):
        return x @ weight.T + alpha / A.size(1) * (x @ A.T @ B.T)
    assert "A.shape[0]" in _hint(check_lora_forward, forward, capsys)


def test_forward_without_the_base(capsys):
    def forward(x, weight, A, B, alpha):
        return (alpha / A.shape[0]) * (x @ A.T @ B.T)
    assert "frozen layer's output" in _hint(check_lora_forward, forward, capsys)


def test_merge_scaled_by_alpha(capsys):
    def merge(weight, A, B, alpha):
        return weight + alpha * B @ A
    assert "alpha / r, not alpha" in _hint(check_lora_merge, merge, capsys)


def test_merge_subtracts(capsys):
    def merge(weight, A, B, alpha):
        return weight - alpha / len(A) * B @ A
    assert "unmerge" in _hint(check_lora_merge, merge, capsys)


def test_merge_returns_the_change_only(capsys):
    def merge(weight, A, B, alpha):
        return alpha / A.shape[0] * (B @ A)
    assert "add the change to the frozen weight" in _hint(check_lora_merge, merge, capsys)


def test_init_with_A_zero(capsys):
    def init(in_features, out_features, r, generator):
        A = torch.zeros(r, in_features)
        B = torch.randn(out_features, r, generator=generator) / math.sqrt(in_features)
        return A, B
    assert "B starts at zero, not A" in _hint(check_lora_init, init, capsys)


def test_init_with_A_zero_and_an_unscaled_B(capsys):
    def init(in_features, out_features, r, generator):
        return torch.zeros(r, in_features), torch.randn(out_features, r, generator=generator)
    assert "B starts at zero, not A" in _hint(check_lora_init, init, capsys)


def test_init_all_zero(capsys):
    def init(in_features, out_features, r, generator):
        return torch.zeros(r, in_features), torch.zeros(out_features, r)
    assert "never learns" in _hint(check_lora_init, init, capsys)


def test_init_both_random(capsys):
    def init(in_features, out_features, r, generator):
        A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
        B = torch.randn(out_features, r, generator=generator) / math.sqrt(in_features)
        return A, B
    assert "exactly equal to its base" in _hint(check_lora_init, init, capsys)


def test_init_transposed(capsys):
    def init(in_features, out_features, r, generator):
        A = torch.randn(in_features, r, generator=generator) / math.sqrt(in_features)
        return A, torch.zeros(r, out_features)
    assert "(r, in_features)" in _hint(check_lora_init, init, capsys)


def test_a_random_A_of_another_scale_never_passes(capsys):
    """An answer with B = 0 but another draw for A is wrong here (the statement fixes it)."""
    def init(in_features, out_features, r, generator):
        return torch.randn(r, in_features, generator=generator) * 0.01, \
            torch.zeros(out_features, r)
    assert not check_lora_init(init)
    assert capsys.readouterr().out.startswith("✗")


def test_count_as_a_full_matrix(capsys):
    def count(shapes, r):
        return sum(r * d_in * d_out for d_out, d_in in shapes)
    assert "r * (in + out)" in _hint(check_lora_parameter_count, count, capsys)


def test_count_A_only(capsys):
    def count(shapes, r):
        return sum(r * d_in for d_out, d_in in shapes)
    assert "count both A" in _hint(check_lora_parameter_count, count, capsys)


def test_count_square(capsys):
    def count(shapes, r):
        return sum(2 * r * d_in for d_out, d_in in shapes)
    assert "2 * r * in" in _hint(check_lora_parameter_count, count, capsys)


def test_count_as_a_float_is_refused(capsys):
    def count(shapes, r):
        return float(sum(r * (d_in + d_out) for d_out, d_in in shapes))
    assert not check_lora_parameter_count(count)
    capsys.readouterr()


# --- hints added after the learner's review ----------------------------------------------------

def test_labels_without_the_marker_positions(capsys):
    def labels(turns, role_ids, end_id):
        out = []
        for role, content in turns:     # content and end only: one label short per turn
            out += [*content, end_id] if role == "assistant" else [-100] * (len(content) + 1)
        return out
    assert "as long as the conversation" in _hint(check_sft_labels, labels, capsys)


def test_labels_without_the_marker_positions_nor_the_end(capsys):
    def labels(turns, role_ids, end_id):
        return [i if role == "assistant" else -100 for role, content in turns for i in content]
    assert "as long as the conversation" in _hint(check_sft_labels, labels, capsys)


def test_loss_with_nll_loss_on_logits(capsys):
    def loss(logits, labels):
        return F.nll_loss(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100)
    assert "log-probabilities" in _hint(check_sft_loss, loss, capsys)


def test_loss_with_zero_for_ignored(capsys):
    def loss(logits, labels):
        labels = labels.clone()
        labels[labels == -100] = 0
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:])
    assert "keep -100 in the labels" in _hint(check_sft_loss, loss, capsys)


def test_forward_with_floor_division(capsys):
    def forward(x, weight, A, B, alpha):
        return x @ weight.T + alpha // A.shape[0] * (x @ A.T @ B.T)
    assert "not alpha // r" in _hint(check_lora_forward, forward, capsys)


def test_merge_with_floor_division(capsys):
    def merge(weight, A, B, alpha):
        return weight + (alpha // len(A)) * B @ A
    assert "not alpha // r" in _hint(check_lora_merge, merge, capsys)


def test_init_kaiming_uniform_as_peft(capsys):
    """PEFT's start (and the package's LoRALinear's) is told apart from a wrong one."""
    def init(in_features, out_features, r, generator):
        A = torch.empty(r, in_features)
        torch.nn.init.kaiming_uniform_(A, a=math.sqrt(5), generator=generator)
        return A, torch.zeros(out_features, r)
    assert "Kaiming-uniform" in _hint(check_lora_init, init, capsys)


def test_count_with_the_frozen_weight(capsys):
    def count(shapes, r):
        return sum(d_in * d_out + r * (d_in + d_out) for d_out, d_in in shapes)
    assert "frozen weight's in * out" in _hint(check_lora_parameter_count, count, capsys)


def test_count_with_the_bias(capsys):
    def count(shapes, r):
        return sum(r * d_in + d_out * r + d_out for d_out, d_in in shapes)
    assert "bias is frozen" in _hint(check_lora_parameter_count, count, capsys)


# --- issue 40: answers that cannot be trained through, of the wrong type, or misleadingly told -

def test_an_sft_loss_through_item_fails_with_the_gradient_hint(capsys):
    """The right value, computed through .item() in a loop: no gradient to train with."""
    def my_sft_loss(logits, labels):
        vocab, total, count = logits.shape[-1], 0.0, 0
        for row_logits, row_labels in zip(logits[:, :-1].reshape(-1, vocab),
                                          labels[:, 1:].reshape(-1)):
            if row_labels != -100:
                total += -row_logits.log_softmax(-1)[row_labels].item()
                count += 1
        return torch.tensor(total / count)
    assert "does not carry a gradient" in _hint(check_sft_loss, my_sft_loss, capsys)


def test_an_sft_loss_with_a_detached_normaliser_fails_with_the_cut_hint(capsys):
    """The right value and a gradient, but log_softmax's normaliser detached: the gradient
    differs from the reference's."""
    def my_sft_loss(logits, labels):
        vocab = logits.shape[-1]
        shifted = logits[:, :-1].reshape(-1, vocab)
        log_probs = shifted - shifted.logsumexp(-1, keepdim=True).detach()
        return F.nll_loss(log_probs, labels[:, 1:].reshape(-1), ignore_index=-100)
    assert "part of the computation is cut" in _hint(check_sft_loss, my_sft_loss, capsys)


def test_a_lora_init_in_numpy_or_float64_fails_with_its_type(capsys):
    def in_numpy(in_features, out_features, r, generator):
        A, B = check_lora_init.reference(in_features, out_features, r, generator)
        return A.numpy(), B.numpy()

    def in_float64(in_features, out_features, r, generator):
        A, B = check_lora_init.reference(in_features, out_features, r, generator)
        return A.double(), B
    assert "not a numpy array" in _hint(check_lora_init, in_numpy, capsys)
    assert "float64 (double)" in _hint(check_lora_init, in_float64, capsys)


def test_a_count_from_the_first_layer_is_told_so(capsys):
    """Issue 40: len(shapes) * r * (in + out) of the first layer was told 'not 2 * r * in';
    case 4's layers now differ, and the hint names the first layer."""
    assert "not len(shapes) times the first layer's" in _hint(
        check_lora_parameter_count, lambda shapes, r: len(shapes) * r * sum(shapes[0]), capsys)


def test_a_merge_that_changes_the_callers_weight_fails(capsys):
    def my_lora_merge(weight, A, B, alpha):
        weight += alpha / A.shape[0] * (B @ A)
        return weight
    assert "leave the arguments as they were" in _hint(check_lora_merge, my_lora_merge, capsys)
