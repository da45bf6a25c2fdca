"""A sentence classifier: an encoder read through a [CLS] token or a mean (chapter 10).

An encoder-only transformer (chapter 10's family table) turns a sentence into one vector per
token. To classify the sentence, one vector must stand for all of it. Two ways:

* ``pooling="cls"``: a learned vector, the [CLS] token, is put in front of the sentence and goes
  through every block like a word; the head reads its final vector (BERT, Devlin et al., 2019);
* ``pooling="mean"``: the head reads the average of the sentence's final vectors, padding left
  out.

* :class:`EncoderConfig` -- the sizes of the encoder and its padding id;
* :class:`EncoderClassifier` -- token and position embeddings, chapter 8's pre-norm
  :class:`~minitransformer.layers.EncoderLayer` blocks without a causal mask, a final layer
  norm, the pooling, and a linear head with one score per class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.layers import EncoderLayer, LayerNorm
from minitransformer.lm import INIT_STD, init_weights
from minitransformer.masks import padding_mask

POOLINGS = ("cls", "mean")


@dataclass(frozen=True)
class EncoderConfig:
    """The sizes of an encoder that reads padded sentences. Frozen, like
    :class:`~minitransformer.gpt.GPTConfig`: ``dataclasses.replace`` makes a new, checked one.

    Args:
        vocab_size: the number of tokens N.
        context_length: the most tokens of a sentence (a [CLS] token comes on top).
        num_layers: how many blocks are stacked.
        num_heads: attention heads per block; must divide ``d_model``.
        d_model: the width of every token vector.
        d_ff: the feed-forward hidden width; ``None`` means ``4 * d_model``.
        dropout: dropout probability in training (embeddings, attention, residual branches).
        pad_id: the id that fills up short sentences; no token reads it.

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``d_model`` not divisible by
            ``num_heads``, a bad ``dropout``, a ``pad_id`` outside the vocabulary.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    pad_id: int = 0

    def __post_init__(self) -> None:
        _checks.check_model_sizes(self, ("vocab_size", "context_length", "num_layers",
                                         "num_heads", "d_model"), lambda d: 4 * d)
        _checks.check_probability("dropout", self.dropout)
        _checks.check_int("pad_id", self.pad_id, low=0)
        if self.pad_id >= self.vocab_size:
            raise ValueError(f"pad_id={self.pad_id} must be a token of the vocabulary, which "
                             f"has {self.vocab_size} tokens")


class EncoderClassifier(nn.Module):
    """An encoder-only transformer with a classification head.

    ``logits = head(pool(norm(blocks(embed(idx)))))``: every token reads every real token of
    its sentence (padding is masked), and ``pool`` takes the final vector of the [CLS] token
    (``"cls"``) or the mean of the sentence's real tokens (``"mean"``).

    With ``"cls"``, the [CLS] token is the parameter ``cls_token`` ``(d_model,)``, put in front
    of the token-plus-position vectors at position 0: the sentence's tokens keep positions
    ``0 .. T - 1`` of ``position_embedding`` and the [CLS] vector, always in the same place,
    needs no position vector of its own. The vocabulary needs no [CLS] entry.

    Args:
        config: the sizes (:class:`EncoderConfig`).
        num_classes: how many classes; the head gives one score each.
        pooling: ``"cls"`` or ``"mean"``.
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``token_embedding``, ``position_embedding``, ``cls_token`` (``None`` with
    ``"mean"``), ``dropout``, ``layers`` (:class:`~minitransformer.layers.EncoderLayer`,
    pre-norm, GELU), ``norm``, ``head``. Weights start as GPT-2's (normal, std 0.02; biases
    0); the [CLS] vector is drawn last, so that under one seed both poolings start from the
    same weights.

    Raises:
        TypeError, ValueError: ``config`` is not an :class:`EncoderConfig`, ``num_classes`` is
            not an int of at least 2, ``pooling`` is not ``"cls"`` or ``"mean"``, a bad
            ``dtype``.
    """

    def __init__(self, config: EncoderConfig, num_classes: int, *, pooling: str = "cls",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        _checks.check_type("config", config, EncoderConfig, "an EncoderConfig")
        self.num_classes = _checks.check_int("num_classes", num_classes, low=2)
        self.pooling = _checks.check_choice("pooling", pooling, POOLINGS)
        factory = _checks.factory_kwargs(device, dtype)
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model, **factory)
        self.position_embedding = nn.Embedding(c.context_length, c.d_model, **factory)
        self.cls_token = (nn.Parameter(torch.zeros(c.d_model, **factory))
                          if pooling == "cls" else None)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                         norm_first=True, **factory)
            for _ in range(c.num_layers))
        self.norm = LayerNorm(c.d_model, **factory)
        self.head = nn.Linear(c.d_model, num_classes, **factory)
        self.apply(init_weights)
        if self.cls_token is not None:  # drawn last: the other weights are the same either way
            nn.init.normal_(self.cls_token, mean=0.0, std=INIT_STD)

    def forward(self, idx: Tensor, labels: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Class scores for each sentence, and the loss when ``labels`` are given.

        Args:
            idx: ``(B, T)`` token ids, short sentences filled up with ``pad_id`` (anywhere:
                padded positions are masked, not cut off).
            labels: ``(B,)`` the class of each sentence, in ``[0, num_classes)``.

        Returns:
            ``(logits, loss)``: logits ``(B, num_classes)``; ``loss`` the mean cross-entropy,
            or ``None`` without labels.

        Raises:
            TypeError: ``idx`` or ``labels`` is not an integer tensor.
            ValueError: ``idx`` not ``(B, T)``, ``T > context_length``, a token id outside the
                vocabulary, a row that is all padding; ``labels`` not ``(B,)`` or a class
                outside ``[0, num_classes)``.
        """
        self._check_idx(idx)
        if labels is not None:
            _checks.check_int_tensor("labels", labels, ndim=1)
            if labels.shape[0] != idx.shape[0]:
                raise ValueError(f"labels must have shape (B,) = ({idx.shape[0]},) for idx "
                                 f"{_checks.shape(idx)}, got {_checks.shape(labels)}")
            if labels.numel() and labels.device.type != "meta":
                low, high = int(labels.min()), int(labels.max())
                if low < 0 or high >= self.num_classes:
                    raise ValueError(f"labels holds class {low if low < 0 else high}, outside "
                                     f"[0, {self.num_classes})")
        x, real = self._encode(idx)
        logits = self.head(self._pool(x, real))                       # (B, num_classes)
        if labels is None:
            return logits, None
        return logits, F.cross_entropy(logits, labels)

    def encode(self, idx: Tensor) -> Tensor:
        """The final token vectors ``(B, T', d_model)``, after the last layer norm: with
        ``"cls"``, ``T' = T + 1`` and position 0 is the [CLS] token; with ``"mean"``,
        ``T' = T``. Raises as :meth:`forward` for ``idx``."""
        self._check_idx(idx)
        return self._encode(idx)[0]

    def _encode(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The final vectors ``(B, T', d_model)`` and ``(B, T')``, True at real tokens."""
        length = idx.shape[1]
        x = self.token_embedding(idx) + self.position_embedding.weight[:length]  # (B, T, d)
        real = idx != self.config.pad_id                                         # (B, T)
        if self.cls_token is not None:
            cls = self.cls_token.expand(idx.shape[0], 1, -1)                     # (B, 1, d)
            x = torch.cat([cls, x], dim=1)                                       # (B, T+1, d)
            real = torch.cat([torch.ones_like(real[:, :1]), real], dim=1)
        x = self.dropout(x)
        mask = real[:, None, None, :]                                  # (B, 1, 1, T')
        for layer in self.layers:
            x = layer.encode(x, attn_mask=mask)
        return self.norm.normalize(x), real

    def _pool(self, x: Tensor, real: Tensor) -> Tensor:
        """One vector per sentence ``(B, d_model)`` from the final vectors ``x``."""
        if self.pooling == "cls":
            return x[:, 0]                                             # the [CLS] position
        weights = real.to(x.dtype).unsqueeze(-1)                       # (B, T, 1)
        return (x * weights).sum(1) / weights.sum(1)                   # mean of real tokens

    def _check_idx(self, idx: Tensor) -> None:
        c = self.config
        _checks.check_token_ids("idx", idx, c.vocab_size, max_len=c.context_length)
        if idx.device.type != "meta" and idx.numel():
            empty = padding_mask(idx, c.pad_id)[:, 0, 0].sum(1) == 0
            if empty.any():
                raise ValueError(f"idx row {int(torch.nonzero(empty)[0])} is all padding "
                                 f"(pad_id={c.pad_id}): a sentence needs at least one token")

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, pooling={self.pooling!r}"
