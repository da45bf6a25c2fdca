"""Checkers for the exercises of chapter 19, *Quantization*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_q8_0_block` -- ``my_q8_0_block(x)``: a block of 32 float32 values as Q8_0
  stores it, ``(d, q)``: the scale ``d = max|x| / 127`` (a float32 scalar tensor) and the
  int8 ``q = x / d`` rounded to the nearest whole number, halves away from zero (C's
  ``roundf``); a block of zeros has ``d = 0`` and ``q = 0``.
* :data:`check_unpack_nibbles` -- ``my_unpack_nibbles(packed)``: the 16 bytes (uint8) of a
  4-bit block as its 32 values 0 to 15 (int64), in GGUF's order: value ``i`` is the low
  nibble of byte ``i`` for ``i < 16``, the high nibble of byte ``i - 16`` otherwise.
* :data:`check_q4_1_bytes` -- ``my_q4_1_bytes(n)``: the bytes that ``n`` weights (a multiple
  of 32) take in Q4_1: per block of 32, a float16 scale, a float16 minimum and 32 four-bit
  values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_q4_1_bytes", "check_q8_0_block", "check_unpack_nibbles"]


# --- my_q8_0_block(x) ---------------------------------------------------------------------------

def _round_half_away(v: Tensor) -> Tensor:
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _q8_0(x: Tensor, *, divisor: float = 127, rounding=_round_half_away, signed: bool = True,
          clamp: bool = True) -> tuple[Tensor, Tensor]:
    largest = x.abs().max() if signed else x.max()
    d = largest / divisor
    q = rounding(x / d) if d != 0 else torch.zeros_like(x)
    if clamp:
        q = q.clamp(-128, 127)
    return d, q.to(torch.int8)


def _q8_0_block(x: Tensor) -> tuple[Tensor, Tensor]:
    return _q8_0(x)


def _q8_0_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(19)
    halves = torch.arange(-16, 16).float() + 0.5            # every x / d a half: ties
    halves[0] = -127.0                                     # max|x| = 127: d = 1 exactly
    negative = torch.randn(32, generator=g)
    negative[5] = -4.0                                     # the largest magnitude is negative
    return [(halves,), (torch.randn(32, generator=g) * 0.02,), (negative,),
            (torch.zeros(32),)]


check_q8_0_block = Checker(
    reference=_q8_0_block,
    cases=_q8_0_cases(),
    mistakes={
        "halves round away from zero in llama.cpp (C's roundf: 2.5 -> 3, -2.5 -> -3); "
        "torch.round rounds them to the even neighbour (2.5 -> 2)":
            lambda x: _q8_0(x, rounding=torch.round),
        "x / d is rounded to the nearest whole number, not cut towards zero (int() and "
        ".to(torch.int8) truncate: 2.7 -> 2)": lambda x: _q8_0(x, rounding=torch.trunc),
        "the scale maps the largest magnitude to 127: d = max|x| / 127 (int8's -128 stays "
        "unused, so that the range is symmetric)": lambda x: _q8_0(x, divisor=128),
        "the scale is d = max|x| / 127: 127 levels on each side of zero, not 255 over the "
        "whole range (that is the zero-point scheme)": lambda x: _q8_0(x, divisor=255, clamp=False),
        "the largest magnitude is x.abs().max(): a block whose most extreme value is "
        "negative needs it, x.max() misses it": lambda x: _q8_0(x, signed=False, clamp=False),
    },
)


# --- my_unpack_nibbles(packed) ------------------------------------------------------------------

def _unpack(packed: Tensor) -> Tensor:
    packed = packed.to(torch.int64)
    return torch.cat([packed & 0x0F, packed >> 4])


def _unpack_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(4)
    return [(torch.arange(16, dtype=torch.uint8) * 17,),             # 0x00, 0x11, ... 0xFF
            (torch.tensor([0x21] * 16, dtype=torch.uint8),),         # low 1, high 2
            (torch.randint(0, 256, (16,), generator=g).to(torch.uint8),)]


check_unpack_nibbles = Checker(
    reference=_unpack,
    cases=_unpack_cases(),
    mistakes={
        "GGUF puts values 0-15 in the low nibbles of the 16 bytes and values 16-31 in the high "
        "nibbles: torch.cat([low, high]), not the two nibbles of each byte side by side":
            lambda p: torch.stack([p.long() & 15, p.long() >> 4], dim=1).reshape(-1),
        "the low nibbles (byte & 0x0F) come first, as values 0-15; the high nibbles "
        "(byte >> 4) are values 16-31": lambda p: torch.cat([p.long() >> 4, p.long() & 15]),
        "the high nibble is byte >> 4, shifted down to 0..15; byte & 0xF0 keeps it in place "
        "(0, 16, 32, ...)": lambda p: torch.cat([p.long() & 15, p.long() & 0xF0]),
        "a nibble is 4 bits: byte >> 4 and byte & 0x0F (15), not 8 bits":
            lambda p: torch.cat([p.long() & 0xFF, p.long() >> 8]),
    },
)


# --- my_q4_1_bytes(n) ---------------------------------------------------------------------------

def _q4_1_bytes(n: int, *, scales: int = 2 + 2, per_value: float = 0.5) -> int:
    return int(n // 32 * (scales + 32 * per_value))


check_q4_1_bytes = Checker(
    reference=_q4_1_bytes,
    cases=[(32,), (64,), (576 * 1536,)],
    whole_numbers=True,
    match_every_case=True,
    mistakes={
        "Q4_1 stores a minimum m beside the scale d, each a float16 of 2 bytes: 4 bytes a "
        "block, not 2 (Q4_0 has d alone)": lambda n: _q4_1_bytes(n, scales=2),
        "d and m are float16, 2 bytes each, not float32's 4":
            lambda n: _q4_1_bytes(n, scales=8),
        "two 4-bit values share a byte: 32 values take 16 bytes, not 32":
            lambda n: _q4_1_bytes(n, per_value=1),
        "each block of 32 values also stores its d and m (4 bytes): n / 2 bytes counts the "
        "values alone": lambda n: n // 2,
        "d and m are per block of 32 values, not once for the whole tensor":
            lambda n: n // 2 + 4,
    },
)
