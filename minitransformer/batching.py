"""Batched generation: many prompts of different lengths through one forward pass (chapter 18).

A batch is a rectangle, prompts are not. They are padded on the *left*, so that every row's
last token sits in the last column, where each step reads the scores and appends the next
token. Two things keep the padding from changing any row:

* the attention mask (``(B, T)``, True on real tokens): no query attends to a padding key;
* the position ids: a row's first real token is at position 0, as when it runs alone, not at
  the number of pads before it.

With both, each row's scores are those of its prompt alone, up to float rounding: the matrix
products of a batch may add in another order than those of a single row (batch invariance, which
chapter 18 measures).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer._modes import eval_mode
from minitransformer.cache import KVCache
from minitransformer.generation import SamplingParams, resolve_sampling


def _check_prompts(prompts: object) -> list[list[int]]:
    _checks.check_type("prompts", prompts, (list, tuple), "a list of lists of token ids")
    return [_checks.check_id_list(f"prompts[{i}]", prompt, allow_empty=False)
            for i, prompt in enumerate(prompts)]


def left_pad(prompts: Sequence[Sequence[int]], *, pad_id: int,
             device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Token ids of different lengths as one left-padded batch.

    Args:
        prompts: lists of token ids, at least one id each.
        pad_id: the id written in the padding (any id: the mask hides it).
        device: where to create the tensors (default: the CPU).

    Returns:
        ``(idx, attention_mask, position_ids)``, each ``(B, T)`` with ``T`` the longest
        prompt: ``idx`` long, ``attention_mask`` bool (True on real tokens), ``position_ids``
        long, counted from each row's first real token (0 on the padding).

    Raises:
        TypeError, ValueError: prompts that are not lists of ids >= 0, an empty prompt or an
            empty list, a bad ``pad_id``.
    """
    prompts = _check_prompts(prompts)
    if not prompts:
        raise ValueError("prompts is empty: nothing to pad")
    _checks.check_int("pad_id", pad_id, low=0)
    device = _checks.check_device(device) or torch.device("cpu")
    width = max(len(p) for p in prompts)
    idx = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long,
                       device=device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    positions = torch.arange(width, device=device) - (width - lengths)[:, None]   # (B, T)
    return idx, positions >= 0, positions.clamp(min=0)


def generate_batch(model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                   eos_id: int | None = None, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None,
                   presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                   seeds: Sequence[int | None] | None = None,
                   sampling: SamplingParams | None = None) -> list[list[int]]:
    """Continue every prompt by up to ``max_new_tokens`` tokens, all in one batch (static
    batching: the batch runs until its longest answer is done).

    The prompts are left-padded (:func:`left_pad`) and go through the model with their
    attention mask and position ids, with a :class:`~minitransformer.cache.KVCache`; each step
    adds one column. Row ``i``'s tokens are those of
    ``generate(model, prompts[i][None], max_new_tokens, ...)`` alone (greedy, or sampled with
    ``generator=torch.Generator().manual_seed(seeds[i])``), up to float rounding.

    Args:
        model: a :class:`~minitransformer.gpt.GPT` or :class:`~minitransformer.llama.Llama`.
        prompts: lists of token ids.
        max_new_tokens: the most new tokens per prompt.
        eos_id: the token that ends a row (kept as its last token).
        temperature, top_k, top_p, presence_penalty, frequency_penalty: as for
            :func:`~minitransformer.generation.generate`; each row counts its own tokens.
        seeds: one seed (or ``None``: PyTorch's global generator) per prompt; ``None``: every
            row seeded with ``sampling.seed`` (``None`` without ``sampling``).
        sampling: the five options in one
            :class:`~minitransformer.generation.SamplingParams` instead of as keywords.

    Returns:
        the new tokens of each prompt, in order (cut after ``eos_id``).

    Raises:
        TypeError, ValueError: a model that is not a GPT or Llama, bad prompts or options,
            a prompt plus ``max_new_tokens`` past the context.
    """
    from minitransformer.models import architecture_of

    architecture_of(model)                   # a GPT or a Llama
    c = model.config
    prompts = _check_prompts(prompts)
    _checks.check_int("max_new_tokens", max_new_tokens, low=0)
    sampling, _ = resolve_sampling(sampling, None, None, c.vocab_size,
                                   temperature=temperature, top_k=top_k, top_p=top_p,
                                   presence_penalty=presence_penalty,
                                   frequency_penalty=frequency_penalty)
    if eos_id is not None and _checks.check_int("eos_id", eos_id, low=0) >= c.vocab_size:
        raise ValueError(f"eos_id={eos_id} is not a token of the vocabulary [0, {c.vocab_size})")
    for i, prompt in enumerate(prompts):
        if max(prompt) >= c.vocab_size:
            raise ValueError(f"prompts[{i}] holds token id {max(prompt)}, outside the "
                             f"vocabulary [0, {c.vocab_size})")
        if len(prompt) + max_new_tokens > c.context_length:
            raise ValueError(f"prompts[{i}]'s {len(prompt)} tokens plus max_new_tokens="
                             f"{max_new_tokens} make more than context_length="
                             f"{c.context_length}")
    if seeds is None:
        seeds = [sampling.seed] * len(prompts)
    _checks.check_type("seeds", seeds, (list, tuple), "a list of seeds (int or None)")
    if len(seeds) != len(prompts):
        raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
    for i, seed in enumerate(seeds):
        if seed is not None:
            _checks.check_int(f"seeds[{i}]", seed, low=0)
    if not prompts or max_new_tokens == 0:
        return [[] for _ in prompts]
    device = model.token_embedding.weight.device
    generators = [None if s is None else torch.Generator(device).manual_seed(s) for s in seeds]
    with eval_mode(model), torch.inference_mode():
        return _generate(model, prompts, max_new_tokens, eos_id, generators, sampling)


def _generate(model: nn.Module, prompts: list[list[int]], max_new_tokens: int,
              eos_id: int | None, generators: list, sampling: SamplingParams
              ) -> list[list[int]]:
    """:func:`generate_batch`'s loop, on checked arguments."""
    device = model.token_embedding.weight.device
    idx, mask, positions = left_pad(prompts, pad_id=0, device=device)
    batch, width = idx.shape
    step = model.make_decode_step()
    cache = KVCache(model.config.num_layers, max_len=width + max_new_tokens)
    counts = (torch.zeros(batch, model.config.vocab_size, dtype=torch.long, device=device)
              if sampling.penalised else None)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * batch
    new = idx
    for _ in range(max_new_tokens):
        logits = step(new, cache, attention_mask=mask, position_ids=positions)[:, -1]  # (B, V)
        if sampling.temperature == 0 and not sampling.penalised:
            chosen = sampling.choose(logits).tolist()                          # one argmax
        else:
            chosen = [int(sampling.choose(logits[b:b + 1],
                                          None if counts is None else counts[b:b + 1],
                                          generators[b])[0]) for b in range(batch)]
        for b, token in enumerate(chosen):
            if not done[b]:
                out[b].append(token)
                done[b] = token == eos_id
                if counts is not None:
                    counts[b, token] += 1
        if all(done):
            break
        new = torch.tensor(chosen, dtype=torch.long, device=device)[:, None]  # (B, 1)
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)              # (B, T + 1)
        positions = positions[:, -1:] + 1
    return out
