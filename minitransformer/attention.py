"""Attention: softmax (chapter 5), scaled dot-product and multi-head attention (chapters 6 and 7)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"softmax expects a floating-point tensor, got {type(x).__name__}"
                        + (f" of dtype {x.dtype}" if isinstance(x, Tensor) else ""))
    if torch.isnan(x).any() or torch.isposinf(x).any():
        raise ValueError("softmax scores must not contain NaN or +inf")
    if x.dim() and not -x.dim() <= dim < x.dim():
        raise ValueError(f"softmax dim {dim} is out of range for a tensor of shape {tuple(x.shape)}")
    if x.dim() and x.shape[dim] == 0:
        raise ValueError(f"softmax got an empty dimension {dim} in a tensor of shape {tuple(x.shape)}")
    largest = x.amax(dim=dim, keepdim=True)
    if torch.isneginf(largest).any():
        raise ValueError(f"softmax got a slice along dim {dim} whose scores are all -inf "
                         f"(every position masked), in a tensor of shape {tuple(x.shape)}")
    exps = torch.exp(x - largest)
    return exps / exps.sum(dim=dim, keepdim=True)


def _warm_up_exp() -> None:
    """Call ``torch.exp`` once on a single number of each float type, before any real work.

    Measured here (torch 2.13.0 CPU build, 2 threads): in about one fresh process in ten, the first
    attention computed after import differed from PyTorch's by ~4e-5 instead of ~3e-7, and only
    that first call. One tiny ``exp`` per dtype at import removed it (0 bad runs in 40, against 4
    in 40 without it, and 5 in 40 with a warm-up that used ``matmul`` instead of ``exp``), which
    points at ``exp`` choosing its kernel lazily on its first, multi-threaded call.
    """
    for dtype in (torch.float32, torch.float64):
        torch.exp(torch.zeros(1, dtype=dtype))


_warm_up_exp()

# Queries are processed this many at a time, so only a (..., QUERY_BLOCK, S) slice of the score
# matrix exists at once instead of the whole (..., L, S): the idea behind FlashAttention (chapter 7).
QUERY_BLOCK = 128


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_attention_inputs(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                            dropout_p: float, scale: float | None) -> tuple[int, ...]:
    """Validate the arguments of :func:`scaled_dot_product_attention`; return the batch shape."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got "
                            + (f"dtype {t.dtype}" if isinstance(t, Tensor) else type(t).__name__))
        if t.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (positions, features), "
                             f"got shape {_shape(t)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must have the same dtype, got {query.dtype}, "
                        f"{key.dtype} and {value.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same last dimension, got query "
                         f"{_shape(query)} and key {_shape(key)}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same number of positions (dim -2), got key "
                         f"{_shape(key)} and value {_shape(value)}")
    if key.shape[-2] == 0:
        raise ValueError(f"key has no positions to attend to, shape {_shape(key)}")
    try:
        batch_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of query {_shape(query)}, key "
                         f"{_shape(key)} and value {_shape(value)} do not broadcast") from None
    # The scores' batch dimensions come from query and key only (value may broadcast further).
    scores_batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    scores_shape = (*scores_batch, query.shape[-2], key.shape[-2])
    if attn_mask is not None:
        _check_mask(attn_mask, scores_shape, "(..., L, S)")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) \
            or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a number or None, got {type(scale).__name__}")
    return tuple(batch_shape)


def _check_mask(attn_mask: Tensor, scores_shape: tuple[int, ...], described: str) -> None:
    """A mask must be boolean or floating and broadcast to the scores without enlarging them."""
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be boolean (True = may attend) or floating (added to the "
                        f"scores), got dtype {attn_mask.dtype}")
    try:
        broadcast = torch.broadcast_shapes(attn_mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(f"attn_mask of shape {_shape(attn_mask)} does not broadcast to the scores "
                         f"{described} = {tuple(scores_shape)}")


def _rows(mask: Tensor | None, rows: slice) -> Tensor | None:
    """The part of a mask that belongs to the queries ``rows`` (a mask may broadcast over them)."""
    if mask is None or mask.ndim < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., rows, :]


def _raise_all_masked(largest: Tensor, first_row: int) -> None:
    where = torch.nonzero(torch.isneginf(largest))[0].tolist()  # (batch..., row, 0)
    batch, row = tuple(where[:-2]), where[-2] + first_row
    raise ValueError(f"query {row}" + (f" of batch/head index {batch}" if batch else "")
                     + " has every key masked, so there is nothing to attend to (a softmax over "
                     "only -inf scores); let each query see at least one key (True = may attend)")


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

    The same arguments, in the same order and with the same meaning, as
    ``torch.nn.functional.scaled_dot_product_attention``. Any leading batch and head dimensions
    ``...`` are allowed (they broadcast).

    The queries are handled in blocks of ``QUERY_BLOCK`` rows, so only a slice of the ``(L, S)``
    score matrix is in memory at once; the result is the same as doing all rows together.

    Args:
        query: ``(..., L, E)``, what each of the L positions is looking for.
        key: ``(..., S, E)``, what each of the S positions offers.
        value: ``(..., S, Ev)``, what each of the S positions passes on.
        attn_mask: broadcastable to ``(..., L, S)``; boolean with True = may attend, or floating
            and added to the scores (``-inf`` hides a key).
        dropout_p: the probability of zeroing an attention weight (survivors scaled by
            ``1 / (1 - dropout_p)``), as in training; 0 for none.
        scale: multiplies the scores; default ``1 / sqrt(E)``.
        return_weights: also return the attention weights.

    Returns:
        The output ``(..., L, Ev)``; with ``return_weights=True`` the pair ``(output, weights)``,
        weights of shape ``(..., L, S)`` whose rows sum to 1 (the weights actually used: with
        dropout, after dropout).

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes that do not fit together (naming them), a mask that does not broadcast,
            ``dropout_p`` outside ``[0, 1)``, or a query whose keys are all masked.
    """
    batch_shape = _check_attention_inputs(query, key, value, attn_mask, dropout_p, scale)
    if query.shape[-2] == 0:                       # no queries: nothing to compute
        output = query.new_empty(*batch_shape, 0, value.shape[-1])
        return (output, query.new_empty(*batch_shape, 0, key.shape[-2])) if return_weights else output
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    hidden = added = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        hidden = ~attn_mask                        # True where a key is hidden from a query
    elif attn_mask is not None:
        added = attn_mask.to(query.dtype)
    query = query * scale                          # (..., L, E), cheaper than scaling (L, S) scores
    key_t = key.transpose(-2, -1)                  # (..., E, S)
    # Without gradients to track, every block writes its scores into this one scratch tensor.
    tracks_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    n_block = min(query.shape[-2], QUERY_BLOCK)
    scores_batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])  # value may add more
    scratch = None if tracks_grad else query.new_empty(*scores_batch, n_block, key.shape[-2])
    outputs, weights = [], []
    for start in range(0, query.shape[-2], QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        q = query[..., rows, :]                                          # (..., l, E)
        out = None if scratch is None else scratch[..., : q.shape[-2], :]
        # 1. scores: how well each query matches each key (already scaled)
        scores = torch.matmul(q, key_t, out=out)                         # (..., l, S)
        # 2. mask: a hidden key gets -inf, so exp() turns it into exactly 0
        if hidden is not None:
            scores.masked_fill_(_rows(hidden, rows), float("-inf"))
        elif added is not None:
            scores.add_(_rows(added, rows))
        # 3. softmax over the keys: subtract each row's largest score, exponentiate, normalize
        # (the largest score is a constant that cancels, so gradients need not flow through it)
        largest = scores.detach().amax(dim=-1, keepdim=True)             # (..., l, 1)
        if torch.isneginf(largest).any():
            _raise_all_masked(largest, start)
        exps = scores.sub_(largest).exp_()                               # (..., l, S)
        total = exps.sum(dim=-1, keepdim=True)                           # (..., l, 1)
        if dropout_p > 0:
            exps = F.dropout(exps, dropout_p)
        # 4. the weighted sum of the values, divided by the total only now (fewer numbers)
        outputs.append(torch.matmul(exps, value) / total)                # (..., l, Ev)
        if return_weights:
            weights.append(exps / total)
    output = torch.cat(outputs, dim=-2)                                  # (..., L, Ev)
    if return_weights:
        return output, torch.cat(weights, dim=-2)                        # (..., L, S)
    return output


def _check_no_empty_rows(attn_mask: Tensor | None) -> None:
    """Raise when a mask hides every key from some query (PyTorch's fused kernel returns zeros)."""
    if attn_mask is None:
        return
    if attn_mask.dtype == torch.bool:
        empty = ~attn_mask.any(dim=-1)
    else:
        empty = torch.isneginf(attn_mask).all(dim=-1)
    if empty.any():
        where = torch.nonzero(empty)[0].tolist()
        raise ValueError(f"attn_mask of shape {_shape(attn_mask)} hides every key from a query "
                         f"(mask index {tuple(where)}), so there is nothing to attend to; let each "
                         f"query see at least one key (True = may attend)")


class MultiHeadAttention(nn.Module):
    """Several attention heads side by side, batch-first (chapter 7).

    The inputs are projected to queries, keys and values of width ``d_model``, split into
    ``num_heads`` heads of width ``d_k = d_model // num_heads``, attended per head, concatenated
    back to ``d_model`` and mixed by ``out_proj``. Equal to ``nn.MultiheadAttention(d_model,
    num_heads, batch_first=True)`` with the same weights (see :meth:`from_torch`).

    Args:
        d_model: the width of the token vectors.
        num_heads: the number of heads h; must divide ``d_model``.
        bias: give the four projections a bias.
        dropout: the dropout probability on the attention weights, in training mode only.
        device, dtype: where and in what precision to create the parameters.

    Sub-modules ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` are ``nn.Linear(d_model,
    d_model)``.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        for name, number in (("d_model", d_model), ("num_heads", num_heads)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 1:
                raise ValueError(f"{name} must be a positive int, got {number!r}")
        if d_model % num_heads:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model} and "
                             f"num_heads={num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.dropout = float(dropout)
        factory = {"device": device, "dtype": dtype}
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

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor,
                      attn_mask: Tensor | None) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got "
                                + (f"dtype {t.dtype}" if isinstance(t, Tensor) else type(t).__name__))
            if t.ndim != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got "
                                 f"{_shape(t)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(f"query, key and value must have the same batch size, got query "
                             f"{_shape(query)}, key {_shape(key)} and value {_shape(value)}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length, got key {_shape(key)} and "
                             f"value {_shape(value)}")
        if key.shape[1] == 0:
            raise ValueError(f"key has no positions to attend to, shape {_shape(key)}")
        if attn_mask is not None:
            scores_shape = (query.shape[0], self.num_heads, query.shape[1], key.shape[1])
            _check_mask(attn_mask, scores_shape, "(B, num_heads, L, S)")

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                attn_mask: Tensor | None = None, *,
                return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, L, d_model)``.
            key: ``(B, S, d_model)``; omitted: ``query`` (self-attention).
            value: ``(B, S, d_model)``; omitted: ``key``.
            attn_mask: broadcastable to ``(B, num_heads, L, S)``, boolean (True = may attend) or
                floating (added to the scores); e.g. :func:`causal_mask` or :func:`padding_mask`.
            return_weights: also return the per-head attention weights.

        Returns:
            The output ``(B, L, d_model)``; with ``return_weights=True`` also the weights
            ``(B, num_heads, L, S)``. Without weights PyTorch's fused kernel does the attention;
            with them, :func:`scaled_dot_product_attention`. Both give the same output.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, attn_mask)
        q = self.split_heads(self.q_proj(query))     # (B, h, L, d_k)
        k = self.split_heads(self.k_proj(key))       # (B, h, S, d_k)
        v = self.split_heads(self.v_proj(value))     # (B, h, S, d_k)
        dropout_p = self.dropout if self.training else 0.0
        if return_weights:
            heads, weights = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p,
                                                          return_weights=True)
        else:
            _check_no_empty_rows(attn_mask)
            heads = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p)
        output = self.out_proj(self.merge_heads(heads))  # (B, L, d_model)
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
            raise TypeError(f"from_torch expects an nn.MultiheadAttention, got {type(module).__name__}")
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
        """The same layer as an ``nn.MultiheadAttention(batch_first=True)`` (masks: see from_torch)."""
        weight = self.q_proj.weight
        bias = self.q_proj.bias is not None
        module = nn.MultiheadAttention(self.d_model, self.num_heads, dropout=self.dropout, bias=bias,
                                       batch_first=True, device=weight.device, dtype=weight.dtype)
        projections = (self.q_proj, self.k_proj, self.v_proj)
        with torch.no_grad():
            module.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
            module.out_proj.weight.copy_(self.out_proj.weight)
            if bias:
                module.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                module.out_proj.bias.copy_(self.out_proj.bias)
        return module.train(self.training)
