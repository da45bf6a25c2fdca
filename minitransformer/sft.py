"""Supervised fine-tuning on conversations (chapter 16).

A chat model learns from conversations with the loss of pre-training, the next token's
cross-entropy, counted only where the assistant speaks: the labels are the token ids on the
assistant's content and end-of-turn token, and ``-100`` (left out) everywhere else. Trained on
the users' turns too, a model learns to write them.

:func:`sft_batch` pads a batch of conversations and shifts the labels against the inputs, in
this one place: position ``t`` of ``idx`` is scored on label ``t + 1``. Its ``(idx, targets)``
is the batch that a model's ``forward`` and chapter 9's ``train`` already take, so fine-tuning
runs in the same :class:`~minitransformer.training.TrainingLoop` as pre-training, and
:func:`sft_loss` is the model's own loss: the mean over the batch's assistant tokens, as TRL's
``SFTTrainer`` with ``assistant_only_loss=True`` computes it.

The same step written from log-probabilities, as chapter 17's methods start from them:
:func:`masked_mean`, :func:`sft_step`, and :func:`token_entropy` to watch how sure the model is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer._checks import check_int, check_type
from minitransformer.chat import encode_chat, pad_token_id
from minitransformer.lm import IGNORE_INDEX


def sft_labels(ids: Sequence[int], mask: Sequence[bool]) -> list[int]:
    """``ids`` where ``mask`` is True (the assistant's tokens and its end-of-turn token),
    ``-100`` elsewhere; not shifted (label ``t`` is token ``t``, as in transformers).

    Raises ``TypeError`` for a mask entry that is not a bool (or 0/1) and ``ValueError`` for
    lengths that differ.
    """
    check_type("ids", ids, (list, tuple), "a list of ints")
    check_type("mask", mask, (list, tuple), "a list of bools")
    if len(ids) != len(mask):
        raise ValueError(f"ids and mask must have the same length, got {len(ids)} and "
                         f"{len(mask)}")
    for k, bit in enumerate(mask):
        if bit not in (0, 1) or not isinstance(bit, (bool, int)):
            raise TypeError(f"mask[{k}] must be True or False, got {bit!r}")
    return [i if bit else IGNORE_INDEX for i, bit in zip(ids, mask)]


def sft_batch(tokenizer: object, conversations: Sequence[Sequence[Mapping[str, str]]], *,
              context_length: int | None = None,
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """A batch for ``model(idx, targets)``: each conversation's ids without their last token,
    and its :func:`sft_labels` without their first (the next token of each position), padded
    on the right with :func:`~minitransformer.chat.pad_token_id` (``<|pad|>``) and ``-100``.
    Causal attention keeps padding on the right out of every real position's view, so no
    attention mask is needed.

    Args:
        tokenizer: a ``BPETokenizer`` with the chat format: the course's, or a model's
            template with ``{% generation %}`` marks (SmolLM2's gets them).
        conversations: lists of messages, at least one.
        context_length: refuse a conversation whose ``idx`` would be longer (the model's).
        device: where the tensors go (default the CPU).

    Returns:
        ``(idx, targets)``, both ``(B, T)`` int64 with ``T`` the longest conversation's length
        minus one.

    Raises:
        TypeError, ValueError: as :func:`~minitransformer.chat.encode_chat`, naming the
            conversation; no conversations, a conversation longer than ``context_length`` or
            without an assistant token (nothing to learn).
    """
    pad = pad_token_id(tokenizer)
    if isinstance(conversations, (str, bytes, Mapping)) or not isinstance(conversations,
                                                                          Sequence):
        raise TypeError(f"conversations must be a list of conversations (lists of messages), "
                        f"got {type(conversations).__name__}")
    if not conversations:
        raise ValueError("conversations is empty: a batch needs at least one")
    if context_length is not None:
        check_int("context_length", context_length)
    rows = []
    for n, messages in enumerate(conversations):
        try:
            ids, mask = encode_chat(tokenizer, messages)
        except (TypeError, ValueError) as error:
            raise type(error)(f"conversations[{n}]: {error}") from None
        if not any(mask[1:]):
            raise ValueError(f"conversations[{n}] has no assistant tokens to learn from")
        if context_length is not None and len(ids) - 1 > context_length:
            raise ValueError(f"conversations[{n}] is {len(ids)} tokens long, more than the "
                             f"context of {context_length} + 1")
        labels = sft_labels(ids, mask)
        rows.append((ids[:-1], labels[1:]))  # the shift: position t predicts token t + 1
    length = max(len(idx) for idx, _ in rows)
    idx = torch.tensor([i + [pad] * (length - len(i)) for i, _ in rows], device=device)
    targets = torch.tensor([t + [IGNORE_INDEX] * (length - len(t)) for _, t in rows],
                           device=device)
    return idx, targets


def sft_loss(model: nn.Module, tokenizer: object,
             conversations: Sequence[Sequence[Mapping[str, str]]]) -> Tensor:
    """The supervised fine-tuning loss of ``model`` on ``conversations``: the mean
    cross-entropy of the next token over all the batch's assistant tokens (each conversation
    weighted by its number of them). Runs ``model(*sft_batch(...))`` on the model's device."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    device = next(model.parameters()).device
    context = getattr(getattr(model, "config", None), "context_length", None)
    return model(*sft_batch(tokenizer, conversations, context_length=context,
                            device=device))[1]


# ----- the pieces of a fine-tuning step, written out (CS336's alignment assignment) -----------

def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """The mean of ``values`` where ``mask`` is True: ``sum(values · mask) / sum(mask)``, over
    everything (``dim=None``) or along ``dim``. ``mask`` is boolean and of ``values``' shape.

    Raises:
        TypeError, ValueError: a mask that is not boolean or not of ``values``' shape, or
            with no True where a mean is taken (it would be 0 / 0).
    """
    _checks.check_float_tensor("values", values)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor, got {_checks._type_name(mask)}")
    if mask.shape != values.shape:
        raise ValueError(f"mask must have the shape of values {_checks.shape(values)}, got "
                         f"{_checks.shape(mask)}")
    if dim is not None:
        _checks.check_int("dim", dim, low=-values.ndim)
        if dim >= values.ndim:
            raise ValueError(f"dim must be below values' {values.ndim} dimensions, got {dim}")
    count = mask.sum() if dim is None else mask.sum(dim)
    if bool((count == 0).any()):
        raise ValueError("mask has no True " + ("at all" if dim is None else
                         f"in some row along dim={dim}") + ": the mean would be 0 / 0")
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    return total / count


def token_entropy(logits: Tensor) -> Tensor:
    """The entropy of the next-token distribution at each position,
    ``H = -sum_v p_v log p_v`` with ``p = softmax(logits)``, in nats: ``(..., V)`` ->
    ``(...)``. 0 for a certain prediction, ``ln V`` for a uniform one."""
    _checks.check_float_tensor("logits", logits)
    if logits.ndim == 0:
        raise ValueError("logits must have a last dimension (the vocabulary), got a scalar")
    log_p = logits.log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def sft_step(log_probs: Tensor, mask: Tensor, *, grad_accum: int = 1) -> Tensor:
    """One micro-batch of supervised fine-tuning from the log-probabilities of the answer's
    tokens: ``loss = -masked_mean(log_probs, mask) / grad_accum``, back-propagated
    (``loss.backward()``); returns the loss, detached. With ``mask = targets != -100`` this
    is :func:`sft_loss`'s cross-entropy (divided by ``grad_accum``, so that the gradients of
    ``grad_accum`` micro-batches add up to one batch's); the optimizer steps after the last.

    Args:
        log_probs: ``(B, T)`` the log-probability of each target token (with a graph), e.g.
            :func:`~minitransformer.preferences.per_token_log_probs`.
        mask: ``(B, T)`` bool, True on the answer's tokens.
        grad_accum: the micro-batches of one optimizer step.
    """
    grad_accum = check_int("grad_accum", grad_accum)
    loss = -masked_mean(log_probs, mask) / grad_accum
    loss.backward()
    return loss.detach()
