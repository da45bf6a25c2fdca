"""The checkers of chapters 6 and 7: they accept correct answers and explain plausible wrong ones."""

import math

import numpy as np
import pytest
import torch

from minitransformer import MultiHeadAttention
from minitransformer.exercises import chapter06, chapter07
from minitransformer.exercises.chapter06 import (
    check_attend_one_query,
    check_attention_scores,
    check_causal_mask,
)
from minitransformer.exercises.chapter07 import (
    check_count_parameters,
    check_merge_heads,
    check_split_heads,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def attention_scores(query, key):
    d_k = query.shape[-1]
    return query @ key.T / math.sqrt(d_k)


def attend_one_query(q, keys, values):
    scores = keys @ q / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.max())
    weights = weights / weights.sum()
    return weights @ values


def my_causal_mask(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def split_heads(x, num_heads):
    B, T, d_model = x.shape
    return x.view(B, T, num_heads, d_model // num_heads).transpose(1, 2)


def merge_heads(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)


def count_parameters(d_model, num_heads, bias):
    return sum(p.numel() for p in MultiHeadAttention(d_model, num_heads, bias=bias).parameters())


CHECKERS = {
    "attention_scores": (check_attention_scores, attention_scores),
    "attend_one_query": (check_attend_one_query, attend_one_query),
    "causal_mask": (check_causal_mask, my_causal_mask),
    "split_heads": (check_split_heads, split_heads),
    "merge_heads": (check_merge_heads, merge_heads),
    "count_parameters": (check_count_parameters, count_parameters),
}


def test_modules_export_every_checker():
    names = sorted(chapter06.__all__ + chapter07.__all__)
    assert names == sorted(f"check_{name}" for name in CHECKERS)


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


# --- specific wrong answers a learner writes, with the exact line they see -----------------

def test_unscaled_scores(capsys):
    assert not check_attention_scores(lambda query, key: query @ key.T)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (")
    assert out.endswith("Hint: the scores are not scaled: divide by the square root of d_k, "
                        "the query width\n")


def test_scores_scaled_by_the_number_of_keys_are_told_what_d_k_is(capsys):
    assert not check_attention_scores(lambda query, key: query @ key.T / math.sqrt(len(key)))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith("Hint: you divided by the square root of the number of keys (or "
                        "queries); d_k is the width of one query or key, query.shape[-1]\n")


def test_one_query_scaled_by_the_number_of_keys_is_told_what_d_k_is(capsys):
    assert not check_attend_one_query(
        lambda q, keys, values: torch.softmax(keys @ q / math.sqrt(len(keys)), dim=0) @ values)
    assert capsys.readouterr().out.endswith(
        "Hint: you divided by the square root of the number of keys; d_k is the width of the "
        "query, q.shape[-1]\n")


def test_causal_mask_in_additive_form_gets_its_hint(capsys):
    def additive(T):
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
        return torch.zeros(T, T).masked_fill(~allowed, float("-inf"))

    assert not check_causal_mask(additive)
    out = capsys.readouterr().out
    assert "(expected boolean values but got float values (float32))" in out
    assert out.endswith("this exercise asks for the boolean form, True = may attend\n")


def test_one_query_without_softmax(capsys):
    assert not check_attend_one_query(lambda q, keys, values: (keys @ q / math.sqrt(len(q))) @ values)
    assert capsys.readouterr().out.endswith(
        "Hint: the raw scores are used as weights: turn them into probabilities with softmax first\n")


def test_one_query_returning_weights(capsys):
    def weights_only(q, keys, values):
        return torch.softmax(keys @ q / math.sqrt(len(q)), dim=0)

    assert not check_attend_one_query(weights_only)
    out = capsys.readouterr().out
    assert "(expected shape (3,) but got shape (5,))" in out
    assert out.endswith("Hint: you returned the weights: the answer is the weighted sum of the values\n")


def test_causal_mask_as_numbers(capsys):
    assert not check_causal_mask(lambda n: np.tril(np.ones((n, n))))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (4,) ")
    assert "expected boolean values but got float values (float64)" in out
    assert out.endswith("Hint: return booleans (True = may attend), not numbers: "
                        "add dtype=torch.bool\n")


def test_causal_mask_inverted_gets_the_convention_hint(capsys):
    # True = masked, as nn.MultiheadAttention's attn_mask
    assert not check_causal_mask(lambda T: torch.ones(T, T, dtype=torch.bool).triu(1))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (4,) ")
    assert out.endswith(
        "Hint: your mask is True where attention is forbidden (True = masked, the convention of "
        "nn.MultiheadAttention); in this book True = may attend: keep the lower triangle "
        "including the diagonal, e.g. invert yours with ~\n")


def test_causal_mask_upper_triangle(capsys):
    assert not check_causal_mask(lambda n: np.triu(np.ones((n, n), dtype=bool)))
    assert capsys.readouterr().out.endswith(
        "Hint: that lets each position see the future and hides the past: keep the lower triangle "
        "(torch.tril), not the upper one\n")


def test_split_heads_by_plain_reshape(capsys):
    assert not check_split_heads(lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ")
    assert out.endswith(
        "Hint: a plain reshape to (B, h, T, d_k) mixes positions into heads: reshape to (B, T, h, d_k) "
        "first, then swap the T and h dimensions with .transpose(1, 2)\n")


def test_split_heads_without_transpose_has_the_wrong_shape(capsys):
    assert not check_split_heads(lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1))
    assert "(expected shape (1, 2, 3, 2) but got shape (1, 3, 2, 2))" in capsys.readouterr().out


def test_merge_heads_by_plain_reshape(capsys):
    assert not check_merge_heads(lambda x: x.reshape(x.shape[0], x.shape[2], -1))
    assert capsys.readouterr().out.endswith(
        "Hint: a plain reshape mixes heads and positions: move the head dimension next to d_k first "
        "with .transpose(1, 2), then reshape\n")


def test_count_parameters_per_head(capsys):
    assert not check_count_parameters(lambda d, h, bias: h * (4 * d * d + 4 * d))
    assert capsys.readouterr().out.startswith("✗ case 1: for input (512, 8, True) expected 1050624 "
                                              "but got 8404992. Hint: each head has")


def test_count_parameters_without_biases(capsys):
    assert not check_count_parameters(lambda d, h, bias: 4 * d * d)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (512, 8, True) expected 1050624 but got 1048576. "
        "Hint: with bias=True each of the four projections also has d_model biases\n")


def test_count_parameters_counting_biases_even_without_them(capsys):
    assert not check_count_parameters(lambda d, h, bias: 4 * d * d + 4 * d)
    assert capsys.readouterr().out == (
        "✗ case 2: for input (64, 4, False) expected 16384 but got 16640. "
        "Hint: with bias=False the projections have no biases: only the four d_model x d_model "
        "weight matrices count\n")
