"""Quantization: a weight in 8 or 4 bits instead of 32 (chapter 19).

Two ways to write numbers as small integers, each over a *group* of numbers that share one
scale: the whole tensor, each row, or blocks of 32 along each row.

* **absmax** (symmetric): ``s = max|x| / (2^(b-1) - 1)``, ``q = round(x / s)``, ``x ~ s q``.
  Zero stays exactly zero; one outlier stretches ``s`` for its whole group.
* **zero-point** (asymmetric): ``s = (max x - min x) / (2^b - 1)``, ``z = round(-min x / s)``,
  ``q = clamp(round(x / s) + z, 0, 2^b - 1)``, ``x ~ s (q - z)``. All ``2^b`` levels cover the
  group's range, wherever it lies.

Then GGUF's own block formats, as llama.cpp writes them (byte for byte equal to the ``gguf``
package's ``quants.quantize``; :mod:`minitransformer.gguf` reads them back):

* ``Q8_0``: per 32 values, a float16 ``d = max|x| / 127`` and 32 int8 ``q``, rounded half away
  from zero: 34 bytes, 8.5 bits a weight.
* ``Q4_0``: per 32 values, a float16 ``d = m / -8`` where ``m`` is the value of largest
  magnitude, and 16 bytes of 4-bit ``q = trunc(x / d + 8.5)``, clamped to 15; ``x ~ d (q - 8)``:
  18 bytes, 4.5 bits a weight.
* ``Q4_1``: per 32 values, float16 ``d = (max - min) / 15`` and ``m = min``, and 16 bytes of
  ``q = trunc((x - min) / d + 0.5)``; ``x ~ d q + m``: 20 bytes, 5 bits a weight.

In both 4-bit formats value ``i`` of a block sits in the low nibble of byte ``i`` for
``i < 16`` and in the high nibble of byte ``i - 16`` otherwise.

Then decoding from int8 weights (weight-only: the rows stay float): :class:`Int8Linear` keeps a
linear layer's weight as absmax int8 with a float32 scale per row (or per block), and
:func:`quantize_linears` puts one in place of every ``nn.Linear`` of a model, whose fast decode
step then multiplies through them. :func:`int8_linear` is the product as the equation writes it
(dequantise, multiply); :func:`int8_linear_fast`, which the layer calls, multiplies the int8
matrix itself (``benchmarks/int8_decode.py`` times it against float32). :class:`Int4Linear`
does the same with 4-bit codes in Q4_1's form (a float32 scale and offset per block of 32:
:func:`int4_quantize`, exact for a Q4_1 file's weights), :func:`int4_linear` its equation and
:func:`int4_linear_fast` its kernel; ``quantize_linears(model, bits=4)`` puts them in place.
Both fast kernels multiply bfloat16 rows (8 significant bits): on SmolLM2 that parts greedy
tokens from float32's at near-ties (``benchmarks/int8_rounding.py`` measures which rounding
does it).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks

GROUPS = ("tensor", "row", "block")
BLOCK_SIZE = 32
#: bytes per block of 32 values in each GGUF block format
GGUF_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


# ----- from the equations -----------------------------------------------------------------------

def absmax_quantize(x: Tensor, *, bits: int = 8, group: str = "tensor",
                    block_size: int = BLOCK_SIZE) -> tuple[Tensor, Tensor]:
    """Symmetric quantization: ``q = round(x / s)`` with ``s = max|x| / (2^(bits-1) - 1)`` per
    group.

    Args:
        x: a float tensor of at least one dimension.
        bits: 2 to 8.
        group: ``"tensor"`` (one scale), ``"row"`` (one per row: the last dimension) or
            ``"block"`` (one per ``block_size`` values of a row).

    Returns:
        ``(q, scale)``: ``q`` int8 of ``x``'s shape; ``scale`` float32 of the groups' shape
        (``()``, ``(..., 1)`` or ``(..., n_blocks, 1)``). A group of zeros gets scale 1.

    Raises:
        TypeError, ValueError: not a float tensor, NaN or inf in it, bits outside 2 to 8, an
            unknown group, rows not a multiple of ``block_size``.
    """
    groups = _grouped(x, bits, group, block_size)
    q_max = 2 ** (bits - 1) - 1
    scale = groups.abs().amax(dim=-1, keepdim=True) / q_max           # (..., G, 1)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale).clamp(-q_max, q_max)
    return q.to(torch.int8).reshape(x.shape), _scale_shape(scale, group)


def absmax_dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """``s q``: the float32 values that :func:`absmax_quantize`'s ``(q, scale)`` stand for."""
    return _times_scale(q.float(), scale)


def zero_point_quantize(x: Tensor, *, bits: int = 4, group: str = "tensor",
                        block_size: int = BLOCK_SIZE) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric quantization: ``q = clamp(round(x / s) + z, 0, 2^bits - 1)`` with
    ``s = (max - min) / (2^bits - 1)`` and ``z = round(-min / s)`` per group.

    Returns:
        ``(q, scale, zero)``: ``q`` uint8 of ``x``'s shape; ``scale`` float32 and ``zero``
        (float32 holding whole numbers) of the groups' shape, as :func:`absmax_quantize`'s.
        A group whose values are all equal gets scale 1.

    Raises:
        TypeError, ValueError: as :func:`absmax_quantize`.
    """
    groups = _grouped(x, bits, group, block_size)
    q_max = 2 ** bits - 1
    low = groups.amin(dim=-1, keepdim=True)
    high = groups.amax(dim=-1, keepdim=True)
    scale = (high - low) / q_max
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.round(-low / scale)
    q = (torch.round(groups / scale) + zero).clamp(0, q_max)
    return (q.to(torch.uint8).reshape(x.shape), _scale_shape(scale, group),
            _scale_shape(zero, group))


def zero_point_dequantize(q: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """``s (q - z)``: the float32 values that :func:`zero_point_quantize`'s output stands for."""
    return _times_scale(q.float() - _expand_like(zero, q), scale)


def _grouped(x: Tensor, bits: object, group: object, block_size: object) -> Tensor:
    """``x`` as float32 groups ``(..., G, S)``: one group, the rows, or blocks of rows."""
    _checks.check_float_tensor("x", x, min_ndim=1)
    if _checks.check_int("bits", bits, low=2) > 8:
        raise ValueError(f"bits must be between 2 and 8, got {bits}")
    _checks.check_choice("group", group, GROUPS)
    _checks.check_int("block_size", block_size)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds NaN or inf, which no scale can represent")
    x = x.float()
    if group == "tensor":
        return x.reshape(1, -1)                                  # (1, N)
    if group == "row":
        return x.unsqueeze(-2)                                   # (..., 1, n)
    if x.shape[-1] % block_size:
        raise ValueError(f"rows of {x.shape[-1]} values do not split into blocks of "
                         f"{block_size}")
    return x.reshape(*x.shape[:-1], -1, block_size)              # (..., n / S, S)


def _scale_shape(scale: Tensor, group: str) -> Tensor:
    if group == "tensor":
        return scale.reshape(())
    if group == "row":
        return scale.squeeze(-2)                                 # (..., 1)
    return scale                                                 # (..., n_blocks, 1)


def _expand_like(scale: Tensor, q: Tensor) -> Tensor:
    """A scale of :func:`_scale_shape`'s shape, repeated over the values of its group."""
    if scale.ndim == q.ndim + 1:                                 # blocks
        size = q.shape[-1] // scale.shape[-2]
        return scale.expand(*scale.shape[:-1], size).reshape(q.shape)
    return scale


def _times_scale(values: Tensor, scale: Tensor) -> Tensor:
    return values * _expand_like(scale.float(), values)


# ----- GGUF's block formats ---------------------------------------------------------------------

def quantize_q8_0(x: Tensor) -> Tensor:
    """``x`` (rows a multiple of 32 long) as Q8_0 blocks: uint8 ``(..., n / 32 * 34)``."""
    blocks = _gguf_blocks(x, "Q8_0")
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    q = _round_half_away(blocks * _inverse(d))
    return _rows_of_bytes(x, _f16_bytes(d), q.to(torch.int8).view(torch.uint8))


def quantize_q4_0(x: Tensor) -> Tensor:
    """``x`` as Q4_0 blocks: uint8 ``(..., n / 32 * 18)``."""
    blocks = _gguf_blocks(x, "Q4_0")
    largest = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True))  # signed
    d = largest / -8
    q = torch.trunc(blocks * _inverse(d) + 8.5).clamp(0, 15)
    return _rows_of_bytes(x, _f16_bytes(d), _nibbles(q))


def quantize_q4_1(x: Tensor) -> Tensor:
    """``x`` as Q4_1 blocks: uint8 ``(..., n / 32 * 20)``."""
    blocks = _gguf_blocks(x, "Q4_1")
    low = blocks.amin(dim=-1, keepdim=True)
    d = (blocks.amax(dim=-1, keepdim=True) - low) / 15
    q = torch.trunc((blocks - low) * _inverse(d) + 0.5).clamp(0, 15)
    return _rows_of_bytes(x, _f16_bytes(d), _f16_bytes(low), _nibbles(q))


GGUF_QUANTIZERS = {"Q8_0": quantize_q8_0, "Q4_0": quantize_q4_0, "Q4_1": quantize_q4_1}


def quantize_gguf(x: Tensor, type_name: str) -> Tensor:
    """``x`` in one of GGUF's types (``"F32"``, ``"F16"``, ``"BF16"``, ``"Q8_0"``,
    ``"Q4_0"``, ``"Q4_1"``), as the raw bytes a GGUF file stores: uint8 ``(..., bytes per
    row)``."""
    _checks.check_choice("type_name", type_name, ("F32", "F16", "BF16", *GGUF_QUANTIZERS))
    if type_name in GGUF_QUANTIZERS:
        return GGUF_QUANTIZERS[type_name](x)
    _checks.check_float_tensor("x", x, min_ndim=1)
    dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
    values = x.detach().to(dtype).contiguous()
    return values.view(torch.uint8).reshape(*x.shape[:-1], -1)


def _gguf_blocks(x: Tensor, type_name: str) -> Tensor:
    """``x`` as float32 blocks ``(n_blocks, 32)``, after the checks every format shares."""
    _checks.check_float_tensor("x", x, min_ndim=1)
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"{type_name} stores rows in blocks of {BLOCK_SIZE} values; a row of "
                         f"x has {x.shape[-1]}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"x holds NaN or inf, which {type_name} cannot store")
    return x.detach().float().reshape(-1, BLOCK_SIZE)


def _inverse(d: Tensor) -> Tensor:
    """``1 / d``, and 0 where ``d`` is 0 (a block of zeros stores zeros)."""
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _round_half_away(v: Tensor) -> Tensor:
    """Round to the nearest whole number, halves away from zero (C's ``roundf``)."""
    a = v.abs()
    whole = torch.floor(a)
    return torch.sign(v) * (whole + torch.floor(2 * (a - whole)))


def _f16_bytes(v: Tensor) -> Tensor:
    """Each value of ``(n_blocks, 1)`` as float16: ``(n_blocks, 2)`` bytes."""
    return v.to(torch.float16).view(torch.uint8)


def _nibbles(q: Tensor) -> Tensor:
    """Blocks of 32 values in 0..15 as 16 bytes each: values 0-15 low, 16-31 high."""
    q = q.to(torch.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _rows_of_bytes(x: Tensor, *parts: Tensor) -> Tensor:
    return torch.cat(parts, dim=-1).reshape(*x.shape[:-1], -1)


# ----- weight-only int8 decoding ----------------------------------------------------------------
#
# A linear layer whose weight is kept as int8 ``q`` with float32 scales ``s`` (absmax, per row or
# per block): ``y = x (s q)^T + b``. Only the weights are quantized; the rows ``x`` stay float.

#: the values of ``q`` that :func:`int8_linear_fast`'s fallback dequantises at a time (whole
#: rows, at least one): its float32 buffer stays about 256 KiB whatever the matrix's size
INT8_CHUNK_VALUES = 65536


def int8_linear(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, s q, bias)`` from the equation: the int8 weight ``q`` ``(out, in)``
    dequantised (:func:`absmax_dequantize`, a float copy of the whole matrix), then multiplied.
    The reference that :func:`int8_linear_fast` is tested against."""
    return F.linear(x, absmax_dequantize(q, scale).to(x.dtype), bias)


def int8_linear_fast(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """:func:`int8_linear` without a float copy of the whole matrix.

    With one scale per row on the CPU, PyTorch's ``_weight_int8pack_mm`` (the kernel gpt-fast
    calls) multiplies the int8 matrix itself: it takes bfloat16 rows, so ``x`` is rounded to
    bfloat16 (8 significant bits), the sums come back in bfloat16 and are multiplied by the
    float32 scales here: ``y = s * bf16(bf16(x) q^T)``. Each output is :func:`int8_linear`'s
    of the rounded rows ``bf16(x)`` within ``2^-8`` of its size (the sum's rounding, as
    measured on torch 2.13), hence within ``2^-9 |x| |s q|^T + 2^-8 |y|`` of
    :func:`int8_linear`'s of ``x``, plus float32's own rounding. Otherwise (per-block
    scales, another device, no such kernel) blocks of rows are dequantised into a small
    buffer (``INT8_CHUNK_VALUES`` values) and multiplied in float, equal to :func:`int8_linear`
    up to float rounding.
    """
    out, width = q.shape
    rows = x.reshape(-1, width)
    if scale.ndim == 2 and _int8pack_mm is not None and x.device.type == "cpu":
        sums = _int8pack_mm(rows.to(torch.bfloat16), q, _ones_bf16(out))   # bf16(x) q^T
        y = torch.mul(sums, scale.view(1, out)).to(x.dtype)       # float32 s, float32 y
    else:
        chunk = max(1, INT8_CHUNK_VALUES // width)
        y = rows.new_empty(rows.shape[0], out)
        buffer = rows.new_empty(min(chunk, out), width)
        for start in range(0, out, chunk):
            block = buffer[:min(chunk, out - start)]
            torch.mul(q[start:start + len(block)],
                      _expand_like(scale[start:start + len(block)], block), out=block)
            torch.mm(rows, block.t(), out=y[:, start:start + len(block)])
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], out)


_int8pack_mm = getattr(torch.ops.aten, "_weight_int8pack_mm", None)


@functools.lru_cache(maxsize=64)
def _ones_bf16(size: int) -> Tensor:
    """The kernel's own scales, all 1 (ours are float32, applied after it: exact)."""
    return torch.ones(size, dtype=torch.bfloat16)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (weight-only quantization, chapter 19): ``weight_int8``
    ``(out, in)`` and absmax scales ``scale`` (``(out, 1)`` for ``group="row"``, ``(out,
    in / block_size, 1)`` for ``"block"``), and a float ``bias`` or none. Its forward is
    :func:`int8_linear_fast`; :func:`int8_linear` gives the same from the equation. Made from
    a trained layer by :meth:`from_linear`, or all of a model's by :func:`quantize_linears`;
    a GPT's and a Llama's fast decode steps multiply through it.
    For inference: nothing in it learns."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True,
                 group: str = "row", block_size: int = BLOCK_SIZE,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        _checks.check_int("in_features", in_features)
        _checks.check_int("out_features", out_features)
        _checks.check_choice("group", group, ("row", "block"))
        _checks.check_int("block_size", block_size)
        if group == "block" and in_features % block_size:
            raise ValueError(f"in_features={in_features} do not split into blocks of "
                             f"{block_size}")
        self.in_features, self.out_features = in_features, out_features
        self.group, self.block_size = group, block_size
        groups = (1,) if group == "row" else (in_features // block_size, 1)
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features,
                                                        dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, *groups, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device, dtype=dtype)
                             if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group: str = "row",
                    block_size: int = BLOCK_SIZE) -> Int8Linear:
        """``linear``'s weight quantized by :func:`absmax_quantize` (8 bits, per row or per
        block), its bias kept as it is, on its device."""
        _checks.check_type("linear", linear, nn.Linear, "an nn.Linear")
        weight = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    group=group, block_size=block_size, device=weight.device,
                    dtype=weight.dtype)
        q, scale = absmax_quantize(weight, bits=8, group=group, block_size=block_size)
        layer.weight_int8.copy_(q)
        layer.scale.copy_(scale)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
        return layer

    def dequantized(self) -> Tensor:
        """The float32 weight ``s q`` that the layer multiplies by."""
        return absmax_dequantize(self.weight_int8, self.scale)

    def forward(self, x: Tensor) -> Tensor:
        """``x (s q)^T + b`` for ``x`` ``(..., in)``, through :func:`int8_linear_fast`."""
        return int8_linear_fast(x, self.weight_int8, self.scale, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, group={self.group!r}"
                + (f", block_size={self.block_size}" if self.group == "block" else ""))


# ----- weight-only int4 ----------------------------------------------------------------------

#: the CPU kernel's packing wants whole tiles of rows: an int4 layer's rows are padded with
#: zeros to a multiple of this for it
INT4_ROW_TILE = 16


def int4_quantize(weight: Tensor, *, block_size: int = BLOCK_SIZE
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Q4_1's form with float32 numbers (chapter 19): per block of ``block_size`` values of a
    row, ``d = (max - min) / 15``, ``m = min`` and ``q = round((x - m) / d)`` in 0-15;
    ``x ~ d q + m``. A weight that a Q4_1 file stored (dequantised ``d q + m``, as SmolLM2's
    linear layers are) comes back exactly, which :func:`zero_point_quantize`'s whole-number
    zero does not give.

    Returns:
        ``(q, scale, offset)``: ``q`` uint8 0-15 of ``weight``'s shape, ``scale`` ``d`` and
        ``offset`` ``m`` float32 ``(..., n_blocks, 1)``; a block of equal values gets ``d = 1``.

    Raises:
        TypeError, ValueError: as :func:`absmax_quantize` with ``group="block"``.
    """
    groups = _grouped(weight, 4, "block", block_size)
    low = groups.amin(dim=-1, keepdim=True)
    scale = (groups.amax(dim=-1, keepdim=True) - low) / 15
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round((groups - low) / scale).clamp(0, 15)
    return q.to(torch.uint8).reshape(weight.shape), scale, low


def int4_dequantize(q: Tensor, scale: Tensor, offset: Tensor) -> Tensor:
    """``d q + m``: the float32 values of :func:`int4_quantize`'s output."""
    return _times_scale(q.float(), scale) + _expand_like(offset.float(), q)


def int4_linear(x: Tensor, q: Tensor, scale: Tensor, offset: Tensor,
                bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, d q + m, bias)`` from the equation (:func:`int4_dequantize`, a float copy
    of the whole matrix): the reference that :func:`int4_linear_fast` is tested against."""
    return F.linear(x, int4_dequantize(q, scale, offset).to(x.dtype), bias)


def int4_linear_fast(x: Tensor, packed: Tensor, scales_and_zeros: Tensor, out_features: int,
                     bias: Tensor | None = None) -> Tensor:
    """:func:`int4_linear` through PyTorch's CPU kernel ``_weight_int4pack_mm_for_cpu``, which
    reads the packed 4-bit codes themselves (half a byte a weight) and computes
    ``(q - 8) s + z`` per block of 32 inside the product. It is fast for bfloat16 rows only
    (on torch 2.13, float32 rows took 40x longer), so the rows, ``s = d`` and
    ``z = m + 8 d`` are rounded to bfloat16 (8 significant bits) and the sums come back in
    bfloat16: each output is within ``2^-8 |x| (|W| + 16 |d| + |m|)^T + 2^-8 |y|`` of
    :func:`int4_linear`'s (each rounding ``2^-9`` relative, doubled for slack).
    ``packed`` and ``scales_and_zeros`` are :meth:`Int4Linear.packed`'s."""
    width = x.shape[-1]
    rows = x.reshape(-1, width).to(torch.bfloat16)
    y = _int4pack_mm(rows, packed, BLOCK_SIZE, scales_and_zeros)[:, :out_features]
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], out_features)


_int4pack_mm = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
_int4pack = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)


class Int4Linear(nn.Module):
    """A linear layer with 4-bit weights in Q4_1's form (weight-only, chapter 19): codes
    ``weight_int4`` ``(out, in)`` (uint8 0-15, one a byte), and per block of 32 values of a
    row a float32 ``scale`` ``d`` and ``offset`` ``m`` ``(out, in / 32, 1)``: ``W = d q + m``
    (:func:`int4_quantize`), and a float ``bias`` or none. Its forward on the CPU is
    :func:`int4_linear_fast` (bfloat16 inside the kernel) over a packed copy of the codes made
    at the first call (and again if the codes change); elsewhere, or without the kernel,
    :func:`int4_linear`. Made from a trained layer by :meth:`from_linear`, or all of a model's
    by :func:`quantize_linears` with ``bits=4``. For inference: nothing in it learns."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        _checks.check_int("in_features", in_features)
        _checks.check_int("out_features", out_features)
        if in_features % BLOCK_SIZE:
            raise ValueError(f"in_features={in_features} do not split into blocks of "
                             f"{BLOCK_SIZE}")
        self.in_features, self.out_features = in_features, out_features
        blocks = (out_features, in_features // BLOCK_SIZE, 1)
        self.register_buffer("weight_int4", torch.zeros(out_features, in_features,
                                                        dtype=torch.uint8, device=device))
        self.register_buffer("scale", torch.ones(blocks, device=device))
        self.register_buffer("offset", torch.zeros(blocks, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device, dtype=dtype)
                             if bias else None)
        self._packed: tuple[tuple, Tensor, Tensor] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        """``linear``'s weight by :func:`int4_quantize`, its bias as it is, on its device."""
        _checks.check_type("linear", linear, nn.Linear, "an nn.Linear")
        weight = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                    device=weight.device, dtype=weight.dtype)
        q, scale, offset = int4_quantize(weight)
        layer.weight_int4.copy_(q)
        layer.scale.copy_(scale)
        layer.offset.copy_(offset)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
        return layer

    def dequantized(self) -> Tensor:
        """The float32 weight ``d q + m`` of the equation."""
        return int4_dequantize(self.weight_int4, self.scale, self.offset)

    def packed(self) -> tuple[Tensor, Tensor]:
        """The kernel's inputs: the codes packed (rows padded with zeros to a multiple of
        ``INT4_ROW_TILE``) and the bfloat16 ``(in / 32, rows, 2)`` scales ``d`` and zeros
        ``m + 8 d``; made again when the codes, scales or offsets have changed."""
        key = tuple((t.data_ptr(), t._version) for t in
                    (self.weight_int4, self.scale, self.offset))
        if self._packed is None or self._packed[0] != key:
            pad = -self.out_features % INT4_ROW_TILE
            codes = F.pad(self.weight_int4.to(torch.int32), (0, 0, 0, pad))
            zeros = self.offset + 8 * self.scale
            pairs = torch.cat([self.scale, zeros], dim=-1)               # (out, blocks, 2)
            pairs = F.pad(pairs, (0, 0, 0, 0, 0, pad)).transpose(0, 1)
            self._packed = (key, _int4pack(codes, 2),
                            pairs.to(torch.bfloat16).contiguous())
        return self._packed[1], self._packed[2]

    def forward(self, x: Tensor) -> Tensor:
        """``x (d q + m)^T + b`` for ``x`` ``(..., in)``: :func:`int4_linear_fast` on the
        CPU, else :func:`int4_linear`."""
        if x.device.type == "cpu" and _int4pack_mm is not None and x.is_floating_point():
            return int4_linear_fast(x, *self.packed(), self.out_features, self.bias)
        return int4_linear(x, self.weight_int4, self.scale, self.offset, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, block_size={BLOCK_SIZE}")


#: the weight-only quantized layers a fast decode step multiplies through
QUANTIZED_LINEARS = (Int8Linear, Int4Linear)


def quantize_linears(model: nn.Module, *, bits: int = 8, group: str | None = None,
                     block_size: int = BLOCK_SIZE) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``model`` by its :class:`Int8Linear`
    (:meth:`Int8Linear.from_linear`; ``bits=8``, ``group`` ``"row"`` (default) or
    ``"block"``) or its :class:`Int4Linear` (``bits=4``: per block of 32, ``group`` left out
    or ``"block"``), in place, and return ``model``: weight-only, for decoding. Embeddings and
    norms stay as they are (an embedding is read one row per token); a head tied to the
    embedding gets its own quantized copy, in int8 per row even with ``bits=4`` (as
    llama.cpp's 4-bit files keep the token embedding in 6 to 8 bits: SmolLM2's is Q8_0, and 4
    bits there made 43 of 320 greedy choices differ from float32's). Raises ``ValueError``
    where a row does not split into blocks, naming the layer, or over LoRA layers (merge them
    first), and leaves the model as it was."""
    from minitransformer.lora import LoRALinear        # lora imports the models, which import us

    _checks.check_type("model", model, nn.Module, "an nn.Module")
    if _checks.check_int("bits", bits) not in (4, 8):
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    if bits == 4:
        if group not in (None, "block") or block_size != BLOCK_SIZE:
            raise ValueError(f"bits=4 quantizes per block of {BLOCK_SIZE}: leave out group "
                             f"and block_size (got group={group!r}, block_size={block_size})")
        make = Int4Linear.from_linear
    else:
        group = "row" if group is None else group
        _checks.check_choice("group", group, ("row", "block"))

        def make(child: nn.Linear) -> Int8Linear:
            return Int8Linear.from_linear(child, group=group, block_size=block_size)
    adapted = [name for name, m in model.named_modules() if isinstance(m, LoRALinear)]
    if adapted:
        raise ValueError(f"{adapted[0]} is a LoRA layer: merge the adapters first "
                         f"(lora.merge_lora), then quantize")
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    layers = []                        # all made first: a refusal leaves the model as it was
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if type(child) is nn.Linear:
                try:
                    layer = (Int8Linear.from_linear(child) if bits == 4 and id(child.weight)
                             in tied else make(child))
                except ValueError as exc:
                    raise ValueError(f"{(name + '.' if name else '') + child_name}: {exc}"
                                     ) from None
                layers.append((module, child_name, layer))
    for module, child_name, layer in layers:
        setattr(module, child_name, layer)
    return model
