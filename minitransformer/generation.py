"""Choosing the next word from the model's scores: greedy, temperature, top-k and top-p
(chapter 5), and generating text with a language model (chapter 9).

Chapter 5 introduces :func:`sample_next`; :func:`generate` (chapter 9) calls it once per new
token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache
from minitransformer.functional import softmax


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    counts: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token id from each row of scores.

    The scores are divided by ``temperature`` and turned into probabilities with softmax; one id
    is then drawn from them. A low temperature sharpens the distribution towards the best word, a
    high one flattens it; ``temperature=0`` skips the draw and takes the best word (greedy
    decoding). ``top_k`` first throws away every word but the ``k`` best; ``top_p`` (nucleus
    sampling) keeps the fewest best words whose probabilities add up to at least ``p``, as
    transformers' ``TopPLogitsWarper`` does.

    Before all that, the penalties push down words that were already written, as OpenAI's API
    defines them: ``logits - presence_penalty * (counts > 0) - frequency_penalty * counts``.

    Args:
        logits: float tensor of shape ``(..., V)``, one score per vocabulary word.
        temperature: ``0`` (greedy) or a positive number; one too small to divide the
            scores by (1e-300 in float32) is greedy as well.
        top_k: keep only the ``k`` highest-scoring words, ``1 <= k <= V``; ``None`` keeps all.
        top_p: keep the smallest set of best words with total probability ``>= top_p``,
            ``0 < top_p <= 1`` (after temperature and ``top_k``); ``None`` keeps all.
        presence_penalty, frequency_penalty: finite numbers (negative ones favour repeats).
        counts: ``(..., V)`` how often each word was written so far (numbers >= 0, no NaN),
            needed by a penalty.
        generator: a seeded ``torch.Generator`` on the logits' device, for repeatable draws.

    Returns:
        long tensor of shape ``(...)``: the chosen ids, on the logits' device.

    Raises:
        TypeError: ``logits`` is not a floating-point tensor; an option of the wrong type.
        ValueError: ``logits`` without a dimension, a negative or non-finite temperature, a
            ``top_k`` outside ``[1, V]``, a ``top_p`` outside ``(0, 1]``, a non-finite penalty,
            a penalty without ``counts``, ``counts`` shaped unlike ``logits``, negative or NaN,
            or scores holding NaN or ``+inf``, or all ``-inf`` in a row.
    """
    _checks.check_float_tensor("logits", logits, min_ndim=1)
    vocab_size = logits.shape[-1]
    sampling = SamplingParams(temperature, top_k, top_p, presence_penalty, frequency_penalty)
    sampling.check_vocab(vocab_size)
    if vocab_size == 0:
        raise ValueError(f"logits have an empty vocabulary dimension, shape {tuple(logits.shape)}")
    if presence_penalty or frequency_penalty:
        if not isinstance(counts, Tensor) or counts.shape != logits.shape:
            got = _checks.shape(counts) if isinstance(counts, Tensor) else type(counts).__name__
            raise ValueError(f"a presence or frequency penalty needs counts of the logits' shape "
                             f"{_checks.shape(logits)}, got {got}")
    if counts is not None:
        _check_counts(counts, logits)
    _checks.check_scores(logits)  # as softmax does: no NaN or +inf, no row that is all -inf
    return sampling.choose(logits, counts, generator)


def _check_counts(counts: object, logits: Tensor) -> None:
    """``counts``: how often each word was written, so numbers >= 0 (no NaN), on the logits'
    device; a negative or NaN count would turn a penalty into a reward or every score into
    NaN."""
    if not isinstance(counts, Tensor) or counts.is_complex():
        raise TypeError(f"counts must be a tensor of counts (int or float), got "
                        f"{_checks._type_name(counts)}")
    if counts.device != logits.device:
        raise ValueError(f"counts is on {counts.device} and logits on {logits.device}")
    if counts.numel() and counts.device.type != "meta" and counts.dtype != torch.bool:
        if counts.is_floating_point() and not bool(torch.isfinite(counts).all()):
            raise ValueError("counts must be finite numbers >= 0, got NaN or inf")
        if bool((counts < 0).any()):
            raise ValueError(f"counts must be >= 0 (how often each word was written), got "
                             f"{counts.min().item()}")


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each next token: the options of :func:`sample_next`, checked once, in one
    value that :func:`generate`, :func:`stream_tokens`,
    :func:`~minitransformer.batching.generate_batch` and the serving
    :class:`~minitransformer.serving.Engine` take (as vLLM's ``SamplingParams``).

    Args:
        temperature: ``0`` (greedy) or a positive number.
        top_k: keep only the ``k`` best words (``>= 1``; at most the vocabulary, checked where
            the vocabulary is known); ``None`` keeps all.
        top_p: nucleus sampling, ``0 < top_p <= 1``; ``None`` keeps all.
        presence_penalty, frequency_penalty: finite numbers, as OpenAI's API defines them.
        seed: seeds a ``torch.Generator`` for repeatable draws (``>= 0``); ``None`` draws
            from PyTorch's global generator (or from a ``generator=`` given beside it).

    The number of tokens is not an option here: it is each function's own argument
    (``max_new_tokens``, a request's ``max_tokens``).

    Raises:
        TypeError, ValueError: an option of the wrong type or out of its range, naming it.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _checks.check_number("temperature", self.temperature, low=0.0)
        if self.top_k is not None:
            _checks.check_int("top_k", self.top_k)
        if self.top_p is not None and not 0 < _checks.check_number("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        _checks.check_number("presence_penalty", self.presence_penalty)
        _checks.check_number("frequency_penalty", self.frequency_penalty)
        if self.seed is not None:
            _checks.check_int("seed", self.seed, low=0)

    @property
    def penalised(self) -> bool:
        """Whether a penalty is set (the words written so far must then be counted)."""
        return bool(self.presence_penalty or self.frequency_penalty)

    def check_vocab(self, vocab_size: int) -> SamplingParams:
        """These options for a vocabulary of ``vocab_size`` words (``top_k`` at most that);
        returns them."""
        if self.top_k is not None and self.top_k > vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size {vocab_size}, got "
                             f"{self.top_k}")
        return self

    def make_generator(self, device: torch.device | str | None = None
                       ) -> torch.Generator | None:
        """A ``torch.Generator`` on ``device`` seeded with ``seed``, or ``None`` without one."""
        return (None if self.seed is None
                else torch.Generator(device or "cpu").manual_seed(self.seed))

    def choose(self, logits: Tensor, counts: Tensor | None = None,
               generator: torch.Generator | None = None) -> Tensor:
        """:func:`sample_next` with these options, for a generation loop: ``logits``
        ``(..., V)`` (a model's scores, not checked but for NaN and ``+inf``, which are named:
        NaN weights, or penalties that overflowed the scores), ``counts`` as for
        :func:`sample_next` (needed by a penalty), ``generator`` the draws' (``None``: PyTorch's
        global one). Returns the chosen ids ``(...)``.

        Raises:
            ValueError: scores holding NaN or ``+inf``.
        """
        _check_finite(logits, "the model's scores (logits) hold {}: are its weights NaN or "
                              "inf (a training that diverged, a broken checkpoint)?")
        if self.penalised:
            counts = counts.to(logits.dtype)
            logits = (logits - self.presence_penalty * (counts > 0)
                      - self.frequency_penalty * counts)
            _check_finite(logits, f"presence_penalty={self.presence_penalty!r} and "
                                  f"frequency_penalty={self.frequency_penalty!r} overflowed the "
                                  f"scores ({logits.dtype}) to {{}}: use smaller penalties")
        temperature = self.temperature
        if temperature == 0 or _rounds_to_zero(temperature, logits.dtype):
            return logits.argmax(dim=-1)    # a temperature too small to divide by is greedy too
        # Shift each row's best score to 0 first: dividing by a tiny temperature cannot overflow.
        scores = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # (..., V)
        if self.top_k is not None:
            best = scores.topk(self.top_k, dim=-1).indices  # (..., k)
            keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, best, True)
            scores = scores.masked_fill(~keep, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            scores = scores.masked_fill(_outside_nucleus(scores, self.top_p), float("-inf"))
        probs = softmax(scores, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])  # (rows, V)
        if flat.shape[0] == 0:
            return torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
        ids = torch.multinomial(flat, num_samples=1, generator=generator)  # (rows, 1)
        return ids.reshape(logits.shape[:-1])


def _check_finite(scores: Tensor, message: str) -> None:
    """A ``ValueError`` with ``message`` (``{}``: what was found) when ``scores`` hold NaN or
    ``+inf`` (``-inf``, a word ruled out, is allowed): one reduction, as the largest score is
    NaN or ``+inf`` exactly then."""
    if not scores.numel() or scores.device.type == "meta":
        return
    top = float(scores.detach().amax())
    if not top < math.inf:
        found = "NaN" if math.isnan(top) or bool(torch.isnan(scores).any()) else "+inf"
        raise ValueError(message.format(found))


def _rounds_to_zero(temperature: float, dtype: torch.dtype) -> bool:
    """Whether dividing scores of ``dtype`` by ``temperature`` divides by zero (1e-300 is 0
    in float32): the best score would become 0/0, NaN."""
    return bool(torch.isnan(torch.zeros((), dtype=dtype, device="cpu") / temperature))


def _outside_nucleus(scores: Tensor, top_p: float) -> Tensor:
    """True for the words outside the nucleus: sorted from the least likely up, the words
    whose running total of probability stays at or below ``1 - top_p`` (the best word is always
    kept)."""
    ascending, order = scores.sort(dim=-1)                                   # (..., V)
    below = softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - top_p
    below[..., -1] = False                                                  # keep the best
    return below.scatter(-1, order, below)                                  # back in place


def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    fast: bool = True,
    sampling: SamplingParams | None = None,
) -> Tensor:
    """Continue each row of ``idx`` by up to ``max_new_tokens`` tokens, one at a time
    (chapter 9).

    Each step takes the scores of the last position and picks the next token with
    :func:`sample_next`. Without the cache, each step runs the model on everything so far
    (chapter 9). With it (chapter 11), a :class:`~minitransformer.cache.KVCache` keeps every
    layer's keys and values: the prompt goes through the model once (the prefill), then each
    step feeds the model only the newest token. Both give the same tokens. The model runs in
    eval mode (no dropout) and is put back in the mode it was in. :func:`stream_tokens` runs
    the same loop for one prompt and hands out each token as soon as it is chosen.

    The penalties count the tokens each row has *generated* (not its prompt). With ``eos_id``,
    a row that writes it stops: its later positions are ``eos_id`` too, so the batch stays
    rectangular, and generation ends early once every row has stopped.

    A prompt and new tokens longer than ``context_length`` are refused, not cropped to the last
    ``context_length`` tokens as nanoGPT does: a model with learned positions has no position
    past the context, so a cropped prompt is a different, shorter text. To continue a longer
    text, pass its last tokens.

    The loop runs under ``torch.inference_mode()``; the result is cloned outside it, so it is
    an ordinary tensor that may take part in training later.

    Args:
        model: a language model such as :class:`~minitransformer.gpt.GPT`: ``model(idx)``
            returns ``(logits, loss)``, and ``model.config`` has ``vocab_size`` and
            ``context_length`` (with ``use_cache``, also ``num_layers``, and the model takes
            ``kv_cache=``). A model with a ``make_decode_step()`` method, as ``GPT`` has, is
            stepped through the function that method returns, made once per call.
        idx: ``(B, T)`` token ids, the prompt, on the model's device.
        max_new_tokens: the most tokens to add; ``T + max_new_tokens <= context_length``.
        use_cache: keep the keys and values instead of recomputing them.
        temperature, top_k, top_p, presence_penalty, frequency_penalty, generator: as for
            :func:`sample_next`; ``temperature=0`` is greedy.
        eos_id: the token that ends a row; ``None`` runs every row ``max_new_tokens`` steps.
        fast: with the cache, step through ``model.make_fast_decode_step()`` where the model
            has that method (:meth:`GPT.make_fast_decode_step
            <minitransformer.gpt.GPT.make_fast_decode_step>`, :meth:`Llama.make_fast_decode_step
            <minitransformer.llama.Llama.make_fast_decode_step>`): faster, with logits equal to
            the ordinary step's up to float rounding instead of bit for bit (the greedy tokens
            are the same unless two scores tie to within that rounding). ``fast=False`` steps
            through ``model.make_decode_step()``, bit for bit ``forward`` (chapter 11). Other
            models, and ``use_cache=False``, run as without it.
        sampling: the five sampling options in one :class:`SamplingParams` instead of as
            keywords (not both); its ``seed``, if any, seeds the generator (not beside
            ``generator``).

    Returns:
        long tensor ``(B, T + n)``, ``n <= max_new_tokens``: the prompt followed by the new
        tokens (``n < max_new_tokens`` only when every row wrote ``eos_id``). An empty batch
        (``B = 0``) gives an empty ``(0, T + max_new_tokens)`` tensor.

    Raises:
        TypeError: a model that is not such a language model (an encoder-decoder is pointed to
            ``translate`` and ``beam_search``), a prompt that is not an integer tensor, an
            option of the wrong type.
        ValueError: more tokens than ``context_length`` allows in total, a prompt on another
            device than the model, or a bad prompt, option or ``eos_id``.
    """
    config = _check_language_model(model, use_cache)
    _check_prompt(model, config, idx, max_new_tokens)
    _checks.check_type("use_cache", use_cache, bool, "True or False")
    _checks.check_type("fast", fast, bool, "True or False")
    sampling, generator = resolve_sampling(
        sampling, generator, idx.device, config.vocab_size, temperature=temperature,
        top_k=top_k, top_p=top_p, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty)
    stops = () if eos_id is None else _check_stop_ids("eos_id", (eos_id,), config.vocab_size)
    if idx.shape[0] == 0:                        # no rows: nothing to run the model on
        return idx.new_zeros((0, idx.shape[1] + max_new_tokens), dtype=torch.long)
    with eval_mode(model), torch.inference_mode():
        idx = idx.long()
        new = list(_next_tokens(model, idx, max_new_tokens, use_cache, sampling, generator,
                                stops, fast))
        idx = torch.cat([idx] + [t[:, None] for t in new], dim=1)      # (B, T + n)
    return idx.clone()                           # an ordinary tensor, not an inference tensor


def stream_tokens(
    model: nn.Module,
    prompt: Tensor | Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    stop_ids: Iterable[int] | None = None,
    generator: torch.Generator | None = None,
    fast: bool = True,
    sampling: SamplingParams | None = None,
) -> Iterator[int]:
    """Continue one prompt token by token, handing out each new token as soon as it is chosen:
    what a chat program prints while the model is still writing.

    The loop is :func:`generate`'s with the cache: the prompt goes through the model once (the
    prefill), then each step feeds the model only the newest token, with one
    :class:`~minitransformer.cache.KVCache` for the whole stream, so the tokens are those of
    ``generate(model, prompt[None], max_new_tokens, ...)`` with the same options and
    ``generator`` (with ``eos_id``, the same tokens up to and including it).

    The stream ends after ``max_new_tokens`` tokens, or after a token of ``stop_ids`` (the
    model's end of text, a chat's end-of-turn token such as SmolLM2's ``<|im_end|>``): **the
    stop token is yielded**, as the last token, as :func:`generate` keeps ``eos_id``; so a
    stream that ends on a token of ``stop_ids`` stopped there, and one that does not ran out of
    ``max_new_tokens``. A program that prints the reply leaves the stop token out. Leaving the
    loop early (``break``, ``close()``) is fine: nothing is computed ahead.

    The arguments are checked when ``stream_tokens`` is called, before the first token. Each
    step runs in eval mode and under ``torch.inference_mode()``, entered and left around that
    step only, so the caller's code between two tokens runs in its own modes.

    Args:
        model: a language model with a cache, as for :func:`generate`.
        prompt: the prompt's token ids, a list of ints or a ``(T,)`` integer tensor,
            ``T >= 1``.
        max_new_tokens: the most tokens to write; ``T + max_new_tokens <= context_length``.
        temperature, top_k, top_p, presence_penalty, frequency_penalty, generator: as for
            :func:`generate`.
        stop_ids: the tokens that end the stream (a set, list or tuple of ids); ``None`` or
            empty: none.
        fast, sampling: as for :func:`generate`.

    Yields:
        each new token id, an ``int``.

    Raises:
        TypeError, ValueError: as :func:`generate`; a ``prompt`` that is not a list of ids or a
            1-D tensor, a stop id outside the vocabulary.
    """
    config = _check_language_model(model, True)
    weight = next(iter(model.parameters()), None)
    device = None if weight is None else weight.device
    ids = _checks.check_id_list("prompt", prompt, allow_empty=False)
    idx = torch.tensor([ids], dtype=torch.long, device=device)              # (1, T)
    _check_prompt(model, config, idx, max_new_tokens, name="prompt", device=device)
    _checks.check_type("fast", fast, bool, "True or False")
    sampling, generator = resolve_sampling(
        sampling, generator, idx.device, config.vocab_size, temperature=temperature,
        top_k=top_k, top_p=top_p, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty)
    stops = _check_stop_ids("stop_ids", stop_ids, config.vocab_size)
    return _stream(model, idx.long(), max_new_tokens, sampling, generator, stops, fast)


def _stream(model: nn.Module, idx: Tensor, max_new_tokens: int, sampling: SamplingParams,
            generator: torch.Generator | None, stops: tuple[int, ...], fast: bool
            ) -> Iterator[int]:
    """:func:`stream_tokens`'s generator, on checked arguments."""
    for token in _next_tokens(model, idx, max_new_tokens, True, sampling, generator, stops,
                              fast, per_step=True):
        yield int(token[0])


_LOOSE_DEFAULTS = {"temperature": 1.0, "top_k": None, "top_p": None, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0}


def resolve_sampling(sampling: object, generator: torch.Generator | None, device: torch.device,
                 vocab_size: int, **loose: object
                 ) -> tuple[SamplingParams, torch.Generator | None]:
    """The :class:`SamplingParams` and generator of a call that takes ``sampling=`` or the five
    loose keyword options (not both), checked for ``vocab_size`` words; ``sampling.seed``
    makes a generator on ``device`` (not beside ``generator=``). What :func:`generate`,
    :func:`stream_tokens` and :func:`~minitransformer.batching.generate_batch` do with their
    options.

    Raises:
        TypeError, ValueError: a bad option, ``sampling`` beside a loose option, or
            ``sampling.seed`` beside ``generator``.
    """
    if sampling is None:
        return SamplingParams(**loose).check_vocab(vocab_size), generator
    _checks.check_type("sampling", sampling, SamplingParams, "a SamplingParams")
    both = [name for name, value in loose.items() if value != _LOOSE_DEFAULTS[name]]
    if both:
        raise TypeError(f"give the sampling options in sampling= or as keywords, not both: "
                        f"got sampling= and {', '.join(both)}=")
    if sampling.seed is not None:
        if generator is not None:
            raise TypeError("give sampling.seed or generator=, not both")
        generator = sampling.make_generator(device)
    return sampling.check_vocab(vocab_size), generator


def _check_prompt(model: nn.Module, config: object, idx: object, max_new_tokens: object, *,
                  name: str = "idx", device: torch.device | None = None) -> None:
    """A prompt ``(B, T)`` of the model's ids on its device, and ``max_new_tokens`` more
    positions that fit ``context_length`` (what :func:`generate` and :func:`stream_tokens`
    check)."""
    if device is None:
        weight = next(iter(model.parameters()), None)
        device = None if weight is None else weight.device
    _checks.check_token_ids(name, idx, config.vocab_size, max_len=config.context_length,
                            device=device)
    _checks.check_int("max_new_tokens", max_new_tokens, low=0)
    total = idx.shape[1] + max_new_tokens
    if total > config.context_length:
        raise ValueError(f"the prompt's {idx.shape[1]} tokens plus max_new_tokens="
                         f"{max_new_tokens} make {total}, more than context_length="
                         f"{config.context_length}")


def _check_stop_ids(name: str, stop_ids: object, vocab_size: int) -> tuple[int, ...]:
    """Token ids that end generation (none for ``None``), each in ``[0, vocab_size)``."""
    if stop_ids is None:
        return ()
    if isinstance(stop_ids, (str, bytes, Tensor)) or not isinstance(stop_ids, Iterable):
        raise TypeError(f"{name} must be a set, list or tuple of token ids, got "
                        f"{_checks._type_name(stop_ids)}")
    ids = tuple(stop_ids)
    for i in ids:
        if _checks.check_int(name, i, low=0) >= vocab_size:
            raise ValueError(f"{name}={i} is not a token of the vocabulary [0, {vocab_size})")
    return ids


def _check_language_model(model: object, use_cache: bool) -> object:
    """The config of a model :func:`generate` can run, or a ``TypeError`` that says why not."""
    from minitransformer.seq2seq import Seq2Seq  # here: generating with a GPT does not need it

    if isinstance(model, Seq2Seq):
        raise TypeError("generate continues a language model's prompt; a Seq2Seq translates a "
                        "source sentence: use model.translate(src, max_new_tokens) or "
                        "beam_search(model, src, beam_size=..., max_new_tokens=...)")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module such as GPT, got {type(model).__name__}")
    needed = ("vocab_size", "context_length") + (("num_layers",) if use_cache is True else ())
    config = getattr(model, "config", None)
    for field in needed:
        if not isinstance(getattr(config, field, None), int):
            raise TypeError(f"generate needs a language model such as GPT, whose model.config "
                            f"has {', '.join(needed)}; {type(model).__name__} has no "
                            f"model.config.{field}")
    return config


@contextmanager
def _stepping(model: nn.Module) -> Iterator[None]:
    """Eval mode and inference mode for one step of a stream, left before the token is
    handed out."""
    with eval_mode(model), torch.inference_mode():
        yield


def _next_tokens(model: nn.Module, idx: Tensor, max_new_tokens: int, use_cache: bool,
                 sampling: SamplingParams, generator: torch.Generator | None,
                 stops: tuple[int, ...], fast: bool = False, *,
                 per_step: bool = False) -> Iterator[Tensor]:
    """The loop of :func:`generate` and :func:`stream_tokens`, on checked arguments: yields
    each step's new token of every row, ``(B,)``, at most ``max_new_tokens`` times. The
    prompt ``idx`` is run once (the prefill), then one token per step through one cache. A row
    that wrote a token of ``stops`` writes it again; the loop ends when every row has stopped.
    ``per_step``: each step enters eval and inference mode itself (a stream); otherwise the
    caller runs the whole loop in them."""
    modes = (lambda: _stepping(model)) if per_step else nullcontext
    with modes():
        cache = (KVCache(model.config.num_layers, max_len=idx.shape[1] + max_new_tokens)
                 if use_cache else None)
        make_step = getattr(model, "make_decode_step", None)  # a faster cached pass, if any
        if fast:
            make_step = getattr(model, "make_fast_decode_step", make_step)
        step = make_step() if cache is not None and make_step is not None else None
        counts = (torch.zeros(idx.shape[0], model.config.vocab_size, dtype=torch.long,
                              device=idx.device) if sampling.penalised else None)  # (B, V)
        stop = torch.tensor(stops, dtype=torch.long, device=idx.device) if stops else None
        done = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    seen, new = idx, idx                          # everything so far; what the model has not seen
    for _ in range(max_new_tokens):
        with modes():
            if cache is None:
                logits, _ = model(seen)                              # (B, T, N)
            elif step is not None:
                logits = step(new, cache)                            # (B, T_new, N)
            else:
                logits, _ = model(new, kv_cache=cache)               # (B, T_new, N)
            next_id = sampling.choose(logits[:, -1], counts, generator)  # (B,)
            if stop is not None:
                next_id = torch.where(done, new[:, -1], next_id)     # stopped rows: stop again
                done = done | torch.isin(next_id, stop)
            if counts is not None:
                counts.scatter_add_(1, next_id[:, None], torch.ones_like(next_id[:, None]))
            new = next_id[:, None]                                   # (B, 1)
            if cache is None:
                seen = torch.cat([seen, new], dim=1)                 # (B, T + 1)
            finished = stop is not None and bool(done.all())
        yield next_id
        if finished:
            return


@torch.no_grad()
def beam_search(model: nn.Module, src: Tensor, *, beam_size: int, max_new_tokens: int) -> Tensor:
    """Translate with a :class:`~minitransformer.seq2seq.Seq2Seq` by keeping the ``beam_size`` most
    likely partial translations of each sentence (chapter 10).

    At each step every kept translation is extended by every token, and the ``beam_size``
    extensions with the highest total log-probability survive; a translation that has written
    ``eos_id`` keeps its score and is extended only by padding. ``beam_size=1`` is greedy
    decoding, :meth:`~minitransformer.seq2seq.Seq2Seq.translate`.

    Returns:
        ``(B, <= max_new_tokens + 1)`` ids laid out as ``translate``'s: the best translation of
        each sentence.

    Raises:
        TypeError, ValueError: as ``translate``; ``beam_size`` not a positive int; a model that
            is not a ``Seq2Seq``.
    """
    from minitransformer.seq2seq import Seq2Seq  # here: generating with a GPT does not need it

    if not isinstance(model, Seq2Seq):
        raise TypeError(f"beam_search expects a Seq2Seq model, got {type(model).__name__}")
    _checks.check_int("beam_size", beam_size)
    _checks.check_int("max_new_tokens", max_new_tokens)
    c, k = model.config, beam_size
    if k > c.tgt_vocab_size:
        raise ValueError(f"beam_size={k} is more than the {c.tgt_vocab_size} target tokens: "
                         f"there are not that many different continuations to keep")
    if max_new_tokens + 1 > c.context_length:
        raise ValueError(f"max_new_tokens={max_new_tokens} plus <bos> needs {max_new_tokens + 1} "
                         f"positions, more than context_length={c.context_length}")
    model._check_src(src)                          # before eval(): a bad source changes no mode
    if src.shape[0] == 0:                          # an empty batch: nothing to search
        return torch.full((0, 1), c.bos_id, dtype=torch.long, device=src.device)
    with eval_mode(model):
        seqs = _beams(model, src, k, max_new_tokens)                 # (B, k, t), best first
    seqs = seqs[:, 0]                                                # the best beam
    is_eos = seqs == c.eos_id
    ends = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, seqs.shape[1])
    return seqs[:, : int(ends.max())]                                # as long as greedy's


def _beams(model: nn.Module, src: Tensor, k: int, max_new_tokens: int) -> Tensor:
    """:func:`beam_search`'s search, on checked arguments, in eval mode: ``(B, k, t)`` ids, each
    sentence's ``k`` beams best first."""
    c = model.config
    source = model._read_source(src, True).repeat_interleave(k)     # B * k copies
    batch = src.shape[0]
    seqs = torch.full((batch * k, 1), c.bos_id, dtype=torch.long, device=src.device)
    scores = torch.full((batch, k), float("-inf"), dtype=source.memory.dtype, device=src.device)
    scores[:, 0] = 0.0                                               # one live beam to start
    done = torch.zeros(batch * k, dtype=torch.bool, device=src.device)
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(model.next_token_logits(seqs, source), dim=-1)  # (B k, N)
        logp[done] = float("-inf")
        logp[done, c.pad_id] = 0.0                                   # finished: pad for free
        candidates = (scores.reshape(-1, 1) + logp).reshape(batch, -1)             # (B, k N)
        scores, best = candidates.topk(k, dim=-1)                    # (B, k), sorted
        beam, token = best // logp.shape[-1], best % logp.shape[-1]
        rows = (torch.arange(batch, device=src.device)[:, None] * k + beam).flatten()
        seqs = torch.cat([seqs[rows], token.reshape(-1, 1)], dim=1)
        done = done[rows] | (token.flatten() == c.eos_id)
        if done.all():
            break
    return seqs.reshape(batch, k, -1)
