"""The transformer block and its parts (chapters 4 and 8).

* :class:`FeedForward` -- the position-wise feed-forward block of chapter 4.
* :class:`LayerNorm` -- layer normalization (chapter 8), through PyTorch's fused kernel; the
  equation written out is :func:`minitransformer.functional.layer_norm`.
* :class:`EncoderLayer` -- self-attention then feed-forward, each inside a residual connection
  with layer norm and dropout (chapter 8). With ``norm_first=True`` and a causal mask it is the
  block a GPT stacks.
* :class:`DecoderLayer` -- masked self-attention, cross-attention to an encoder's output
  (``memory``), then feed-forward (chapter 8).
* :class:`RMSNorm` and :class:`SwiGLU` -- Llama's normalization and gated feed-forward block
  (chapter 14); the block that stacks them is :class:`~minitransformer.llama.LlamaBlock`.

Checked once, at the entrance. Each module's ``forward`` is a public entry point: it checks its
inputs (types, shapes, dtypes, masks) and then calls the module's unchecked method, which is the
computation alone:

=================  ===========================================================================
module             unchecked method
=================  ===========================================================================
LayerNorm          ``normalize(x)``
RMSNorm            ``normalize(x)``
SwiGLU             ``transform(x)``
FeedForward        ``transform(x)``
EncoderLayer       ``encode(x, *, attn_mask=None, kv_cache=None, layer_idx=0)``
DecoderLayer       ``decode(x, memory, *, tgt_mask=None, memory_mask=None, kv_cache=None,
                   layer_idx=0, memory_kv=None, return_cross_weights=False)``
=================  ===========================================================================

The unchecked methods call each other and
:meth:`~minitransformer.attention.MultiHeadAttention.attend`, never a checked ``forward``. A
model that has checked its own input (a GPT, an encoder-decoder) calls
``layer.encode``/``layer.decode`` on the same footing. Chapter 11's KV cache is one more
keyword of ``encode``/``decode`` (with the layer's slot, ``layer_idx``), passed on to the
self-attention; a decoder's cross-attention never appends to it. Instead, a model that
generates projects each source once and passes the cross-attention keys and values to
``decode`` as ``memory_kv`` (chapter 10).

Masks are boolean with True = may attend (or additive floating masks of 0 and -inf), broadcast
to the scores ``(B, num_heads, T_q, T_k)``. PyTorch's transformer layers use the opposite
polarity: where ``nn.TransformerEncoderLayer`` takes ``src_mask=m`` or
``src_key_padding_mask=p`` (True = masked), these layers take ``attn_mask=~m`` or
``attn_mask=~p[:, None, None, :]``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.attention import MultiHeadAttention
from minitransformer.cache import KVCache, check_kv_cache

# "gelu" is the exact x * Phi(x); "gelu_tanh" its tanh approximation, GPT-2's (chapter 13)
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU,
               "gelu_tanh": functools.partial(nn.GELU, approximate="tanh")}


def _dropout(dropout: nn.Dropout, x: Tensor) -> Tensor:
    """``dropout(x)``, without the call where it would return ``x`` unchanged: in eval mode or
    with ``p = 0``. A block calls dropout three times; while a model writes one token at a time
    (chapter 11), the calls that do nothing took a tenth of each step."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


class FeedForward(nn.Module):
    """``FFN(x) = activation(x W1 + b1) W2 + b2``, applied to every position on its own.

    With ReLU this is ``max(0, x W1 + b1) W2 + b2`` of Vaswani et al. (2017), eq. 2. The
    sub-modules carry PyTorch's names (``linear1``, ``linear2``, as in
    ``nn.TransformerEncoderLayer``), so weights copy across one to one. Note that
    ``nn.Linear`` stores ``W1`` transposed: ``linear1.weight`` has shape ``(d_ff, d_model)``.

    Args:
        d_model: size of each input and output vector.
        d_ff: number of hidden features.
        dropout: probability of zeroing a hidden feature while training (``0.0`` = off).
        activation: ``"relu"``, ``"gelu"`` (exact) or ``"gelu_tanh"`` (approximate).
        device, dtype: where and in what precision to create the parameters.

    Shapes:
        input ``(..., d_model)`` -> output ``(..., d_model)``; the hidden features are
        ``(..., d_ff)``.
    """

    def __init__(self, d_model: int, d_ff: int, *, dropout: float = 0.0,
                 activation: str = "relu", device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.d_model = _checks.check_int("d_model", d_model)
        self.d_ff = _checks.check_int("d_ff", d_ff)
        _checks.check_probability("dropout", dropout)
        _checks.check_choice("activation", activation, ACTIVATIONS)
        factory = _checks.factory_kwargs(device, dtype)
        self.linear1 = nn.Linear(d_model, d_ff, **factory)
        self.activation = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, **factory)

    def features(self, x: Tensor) -> Tensor:
        """The hidden features ``activation(x W1 + b1)``, shape ``(..., d_ff)``."""
        self._check_input(x)
        return self.activation(self.linear1(x))

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to ``x`` of shape ``(..., d_model)``; returns ``(..., d_model)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the parameters' dtype.
            ValueError: its last dimension is not ``d_model``.
        """
        self._check_input(x)
        return self.transform(x)

    def transform(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the input check, for callers that checked ``x`` already."""
        return self.linear2(_dropout(self.dropout, self.activation(self.linear1(x))))

    def _check_input(self, x: Tensor) -> None:
        _checks.check_float_tensor("x", x, min_ndim=1, last_dim=self.d_model)
        _checks.check_same_dtype(x=x, weights=self.linear1.weight)

    def set_weights(self, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> "FeedForward":
        """Copy hand-set weights, written the way the equation reads, into the block.

        Args:
            w1: ``(d_model, d_ff)``, so that the features are ``x @ w1 + b1``.
            b1: ``(d_ff,)``.
            w2: ``(d_ff, d_model)``, so that the output is ``features @ w2 + b2``.
            b2: ``(d_model,)``.

        Returns:
            the block itself, for chaining.
        """
        expected = {"w1": (self.d_model, self.d_ff), "b1": (self.d_ff,),
                    "w2": (self.d_ff, self.d_model), "b2": (self.d_model,)}
        given = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
        for name, value in given.items():
            _checks.check_float_tensor(name, value)
            if _checks.shape(value) != expected[name]:
                raise ValueError(f"{name} must have shape {expected[name]}, got "
                                 f"{_checks.shape(value)}")
        with torch.no_grad():
            self.linear1.weight.copy_(w1.T)
            self.linear1.bias.copy_(b1)
            self.linear2.weight.copy_(w2.T)
            self.linear2.bias.copy_(b2)
        return self

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"


class LayerNorm(nn.Module):
    """Layer normalization (Ba et al., 2016): each vector to mean 0 and variance 1, then
    scaled by ``weight`` and shifted by ``bias``.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias``, with the mean and the biased
    variance (divided by ``d_model``) taken over the last dimension. Equal to
    ``nn.LayerNorm(d_model, eps=eps)`` with the same ``weight`` and ``bias``.

    Chapter 8 writes the equation out: :func:`~minitransformer.functional.layer_norm`. This
    module computes it with PyTorch's fused kernel ``F.layer_norm`` (a single call instead of the
    equation's eight operations), because every block calls it two or three times, and when a
    model writes one token at a time (chapter 11) the written-out version took a quarter to a
    third of each step. The two agree to float rounding (tested).

    Args:
        d_model: the size of the last dimension.
        eps: added to the variance, so that a constant vector does not divide by zero.
        device, dtype: where and in what precision to create the parameters.

    Shapes:
        ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-5,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.d_model = _checks.check_int("d_model", d_model)
        self.eps = _checks.check_number("eps", eps, positive=True)
        factory = _checks.factory_kwargs(device, dtype)
        self.weight = nn.Parameter(torch.ones(d_model, **factory))
        self.bias = nn.Parameter(torch.zeros(d_model, **factory))

    def forward(self, x: Tensor) -> Tensor:
        """Normalize each vector of ``x`` ``(..., d_model)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the parameters' dtype.
            ValueError: its last dimension is not ``d_model``.
        """
        _checks.check_float_tensor("x", x, min_ndim=1, last_dim=self.d_model)
        _checks.check_same_dtype(x=x, weight=self.weight)
        return self.normalize(x)

    def normalize(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the input check (for callers that checked): PyTorch's fused
        kernel, equal to :func:`~minitransformer.functional.layer_norm`."""
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class RMSNorm(nn.Module):
    """Root-mean-square normalization (Zhang and Sennrich, 2019): each vector divided by its
    root mean square, then scaled by ``weight`` (chapter 14).

    ``y = x / sqrt(mean(x ** 2) + eps) * weight``, the mean over the last dimension. Unlike
    :class:`LayerNorm` it subtracts no mean and adds no bias. Equal to
    ``nn.RMSNorm(d_model, eps=eps)`` with the same ``weight``; the equation written out is
    :func:`~minitransformer.functional.rms_norm`, and this module calls PyTorch's fused
    ``F.rms_norm``, for the reason :class:`LayerNorm` gives.

    Args:
        d_model: the size of the last dimension.
        eps: added to the mean square (Llama's ``rms_norm_eps``).
        device, dtype: where and in what precision to create the weight.

    Shapes:
        ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, *, eps: float = 1e-6,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.d_model = _checks.check_int("d_model", d_model)
        self.eps = _checks.check_number("eps", eps, positive=True)
        factory = _checks.factory_kwargs(device, dtype)
        self.weight = nn.Parameter(torch.ones(d_model, **factory))

    def forward(self, x: Tensor) -> Tensor:
        """Normalize each vector of ``x`` ``(..., d_model)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the weight's dtype.
            ValueError: its last dimension is not ``d_model``.
        """
        _checks.check_float_tensor("x", x, min_ndim=1, last_dim=self.d_model)
        _checks.check_same_dtype(x=x, weight=self.weight)
        return self.normalize(x)

    def normalize(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the input check: PyTorch's fused kernel, equal to
        :func:`~minitransformer.functional.rms_norm`."""
        return F.rms_norm(x, (self.d_model,), self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class SwiGLU(nn.Module):
    """The gated feed-forward block of Llama (Shazeer, 2020; chapter 14):
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``, with no biases.

    ``gate_proj`` and ``up_proj`` both lift ``x`` to ``d_ff`` features; the SiLU of the first
    (``z * sigmoid(z)``) decides, feature by feature, how much of the second passes;
    ``down_proj`` brings the result back to ``d_model``. Three matrices instead of
    :class:`FeedForward`'s two, so a ``d_ff`` of about ``8/3 * d_model`` costs what ``4 *
    d_model`` costs there. The sub-modules carry transformers' names.

    Args:
        d_model: size of each input and output vector.
        d_ff: number of hidden features.
        device, dtype: where and in what precision to create the parameters.

    Shapes:
        ``(..., d_model)`` -> ``(..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.d_model = _checks.check_int("d_model", d_model)
        self.d_ff = _checks.check_int("d_ff", d_ff)
        factory = _checks.factory_kwargs(device, dtype)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False, **factory)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False, **factory)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False, **factory)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to ``x`` of shape ``(..., d_model)``.

        Raises:
            TypeError: ``x`` is not a floating-point tensor of the parameters' dtype.
            ValueError: its last dimension is not ``d_model``.
        """
        _checks.check_float_tensor("x", x, min_ndim=1, last_dim=self.d_model)
        _checks.check_same_dtype(x=x, weights=self.gate_proj.weight)
        return self.transform(x)

    def transform(self, x: Tensor) -> Tensor:
        """:meth:`forward` without the input check."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"


def _check_sizes(d_model: int, num_heads: int, d_ff: int) -> None:
    _checks.check_int("d_model", d_model)
    _checks.check_int("num_heads", num_heads)
    _checks.check_int("d_ff", d_ff)
    _checks.check_divisible(d_model, num_heads)


def _check_sequence(name: str, x: object, d_model: int, weight: Tensor) -> Tensor:
    """A floating ``(B, T, d_model)`` tensor in the layer's dtype, with at least one position."""
    _checks.check_float_tensor(name, x, ndim=3, last_dim=d_model)
    _checks.check_same_dtype(**{name: x, "the layer's weights": weight})
    if x.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one position, got shape {_checks.shape(x)}")
    return x


def _check_layer_mask(name: str, mask: Tensor | None, x: Tensor, num_heads: int,
                      keys: int) -> None:
    """A mask that broadcasts to the scores ``(B, num_heads, T, keys)``; a floating one in the
    dtype of ``x``."""
    if mask is not None:
        _checks.check_mask(mask, (x.shape[0], num_heads, x.shape[1], keys),
                           "(B, num_heads, T_q, T_k)", name=name)
        if mask.is_floating_point():
            _checks.check_same_dtype(x=x, **{name: mask})


class EncoderLayer(nn.Module):
    """One transformer block: self-attention, then the feed-forward block, each wrapped in a
    residual connection with dropout and layer norm (chapter 8).

    Post-norm (``norm_first=False``, the original transformer's order)::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(feed_forward(x)))

    Pre-norm (``norm_first=True``, GPT-2's order)::

        x = x + dropout1(self_attn(norm1(x)))
        x = x + dropout2(feed_forward(norm2(x)))

    Equal to ``nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout, activation,
    batch_first=True, norm_first=norm_first)`` with the same weights (see :meth:`from_torch`).

    Args:
        d_model: the width of the token vectors.
        num_heads: the number of attention heads; must divide ``d_model``.
        d_ff: the feed-forward block's hidden width (the paper uses ``4 * d_model``).
        dropout: the dropout probability on the attention weights, inside the feed-forward block
            and on each sub-layer's output before it is added; acts in training mode only.
        activation: ``"relu"``, ``"gelu"`` (exact) or ``"gelu_tanh"`` (approximate).
        norm_first: pre-norm instead of post-norm.
        layer_norm_eps: the layer norms' ``eps`` (PyTorch's name for it).
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``self_attn`` (:class:`~minitransformer.attention.MultiHeadAttention`),
    ``feed_forward`` (:class:`FeedForward`), ``norm1``, ``norm2`` (:class:`LayerNorm`),
    ``dropout1``, ``dropout2``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False,
                 layer_norm_eps: float = 1e-5, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        _check_sizes(d_model, num_heads, d_ff)
        _checks.check_probability("dropout", dropout)
        factory = _checks.factory_kwargs(device, dtype)
        self.d_model, self.num_heads, self.norm_first = d_model, num_heads, bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, **factory)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation,
                                        **factory)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, *, attn_mask: Tensor | None = None,
                kv_cache: KVCache | None = None, layer_idx: int = 0) -> Tensor:
        """Run the block on ``x`` ``(B, T, d_model)``; returns ``(B, T, d_model)``.

        Args:
            x: the token vectors.
            attn_mask: broadcastable to ``(B, num_heads, T, T)``; boolean (True = may attend)
                or additive floating, e.g. :func:`~minitransformer.masks.causal_mask` or
                :func:`~minitransformer.masks.padding_mask`. With a cache holding ``P``
                positions, ``(B, num_heads, T, P + T)``.
            kv_cache, layer_idx: a :class:`~minitransformer.cache.KVCache` for the
                self-attention and this layer's slot in it (chapter 11).

        Raises:
            TypeError: ``x``, the mask or the cache has the wrong type or dtype.
            ValueError: ``x`` is not ``(B, T, d_model)``, or the mask does not broadcast.
        """
        past = 0 if kv_cache is None else check_kv_cache(kv_cache, layer_idx)
        _check_sequence("x", x, self.d_model, self.norm1.weight)
        _check_layer_mask("attn_mask", attn_mask, x, self.num_heads, past + x.shape[1])
        return self.encode(x, attn_mask=attn_mask, kv_cache=kv_cache, layer_idx=layer_idx)

    def encode(self, x: Tensor, *, attn_mask: Tensor | None = None,
               kv_cache: KVCache | None = None, layer_idx: int = 0,
               return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` without the input checks (for callers that checked).

        ``return_weights``: also return the self-attention weights ``(B, num_heads, T, T_k)``,
        as the pair ``(output, weights)``; the heads then go through the written-out attention
        (see :meth:`~minitransformer.attention.MultiHeadAttention.attend`).
        """
        weights = [] if return_weights else None              # the self-attention's, if asked
        if self.norm_first:
            x = x + self._self_attention(self.norm1.normalize(x), attn_mask, kv_cache, layer_idx,
                                         weights)
            x = x + self._feed_forward(self.norm2.normalize(x))
        else:
            x = self.norm1.normalize(x + self._self_attention(x, attn_mask, kv_cache, layer_idx,
                                                              weights))
            x = self.norm2.normalize(x + self._feed_forward(x))
        return (x, weights[0]) if return_weights else x

    def _self_attention(self, x: Tensor, attn_mask: Tensor | None,
                        kv_cache: KVCache | None = None, layer_idx: int = 0,
                        weights: list[Tensor] | None = None) -> Tensor:
        """The self-attention sub-layer; appends its weights to ``weights`` if that is a list."""
        if weights is None:
            out = self.self_attn.attend(x, x, x, attn_mask=attn_mask, kv_cache=kv_cache,
                                        layer_idx=layer_idx)
        else:
            out, attention = self.self_attn.attend(x, x, x, attn_mask=attn_mask,
                                                   kv_cache=kv_cache, layer_idx=layer_idx,
                                                   return_weights=True)
            weights.append(attention)
        return _dropout(self.dropout1, out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return _dropout(self.dropout2, self.feed_forward.transform(x))

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoderLayer) -> "EncoderLayer":
        """A copy of a batch-first ``nn.TransformerEncoderLayer`` (weights, dropout, eps,
        training mode). Masks mean the opposite of PyTorch's: see the module docstring.

        Raises:
            TypeError: ``module`` is not an ``nn.TransformerEncoderLayer``.
            ValueError: it uses something this class does not have (naming it):
                ``batch_first=False``, an activation other than ReLU or GELU, ``bias=False``,
                different dropout probabilities.
        """
        if not isinstance(module, nn.TransformerEncoderLayer):
            raise TypeError(f"from_torch expects an nn.TransformerEncoderLayer, got "
                            f"{type(module).__name__}")
        settings = _torch_settings(module, ["linear1", "linear2", "norm1", "norm2"],
                                   ["dropout", "dropout1", "dropout2"])
        ours = cls(**settings)
        _copy_common(ours, module, ["norm1", "norm2"])
        return ours.train(module.training)


class DecoderLayer(nn.Module):
    """A decoder block: masked self-attention, cross-attention to the encoder's output
    ``memory``, then the feed-forward block; each wrapped in a residual connection with dropout
    and layer norm (chapter 8).

    Post-norm (``norm_first=False``)::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(multihead_attn(x, memory)))
        x = norm3(x + dropout3(feed_forward(x)))

    Pre-norm (``norm_first=True``) normalizes each sub-layer's input instead:
    ``x = x + dropout1(self_attn(norm1(x)))`` and so on (``memory`` is used as given).

    Equal to ``nn.TransformerDecoderLayer(..., batch_first=True)`` with the same weights (see
    :meth:`from_torch`). The arguments are those of :class:`EncoderLayer`.

    Sub-modules: ``self_attn``, ``multihead_attn``
    (:class:`~minitransformer.attention.MultiHeadAttention`), ``feed_forward``
    (:class:`FeedForward`), ``norm1``, ``norm2``, ``norm3`` (:class:`LayerNorm`), ``dropout1``,
    ``dropout2``, ``dropout3``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        _check_sizes(d_model, num_heads, d_ff)
        _checks.check_probability("dropout", dropout)
        factory = _checks.factory_kwargs(device, dtype)
        self.d_model, self.num_heads, self.norm_first = d_model, num_heads, bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, **factory)
        self.multihead_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, **factory)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation,
                                        **factory)
        self.norm1 = LayerNorm(d_model, **factory)
        self.norm2 = LayerNorm(d_model, **factory)
        self.norm3 = LayerNorm(d_model, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor, *, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, kv_cache: KVCache | None = None,
                layer_idx: int = 0) -> Tensor:
        """Run the block on ``x`` ``(B, T, d_model)`` reading ``memory`` ``(B, T_k, d_model)``;
        returns ``(B, T, d_model)``.

        Args:
            x: the target-side token vectors.
            memory: the encoder's output.
            tgt_mask: for the self-attention, broadcastable to ``(B, num_heads, T, T)``
                (usually :func:`~minitransformer.masks.causal_mask`); True = may attend.
            memory_mask: for the cross-attention, broadcastable to ``(B, num_heads, T, T_k)``
                (usually the source's :func:`~minitransformer.masks.padding_mask`); True = may
                attend.
            kv_cache, layer_idx: a :class:`~minitransformer.cache.KVCache` for the
                self-attention and this layer's slot in it (chapter 11); ``tgt_mask`` then
                covers the cached positions too, ``(B, num_heads, T, P + T)``. The
                cross-attention reads ``memory`` whole and caches nothing.

        Raises:
            TypeError: an input or mask has the wrong type or dtype.
            ValueError: ``x`` or ``memory`` is not ``(B, ., d_model)``, their batch sizes
                differ, or a mask does not broadcast.
        """
        past = 0 if kv_cache is None else check_kv_cache(kv_cache, layer_idx)
        _check_sequence("x", x, self.d_model, self.norm1.weight)
        _check_sequence("memory", memory, self.d_model, self.norm1.weight)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"x and memory must have the same batch size, got x "
                             f"{_checks.shape(x)} and memory {_checks.shape(memory)}")
        _check_layer_mask("tgt_mask", tgt_mask, x, self.num_heads, past + x.shape[1])
        _check_layer_mask("memory_mask", memory_mask, x, self.num_heads, memory.shape[1])
        return self.decode(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           kv_cache=kv_cache, layer_idx=layer_idx)

    def decode(self, x: Tensor, memory: Tensor | None, *, tgt_mask: Tensor | None = None,
               memory_mask: Tensor | None = None, kv_cache: KVCache | None = None,
               layer_idx: int = 0, memory_kv: tuple[Tensor, Tensor] | None = None,
               return_cross_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """:meth:`forward` without the input checks, for callers that checked already.

        Two more keywords, for generating (chapter 10):

        * ``memory_kv``: the cross-attention's keys and values of ``memory``, already projected
          and split into heads, ``multihead_attn.project_kv(memory, memory)``, each
          ``(B, num_heads, T_k, d_k)``. They are read instead of ``memory`` (which may then be
          ``None``), so a translation projects its source once, not at every step.
        * ``return_cross_weights``: also return the cross-attention weights
          ``(B, num_heads, T, T_k)``, as the pair ``(output, weights)``; the heads then go
          through the written-out attention (see
          :meth:`~minitransformer.attention.MultiHeadAttention.attend`).
        """
        if memory_kv is None:
            memory_kv = self.multihead_attn.project_kv(memory, memory)  # 2 x (B, h, T_k, d_k)
        weights = [] if return_cross_weights else None        # the cross-attention's, if asked
        if self.norm_first:
            x = x + self._self_attention(self.norm1.normalize(x), tgt_mask, kv_cache, layer_idx)
            x = x + self._cross_attention(self.norm2.normalize(x), memory_kv, memory_mask, weights)
            x = x + self._feed_forward(self.norm3.normalize(x))
        else:
            x = self.norm1.normalize(x + self._self_attention(x, tgt_mask, kv_cache, layer_idx))
            x = self.norm2.normalize(x + self._cross_attention(x, memory_kv, memory_mask, weights))
            x = self.norm3.normalize(x + self._feed_forward(x))
        return (x, weights[0]) if return_cross_weights else x

    def _self_attention(self, x: Tensor, mask: Tensor | None, kv_cache: KVCache | None = None,
                        layer_idx: int = 0) -> Tensor:
        return _dropout(self.dropout1, self.self_attn.attend(x, x, x, attn_mask=mask,
                                                             kv_cache=kv_cache,
                                                             layer_idx=layer_idx))

    def _cross_attention(self, x: Tensor, memory_kv: tuple[Tensor, Tensor],
                         mask: Tensor | None, weights: list[Tensor] | None) -> Tensor:
        """The cross-attention sub-layer; appends its weights to ``weights`` if that is a list."""
        if weights is None:
            out = self.multihead_attn.attend(x, None, None, attn_mask=mask, projected_kv=memory_kv)
        else:
            out, w = self.multihead_attn.attend(x, None, None, attn_mask=mask,
                                                projected_kv=memory_kv, return_weights=True)
            weights.append(w)
        return _dropout(self.dropout2, out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return _dropout(self.dropout3, self.feed_forward.transform(x))

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    @classmethod
    def from_torch(cls, module: nn.TransformerDecoderLayer) -> "DecoderLayer":
        """A copy of a batch-first ``nn.TransformerDecoderLayer`` (weights, dropout, eps,
        training mode). Masks mean the opposite of PyTorch's: where PyTorch takes
        ``tgt_mask=m`` or ``memory_key_padding_mask=p`` (True = masked), give ``tgt_mask=~m``
        or ``memory_mask=~p[:, None, None, :]``.

        Raises:
            TypeError: ``module`` is not an ``nn.TransformerDecoderLayer``.
            ValueError: it uses something this class does not have (naming it), as in
                :meth:`EncoderLayer.from_torch`.
        """
        if not isinstance(module, nn.TransformerDecoderLayer):
            raise TypeError(f"from_torch expects an nn.TransformerDecoderLayer, got "
                            f"{type(module).__name__}")
        settings = _torch_settings(module, ["linear1", "linear2", "norm1", "norm2", "norm3"],
                                   ["dropout", "dropout1", "dropout2", "dropout3"])
        ours = cls(**settings)
        _copy_common(ours, module, ["norm1", "norm2", "norm3"])
        ours.multihead_attn = MultiHeadAttention.from_torch(module.multihead_attn)
        return ours.train(module.training)


def _activation_name(activation: object) -> str | None:
    """``"relu"`` or ``"gelu"`` for the activations PyTorch's layers accept, else ``None``."""
    if activation in ("relu", F.relu, torch.relu) or type(activation) is nn.ReLU:
        return "relu"
    if activation in ("gelu", F.gelu) or (type(activation) is nn.GELU
                                          and activation.approximate == "none"):
        return "gelu"
    return None


def _torch_settings(module: nn.Module, with_bias: list[str],
                    dropouts: list[str]) -> dict[str, object]:
    """The constructor arguments of our copy of PyTorch's layer ``module``, or a ValueError
    naming what we cannot copy."""
    if not module.self_attn.batch_first:
        raise ValueError("from_torch needs a batch-first layer (batch_first=True), got "
                         "batch_first=False; our layers take (B, T, d_model)")
    activation = _activation_name(module.activation)
    if activation is None:
        raise ValueError(f"from_torch supports the activations ReLU and GELU, got "
                         f"{module.activation!r}")
    norms_without_weight = [name for name in with_bias
                            if name.startswith("norm") and getattr(module, name).weight is None]
    if norms_without_weight:
        raise ValueError(f"from_torch needs layer norms with a weight and a bias "
                         f"(elementwise_affine=True); without them: "
                         f"{', '.join(norms_without_weight)}")
    if any(getattr(module, name).bias is None for name in with_bias):
        missing = [name for name in with_bias if getattr(module, name).bias is None]
        raise ValueError(f"from_torch needs a layer with biases (bias=True); without a bias: "
                         f"{', '.join(missing)}")
    probabilities = {name: getattr(module, name).p for name in dropouts}
    probabilities["self_attn.dropout"] = module.self_attn.dropout
    if len(set(probabilities.values())) > 1:
        raise ValueError(f"from_torch needs one dropout probability for the whole layer, got "
                         f"{probabilities}")
    weight = module.linear1.weight
    return dict(d_model=module.linear1.in_features, num_heads=module.self_attn.num_heads,
                d_ff=module.linear1.out_features, dropout=probabilities["dropout"],
                activation=activation, norm_first=module.norm_first, device=weight.device,
                dtype=weight.dtype)


def _copy_common(ours: nn.Module, module: nn.Module, norms: list[str]) -> None:
    """Copy the self-attention, the feed-forward weights and the norms (with their eps)."""
    ours.self_attn = MultiHeadAttention.from_torch(module.self_attn)
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(ours.feed_forward, name).load_state_dict(getattr(module, name).state_dict())
        for name in norms:
            ours_norm, theirs = getattr(ours, name), getattr(module, name)
            ours_norm.load_state_dict(theirs.state_dict())
            ours_norm.eps = float(theirs.eps)
