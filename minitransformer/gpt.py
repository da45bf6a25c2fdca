"""A small GPT: the decoder-only transformer, built from chapter 8's blocks (chapter 9).

Token ids become vectors (token embedding plus a position vector), pass through a stack of
pre-norm :class:`~minitransformer.layers.EncoderLayer` blocks under a causal mask, a final layer
norm, and an output head that shares its weights with the token embedding ("weight tying",
Press and Wolf, 2017). "Decoder-only" is the name of the family; the block it stacks has the
encoder layer's shape, self-attention plus feed-forward with no cross-attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from minitransformer import _checks
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache
from minitransformer.attention import MultiHeadAttention
from minitransformer.layers import EncoderLayer, FeedForward, LayerNorm, _dropout
from minitransformer.masks import causal_mask
from minitransformer.positional import sinusoidal_positional_encoding

POSITIONAL = ("learned", "sinusoidal")
INIT_STD = 0.02  # GPT-2's: every weight starts normal with this standard deviation
# the classes of the modules inside a GPT as it builds them (GPT.make_decode_step knows these)
_BUILT_TYPES = (nn.Embedding, nn.Dropout, nn.ModuleList, EncoderLayer, MultiHeadAttention,
                FeedForward, LayerNorm, nn.Linear, nn.GELU)


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a :class:`GPT`. Frozen: a model is built from its config, so changing a field
    afterwards would describe another model; ``dataclasses.replace(config, dropout=0.1)`` makes a
    new, checked config instead.

    Args:
        vocab_size: the number of tokens N.
        context_length: the most positions the model reads at once (nanoGPT's ``block_size``).
        num_layers: how many transformer blocks are stacked.
        num_heads: attention heads per block; must divide ``d_model``.
        d_model: the width of every token vector.
        d_ff: the feed-forward hidden width; ``None`` means ``4 * d_model``.
        dropout: dropout probability in training (embeddings, attention, residual branches).
        positional: ``"learned"`` (a trained vector per position, as in GPT-2) or
            ``"sinusoidal"`` (chapter 5's fixed encoding, scaled by ``INIT_STD``; ``d_model`` must
            be even).

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``d_model`` not divisible by
            ``num_heads``, a bad ``dropout`` or ``positional``.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    positional: str = "learned"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "num_layers", "num_heads", "d_model"):
            _checks.check_int(name, getattr(self, name))
        _checks.check_divisible(self.d_model, self.num_heads)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)    # frozen: set once, here
        _checks.check_int("d_ff", self.d_ff)
        _checks.check_probability("dropout", self.dropout)
        _checks.check_choice("positional", self.positional, POSITIONAL)
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")


def _global_forward_hooks() -> bool:
    """Whether hooks registered for every module (``nn.modules.module.register_module_forward_
    hook`` and its pre-hook twin) are present: PyTorch keeps them in private dictionaries."""
    module = nn.modules.module
    return bool(getattr(module, "_global_forward_hooks", None)
                or getattr(module, "_global_forward_pre_hooks", None))


class _BlockWeights(NamedTuple):
    """One pre-norm block's parameters, looked up once for :meth:`GPT.make_decode_step`:
    ``(weight, bias)`` of each linear layer, ``(weight, bias, eps)`` of each layer norm."""

    norm1: tuple[Tensor, Tensor, float]
    q_proj: tuple[Tensor, Tensor]
    k_proj: tuple[Tensor, Tensor]
    v_proj: tuple[Tensor, Tensor]
    out_proj: tuple[Tensor, Tensor]
    norm2: tuple[Tensor, Tensor, float]
    linear1: tuple[Tensor, Tensor]
    linear2: tuple[Tensor, Tensor]

    @staticmethod
    def norm(norm: LayerNorm) -> tuple[Tensor, Tensor, float]:
        return norm.weight, norm.bias, norm.eps

    @classmethod
    def of(cls, layer: EncoderLayer) -> _BlockWeights:
        attn, ff = layer.self_attn, layer.feed_forward
        q, k, v, out, l1, l2 = (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj,
                                ff.linear1, ff.linear2)
        return cls(cls.norm(layer.norm1), (q.weight, q.bias), (k.weight, k.bias),
                   (v.weight, v.bias), (out.weight, out.bias), cls.norm(layer.norm2),
                   (l1.weight, l1.bias), (l2.weight, l2.bias))


class GPT(nn.Module):
    """A decoder-only transformer language model.

    ``logits = head(norm(blocks(token_embedding(idx) + position(idx))))``, with a causal mask
    in every block and ``head.weight`` the same tensor as ``token_embedding.weight``.

    Args:
        config: the sizes (:class:`GPTConfig`).
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``token_embedding``, ``position_embedding`` (``None`` for sinusoidal
    positions), ``dropout``, ``layers`` (:class:`~minitransformer.layers.EncoderLayer`,
    pre-norm, GELU), ``norm``, ``head``.

    Weights start as GPT-2's: every linear and embedding weight normal with std 0.02, biases
    zero, layer norms at weight 1 and bias 0.
    """

    def __init__(self, config: GPTConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        factory = _checks.factory_kwargs(device, dtype)
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model, **factory)
        self.position_embedding = (nn.Embedding(c.context_length, c.d_model, **factory)
                                   if c.positional == "learned" else None)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                         norm_first=True, **factory)
            for _ in range(c.num_layers))
        self.norm = LayerNorm(c.d_model, **factory)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False, **factory)
        self.head.weight = self.token_embedding.weight  # weight tying: one (N, d_model) matrix
        self.apply(_init_weights)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                kv_cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Next-token scores for every position, and the loss when ``targets`` are given.

        Args:
            idx: ``(B, T)`` token ids, ``T <= context_length``.
            targets: ``(B, T)`` the token that follows each position (``idx`` shifted left).
            kv_cache: a :class:`~minitransformer.cache.KVCache` with a slot per layer
                (chapter 11). ``idx`` then holds only the new tokens: they take the positions
                after the ``kv_cache.seq_len`` cached ones, attend to those too, and their
                keys and values are appended. Logits and loss are for the new tokens.

        Returns:
            ``(logits, loss)``: logits ``(B, T, vocab_size)``; ``loss`` the mean cross-entropy
            over all ``B * T`` positions, or ``None`` without targets.

        Raises:
            TypeError: ``idx`` or ``targets`` is not an integer tensor.
            ValueError: a shape other than ``(B, T)``, ``T > context_length``, a token id
                outside ``[0, vocab_size)``, or ``targets`` shaped unlike ``idx``; a cache
                whose positions plus ``T`` exceed ``context_length``, with another number of
                layers, or holding another batch size (or past its ``max_len``).
        """
        c = self.config
        _checks.check_token_ids("idx", idx, c.vocab_size, max_len=c.context_length)
        past = 0 if kv_cache is None else self._check_cache(kv_cache, idx.shape[1])
        if targets is not None:
            _checks.check_token_ids("targets", targets, c.vocab_size)
            if targets.shape != idx.shape:
                raise ValueError(f"targets must have the shape of idx {_checks.shape(idx)}, "
                                 f"got {_checks.shape(targets)}")
        length = idx.shape[1]
        x = self.embed(idx, offset=past)                              # (B, T, d_model)
        # the new queries are the last T of past + T keys (lower right); one query sees all
        mask = causal_mask(length, past + length, device=idx.device) if length > 1 else None
        for i, layer in enumerate(self.layers):
            x = layer.encode(x, attn_mask=mask, kv_cache=kv_cache, layer_idx=i)
        logits = self.head(self.norm.normalize(x))                    # (B, T, N)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def decode_step(self, idx: Tensor, kv_cache: KVCache) -> Tensor:
        """``forward(idx, kv_cache=kv_cache)[0]``, the same numbers bit for bit, through the
        speed path of chapter 11: ``self.make_decode_step()(idx, kv_cache)``. A loop of steps
        should make the step function once and call it, as
        :func:`~minitransformer.generation.generate` does."""
        return self.make_decode_step()(idx, kv_cache)

    def make_decode_step(self) -> Callable[[Tensor, KVCache], Tensor]:
        """A function ``step(idx, kv_cache) -> logits`` that computes
        ``forward(idx, kv_cache=kv_cache)[0]`` in eval mode (no dropout), bit for bit, faster:
        generation's inner loop (chapter 11).

        A decode step multiplies one vector by a few small matrices, so most of its time is
        the fixed cost of each call rather than arithmetic. The step therefore does the cached
        forward pass's operations in the same order, on the same weights, but looks the
        weights up once, here, instead of through every block's sub-modules at every token,
        and calls PyTorch's functions instead of the blocks' methods.
        :func:`~minitransformer.generation.generate` makes one step function per call, after
        checking its arguments once.

        The shortcut knows the GPT as this class builds it. A model changed in a way it cannot
        follow (a subclass with its own ``forward`` or ``embed``, blocks turned post-norm,
        another activation or module class, a hook, a parametrized weight) gets
        ``forward`` itself, in eval mode, so the two never disagree. The step holds the weight
        tensors: updated in place, as an optimizer does, they are seen; after anything else
        (a module, a weight or an ``eps`` replaced, ``load_state_dict(..., assign=True)``),
        make a new step function.

        The returned ``step`` takes ``idx`` ``(B, T)``, the new token ids (one per row in a
        decode step; not checked), and the :class:`~minitransformer.cache.KVCache` that
        :meth:`forward` would take, to which it appends the new keys and values. It returns the
        logits ``(B, T, vocab_size)`` of the new tokens, and raises ``ValueError`` when the
        cached and the new positions together exceed ``context_length``.
        """
        if not self._is_as_built():
            def forward_step(idx: Tensor, kv_cache: KVCache) -> Tensor:
                with eval_mode(self):                                 # no dropout here either
                    return self(idx, kv_cache=kv_cache)[0]
            return forward_step
        blocks = [_BlockWeights.of(layer) for layer in self.layers]
        final_norm, head = _BlockWeights.norm(self.norm), self.head.weight
        width, heads = (self.config.d_model,), self.config.num_heads

        def split_heads(t: Tensor) -> Tensor:                     # (B, T, d) -> (B, h, T, d_k)
            batch, length, _ = t.shape
            return t.view(batch, length, heads, -1).transpose(1, 2)

        def step(idx: Tensor, kv_cache: KVCache) -> Tensor:
            past, length = kv_cache.seq_len, idx.shape[1]
            x = self._embed(idx, past)                                # (B, T, d_model)
            mask = causal_mask(length, past + length, device=idx.device) if length > 1 else None
            for i, b in enumerate(blocks):                           # pre-norm, GELU blocks
                h = F.layer_norm(x, width, *b.norm1)
                q = split_heads(F.linear(h, *b.q_proj))
                k = split_heads(F.linear(h, *b.k_proj))
                v = split_heads(F.linear(h, *b.v_proj))
                k, v = kv_cache.update(i, k, v)                       # (B, h, past + T, d_k)
                attended = F.scaled_dot_product_attention(q, k, v, mask).transpose(1, 2)
                x = x + F.linear(attended.reshape(x.shape), *b.out_proj)
                h = F.layer_norm(x, width, *b.norm2)
                x = x + F.linear(F.gelu(F.linear(h, *b.linear1)), *b.linear2)
            x = F.layer_norm(x, width, *final_norm)
            return F.linear(x, head)                                  # (B, T, N)

        return step

    def _is_as_built(self) -> bool:
        """Whether :meth:`make_decode_step`'s written-out pass computes this model's
        :meth:`forward`: GPT's own ``forward`` and ``embed``; every sub-module of a type that
        GPT builds (no subclass); pre-norm blocks with the exact GELU; no hooks (the step calls
        no module, so a hook would not run) and no parametrized weights."""
        cls = type(self)
        if (cls.forward is not GPT.forward or cls.embed is not GPT.embed
                or cls._embed is not GPT._embed or _global_forward_hooks()):
            return False
        for module in self.modules():
            if module is not self and type(module) not in _BUILT_TYPES:
                return False
            if (module._forward_hooks or module._forward_pre_hooks
                    or parametrize.is_parametrized(module)):
                return False
        return all(layer.norm_first and layer.feed_forward.activation.approximate == "none"
                   for layer in self.layers)

    def _check_cache(self, kv_cache: KVCache, length: int) -> int:
        """The positions ``kv_cache`` holds, after checking that ``length`` more fit."""
        _checks.check_type("kv_cache", kv_cache, KVCache, "a KVCache")
        c = self.config
        if kv_cache.num_layers != c.num_layers:
            raise ValueError(f"kv_cache has {kv_cache.num_layers} layers, the model "
                             f"{c.num_layers} layers")
        past = kv_cache.seq_len
        if past + length > c.context_length:
            raise ValueError(f"the cache holds {past} positions and idx has {length} new ones: "
                             f"{past + length} positions, more than context_length="
                             f"{c.context_length}")
        return past

    def embed(self, idx: Tensor, *, offset: int = 0) -> Tensor:
        """Token vectors plus position vectors (then dropout), ``(B, T)`` ids -> ``(B, T,
        d_model)``; ``offset`` is the position of the first column. Unchecked: call with ids
        that :meth:`forward` would accept.

        Chapter 5's sinusoidal encoding has entries up to 1, fifty times the token vectors at
        initialisation (std ``INIT_STD``): added as it is, it drowns the words, and a model
        trained as in chapter 9 never learned the cue (20% after 600 steps, against 100% with
        the encoding scaled by ``INIT_STD``). So it is scaled to the embeddings' size."""
        return _dropout(self.dropout, self._embed(idx, offset))

    def _embed(self, idx: Tensor, offset: int) -> Tensor:
        """:meth:`embed` without the dropout."""
        if offset + idx.shape[1] > self.config.context_length:   # a slice would come out empty
            raise ValueError(f"positions {offset} to {offset + idx.shape[1] - 1} do not fit "
                             f"context_length={self.config.context_length}")
        x = self.token_embedding(idx)                                 # (B, T, d_model)
        length = idx.shape[1]
        if self.position_embedding is not None:
            # the rows of positions offset, ..., offset + T - 1: the lookup of those positions
            positions = self.position_embedding.weight[offset: offset + length]
            x = x + positions                                         # (T, d_model) broadcast
        else:
            encoding = sinusoidal_positional_encoding(length, self.config.d_model, offset=offset,
                                                      device=x.device, dtype=x.dtype)
            x = x + INIT_STD * encoding                               # (T, d_model) broadcast
        return x

    @torch.no_grad()
    def attention_weights(self, idx: Tensor) -> list[Tensor]:
        """Every layer's attention weights for ``idx``: a list of ``num_layers`` tensors
        ``(B, num_heads, T, T)``, row = query position, column = key position. Computed in
        eval mode (no dropout on the weights); the mode is restored."""
        c = self.config
        _checks.check_token_ids("idx", idx, c.vocab_size, max_len=c.context_length)
        with eval_mode(self):
            x = self.embed(idx)
            mask = causal_mask(idx.shape[1], device=idx.device)
            weights = []
            for layer in self.layers:
                x, layer_weights = layer.encode(x, attn_mask=mask, return_weights=True)
                weights.append(layer_weights)
        return weights

    def extra_repr(self) -> str:
        return f"positional={self.config.positional!r}"


def _init_weights(module: nn.Module) -> None:
    """N(0, 0.02) weights, zero biases: as GPT-1 (Radford et al., 2018) and GPT-2 start."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def count_parameters(model: nn.Module) -> int:
    """The number of distinct trainable numbers; a tied weight counts once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

