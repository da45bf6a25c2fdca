"""The paged KV cache: keys and values in fixed-size blocks, found through a block table
(chapter 18; Kwon et al., 2023, vLLM's PagedAttention).

Chapter 11's :class:`~minitransformer.cache.KVCache` gives each sequence one contiguous
tensor, sized for the longest text it may reach. A server does not know how long an answer will
be, so such a cache reserves memory for tokens that never come. A paged cache cuts the memory
into *blocks* of ``block_size`` positions (16 here by default), as an operating system cuts
memory into pages. A request owns a list of blocks, its *block table*: position ``p`` of the
request lives in block ``table[p // block_size]`` at offset ``p % block_size``. A request takes
a new block only when its last one is full, and gives all of them back when it ends; at most
``block_size - 1`` positions per request are reserved and unused.

:class:`BlockPool` holds every layer's blocks and hands them out. :func:`gather_blocks` copies a
request's blocks back into the contiguous layout of chapter 11, and :func:`paged_attention`
attends over the blocks one at a time without gathering them: each block gives a partial
softmax (its largest score, its sum of exponentials and its weighted sum of values), and
:func:`merge_partials` combines two partials into the softmax over both, the step of the
*online softmax* behind FlashAttention (Dao et al., 2022) and flash-decoding.

:class:`PagedView` lets a model's ``forward`` read and write the pool as if it were a
:class:`~minitransformer.cache.KVCache` holding a left-padded batch; the engine of
:mod:`minitransformer.serving` runs the model through it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from minitransformer import _checks
from minitransformer.cache import KVCache

BLOCK_SIZE = 16


class BlockPool:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` positions, for every layer.

    The storage is allocated once, zero-filled: ``keys`` and ``values`` of shape
    ``(num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)``. The extra last block
    (number ``num_blocks``, :attr:`null_block`) is never handed out: padding reads from it and
    writes to it, so a padded batch never touches a request's blocks.

    Blocks are handed out by :meth:`allocate` and given back by :meth:`free`; a freed block is
    the first to be handed out again (a stack), and a block cannot be freed twice or freed
    without having been allocated. For prefix caching, :meth:`share` gives a block one more
    user (a reference count): :meth:`free` then takes one user away, and the block is free
    again only when its last user gives it back.

    A block whose keys :meth:`cache` made findable by a key (:meth:`find`; the engine's key is
    the adapter and the tokens from the prompt's start to the block's end) keeps that key and
    its keys and values when its last user gives it back: it is *evictable*, free but still
    holding a cached prefix, in a queue ordered by when it was last given back (vLLM's free
    block queue).
    :meth:`share` takes it out of the queue again (a cache hit revives it). :meth:`allocate`
    hands out empty blocks first, then evicts the least recently used evictable blocks, each
    losing its key (``evictions`` counts them). A block is thus in one of three states: held
    (by one user or more), evictable, or empty; :attr:`num_free` counts the last two.

    Args:
        num_blocks: how many blocks the pool holds.
        block_size: positions per block.
        num_layers, num_kv_heads, head_dim: the model's sizes (the key and value heads).
        device, dtype: where and in what precision to allocate the storage.

    Raises:
        TypeError, ValueError: a size that is not a positive int, a bad device or dtype.
    """

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE, *, num_layers: int,
                 num_kv_heads: int, head_dim: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        self.num_blocks = _checks.check_int("num_blocks", num_blocks)
        self.block_size = _checks.check_int("block_size", block_size)
        self.num_layers = _checks.check_int("num_layers", num_layers)
        self.num_kv_heads = _checks.check_int("num_kv_heads", num_kv_heads)
        self.head_dim = _checks.check_int("head_dim", head_dim)
        factory = _checks.factory_kwargs(device, dtype)
        shape = (num_layers, num_blocks + 1, block_size, num_kv_heads, head_dim)
        self.keys = torch.zeros(shape, **factory)
        self.values = torch.zeros(shape, **factory)
        self._free = list(range(num_blocks - 1, -1, -1))   # a stack: block 0 is handed out first
        self._allocated: set[int] = set()
        self._refs: dict[int, int] = {}         # the users of each allocated block
        self._cached: dict[Hashable, int] = {}  # key -> the block that holds its keys
        self._key_of: dict[int, Hashable] = {}  # block -> its key (held or evictable)
        self._evictable: dict[int, None] = {}   # unused cached blocks, least recently used first
        self.evictions = 0                      # cached blocks evicted so far
        self._gathered: Tensor | None = None    # the buffer of gathered() (keys, values)

    @property
    def null_block(self) -> int:
        """The block that padding reads and writes; never allocated."""
        return self.num_blocks

    @property
    def num_free(self) -> int:
        """How many blocks no user holds (what :meth:`allocate` can hand out): the empty ones
        and the evictable ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        """How many free blocks still hold a cached prefix (evicted when no empty one is
        left)."""
        return len(self._evictable)

    @property
    def evictable(self) -> tuple[int, ...]:
        """The evictable blocks, the next to be evicted (least recently used) first."""
        return tuple(self._evictable)

    @property
    def allocated(self) -> frozenset[int]:
        """The blocks handed out and not freed."""
        return frozenset(self._allocated)

    @property
    def nbytes(self) -> int:
        """The bytes of the storage (the pool's blocks and the null block)."""
        return 2 * self.keys.numel() * self.keys.element_size()

    @property
    def block_nbytes(self) -> int:
        """How many bytes one block holds (the keys and values of ``block_size`` positions in
        every layer)."""
        return self.nbytes // (self.num_blocks + 1)

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks ``num_tokens`` positions need: ``ceil(num_tokens / block_size)``."""
        _checks.check_int("num_tokens", num_tokens, low=0)
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int] | None:
        """Hand out ``n`` free blocks, or ``None`` (and nothing) when fewer are free: the
        caller waits, or frees blocks elsewhere, and asks again. Empty blocks go first; then
        the least recently used evictable blocks, which lose their keys (:meth:`find` no
        longer finds them).

        Raises:
            TypeError, ValueError: ``n`` is not an int >= 0.
        """
        _checks.check_int("n", n, low=0)
        if n > self.num_free:
            return None
        blocks = [self._free.pop() for _ in range(min(n, len(self._free)))]
        while len(blocks) < n:
            block = next(iter(self._evictable))                 # the least recently used
            del self._evictable[block]
            del self._cached[self._key_of.pop(block)]
            self.evictions += 1
            blocks.append(block)
        self._allocated.update(blocks)
        self._refs.update(dict.fromkeys(blocks, 1))
        return blocks

    def share(self, blocks: Sequence[int]) -> None:
        """Give each of ``blocks`` one more user (prefix caching): it is freed when the last
        one gives it back. An evictable block leaves the queue: it is held again, with the keys
        and values it held.

        Raises:
            ValueError: a block that is neither allocated nor evictable.
        """
        for block in blocks:
            if block not in self._allocated and block not in self._evictable:
                raise ValueError(f"block {block} is neither allocated nor cached: it cannot be "
                                 f"shared")
        for block in blocks:
            if block in self._evictable:
                del self._evictable[block]
                self._allocated.add(block)
            self._refs[block] = self._refs.get(block, 0) + 1

    def users(self, block: int) -> int:
        """How many requests hold ``block`` (0: it is free)."""
        return self._refs.get(block, 0)

    def cache(self, block: int, key: Hashable) -> bool:
        """Make the allocated ``block``, full, findable by ``key`` (:meth:`find`), so that it
        keeps its keys and values, evictable, after its last user frees it. Returns whether it
        did: not when ``key`` already names a block, or ``block`` already has a key (the first
        stays, as vLLM keeps it: a block table only ever grows).

        Raises:
            ValueError: ``block`` is not allocated.
        """
        _checks.check_int("block", block, low=0)
        if block not in self._allocated:
            raise ValueError(f"block {block} is not allocated: only a block that holds keys "
                             f"can be cached")
        if key in self._cached or block in self._key_of:
            return False
        self._cached[key], self._key_of[block] = block, key
        return True

    def find(self, key: Hashable) -> int | None:
        """The block that :meth:`cache` made findable by ``key``, held or evictable, or
        ``None`` (never cached, or evicted since)."""
        return self._cached.get(key)

    def key_of(self, block: int) -> Hashable | None:
        """The key that finds ``block``, or ``None`` when it is not cached."""
        return self._key_of.get(block)

    def free(self, blocks: Sequence[int]) -> list[int]:
        """Give ``blocks`` back to the pool: each loses a user, and those left with none are
        free again (returned): the cached ones evictable, the most recently used, the last of
        ``blocks`` to be evicted first (a prefix's end is worth less than its start without
        it); the others empty. All or nothing: nothing is freed when one of them is not
        allocated.

        Raises:
            TypeError: ``blocks`` is not a list of ints.
            ValueError: a block that is not allocated (freed already, or never handed out), or
                named twice.
        """
        _checks.check_type("blocks", blocks, (list, tuple), "a list of block numbers")
        for block in blocks:
            _checks.check_int("block", block, low=0)
            if block not in self._allocated:
                raise ValueError(f"block {block} is not allocated (freed already or never "
                                 f"handed out): freeing it could give it to two requests")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks {list(blocks)} names a block twice")
        freed = []
        for block in blocks:
            self._refs[block] -= 1
            if not self._refs[block]:
                del self._refs[block]
                freed.append(block)
        self._allocated.difference_update(freed)
        for block in reversed(freed):
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._free.append(block)
        return freed

    def gathered(self, slots: int) -> tuple[Tensor, Tensor]:
        """Two tensors ``(slots, num_kv_heads, head_dim)`` into which :meth:`PagedView.update`
        gathers a layer's keys and values: views of one buffer that the pool keeps and grows,
        so that every layer of every step writes into the same memory. Gathering into a fresh
        tensor of a few megabytes took two to five times as long as into memory used before,
        on the course's CPU: the system hands new memory out page by page, zeroed on first
        touch. The buffer at least doubles when it grows (a decoding batch widens by a
        position a step). What one call returns is overwritten by the next call on this pool,
        from any view or thread."""
        _checks.check_int("slots", slots, low=0)
        per = self.num_kv_heads * self.head_dim
        if self._gathered is None or self._gathered.shape[1] < slots * per:
            size = max(slots * per, 0 if self._gathered is None else 2 * self._gathered.shape[1])
            with torch.inference_mode(False):     # a normal tensor, writable in any mode
                self._gathered = self.keys.new_empty(2, size)
        keys, values = self._gathered[:, :slots * per].unbind(0)
        return (keys.view(slots, self.num_kv_heads, self.head_dim),
                values.view(slots, self.num_kv_heads, self.head_dim))

    def view(self, block_tables: Sequence[Sequence[int]], cached: Sequence[int],
             new: int) -> PagedView:
        """A :class:`PagedView` of this pool for one forward pass of a batch: row ``b`` holds
        ``cached[b]`` positions in the blocks ``block_tables[b]`` and takes ``new`` more."""
        return PagedView(self, block_tables, cached, new)

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"num_free={self.num_free}, num_evictable={self.num_evictable})")


class PagedView(KVCache):
    """A batch's blocks in a :class:`BlockPool`, seen by a model as a
    :class:`~minitransformer.cache.KVCache` that holds a left-padded batch (chapter 18).

    Row ``b`` has ``cached[b]`` positions in its blocks and takes ``new`` positions in this
    forward pass. With ``P = max(cached)``, the view holds ``P`` positions (:attr:`seq_len`):
    row ``b``'s are the last ``cached[b]``, after ``P - cached[b]`` padding ones that read the
    null block. :meth:`update` writes the new keys and values into the rows' blocks (which must
    have room: allocate first) and returns ``(B, heads, P + new, head_dim)`` gathered from the
    blocks into the pool's buffer (:meth:`BlockPool.gathered`), valid until the next update:
    all a layer's attention needs. The model then takes ``attention_mask`` ``(B, P + new)``
    (False on the padding) and ``position_ids`` ``(B, new)``.
    """

    def __init__(self, pool: BlockPool, block_tables: Sequence[Sequence[int]],
                 cached: Sequence[int], new: int):
        super().__init__(pool.num_layers)
        self.pool = pool
        device = pool.keys.device
        batch = len(block_tables)
        width = max(cached) + new if batch else new
        self._past = width - new
        # column j of row b is the row's position j - (width - cached[b] - new)
        lengths = torch.tensor([c + new for c in cached], dtype=torch.long, device=device)
        columns = torch.arange(width, device=device)
        positions = columns - (width - lengths)[:, None]                 # (B, width)
        self.attention_mask = positions >= 0
        self.position_ids = positions[:, width - new:]                   # (B, new)
        null = torch.full((batch, 1), pool.null_block, dtype=torch.long, device=device)
        longest = max((len(t) for t in block_tables), default=0)
        table = torch.tensor([list(t) + [pool.null_block] * (longest - len(t))
                              for t in block_tables], dtype=torch.long, device=device)
        table = torch.cat([table.reshape(batch, longest), null], dim=1)  # (B, blocks + 1)
        block = torch.where(positions < 0, longest, positions // pool.block_size)
        slots = (table.gather(1, block) * pool.block_size
                 + positions.clamp(min=0) % pool.block_size)             # (B, width)
        if bool((slots[:, width - new:] // pool.block_size == pool.null_block).any()):
            raise ValueError("a row has no block for its new positions: allocate first")
        self._read = slots.flatten()
        self._write = slots[:, width - new:].flatten()                   # (B new,)
        self._batch, self._width, self._new = batch, width, new

    @property
    def seq_len(self) -> int:
        """The padded number of cached positions ``P`` (every layer alike)."""
        return self._past

    def length(self, layer_idx: int) -> int:
        return self._past

    def update(self, layer_idx: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new ``key`` and ``value`` ``(B, heads, new, head_dim)`` of layer
        ``layer_idx`` into the rows' blocks; return all of the batch's keys and values,
        ``(B, heads, P + new, head_dim)``, gathered from the blocks (padding from the null
        block). Without autograd (``torch.no_grad``, ``torch.inference_mode``) they are
        gathered into the pool's buffer (:meth:`BlockPool.gathered`), overwritten by the next
        ``update`` of any view of this pool: use them before that (a layer's attention does),
        and give each thread its own pool."""
        pool = self.pool
        batch, heads, new, width = key.shape
        if ((batch, new) != (self._batch, self._new) or heads != pool.num_kv_heads
                or width != pool.head_dim or value.shape != key.shape):
            raise ValueError(f"the paged view holds {self._batch} rows of {self._new} new "
                             f"positions and {pool.num_kv_heads} heads of size "
                             f"{pool.head_dim}, got keys of shape {_checks.shape(key)} and "
                             f"values of shape {_checks.shape(value)}")
        flat_keys = pool.keys[layer_idx].view(-1, heads, width)          # (slots, h, d)
        flat_values = pool.values[layer_idx].view(-1, heads, width)
        flat_keys.index_copy_(0, self._write, key.transpose(1, 2).reshape(-1, heads, width))
        flat_values.index_copy_(0, self._write,
                                value.transpose(1, 2).reshape(-1, heads, width))
        if torch.is_grad_enabled():          # autograd may keep them for the backward pass
            keys = flat_keys.index_select(0, self._read)
            values = flat_values.index_select(0, self._read)
        else:
            keys, values = pool.gathered(self._read.numel())
            torch.index_select(flat_keys, 0, self._read, out=keys)
            torch.index_select(flat_values, 0, self._read, out=values)
        keys = keys.view(batch, self._width, heads, width)
        values = values.view(batch, self._width, heads, width)
        return keys.transpose(1, 2), values.transpose(1, 2)              # (B, h, P + new, d)

    def reset(self) -> None:
        self.keys: list[Tensor | None] = [None] * self.num_layers
        self.values: list[Tensor | None] = [None] * self.num_layers
        self._lengths = [0] * self.num_layers

    @property
    def nbytes(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"PagedView(rows={self._batch}, seq_len={self._past}, new={self._new})"


def _check_blocks(key_blocks: object, value_blocks: object) -> None:
    _checks.check_float_tensor("key_blocks", key_blocks, ndim=4)
    _checks.check_float_tensor("value_blocks", value_blocks, ndim=4)
    if key_blocks.shape != value_blocks.shape:
        raise ValueError(f"key_blocks and value_blocks must have one shape (num_blocks, "
                         f"block_size, num_kv_heads, head_dim), got "
                         f"{_checks.shape(key_blocks)} and {_checks.shape(value_blocks)}")


def _check_table(block_table: object, length: object, key_blocks: Tensor) -> list[int]:
    """A block table of block numbers of ``key_blocks`` that holds ``length`` positions."""
    _checks.check_type("block_table", block_table, (list, tuple), "a list of block numbers")
    table = [_checks.check_int("block_table[i]", b, low=0) for b in block_table]
    for block in table:
        if block >= key_blocks.shape[0]:
            raise ValueError(f"block_table names block {block}, outside the "
                             f"{key_blocks.shape[0]} blocks")
    _checks.check_int("length", length, low=1)
    room = len(table) * key_blocks.shape[1]
    if length > room:
        raise ValueError(f"length={length} positions do not fit the {len(table)} blocks of "
                         f"{key_blocks.shape[1]} positions of block_table ({room})")
    return table


def gather_blocks(blocks: Tensor, block_table: Sequence[int], length: int) -> Tensor:
    """A request's keys (or values) as one contiguous tensor, from its blocks.

    Args:
        blocks: ``(num_blocks, block_size, num_kv_heads, head_dim)``, one layer of a pool
            (``pool.keys[layer]``).
        block_table: the request's blocks, in order.
        length: how many positions the request holds (its last block may be partly filled).

    Returns:
        ``(num_kv_heads, length, head_dim)``: chapter 11's layout of one row of a cache.

    Raises:
        TypeError, ValueError: tensors or a table that do not fit, a length past the blocks.
    """
    _checks.check_float_tensor("blocks", blocks, ndim=4)
    table = _check_table(block_table, length, blocks)
    picked = blocks[torch.tensor(table, dtype=torch.long, device=blocks.device)]  # (n, bs, h, d)
    return picked.flatten(0, 1)[:length].transpose(0, 1).contiguous()             # (h, L, d)


def merge_partials(m1: Tensor, l1: Tensor, o1: Tensor, m2: Tensor, l2: Tensor,
                   o2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Combine the softmax-weighted sums of two sets of keys into the one over both: the
    online-softmax step.

    A partial over some keys is ``(m, l, o)``: ``m`` the largest score, ``l = sum(exp(s - m))``
    and ``o = sum(exp(s - m) * v)``, all relative to its own ``m``. Over both sets the largest
    score is ``m = max(m1, m2)``, so each partial is rescaled by ``exp(m_i - m)`` before the sums
    are added; the attention output is ``o / l`` at the end. A partial over no keys has
    ``m = -inf`` and ``l = o = 0``.

    Args:
        m1, l1: ``(...)``; o1: ``(..., head_dim)``; the same for the second partial.

    Returns:
        ``(m, l, o)`` of the union.

    Raises:
        TypeError, ValueError: tensors that are not floating or whose shapes do not fit.
    """
    for name, t in (("m1", m1), ("l1", l1), ("o1", o1), ("m2", m2), ("l2", l2), ("o2", o2)):
        _checks.check_float_tensor(name, t)
    if not (m1.shape == l1.shape == m2.shape == l2.shape and o1.shape == o2.shape
            and o1.shape[:-1] == m1.shape):
        raise ValueError(f"m and l must have one shape (...) and o (..., head_dim), got m1 "
                         f"{_checks.shape(m1)}, l1 {_checks.shape(l1)}, o1 {_checks.shape(o1)}, "
                         f"m2 {_checks.shape(m2)}, l2 {_checks.shape(l2)}, o2 "
                         f"{_checks.shape(o2)}")
    return _merge(m1, l1, o1, m2, l2, o2)


def _merge(m1: Tensor, l1: Tensor, o1: Tensor, m2: Tensor, l2: Tensor,
           o2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`merge_partials` without the checks."""
    m = torch.maximum(m1, m2)
    # a partial over no keys (m = -inf) weighs 0; exp(-inf - -inf) would be NaN
    a1 = torch.where(torch.isneginf(m1), 0.0, torch.exp(m1 - m))
    a2 = torch.where(torch.isneginf(m2), 0.0, torch.exp(m2 - m))
    return m, a1 * l1 + a2 * l2, a1[..., None] * o1 + a2[..., None] * o2


def _partial(query: Tensor, keys: Tensor, values: Tensor,
             scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The partial ``(m, l, o)`` of ``query`` ``(h, d)`` over ``keys``/``values``
    ``(h, n, d)``."""
    scores = torch.einsum("hd,hnd->hn", query, keys) * scale        # (h, n)
    m = scores.amax(dim=-1)                                          # (h,)
    weights = torch.exp(scores - m[:, None])                         # (h, n)
    return m, weights.sum(dim=-1), torch.einsum("hn,hnd->hd", weights, values)


def paged_attention(query: Tensor, key_blocks: Tensor, value_blocks: Tensor,
                    block_table: Sequence[int], length: int, *,
                    scale: float | None = None) -> Tensor:
    """One new token's attention over a request's cached keys and values, block by block,
    without gathering them (flash-decoding's idea on one request).

    Each block gives a partial softmax over its positions (the last block only over its first
    ``length - (n - 1) * block_size``); :func:`merge_partials` folds them together in order, and
    the output is the weighted sum divided by the sum of weights. The result equals
    ``softmax(q k^T * scale) v`` over the gathered keys (:func:`gather_blocks`) within float
    rounding.

    Args:
        query: ``(num_heads, head_dim)``, the new token's query in every head.
        key_blocks, value_blocks: ``(num_blocks, block_size, num_kv_heads, head_dim)``, one
            layer of a :class:`BlockPool`. With fewer key heads than query heads, query head
            ``j`` reads key head ``j // (num_heads // num_kv_heads)`` (grouped-query attention).
        block_table: the request's blocks, in order.
        length: the positions the request holds, the new token's included.
        scale: multiplies the scores; ``None`` is ``1 / sqrt(head_dim)``.

    Returns:
        ``(num_heads, head_dim)``.

    Raises:
        TypeError, ValueError: tensors of the wrong type or shape, a table or length that does
            not fit.
    """
    _check_blocks(key_blocks, value_blocks)
    _checks.check_float_tensor("query", query, ndim=2)
    heads, width = query.shape
    kv_heads = key_blocks.shape[2]
    if width != key_blocks.shape[3] or heads % kv_heads:
        raise ValueError(f"query of shape {_checks.shape(query)} does not fit blocks of "
                         f"{kv_heads} heads of width {key_blocks.shape[3]}")
    _checks.check_same_dtype(query=query, key_blocks=key_blocks, value_blocks=value_blocks)
    table = _check_table(block_table, length, key_blocks)
    scale = 1.0 / math.sqrt(width) if scale is None else _checks.check_number("scale", scale)
    group = heads // kv_heads
    m = torch.full((heads,), float("-inf"), dtype=query.dtype, device=query.device)
    total = torch.zeros(heads, dtype=query.dtype, device=query.device)
    out = torch.zeros(heads, width, dtype=query.dtype, device=query.device)
    block_size = key_blocks.shape[1]
    for i, block in enumerate(table[:-(-length // block_size)]):
        n = min(block_size, length - i * block_size)                  # the filled positions
        keys = key_blocks[block, :n].transpose(0, 1).repeat_interleave(group, dim=0)
        values = value_blocks[block, :n].transpose(0, 1).repeat_interleave(group, dim=0)
        m, total, out = _merge(m, total, out, *_partial(query, keys, values, scale))
    return out / total[:, None]
