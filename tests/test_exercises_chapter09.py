"""The checkers of chapter 9: they accept correct answers and explain the plausible wrong ones."""

import pytest
import torch

from minitransformer.exercises.chapter09 import (
    check_cross_entropy,
    check_parameter_count,
    check_shift_pairs,
)
from minitransformer.gpt import GPT, GPTConfig, count_parameters

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_shift_pairs(windows):
    return windows[:, :-1], windows[:, 1:]


def my_cross_entropy(logits, targets):
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)   # (B, T, N)
    picked = log_probs.gather(-1, targets[..., None])[..., 0]            # (B, T)
    return -picked.mean()


def my_parameter_count(config):
    d, f = config.d_model, config.d_ff
    block = (4 * d * d + 4 * d) + (d * f + f + f * d + d) + 2 * (2 * d)
    positions = config.context_length * d if config.positional == "learned" else 0
    return config.vocab_size * d + positions + config.num_layers * block + 2 * d


CHECKERS = {
    "shift_pairs": (check_shift_pairs, my_shift_pairs),
    "cross_entropy": (check_cross_entropy, my_cross_entropy),
    "parameter_count": (check_parameter_count, my_parameter_count),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_a_correct_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_the_reference_count_is_what_the_model_has():
    for (config,) in check_parameter_count.cases:
        assert check_parameter_count.reference(config) == count_parameters(GPT(config))


def test_a_naive_softmax_cross_entropy_passes_too(capsys):
    def naive(logits, targets):
        probs = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
        return -torch.log(probs.gather(-1, targets[..., None])).mean()

    assert check_cross_entropy(naive)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("wrong, hint", [
    (lambda w: (w[:, 1:], w[:, :-1]), "inputs and targets are swapped"),
    (lambda w: (w[:-1], w[1:]), "cut along the columns"),
    (lambda w: (w[:, :-1], w[:, :-1]), "moved one token to the left"),
])
def test_shift_pairs_hints(wrong, hint, capsys):
    assert not check_shift_pairs(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def test_shift_pairs_with_the_wrong_length_is_explained(capsys):
    assert not check_shift_pairs(lambda w: (w, w[:, 1:]))
    assert capsys.readouterr().out.startswith("✗ case 1:")


@pytest.mark.parametrize("wrong, hint", [
    (lambda lg, t: -my_cross_entropy(lg, t), "the *negative* mean log-probability"),
    (lambda lg, t: -torch.softmax(lg, -1).gather(-1, t[..., None]).mean(),
     "take the log of the probabilities"),
    (lambda lg, t: my_cross_entropy(lg, t) * t.numel(), "you summed"),
    (lambda lg, t: -torch.log_softmax(lg, 1).gather(-1, t[..., None]).mean(),
     "not over the positions"),
    (lambda lg, t: -torch.log_softmax(lg, -1).mean(), "not the mean over the whole vocabulary"),
    (lambda lg, t: -lg.gather(-1, t[..., None]).mean(), "logits are not log-probabilities"),
    (lambda lg, t: torch.nn.functional.nll_loss(lg.flatten(0, 1), t.flatten()),
     "logits are not log-probabilities"),
])
def test_cross_entropy_hints(wrong, hint, capsys):
    assert not check_cross_entropy(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


@pytest.mark.parametrize("wrong, hint", [
    (lambda c: my_parameter_count(c) + c.vocab_size * c.d_model, "weight tying"),
    (lambda c: my_parameter_count(c) - c.num_layers * (4 * c.d_model + c.d_ff + c.d_model),
     "has a bias"),
    (lambda c: my_parameter_count(c) - (4 * c.num_layers + 2) * c.d_model,
     "one more follows the last block"),
    (lambda c: my_parameter_count(c) - 4 * c.num_layers * c.d_model, "norm1 before attention"),
    (lambda c: my_parameter_count(c) - 2 * c.d_model, "before the head"),
    (lambda c: my_parameter_count(c) - (2 * c.num_layers + 1) * c.d_model,
     "a bias as well as a weight"),
    (lambda c: my_parameter_count(c) - c.num_layers * (c.d_model ** 2 + c.d_model),
     "four projections"),
    (lambda c: my_parameter_count(GPTConfig(**{**vars(c), "num_layers": 1})),
     "multiply one block's count by num_layers"),
    (lambda c: my_parameter_count(c) + (c.context_length * c.d_model
                                        if c.positional == "sinusoidal" else 0),
     "add no parameters"),
])
def test_parameter_count_hints(wrong, hint, capsys):
    assert not check_parameter_count(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def test_forgetting_learned_positions_is_explained(capsys):
    def without_positions(config):
        count = my_parameter_count(config)
        if config.positional == "learned":
            count -= config.context_length * config.d_model
        return count

    assert not check_parameter_count(without_positions)
    assert "(context_length, d_model) table" in capsys.readouterr().out


def test_assuming_d_ff_is_four_d_model_fails_on_the_case_that_sets_it(capsys):
    def four_d(config):
        return my_parameter_count(GPTConfig(**{**vars(config), "d_ff": 4 * config.d_model}))

    assert not check_parameter_count(four_d)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert "use config.d_ff" in out


# --- mistakes found by a learner's review of chapters 8-10 -----------------------------------

def test_logsumexp_without_keepdim_is_explained(capsys):
    # the exercise says "subtract torch.logsumexp over the last dimension"; keepdim is the step
    # a learner forgets, and the broadcasting error names neither
    def no_keepdim(logits, targets):
        log_probs = logits - torch.logsumexp(logits, dim=-1)
        return -log_probs.gather(-1, targets[..., None]).mean()

    assert not check_cross_entropy(no_keepdim)
    out = capsys.readouterr().out
    assert "your function raised RuntimeError: The size of tensor a (3) must match" in out
    assert out.endswith("Hint: torch.logsumexp(logits, dim=-1) has shape (B, T), which does "
                        "not line up with logits (B, T, N); keepdim=True gives (B, T, 1), "
                        "which does\n")


def test_gather_with_a_two_dimensional_index_is_explained(capsys):
    def index_without_its_last_dimension(logits, targets):
        log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        return -log_probs.gather(-1, targets).mean()

    assert not check_cross_entropy(index_without_its_last_dimension)
    out = capsys.readouterr().out
    assert "your function raised RuntimeError: Index tensor must have the same number" in out
    assert out.endswith("Hint: gather wants an index with as many dimensions as log_probs "
                        "(B, T, N): targets[..., None] is (B, T, 1), and [..., 0] drops the "
                        "extra dimension of the result again\n")


def test_gather_along_the_positions_is_explained(capsys):
    def gathered_along_dim_1(logits, targets):
        log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        return -log_probs.gather(1, targets[..., None]).squeeze(-1).mean()

    assert not check_cross_entropy(gathered_along_dim_1)
    out = capsys.readouterr().out
    assert "raised RuntimeError: index 2 is out of bounds for dimension 1 with size 2" in out
    assert out.endswith("Hint: gather along the vocabulary, the last dimension: "
                        "log_probs.gather(-1, targets[..., None]); dimension 1 of (B, T, N) is "
                        "the T positions, so gather(1, ...) uses the word ids as positions\n")


# --- mistakes found by a learner's review of chapters 8-12 (issue 25) ------------------------

def test_a_loss_returned_as_a_python_float_is_refused(capsys):
    # the exercise asks for "a tensor with one number"; the value alone passed before
    assert not check_cross_entropy(lambda logits, targets: my_cross_entropy(logits, targets)
                                   .item())
    assert capsys.readouterr().out == (
        "✗ case 1: for input ([[[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]]], [[0, 2]]) expected a "
        "tensor with one number but got a float, 0.2056. Hint: return the loss as a tensor, "
        "-picked.mean(), as F.cross_entropy does: .item() and float() turn it into a Python "
        "number, which carries no gradient, so loss.backward() could not train the model\n")


@pytest.mark.parametrize("wrong, hint", [
    (lambda w: (w[:, :w.shape[1] - 2], w[:, 1:w.shape[1] - 1]),
     "both are one token short, (B, T - 1): a slice stops before its end index, so "
     "windows[:, :-1] keeps all but the last token and windows[:, 1:] all but the first, "
     "T tokens each"),
    (lambda w: (w[:, :-1], w[:, 1:-1]),
     "the targets are one token short: they run to the end of the window, windows[:, 1:] "
     "(a slice stops before its end, so 1:-1 drops the last token too)"),
    (lambda w: (w[:, :-2], w[:, 1:]),
     "the inputs are one token short: they are all but the last token, windows[:, :-1] "
     "(a slice stops before its end, so :-2 drops two)"),
    (lambda w: (w, w[:, 1:]),
     "the inputs are all but the last token, windows[:, :-1]: the last token of a window "
     "has no next token in it to be its target"),
], ids=["both short", "targets short", "inputs short", "inputs whole"])
def test_shift_pairs_of_the_wrong_length_are_named(wrong, hint, capsys):
    # learner review (issue 25): a slice too short got no hint
    assert not check_shift_pairs(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[5, 1, 4, 2, 3]],)")
    assert out.endswith(f"Hint: {hint}\n")
