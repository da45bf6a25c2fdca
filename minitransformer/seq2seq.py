"""The encoder-decoder transformer, trained to translate (chapter 10).

The encoder reads the whole source sentence with unmasked self-attention; the decoder writes the
target one token at a time with causal self-attention, and reads the encoder's output, the
*memory*, through cross-attention: queries from the target, keys and values from the source.
Both stacks are chapter 8's pre-norm blocks; weights start as in chapter 9 (GPT-2's).

* :class:`Seq2SeqConfig`, :class:`Seq2Seq` -- the model: ``encode``, ``decode``, ``forward``
  (teacher forcing), ``translate`` (greedy);
* :class:`SourceMemory` -- an encoded source batch as the decoder reads it while generating, with
  the cross-attention keys and values projected once;
* :func:`exact_match` -- the share of translations that are exactly right.

Beam search, the alternative to greedy decoding, is
:func:`minitransformer.generation.beam_search`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks, pretrained
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache
from minitransformer.layers import DecoderLayer, EncoderLayer, LayerNorm
from minitransformer.lm import init_weights
from minitransformer.masks import causal_mask, padding_mask


@dataclass(frozen=True)
class Seq2SeqConfig:
    """The sizes of a :class:`Seq2Seq`. Frozen, as :class:`~minitransformer.gpt.GPTConfig`: a
    model is built from its config, so ``dataclasses.replace`` makes a new, checked one.

    Args:
        src_vocab_size, tgt_vocab_size: the number of source and target tokens.
        context_length: the most positions of a source sentence, and of a decoder input.
        num_layers: blocks in the encoder, and again in the decoder.
        num_heads: attention heads per attention layer; must divide ``d_model``.
        d_model: the width of every token vector.
        d_ff: the feed-forward hidden width; ``None`` means ``4 * d_model``.
        dropout: dropout probability in training.
        label_smoothing: the share ``alpha`` of the target probability spread evenly over the
            whole target vocabulary (0 = plain cross-entropy; chapter 10 writes it alpha).
        pad_id, bos_id, eos_id: the special tokens, the same ids in both vocabularies.

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``d_model`` not divisible by
            ``num_heads``, a probability outside ``[0, 1)``, special ids that are not distinct
            or do not fit in both vocabularies.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    context_length: int
    num_layers: int
    num_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    label_smoothing: float = 0.0
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        _checks.check_model_sizes(self, ("src_vocab_size", "tgt_vocab_size", "context_length",
                                         "num_layers", "num_heads", "d_model"), lambda d: 4 * d)
        _checks.check_probability("dropout", self.dropout)
        _checks.check_probability("label_smoothing", self.label_smoothing)
        smallest = min(self.src_vocab_size, self.tgt_vocab_size)
        for name in ("pad_id", "bos_id", "eos_id"):
            _checks.check_int(name, getattr(self, name), low=0)
            if getattr(self, name) >= smallest:
                raise ValueError(f"{name}={getattr(self, name)} must be a token of both "
                                 f"vocabularies, which have {self.src_vocab_size} and "
                                 f"{self.tgt_vocab_size} tokens")
        if len({self.pad_id, self.bos_id, self.eos_id}) < 3:
            raise ValueError(f"pad_id, bos_id and eos_id must differ, got {self.pad_id}, "
                             f"{self.bos_id} and {self.eos_id}")


@dataclass
class SourceMemory:
    """A batch of encoded source sentences, as the decoder reads them while generating.

    Attributes:
        memory: the encoder's output ``(B, T_src, d_model)``.
        mask: ``(B, 1, 1, T_src)``, True at real source tokens (cross-attention never reads
            padding).
        keys_values: per decoder layer, the cross-attention keys and values
            ``(B, num_heads, T_src, d_k)``, projected once per sentence; ``None`` to project the
            memory again at every step.
    """

    memory: Tensor
    mask: Tensor
    keys_values: list[tuple[Tensor, Tensor]] | None = None

    def repeat_interleave(self, repeats: int) -> SourceMemory:
        """Each sentence ``repeats`` times in a row (one copy per beam of
        :func:`~minitransformer.generation.beam_search`)."""
        kv = None if self.keys_values is None else [
            (k.repeat_interleave(repeats, 0), v.repeat_interleave(repeats, 0))
            for k, v in self.keys_values]
        return SourceMemory(self.memory.repeat_interleave(repeats, 0),
                            self.mask.repeat_interleave(repeats, 0), kv)


class Seq2Seq(nn.Module):
    """An encoder-decoder transformer (Vaswani et al., 2017), pre-norm.

    ``memory = encoder(src)``; ``logits = decoder(tgt_in, memory)``. Token and learned position
    embeddings on each side; ``num_layers`` :class:`~minitransformer.layers.EncoderLayer` and
    ``num_layers`` :class:`~minitransformer.layers.DecoderLayer` blocks, each stack followed by a
    layer norm; an output head that shares its weights with the target token embedding.

    Args:
        config: the sizes and special ids (:class:`Seq2SeqConfig`).
        device, dtype: where and in what precision to create the parameters.

    Sub-modules: ``src_token_embedding``, ``src_position_embedding``, ``tgt_token_embedding``,
    ``tgt_position_embedding``, ``dropout``, ``encoder_layers``, ``encoder_norm``,
    ``decoder_layers``, ``decoder_norm``, ``head``. Weights start as GPT-2's: linear and
    embedding weights normal with std 0.02, biases zero.
    """

    def __init__(self, config: Seq2SeqConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"config must be a Seq2SeqConfig, got {type(config).__name__}")
        factory = _checks.factory_kwargs(device, dtype)
        self.config = c = config
        self.src_token_embedding = nn.Embedding(c.src_vocab_size, c.d_model, **factory)
        self.src_position_embedding = nn.Embedding(c.context_length, c.d_model, **factory)
        self.tgt_token_embedding = nn.Embedding(c.tgt_vocab_size, c.d_model, **factory)
        self.tgt_position_embedding = nn.Embedding(c.context_length, c.d_model, **factory)
        self.dropout = nn.Dropout(c.dropout)
        block = {"dropout": c.dropout, "activation": "gelu", "norm_first": True, **factory}
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, **block) for _ in range(c.num_layers))
        self.encoder_norm = LayerNorm(c.d_model, **factory)
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(c.d_model, c.num_heads, c.d_ff, **block) for _ in range(c.num_layers))
        self.decoder_norm = LayerNorm(c.d_model, **factory)
        self.head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False, **factory)
        self.head.weight = self.tgt_token_embedding.weight  # weight tying
        self.apply(init_weights)

    # --- the public, checked entry points ------------------------------------------------------

    def encode(self, src: Tensor) -> Tensor:
        """The memory: source ids ``(B, T_src)`` -> ``(B, T_src, d_model)``.

        Self-attention without a causal mask: every source token reads the whole sentence, except
        padding (``pad_id``), which no token reads.

        Raises:
            TypeError: ``src`` is not an integer tensor.
            ValueError: not ``(B, T_src)``, longer than ``context_length``, a token id out of
                range, or a sentence that is all padding.
        """
        self._check_src(src)
        return self._encode(src, padding_mask(src, self.config.pad_id))

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor) -> Tensor:
        """Next-token logits ``(B, T_tgt, tgt_vocab_size)`` for the decoder input ``tgt_in``.

        Causal self-attention over ``tgt_in`` ``(B, T_tgt)``, then cross-attention to
        ``memory`` ``(B, T_src, d_model)`` in every layer, never to the padding of ``src``.

        Raises:
            TypeError, ValueError: as :meth:`encode` for ``src`` and ``tgt_in``; a ``memory`` that
                is not ``(B, T_src, d_model)`` of ``src``'s batch and length.
        """
        self._check_src(src)
        self._check_tgt("tgt_in", tgt_in, src)
        expected = (src.shape[0], src.shape[1], self.config.d_model)
        _checks.check_float_tensor("memory", memory, ndim=3)
        if tuple(memory.shape) != expected:
            raise ValueError(f"memory must have shape (B, T_src, d_model) = {expected} for src "
                             f"{_checks.shape(src)}, got {_checks.shape(memory)}")
        _checks.check_same_dtype(memory=memory, **{"the model's weights": self.head.weight})
        return self._decode(tgt_in, memory, padding_mask(src, self.config.pad_id))

    def forward(self, src: Tensor, tgt_in: Tensor,
                targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: logits for every target position at once, and the loss.

        Args:
            src: ``(B, T_src)`` source ids, padded with ``pad_id``.
            tgt_in: ``(B, T_tgt)`` the decoder input: ``bos_id``, then the target sentence.
            targets: ``(B, T_tgt)`` the target sentence, then ``eos_id`` (``tgt_in`` shifted
                one to the left); positions holding ``pad_id`` are left out of the loss.

        Returns:
            ``(logits, loss)``: logits ``(B, T_tgt, tgt_vocab_size)``; the loss is the mean
            cross-entropy over the non-padding targets, with ``config.label_smoothing``, or
            ``None`` without ``targets``.

        Raises:
            TypeError, ValueError: as :meth:`encode`; also a ``tgt_in`` that does not start with
                ``bos_id``, a batch size that differs from ``src``'s, ``targets`` shaped unlike
                ``tgt_in``.
        """
        c = self.config
        self._check_src(src)
        self._check_tgt("tgt_in", tgt_in, src)
        if tgt_in.device.type != "meta" and (tgt_in[:, 0] != c.bos_id).any():
            rows = torch.nonzero(tgt_in[:, 0] != c.bos_id).flatten().tolist()
            raise ValueError(f"tgt_in must start with bos_id={c.bos_id} (the decoder input is "
                             f"<bos> + the target), but row {rows[0]} starts with "
                             f"{int(tgt_in[rows[0], 0])}")
        if targets is not None:
            self._check_tgt("targets", targets, src)
            if targets.shape != tgt_in.shape:
                raise ValueError(f"targets must have the shape of tgt_in "
                                 f"{_checks.shape(tgt_in)}, got {_checks.shape(targets)}")
        mask = padding_mask(src, c.pad_id)
        logits = self._decode(tgt_in, self._encode(src, mask), mask)   # (B, T_tgt, N)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten().long(),
                               ignore_index=c.pad_id,
                               label_smoothing=c.label_smoothing)
        return logits, loss

    @torch.no_grad()
    def translate(self, src: Tensor, max_new_tokens: int, *, use_cache: bool = True) -> Tensor:
        """Greedy decoding: start from ``bos_id``, append the most likely next token, repeat.

        Args:
            src: ``(B, T_src)`` source ids.
            max_new_tokens: the most tokens to write after ``bos_id`` (``eos_id`` included).
            use_cache: project the memory to cross-attention keys and values once per sentence
                instead of at every step, and keep the decoder's self-attention keys and values
                in a :class:`~minitransformer.cache.KVCache` (chapter 11), so that each step
                feeds the decoder only the newest token. The output is the same either way.

        Returns:
            ``(B, <= max_new_tokens + 1)`` ids: each row ``bos_id``, the translation, ``eos_id``,
            then ``pad_id`` to the common length; a row that reaches ``max_new_tokens`` without
            ``eos_id`` stops there. Computed in eval mode (the mode is restored).

        Raises:
            TypeError, ValueError: as :meth:`encode`; ``max_new_tokens`` not a positive int or
                ``max_new_tokens + 1 > context_length``; ``use_cache`` not a bool.
        """
        self._check_max_new_tokens(max_new_tokens)
        _checks.check_type("use_cache", use_cache, bool, "True or False")
        self._check_src(src)                       # before eval(): a bad source changes no mode
        with eval_mode(self):
            return self._greedy(src, max_new_tokens, use_cache)

    def _greedy(self, src: Tensor, max_new_tokens: int, use_cache: bool) -> Tensor:
        """:meth:`translate`'s loop, on checked arguments."""
        c = self.config
        source = self._read_source(src, use_cache)
        cache = KVCache(c.num_layers, max_len=max_new_tokens + 1) if use_cache else None
        out = torch.full((src.shape[0], 1), c.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_new_tokens):
            new = out if cache is None else out[:, -1:]      # what the decoder has not seen
            next_id = self.next_token_logits(new, source, kv_cache=cache).argmax(dim=-1)  # (B,)
            next_id = next_id.masked_fill(done, c.pad_id)
            out = torch.cat([out, next_id[:, None]], dim=1)                      # (B, t + 1)
            done |= next_id == c.eos_id
            if done.all():
                break
        return out

    @torch.no_grad()
    def cross_attention_weights(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """Every decoder layer's cross-attention weights when the decoder reads ``tgt_in``:
        a list of ``num_layers`` tensors ``(B, num_heads, T_tgt, T_src)``; row = target
        position (query), column = source position (key). Padding columns are exactly 0.
        Computed in eval mode (the mode is restored), as in :meth:`translate`."""
        self._check_src(src)
        self._check_tgt("tgt_in", tgt_in, src)
        with eval_mode(self):
            mask = padding_mask(src, self.config.pad_id)
            weights: list[Tensor] = []
            self._decode(tgt_in, self._encode(src, mask), mask, weights=weights)
        return weights

    # --- generation: encode once, then one step at a time -------------------------------------

    def read_source(self, src: Tensor, *, use_cache: bool = True) -> SourceMemory:
        """Encode ``src`` (checked as in :meth:`encode`) for generation; with ``use_cache`` also
        project the memory to every decoder layer's cross-attention keys and values, once."""
        _checks.check_type("use_cache", use_cache, bool, "True or False")
        self._check_src(src)
        return self._read_source(src, use_cache)

    def _read_source(self, src: Tensor, use_cache: bool) -> SourceMemory:
        mask = padding_mask(src, self.config.pad_id)
        memory = self._encode(src, mask)
        keys_values = self.memory_keys_values(memory) if use_cache else None
        return SourceMemory(memory, mask, keys_values)

    def memory_keys_values(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of ``memory``, split into heads:
        ``num_layers`` pairs of ``(B, num_heads, T_src, d_k)``. They depend on the source only,
        so a translation needs them once, however many tokens it writes. Unchecked."""
        return [layer.multihead_attn.project_kv(memory, memory) for layer in self.decoder_layers]

    def next_token_logits(self, tgt_in: Tensor, source: SourceMemory, *,
                          kv_cache: KVCache | None = None) -> Tensor:
        """The logits ``(B, tgt_vocab_size)`` of the token that follows ``tgt_in`` ``(B, t)``.
        With a ``kv_cache`` for the decoder's self-attention (chapter 11), ``tgt_in`` holds only
        the tokens after the cached ones. Unchecked: for generation loops that checked their
        input once."""
        logits = self._decode(tgt_in, source.memory, source.mask, keys_values=source.keys_values,
                              kv_cache=kv_cache)
        return logits[:, -1]

    # --- checkpoints ----------------------------------------------------------------------------

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write ``path/config.json`` (the config's fields and ``model_type``
        ``"minitransformer-seq2seq"``) and ``path/model.safetensors`` (the weights by their
        names here, the tied head stored once). :meth:`from_pretrained` reads it back."""
        config = {"model_type": MODEL_TYPE, **dataclasses.asdict(self.config)}
        pretrained.write_checkpoint(path, config, pretrained.unique_state(self))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> Seq2Seq:
        """The model :meth:`save_pretrained` wrote into the directory ``path``, in eval mode;
        ``dtype=None`` keeps the stored dtype. Only safetensors are read, never a pickle.

        Raises:
            FileNotFoundError: no such directory or file.
            ValueError: another ``model_type``, a config field that is unknown or wrong, a file
                that is not JSON or safetensors, a tensor missing, unknown (a layer more than
                ``num_layers``) or shaped unlike the config says (naming it and both shapes;
                checked before the model is allocated), a stored ``head.weight`` that differs
                from the tied target embedding, float8 weights, a device that is not here.
        """
        folder = pretrained.resolve(path)
        raw, tensors = pretrained.read_checkpoint(folder)
        source = folder / pretrained.CONFIG_FILE
        model_type = raw.pop("model_type", None)
        if model_type != MODEL_TYPE:
            raise ValueError(f"{source}: model_type must be {MODEL_TYPE!r}, got {model_type!r}")
        try:
            config = Seq2SeqConfig(**raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from None
        weights = str(folder / pretrained.WEIGHTS_FILE)
        pretrained.check_names(tensors, pretrained.meta_model(cls, config).state_dict(),
                               source=weights,
                               model=f"a Seq2Seq with num_layers={config.num_layers}")
        pretrained.check_tied(tensors, "head.weight", "tgt_token_embedding.weight",
                              source=weights, config=str(source))
        return pretrained.build(cls, config, tensors, source=weights, device=device,
                                dtype=dtype)

    # --- the computation, unchecked ------------------------------------------------------------

    def _encode(self, src: Tensor, mask: Tensor) -> Tensor:
        x = self._embed(src, self.src_token_embedding, self.src_position_embedding)
        for layer in self.encoder_layers:
            x = layer.encode(x, attn_mask=mask)                      # mask (B, 1, 1, T_src)
        return self.encoder_norm.normalize(x)                        # (B, T_src, d_model)

    def _decode(self, tgt_in: Tensor, memory: Tensor, mask: Tensor, *,
                keys_values: list[tuple[Tensor, Tensor]] | None = None,
                weights: list[Tensor] | None = None,
                kv_cache: KVCache | None = None) -> Tensor:
        past, length = (0 if kv_cache is None else kv_cache.seq_len), tgt_in.shape[1]
        y = self._embed(tgt_in, self.tgt_token_embedding, self.tgt_position_embedding,
                        offset=past)
        # lower right: the new positions are the last of past + length; one sees them all
        causal = causal_mask(length, past + length, device=tgt_in.device) if length > 1 else None
        for i, layer in enumerate(self.decoder_layers):
            memory_kv = None if keys_values is None else keys_values[i]
            y = layer.decode(y, memory, tgt_mask=causal, memory_mask=mask, kv_cache=kv_cache,
                             layer_idx=i, memory_kv=memory_kv,
                             return_cross_weights=weights is not None)
            if weights is not None:
                y, layer_weights = y
                weights.append(layer_weights)                        # (B, h, T_tgt, T_src)
        return self.head(self.decoder_norm.normalize(y))             # (B, T_tgt, N)

    def _embed(self, ids: Tensor, tokens: nn.Embedding, positions: nn.Embedding, *,
               offset: int = 0) -> Tensor:
        where = torch.arange(offset, offset + ids.shape[1], device=ids.device)
        return self.dropout(tokens(ids) + positions(where))          # (B, T, d_model)

    # --- checks ----------------------------------------------------------------------------------

    def _check_src(self, src: Tensor) -> None:
        c = self.config
        _checks.check_token_ids("src", src, c.src_vocab_size, max_len=c.context_length,
                                device=self.head.weight.device)
        if src.device.type != "meta" and src.numel() and (src == c.pad_id).all(dim=1).any():
            row = int(torch.nonzero((src == c.pad_id).all(dim=1))[0])
            raise ValueError(f"src row {row} is all padding (pad_id={c.pad_id}): a sentence "
                             f"needs at least one token for the decoder to read")

    def _check_tgt(self, name: str, ids: Tensor, src: Tensor) -> None:
        c = self.config
        _checks.check_token_ids(name, ids, c.tgt_vocab_size, max_len=c.context_length,
                                device=self.head.weight.device)
        if ids.shape[0] != src.shape[0]:
            raise ValueError(f"{name} and src must have the same batch size, got {name} "
                             f"{_checks.shape(ids)} and src {_checks.shape(src)}")

    def _check_max_new_tokens(self, max_new_tokens: int) -> None:
        _checks.check_int("max_new_tokens", max_new_tokens)
        if max_new_tokens + 1 > self.config.context_length:
            raise ValueError(f"max_new_tokens={max_new_tokens} plus <bos> needs "
                             f"{max_new_tokens + 1} positions, more than context_length="
                             f"{self.config.context_length}")


MODEL_TYPE = "minitransformer-seq2seq"  # config.json's model_type for a Seq2Seq


def strip_special(ids: Tensor | list[int], *, bos_id: int = 1, eos_id: int = 2) -> list[int]:
    """The sentence inside one row of ids: without a leading ``bos_id``, cut before the first
    ``eos_id`` (padding follows it). ``[1, 7, 4, 2, 0]`` -> ``[7, 4]``."""
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    if ids[:1] == [bos_id]:
        ids = ids[1:]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def exact_match(translations: Tensor, targets: Tensor, *, bos_id: int = 1,
                eos_id: int = 2) -> float:
    """The share of rows whose translation is exactly the target: the tokens between ``bos_id``
    and ``eos_id`` in a row of ``translations`` (from :meth:`Seq2Seq.translate`) equal the
    tokens before ``eos_id`` in the same row of ``targets``. A translation that never wrote
    ``eos_id`` does not match.

    Raises:
        TypeError: either is not an integer tensor.
        ValueError: either is not 2-D, their numbers of rows differ, or they have no rows.
    """
    _checks.check_int_tensor("translations", translations, ndim=2)
    _checks.check_int_tensor("targets", targets, ndim=2)
    if translations.shape[0] != targets.shape[0]:
        raise ValueError(f"translations and targets must have the same number of rows, got "
                         f"{_checks.shape(translations)} and {_checks.shape(targets)}")
    if translations.shape[0] == 0:
        raise ValueError("exact_match needs at least one row, got none: a share of zero "
                         "translations has no value")
    hits = 0
    for out, ref in zip(translations.tolist(), targets.tolist()):
        hits += eos_id in out and (strip_special(out, bos_id=bos_id, eos_id=eos_id)
                                   == strip_special(ref, bos_id=bos_id, eos_id=eos_id))
    return hits / translations.shape[0]
