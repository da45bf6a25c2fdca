"""Choosing the next word from the model's scores: greedy, temperature and top-k (chapter 5),
and generating text with a language model (chapter 9).

Chapter 5 introduces :func:`sample_next`; :func:`generate` (chapter 9) calls it once per new
token.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from minitransformer import _checks
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
        TypeError: ``logits`` is not a floating-point tensor with at least one dimension.
        ValueError: a negative or non-finite temperature, a ``top_k`` outside ``[1, V]``, or
            scores holding NaN or ``+inf``, or all ``-inf`` in a row.
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() == 0:
        raise TypeError("sample_next expects a floating-point tensor of shape (..., V), got "
                        + (f"{logits.dtype} of shape {tuple(logits.shape)}"
                           if isinstance(logits, Tensor) else type(logits).__name__))
    vocab_size = logits.shape[-1]
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be 0 (greedy) or a positive number, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k must be an integer between 1 and the vocabulary size {vocab_size}, "
                         f"got {top_k!r}")
    if vocab_size == 0:
        raise ValueError(f"logits have an empty vocabulary dimension, shape {tuple(logits.shape)}")
    softmax(logits)  # checks the scores: no NaN or +inf, and no row that is all -inf
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


@torch.no_grad()
def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue each row of ``idx`` by ``max_new_tokens`` tokens, one at a time (chapter 9).

    Each step runs the model on everything so far, takes the scores of the last position and
    picks the next token with :func:`sample_next`. The model runs in eval mode (no dropout) and
    is put back in the mode it was in.

    Args:
        model: a language model such as :class:`~minitransformer.gpt.GPT`: ``model(idx)``
            returns ``(logits, loss)``, and ``model.config`` has ``vocab_size`` and
            ``context_length``.
        idx: ``(B, T)`` token ids, the prompt.
        max_new_tokens: how many tokens to add; ``T + max_new_tokens <= context_length``.
        temperature, top_k, generator: as for :func:`sample_next`; ``temperature=0`` is greedy.

    Returns:
        long tensor ``(B, T + max_new_tokens)``: the prompt followed by the new tokens.

    Raises:
        ValueError: more tokens than ``context_length`` allows in total, or a bad prompt,
            temperature or ``top_k``.
    """
    config = model.config
    _checks.check_token_ids("idx", idx, config.vocab_size, max_len=config.context_length)
    _checks.check_int("max_new_tokens", max_new_tokens, low=0)
    _checks.check_number("temperature", temperature, low=0.0)
    if top_k is not None and _checks.check_int("top_k", top_k) > config.vocab_size:
        raise ValueError(f"top_k must be at most the vocabulary size {config.vocab_size}, "
                         f"got {top_k}")
    total = idx.shape[1] + max_new_tokens
    if total > config.context_length:
        raise ValueError(f"the prompt's {idx.shape[1]} tokens plus max_new_tokens="
                         f"{max_new_tokens} make {total}, more than context_length="
                         f"{config.context_length}")
    was_training = model.training
    model.eval()
    idx = idx.long()
    for _ in range(max_new_tokens):
        logits, _ = model(idx)                                   # (B, T, N)
        next_id = sample_next(logits[:, -1], temperature=temperature, top_k=top_k,
                              generator=generator)               # (B,)
        idx = torch.cat([idx, next_id[:, None]], dim=1)          # (B, T + 1)
    model.train(was_training)
    return idx
