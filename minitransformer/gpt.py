"""A small GPT: the decoder-only transformer, built from chapter 8's blocks (chapter 9).

Token ids become vectors (token embedding plus a position vector), pass through a stack of
pre-norm :class:`~minitransformer.layers.EncoderLayer` blocks under a causal mask, a final layer
norm, and an output head that shares its weights with the token embedding ("weight tying",
Press and Wolf, 2017). "Decoder-only" is the name of the family; the block it stacks has the
encoder layer's shape, self-attention plus feed-forward with no cross-attention.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from minitransformer import _checks, pretrained
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache
from minitransformer.attention import MultiHeadAttention
from minitransformer.fast_decode import RowProducts, pieces_pay, step_weight
from minitransformer.layers import EncoderLayer, FeedForward, LayerNorm, _dropout
from minitransformer.lm import (
    INIT_STD,
    attention_mask_for,
    check_batch_inputs,
    check_model_cache,
    check_targets,
    global_forward_hooks,
    init_weights,
    next_token_loss,
    positions_from_mask,
)
from minitransformer.masks import causal_mask
from minitransformer.positional import sinusoidal_positional_encoding
from minitransformer.pretrained import Rename
from minitransformer.quantize import QUANTIZED_LINEARS, Int8Linear

POSITIONAL = ("learned", "sinusoidal")
GELUS = ("gelu", "gelu_tanh")  # exact, and the tanh approximation GPT-2 uses (chapter 13)
# the classes of the modules inside a GPT as it builds them (GPT.make_decode_step knows these)
_BUILT_TYPES = (nn.Embedding, nn.Dropout, nn.ModuleList, EncoderLayer, MultiHeadAttention,
                FeedForward, LayerNorm, nn.Linear, nn.GELU)

# GPT-2's name for each of our tensors (chapter 13); "{i}" is a layer's number. GPT-2's Conv1D
# layers store a weight (in, out), nn.Linear (out, in): transposed. Its c_attn is the query, key
# and value projections side by side. The head is tied to wte, as ours to token_embedding.
_QKV = tuple(f"layers.{{i}}.self_attn.{p}_proj" for p in "qkv")
GPT2_NAMES = (
    Rename("token_embedding.weight", "wte.weight"),
    Rename("position_embedding.weight", "wpe.weight"),
    Rename("layers.{i}.norm1.weight", "h.{i}.ln_1.weight"),
    Rename("layers.{i}.norm1.bias", "h.{i}.ln_1.bias"),
    Rename(tuple(f"{p}.weight" for p in _QKV), "h.{i}.attn.c_attn.weight", transpose=True),
    Rename(tuple(f"{p}.bias" for p in _QKV), "h.{i}.attn.c_attn.bias"),
    Rename("layers.{i}.self_attn.out_proj.weight", "h.{i}.attn.c_proj.weight", transpose=True),
    Rename("layers.{i}.self_attn.out_proj.bias", "h.{i}.attn.c_proj.bias"),
    Rename("layers.{i}.norm2.weight", "h.{i}.ln_2.weight"),
    Rename("layers.{i}.norm2.bias", "h.{i}.ln_2.bias"),
    Rename("layers.{i}.feed_forward.linear1.weight", "h.{i}.mlp.c_fc.weight", transpose=True),
    Rename("layers.{i}.feed_forward.linear1.bias", "h.{i}.mlp.c_fc.bias"),
    Rename("layers.{i}.feed_forward.linear2.weight", "h.{i}.mlp.c_proj.weight", transpose=True),
    Rename("layers.{i}.feed_forward.linear2.bias", "h.{i}.mlp.c_proj.bias"),
    Rename("norm.weight", "ln_f.weight"),
    Rename("norm.bias", "ln_f.bias"),
)
# in GPT-2 files but not weights: the causal-mask buffers, and the head tied to wte
_GPT2_SKIPPED = re.compile(r"h\.\d+\.attn\.(masked_)?bias|lm_head\.weight")
_GPT2_GELUS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


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
        activation: the feed-forward's GELU: ``"gelu"``, exact, ``x * Phi(x)``, or
            ``"gelu_tanh"``, GPT-2's tanh approximation of it (chapter 13).
        norm_eps: the layer norms' ``eps`` (GPT-2's ``layer_norm_epsilon``).

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``d_model`` not divisible by
            ``num_heads``, a bad ``dropout``, ``positional``, ``activation`` or ``norm_eps``.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    positional: str = "learned"
    activation: str = "gelu"
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        _checks.check_model_sizes(self, ("vocab_size", "context_length", "num_layers",
                                         "num_heads", "d_model"), lambda d: 4 * d)
        _checks.check_probability("dropout", self.dropout)
        _checks.check_choice("positional", self.positional, POSITIONAL)
        _checks.check_choice("activation", self.activation, GELUS)
        _checks.check_number("norm_eps", self.norm_eps, positive=True)
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")


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
        return cls(cls.norm(layer.norm1), cls.linear(q), cls.linear(k), cls.linear(v),
                   cls.linear(out), cls.norm(layer.norm2), cls.linear(l1), cls.linear(l2))

    @staticmethod
    def linear(linear: nn.Linear | Int8Linear) -> tuple[Tensor | Int8Linear, Tensor | None]:
        """``(weight, bias)``; an int8 layer is ``(layer, None)``: it adds its own bias."""
        return ((linear.weight, linear.bias) if isinstance(linear, nn.Linear)
                else (step_weight(linear), None))


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
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout,
                         activation=c.activation, norm_first=True, layer_norm_eps=c.norm_eps,
                         **factory)
            for _ in range(c.num_layers))
        self.norm = LayerNorm(c.d_model, eps=c.norm_eps, **factory)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False, **factory)
        self.head.weight = self.token_embedding.weight  # weight tying: one (N, d_model) matrix
        self.apply(init_weights)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *,
                kv_cache: KVCache | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Next-token scores for every position, and the loss when ``targets`` are given.

        Args:
            idx: ``(B, T)`` token ids, ``T <= context_length``.
            targets: ``(B, T)`` the token that follows each position (``idx`` shifted left);
                ``-100`` marks a position left out of the loss, as in ``F.cross_entropy``.
            kv_cache: a :class:`~minitransformer.cache.KVCache` with a slot per layer
                (chapter 11). ``idx`` then holds only the new tokens: they take the positions
                after the ``kv_cache.seq_len`` cached ones, attend to those too, and their
                keys and values are appended. Logits and loss are for the new tokens.
            attention_mask: ``(B, P + T)`` bool, True on the real tokens of each row (the ``P``
                cached positions, then the ``T`` new ones), False on padding (chapter 18): no
                query attends to a padding key. A batch of prompts of different lengths is
                padded on the left (:func:`~minitransformer.batching.left_pad`).
            position_ids: ``(B, T)`` the position of each new token. ``None``: counted from
                each row's first real token when ``attention_mask`` is given (a padded row's
                first real token is at position 0, as when it runs alone), else ``P`` to
                ``P + T - 1``.

        Returns:
            ``(logits, loss)``: logits ``(B, T, vocab_size)``; ``loss`` the mean cross-entropy
            over the positions whose target is not ``-100``, or ``None`` without targets.

        Raises:
            TypeError: ``idx`` or ``targets`` is not an int64 or int32 tensor.
            ValueError: a shape other than ``(B, T)``, ``T > context_length``, a token id
                outside ``[0, vocab_size)``, ``idx`` on another device than the model,
                ``targets`` shaped unlike ``idx`` or all ``-100``; a cache whose positions plus
                ``T`` exceed ``context_length``, with another number of layers, or holding
                another batch size (or past its ``max_len``); an ``attention_mask`` that is not
                boolean ``(B, P + T)``, ``position_ids`` not integer ``(B, T)`` in
                ``[0, context_length)``.
        """
        past = self._check_input(idx, kv_cache)
        if targets is not None:
            check_targets(targets, idx, self.config.vocab_size)
        position_ids = check_batch_inputs(self.config, idx, past, attention_mask, position_ids)
        length = idx.shape[1]
        if position_ids is None:
            x = self.embed(idx, offset=past)                          # (B, T, d_model)
        else:
            x = _dropout(self.dropout, self._embed_at(idx, position_ids))
        # the new queries are the last T of past + T keys (lower right); one query sees all
        mask = attention_mask_for(attention_mask, length, past, idx.device)
        for i, layer in enumerate(self.layers):
            x = layer.encode(x, attn_mask=mask, kv_cache=kv_cache, layer_idx=i)
        logits = self.head(self.norm.normalize(x))                    # (B, T, N)
        return logits, None if targets is None else next_token_loss(logits, targets)

    def decode_step(self, idx: Tensor, kv_cache: KVCache) -> Tensor:
        """``forward(idx, kv_cache=kv_cache)[0]`` in eval mode, the same numbers bit for bit,
        through the speed path of chapter 11: ``self.make_decode_step()(idx, kv_cache)``.

        The arguments are checked as :meth:`forward` checks them (ids, dtype, device, and the
        cache's type, layers, batch and room). A loop of steps should check once, make the step
        function once and call it, as :func:`~minitransformer.generation.generate` does.
        """
        self._check_input(idx, kv_cache, cache_required=True)
        return self.make_decode_step()(idx, kv_cache)

    def _check_input(self, idx: Tensor, kv_cache: KVCache | None, *,
                     cache_required: bool = False) -> int:
        """The checks of :meth:`forward` and :meth:`decode_step`; returns the cached positions."""
        c = self.config
        _checks.check_token_ids("idx", idx, c.vocab_size, max_len=c.context_length,
                                device=self.token_embedding.weight.device)
        if kv_cache is None and not cache_required:
            return 0
        return self._check_cache(kv_cache, idx.shape)

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
        :meth:`forward` would take, to which it appends the new keys and values, and
        :meth:`forward`'s keyword-only ``attention_mask`` and ``position_ids`` (a padded batch,
        chapter 18; not checked). It returns the
        logits ``(B, T, vocab_size)`` of the new tokens, and raises ``ValueError`` when the
        cached and the new positions together exceed ``context_length``.
        """
        if not self._is_as_built():
            def forward_step(idx: Tensor, kv_cache: KVCache, *,
                             attention_mask: Tensor | None = None,
                             position_ids: Tensor | None = None) -> Tensor:
                with eval_mode(self):                                 # no dropout here either
                    batch = {name: t for name, t in (("attention_mask", attention_mask),
                                                     ("position_ids", position_ids))
                             if t is not None}   # a subclass's forward may not take them
                    return self(idx, kv_cache=kv_cache, **batch)[0]
            return forward_step
        blocks = [_BlockWeights.of(layer) for layer in self.layers]
        final_norm, head = _BlockWeights.norm(self.norm), self.head.weight
        width, heads = (self.config.d_model,), self.config.num_heads
        approximate = "tanh" if self.config.activation == "gelu_tanh" else "none"

        def split_heads(t: Tensor) -> Tensor:                     # (B, T, d) -> (B, h, T, d_k)
            batch, length, _ = t.shape
            return t.view(batch, length, heads, -1).transpose(1, 2)

        def step(idx: Tensor, kv_cache: KVCache, *, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None) -> Tensor:
            past, length = kv_cache.seq_len, idx.shape[1]
            if attention_mask is not None and position_ids is None:
                position_ids = positions_from_mask(attention_mask, length)
            x = (self._embed(idx, past) if position_ids is None
                 else self._embed_at(idx, position_ids))              # (B, T, d_model)
            mask = attention_mask_for(attention_mask, length, past, idx.device)
            for i, b in enumerate(blocks):                           # pre-norm, GELU blocks
                h = F.layer_norm(x, width, *b.norm1)
                q = split_heads(F.linear(h, *b.q_proj))
                k = split_heads(F.linear(h, *b.k_proj))
                v = split_heads(F.linear(h, *b.v_proj))
                k, v = kv_cache.update(i, k, v)                       # (B, h, past + T, d_k)
                attended = F.scaled_dot_product_attention(q, k, v, mask).transpose(1, 2)
                x = x + F.linear(attended.reshape(x.shape), *b.out_proj)
                h = F.layer_norm(x, width, *b.norm2)
                hidden = F.gelu(F.linear(h, *b.linear1), approximate=approximate)
                x = x + F.linear(hidden, *b.linear2)
            x = F.layer_norm(x, width, *final_norm)
            return F.linear(x, head)                                  # (B, T, N)

        return step

    def make_fast_decode_step(self, *, pack_weights: bool = False
                              ) -> Callable[[Tensor, KVCache], Tensor]:
        """:meth:`make_decode_step`'s step, faster where a batch writes one token per row; its
        logits equal :meth:`forward`'s up to float rounding, no longer bit for bit (so the
        greedy tokens are the same unless two scores tie to within that rounding).
        :func:`~minitransformer.generation.generate` steps through it by default.

        At one token per row, each linear layer is a matrix-vector product, whose speed is the
        memory's, and ``F.linear`` of one row on the CPU reads the weights well below it. This
        step multiplies each large weight matrix through ``minitransformer.fast_decode``'s
        blocks of rows instead (views of the weight itself, no copy), which the threads share;
        smaller matrices, and other dtypes (bfloat16) and devices, keep ``F.linear``, and the
        step still saves Python's time per layer. The blocks change the order of the
        additions, hence the rounding. ``benchmarks/decode_vs_transformers.py`` times it
        against the ordinary step and ``transformers`` (its docstring has the figures).

        The step follows the model exactly as :meth:`make_decode_step`'s does (the same
        weight tensors, so a weight changed in place, by an optimizer or ``load_state_dict``,
        or moved by ``.to()``, is seen); a call with several new tokens per row (the prompt's
        prefill) is that step's, bit for bit (unless ``pack_weights``); and a model it cannot
        follow gets ``forward`` itself. Gradients flow through it as through ``forward``.
        Arguments and result are those of :meth:`make_decode_step`'s step.

        ``pack_weights=True`` (a serving engine's choice, chapter 18) also keeps a copy of
        every weight matrix in the layout that oneDNN, PyTorch's CPU kernel library, packs a
        matrix into for its products, made once, here, instead of at every call. Products of
        ``PACKED_MIN_ROWS`` (3) rows or more then read that copy: the prefill too, and a
        batch's decode step; one or two rows keep the blocks, which read faster
        (``benchmarks/packed_weights.py`` times each way). The prefill is then no longer
        ``forward`` bit for bit, only within float32 rounding.

        The copy costs the weights' memory once more, and it is a copy: a weight changed in
        place through its tensor (``copy_``, ``mul_``, ``load_state_dict``, most optimizers),
        which counts the change in its ``_version``, or moved, is packed again at the next call;
        a change that bypasses the counter is not seen (through ``.data``, through another
        tensor on the same memory, or by a fused optimizer such as ``AdamW(fused=True)`` on the
        CPU): make a new step after one. Packing applies to float32 weights on the CPU while
        ``torch.backends.mkldnn`` is available and enabled, and only without autograd (under
        ``torch.no_grad()`` or ``torch.inference_mode()``); otherwise, and for weights made
        under inference mode (which have no counter), the step is the unpacked one, bit for
        bit. It goes through ``torch.ops.mkldnn``'s private operators
        (``_reorder_linear_weight``, ``_linear_pointwise``), pinned with the course's ``torch``.
        """
        _checks.check_type("pack_weights", pack_weights, bool, "True or False")
        ordinary = self.make_decode_step()
        if not self._is_as_built(int8=True):
            return ordinary                              # forward itself, in eval mode
        blocks = [_BlockWeights.of(layer) for layer in self.layers]
        final_norm, head = _BlockWeights.norm(self.norm), _BlockWeights.linear(self.head)
        width, heads = (self.config.d_model,), self.config.num_heads
        approximate = "tanh" if self.config.activation == "gelu_tanh" else "none"
        products = RowProducts([w for b in blocks for w, _ in (
            b.q_proj, b.k_proj, b.v_proj, b.out_proj, b.linear1, b.linear2)] + [head[0]],
            pack_weights=pack_weights)

        def step(idx: Tensor, kv_cache: KVCache, *, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None) -> Tensor:
            rows, length = idx.shape
            packed = products.packed_now()
            if length != 1 and not packed:               # the prefill: matrix products
                return ordinary(idx, kv_cache, attention_mask=attention_mask,
                                position_ids=position_ids)
            past = kv_cache.seq_len
            if attention_mask is not None and position_ids is None:
                position_ids = positions_from_mask(attention_mask, length)
            x = (self._embed(idx, past) if position_ids is None
                 else self._embed_at(idx, position_ids)).view(rows * length, -1)  # (B T, d)
            mask = attention_mask_for(attention_mask, length, past, idx.device)
            way = {"packed": packed, "blockwise": pieces_pay(x)}

            def split_heads(t: Tensor) -> Tensor:            # (B T, d) -> (B, h, T, d_k)
                return t.view(rows, length, heads, -1).transpose(1, 2)

            for i, b in enumerate(blocks):                # the blocks of make_decode_step
                h = F.layer_norm(x, width, *b.norm1)
                q = split_heads(products(h, *b.q_proj, **way))
                k = split_heads(products(h, *b.k_proj, **way))
                v = split_heads(products(h, *b.v_proj, **way))
                k, v = kv_cache.update(i, k, v)                          # (B, h, past + T, d_k)
                attended = F.scaled_dot_product_attention(q, k, v, mask)  # (B, h, T, d_k)
                attended = attended.transpose(1, 2).reshape(rows * length, -1)
                x = x + products(attended, *b.out_proj, **way)
                h = F.layer_norm(x, width, *b.norm2)
                hidden = F.gelu(products(h, *b.linear1, **way), approximate=approximate)
                x = x + products(hidden, *b.linear2, **way)
            x = F.layer_norm(x, width, *final_norm)
            return products(x, *head, **way).view(rows, length, -1)      # (B, T, N)

        return step

    def _is_as_built(self, *, int8: bool = False) -> bool:
        """Whether :meth:`make_decode_step`'s written-out pass computes this model's
        :meth:`forward`: GPT's own ``forward`` and ``embed``; every sub-module of a type that
        GPT builds (no subclass); pre-norm blocks with the config's GELU; no hooks (the step calls
        no module, so a hook would not run) and no parametrized weights. ``int8``: the fast
        step's question, which also follows int8 layers
        (:func:`~minitransformer.quantize.quantize_linears`)."""
        built = _BUILT_TYPES + QUANTIZED_LINEARS * int8
        cls = type(self)
        if (cls.forward is not GPT.forward or cls.embed is not GPT.embed
                or cls._embed is not GPT._embed or cls._embed_at is not GPT._embed_at
                or global_forward_hooks()):
            return False
        for module in self.modules():
            if module is not self and type(module) not in built:
                return False
            if (module._forward_hooks or module._forward_pre_hooks
                    or parametrize.is_parametrized(module)):
                return False
        approximate = "tanh" if self.config.activation == "gelu_tanh" else "none"
        return all(layer.norm_first and layer.feed_forward.activation.approximate == approximate
                   for layer in self.layers)

    def _check_cache(self, kv_cache: KVCache, idx_shape: torch.Size) -> int:
        """The positions ``kv_cache`` holds, after checking that it is this model's cache for a
        batch of ``idx_shape`` ``(B, T)``, with room for ``T`` more positions."""
        return check_model_cache(self.config, kv_cache, idx_shape)

    def embed(self, idx: Tensor, *, offset: int = 0) -> Tensor:
        """Token vectors plus position vectors (then dropout), ``(B, T)`` ids -> ``(B, T,
        d_model)``; ``offset`` is the position of the first column. ``idx`` is checked as
        :meth:`forward` checks it (forward, which calls this method, so that a subclass may
        change it, thus checks its ids twice: two reductions of a ``(B, T)`` tensor).

        Chapter 5's sinusoidal encoding has entries up to 1, fifty times the token vectors at
        initialisation (std ``INIT_STD``): added as it is, it drowns the words, and a model
        trained as in chapter 9 never learned the cue (20% after 600 steps, against 100% with
        the encoding scaled by ``INIT_STD``). So it is scaled to the embeddings' size."""
        self._check_input(idx, None)
        _checks.check_int("offset", offset, low=0)
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

    def _embed_at(self, idx: Tensor, position_ids: Tensor) -> Tensor:
        """:meth:`_embed` at the positions ``position_ids`` ``(B, T)`` (a padded batch, in
        which each row has its own positions; chapter 18): the same rows of the same tables."""
        x = self.token_embedding(idx)                                 # (B, T, d_model)
        if self.position_embedding is not None:
            return x + self.position_embedding.weight[position_ids]   # (B, T, d_model)
        table = sinusoidal_positional_encoding(int(position_ids.max()) + 1, self.config.d_model,
                                               device=x.device, dtype=x.dtype)
        return x + INIT_STD * table[position_ids]

    @torch.no_grad()
    def attention_weights(self, idx: Tensor) -> list[Tensor]:
        """Every layer's attention weights for ``idx``: a list of ``num_layers`` tensors
        ``(B, num_heads, T, T)``, row = query position, column = key position. Computed in
        eval mode (no dropout on the weights); the mode is restored."""
        self._check_input(idx, None)
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

    # --- checkpoints: GPT-2's directory layout (chapters 9 and 13) -----------------------------

    def save_pretrained(self, path: str | os.PathLike, *, bos_token_id: int | None = None,
                        eos_token_id: int | None = None) -> None:
        """Write ``path/config.json`` and ``path/model.safetensors`` as a GPT-2 checkpoint:
        GPT-2's config keys and tensor names (:data:`GPT2_NAMES`), which
        ``transformers.GPT2LMHeadModel.from_pretrained`` reads. The tied head is stored once
        (as ``wte``). Sinusoidal positions are written as the table they add (``wpe``), so GPT-2
        computes the same logits; ``config.json``'s ``"minitransformer"`` key keeps what GPT-2
        has no field for, so :meth:`from_pretrained` rebuilds this very model.

        ``bos_token_id`` and ``eos_token_id`` are the tokenizer's (``null`` in ``config.json``
        when it has none): transformers' ``generate`` and ``pipeline`` stop a text at
        ``eos_token_id``, as :func:`~minitransformer.generation.generate` does with ``eos_id``.

        Raises:
            ValueError: blocks changed after construction so that GPT-2 cannot express them
                (post-norm, another activation), a token id outside the vocabulary, or ``path``
                is a file.
        """
        c = self.config
        for name, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if value is not None and _checks.check_int(name, value, low=0) >= c.vocab_size:
                raise ValueError(f"{name}={value} is not a token of the vocabulary "
                                 f"[0, {c.vocab_size})")
        approximate = "tanh" if c.activation == "gelu_tanh" else "none"
        if not all(type(layer) is EncoderLayer and layer.norm_first
                   and getattr(layer.feed_forward.activation, "approximate", None) == approximate
                   for layer in self.layers):
            raise ValueError("this GPT's blocks are no longer the pre-norm blocks of its config "
                             "(GPT-2's layout), so it cannot be saved as a GPT-2 checkpoint")
        state = self.state_dict()
        if self.position_embedding is None:
            weight = self.token_embedding.weight
            state["position_embedding.weight"] = INIT_STD * sinusoidal_positional_encoding(
                c.context_length, c.d_model, device=weight.device, dtype=weight.dtype)
        tensors = pretrained.to_theirs(state, GPT2_NAMES, c.num_layers)
        dtype = str(self.token_embedding.weight.dtype).removeprefix("torch.")
        config = {**_gpt2_config(c, dtype), "bos_token_id": bos_token_id,
                  "eos_token_id": eos_token_id}
        pretrained.write_checkpoint(path, config,
                                    {f"transformer.{name}": t for name, t in tensors.items()})

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> GPT:
        """A GPT-2 checkpoint directory as a :class:`GPT`, in eval mode.

        Reads what :meth:`save_pretrained` writes and what transformers' ``GPT2LMHeadModel``
        writes (keys with or without the ``transformer.`` prefix; the causal-mask buffers of
        older files are skipped). ``path`` is a directory; a name such as ``"gpt2"`` that is
        not one is downloaded from the Hugging Face Hub when ``huggingface_hub`` is installed.
        Only safetensors files are read, never a pickle.

        Args:
            path: the directory (or a Hub repo id).
            device, dtype: where and in what precision to build the model; ``dtype=None`` keeps
                the checkpoint's.

        Raises:
            FileNotFoundError: no such directory or file, and no way to download it.
            ValueError: a config GPT's architecture cannot express (naming the field: another
                ``model_type``, untied embeddings, ``scale_attn_by_inverse_layer_idx``,
                ``reorder_and_upcast_attn``, unequal dropouts, another activation); a file that
                is not JSON or safetensors; a tensor missing, unknown, or shaped unlike the
                config says (naming it and both shapes).
        """
        folder = pretrained.resolve(path)
        raw, tensors = pretrained.read_checkpoint(folder)
        config = _config_from_gpt2(raw, str(folder / pretrained.CONFIG_FILE))
        source = str(folder / pretrained.WEIGHTS_FILE)
        tensors = pretrained.strip_prefix(tensors, "transformer.", source=source)
        theirs = pretrained.their_names(GPT2_NAMES, config.num_layers)
        pretrained.check_names(tensors, theirs.values(), source=source, skipped=_GPT2_SKIPPED,
                               model=f"a GPT-2 model with n_layer={config.num_layers}")
        pretrained.check_tied(tensors, "lm_head.weight", "wte.weight", source=source,
                              config=str(folder / pretrained.CONFIG_FILE))
        state = pretrained.to_ours(tensors, GPT2_NAMES, config.num_layers, source=source)
        if config.positional == "sinusoidal" and not _is_sinusoidal_table(
                state["position_embedding.weight"], config):
            # the table was changed elsewhere (trained on in transformers): GPT-2's learned
            # positions, so that the logits stay the file's
            config = dataclasses.replace(config, positional="learned")
        return pretrained.build(cls, config, state, source=source, device=device, dtype=dtype,
                                theirs=theirs)


def _is_sinusoidal_table(wpe: Tensor, config: GPTConfig) -> bool:
    """Whether ``wpe`` is the scaled sinusoidal table :meth:`GPT.save_pretrained` writes for
    sinusoidal positions (to well within bfloat16's rounding)."""
    table = INIT_STD * sinusoidal_positional_encoding(config.context_length, config.d_model,
                                                      device=wpe.device, dtype=torch.float64)
    return torch.allclose(wpe.double(), table, rtol=0.0, atol=0.01 * INIT_STD)


def _gpt2_config(c: GPTConfig, dtype: str) -> dict:
    """GPT-2's ``config.json`` for ``c``; what GPT-2 has no field for under
    ``"minitransformer"``."""
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "dtype": dtype,
        "vocab_size": c.vocab_size, "n_positions": c.context_length, "n_embd": c.d_model,
        "n_layer": c.num_layers, "n_head": c.num_heads, "n_inner": c.d_ff,
        "activation_function": "gelu_new" if c.activation == "gelu_tanh" else "gelu",
        "layer_norm_epsilon": c.norm_eps, "tie_word_embeddings": True,
        "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
        "bos_token_id": None, "eos_token_id": None,
        "minitransformer": {"positional": c.positional},
    }


def _config_from_gpt2(raw: dict, source: str) -> GPTConfig:
    """The :class:`GPTConfig` of a GPT-2 ``config.json``, or a ``ValueError`` naming the field
    that GPT cannot express (transformers' defaults stand in for absent fields)."""
    def refuse(why: str) -> ValueError:
        return ValueError(f"{source}: {why}, which GPT cannot express")

    if raw.get("model_type") != "gpt2":
        raise refuse(f"model_type is {raw.get('model_type')!r}, not 'gpt2'")
    if raw.get("tie_word_embeddings", True) is not True:
        raise refuse("tie_word_embeddings is false (a head apart from wte)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                 "add_cross_attention"):
        if raw.get(flag):
            raise refuse(f"{flag} is set")
    if raw.get("scale_attn_weights", True) is not True:
        raise refuse("scale_attn_weights is false (scores not divided by sqrt(d_head))")
    drops = {key: raw.get(key, 0.1) for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    if len(set(drops.values())) > 1:
        raise refuse("unequal dropouts " + ", ".join(f"{k}={v}" for k, v in drops.items()))
    activation = raw.get("activation_function", "gelu_new")
    if activation not in _GPT2_GELUS:
        raise refuse(f"activation_function is {activation!r}")
    ours = raw.get("minitransformer", {})
    if not isinstance(ours, dict):
        raise ValueError(f"{source}: the 'minitransformer' field must be an object")
    sizes = {name: raw.get(key) for name, key in (
        ("vocab_size", "vocab_size"), ("context_length", "n_positions"),
        ("num_layers", "n_layer"), ("num_heads", "n_head"), ("d_model", "n_embd"))}
    for name, value in sizes.items():
        if value is None:
            raise ValueError(f"{source} has no field for {name}")
    try:
        return GPTConfig(**sizes, d_ff=raw.get("n_inner"), dropout=drops["resid_pdrop"],
                         positional=ours.get("positional", "learned"),
                         activation=_GPT2_GELUS[activation],
                         norm_eps=raw.get("layer_norm_epsilon", 1e-5))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def count_parameters(model: nn.Module) -> int:
    """The number of distinct trainable numbers; a tied weight counts once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

