"""The key-value cache: what generation keeps from one step to the next (chapter 11).

When a language model writes one token at a time, the keys and values of the tokens it has
already read do not change. :class:`KVCache` keeps them, layer by layer, so that each step only
projects the new token's key and value and appends them. The queries need no cache: only the new
token asks a question.

The cache holds the *self-attention* keys and values, which grow by one position per step. An
encoder-decoder's cross-attention keys and values depend on the source sentence alone; chapter 10
projects them once per sentence and keeps them apart
(:class:`~minitransformer.seq2seq.SourceMemory`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer import _checks


class KVCache:
    """Each layer's keys and values of the positions seen so far.

    ``cache.update(i, key, value)`` appends layer ``i``'s new keys and values and returns all of
    them, old and new, ready for attention. Without ``max_len`` the tensors grow by
    concatenation; with it, storage for ``max_len`` positions is allocated on the first update
    (when the batch size, heads, width, dtype and device are known) and written in place.

    Args:
        num_layers: how many layers share the cache (one slot each).
        max_len: the most positions it will hold; ``None`` for no limit.

    Attributes:
        keys, values: per layer, the stored tensor ``(B, num_heads, T, d_head)`` or ``None``
            before the first update (with ``max_len``, ``T`` is ``max_len``; the first
            :attr:`seq_len` positions are filled).

    Raises:
        TypeError, ValueError: ``num_layers`` or ``max_len`` is not a positive int.
    """

    def __init__(self, num_layers: int, *, max_len: int | None = None):
        self.num_layers = _checks.check_int("num_layers", num_layers)
        self.max_len = None if max_len is None else _checks.check_int("max_len", max_len)
        self.reset()

    def reset(self) -> None:
        """Empty the cache (and drop its storage), ready for a new sequence."""
        self.keys: list[Tensor | None] = [None] * self.num_layers
        self.values: list[Tensor | None] = [None] * self.num_layers
        self._lengths = [0] * self.num_layers

    @property
    def seq_len(self) -> int:
        """How many positions the cache holds (layer 0's count; between forward passes every
        layer holds the same number)."""
        return self._lengths[0]

    def length(self, layer_idx: int) -> int:
        """How many positions layer ``layer_idx`` holds (during a forward pass, the layers
        before it have already appended the new ones)."""
        return self._lengths[layer_idx]

    def update(self, layer_idx: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append layer ``layer_idx``'s new keys and values; return all it holds.

        Args:
            layer_idx: the layer, ``0 <= layer_idx < num_layers``.
            key, value: ``(B, num_heads, T_new, d_head)``, the new positions.

        Returns:
            ``(keys, values)``, each ``(B, num_heads, T_old + T_new, d_head)``.

        Raises:
            ValueError: more positions than ``max_len``, or ``key``/``value`` that do not fit
                what the layer holds already (batch, heads, width, dtype, device).
        """
        self._check_fits(layer_idx, key, value)
        length, end = self._lengths[layer_idx], self._lengths[layer_idx] + key.shape[2]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.max_len is None:
            if keys is None:  # keep a copy, as with max_len: the caller may change its tensors
                key, value = key.clone(), value.clone()
            else:
                key = torch.cat([keys, key], dim=2)               # (B, h, T_old + T_new, d)
                value = torch.cat([values, value], dim=2)
            self.keys[layer_idx], self.values[layer_idx] = key, value
            self._lengths[layer_idx] = end
            return key, value
        if end > self.max_len:
            raise ValueError(f"the cache holds {length} positions of at most max_len="
                             f"{self.max_len}; {key.shape[2]} more would make {end}")
        if keys is None:
            batch, heads, _, width = key.shape
            keys = self.keys[layer_idx] = key.new_empty(batch, heads, self.max_len, width)
            values = self.values[layer_idx] = value.new_empty(batch, heads, self.max_len, width)
        keys.narrow(2, length, key.shape[2]).copy_(key)         # keys[:, :, length:end] = key
        values.narrow(2, length, key.shape[2]).copy_(value)
        self._lengths[layer_idx] = end
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)  # keys[:, :, :end]

    def _check_fits(self, layer_idx: int, key: Tensor, value: Tensor) -> None:
        """New keys and values of one shape, that fit the ones the layer holds: nothing may
        broadcast or be converted silently when they are written into the storage. Only
        comparisons of sizes: this runs in every layer at every generated token."""
        if (isinstance(layer_idx, bool) or not isinstance(layer_idx, int)
                or not 0 <= layer_idx < self.num_layers):
            raise ValueError(f"layer_idx must be an int in [0, {self.num_layers}), got "
                             f"{layer_idx!r}")
        if not isinstance(key, Tensor) or not isinstance(value, Tensor):
            raise TypeError(f"key and value must be tensors, got {type(key).__name__} and "
                            f"{type(value).__name__}")
        if key.ndim != 4 or key.shape != value.shape or key.dtype != value.dtype:
            raise ValueError(f"key and value must both have shape (B, num_heads, T, d_head) "
                             f"and one dtype, got key {_checks.shape(key)} {key.dtype} and "
                             f"value {_checks.shape(value)} {value.dtype}")
        held = self.keys[layer_idx]
        if held is None:
            return
        if key.shape[:2] != held.shape[:2] or key.shape[3] != held.shape[3]:
            raise ValueError(f"layer {layer_idx} of the cache holds keys of shape "
                             f"{_checks.shape(held)}, which new keys of shape "
                             f"{_checks.shape(key)} do not fit (batch, heads and width must "
                             f"match); reset() the cache for a new batch")
        if key.dtype != held.dtype or key.device != held.device:
            raise ValueError(f"layer {layer_idx} of the cache holds {held.dtype} keys on "
                             f"{held.device}, got {key.dtype} on {key.device}")

    @property
    def nbytes(self) -> int:
        """How many bytes the stored keys and values take.

        That is ``2 * layers * B * heads * T * d_head * bytes per number``, with ``T`` =
        :attr:`seq_len` (or ``max_len``, allocated at once).
        """
        return sum(t.numel() * t.element_size()
                   for t in (*self.keys, *self.values) if t is not None)

    def __repr__(self) -> str:
        return (f"KVCache(num_layers={self.num_layers}, max_len={self.max_len}, "
                f"seq_len={self.seq_len})")


def check_kv_cache(kv_cache: object, layer_idx: object = 0) -> int:
    """The check of a public ``forward`` that accepts ``kv_cache=`` and ``layer_idx=``: a
    :class:`KVCache` that has slot ``layer_idx``. Returns how many positions that slot holds.

    Raises:
        TypeError: ``kv_cache`` is not a :class:`KVCache`, or ``layer_idx`` not an int.
        ValueError: ``layer_idx`` is not one of the cache's slots.
    """
    _checks.check_type("kv_cache", kv_cache, KVCache, "a KVCache")
    _checks.check_int("layer_idx", layer_idx, low=0)
    if layer_idx >= kv_cache.num_layers:
        raise ValueError(f"layer_idx={layer_idx} is not a slot of a cache with "
                         f"{kv_cache.num_layers} layers")
    return kv_cache.length(layer_idx)
