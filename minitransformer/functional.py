"""Functions on tensors, written as their equations: softmax (chapter 5), layer norm
(chapter 8) and RMS norm (chapter 14).

Attention (chapters 6-7) and sampling (chapter 5) both turn scores into probabilities; they import
:func:`softmax` from here, so neither depends on the other. :func:`layer_norm` is chapter 8's
equation; the :class:`~minitransformer.layers.LayerNorm` module computes the same with PyTorch's
fused kernel. This module also holds the package's one import-time side effect, the ``torch.exp``
warm-up at the bottom, with what it fixes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import (check_float_tensor, check_number, check_same_dtype,
                                     check_scores)


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
    largest = check_scores(x, dim)                          # the largest score of each slice
    exps = torch.exp(x - largest)
    return exps / exps.sum(dim=dim, keepdim=True)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor,
               eps: float = 1e-5) -> Tensor:
    """Layer normalization (Ba et al., 2016), written as its equation (chapter 8).

    ``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias``, with the mean and the biased
    variance (divided by ``d_model``, not ``d_model - 1``) taken over the last dimension.
    Equal to ``F.layer_norm(x, (d_model,), weight, bias, eps)``, PyTorch's fused kernel, which
    :class:`~minitransformer.layers.LayerNorm` calls: a single call instead of these eight
    operations, which matters when a model generates one token at a time (chapter 11).

    Args:
        x: ``(..., d_model)``.
        weight, bias: ``(d_model,)``, the scale and the shift (gamma and beta).
        eps: added to the variance, so that a constant vector does not divide by zero.

    Raises:
        TypeError: a tensor that is not floating-point, dtypes that differ, ``eps`` not a number.
        ValueError: ``weight`` or ``bias`` not of shape ``(d_model,)``, ``eps`` not positive.
    """
    _check_layer_norm(x, weight, bias, eps)
    mean = x.mean(dim=-1, keepdim=True)                     # (..., 1)
    variance = x.var(dim=-1, keepdim=True, correction=0)    # (..., 1)
    normalized = (x - mean) / torch.sqrt(variance + eps)
    return normalized * weight + bias


def _check_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> None:
    check_float_tensor("x", x, min_ndim=1)
    for name, parameter in (("weight", weight), ("bias", bias)):
        check_float_tensor(name, parameter, ndim=1, last_dim=x.shape[-1])
    check_same_dtype(x=x, weight=weight, bias=bias)
    check_number("eps", eps, positive=True)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Root-mean-square normalization (Zhang and Sennrich, 2019), written as its equation
    (chapter 14).

    ``x / sqrt(mean(x ** 2) + eps) * weight``, the mean taken over the last dimension: layer
    norm without subtracting the mean and without a bias. Equal to
    ``F.rms_norm(x, (d_model,), weight, eps)``, PyTorch's fused kernel, which
    :class:`~minitransformer.layers.RMSNorm` calls.

    Args:
        x: ``(..., d_model)``.
        weight: ``(d_model,)``, the scale (gamma).
        eps: added to the mean square, so that a zero vector does not divide by zero.

    Raises:
        TypeError: a tensor that is not floating-point, dtypes that differ, ``eps`` not a number.
        ValueError: ``weight`` not of shape ``(d_model,)``, ``eps`` not positive.
    """
    check_float_tensor("x", x, min_ndim=1)
    check_float_tensor("weight", weight, ndim=1, last_dim=x.shape[-1])
    check_same_dtype(x=x, weight=weight)
    check_number("eps", eps, positive=True)
    mean_square = x.pow(2).mean(dim=-1, keepdim=True)       # (..., 1)
    return x / torch.sqrt(mean_square + eps) * weight


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
