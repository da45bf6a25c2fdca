"""Checkers for the exercises of chapter 11, *KV caching*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_cache_update` -- ``my_cache_update(cached, new)``: one layer's cached keys (or
  values) followed by the new ones, or the new ones alone when nothing is cached yet.
* :data:`check_position_offset` -- ``my_embed_new_tokens(idx, token_table, position_table,
  past_len)``: the input vectors of new tokens that follow ``past_len`` cached positions.
* :data:`check_cache_bytes` -- ``my_cache_bytes(num_layers, batch, num_heads, length, d_head,
  bytes_per_number)``: the memory a KV cache takes.
* :data:`check_max_positions` -- ``my_max_positions(memory_bytes, num_layers, batch, num_heads,
  d_head, bytes_per_number)``: how many positions of cache fit in a given memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_cache_bytes", "check_cache_update", "check_max_positions",
           "check_position_offset"]


# --- my_cache_update(cached, new) -------------------------------------------------------------

def _cache_update(cached: Tensor | None, new: Tensor) -> Tensor:
    if cached is None:
        return new
    return torch.cat([cached, new], dim=2)


def _update_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(11)

    def numbers(*shape: int) -> Tensor:
        return torch.randint(-9, 10, shape, generator=generator).float()

    return [(None, numbers(1, 1, 1, 2)),
            (numbers(1, 1, 2, 2), numbers(1, 1, 1, 2)),
            (numbers(1, 2, 3, 2), numbers(1, 2, 1, 2)),
            (numbers(2, 2, 2, 3), numbers(2, 2, 2, 3))]


def _cat_on(dim: int):
    def wrong(cached, new):
        return new if cached is None else torch.cat([cached, new], dim=dim)
    return wrong


check_cache_update = Checker(
    reference=_cache_update,
    cases=_update_cases(),
    mistakes={
        "before the first step nothing is cached (cached is None): return new as it is":
            lambda cached, new: torch.cat([cached, new], dim=2),
        "before the first step there are no cached positions: return new as it is, without a "
        "row of zeros in front": lambda cached, new: torch.cat(
            [torch.zeros_like(new) if cached is None else cached, new], dim=2),
        "the new positions go after the cached ones: torch.cat([cached, new], ...)":
            lambda cached, new: new if cached is None else torch.cat([new, cached], dim=2),
        "join along the positions, dim 2 of (B, num_heads, T, d_head); dim 3 (or -1) is the "
        "width of each key": _cat_on(-1),
        "join along the positions, dim 2 of (B, num_heads, T, d_head); dim 1 counts the "
        "heads": _cat_on(1),
        "torch.cat joins along dim 0 unless told otherwise: the positions are dim 2 of "
        "(B, num_heads, T, d_head)": _cat_on(0),
        "torch.stack puts the two side by side in a new dimension (and needs equal shapes); "
        "torch.cat joins them along an existing one, the positions (dim 2)":
            lambda cached, new: new if cached is None else torch.stack([cached, new], dim=2),
        "test for the empty cache with `cached is None`: `not cached` asks a tensor of many "
        "numbers for a single True or False, which torch refuses":
            lambda cached, new: new if not cached else torch.cat([cached, new], dim=2),
        "keep what is cached: return the cached positions followed by the new ones, not the "
        "new ones alone": lambda cached, new: new,
        "append the new positions: return the cached ones followed by the new ones, not the "
        "cached ones alone": lambda cached, new: new if cached is None else cached,
        "the cache grows: the new positions are appended after the cached ones "
        "(torch.cat), not added to their numbers":
            lambda cached, new: new if cached is None else cached + new,
    },
)


# --- my_embed_new_tokens(idx, token_table, position_table, past_len) --------------------------

def _embed_new_tokens(idx: Tensor, token_table: Tensor, position_table: Tensor,
                      past_len: int) -> Tensor:
    length = idx.shape[1]
    return token_table[idx] + position_table[past_len:past_len + length]


def _offset_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(110)
    tokens = torch.randint(-5, 6, (5, 2), generator=generator).float()
    positions = torch.arange(16.0).reshape(8, 2) * 10
    return [(torch.tensor([[3]]), tokens, positions, 0),
            (torch.tensor([[3]]), tokens, positions, 5),
            (torch.tensor([[1, 4, 0]]), tokens, positions, 2),
            (torch.tensor([[2, 2], [0, 1]]), tokens, positions, 6)]


def _shifted(shift: int):
    """The positions past_len + shift, ... sliced from the table: an off-by-one."""
    def wrong(idx, tok, pos, past):
        start = past + shift
        return tok[idx] + pos[start:start + idx.shape[1]]
    return wrong


check_position_offset = Checker(
    reference=_embed_new_tokens,
    cases=_offset_cases(),
    mistakes={
        "the new tokens do not start at position 0: they follow the past_len cached ones, so "
        "their positions are past_len, past_len + 1, ...":
            lambda idx, tok, pos, past: _embed_new_tokens(idx, tok, pos, 0),
        "off by one: with past_len positions cached (0 to past_len - 1), the first new token "
        "sits at position past_len": _shifted(1),
        "off by one: the T new tokens sit at positions past_len to past_len + T - 1 (the "
        "cached ones are 0 to past_len - 1), position_table[past_len:past_len + T]":
            _shifted(-1),
        "off by one: the first new token sits at past_len, not past_len - 1 (and a negative "
        "index reads the table from its end)":
            lambda idx, tok, pos, past: tok[idx] + pos[torch.arange(past - 1,
                                                                    past - 1 + idx.shape[1])],
        "a chunk of several new tokens needs one position each, past_len up to past_len + T - 1, "
        "where T = idx.shape[1] (len(idx) and idx.shape[0] count the rows of the batch, B)":
            lambda idx, tok, pos, past: tok[idx] + pos[past],
        "torch.arange(start, end) counts from start up to end - 1: the new positions are "
        "torch.arange(past_len, past_len + T), with T = idx.shape[1]":
            lambda idx, tok, pos, past: tok[idx] + pos[torch.arange(past, idx.shape[1])],
        "a chunk of several new tokens needs one position each, past_len up to "
        "past_len + T - 1, not only the last one's":
            lambda idx, tok, pos, past: tok[idx] + pos[past + idx.shape[1] - 1],
        "a token's position is where it stands in the text (past_len, past_len + 1, ...), not "
        "its id: index position_table with positions, token_table with idx":
            lambda idx, tok, pos, past: tok[idx] + pos[idx],
        "add the position vectors to the token vectors": lambda idx, tok, pos, past: tok[idx],
        "add the token vectors too: the positions say where each new token stands, "
        "token_table[idx] (B, T, d_model) says which token it is, and the sum keeps the "
        "batch dimension (the (T, d_model) positions broadcast over it)":
            lambda idx, tok, pos, past: pos[past:past + idx.shape[1]],
        "add the token vectors too: the positions say where each new token stands, "
        "token_table[idx] says which token it is; the input vector is their sum":
            lambda idx, tok, pos, past: pos[past:past + idx.shape[1]].expand(
                idx.shape[0], -1, -1),
    },
)


# --- my_cache_bytes(num_layers, batch, num_heads, length, d_head, bytes_per_number) ------------

def _cache_bytes(num_layers: int, batch: int, num_heads: int, length: int, d_head: int,
                 bytes_per_number: int) -> int:
    return 2 * num_layers * batch * num_heads * length * d_head * bytes_per_number


def _without(factor: str):
    """The formula with one of its factors left out."""
    def wrong(L, B, h, T, d, b):
        return (_cache_bytes(L, B, h, T, d, b)
                // {"L": L, "B": B, "h": h, "T": T, "d": d, "b": b}[factor])
    return wrong


check_cache_bytes = Checker(
    reference=_cache_bytes,
    whole_numbers=True,
    # in case 2 no two factors are equal, and none is 8 (2, 5 layers, batch 3, 6 heads, 100
    # positions, width 16, 4 bytes): whichever factor is left out or doubled, and bits for
    # bytes, the hint names that one
    cases=[(1, 1, 1, 1, 1, 4), (5, 3, 6, 100, 16, 4), (12, 8, 12, 1024, 64, 2),
           (32, 3, 32, 4096, 128, 2)],
    mistakes={
        "the cache holds a key and a value for every position: twice the keys alone":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) // 2,
        "only keys and values are cached, not the queries: the factor is 2, not 3":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) // 2 * 3,
        "count bytes, not numbers: multiply by bytes_per_number (4 for float32, 2 for "
        "float16)": _without("b"),
        "bytes_per_number already counts bytes (4 for float32): no factor 8, that would "
        "be bits": lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) * 8,
        "bytes_per_number already counts bytes: do not divide by 8":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) / 8,
        "return the number of bytes; turn it into gigabytes only when you print it":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) / 1e9,   # or / 2**30
        "return the number of bytes; turn it into MiB (2**20 bytes) only when you print it":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) / 2**20,
        "every position has its own key and value: multiply by length": _without("T"),
        "every sequence of the batch has its own keys and values: multiply by batch":
            _without("B"),
        "every layer has its own keys and values: multiply by num_layers": _without("L"),
        "every head has its own keys and values: multiply by num_heads":
            _without("h"),
        "each key is a vector of d_head numbers: multiply by d_head": _without("d"),
        "num_heads counted twice: the heads together are num_heads * d_head = d_model wide, so "
        "multiply by num_heads and by d_head once each":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) * h,
        "the cache grows with T, one key and one value per position; T x T is the size of "
        "the attention scores, which are not cached":
            lambda L, B, h, T, d, b: _cache_bytes(L, B, h, T, d, b) * T,
    },
)


# --- my_max_positions(memory_bytes, num_layers, batch, num_heads, d_head, bytes_per_number) ---

def _max_positions(memory_bytes: int, num_layers: int, batch: int, num_heads: int, d_head: int,
                   bytes_per_number: int) -> int:
    return memory_bytes // _cache_bytes(num_layers, batch, num_heads, 1, d_head,
                                        bytes_per_number)


def _per_position(M, L, B, h, d, b) -> int:                         # noqa: N803 (the formula's)
    return _cache_bytes(L, B, h, 1, d, b)


check_max_positions = Checker(
    reference=_max_positions,
    whole_numbers=True,
    # In cases 2 and 3 no two factors are equal and none is 2, 3 or 8, so each listed mistake
    # gives its own answer (checked in the tests); every memory but case 1's leaves a remainder
    # (a quarter of a position in case 2: rounding to the nearest passes there, rounding up
    # does not).
    cases=[(1000, 1, 1, 1, 1, 4), (95_200, 5, 1, 7, 16, 4), (1_152_077, 5, 3, 6, 16, 4),
           (100, 2, 1, 2, 4, 4), (16_000_000_000, 32, 4, 32, 128, 2)],
    mistakes={
        "a position either fits or it does not: divide with //, which rounds down to a whole "
        "number of positions":
            lambda M, L, B, h, d, b: M / _per_position(M, L, B, h, d, b),
        "round down, not to the nearest: a position that only partly fits does not fit":
            lambda M, L, B, h, d, b: round(M / _per_position(M, L, B, h, d, b)),
        "round down, not up: a position that only partly fits does not fit":
            lambda M, L, B, h, d, b: -(-M // _per_position(M, L, B, h, d, b)),
        "each position holds a key and a value: one position takes "
        "2 * num_layers * batch * num_heads * d_head * bytes_per_number bytes":
            lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // 2),
        "only keys and values are cached, not the queries: the factor is 2, not 3":
            lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // 2 * 3),
        "memory_bytes counts bytes: divide it by the bytes of one position, its numbers times "
        "bytes_per_number": lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // b),
        "bytes_per_number already counts bytes (4 for float32): no factor 8, that would be bits":
            lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) * 8),
        "every sequence of the batch has its own keys and values: one position takes batch "
        "times as many bytes": lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // B),
        "every layer has its own keys and values: one position takes num_layers times as many "
        "bytes": lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // L),
        "every head has its own keys and values: one position takes num_heads times as many "
        "bytes": lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // h),
        "num_heads counted twice: the heads together are num_heads * d_head = d_model wide":
            lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) * h),
        "each key and each value is a vector of d_head numbers: one position takes d_head "
        "times as many bytes":
            lambda M, L, B, h, d, b: M // (_per_position(M, L, B, h, d, b) // d),
        "return how many positions fit, memory_bytes // (bytes of one position), not the bytes "
        "of one position": _per_position,
    },
)
