"""Learning from preferences: direct preference optimisation (chapter 17).

A preference pair is a prompt with a better answer (``chosen``) and a worse one (``rejected``),
as TRL's ``DPOTrainer`` reads them: ``{"prompt": ..., "chosen": ..., "rejected": ...}``, either
plain strings or chapter 16's lists of messages. DPO (Rafailov et al., 2023) trains a policy
``π`` against a frozen reference ``π_ref`` (the model it starts from) with::

    loss = -log σ(β · [(log π(y_c|x) - log π_ref(y_c|x)) - (log π(y_r|x) - log π_ref(y_r|x))])

where ``log π(y|x)`` is :func:`sequence_log_probs`: the sum of the response tokens'
log-probabilities given the prompt, with the prompt and the padding left out. At the first step
``π = π_ref``, so the loss is ``ln 2`` whatever the data. ``β · (log π - log π_ref)`` is the
implicit reward (:func:`implicit_rewards`).

:func:`preference_batch` encodes prompts and responses as ``(idx, targets)`` (targets ``-100``
on the prompt and the padding), :func:`dpo_batch` a list of pairs, chosen rows then rejected rows,
for one forward per model. :class:`DPO` holds the policy and its frozen reference and returns
``(logits, loss)`` like a model, so chapter 9's :func:`~minitransformer.training.train` and
:class:`~minitransformer.training.TrainingLoop` train it unchanged; :func:`dpo_train` does that
for a notebook.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.training import TrainingHistory, train
from minitransformer.chat import apply_chat_template, end_of_turn_id, pad_token_id
from minitransformer.sft import IGNORE_INDEX

#: The keys of a preference pair, TRL's names.
PAIR_KEYS = ("prompt", "chosen", "rejected")


# ----- the sequence log-probability ---------------------------------------------------------------

def per_token_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log p(target_t | tokens <= t)`` at each position, 0 where ``targets`` is ``-100``.

    Args:
        logits: ``(B, T, V)`` float scores.
        targets: ``(B, T)`` the next token of each position, ``-100`` to leave it out.

    Returns:
        ``(B, T)`` in the logits' dtype.

    Raises:
        TypeError, ValueError: tensors of the wrong kind or shape, a target outside
            ``[0, V)`` that is not ``-100``.
    """
    _checks.check_float_tensor("logits", logits, ndim=3)
    _checks.check_token_ids("targets", targets, logits.shape[-1], ignore_index=IGNORE_INDEX)
    if targets.shape != logits.shape[:2]:
        raise ValueError(f"targets must be (B, T) = {tuple(logits.shape[:2])} for logits "
                         f"{tuple(logits.shape)}, got {tuple(targets.shape)}")
    keep = targets != IGNORE_INDEX
    picked = targets.masked_fill(~keep, 0).unsqueeze(-1)                 # (B, T, 1)
    log_probs = logits.log_softmax(-1).gather(-1, picked).squeeze(-1)    # (B, T)
    return log_probs.masked_fill(~keep, 0.0)


def sequence_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log π(y|x)``: the sum over the positions whose target is not ``-100`` (the response's
    tokens) of the target's log-probability. ``(B, T, V)``, ``(B, T)`` -> ``(B,)``."""
    return per_token_log_probs(logits, targets).sum(-1)


# ----- the loss -----------------------------------------------------------------------------------

def _check_log_probs(**tensors: Tensor) -> None:
    shapes = {}
    for name, value in tensors.items():
        _checks.check_float_tensor(name, value, ndim=1)
        shapes[name] = tuple(value.shape)
    if len(set(shapes.values())) > 1:
        raise ValueError("the log-probabilities must have the same shape (B,), got "
                         + ", ".join(f"{k} {v}" for k, v in shapes.items()))


def implicit_rewards(policy_log_probs: Tensor, ref_log_probs: Tensor, *, beta: float) -> Tensor:
    """DPO's implicit reward of each response, ``β · (log π(y|x) - log π_ref(y|x))``:
    ``(B,)``, ``(B,)`` -> ``(B,)``."""
    beta = _checks.check_number("beta", beta, positive=True)
    _check_log_probs(policy_log_probs=policy_log_probs, ref_log_probs=ref_log_probs)
    return beta * (policy_log_probs - ref_log_probs)


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor,
             ref_rejected: Tensor, *, beta: float) -> Tensor:
    """DPO's loss (the sigmoid loss of TRL), the mean over the batch of
    ``-log σ(β · ((log π(y_c) - log π_ref(y_c)) - (log π(y_r) - log π_ref(y_r))))``.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected: ``(B,)``
            :func:`sequence_log_probs` of the chosen and rejected responses under the policy
            and the reference.
        beta: how strongly the policy is held near the reference (> 0).

    Returns:
        a scalar tensor.

    Raises:
        TypeError, ValueError: tensors that do not fit, a ``beta`` that is not positive, or
            one so large that ``beta`` times a margin overflows the tensors' dtype.
    """
    beta = _checks.check_number("beta", beta, positive=True)
    _check_log_probs(policy_chosen=policy_chosen, policy_rejected=policy_rejected,
                     ref_chosen=ref_chosen, ref_rejected=ref_rejected)
    if policy_chosen.numel() == 0:
        raise ValueError("the log-probabilities are empty: no pairs to average the loss over")
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    scaled = beta * margin
    if not bool(torch.isfinite(scaled).all()) and bool(torch.isfinite(margin).all()):
        raise ValueError(f"beta={beta!r} times the log-probability margins (up to "
                         f"{margin.abs().max().item():.3g}) overflows {margin.dtype}: use a "
                         f"smaller beta (TRL's default is 0.1)")
    return -F.logsigmoid(scaled).mean()


def preference_accuracy(chosen: Tensor, rejected: Tensor) -> float:
    """The share of pairs whose chosen score is above the rejected one: with
    :func:`sequence_log_probs`, how often the model ranks the chosen response first; with
    :func:`implicit_rewards`, TRL's ``rewards/accuracies``."""
    _check_log_probs(chosen=chosen, rejected=rejected)
    if chosen.numel() == 0:
        raise ValueError("chosen and rejected are empty: no pairs to count")
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not bool(torch.isfinite(value).all()):
            where = int((~torch.isfinite(value)).nonzero()[0])
            raise ValueError(f"{name}[{where}] is {value[where].item()}: a score must be a "
                             f"finite number to be ranked")
    return (chosen > rejected).float().mean().item()


def kl_estimate(policy_logits: Tensor, ref_logits: Tensor, targets: Tensor) -> Tensor:
    """How far the policy has moved from the reference on given sequences: for each row, the
    sum over the response positions (``targets`` not ``-100``) of the exact
    ``KL(π(·|prefix) || π_ref(·|prefix))`` over the vocabulary. ``(B, T, V)`` twice and
    ``(B, T)`` -> ``(B,)``; 0 when the two models agree."""
    _checks.check_float_tensor("policy_logits", policy_logits, ndim=3)
    _checks.check_float_tensor("ref_logits", ref_logits, ndim=3)
    if policy_logits.shape != ref_logits.shape:
        raise ValueError(f"policy_logits and ref_logits must have the same shape, got "
                         f"{tuple(policy_logits.shape)} and {tuple(ref_logits.shape)}")
    _checks.check_int_tensor("targets", targets, ndim=2)
    if targets.shape != policy_logits.shape[:2]:
        raise ValueError(f"targets must be (B, T) = {tuple(policy_logits.shape[:2])}, got "
                         f"{tuple(targets.shape)}")
    log_p, log_q = policy_logits.log_softmax(-1), ref_logits.log_softmax(-1)
    per_position = (log_p.exp() * (log_p - log_q)).sum(-1)               # (B, T)
    return per_position.masked_fill(targets == IGNORE_INDEX, 0.0).sum(-1)


# ----- batches ------------------------------------------------------------------------------------

def _is_messages(value: object) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, (str, bytes))
            and all(isinstance(m, Mapping) for m in value))


def _check_plain(name: str, text: object, specials: Mapping[str, int]) -> str:
    _checks.check_type(name, text, str, "a str or a list of messages")
    for token in specials:
        if token in text:
            raise ValueError(f"{name} contains the special token {token!r}, which only the "
                             f"template may write")
    return text


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _encode(tokenizer: object, prompt: object, responses: Sequence[object], *,
            prompt_name: str, names: Sequence[str]) -> tuple[list[int], list[list[int]]]:
    """A prompt's ids and each of its responses' ids, as TRL's ``DPOTrainer`` splits them: the
    prompt alone and prompt + response are encoded, and the response starts where the two
    differ (for all of a prompt's responses at the same place). A plain-text response is
    followed by the end of turn (``<|end|>``; SmolLM2's ``<|im_end|>``: TRL adds the
    end-of-sequence token); a conversational one ends with its turn's end already (and
    whatever the chat template writes after it)."""
    end = end_of_turn_id(tokenizer)                 # refuses a tokenizer without a chat format
    specials = tokenizer.special_tokens
    if _is_messages(prompt):
        prompt_ids = apply_chat_template(tokenizer, prompt, add_generation_prompt=True)
        fulls = []
        for response, name in zip(responses, names):
            if not _is_messages(response):
                raise TypeError(f"{name} must be a list of messages like the prompt, got "
                                f"{type(response).__name__}")
            if not response or response[0].get("role") != "assistant":
                raise ValueError(f"{name} must begin with an assistant message, got "
                                 f"{list(response)[:1]!r}")
            fulls.append(apply_chat_template(tokenizer, [*prompt, *response]))
    else:
        prompt = _check_plain(prompt_name, prompt, specials)
        prompt_ids = tokenizer.encode(prompt)
        fulls = [tokenizer.encode(prompt + _check_plain(name, response, specials))
                 + [end] for response, name in zip(responses, names)]
    start = min(_common_prefix(prompt_ids, full) for full in fulls)
    if start == 0:
        raise ValueError(f"{prompt_name} is empty (or merges into the response's first "
                         f"token), so no token predicts the response's first one")
    return prompt_ids[:start], [full[start:] for full in fulls]


def _check_context(prompt: list[int], response: list[int], context_length: int | None,
                   name: str) -> None:
    if context_length is not None and len(prompt) + len(response) - 1 > context_length:
        raise ValueError(f"{name} is {len(prompt) + len(response)} tokens long with its prompt, "
                         f"more than the context of {context_length} + 1")


def _pad(rows: list[tuple[list[int], list[int]]], tokenizer: object,
         device: torch.device | str | None) -> tuple[Tensor, Tensor]:
    """``(prompt ids, response ids)`` rows -> ``(idx, targets)``, shifted once and padded."""
    shifted = []
    for prompt, response in rows:
        ids = prompt + response
        targets = [IGNORE_INDEX] * (len(prompt) - 1) + response   # position t predicts t + 1
        shifted.append((ids[:-1], targets))
    length = max(len(idx) for idx, _ in shifted)
    pad = pad_token_id(tokenizer)
    idx = torch.tensor([i + [pad] * (length - len(i)) for i, _ in shifted], device=device)
    targets = torch.tensor([t + [IGNORE_INDEX] * (length - len(t)) for _, t in shifted],
                           device=device)
    return idx, targets


def _check_list(name: str, value: object) -> None:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} is empty: a batch needs at least one")


def preference_batch(tokenizer: object, prompts: Sequence[object], responses: Sequence[object],
                     *, context_length: int | None = None,
                     device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(idx, targets)`` for scoring each response after its prompt: prompt + response ids
    without the last, and the next token of each position on the response's positions,
    ``-100`` on the prompt's and the padding's (``<|pad|>`` on the right).

    Args:
        tokenizer: a ``BPETokenizer`` with the chat format.
        prompts, responses: equally many; each prompt a str and its response a str (a plain
            completion, followed by ``<|end|>``), or each a list of messages (chapter 16's
            template: the prompt ends with ``<|assistant|>``, the response is the assistant's
            content and its ``<|end|>``).
        context_length: refuse a row whose ``idx`` would be longer (the model's).
        device: where the tensors go.

    Returns:
        ``(idx, targets)``, both ``(B, T)`` int64.
    """
    _check_list("prompts", prompts)
    _check_list("responses", responses)
    if len(prompts) != len(responses):
        raise ValueError(f"prompts and responses must be equally many, got {len(prompts)} and "
                         f"{len(responses)}")
    if context_length is not None:
        _checks.check_int("context_length", context_length)
    rows = []
    for n, (prompt, response) in enumerate(zip(prompts, responses)):
        try:
            prompt_ids, (response_ids,) = _encode(tokenizer, prompt, [response],
                                                  prompt_name="the prompt",
                                                  names=["the response"])
            _check_context(prompt_ids, response_ids, context_length, "the response")
        except (TypeError, ValueError) as error:
            raise type(error)(f"row {n}: {error}") from None
        rows.append((prompt_ids, response_ids))
    return _pad(rows, tokenizer, device)


def check_pair(pair: object, name: str = "the pair") -> Mapping[str, object]:
    """A preference pair: a dict with ``"prompt"``, ``"chosen"`` and ``"rejected"``, all three
    str or all three lists of messages. Other keys are ignored, as TRL does."""
    if not isinstance(pair, Mapping):
        raise TypeError(f'{name} must be a dict {{"prompt", "chosen", "rejected"}}, got '
                        f'{type(pair).__name__}')
    missing = [key for key in PAIR_KEYS if key not in pair]
    if missing:
        raise ValueError(f"{name} has no {', '.join(map(repr, missing))}: a preference pair is "
                         f'{{"prompt": ..., "chosen": ..., "rejected": ...}}')
    kinds = {key: _is_messages(pair[key]) for key in PAIR_KEYS}
    if len(set(kinds.values())) > 1:
        raise TypeError(f"{name} mixes plain text and lists of messages: "
                        + ", ".join(f"{k} is {'messages' if v else type(pair[k]).__name__}"
                                    for k, v in kinds.items()))
    return pair


def encode_pair(tokenizer: object, pair: Mapping[str, object], *,
                context_length: int | None = None) -> tuple[list[int], list[int], list[int]]:
    """A preference pair's prompt ids and its chosen and rejected responses' ids, as
    :func:`preference_batch` encodes them; the two responses start at the same token.
    Refuses what :func:`check_pair` refuses, and, with ``context_length``, a prompt and
    response longer than ``context_length + 1`` tokens."""
    check_pair(pair)
    prompt, (chosen, rejected) = _encode(tokenizer, pair["prompt"],
                                         [pair["chosen"], pair["rejected"]],
                                         prompt_name="prompt", names=["chosen", "rejected"])
    if context_length is not None:
        _checks.check_int("context_length", context_length)
    _check_context(prompt, chosen, context_length, "chosen")
    _check_context(prompt, rejected, context_length, "rejected")
    return prompt, chosen, rejected


def dpo_batch(tokenizer: object, pairs: Sequence[Mapping[str, object]], *,
              context_length: int | None = None,
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(idx, targets)`` of ``2B`` rows for ``B`` preference pairs: the chosen responses
    (rows ``0..B-1``), then the rejected ones, each after its prompt, as
    :func:`preference_batch` encodes them (``encode_pair``)."""
    _check_list("pairs", pairs)
    chosen, rejected = [], []
    for n, pair in enumerate(pairs):
        try:
            prompt_ids, c, r = encode_pair(tokenizer, pair, context_length=context_length)
        except (TypeError, ValueError) as error:
            raise type(error)(f"pairs[{n}]: {error}") from None
        chosen.append((prompt_ids, c))
        rejected.append((prompt_ids, r))
    return _pad(chosen + rejected, tokenizer, device)


def dpo_batches(tokenizer: object, pairs: Sequence[Mapping[str, object]], *, batch_size: int,
                generator: torch.Generator, context_length: int | None = None,
                device: torch.device | str | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless :func:`dpo_batch` es of ``batch_size`` pairs drawn at random (with replacement)
    from ``generator``, whose state is the data's position."""
    _check_list("pairs", pairs)
    _checks.check_int("batch_size", batch_size)
    _checks.check_type("generator", generator, torch.Generator,
                       "a torch.Generator (its state is the data's position)")
    for n, pair in enumerate(pairs):            # refused here, not at some later step
        try:
            check_pair(pair)
        except (TypeError, ValueError) as error:
            raise type(error)(f"pairs[{n}]: {error}") from None
    while True:
        picks = torch.randint(len(pairs), (batch_size,), generator=generator,
                              device=generator.device).tolist()
        yield dpo_batch(tokenizer, [pairs[i] for i in picks], context_length=context_length,
                        device=device)


def identical_pairs(pairs: Sequence[Mapping[str, object]]) -> list[int]:
    """The indices of the pairs whose ``chosen`` equals their ``rejected``: their margin is
    0 whatever the policy, so they add ``ln 2`` to the loss and nothing to its gradient."""
    _check_list("pairs", pairs)
    return [n for n, pair in enumerate(pairs)
            if check_pair(pair, f"pairs[{n}]")["chosen"] == pair["rejected"]]


def identical_pairs_warning(pairs: Sequence[Mapping[str, object]], *,
                            labels: Sequence[str] | None = None) -> str | None:
    """A one-line warning when some pairs have ``chosen`` equal to ``rejected``, naming the
    first (``pairs[n]``, or its entry of ``labels``), else None."""
    same = identical_pairs(pairs)
    if not same:
        return None
    first = f"pairs[{same[0]}]" if labels is None else labels[same[0]]
    return (f"{len(same)} of {len(pairs)} pairs have chosen equal to rejected (the first: "
            f"{first}): DPO learns nothing from them"
            + (", so this run trains for nothing" if len(same) == len(pairs) else ""))


# ----- training -----------------------------------------------------------------------------------

class DPO(nn.Module):
    """A policy and its frozen reference as one module whose ``forward(idx, targets)`` returns
    ``(policy logits, DPO loss)``, as a model does, so that chapter 9's ``train`` and
    ``TrainingLoop`` train the policy (only its parameters that require a gradient: all of
    them, or the LoRA matrices of chapter 16's ``add_lora``).

    Args:
        policy: the model to train.
        reference: the model it starts from; frozen (no gradient, always in eval mode). Default:
            a copy of ``policy`` as it is now.
        beta: DPO's β (> 0).

    ``metrics`` holds the last forward's ``loss``, ``reward_accuracy``, ``chosen_reward``,
    ``rejected_reward`` (batch means of :func:`implicit_rewards`) and ``margin``.
    """

    def __init__(self, policy: nn.Module, reference: nn.Module | None = None, *,
                 beta: float = 0.1) -> None:
        super().__init__()
        _checks.check_type("policy", policy, nn.Module, "an nn.Module")
        if reference is None:
            reference = copy.deepcopy(policy)
        _checks.check_type("reference", reference, nn.Module, "an nn.Module")
        if reference is policy:
            raise ValueError("reference is the policy itself: it would move with it; pass a "
                             "copy (or None for one)")
        self.beta = _checks.check_number("beta", beta, positive=True)
        sizes = [getattr(getattr(m, "config", None), "vocab_size", None)
                 for m in (policy, reference)]
        if None not in sizes and sizes[0] != sizes[1]:
            raise ValueError(f"the reference has a vocabulary of {sizes[1]} tokens, the policy "
                             f"{sizes[0]}: the reference must be the policy as it started")
        where = {p.device for p in (*policy.parameters(), *reference.parameters())}
        if len(where) > 1:
            raise ValueError(f"policy and reference must be on one device, got "
                             f"{sorted(map(str, where))}")
        self.policy = policy
        self.reference = reference.requires_grad_(False).eval()
        self.metrics: dict[str, float] = {}

    def train(self, mode: bool = True) -> DPO:
        """Dropout stays off in both models (TRL's ``disable_dropout=True``): with it, the
        policy would differ from the reference at the first step, and the loss from ln 2."""
        return super().train(False)

    def log_probs(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The policy's logits, and the policy's and reference's :func:`sequence_log_probs`
        (``(2B,)``; the reference's without a graph)."""
        logits = self.policy(idx)[0]
        with torch.no_grad():
            ref_logits = self.reference(idx)[0]
        if ref_logits.shape != logits.shape:
            raise ValueError(f"the reference's logits {tuple(ref_logits.shape)} differ from the "
                             f"policy's {tuple(logits.shape)}: the reference must be a model of "
                             f"the same vocabulary (the policy as it started)")
        with torch.no_grad():
            ref = sequence_log_probs(ref_logits, targets)
        return logits, sequence_log_probs(logits, targets), ref

    def forward(self, idx: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """``(policy logits, DPO loss)`` for :func:`dpo_batch`'s ``(idx, targets)``: ``2B``
        rows, the chosen responses then the rejected ones."""
        if idx.ndim != 2 or idx.shape[0] % 2:
            raise ValueError(f"idx must be (2B, T): B chosen rows then B rejected rows "
                             f"(dpo_batch), got {tuple(idx.shape)}")
        logits, policy, ref = self.log_probs(idx, targets)
        policy_chosen, policy_rejected = policy.chunk(2)
        ref_chosen, ref_rejected = ref.chunk(2)
        loss = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                        beta=self.beta)
        with torch.no_grad():
            chosen = implicit_rewards(policy_chosen, ref_chosen, beta=self.beta)
            rejected = implicit_rewards(policy_rejected, ref_rejected, beta=self.beta)
            self.metrics = {"loss": loss.item(),
                            "reward_accuracy": preference_accuracy(chosen, rejected),
                            "chosen_reward": chosen.mean().item(),
                            "rejected_reward": rejected.mean().item(),
                            "margin": (chosen - rejected).mean().item()}
        return logits, loss


def dpo_train(policy: nn.Module, tokenizer: object, pairs: Sequence[Mapping[str, object]], *,
              reference: nn.Module | None = None, beta: float = 0.1, steps: int = 100,
              lr: float = 1e-4, batch_size: int = 8, seed: int = 0,
              progress: bool = True) -> TrainingHistory:
    """Train ``policy`` with DPO on ``pairs`` for ``steps`` updates of ``batch_size`` pairs
    drawn with ``seed``, through chapter 9's :func:`~minitransformer.training.train` (AdamW
    without weight decay, as TRL: a decay would pull the weights towards zero, not towards
    the reference; warm-up then cosine decay; gradient clipping). ``reference`` defaults to
    a frozen copy of ``policy`` as it is now. Returns the
    :class:`~minitransformer.training.TrainingHistory`, whose ``train_losses`` are each
    step's DPO loss (the first is ln 2)."""
    _checks.check_int("seed", seed, low=0)
    model = DPO(policy, reference, beta=beta)
    _check_list("pairs", pairs)
    message = identical_pairs_warning(pairs)
    if message is not None:
        warnings.warn(message, stacklevel=2)
    device = next(policy.parameters()).device
    context = getattr(getattr(policy, "config", None), "context_length", None)
    batches = dpo_batches(tokenizer, pairs, batch_size=batch_size, context_length=context,
                          generator=torch.Generator().manual_seed(seed), device=device)
    history = train(model, batches, steps=steps, lr=lr, progress=progress, eval_every=1,
                    weight_decay=0.0)
    policy.eval()
    return history
