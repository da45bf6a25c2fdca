"""Checkers for the exercises of chapter 5, *Embeddings, positions and de-embedding*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_softmax` -- ``stable_softmax(scores)``: probabilities along the last dimension,
  safe for large scores.
* :data:`check_positional_vector` -- ``positional_vector(pos, d_model)``: one row of the
  sinusoidal positional encoding.
* :data:`check_apply_temperature` -- ``apply_temperature(logits, temperature)``: the
  probabilities after dividing the scores by a temperature.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from minitransformer import softmax
from minitransformer.exercises import Checker
from minitransformer.positional import sinusoidal_positional_encoding

__all__ = ["check_apply_temperature", "check_positional_vector", "check_softmax"]

# "The capital of France is ..." scored over four words: Paris, London, city, banana.
_FRANCE = torch.tensor([12.3, 4.8, 3.1, -2.0])


# --- softmax(scores) -> same shape, rows summing to 1 ---------------------------------------

def _softmax(scores: Tensor) -> Tensor:
    return softmax(scores, dim=-1)


class _SoftmaxChecker(Checker):
    """A checker that also recognises the overflow of ``exp`` on large scores (NaN answers)."""

    def _with_hint(self, message: str, args: tuple, *, got: Any = None,
                   error: Exception | None = None) -> str:
        if error is not None or got is None:
            return super()._with_hint(message, args, got=got, error=error)
        hinted = super()._with_hint(message, args, got=got, error=error)
        if hinted != message:                   # a listed mistake explains it
            return hinted
        try:
            values = got.detach().cpu() if isinstance(got, Tensor) else got
            has_nan = bool(np.isnan(np.asarray(values, dtype=float)).any())
        except (TypeError, ValueError):
            has_nan = False
        if has_nan:
            return (f"{message}. Hint: exp of a large score overflows to inf, and inf / inf "
                    "is NaN: subtract the largest score of each row before taking exp")
        return super()._with_hint(message, args, got=got, error=error)


def _scores_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(5)
    return [
        (_FRANCE.clone(),),
        (torch.tensor([1000.0, 1001.0, 999.0]),),
        (torch.zeros(4),),
        (torch.randn(3, 5, generator=generator) * 3,),
        # rows far apart: subtracting the largest score of the whole tensor leaves 0 / 0 in row 2
        (torch.tensor([[1000.0, 1001.0, 999.0], [-1.0, 0.0, 1.0]]),),
        # scores 100 apart: shifted by the smallest score, exp(100) overflows float32 to inf
        (torch.tensor([0.0, 100.0, 50.0]),),
    ]


def _global_max(scores: Tensor) -> Tensor:
    exps = torch.exp(scores - scores.max())
    return exps / exps.sum(dim=-1, keepdim=True)


def _min_shifted(scores: Tensor) -> Tensor:
    exps = torch.exp(scores - scores.min(dim=-1, keepdim=True).values)
    return exps / exps.sum(dim=-1, keepdim=True)


def _without_keepdim(scores: Tensor) -> Tensor:
    exps = torch.exp(scores - scores.max(dim=-1).values)
    return exps / exps.sum(dim=-1)


check_softmax = _SoftmaxChecker(
    reference=_softmax,
    cases=_scores_cases(),
    mistakes={
        "the exponentials must be divided by their sum, so that each row adds up to 1":
            lambda scores: torch.exp(scores - scores.max(dim=-1, keepdim=True).values),
        "softmax takes exp of the scores before dividing by the sum":
            lambda scores: scores / scores.sum(dim=-1, keepdim=True),
        "you normalised down the columns (dim 0); each row (last dimension) should sum to 1":
            lambda scores: torch.softmax(scores, dim=0),
        "you subtracted the largest score of the whole tensor; subtract each row's own largest "
        "score, scores.max(dim=-1, keepdim=True).values, or a row far below the overall "
        "maximum has every exp round to 0, and 0 / 0 is NaN": _global_max,
        "you divided by the total of the whole tensor; divide each row by its own total, "
        "sum(dim=-1, keepdim=True), so that every row adds up to 1":
            lambda scores: (lambda e: e / e.sum())(
                torch.exp(scores - scores.max(dim=-1, keepdim=True).values)),
        "subtract each row's largest score, not its smallest: shifted by the smallest, the "
        "other scores stay large and positive, and exp of a large positive number overflows "
        "to inf (inf / inf is NaN)": _min_shifted,
        "without keepdim=True the row maxima and sums have shape (rows,), which does not line up "
        "with scores of shape (rows, N); use max(dim=-1, keepdim=True) and "
        "sum(dim=-1, keepdim=True)": _without_keepdim,
    },
)


# --- positional_vector(pos, d_model) -> (d_model,) float tensor -----------------------------

def _positional_vector(pos: int, d_model: int) -> Tensor:
    return sinusoidal_positional_encoding(1, d_model, offset=pos)[0]


def _by_formula(pos: int, d_model: int, exponent, first=math.sin, second=math.cos) -> Tensor:
    values = []
    for column in range(d_model):
        angle = pos / 10000.0 ** exponent(column, d_model)
        values.append(first(angle) if column % 2 == 0 else second(angle))
    return torch.tensor(values)


def _sines_then_cosines(pos: int, d_model: int) -> Tensor:
    angles = [pos / 10000.0 ** (2 * i / d_model) for i in range(d_model // 2)]
    return torch.tensor([math.sin(a) for a in angles] + [math.cos(a) for a in angles])


check_positional_vector = Checker(
    reference=_positional_vector,
    cases=[(1, 16), (0, 4), (5, 8), (37, 32)],
    mistakes={
        "sin and cos are swapped: even columns (0, 2, ...) take sin, odd columns cos":
            lambda pos, d: _by_formula(pos, d, lambda c, d: (c - c % 2) / d, math.cos, math.sin),
        "the exponent is 2i / d_model, where i is the pair number (column // 2); you used the "
        "pair number i alone":
            lambda pos, d: _by_formula(pos, d, lambda c, d: (c // 2) / d),
        "columns 2i and 2i + 1 share one frequency, 10000 ** (2i / d_model); you used the "
        "column number in the exponent for both":
            lambda pos, d: _by_formula(pos, d, lambda c, d: c / d),
        "you put all the sines first and all the cosines after them; the book's encoding "
        "interleaves them: column 2i is the sine and column 2i + 1 the cosine of one angle":
            _sines_then_cosines,
    },
    atol=1e-5,
)


# --- apply_temperature(logits, temperature) -> probabilities --------------------------------

def _apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    return softmax(logits / temperature, dim=-1)


check_apply_temperature = Checker(
    reference=_apply_temperature,
    cases=[
        (_FRANCE.clone(), 1.0),
        (_FRANCE.clone(), 5.0),
        (_FRANCE.clone(), 0.5),
        (torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.5, -1.0]]), 2.0),
    ],
    mistakes={
        "you multiplied by the temperature; divide the scores by it, so a high temperature "
        "flattens the distribution":
            lambda logits, t: torch.softmax(logits * t, dim=-1),
        "the temperature divides the scores before softmax, not the probabilities after it":
            lambda logits, t: torch.softmax(logits, dim=-1) / t,
        "the temperature was ignored: divide the scores by it before softmax":
            lambda logits, t: torch.softmax(logits, dim=-1),
    },
)
