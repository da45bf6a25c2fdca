"""Attention: softmax (chapter 5), scaled dot-product and multi-head attention (chapters 6 and 7)."""

from __future__ import annotations

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Turn scores into probabilities along ``dim``: ``exp(x) / sum(exp(x))``.

    The largest score is subtracted first, which changes nothing mathematically (it cancels in the
    fraction) but keeps ``exp`` from overflowing for large scores. ``-inf`` scores get probability
    exactly 0.

    Args:
        x: a floating-point tensor of any shape.
        dim: the dimension whose entries should sum to 1.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: a slice along ``dim`` is entirely ``-inf`` (nothing to give probability to),
            or holds NaN or ``+inf``.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"softmax expects a floating-point tensor, got {type(x).__name__}"
                        + (f" of dtype {x.dtype}" if isinstance(x, Tensor) else ""))
    if torch.isnan(x).any() or torch.isposinf(x).any():
        raise ValueError("softmax scores must not contain NaN or +inf")
    largest = x.amax(dim=dim, keepdim=True)
    if torch.isneginf(largest).any():
        raise ValueError(f"softmax got a slice along dim {dim} whose scores are all -inf "
                         f"(every position masked), in a tensor of shape {tuple(x.shape)}")
    exps = torch.exp(x - largest)
    return exps / exps.sum(dim=dim, keepdim=True)
