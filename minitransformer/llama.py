"""From GPT-2 to Llama: the four changes in the block of today's open models (chapter 14).

A :class:`Llama` is chapter 9's GPT with four parts swapped, one idea each:

* :class:`~minitransformer.layers.RMSNorm` for layer norm: no mean subtracted, no bias;
* rotary positions (:mod:`minitransformer.rotary`) for the position table: queries and keys
  are turned by an angle that grows with the position, inside every attention layer;
* :class:`~minitransformer.layers.SwiGLU` for the GELU feed-forward block: a gated one;
* :class:`GroupedQueryAttention` for multi-head attention: several query heads share one key
  and value head, so the KV cache of chapter 11 holds fewer heads.

No biases anywhere, and the head is a matrix of its own unless ``tie_embeddings``. The tensor
names of transformers' ``LlamaForCausalLM`` are one table, :data:`LLAMA_NAMES`, read by the
same loader and saver as GPT-2's (:mod:`minitransformer.pretrained`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from minitransformer import _checks, pretrained
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache, check_kv_cache
from minitransformer.fast_decode import RowProducts, pieces_pay, step_weight
from minitransformer.layers import (RMSNorm, SwiGLU, _check_layer_mask, _check_sequence,
                                    _dropout)
from minitransformer.lm import (
    attention_mask_for,
    check_batch_inputs,
    check_model_cache,
    check_targets,
    global_forward_hooks,
    init_weights,
    next_token_loss,
    positions_from_mask,
)
from minitransformer.pretrained import Rename
from minitransformer.quantize import QUANTIZED_LINEARS
from minitransformer.rotary import _angles, _check_head_dim, _rotate

# transformers' LlamaForCausalLM name for each of our tensors (chapter 14); "{i}" is a layer.
# The head's row is left out when the head is tied to the embedding (stored once, as theirs is).
_LAYER = "model.layers.{i}"
LLAMA_NAMES = (
    Rename("token_embedding.weight", "model.embed_tokens.weight"),
    Rename("layers.{i}.norm1.weight", f"{_LAYER}.input_layernorm.weight"),
    Rename("layers.{i}.self_attn.q_proj.weight", f"{_LAYER}.self_attn.q_proj.weight"),
    Rename("layers.{i}.self_attn.k_proj.weight", f"{_LAYER}.self_attn.k_proj.weight"),
    Rename("layers.{i}.self_attn.v_proj.weight", f"{_LAYER}.self_attn.v_proj.weight"),
    Rename("layers.{i}.self_attn.out_proj.weight", f"{_LAYER}.self_attn.o_proj.weight"),
    Rename("layers.{i}.norm2.weight", f"{_LAYER}.post_attention_layernorm.weight"),
    Rename("layers.{i}.feed_forward.gate_proj.weight", f"{_LAYER}.mlp.gate_proj.weight"),
    Rename("layers.{i}.feed_forward.up_proj.weight", f"{_LAYER}.mlp.up_proj.weight"),
    Rename("layers.{i}.feed_forward.down_proj.weight", f"{_LAYER}.mlp.down_proj.weight"),
    Rename("norm.weight", "model.norm.weight"),
    Rename("head.weight", "lm_head.weight"),
)
# in some Llama files but not weights: old RoPE buffers, and a tied head stored again
_LLAMA_SKIPPED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


@dataclass(frozen=True)
class LlamaConfig:
    """The sizes of a :class:`Llama`, in :class:`~minitransformer.gpt.GPTConfig`'s order.
    Frozen, as GPTConfig is; ``dataclasses.replace`` makes a new, checked config.

    Args:
        vocab_size: the number of tokens N.
        context_length: the most positions the model reads at once (transformers'
            ``max_position_embeddings``; with rotary positions nothing is sized by it).
        num_layers: how many blocks are stacked.
        num_heads: query heads per block; must divide ``d_model``, and ``head_dim =
            d_model // num_heads`` must be even (RoPE turns dimensions in pairs).
        d_model: the width of every token vector.
        d_ff: the SwiGLU hidden width; ``None`` means ``2/3 * 4 * d_model``, cut to an int and
            rounded up to a multiple of ``multiple_of`` (three matrices of that width hold as
            many numbers as GPT's two of ``4 * d_model``), as Meta's Llama code computes it.
        num_kv_heads: key and value heads; must divide ``num_heads``. ``None`` means
            ``num_heads`` (multi-head attention); 1 is multi-query attention.
        rope_theta: the base of the rotary wavelengths (transformers' ``rope_theta``).
        norm_eps: the RMS norms' ``eps`` (transformers' ``rms_norm_eps``).
        tie_embeddings: share one matrix between the token embedding and the head.
        dropout: dropout probability in training (embeddings, attention weights, residual
            branches).
        multiple_of: what the default ``d_ff`` is rounded up to (Meta's ``multiple_of``): 8
            gives ``8 * ceil(d_model / 3)``; Llama-7B's 256 turns ``d_model=4096`` into 11008.
            Unused when ``d_ff`` is given, and not compared (two configs with the same
            ``d_ff`` are equal): a loaded ``config.json`` names ``d_ff`` alone.

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``num_heads`` not dividing
            ``d_model``, an odd ``head_dim``, ``num_kv_heads`` not dividing ``num_heads``, a bad
            ``rope_theta``, ``norm_eps`` or ``dropout``.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int | None = None
    num_kv_heads: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    dropout: float = 0.0
    multiple_of: int = field(default=8, compare=False)

    def __post_init__(self) -> None:
        # d_ff defaults to int(2/3 * 4 * d_model) rounded up to a multiple of multiple_of
        m = _checks.check_int("multiple_of", self.multiple_of)
        _checks.check_model_sizes(self, ("vocab_size", "context_length", "num_layers",
                                         "num_heads", "d_model"),
                                  lambda d: m * -(-(8 * d // 3) // m))
        _check_head_dim(self.head_dim)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        _check_kv_heads(self.num_heads, self.num_kv_heads)
        _checks.check_number("rope_theta", self.rope_theta, positive=True)
        _checks.check_number("norm_eps", self.norm_eps, positive=True)
        _checks.check_type("tie_embeddings", self.tie_embeddings, bool, "True or False")
        _checks.check_probability("dropout", self.dropout)

    @property
    def head_dim(self) -> int:
        """The width of one head, ``d_model // num_heads``."""
        return self.d_model // self.num_heads


def _check_kv_heads(num_heads: int, num_kv_heads: object) -> int:
    _checks.check_int("num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads must divide num_heads, got num_heads={num_heads} and "
                         f"num_kv_heads={num_kv_heads}")
    return num_kv_heads


def expand_kv_heads(x: Tensor, num_heads: int) -> Tensor:
    """Repeat each key or value head for the query heads of its group:
    ``(B, num_kv_heads, T, head_dim)`` -> ``(B, num_heads, T, head_dim)``.

    Query heads ``g * group`` to ``(g + 1) * group - 1`` read kv head ``g`` (``group =
    num_heads // num_kv_heads``), so each kv head is repeated in place
    (``repeat_interleave``), not the whole stack tiled (``repeat``), as transformers'
    ``repeat_kv`` does.

    Raises:
        TypeError: ``x`` is not a floating-point tensor, ``num_heads`` not an int.
        ValueError: ``x`` is not 4-dimensional, or its heads do not divide ``num_heads``.
    """
    _checks.check_float_tensor("x", x, ndim=4)
    _checks.check_int("num_heads", num_heads)
    _check_kv_heads(num_heads, x.shape[1])
    return x.repeat_interleave(num_heads // x.shape[1], dim=1)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention in which groups of query heads share a key and value head
    (Ainslie et al., 2023), with rotary positions (chapter 14).

    ``num_heads`` query heads of width ``head_dim = d_model // num_heads``, and
    ``num_kv_heads`` key and value heads of the same width. Query head ``j`` reads kv head
    ``j // (num_heads // num_kv_heads)``. ``num_kv_heads == num_heads`` is chapter 7's
    multi-head attention, ``num_kv_heads == 1`` multi-query attention (Shazeer, 2019): the two
    ends of one code. The KV cache stores the ``num_kv_heads`` heads only; they are expanded
    (:func:`expand_kv_heads`) just before the scores.

    Args:
        d_model: the width of the token vectors.
        num_heads: query heads; must divide ``d_model``, with an even ``head_dim``.
        num_kv_heads: key and value heads; must divide ``num_heads``; ``None`` = ``num_heads``.
        bias: give the four projections a bias (Llama has none).
        dropout: the dropout probability on the attention weights, in training only.
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``q_proj`` ``(d_model -> d_model)``, ``k_proj`` and ``v_proj``
    ``(d_model -> num_kv_heads * head_dim)``, ``out_proj`` ``(d_model -> d_model)``.

    Raises:
        TypeError, ValueError: sizes as :class:`LlamaConfig` checks them, a bad dropout.
    """

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 bias: bool = False, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        d_model, num_heads = _checks.check_int("d_model", d_model), _checks.check_int(
            "num_heads", num_heads)
        _checks.check_divisible(d_model, num_heads)
        num_kv_heads = _check_kv_heads(num_heads, num_heads if num_kv_heads is None
                                       else num_kv_heads)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = _check_head_dim(d_model // num_heads)
        self.dropout = _checks.check_probability("dropout", dropout)
        factory = _checks.factory_kwargs(device, dtype)
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **factory)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, dropout={self.dropout}")

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, heads * head_dim)`` -> ``(B, heads, T, head_dim)``, for queries
        (``num_heads``) and keys or values (``num_kv_heads``) alike."""
        batch, length, _ = x.shape
        return x.view(batch, length, -1, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, *, rotary: tuple[Tensor, Tensor] | None = None,
                attn_mask: Tensor | None = None, kv_cache: KVCache | None = None,
                layer_idx: int = 0) -> Tensor:
        """Self-attention over ``x`` ``(B, T, d_model)``; returns ``(B, T, d_model)``.

        Args:
            x: the token vectors.
            rotary: ``(cos, sin)``, each ``(T, head_dim)``, from
                :func:`~minitransformer.rotary.rotary_angles` for the positions of ``x`` (with a
                cache holding ``P`` positions: ``offset=P``); ``None`` rotates nothing.
            attn_mask: broadcastable to ``(B, num_heads, T, P + T)``; boolean (True = may
                attend) or additive floating, usually ``causal_mask(T, P + T)``.
            kv_cache, layer_idx: a :class:`~minitransformer.cache.KVCache` and this layer's
                slot; the rotated keys and the values of the ``num_kv_heads`` heads are
                appended to it.

        Raises:
            TypeError, ValueError: ``x``, ``rotary``, the mask or the cache of the wrong type,
                dtype or shape.
        """
        past = 0 if kv_cache is None else check_kv_cache(kv_cache, layer_idx)
        _check_sequence("x", x, self.d_model, self.q_proj.weight)
        _check_layer_mask("attn_mask", attn_mask, x, self.num_heads, past + x.shape[1])
        if rotary is not None:
            _check_rotary(rotary, x, self.head_dim)
        return self.attend(x, rotary=rotary, attn_mask=attn_mask, kv_cache=kv_cache,
                           layer_idx=layer_idx)

    def attend(self, x: Tensor, *, rotary: tuple[Tensor, Tensor] | None = None,
               attn_mask: Tensor | None = None, kv_cache: KVCache | None = None,
               layer_idx: int = 0) -> Tensor:
        """:meth:`forward` without the checks: the path blocks and models call."""
        q = self.split_heads(self.q_proj(x))             # (B, h, T, d_h)
        k = self.split_heads(self.k_proj(x))             # (B, h_kv, T, d_h)
        v = self.split_heads(self.v_proj(x))
        if rotary is not None:                           # positions, before the cache
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)      # (B, h_kv, P + T, d_h)
        k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # (B, h, P+T, d_h)
        v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        dropout_p = self.dropout if self.training else 0.0
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p)
        batch, _, length, _ = heads.shape
        merged = heads.transpose(1, 2).reshape(batch, length, self.d_model)  # (B, T, d_model)
        return self.out_proj(merged)


def _check_rotary(rotary: object, x: Tensor, head_dim: int) -> None:
    """``(cos, sin)``, each ``(T, head_dim)`` in the dtype of ``x``."""
    if not isinstance(rotary, (tuple, list)) or len(rotary) != 2:
        raise TypeError(f"rotary must be the pair (cos, sin) from rotary_angles, got "
                        f"{type(rotary).__name__}")
    for name, table in zip(("cos", "sin"), rotary):
        _checks.check_float_tensor(f"rotary's {name}", table, ndim=2)
        if tuple(table.shape) != (x.shape[1], head_dim):
            raise ValueError(f"rotary's {name} must have shape (T, head_dim) = "
                             f"{(x.shape[1], head_dim)}, got {_checks.shape(table)}")
        _checks.check_same_dtype(x=x, **{name: table})


class LlamaBlock(nn.Module):
    """One Llama block, pre-norm (chapter 14)::

        x = x + dropout1(self_attn(norm1(x), rotary))
        x = x + dropout2(feed_forward(norm2(x)))

    with :class:`~minitransformer.layers.RMSNorm` norms, :class:`GroupedQueryAttention` and a
    :class:`~minitransformer.layers.SwiGLU` feed-forward: chapter 8's pre-norm
    :class:`~minitransformer.layers.EncoderLayer` with those three parts swapped.

    Args:
        d_model, num_heads, d_ff, num_kv_heads, norm_eps, dropout: as in :class:`LlamaConfig`.
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``norm1``, ``self_attn``, ``norm2``, ``feed_forward``, ``dropout1``,
    ``dropout2``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *,
                 num_kv_heads: int | None = None, norm_eps: float = 1e-6,
                 dropout: float = 0.0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        factory = _checks.factory_kwargs(device, dtype)
        self.d_model, self.num_heads = d_model, num_heads
        self.norm1 = RMSNorm(d_model, eps=norm_eps, **factory)
        self.self_attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads=num_kv_heads,
                                               dropout=dropout, **factory)
        self.norm2 = RMSNorm(d_model, eps=norm_eps, **factory)
        self.feed_forward = SwiGLU(d_model, d_ff, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, rotary: tuple[Tensor, Tensor] | None = None,
                attn_mask: Tensor | None = None, kv_cache: KVCache | None = None,
                layer_idx: int = 0) -> Tensor:
        """Run the block on ``x`` ``(B, T, d_model)``; the arguments are those of
        :meth:`GroupedQueryAttention.forward`.

        Raises:
            TypeError, ValueError: as :meth:`GroupedQueryAttention.forward`.
        """
        past = 0 if kv_cache is None else check_kv_cache(kv_cache, layer_idx)
        _check_sequence("x", x, self.d_model, self.norm1.weight)
        _check_layer_mask("attn_mask", attn_mask, x, self.num_heads, past + x.shape[1])
        if rotary is not None:
            _check_rotary(rotary, x, self.self_attn.head_dim)
        return self.encode(x, rotary=rotary, attn_mask=attn_mask, kv_cache=kv_cache,
                           layer_idx=layer_idx)

    def encode(self, x: Tensor, *, rotary: tuple[Tensor, Tensor] | None = None,
               attn_mask: Tensor | None = None, kv_cache: KVCache | None = None,
               layer_idx: int = 0) -> Tensor:
        """:meth:`forward` without the checks."""
        attended = self.self_attn.attend(self.norm1.normalize(x), rotary=rotary,
                                         attn_mask=attn_mask, kv_cache=kv_cache,
                                         layer_idx=layer_idx)
        x = x + _dropout(self.dropout1, attended)
        return x + _dropout(self.dropout2, self.feed_forward.transform(self.norm2.normalize(x)))


# the classes of the modules inside a Llama as it builds them (Llama.make_decode_step knows these)
_BUILT_TYPES = (nn.Embedding, nn.Dropout, nn.ModuleList, LlamaBlock, GroupedQueryAttention,
                SwiGLU, RMSNorm, nn.Linear)


class _BlockWeights(NamedTuple):
    """One block's weights, looked up once for :meth:`Llama.make_decode_step`."""

    norm1: Tensor
    q_proj: Tensor
    k_proj: Tensor
    v_proj: Tensor
    out_proj: Tensor
    norm2: Tensor
    gate_proj: Tensor
    up_proj: Tensor
    down_proj: Tensor

    @classmethod
    def of(cls, block: LlamaBlock) -> _BlockWeights:
        """The weights (an int8 layer itself in place of its weight: ``step_weight``)."""
        attn, ff = block.self_attn, block.feed_forward
        w = step_weight
        return cls(block.norm1.weight, w(attn.q_proj), w(attn.k_proj), w(attn.v_proj),
                   w(attn.out_proj), block.norm2.weight, w(ff.gate_proj), w(ff.up_proj),
                   w(ff.down_proj))


class Llama(nn.Module):
    """A decoder-only language model with Llama's block (Touvron et al., 2023; chapter 14).

    ``logits = head(norm(blocks(token_embedding(idx))))``: no position table (each block's
    attention rotates its queries and keys by their positions), a causal mask in every block,
    no biases.

    Args:
        config: the sizes (:class:`LlamaConfig`).
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``token_embedding``, ``dropout``, ``layers`` (:class:`LlamaBlock`), ``norm``
    (:class:`~minitransformer.layers.RMSNorm`), ``head`` (the same tensor as
    ``token_embedding.weight`` when ``config.tie_embeddings``).

    Weights start as GPT's: linear and embedding weights normal with std 0.02 (transformers'
    ``initializer_range``), norms at 1.
    """

    def __init__(self, config: LlamaConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        factory = _checks.factory_kwargs(device, dtype)
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model, **factory)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            LlamaBlock(c.d_model, c.num_heads, c.d_ff, num_kv_heads=c.num_kv_heads,
                       norm_eps=c.norm_eps, dropout=c.dropout, **factory)
            for _ in range(c.num_layers))
        self.norm = RMSNorm(c.d_model, eps=c.norm_eps, **factory)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False, **factory)
        if c.tie_embeddings:
            self.head.weight = self.token_embedding.weight
        self.apply(init_weights)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                kv_cache: KVCache | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Next-token scores for every position, and the loss when ``targets`` are given;
        as :meth:`GPT.forward <minitransformer.gpt.GPT.forward>`.

        Args:
            idx: ``(B, T)`` token ids, ``T <= context_length``.
            targets: ``(B, T)`` the next token of each position; ``-100`` leaves it out.
            kv_cache: a :class:`~minitransformer.cache.KVCache` with a slot per layer;
                ``idx`` then holds the new tokens only, at positions ``kv_cache.seq_len``
                onwards (their rotation angles start there).
            attention_mask, position_ids: a padded batch, as for :meth:`GPT.forward
                <minitransformer.gpt.GPT.forward>`; each row's queries and keys are turned by
                the angles of its own positions.

        Returns:
            ``(logits, loss)``: logits ``(B, T, vocab_size)``, the mean cross-entropy or
            ``None``.

        Raises:
            TypeError, ValueError: as :meth:`GPT.forward <minitransformer.gpt.GPT.forward>`.
        """
        past = self._check_input(idx, kv_cache)
        if targets is not None:
            check_targets(targets, idx, self.config.vocab_size)
        position_ids = check_batch_inputs(self.config, idx, past, attention_mask, position_ids)
        length = idx.shape[1]
        x = _dropout(self.dropout, self.token_embedding(idx))        # (B, T, d_model)
        rotary = (self._rotary(past, length, x) if position_ids is None   # (T, d_h) twice
                  else self._rotary_at(position_ids, x))                  # (B, 1, T, d_h)
        mask = attention_mask_for(attention_mask, length, past, idx.device)
        for i, layer in enumerate(self.layers):
            x = layer.encode(x, rotary=rotary, attn_mask=mask, kv_cache=kv_cache, layer_idx=i)
        logits = self.head(self.norm.normalize(x))                    # (B, T, N)
        return logits, None if targets is None else next_token_loss(logits, targets)

    def _rotary(self, past: int, length: int, x: Tensor) -> tuple[Tensor, Tensor]:
        """The rotation tables of positions ``past`` to ``past + length - 1``."""
        c = self.config
        return _angles(length, c.head_dim, past, c.rope_theta, x.device, x.dtype)

    def _rotary_at(self, position_ids: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """The rotation tables of each row's positions ``position_ids`` ``(B, T)``, shaped
        ``(B, 1, T, head_dim)`` to turn every head: the numbers :func:`~minitransformer.
        rotary.rotary_angles` gives for those positions (the same products, in float32)."""
        c = self.config
        work = {"dtype": torch.promote_types(x.dtype, torch.float32), "device": x.device}
        two_i = torch.arange(0, c.head_dim, 2, **work)                   # (d/2,)
        frequencies = 1.0 / c.rope_theta ** (two_i / c.head_dim)         # theta_i
        angles = position_ids.to(work["dtype"])[..., None] * frequencies  # (B, T, d/2)
        angles = torch.cat([angles, angles], dim=-1)[:, None]           # (B, 1, T, d)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def _check_input(self, idx: Tensor, kv_cache: KVCache | None, *,
                     cache_required: bool = False) -> int:
        """The checks of :meth:`forward` and :meth:`decode_step`; returns the cached positions."""
        c = self.config
        _checks.check_token_ids("idx", idx, c.vocab_size, max_len=c.context_length,
                                device=self.token_embedding.weight.device)
        if kv_cache is None and not cache_required:
            return 0
        return check_model_cache(c, kv_cache, idx.shape)

    def decode_step(self, idx: Tensor, kv_cache: KVCache) -> Tensor:
        """``forward(idx, kv_cache=kv_cache)[0]`` in eval mode, bit for bit, through
        :meth:`make_decode_step`; the arguments are checked as :meth:`forward` checks them."""
        self._check_input(idx, kv_cache, cache_required=True)
        return self.make_decode_step()(idx, kv_cache)

    def make_decode_step(self) -> Callable[[Tensor, KVCache], Tensor]:
        """A function ``step(idx, kv_cache) -> logits`` equal to ``forward(idx,
        kv_cache=kv_cache)[0]`` in eval mode, bit for bit, faster: the weights are looked up
        once, here, and the step calls PyTorch's functions instead of the blocks' methods, as
        :meth:`GPT.make_decode_step <minitransformer.gpt.GPT.make_decode_step>` does (read
        its notes: a model changed in a way the shortcut cannot follow gets ``forward``
        itself; after replacing a weight, make a new step). The keys and values go to the
        cache as ``num_kv_heads`` heads, and PyTorch's attention reads each for its group of
        query heads (``enable_gqa``), which gives the numbers of the expanded heads without
        copying them.

        ``step`` takes the new ids ``(B, T)`` (not checked), the cache, and :meth:`forward`'s
        keyword-only ``attention_mask`` and ``position_ids`` (not checked), and raises
        ``ValueError`` when the cached and new positions exceed ``context_length``.
        """
        if not self._is_as_built():
            def forward_step(idx: Tensor, kv_cache: KVCache, *,
                             attention_mask: Tensor | None = None,
                             position_ids: Tensor | None = None) -> Tensor:
                with eval_mode(self):
                    batch = {name: t for name, t in (("attention_mask", attention_mask),
                                                     ("position_ids", position_ids))
                             if t is not None}   # a subclass's forward may not take them
                    return self(idx, kv_cache=kv_cache, **batch)[0]
            return forward_step
        c = self.config
        blocks = [_BlockWeights.of(layer) for layer in self.layers]
        embedding, final_norm, head = (self.token_embedding.weight, self.norm.weight,
                                       self.head.weight)
        width, eps = (c.d_model,), c.norm_eps

        def split_heads(t: Tensor) -> Tensor:       # (B, T, h d_h) -> (B, h, T, d_h)
            batch, length, _ = t.shape
            return t.view(batch, length, -1, c.head_dim).transpose(1, 2)

        def step(idx: Tensor, kv_cache: KVCache, *, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None) -> Tensor:
            past, length = kv_cache.seq_len, idx.shape[1]
            if past + length > c.context_length:
                raise ValueError(f"positions {past} to {past + length - 1} do not fit "
                                 f"context_length={c.context_length}")
            if attention_mask is not None and position_ids is None:
                position_ids = positions_from_mask(attention_mask, length)
            x = F.embedding(idx, embedding)                           # (B, T, d_model)
            cos, sin = (self._rotary(past, length, x) if position_ids is None
                        else self._rotary_at(position_ids, x))
            mask = attention_mask_for(attention_mask, length, past, idx.device)
            for i, b in enumerate(blocks):
                h = F.rms_norm(x, width, b.norm1, eps)
                q = _rotate(split_heads(F.linear(h, b.q_proj)), cos, sin)
                k = _rotate(split_heads(F.linear(h, b.k_proj)), cos, sin)
                v = split_heads(F.linear(h, b.v_proj))
                k, v = kv_cache.update(i, k, v)                       # (B, h_kv, P + T, d_h)
                attended = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
                x = x + F.linear(attended.transpose(1, 2).reshape(x.shape), b.out_proj)
                h = F.rms_norm(x, width, b.norm2, eps)
                gated = F.silu(F.linear(h, b.gate_proj)) * F.linear(h, b.up_proj)
                x = x + F.linear(gated, b.down_proj)
            return F.linear(F.rms_norm(x, width, final_norm, eps), head)  # (B, T, N)

        return step

    def make_fast_decode_step(self, *, pack_weights: bool = False
                              ) -> Callable[[Tensor, KVCache], Tensor]:
        """:meth:`make_decode_step`'s step, faster where a batch writes one token per row, as
        :meth:`GPT.make_fast_decode_step <minitransformer.gpt.GPT.make_fast_decode_step>` is
        for a GPT (read its notes): the same kernels (``minitransformer.fast_decode``), the
        same contract. Its logits equal :meth:`forward`'s up to float rounding, no longer bit
        for bit; a prefill (several new tokens per row) is :meth:`make_decode_step`'s step,
        bit for bit, unless ``pack_weights``; a model the shortcut cannot follow gets
        ``forward`` itself. :func:`~minitransformer.generation.generate` and the serving
        :class:`~minitransformer.serving.Engine` step through it by default.
        """
        _checks.check_type("pack_weights", pack_weights, bool, "True or False")
        ordinary = self.make_decode_step()
        if not self._is_as_built(int8=True):
            return ordinary                              # forward itself, in eval mode
        c = self.config
        blocks = [_BlockWeights.of(layer) for layer in self.layers]
        embedding, final_norm, head = (self.token_embedding.weight, self.norm.weight,
                                       step_weight(self.head))
        width, eps = (c.d_model,), c.norm_eps
        products = RowProducts([w for b in blocks for w in (
            b.q_proj, b.k_proj, b.v_proj, b.out_proj, b.gate_proj, b.up_proj, b.down_proj)]
            + [head], pack_weights=pack_weights)

        def step(idx: Tensor, kv_cache: KVCache, *, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None) -> Tensor:
            rows, length = idx.shape
            packed = products.packed_now()
            if length != 1 and not packed:               # the prefill: matrix products
                return ordinary(idx, kv_cache, attention_mask=attention_mask,
                                position_ids=position_ids)
            past = kv_cache.seq_len
            if past + length > c.context_length:
                raise ValueError(f"positions {past} to {past + length - 1} do not fit "
                                 f"context_length={c.context_length}")
            if attention_mask is not None and position_ids is None:
                position_ids = positions_from_mask(attention_mask, length)
            x = F.embedding(idx, embedding)                           # (B, T, d_model)
            cos, sin = (self._rotary(past, length, x) if position_ids is None
                        else self._rotary_at(position_ids, x))
            x = x.view(rows * length, -1)                             # (B T, d_model)
            mask = attention_mask_for(attention_mask, length, past, idx.device)
            way = {"packed": packed, "blockwise": pieces_pay(x)}

            def split_heads(t: Tensor) -> Tensor:       # (B T, h d_h) -> (B, h, T, d_h)
                return t.view(rows, length, -1, c.head_dim).transpose(1, 2)

            for i, b in enumerate(blocks):                # the blocks of make_decode_step
                h = F.rms_norm(x, width, b.norm1, eps)
                q = _rotate(split_heads(products(h, b.q_proj, **way)), cos, sin)
                k = _rotate(split_heads(products(h, b.k_proj, **way)), cos, sin)
                v = split_heads(products(h, b.v_proj, **way))
                k, v = kv_cache.update(i, k, v)                       # (B, h_kv, P + T, d_h)
                attended = F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
                attended = attended.transpose(1, 2).reshape(rows * length, -1)
                x = x + products(attended, b.out_proj, **way)
                h = F.rms_norm(x, width, b.norm2, eps)
                gated = F.silu(products(h, b.gate_proj, **way)) * products(h, b.up_proj, **way)
                x = x + products(gated, b.down_proj, **way)
            x = F.rms_norm(x, width, final_norm, eps)
            return products(x, head, **way).view(rows, length, -1)      # (B, T, N)

        return step

    def _is_as_built(self, *, int8: bool = False) -> bool:
        """Whether :meth:`make_decode_step`'s written-out pass computes this model's
        :meth:`forward`: Llama's own methods, sub-modules of the types Llama builds, the
        config's eps and head width, no hooks and no parametrized weights. ``int8``: the
        fast step's question, which also follows int8 layers
        (:func:`~minitransformer.quantize.quantize_linears`)."""
        built = _BUILT_TYPES + QUANTIZED_LINEARS * int8
        cls = type(self)
        if (cls.forward is not Llama.forward or cls._rotary is not Llama._rotary
                or cls._rotary_at is not Llama._rotary_at or global_forward_hooks()):
            return False
        for module in self.modules():
            if module is not self and type(module) not in built:
                return False
            if (module._forward_hooks or module._forward_pre_hooks
                    or parametrize.is_parametrized(module)):
                return False
        c = self.config
        norms = [self.norm] + [n for layer in self.layers for n in (layer.norm1, layer.norm2)]
        return (all(n.eps == c.norm_eps for n in norms)
                and all(layer.self_attn.num_kv_heads == c.num_kv_heads for layer in self.layers)
                # the step has no biases: a bias put on any projection takes forward
                and all(m.bias is None for m in self.modules() if isinstance(m, nn.Linear)))

    # --- checkpoints: transformers' LlamaForCausalLM layout (chapter 14) -----------------------

    def save_pretrained(self, path: str | os.PathLike, *, bos_token_id: int | None = None,
                        eos_token_id: int | None = None) -> None:
        """Write ``path/config.json`` and ``path/model.safetensors`` as a ``LlamaForCausalLM``
        checkpoint: transformers' config keys and tensor names (:data:`LLAMA_NAMES`), a tied
        head stored once (as ``model.embed_tokens.weight``). ``bos_token_id`` and
        ``eos_token_id`` are the tokenizer's (``null`` when it has none), as for
        :meth:`GPT.save_pretrained <minitransformer.gpt.GPT.save_pretrained>`.

        Raises:
            ValueError: a token id outside the vocabulary, or ``path`` is a file.
        """
        c = self.config
        for name, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if value is not None and _checks.check_int(name, value, low=0) >= c.vocab_size:
                raise ValueError(f"{name}={value} is not a token of the vocabulary "
                                 f"[0, {c.vocab_size})")
        tensors = pretrained.to_theirs(self.state_dict(), llama_names(c), c.num_layers)
        dtype = str(self.token_embedding.weight.dtype).removeprefix("torch.")
        config = {**_llama_config(c, dtype), "bos_token_id": bos_token_id,
                  "eos_token_id": eos_token_id}
        pretrained.write_checkpoint(path, config, tensors)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *,
                        device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> Llama:
        """A ``LlamaForCausalLM`` checkpoint directory as a :class:`Llama`, in eval mode.

        Reads what :meth:`save_pretrained` and transformers write: ``rope_theta`` at the top
        of ``config.json`` (most published checkpoints) or in ``rope_parameters``
        (transformers 5). A name that is not a directory is downloaded from the Hugging Face
        Hub when ``huggingface_hub`` is installed; only safetensors files are read.

        Args:
            path: the directory (or a Hub repo id).
            device, dtype: where and in what precision to build the model; ``dtype=None`` keeps
                the checkpoint's.

        Raises:
            FileNotFoundError: no such directory or file, and no way to download it.
            ValueError: a config this model cannot express, naming the field: another
                ``model_type`` or ``hidden_act``, attention or MLP biases, a ``head_dim`` other
                than ``hidden_size / num_attention_heads``, a RoPE scaling (``llama3``,
                ``yarn``, ``linear``, ``dynamic``, ...); a tensor missing, unknown or of the
                wrong shape (naming it; checked before the model is allocated); a stored
                ``lm_head.weight`` that differs from a tied embedding; float8 weights; a
                device that is not here.
        """
        folder = pretrained.resolve(path)
        raw, tensors = pretrained.read_checkpoint(folder)
        config = _config_from_llama(raw, str(folder / pretrained.CONFIG_FILE))
        source = str(folder / pretrained.WEIGHTS_FILE)
        names = llama_names(config)
        theirs = pretrained.their_names(names, config.num_layers)
        known = set(theirs.values()) | ({"lm_head.weight"} if config.tie_embeddings else set())
        pretrained.check_names(tensors, known, source=source, skipped=_LLAMA_SKIPPED,
                               model=f"a Llama model with num_hidden_layers="
                                     f"{config.num_layers}")
        if config.tie_embeddings:
            pretrained.check_tied(tensors, "lm_head.weight", "model.embed_tokens.weight",
                                  source=source, config=str(folder / pretrained.CONFIG_FILE))
        state = pretrained.to_ours(tensors, names, config.num_layers, source=source)
        return pretrained.build(cls, config, state, source=source, device=device, dtype=dtype,
                                theirs=theirs)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, *, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> Llama:
        """A llama.cpp GGUF file of architecture ``llama`` as a :class:`Llama`, in eval mode,
        read by ``minitransformer.gguf``: the config from its ``llama.*`` metadata, the
        tensors dequantised to float32 (``dtype=None``) and renamed by the table
        ``LLAMA_GGUF_NAMES``, the query and key rows put back in rotate-half order.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a GGUF file, another architecture, a tensor type that is not
                dequantised, or metadata that contradicts the tensors (naming the key).
        """
        from minitransformer import gguf

        return gguf.load_llama(cls, path, device=device, dtype=dtype)


def llama_names(config: LlamaConfig) -> tuple[Rename, ...]:
    """:data:`LLAMA_NAMES`, without the head's row when the config ties it."""
    tied = config.tie_embeddings
    return tuple(row for row in LLAMA_NAMES if not (tied and row.ours == "head.weight"))


def _llama_config(c: LlamaConfig, dtype: str) -> dict:
    """transformers' ``config.json`` of a ``LlamaForCausalLM`` for ``c``."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "dtype": dtype,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.context_length,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff,
        "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": False, "mlp_bias": False, "attention_dropout": c.dropout,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }


def _config_from_llama(raw: dict, source: str) -> LlamaConfig:
    """The :class:`LlamaConfig` of a Llama ``config.json``, or a ``ValueError`` naming the field
    that :class:`Llama` cannot express (transformers' defaults stand in for absent fields)."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"{source}: {why}, which Llama cannot express")

    if raw.get("model_type") != "llama":
        raise refuse(f"model_type is {raw.get('model_type')!r}, not 'llama'")
    if raw.get("hidden_act", "silu") != "silu":
        raise refuse(f"hidden_act is {raw.get('hidden_act')!r}, not 'silu'")
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag) not in (None, False):
            raise refuse(f"{flag} is {raw.get(flag)!r}")
    theta = raw.get("rope_theta", 10000.0)
    for key in ("rope_scaling", "rope_parameters"):
        rope = raw.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ValueError(f"{source}: {key} must be an object, got {rope!r}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise refuse(f"{key} asks for the RoPE scaling {kind!r} (only 'default' "
                         f"rotary positions are implemented)")
        extra = sorted(set(rope) - {"rope_type", "type", "rope_theta"})
        if extra:                          # e.g. a "factor" without a type: not to be ignored
            raise refuse(f"{key} holds {', '.join(extra)} for default rotary positions")
        theta = rope.get("rope_theta", theta)
    sizes = {name: raw.get(key) for name, key in (
        ("vocab_size", "vocab_size"), ("context_length", "max_position_embeddings"),
        ("num_layers", "num_hidden_layers"), ("num_heads", "num_attention_heads"),
        ("d_model", "hidden_size"), ("d_ff", "intermediate_size"))}
    for name, value in sizes.items():
        if value is None:
            raise ValueError(f"{source} has no field for {name}")
    head_dim = raw.get("head_dim")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int)):
        raise ValueError(f"{source}: head_dim must be an int, got {head_dim!r}")
    if (head_dim is not None and isinstance(sizes["num_heads"], int)
            and sizes["num_heads"] > 0 and head_dim * sizes["num_heads"] != sizes["d_model"]):
        raise refuse(f"head_dim is {head_dim}, not hidden_size / num_attention_heads = "
                     f"{sizes['d_model']} / {sizes['num_heads']}")
    try:
        return LlamaConfig(**sizes, num_kv_heads=raw.get("num_key_value_heads"),
                           rope_theta=theta, norm_eps=raw.get("rms_norm_eps", 1e-6),
                           tie_embeddings=raw.get("tie_word_embeddings", False),
                           dropout=raw.get("attention_dropout", 0.0))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None
