"""Checkers for the exercises of chapter 6, *Scaled dot-product attention*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_attention_scores` -- ``attention_scores(query, key)``: ``query @ key.T / sqrt(d_k)``.
* :data:`check_attend_one_query` -- ``attend_one_query(q, keys, values)``: attention for one query.
* :data:`check_causal_mask` -- ``my_causal_mask(T)``: the boolean lower triangle, True = may
  attend.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_attend_one_query", "check_attention_scores", "check_causal_mask"]


def _random(*shape: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


# --- attention_scores(query, key) -> (T_q, T_k) -----------------------------------------------

def _attention_scores(query: Tensor, key: Tensor) -> Tensor:
    return query @ key.T / math.sqrt(query.shape[-1])


check_attention_scores = Checker(
    reference=_attention_scores,
    cases=[
        (_random(3, 4, seed=1), _random(3, 4, seed=2)),
        (_random(2, 8, seed=3), _random(5, 8, seed=4)),      # T_q != T_k
        (_random(4, 16, seed=5), _random(4, 16, seed=6)),
    ],
    mistakes={
        "the scores are not scaled: divide by the square root of d_k, the query width":
            lambda query, key: query @ key.T,
        "divide by sqrt(d_k), not by d_k itself":
            lambda query, key: query @ key.T / query.shape[-1],
        "rows should be queries and columns keys: compute query @ key.T, not key @ query.T":
            lambda query, key: key @ query.T / math.sqrt(query.shape[-1]),
        "you divided by the square root of the number of keys (or queries); d_k is the width "
        "of one query or key, query.shape[-1]":
            lambda query, key: query @ key.T / math.sqrt(key.shape[0]),
    },
)


# --- attend_one_query(q, keys, values) -> (d_v,) --------------------------------------------

def _attend_one_query(q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    weights = torch.softmax(keys @ q / math.sqrt(q.shape[-1]), dim=0)   # (T_k,)
    return weights @ values                                             # (d_v,)


check_attend_one_query = Checker(
    reference=_attend_one_query,
    cases=[
        (_random(4, seed=7), _random(5, 4, seed=8), _random(5, 3, seed=9)),
        (_random(8, seed=10), _random(3, 8, seed=11), _random(3, 8, seed=12)),
        (torch.tensor([1.0, 0.0], dtype=torch.float64),
         torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64),
         torch.tensor([[10.0], [20.0]], dtype=torch.float64)),
    ],
    mistakes={
        "the scores are not scaled: divide them by sqrt(d_k) before the softmax":
            lambda q, keys, values: torch.softmax(keys @ q, dim=0) @ values,
        "the raw scores are used as weights: turn them into probabilities with softmax first":
            lambda q, keys, values: (keys @ q / math.sqrt(q.shape[-1])) @ values,
        "you returned the weights: the answer is the weighted sum of the values":
            lambda q, keys, values: torch.softmax(keys @ q / math.sqrt(q.shape[-1]), dim=0),
        "that is the value of the single best key (a hard max); softmax mixes all the values":
            lambda q, keys, values: values[torch.argmax(keys @ q)],
        "you divided by the square root of the number of keys; d_k is the width of the query, "
        "q.shape[-1]":
            lambda q, keys, values: torch.softmax(keys @ q / math.sqrt(keys.shape[0]), dim=0)
            @ values,
    },
)


# --- my_causal_mask(T) -> (T, T) bool ------------------------------------------------------

def _causal_mask(length: int) -> Tensor:
    return torch.tril(torch.ones(length, length, dtype=torch.bool))


check_causal_mask = Checker(
    reference=_causal_mask,
    cases=[(4,), (1,), (6,)],
    mistakes={
        "your mask is True where attention is forbidden (True = masked, the convention of "
        "nn.MultiheadAttention); in this book True = may attend: keep the lower triangle "
        "including the diagonal, e.g. invert yours with ~":
            lambda T: ~torch.tril(torch.ones(T, T, dtype=torch.bool)),
        "that lets each position see the future and hides the past: keep the lower triangle "
        "(torch.tril), not the upper one":
            lambda T: torch.triu(torch.ones(T, T, dtype=torch.bool)),
        "a position may attend to itself: keep the diagonal":
            lambda T: torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1),
        "return booleans (True = may attend), not numbers: add dtype=torch.bool":
            lambda T: torch.tril(torch.ones(T, T)),
        "that is the additive form (0 = may attend, -inf = hidden), which is added to the "
        "scores; this exercise asks for the boolean form, True = may attend":
            lambda T: torch.zeros(T, T).masked_fill(
                ~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf")),
    },
)
