"""Rotary position embedding, RoPE (Su et al., 2021): positions as rotations (chapter 14).

Instead of adding a position vector to each token, RoPE turns every query and key by an angle
that grows with its position. The head's ``d`` dimensions form ``d/2`` pairs; pair ``i`` turns by
``m * theta_i`` at position ``m``, with ``theta_i = theta ** (-2i / d)``: fast in the first pairs,
slower and slower after. Two rotations subtract inside a dot product, so after RoPE
``q_m . k_n`` depends on the positions only through ``m - n``.

The pairing is transformers' "rotate half": dimension ``i`` is paired with ``i + d/2`` (the paper
pairs neighbours ``2i`` and ``2i + 1``; checkpoints converted from Meta's format have their
query and key weights permuted to fit). :func:`rotary_angles` builds the table of cosines and
sines, :func:`apply_rotary` turns a tensor with it:

    x_rotated = x * cos + rotate_half(x) * sin
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer._checks import check_float_tensor, check_int, check_number, factory_kwargs


def _check_head_dim(head_dim: int) -> int:
    check_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary positions (its dimensions turn in "
                         f"pairs), got head_dim={head_dim}")
    return head_dim


def rotary_angles(length: int, head_dim: int, *, offset: int = 0, theta: float = 10000.0,
                  device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """The cosines and sines of RoPE's angles for positions ``offset`` to
    ``offset + length - 1``.

    Row ``m`` holds ``cos`` and ``sin`` of ``(offset + m) * theta_i``, with
    ``theta_i = theta ** (-2i / head_dim)`` for ``i < head_dim / 2``, repeated for the second half
    of the dimensions (the "rotate half" layout: dimension ``i`` and ``i + head_dim/2`` share an
    angle). The angles are computed in float32 (float64 for a float64 ``dtype``), as
    transformers computes them, and then converted to ``dtype``.

    Args:
        length: how many positions (rows); 0 gives empty tables.
        head_dim: the width of one attention head; must be even.
        offset: the first position (a cached model's next position, chapter 11).
        theta: the base of the wavelengths (10000 in the paper; Llama 3 uses 500000).
        device: where to create the tables (default: the CPU, whatever torch's default device).
        dtype: a floating-point dtype (default: ``torch.get_default_dtype()``).

    Returns:
        ``(cos, sin)``, each ``(length, head_dim)``.

    Raises:
        TypeError: a size, offset or theta of the wrong type, a non-float ``dtype``.
        ValueError: an odd or non-positive ``head_dim``, a negative length or offset, a theta
            that is not positive.
    """
    check_int("length", length, low=0)
    _check_head_dim(head_dim)
    check_int("offset", offset, low=0)
    check_number("theta", theta, positive=True)
    factory_kwargs(device, dtype)
    return _angles(length, head_dim, offset, theta,
                   torch.device("cpu") if device is None else device,
                   torch.get_default_dtype() if dtype is None else dtype)


def _angles(length: int, head_dim: int, offset: int, theta: float,
            device: torch.device | str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`rotary_angles` without the checks (the path models call at every step)."""
    work = {"dtype": torch.promote_types(dtype, torch.float32), "device": device}
    two_i = torch.arange(0, head_dim, 2, **work)                     # (d/2,)
    frequencies = 1.0 / theta ** (two_i / head_dim)                  # theta_i, (d/2,)
    positions = torch.arange(offset, offset + length, **work)        # (T,)
    angles = torch.outer(positions, frequencies)                     # (T, d/2)
    angles = torch.cat([angles, angles], dim=-1)                     # (T, d): i and i + d/2
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` for the two halves of the last dimension: each pair
    ``(x_i, x_{i + d/2})`` turned by 90 degrees. Shape kept.

    Raises:
        TypeError, ValueError: ``x`` is not a floating-point tensor with an even last size.
    """
    check_float_tensor("x", x, min_ndim=1)
    _check_head_dim(x.shape[-1])
    return _rotate_half(x)


def _rotate_half(x: Tensor) -> Tensor:
    """:func:`rotate_half` without the checks (the hot path)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn each pair ``(x_i, x_{i + d/2})`` of every position by its angle:
    ``x * cos + rotate_half(x) * sin``.

    Args:
        x: ``(B, h, T, head_dim)`` queries or keys.
        cos, sin: ``(T, head_dim)``, from :func:`rotary_angles` for the positions of ``x``.

    Returns:
        ``(B, h, T, head_dim)``.

    Raises:
        TypeError: a tensor that is not floating-point.
        ValueError: an odd ``head_dim``, or ``cos``/``sin`` not of shape ``(T, head_dim)``.
    """
    check_float_tensor("x", x, min_ndim=2)
    _check_head_dim(x.shape[-1])
    for name, table in (("cos", cos), ("sin", sin)):
        check_float_tensor(name, table, ndim=2)
        if table.shape != x.shape[-2:]:
            raise ValueError(f"{name} must have shape (T, head_dim) = {tuple(x.shape[-2:])} "
                             f"for x of shape {tuple(x.shape)}, got {tuple(table.shape)}")
    return _rotate(x, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`apply_rotary` without the checks (the path models call)."""
    return x * cos + _rotate_half(x) * sin
