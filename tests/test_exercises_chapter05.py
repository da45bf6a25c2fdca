"""The checkers of chapter 5: they accept correct answers and explain the plausible wrong ones."""

import math

import pytest
import torch

from minitransformer.exercises.chapter05 import (
    check_apply_temperature,
    check_positional_vector,
    check_softmax,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def softmax(scores):
    exps = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return exps / exps.sum(dim=-1, keepdim=True)


def positional_vector(pos, d_model):
    vector = torch.zeros(d_model)
    for i in range(d_model // 2):
        angle = pos / 10000 ** (2 * i / d_model)
        vector[2 * i] = math.sin(angle)
        vector[2 * i + 1] = math.cos(angle)
    return vector


def apply_temperature(logits, temperature):
    return softmax(logits / temperature)


CHECKERS = {
    "softmax": (check_softmax, softmax),
    "positional_vector": (check_positional_vector, positional_vector),
    "apply_temperature": (check_apply_temperature, apply_temperature),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_a_correct_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_accepts_torch_softmax_too(capsys):
    assert check_softmax(lambda s: torch.softmax(s, dim=-1))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("wrong, hint", [
    (lambda s: torch.exp(s) / torch.exp(s).sum(dim=-1, keepdim=True),
     "exp of a large score overflows"),
    (lambda s: s / s.sum(dim=-1, keepdim=True), "softmax takes exp of the scores"),
    (lambda s: torch.exp(s - s.max(dim=-1, keepdim=True).values), "divided by their sum"),
    (lambda s: torch.softmax(s, dim=0), "you normalised down the columns"),
    (lambda s: (lambda e: e / e.sum(dim=-1, keepdim=True))(torch.exp(s - s.max())),
     "you subtracted the largest score of the whole tensor"),
    (lambda s: (lambda e: e / e.sum(dim=-1))(torch.exp(s - s.max(dim=-1).values)),
     "without keepdim=True"),
    (lambda s: (lambda e: e / e.sum())(torch.exp(s - s.max(dim=-1, keepdim=True).values)),
     "you divided by the total of the whole tensor"),
])
def test_softmax_hints(wrong, hint, capsys):
    assert not check_softmax(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case ") and hint in out.split("Hint: ", 1)[1]


def _pe_with(first, second, exponent):
    def wrong(pos, d_model):
        return torch.tensor([(first if c % 2 == 0 else second)(pos / 10000 ** exponent(c, d_model))
                             for c in range(d_model)])
    return wrong


@pytest.mark.parametrize("wrong, hint", [
    (_pe_with(math.cos, math.sin, lambda c, d: 2 * (c // 2) / d), "sin and cos are swapped"),
    (_pe_with(math.sin, math.cos, lambda c, d: (c // 2) / d), "you used the pair number i alone"),
    (_pe_with(math.sin, math.cos, lambda c, d: c / d), "you used the column number"),
])
def test_positional_vector_hints(wrong, hint, capsys):
    assert not check_positional_vector(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


@pytest.mark.parametrize("wrong, hint", [
    (lambda logits, t: softmax(logits * t), "you multiplied by the temperature"),
    (lambda logits, t: softmax(logits) / t, "not the probabilities after it"),
    (lambda logits, t: softmax(logits), "the temperature was ignored"),
])
def test_apply_temperature_hints(wrong, hint, capsys):
    assert not check_apply_temperature(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def test_sines_then_cosines_gets_the_layout_hint(capsys):
    def concatenated(pos, d_model):
        i = torch.arange(d_model // 2, dtype=torch.float64)
        angle = pos / 10000 ** (2 * i / d_model)
        return torch.cat([torch.sin(angle), torch.cos(angle)]).float()

    assert not check_positional_vector(concatenated)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.rstrip("\n").endswith(
        "Hint: you put all the sines first and all the cosines after them; the book's "
        "encoding interleaves them: column 2i is the sine and column 2i + 1 the cosine of "
        "one angle")


def test_a_global_maximum_fails_on_rows_far_apart(capsys):
    """Subtracting the overall maximum is right for one row; the last case has two rows far
    apart, so the second underflows to 0 / 0 and the learner is told why."""
    def global_max(scores):
        exps = torch.exp(scores - scores.max())
        return exps / exps.sum(dim=-1, keepdim=True)

    assert not check_softmax(global_max)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 5: for input ([[1000.0, 1001.0, 999.0], [-1.0, 0.0, 1.0]],)")
    assert "overflows" not in out and "each row's own largest score" in out


def test_subtracting_each_rows_minimum_overflows_on_scores_far_apart(capsys):
    """Shifting by the row minimum keeps every case with scores close together finite; the
    last case has scores 100 apart, where exp(100) overflows float32 to inf."""
    def min_shifted(scores):
        exps = torch.exp(scores - scores.min(dim=-1, keepdim=True).values)
        return exps / exps.sum(dim=-1, keepdim=True)

    assert not check_softmax(min_shifted)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 6: for input ([0.0, 100.0, 50.0],) expected [0.0, 1.0, 0.0] "
                          "but got [0.0, nan, 0.0]")
    assert out.rstrip("\n").endswith(
        "Hint: subtract each row's largest score, not its smallest: shifted by the smallest, the "
        "other scores stay large and positive, and exp of a large positive number overflows "
        "to inf (inf / inf is NaN)")


def test_softmax_has_six_cases():
    # chapter 5's notebook prints this count; re-execute it when it changes
    assert len(check_softmax.cases) == 6
