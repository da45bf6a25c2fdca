"""Functions on tensors, written as their equations: softmax (chapter 5), layer norm
(chapter 8), the cross-entropy loss (chapter 9) and RMS norm (chapter 14).

Attention (chapters 6-7) and sampling (chapter 5) both turn scores into probabilities; they import
:func:`softmax` from here, so neither depends on the other. :func:`layer_norm` is chapter 8's
equation; the :class:`~minitransformer.layers.LayerNorm` module computes the same with PyTorch's
fused kernel. This module also holds the package's one import-time side effect, the ``torch.exp``
warm-up at the bottom, with what it fixes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import (ID_DTYPES, check_float_tensor, check_int,
                                     check_int_tensor, check_number, check_same_dtype,
                                     check_scores, shape)


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


def cross_entropy(logits: Tensor, targets: Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> Tensor:
    """The mean cross-entropy of ``logits`` against ``targets``, written as its equation
    (chapter 9), with the options of ``F.cross_entropy``, which it equals.

    At each position the target distribution ``q`` puts ``1 - label_smoothing`` on the target
    and spreads ``label_smoothing`` evenly over all ``N`` tokens (Szegedy et al., 2016); the
    loss is ``-sum_j q_j log p_j = logsumexp(z) - sum_j q_j z_j`` for the scores ``z``. The
    log-sum-exp subtracts the largest score before ``exp``, so large scores do not overflow.
    Positions whose target is ``ignore_index`` are left out of the mean. The models' ``forward``
    calls ``F.cross_entropy``, one fused kernel for the same numbers.

    Args:
        logits: ``(..., N)``, the scores of the ``N`` tokens at each position.
        targets: ``(...)``, int64 or int32 ids in ``[0, N)``, or ``ignore_index``.
        ignore_index: the target that means "no target here".
        label_smoothing: in ``[0, 1]``; 0 is the plain cross-entropy.

    Raises:
        TypeError: logits not floating-point, targets not int64/int32 ids, an option of the
            wrong type.
        ValueError: shapes that do not match, an id outside ``[0, N)``, every target ignored
            (no position to average over), NaN or ``+inf`` logits, a position whose scores are
            all ``-inf``, ``label_smoothing`` outside ``[0, 1]``.
    """
    _check_cross_entropy(logits, targets, ignore_index, label_smoothing)
    largest = logits.detach().amax(dim=-1, keepdim=True)                    # (..., 1)
    log_z = (largest + torch.log(torch.exp(logits - largest).sum(-1, keepdim=True)))[..., 0]
    kept = targets != ignore_index                                          # (...)
    safe = torch.where(kept, targets, 0).long()                             # any id in range
    target_score = logits.gather(-1, safe[..., None])[..., 0]               # z_target, (...)
    expected_score = (1 - label_smoothing) * target_score                   # sum_j q_j z_j
    if label_smoothing:
        expected_score = expected_score + label_smoothing * logits.mean(dim=-1)
    return (log_z - expected_score)[kept].mean()


def _check_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int,
                         label_smoothing: float) -> None:
    check_float_tensor("logits", logits, min_ndim=1)
    check_int_tensor("targets", targets)
    if targets.dtype not in ID_DTYPES:
        raise TypeError(f"targets must hold int64 or int32 ids, got dtype {targets.dtype}: "
                        f"convert it with targets.long()")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have the shape of logits without its last dimension, "
                         f"{shape(logits)[:-1]}, got {shape(targets)}")
    check_int("ignore_index", ignore_index, low=-2**63)
    check_number("label_smoothing", label_smoothing, low=0.0)
    if label_smoothing > 1:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    n = logits.shape[-1]
    if n == 0:
        raise ValueError(f"logits has no token to score: shape {shape(logits)}")
    ids = targets[targets != ignore_index]
    if ids.numel() == 0:
        raise ValueError(f"every target is ignore_index={ignore_index} (or there are none): "
                         f"there is no position to average the loss over")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= n:
        raise ValueError(f"targets holds id {low if low < 0 else high}, outside [0, {n}) "
                         f"(or {ignore_index}: ignored)")
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError("logits must not contain NaN or +inf")
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("logits has a position whose scores are all -inf: no token has any "
                         "probability there")


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
