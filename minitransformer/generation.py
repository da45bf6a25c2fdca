"""Choosing the next word from the model's scores: greedy, temperature and top-k (chapter 5),
and generating text with a language model (chapter 9).

Chapter 5 introduces :func:`sample_next`; :func:`generate` (chapter 9) calls it once per new
token.
"""

from __future__ import annotations

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
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token id from each row of scores.

    The scores are divided by ``temperature`` and turned into probabilities with softmax; one id
    is then drawn from them. A low temperature sharpens the distribution towards the best word, a
    high one flattens it; ``temperature=0`` skips the draw and takes the best word (greedy
    decoding). ``top_k`` first throws away every word but the ``k`` best.

    Args:
        logits: float tensor of shape ``(..., V)``, one score per vocabulary word.
        temperature: ``0`` (greedy) or a positive number.
        top_k: keep only the ``k`` highest-scoring words, ``1 <= k <= V``; ``None`` keeps all.
        generator: a seeded ``torch.Generator`` on the logits' device, for repeatable draws.

    Returns:
        long tensor of shape ``(...)``: the chosen ids, on the logits' device.

    Raises:
        TypeError: ``logits`` is not a floating-point tensor; ``temperature`` is not a number or
            ``top_k`` not an int.
        ValueError: ``logits`` without a dimension, a negative or non-finite temperature, a
            ``top_k`` outside ``[1, V]``, or scores holding NaN or ``+inf``, or all ``-inf`` in a
            row.
    """
    _checks.check_float_tensor("logits", logits, min_ndim=1)
    vocab_size = logits.shape[-1]
    _check_sampling(temperature, top_k, vocab_size)
    if vocab_size == 0:
        raise ValueError(f"logits have an empty vocabulary dimension, shape {tuple(logits.shape)}")
    _checks.check_scores(logits)  # as softmax does: no NaN or +inf, no row that is all -inf
    if temperature == 0:
        return logits.argmax(dim=-1)
    # Shift each row's best score to 0 first: dividing by a tiny temperature then cannot overflow.
    scores = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # (..., V)
    if top_k is not None:
        best = scores.topk(top_k, dim=-1).indices  # (..., k)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, best, True)
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = softmax(scores, dim=-1)
    flat = probs.reshape(-1, vocab_size)  # (rows, V)
    if flat.shape[0] == 0:
        return torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
    ids = torch.multinomial(flat, num_samples=1, generator=generator)  # (rows, 1)
    return ids.reshape(logits.shape[:-1])


def _check_sampling(temperature: object, top_k: object, vocab_size: int) -> None:
    """The sampling options of :func:`sample_next` and :func:`generate`, checked the same way."""
    _checks.check_number("temperature", temperature, low=0.0)
    if top_k is not None and _checks.check_int("top_k", top_k) > vocab_size:
        raise ValueError(f"top_k must be at most the vocabulary size {vocab_size}, got {top_k}")


def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue each row of ``idx`` by ``max_new_tokens`` tokens, one at a time (chapter 9).

    Each step takes the scores of the last position and picks the next token with
    :func:`sample_next`. Without the cache, each step runs the model on everything so far
    (chapter 9). With it (chapter 11), a :class:`~minitransformer.cache.KVCache` keeps every
    layer's keys and values: the prompt goes through the model once (the prefill), then each
    step feeds the model only the newest token. Both give the same tokens. The model runs in
    eval mode (no dropout) and is put back in the mode it was in.

    The loop runs under ``torch.inference_mode()``, which skips more of autograd's bookkeeping
    than ``torch.no_grad()`` (a cached step, a few small matrix products, is dominated by such
    overheads); the result is cloned outside it, so it is an ordinary tensor that may take part
    in training later.

    Args:
        model: a language model such as :class:`~minitransformer.gpt.GPT`: ``model(idx)``
            returns ``(logits, loss)``, and ``model.config`` has ``vocab_size`` and
            ``context_length`` (with ``use_cache``, also ``num_layers``, and the model takes
            ``kv_cache=``). A model with a ``make_decode_step()`` method, as ``GPT`` has, is
            stepped through the function that method returns, made once per call.
        idx: ``(B, T)`` token ids, the prompt.
        max_new_tokens: how many tokens to add; ``T + max_new_tokens <= context_length``.
        use_cache: keep the keys and values instead of recomputing them.
        temperature, top_k, generator: as for :func:`sample_next`; ``temperature=0`` is greedy.

    Returns:
        long tensor ``(B, T + max_new_tokens)``: the prompt followed by the new tokens.

    Raises:
        TypeError: a prompt that is not an integer tensor, a ``use_cache`` that is not a bool,
            a temperature or ``top_k`` of the wrong type.
        ValueError: more tokens than ``context_length`` allows in total, or a bad prompt,
            temperature or ``top_k``.
    """
    config = model.config
    _checks.check_token_ids("idx", idx, config.vocab_size, max_len=config.context_length)
    _checks.check_int("max_new_tokens", max_new_tokens, low=0)
    _checks.check_type("use_cache", use_cache, bool, "True or False")
    _check_sampling(temperature, top_k, config.vocab_size)
    total = idx.shape[1] + max_new_tokens
    if total > config.context_length:
        raise ValueError(f"the prompt's {idx.shape[1]} tokens plus max_new_tokens="
                         f"{max_new_tokens} make {total}, more than context_length="
                         f"{config.context_length}")
    with eval_mode(model), torch.inference_mode():
        idx = _continue(model, idx.long(), max_new_tokens, use_cache, temperature, top_k,
                        generator)
    return idx.clone()                           # an ordinary tensor, not an inference tensor


def _continue(model: nn.Module, idx: Tensor, max_new_tokens: int, use_cache: bool,
              temperature: float, top_k: int | None,
              generator: torch.Generator | None) -> Tensor:
    """:func:`generate`'s loop, on checked arguments: ``idx`` followed by the new tokens."""
    total = idx.shape[1] + max_new_tokens
    cache = KVCache(model.config.num_layers, max_len=total) if use_cache else None
    make_step = getattr(model, "make_decode_step", None)  # a faster cached pass, if there is one
    step = make_step() if cache is not None and make_step is not None else None
    new = idx                                    # what the model has not seen yet
    for _ in range(max_new_tokens):
        if cache is None:
            logits, _ = model(idx)                               # (B, T, N)
        elif step is not None:
            logits = step(new, cache)                            # (B, T_new, N)
        else:
            logits, _ = model(new, kv_cache=cache)               # (B, T_new, N)
        next_id = sample_next(logits[:, -1], temperature=temperature, top_k=top_k,
                              generator=generator)               # (B,)
        new = next_id[:, None]                                   # (B, 1)
        idx = torch.cat([idx, new], dim=1)                       # (B, T + 1)
    return idx


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
    if max_new_tokens + 1 > c.context_length:
        raise ValueError(f"max_new_tokens={max_new_tokens} plus <bos> needs {max_new_tokens + 1} "
                         f"positions, more than context_length={c.context_length}")
    model._check_src(src)                          # before eval(): a bad source changes no mode
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
