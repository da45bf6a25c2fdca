"""Attention: scaled dot-product attention (chapter 6), its memory-saving blocked version and
multi-head attention (chapter 7).

``scaled_dot_product_attention`` is the reference: it reads like the formula. ``blocked_attention``
computes the same numbers with only a slice of the score matrix in memory at once, and is the one
the benchmark (``benchmarks/attention.py``) times against PyTorch's fused kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer._checks import (
    check_divisible,
    check_float_tensor,
    check_int,
    check_mask,
    check_number,
    check_probability,
    check_same_dtype,
    factory_kwargs,
    shape,
)
from minitransformer.cache import KVCache, check_kv_cache
from minitransformer.functional import softmax

# blocked_attention's default: queries are processed this many at a time, so only a
# (..., QUERY_BLOCK, T_k) slice of the score matrix exists at once (chapter 7).
QUERY_BLOCK = 128


def _check_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *,
                     dropout_p: float = 0.0, scale: float | None = None) -> None:
    """Validate the arguments shared by the attention functions, once, at their entry."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_float_tensor(name, t, min_ndim=2)
    check_same_dtype(query=query, key=key, value=value)
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same last dimension, got query "
                         f"{shape(query)} and key {shape(key)}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same number of positions (dim -2), got key "
                         f"{shape(key)} and value {shape(value)}")
    if key.shape[-2] == 0:
        raise ValueError(f"key has no positions to attend to, shape {shape(key)}")
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of query {shape(query)}, key "
                         f"{shape(key)} and value {shape(value)} do not broadcast") from None
    if attn_mask is not None:
        # The scores' batch dimensions come from query and key only (value may broadcast further).
        scores_batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        check_mask(attn_mask, (*scores_batch, query.shape[-2], key.shape[-2]), "(..., T_q, T_k)")
        if attn_mask.is_floating_point():
            check_same_dtype(query=query, attn_mask=attn_mask)
    check_probability("dropout_p", dropout_p)
    if scale is not None:
        check_number("scale", scale)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention, written out: ``softmax(query @ key^T * scale + mask) @ value``.

    ``query, key, value, attn_mask`` come in the order of
    ``torch.nn.functional.scaled_dot_product_attention`` and mean the same. Unlike PyTorch,
    ``dropout_p`` and ``scale`` are keyword-only, there is no ``is_causal`` (pass
    :func:`~minitransformer.masks.causal_mask` as the mask: it aligns to the lower right, which
    cached decoding needs), a query whose keys are all masked is an error instead of zeros, so is
    a floating mask of only 0s and 1s, and ``return_weights`` also returns the weights. Leading
    batch and head dimensions ``...`` broadcast.

    Args:
        query: ``(..., T_q, d_k)``, what each of the T_q positions is looking for.
        key: ``(..., T_k, d_k)``, what each of the T_k positions offers.
        value: ``(..., T_k, d_v)``, what each of the T_k positions passes on.
        attn_mask: broadcastable to ``(..., T_q, T_k)``; boolean with True = may attend, or
            floating and added to the scores (0 keeps a key, ``-inf`` hides it).
        dropout_p: the probability of zeroing an attention weight (survivors scaled by
            ``1 / (1 - dropout_p)``), as in training; 0 for none.
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.
        return_weights: also return the attention weights.

    Returns:
        The output ``(..., T_q, d_v)``; with ``return_weights=True`` the pair ``(output, weights)``,
        weights ``(..., T_q, T_k)`` (the ones used: with dropout, after dropout).

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: shapes that do not fit together (naming them), a mask that does not broadcast,
            a floating mask of only 0s and 1s (use ``.bool()``), a query whose keys are all masked,
            ``dropout_p`` outside ``[0, 1)``.
    """
    _check_attention(query, key, value, attn_mask, dropout_p=dropout_p, scale=scale)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # 1. scores: how well each query matches each key
    scores = query @ key.transpose(-2, -1) * scale               # (..., T_q, T_k)
    # 2. mask: a hidden key gets -inf, which softmax turns into exactly 0
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    # 3. softmax over the keys: each query's weights sum to 1
    weights = softmax(scores, dim=-1)                             # (..., T_q, T_k)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p)
    # 4. the weighted sum of the values
    output = weights @ value                                      # (..., T_q, d_v)
    return (output, weights) if return_weights else output


def blocked_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    *,
    scale: float | None = None,
    query_block: int = QUERY_BLOCK,
) -> Tensor:
    """Attention with the queries taken ``query_block`` at a time (chapter 7).

    The rows of the score matrix are independent, so only a ``(..., query_block, T_k)`` slice of
    it needs to exist at once; the result is the same. Each block takes three steps: scores,
    mask, then PyTorch's fused ``torch.softmax`` written over the scores (without gradients to
    track, every block reuses one scratch tensor for them) and the weighted sum. No dropout and
    no weights: this is the version for speed and memory.

    Args:
        query, key, value, attn_mask, scale: as for :func:`scaled_dot_product_attention`.
        query_block: how many queries to process at once (at least 1).

    Returns:
        The output ``(..., T_q, d_v)``.

    Raises:
        TypeError, ValueError: as for :func:`scaled_dot_product_attention`, and for a
            ``query_block`` that is not a positive int.
    """
    _check_attention(query, key, value, attn_mask, scale=scale)
    query_block = check_int("query_block", query_block)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    length = query.shape[-2]
    if length == 0:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        return query.new_empty(*batch, 0, value.shape[-1])
    hidden = ~attn_mask if attn_mask is not None and attn_mask.dtype == torch.bool else None
    added = attn_mask if attn_mask is not None and attn_mask.is_floating_point() else None
    query = query * scale                          # (..., T_q, d_k): fewer numbers than the scores
    key_t = key.transpose(-2, -1)                  # (..., d_k, T_k)
    tracks_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    scores_batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    scratch = None if tracks_grad else query.new_empty(*scores_batch, min(length, query_block),
                                                       key.shape[-2])
    outputs = []
    for start in range(0, length, query_block):
        rows = slice(start, start + query_block)
        q = query[..., rows, :]                                          # (..., b, d_k)
        out = None if scratch is None else scratch[..., : q.shape[-2], :]
        scores = torch.matmul(q, key_t, out=out)                         # (..., b, T_k)
        if hidden is not None:
            scores.masked_fill_(_rows(hidden, rows), float("-inf"))
        elif added is not None:
            scores.add_(_rows(added, rows))
        weights = torch.softmax(scores, dim=-1, out=out)                 # over the scores
        outputs.append(torch.matmul(weights, value))                     # (..., b, d_v)
    return torch.cat(outputs, dim=-2)                                    # (..., T_q, d_v)


def _rows(mask: Tensor, rows: slice) -> Tensor:
    """The part of a mask that belongs to the queries ``rows`` (a mask may broadcast over them)."""
    if mask.ndim < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., rows, :]


class MultiHeadAttention(nn.Module):
    """Several attention heads side by side, batch-first (chapter 7).

    The inputs are projected to queries, keys and values of width ``d_model``, split into
    ``num_heads`` heads of width ``d_k = d_model // num_heads``, attended per head, concatenated
    back to ``d_model`` and mixed by ``out_proj``. Equal to ``nn.MultiheadAttention(d_model,
    num_heads, batch_first=True)`` with the same weights (see :meth:`from_torch`), but masks are
    boolean with True = may attend and passed by keyword (``attn_mask=``).

    Args:
        d_model: the width of the token vectors.
        num_heads: the number of heads h; must divide ``d_model``.
        bias: give the four projections a bias.
        dropout: the dropout probability on the attention weights, in training mode only.
        device, dtype: where and in what precision to create the parameters.

    Sub-modules ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` are ``nn.Linear(d_model,
    d_model)``. :meth:`forward` validates its inputs once and calls :meth:`attend`, the unchecked
    path that layers and models call. Without weights requested, the heads go through PyTorch's
    fused kernel, with them through the written-out attention: in training with ``dropout > 0``
    the two draw different dropout masks.

    Raises:
        TypeError: a size that is not an int, a dropout that is not a number, a non-float dtype.
        ValueError: a size below 1, ``num_heads`` not dividing ``d_model``, dropout outside [0, 1).
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        d_model, num_heads = check_int("d_model", d_model), check_int("num_heads", num_heads)
        check_divisible(d_model, num_heads)
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.dropout = check_probability("dropout", dropout)
        factory = factory_kwargs(device, dtype)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **factory)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, d_model)`` -> ``(B, num_heads, T, d_k)``: head i gets features i*d_k ... ."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_k).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(B, num_heads, T, d_k)`` -> ``(B, T, d_model)``: the heads side by side again."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values :meth:`attend` reads, projected and split into heads:
        ``(B, T_k, d_model)`` each -> two ``(B, num_heads, T_k, d_k)``. A decoder's
        cross-attention reads the same source at every step, so it can project it once and pass
        the pair to :meth:`attend` as ``projected_kv`` (chapter 10). Unchecked."""
        return self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor,
                     attn_mask: Tensor | None = None, past: int = 0) -> None:
        """Validate :meth:`forward`'s arguments (``key`` and ``value`` already filled in);
        ``past`` keys held in a cache come before ``key``'s."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_float_tensor(name, t)
            if t.ndim != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got "
                                 f"{shape(t)}")
        check_same_dtype(query=query, key=key, value=value)
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"query, key and value must have the same batch size, got query "
                             f"{shape(query)}, key {shape(key)} and value {shape(value)}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length, got key {shape(key)} and "
                             f"value {shape(value)}")
        if key.shape[1] == 0:
            raise ValueError(f"key has no positions to attend to, shape {shape(key)}")
        if attn_mask is not None:
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], past + key.shape[1])
            check_mask(attn_mask, scores_shape, "(B, num_heads, T_q, T_k)")
            if attn_mask.is_floating_point():
                check_same_dtype(query=query, attn_mask=attn_mask)

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, *,
                attn_mask: Tensor | None = None, return_weights: bool = False,
                kv_cache: KVCache | None = None,
                layer_idx: int = 0) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``: validate once, then :meth:`attend`.

        Args:
            query: ``(B, T_q, d_model)``.
            key: ``(B, T_k, d_model)``; omitted: ``query`` (self-attention).
            value: ``(B, T_k, d_model)``; omitted: ``key``.
            attn_mask: keyword-only, broadcastable to ``(B, num_heads, T_q, T_k)``, boolean
                (True = may attend) or floating (added to the scores); e.g.
                :func:`~minitransformer.masks.causal_mask` or
                :func:`~minitransformer.masks.padding_mask`. (``nn.MultiheadAttention``'s 4th
                positional argument is ``key_padding_mask``, with True = *masked*.)
            return_weights: also return the per-head attention weights.
            kv_cache: a :class:`~minitransformer.cache.KVCache` (chapter 11): the new keys and
                values are appended to slot ``layer_idx``, and the queries attend to all it
                holds, so ``T_k`` counts the cached positions too (the mask is
                ``causal_mask(T_q, T_k)``, aligned to the lower right).
            layer_idx: this layer's slot in ``kv_cache``.

        Returns:
            The output ``(B, T_q, d_model)``; with ``return_weights=True`` also the weights
            ``(B, num_heads, T_q, T_k)``.

        Raises:
            TypeError, ValueError: inputs that are not float tensors of shape
                ``(B, T, d_model)``, that do not fit together or the cache, or a bad mask (as
                for :func:`scaled_dot_product_attention`).
        """
        key = query if key is None else key
        value = key if value is None else value
        past = 0 if kv_cache is None else check_kv_cache(kv_cache, layer_idx)
        self._check_inputs(query, key, value, attn_mask, past)
        return self.attend(query, key, value, attn_mask=attn_mask, return_weights=return_weights,
                           kv_cache=kv_cache, layer_idx=layer_idx)

    def attend(self, query: Tensor, key: Tensor | None, value: Tensor | None, *,
               attn_mask: Tensor | None = None, return_weights: bool = False,
               kv_cache: KVCache | None = None, layer_idx: int = 0,
               projected_kv: tuple[Tensor, Tensor] | None = None,
               ) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` without validation: the path layers and models call.

        A model validates its input once in its own ``forward`` and then calls its layers'
        ``attend`` on every step, so that no input is checked twice. Arguments and results as for
        :meth:`forward`, but ``key`` and ``value`` must be given (unless ``projected_kv`` is), and
        bad input gives PyTorch's errors (or a wrong result) instead of ours.

        Without weights, the heads go through PyTorch's fused kernel
        ``F.scaled_dot_product_attention``; with ``return_weights=True`` through the written-out
        attention of chapter 6. The two give the same output, except that in training with
        ``dropout > 0`` they draw different dropout masks.

        With a ``kv_cache``, only the new positions are projected; their keys and values join
        the cached ones (chapter 11).

        ``projected_kv``: the keys and values already projected and split into heads, each
        ``(B, num_heads, T_k, d_k)`` (from :meth:`project_kv`); they are read instead of
        ``key`` and ``value``, which may then be ``None``. A decoder's cross-attention projects
        the source once per sentence this way (chapter 10).
        """
        q = self.split_heads(self.q_proj(query))     # (B, h, T_q, d_k)
        if projected_kv is None:
            k = self.split_heads(self.k_proj(key))   # (B, h, T_k, d_k)
            v = self.split_heads(self.v_proj(value))
        else:
            k, v = projected_kv
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)  # (B, h, T_cached + T_k, d_k)
        dropout_p = self.dropout if self.training else 0.0
        if return_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)        # (B, h, T_q, T_k)
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            elif attn_mask is not None:
                scores = scores + attn_mask
            weights = softmax(scores, dim=-1)
            if dropout_p > 0:
                weights = F.dropout(weights, dropout_p)
            heads = weights @ v                                           # (B, h, T_q, d_k)
        else:
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p)
        output = self.out_proj(self.merge_heads(heads))                   # (B, T_q, d_model)
        return (output, weights) if return_weights else output

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A copy of an ``nn.MultiheadAttention`` (same weights, dropout and training mode).

        Its packed ``in_proj_weight`` ``(3 d_model, d_model)`` holds the query, key and value
        projections in that order. The copy is batch-first whatever ``module.batch_first`` is,
        and its masks mean the opposite of PyTorch's: where ``nn.MultiheadAttention`` takes
        ``attn_mask=m`` or ``key_padding_mask=p`` (True = *masked*), give this module ``~m`` or
        ``~p[:, None, None, :]`` (True = may attend).

        Raises:
            TypeError: ``module`` is not an ``nn.MultiheadAttention``.
            ValueError: it uses features this class does not have (different ``kdim``/``vdim``,
                ``add_bias_kv``, ``add_zero_attn``).
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects an nn.MultiheadAttention, got "
                            f"{type(module).__name__}")
        if not module._qkv_same_embed_dim:
            raise ValueError(f"from_torch needs kdim == vdim == embed_dim, got kdim={module.kdim}, "
                             f"vdim={module.vdim}, embed_dim={module.embed_dim}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv or add_zero_attn")
        weight = module.in_proj_weight
        bias = module.in_proj_bias is not None
        ours = cls(module.embed_dim, module.num_heads, bias=bias, dropout=module.dropout,
                   device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for proj, w in zip((ours.q_proj, ours.k_proj, ours.v_proj), weight.chunk(3)):
                proj.weight.copy_(w)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if bias:
                for proj, b in zip((ours.q_proj, ours.k_proj, ours.v_proj),
                                   module.in_proj_bias.chunk(3)):
                    proj.bias.copy_(b)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """The same layer as an ``nn.MultiheadAttention(batch_first=True)`` (masks: see
        from_torch)."""
        weight = self.q_proj.weight
        bias = self.q_proj.bias is not None
        module = nn.MultiheadAttention(self.d_model, self.num_heads, dropout=self.dropout,
                                       bias=bias, batch_first=True, device=weight.device,
                                       dtype=weight.dtype)
        projections = (self.q_proj, self.k_proj, self.v_proj)
        with torch.no_grad():
            module.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
            module.out_proj.weight.copy_(self.out_proj.weight)
            if bias:
                module.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                module.out_proj.bias.copy_(self.out_proj.bias)
        return module.train(self.training)
