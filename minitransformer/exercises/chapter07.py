"""Checkers for the exercises of chapter 7, *Multi-head attention*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_split_heads` -- ``my_split_heads(x, num_heads)``: ``(B, T, d_model)`` to
  ``(B, num_heads, T, d_k)``.
* :data:`check_merge_heads` -- ``my_merge_heads(x)``: ``(B, num_heads, T, d_k)`` back to
  ``(B, T, d_model)``.
* :data:`check_count_parameters` -- ``my_count_parameters(d_model, num_heads, bias)``: the number of
  weights in a multi-head attention layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_count_parameters", "check_merge_heads", "check_split_heads"]


def _counting(*shape: int) -> Tensor:
    """0, 1, 2, ... in the given shape: every number shows where it came from."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


# --- split_heads(x, num_heads) -> (B, h, T, d_k) --------------------------------------------

def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    batch, length, d_model = x.shape
    return x.reshape(batch, length, num_heads, d_model // num_heads).transpose(1, 2)


def _split_without_transpose(x, num_heads):
    batch, length, d_model = x.shape
    return x.reshape(batch, num_heads, length, d_model // num_heads)


def _split_interleaved(x, num_heads):
    batch, length, d_model = x.shape
    return x.reshape(batch, length, d_model // num_heads, num_heads).permute(0, 3, 1, 2)


check_split_heads = Checker(
    reference=_split_heads,
    cases=[(_counting(1, 3, 4), 2), (_counting(2, 4, 6), 3), (_counting(2, 5, 8), 4)],
    mistakes={
        "a plain reshape to (B, h, T, d_k) mixes positions into heads: reshape to (B, T, h, d_k) "
        "first, then swap the T and h dimensions with .transpose(1, 2)": _split_without_transpose,
        "head i takes the d_k neighbouring features i*d_k ... (i+1)*d_k - 1, not every h-th "
        "feature: reshape to (B, T, h, d_k)": _split_interleaved,
    },
)


# --- merge_heads(x) -> (B, T, h * d_k) ------------------------------------------------------

def _merge_heads(x: Tensor) -> Tensor:
    batch, heads, length, d_k = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * d_k)


def _merge_without_transpose(x):
    batch, heads, length, d_k = x.shape
    return x.reshape(batch, length, heads * d_k)


def _merge_interleaved(x):
    batch, heads, length, d_k = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, length, heads * d_k)


check_merge_heads = Checker(
    reference=_merge_heads,
    cases=[(_counting(1, 2, 3, 2),), (_counting(2, 3, 4, 2),), (_counting(2, 4, 5, 2),)],
    mistakes={
        "a plain reshape mixes heads and positions: move the head dimension next to d_k first "
        "with .transpose(1, 2), then reshape": _merge_without_transpose,
        "the heads should sit side by side (head 0's d_k features, then head 1's, ...), not "
        "interleaved feature by feature": _merge_interleaved,
    },
)


# --- count_parameters(d_model, num_heads, bias) -> int --------------------------------------

def _count_parameters(d_model: int, num_heads: int, bias: bool) -> int:
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


check_count_parameters = Checker(
    reference=_count_parameters,
    cases=[(512, 8, True), (64, 4, False), (12, 3, True), (6, 1, True)],
    mistakes={
        "each head has d_model x d_k projections, not d_model x d_model: the heads share the "
        "width, so the count does not grow with num_heads":
            lambda d, h, bias: h * _count_parameters(d, h, bias),
        "do not forget the output projection W_O (out_proj): four d_model x d_model matrices":
            lambda d, h, bias: 3 * d * d + (3 * d if bias else 0),
        "with bias=True each of the four projections also has d_model biases":
            lambda d, h, bias: 4 * d * d,
        "with bias=False the projections have no biases: only the four d_model x d_model "
        "weight matrices count":
            lambda d, h, bias: 4 * d * d + 4 * d,
    },
)
