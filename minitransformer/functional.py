"""Functions on tensors that several modules share: softmax (chapter 5).

Attention (chapters 6-7) and sampling (chapter 5) both turn scores into probabilities; they import
:func:`softmax` from here, so neither depends on the other. This module also holds the package's
one import-time side effect, the ``torch.exp`` warm-up at the bottom, with what it fixes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import check_float_tensor, shape


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
    check_float_tensor("x", x)
    if torch.isnan(x).any() or torch.isposinf(x).any():
        raise ValueError("softmax scores must not contain NaN or +inf")
    if x.dim() and not -x.dim() <= dim < x.dim():
        raise ValueError(f"softmax dim {dim} is out of range for a tensor of shape {shape(x)}")
    if x.dim() and x.shape[dim] == 0:
        raise ValueError(f"softmax got an empty dimension {dim} in a tensor of shape {shape(x)}")
    largest = x.amax(dim=dim, keepdim=True)
    if torch.isneginf(largest).any():
        raise ValueError(f"softmax got a slice along dim {dim} whose scores are all -inf "
                         f"(every position masked), in a tensor of shape {shape(x)}")
    exps = torch.exp(x - largest)
    return exps / exps.sum(dim=dim, keepdim=True)


# --- The package's one import-time side effect -----------------------------------------------

def _warm_up_exp() -> None:
    """Call ``torch.exp`` once on a single number of each float type, before any real work.

    Measured on the course machines (torch 2.13.0 CPU build, 2 threads), comparing the first
    attention computed in a fresh process with PyTorch's: without this warm-up, 7 of 40 fresh
    processes were off by 6.4e-5 to 6.8e-5 instead of 2.4e-7, on that first call only, and a plain,
    non-in-place softmax did the same. With it, 0 of 40 (an earlier run: 4 of 40 without it, 5 of
    40 when the warm-up used ``matmul`` instead of ``exp``). This points at ``exp`` choosing its
    kernel lazily on its first, multi-threaded call. Chapters print rounded float64 differences or
    booleans at a stated tolerance, so no printed value depends on it.
    """
    for dtype in (torch.float32, torch.float64):
        torch.exp(torch.zeros(1, dtype=dtype, device="cpu"))


_warm_up_exp()
