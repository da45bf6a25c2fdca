"""Learning from a verifiable reward: group relative policy optimisation, GRPO (chapter 17).

For each prompt the model writes ``G`` replies (:func:`sample_group`, one batched, cached
``generate`` call); a Python function scores them; each reply's *advantage* is its reward
compared with the other replies to the same prompt (:func:`group_advantages`); and the loss
(:func:`grpo_loss`) raises the log-probability of the tokens of replies better than their group
and lowers the others', clipped as in PPO, with an optional KL penalty towards a reference model.
:func:`grpo_step` does one round of this, :func:`grpo_train` many, on chapter 16's chat format,
in chapter 9's :class:`~minitransformer.training.TrainingLoop` through :class:`GRPO`, a module
that returns the loss as a model does. :func:`policy_gradient_loss` is the plain REINFORCE loss
that the clipped one reduces to at the first update.

The formulas are TRL's ``GRPOTrainer`` (version 1.16): the same advantages (``scale_rewards=
"group"``, the group's sample standard deviation, ``+ 1e-4``), the same per-token objective and
k3 KL estimator, and its ``loss_type`` averages (``"grpo"`` is the DeepSeekMath paper's: the mean
over each reply's tokens, then over the replies; TRL's default is ``"dapo"``).
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.generation import generate
from minitransformer.preferences import per_token_log_probs
from minitransformer.sft import IGNORE_INDEX

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")
ADVANTAGES = ("group", "group_mean", "batch", "raw")


def group_advantages(rewards: Tensor, group_size: int, *, normalize: bool = True,
                     eps: float = 1e-4) -> Tensor:
    """Each reward compared with its group's: ``(r - mean) / (std + eps)``, or ``r - mean``
    without ``normalize``.

    ``rewards`` holds ``B * G`` rewards laid out group after group (the ``G`` replies to prompt
    0, then to prompt 1, ...). The mean and standard deviation are each group's own, never the
    batch's; the standard deviation is the sample one (divided by ``G - 1``), as TRL's. A group
    whose rewards are all equal teaches nothing: its advantages are 0.

    Raises:
        TypeError: ``rewards`` not a floating tensor, options of the wrong type.
        ValueError: ``rewards`` not one-dimensional, a length that ``group_size`` does not
            divide, a ``group_size`` below 2, a NaN or infinite reward, ``eps <= 0``.
    """
    rewards = _check_rewards(rewards, group_size)
    _checks.check_type("normalize", normalize, bool, "True or False")
    _checks.check_number("eps", eps, positive=True)
    groups = rewards.view(-1, group_size)                                       # (B, G)
    advantages = groups - groups.mean(dim=1, keepdim=True)
    if normalize:
        advantages = advantages / (groups.std(dim=1, keepdim=True) + eps)
    return advantages.reshape(-1)


def _check_rewards(rewards: object, group_size: object) -> Tensor:
    _checks.check_float_tensor("rewards", rewards, ndim=1)
    group_size = _checks.check_int("group_size", group_size)
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (a reply is compared with the others "
                         f"to its prompt), got {group_size}")
    if rewards.numel() == 0 or rewards.numel() % group_size:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a positive multiple of "
                         f"group_size={group_size}")
    bad = ~torch.isfinite(rewards)
    if bad.any():
        where = int(bad.nonzero()[0])
        raise ValueError(f"rewards[{where}] is {rewards[where].item()}: every reward must be a "
                         f"finite number")
    return rewards


def grpo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, *,
              epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0,
              ref_log_probs: Tensor | None = None, loss_type: str = "grpo",
              kl_correction: bool = False) -> Tensor:
    """The clipped ratio objective of GRPO, as a loss to minimise.

    Per completion token, with ``ratio = exp(log_probs - old_log_probs)`` and the reply's
    advantage ``A``::

        loss_t = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)
                 + beta * (exp(ref - logp) - (ref - logp) - 1)        # k3 estimate of the KL

    then averaged over the tokens where ``mask`` is True as ``loss_type`` says: ``"grpo"`` the
    mean over each reply's tokens, then over the replies; ``"bnpo"`` and ``"dapo"`` the mean
    over all the batch's tokens (the same on one process, without gradient accumulation);
    ``"dr_grpo"`` the sum over ``B * T`` (``T`` the completions' padded length).

    Args:
        log_probs: ``(B, T)`` the policy's log-probabilities of the completion tokens (with
            gradient). old_log_probs: ``(B, T)`` those of the policy that sampled them.
            Only ``log_probs`` is differentiated: the others are constants (detached).
        advantages: ``(B,)`` one per completion. mask: ``(B, T)`` bool, True on completion tokens.
        epsilon, epsilon_high: the clip range ``[1 - epsilon, 1 + epsilon_high]``;
            ``epsilon_high`` defaults to ``epsilon``. ``epsilon >= 1`` turns the lower clip
            off (a ratio is never below 0), as TRL allows.
        beta: the KL penalty's weight; ``beta > 0`` needs ``ref_log_probs`` ``(B, T)``.
        kl_correction: multiply the KL term by ``ratio``, as TRL does by default
            (``use_bias_correction_kl=True``): the same value on-policy, another gradient.

    Raises:
        TypeError, ValueError: tensors of the wrong type, shape or dtype, non-finite values
            where the mask is True, an empty mask, a bad option, ``beta > 0`` without
            ``ref_log_probs`` or ``ref_log_probs`` with ``beta = 0``.
    """
    if beta == 0 and ref_log_probs is not None:
        raise ValueError("ref_log_probs given with beta=0: the KL term would be left out; "
                         "pass beta > 0 or leave ref_log_probs out")
    return _grpo_terms(log_probs, old_log_probs, advantages, mask, epsilon=epsilon,
                       epsilon_high=epsilon_high, beta=beta, ref_log_probs=ref_log_probs,
                       loss_type=loss_type, kl_correction=kl_correction)["loss"]


def _grpo_terms(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, *,
                epsilon: float, epsilon_high: float | None, beta: float,
                ref_log_probs: Tensor | None, loss_type: str,
                kl_correction: bool = False) -> dict[str, Tensor]:
    """:func:`grpo_loss` and what a training step reports: the share of clipped tokens and,
    with ``ref_log_probs``, the mean KL estimate (measured, and in the loss only if
    ``beta > 0``)."""
    low, high, beta = _check_loss_options(epsilon, epsilon_high, beta, ref_log_probs, loss_type)
    _checks.check_type("kl_correction", kl_correction, bool, "True or False")
    _check_loss_tensors(log_probs, old_log_probs, advantages, mask, ref_log_probs)
    advantages = advantages.detach().unsqueeze(1)                               # (B, 1)
    ratio = torch.exp(log_probs - old_log_probs.detach())                       # (B, T)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if ref_log_probs is not None:
        diff = ref_log_probs.detach() - log_probs
        kl = torch.exp(diff) - diff - 1                                         # k3, >= 0
    if beta != 0.0:
        per_token = per_token + beta * (kl * ratio if kl_correction else kl)
    weights = mask.to(per_token.dtype)
    if loss_type == "grpo":
        loss = ((per_token * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)).mean()
    elif loss_type in ("bnpo", "dapo"):
        loss = (per_token * weights).sum() / weights.sum()
    else:                                                                       # dr_grpo
        loss = (per_token * weights).sum() / (per_token.shape[0] * per_token.shape[1])
    with torch.no_grad():
        outside = ((ratio < 1 - low) & (advantages < 0)) | ((ratio > 1 + high) & (advantages > 0))
        count = weights.sum()
        terms = {"loss": loss, "clip_fraction": (outside * weights).sum() / count}
        if kl is not None:
            terms["kl"] = (kl * weights).sum() / count
    return terms


def _check_loss_options(epsilon: object, epsilon_high: object, beta: object,
                        ref_log_probs: object, loss_type: object) -> tuple[float, float, float]:
    low = _checks.check_number("epsilon", epsilon, positive=True)
    high = low if epsilon_high is None else _checks.check_number("epsilon_high", epsilon_high,
                                                                 positive=True)
    beta = _checks.check_number("beta", beta, low=0.0)
    if beta > 0 and ref_log_probs is None:
        raise ValueError(f"beta={beta!r} weights a KL term to the reference: pass its "
                         f"ref_log_probs")
    _checks.check_choice("loss_type", loss_type, LOSS_TYPES)
    return low, high, beta


def _check_loss_tensors(log_probs: object, old_log_probs: object, advantages: object,
                        mask: object, ref_log_probs: object) -> None:
    _checks.check_float_tensor("log_probs", log_probs, ndim=2)
    named = {"old_log_probs": old_log_probs}
    if ref_log_probs is not None:
        named["ref_log_probs"] = ref_log_probs
    for name, value in named.items():
        _checks.check_float_tensor(name, value, ndim=2)
        if value.shape != log_probs.shape:
            raise ValueError(f"{name} must have the shape of log_probs "
                             f"{_checks.shape(log_probs)}, got {_checks.shape(value)}")
    _checks.check_float_tensor("advantages", advantages, ndim=1)
    if advantages.shape[0] != log_probs.shape[0]:
        raise ValueError(f"advantages must hold one value per completion, "
                         f"{log_probs.shape[0]}, got {_checks.shape(advantages)}")
    _checks.check_same_dtype(log_probs=log_probs, advantages=advantages, **named)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor (True = a completion token), got "
                        f"{_checks._type_name(mask)}")
    if mask.shape != log_probs.shape:
        raise ValueError(f"mask must have the shape of log_probs {_checks.shape(log_probs)}, "
                         f"got {_checks.shape(mask)}")
    if not mask.any():
        raise ValueError("mask is False everywhere: there is no completion token to learn from")
    if not torch.isfinite(advantages).all():
        raise ValueError("advantages must be finite numbers, got NaN or inf")
    for name, value in {"log_probs": log_probs, **named}.items():
        if not torch.isfinite(value.detach()[mask]).all():
            raise ValueError(f"{name} must be finite on the completion tokens, got NaN or inf")


def sample_group(model: nn.Module, prompt_ids: Sequence[Sequence[int]] | Tensor,
                 group_size: int, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
                 generator: torch.Generator | None = None) -> list[list[int]]:
    """``group_size`` sampled completions of each prompt, in one batched, cached
    :func:`~minitransformer.generation.generate` call: each prompt is repeated ``G`` times and
    the model runs once per step for all the rows, not ``G`` times.

    ``generate`` takes rows of one length (no padding), so prompts of different lengths go in
    one call per length.

    Args:
        prompt_ids: the prompts' token ids, a list of lists or a ``(B, T)`` tensor.
        group_size: ``G``, the completions per prompt.
        max_new_tokens, temperature, top_k, top_p, eos_id, generator: as for ``generate``.

    Returns:
        ``B * G`` lists of new token ids, group after group (the ``G`` completions of prompt 0,
        then of prompt 1, ...), each cut after its first ``eos_id`` (which it keeps).

    Raises:
        TypeError, ValueError: prompts that are not lists of token ids, an empty prompt or
            none, a ``group_size`` below 1; what ``generate`` refuses.
    """
    prompts = _check_prompts(prompt_ids)
    group_size = _checks.check_int("group_size", group_size)
    weight = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
    device = None if weight is None else weight.device
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    completions: list[list[int]] = [[] for _ in range(len(prompts) * group_size)]
    for length, which in by_length.items():
        idx = torch.tensor([prompts[i] for i in which], dtype=torch.long, device=device)
        idx = idx.repeat_interleave(group_size, dim=0)                          # (n G, T)
        new = generate(model, idx, max_new_tokens, temperature=temperature, top_k=top_k,
                       top_p=top_p, eos_id=eos_id, generator=generator)[:, length:].tolist()
        for row, ids in enumerate(new):
            prompt, g = which[row // group_size], row % group_size
            completions[prompt * group_size + g] = _cut(ids, eos_id)
    return completions


def _cut(ids: list[int], eos_id: int | None) -> list[int]:
    """``ids`` up to and including the first ``eos_id``."""
    return ids[: ids.index(eos_id) + 1] if eos_id is not None and eos_id in ids else ids


def _check_prompts(prompt_ids: object) -> list[list[int]]:
    if isinstance(prompt_ids, Tensor):
        _checks.check_int_tensor("prompt_ids", prompt_ids, ndim=2)
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise TypeError(f"prompt_ids must be a list of prompts (lists of token ids) or a "
                        f"(B, T) tensor, got {_checks._type_name(prompt_ids)}")
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: there is no prompt to sample from")
    prompts = []
    for i, prompt in enumerate(prompt_ids):
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise TypeError(f"prompt_ids[{i}] must be a list of token ids, got "
                            f"{_checks._type_name(prompt)}")
        if not prompt:
            raise ValueError(f"prompt_ids[{i}] is empty: a prompt needs at least one token")
        for token in prompt:
            _checks.check_int(f"a token of prompt_ids[{i}]", token, low=0)
        prompts.append([int(t) for t in prompt])
    return prompts


def completion_batch(prompt_ids: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                     *, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """A batch for the log-probabilities of the completions: each row is a prompt followed by
    one of its completions (``len(completions) / len(prompt_ids)`` per prompt, group after
    group), without its last token; ``targets`` is the next token on completion positions and
    -100 on the prompt and the padding (padded on the right, which a causal model never sees).

    Returns:
        ``(idx, targets)``, both ``(B G, T)`` int64.
    """
    prompts = _check_prompts(prompt_ids)
    if not isinstance(completions, Sequence) or len(completions) % len(prompts):
        raise ValueError(f"completions must hold the same number of completions for each of "
                         f"the {len(prompts)} prompts, got {_checks._type_name(completions)}")
    group_size = len(completions) // len(prompts)
    rows = []
    for k, completion in enumerate(completions):
        if not completion:
            raise ValueError(f"completions[{k}] is empty: there is no token to score")
        for token in completion:
            _checks.check_int(f"a token of completions[{k}]", token, low=0)
        prompt = prompts[k // group_size]
        ids = [*prompt, *completion]
        labels = [IGNORE_INDEX] * len(prompt) + list(completion)
        rows.append((ids[:-1], labels[1:]))
    length = max(len(ids) for ids, _ in rows)
    idx = torch.tensor([ids + [0] * (length - len(ids)) for ids, _ in rows], device=device)
    targets = torch.tensor([t + [IGNORE_INDEX] * (length - len(t)) for _, t in rows],
                           device=device)
    return idx, targets


def completion_log_probs(model: nn.Module, idx: Tensor, targets: Tensor, *,
                         temperature: float = 1.0) -> Tensor:
    """``(B, T)`` log-probabilities of the completion tokens under ``model``'s scores divided
    by ``temperature`` (those the sampler drew from, as TRL computes them), 0 elsewhere."""
    logits = model(idx)[0]
    if temperature != 1.0:
        logits = logits / temperature
    return per_token_log_probs(logits, targets)


def policy_gradient_loss(log_probs: Tensor, rewards: Tensor, *,
                         baseline: float | Tensor | None = None) -> Tensor:
    """The plain policy-gradient (REINFORCE) loss of each token, ``-A · log π(y_t)`` with
    ``A = reward - baseline`` (``A = reward`` without one): its gradient is REINFORCE's
    estimate of the expected reward's, with a minus sign. Average it with
    :func:`~minitransformer.sft.masked_mean` over the reply's tokens.

    Args:
        log_probs: ``(B, T)`` the policy's log-probabilities of the sampled tokens.
        rewards: ``(B,)`` one reward per reply.
        baseline: a number or ``(B,)`` subtracted from the rewards (a group's mean reward,
            say); it leaves the expected gradient unchanged and lowers its variance.

    Returns:
        ``(B, T)``: ``-(rewards - baseline)[:, None] * log_probs``.
    """
    _checks.check_float_tensor("log_probs", log_probs, ndim=2)
    _checks.check_float_tensor("rewards", rewards, ndim=1)
    if rewards.shape[0] != log_probs.shape[0]:
        raise ValueError(f"rewards must hold one value per reply, {log_probs.shape[0]}, got "
                         f"{_checks.shape(rewards)}")
    advantages = rewards.detach()
    if baseline is not None:
        if isinstance(baseline, Tensor):
            _checks.check_float_tensor("baseline", baseline)
            if baseline.ndim and baseline.shape != rewards.shape:
                raise ValueError(f"baseline must be a number or one value per reply "
                                 f"{_checks.shape(rewards)}, got {_checks.shape(baseline)}")
            baseline = baseline.detach()
        else:
            baseline = _checks.check_number("baseline", baseline)
        advantages = advantages - baseline
    return -advantages.unsqueeze(-1) * log_probs


@dataclass
class Rollout:
    """One round's sampled replies, scored, as :class:`GRPO` learns from them: ``(idx,
    targets)`` from :func:`completion_batch`, ``mask`` True on the replies' tokens, each
    reply's ``advantage``, the reference's log-probabilities (or None), the rewards and the
    replies. ``old_log_probs`` are the policy's when it sampled them, filled in by the first
    forward."""

    idx: Tensor
    targets: Tensor
    mask: Tensor
    advantages: Tensor
    ref_log_probs: Tensor | None
    rewards: Tensor
    completions: list[list[int]]
    group_size: int
    old_log_probs: Tensor | None = None

    def stats(self) -> dict[str, float]:
        """The mean reward, the mean spread of the rewards within a group and the mean reply
        length; and, where a reward returned None, how many replies it could not score (left
        out of the means)."""
        unscored = int(torch.isnan(self.rewards).sum())
        groups = self.rewards.view(-1, self.group_size)
        spread = _nan_std(groups).nanmean() if unscored else groups.std(dim=1).mean()
        stats = {"reward": (self.rewards.nanmean() if unscored else self.rewards.mean()).item(),
                 "reward_std": spread.item(),
                 "length": sum(map(len, self.completions)) / len(self.completions)}
        if unscored:
            stats["unscored"] = unscored
        return stats


class GRPO(nn.Module):
    """A policy and GRPO's loss as one module whose ``forward(rollout)`` returns ``(policy
    logits, loss)``, as a model does, so that chapter 9's
    :class:`~minitransformer.training.TrainingLoop` trains it as it trains SFT and DPO.
    :meth:`rollout` samples and scores a round of replies. ``ref_model``, if given, is only
    read (under ``torch.no_grad``). ``metrics`` holds the last forward's ``loss``,
    ``clip_fraction`` and (with ``ref_model``) ``kl``. Dropout stays off, as in
    :class:`~minitransformer.preferences.DPO` and TRL."""

    def __init__(self, policy: nn.Module, ref_model: nn.Module | None = None, *,
                 beta: float = 0.0, epsilon: float = 0.2, loss_type: str = "grpo",
                 kl_correction: bool = False, temperature: float = 1.0) -> None:
        super().__init__()
        _checks.check_type("policy", policy, nn.Module, "an nn.Module")
        if ref_model is not None:
            _checks.check_type("ref_model", ref_model, nn.Module, "an nn.Module")
        if beta and ref_model is None:
            raise ValueError(f"beta={beta!r} needs a ref_model to compare the policy with")
        _check_loss_options(epsilon, None, beta, 0.0 if ref_model is not None else None,
                            loss_type)
        _checks.check_type("kl_correction", kl_correction, bool, "True or False")
        if _checks.check_number("temperature", temperature) <= 0:
            raise ValueError(f"temperature must be positive, got {temperature!r}: GRPO learns "
                             f"from sampled replies and scores them at that temperature (0 "
                             f"would be greedy: every reply of a group the same, nothing to "
                             f"compare)")
        self.policy, self.ref_model = policy, ref_model
        self.options = {"epsilon": epsilon, "beta": beta, "loss_type": loss_type,
                        "kl_correction": kl_correction}
        self.temperature = temperature
        self.metrics: dict[str, float] = {}

    def train(self, mode: bool = True) -> GRPO:
        return super().train(False)

    def rollout(self, prompt_ids: Sequence[Sequence[int]],
                reward: Callable[[list[list[int]]], Sequence[float]], *, group_size: int,
                max_new_tokens: int, eos_id: int | None = None, top_k: int | None = None,
                advantage: str = "group", generator: torch.Generator | None = None) -> Rollout:
        """Sample ``group_size`` replies to each prompt, score them with ``reward`` and
        compare each with its group (:func:`grpo_step` says how)."""
        _checks.check_choice("advantage", advantage, ADVANTAGES)
        _checks.check_int("group_size", group_size, low=2)
        _checks.check_int("max_new_tokens", max_new_tokens)
        if not callable(reward):
            raise TypeError(f"reward must be a function of the completions, got "
                            f"{_checks._type_name(reward)}")
        completions = sample_group(self.policy, prompt_ids, group_size, max_new_tokens,
                                   temperature=self.temperature, top_k=top_k, eos_id=eos_id,
                                   generator=generator)
        rewards = _rewards(reward(completions), len(completions), self.policy)
        advantages = _advantages(rewards, group_size, advantage)
        idx, targets = completion_batch(prompt_ids, completions, device=rewards.device)
        with torch.no_grad():
            ref = (None if self.ref_model is None else
                   completion_log_probs(self.ref_model, idx, targets,
                                        temperature=self.temperature))
        return Rollout(idx, targets, targets != IGNORE_INDEX, advantages, ref, rewards,
                       completions, group_size)

    def forward(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """``(policy logits, loss)``: :func:`grpo_loss` of the policy's log-probabilities of
        the rollout's replies, against those it had when it sampled them."""
        _checks.check_type("rollout", rollout, Rollout, "a Rollout (GRPO.rollout)")
        logits = self.policy(rollout.idx)[0]
        if self.temperature != 1.0:
            logits = logits / self.temperature
        log_probs = per_token_log_probs(logits, rollout.targets)
        if rollout.old_log_probs is None:        # the policy that sampled them
            rollout.old_log_probs = log_probs.detach()
        o = self.options
        terms = _grpo_terms(log_probs, rollout.old_log_probs,
                            rollout.advantages.to(log_probs.dtype), rollout.mask,
                            epsilon=o["epsilon"], epsilon_high=None, beta=o["beta"],
                            ref_log_probs=rollout.ref_log_probs, loss_type=o["loss_type"],
                            kl_correction=o["kl_correction"])
        self.metrics = {k: v.item() for k, v in terms.items()}
        return logits, terms["loss"]


def _check_optimizer(model: nn.Module, optimizer: object) -> None:
    _checks.check_type("optimizer", optimizer, torch.optim.Optimizer, "a torch.optim.Optimizer")
    mine = {id(p) for p in model.parameters() if p.requires_grad}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(id(p) in mine for p in held):
        raise ValueError("the optimizer holds none of the model's trainable parameters (is it "
                         "another model's?): a step would change nothing")


def grpo_step(model: nn.Module, optimizer: torch.optim.Optimizer,
              prompt_ids: Sequence[Sequence[int]],
              reward: Callable[[list[list[int]]], Sequence[float]], *, group_size: int,
              max_new_tokens: int, eos_id: int | None = None, ref_model: nn.Module | None = None,
              beta: float = 0.0, epsilon: float = 0.2, loss_type: str = "grpo",
              kl_correction: bool = False, num_iterations: int = 1, temperature: float = 1.0,
              top_k: int | None = None, advantage: str = "group",
              generator: torch.Generator | None = None) -> dict[str, float]:
    """One round of GRPO, on-policy: sample ``G`` completions per prompt, score them, compare
    each with its group, and take ``num_iterations`` optimizer steps on the clipped loss
    (:class:`GRPO`'s :meth:`~GRPO.rollout` and forward).

    ``reward(completions)`` gets the ``B * G`` completions' token ids (group after group) and
    returns one number each, or None for one it cannot score (TRL's convention: it is left out
    of its group's mean and spread, and its advantage is 0). ``advantage`` says how rewards
    become advantages: ``"group"`` (GRPO), ``"group_mean"`` (the group's mean subtracted, not
    divided by its spread), ``"batch"`` (normalised over the whole batch instead of each
    group) or ``"raw"`` (the rewards themselves), to show what the group does.

    With ``ref_model``, the KL estimate to it is measured (``"kl"``), and with ``beta > 0``
    it is in the loss too.

    Returns:
        ``{"loss", "reward", "reward_std", "length", "clip_fraction"}`` (and ``"kl"`` with a
        reference model): the first iteration's loss, the mean reward, the mean spread of the
        rewards within a group, the mean completion length and the share of clipped tokens
        in the last iteration, as Python floats.

    Raises:
        TypeError, ValueError: bad options, a reward that is not one number per completion,
            an optimizer that holds none of ``model``'s trainable parameters.
    """
    _checks.check_type("model", model, nn.Module, "an nn.Module")
    _check_optimizer(model, optimizer)
    num_iterations = _checks.check_int("num_iterations", num_iterations)
    objective = GRPO(model, ref_model, beta=beta, epsilon=epsilon, loss_type=loss_type,
                     kl_correction=kl_correction, temperature=temperature)
    rollout = objective.rollout(prompt_ids, reward, group_size=group_size,
                                max_new_tokens=max_new_tokens, eos_id=eos_id, top_k=top_k,
                                advantage=advantage, generator=generator)
    first = None
    for _ in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        objective(rollout)[1].backward()
        optimizer.step()
        first = objective.metrics["loss"] if first is None else first
    return _round_stats(first, rollout, objective.metrics)


def _round_stats(first_loss: float, rollout: Rollout, metrics: dict[str, float]
                 ) -> dict[str, float]:
    stats = {"loss": first_loss, **rollout.stats(), "clip_fraction": metrics["clip_fraction"]}
    if "kl" in metrics:
        stats["kl"] = metrics["kl"]
    return stats


def _rewards(values: object, count: int, model: nn.Module) -> Tensor:
    """The rewards as a float32 tensor; None (a completion the reward cannot score, TRL's
    convention) becomes NaN, which :func:`_advantages` leaves out."""
    device = next(iter(model.parameters())).device
    if isinstance(values, Tensor):
        values = values.detach().reshape(-1).tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"reward must return one number per completion, got "
                        f"{_checks._type_name(values)}")
    if len(values) != count:
        raise ValueError(f"reward returned {len(values)} numbers for {count} completions")
    for i, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"reward returned {_checks._type_name(value)} ({value!r}) at "
                            f"index {i}: a reward is a number")
        if not math.isfinite(value):
            raise ValueError(f"rewards[{i}] is {value}: every reward must be a finite number "
                             f"(None marks a completion that cannot be scored)")
    return torch.tensor([math.nan if v is None else float(v) for v in values],
                        dtype=torch.float32, device=device)


def _advantages(rewards: Tensor, group_size: int, advantage: str) -> Tensor:
    if torch.isnan(rewards).any():
        return _advantages_scored(rewards, group_size, advantage)
    if advantage in ("group", "group_mean"):
        return group_advantages(rewards, group_size, normalize=advantage == "group")
    _check_rewards(rewards, group_size)
    if advantage == "batch":
        return (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    return rewards


def _advantages_scored(rewards: Tensor, group_size: int, advantage: str) -> Tensor:
    """:func:`_advantages` where some rewards are NaN (None: unscorable), as TRL: the means
    and spreads are of the scored rewards only, and an unscorable completion's advantage is 0
    (so is a scored one alone in its group, whose spread is undefined)."""
    _check_rewards(torch.nan_to_num(rewards), group_size)
    if advantage == "raw":
        return torch.nan_to_num(rewards, nan=0.0)
    rows = rewards.view(-1, group_size) if advantage != "batch" else rewards.view(1, -1)
    centred = rows - rows.nanmean(dim=1, keepdim=True)
    if advantage != "group_mean":
        centred = centred / (_nan_std(rows) + 1e-4)
    return torch.nan_to_num(centred.reshape(-1), nan=0.0)


def _nan_std(rows: Tensor) -> Tensor:
    """Each row's sample standard deviation, NaN left out (TRL's ``nanstd``); NaN for a row
    with fewer than two numbers."""
    count = (~torch.isnan(rows)).sum(dim=1, keepdim=True)
    squares = ((rows - rows.nanmean(dim=1, keepdim=True)) ** 2).nansum(dim=1, keepdim=True)
    return (squares / (count - 1)).sqrt()


def chat_prompts(tokenizer: object, rows: Sequence[Mapping[str, object]]) -> list[list[int]]:
    """The token ids of each row's ``"prompt"`` (a list of messages, TRL's conversational
    form) in chapter 16's chat format, ending with ``<|assistant|>`` for the model to answer."""
    from minitransformer.chat import apply_chat_template

    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of rows with a 'prompt', got "
                        f"{_checks._type_name(rows)}")
    if not rows:
        raise ValueError("rows is empty: there is no prompt")
    ids = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "prompt" not in row:
            raise ValueError(f"rows[{i}] must be a dict with a 'prompt' (a list of messages), "
                             f"got {_checks._type_name(row)}")
        try:
            ids.append(apply_chat_template(tokenizer, row["prompt"], add_generation_prompt=True))
        except (TypeError, ValueError) as error:
            raise type(error)(f"rows[{i}]['prompt']: {error}") from None
    return ids


def chat_replies(tokenizer: object, completions: Sequence[Sequence[int]]) -> list[str]:
    """The text of each completion, without the end-of-turn token that closes it."""
    from minitransformer.chat import end_of_turn_id

    end = end_of_turn_id(tokenizer)
    return [tokenizer.decode([t for t in ids if t != end]) for ids in completions]


def chat_rewards(tokenizer: object, rows: Sequence[Mapping[str, object]],
                 reward_funcs: Callable | Sequence[Callable], group_size: int
                 ) -> Callable[[list[list[int]]], list[float]]:
    """A ``reward`` for :func:`grpo_step`: it decodes the completions and calls each reward
    function as TRL's ``GRPOTrainer`` does, ``f(prompts=..., completions=..., **columns)``
    with every other column of the rows repeated ``group_size`` times; the sum is the reward."""
    funcs = _check_reward_funcs(reward_funcs)
    chat_prompts(tokenizer, rows)                                   # the rows are checked
    repeat = [row for row in rows for _ in range(group_size)]
    columns = {key: [row[key] for row in repeat] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in repeat]

    def reward(completions: list[list[int]]) -> list[float]:
        texts = chat_replies(tokenizer, completions)
        totals = [0.0] * len(texts)
        for f in funcs:
            values = f(prompts=prompts, completions=texts, **columns)
            name = getattr(f, "__name__", type(f).__name__)
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) \
                    or len(values) != len(texts):
                raise ValueError(f"reward function {name} must return one number for each of "
                                 f"the {len(texts)} completions, got {_checks._type_name(values)}"
                                 f"{f' of {len(values)}' if isinstance(values, Sequence) else ''}")
            for i, value in enumerate(values):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"reward function {name} returned "
                                    f"{_checks._type_name(value)} ({value!r}) at index {i}: "
                                    f"a reward is a number")
            totals = [t + float(v) for t, v in zip(totals, values)]
        return totals

    return reward


def _check_reward_funcs(reward_funcs: object) -> list[Callable]:
    funcs = [reward_funcs] if callable(reward_funcs) else reward_funcs
    if isinstance(funcs, (str, bytes)) or not isinstance(funcs, Sequence) or not funcs:
        raise TypeError(f"reward_funcs must be a reward function or a list of them, got "
                        f"{_checks._type_name(reward_funcs)}")
    for f in funcs:
        if not callable(f):
            raise TypeError(f"reward_funcs must be functions, got {_checks._type_name(f)}")
    return list(funcs)


def mean_reward(model: nn.Module, tokenizer: object, rows: Sequence[Mapping[str, object]],
                reward_func: Callable, *, max_new_tokens: int, temperature: float = 0.0,
                samples: int = 1, generator: torch.Generator | None = None) -> float:
    """The mean reward of the model's replies to ``rows``' prompts: greedy by default (with
    :func:`~minitransformer.data.reward_exact`, the held-out accuracy), or ``samples`` replies
    each drawn at ``temperature`` (the accuracy of a sampled reply)."""
    from minitransformer.chat import end_of_turn_id

    end = end_of_turn_id(tokenizer)
    ids = chat_prompts(tokenizer, rows)
    completions = sample_group(model, ids, samples, max_new_tokens, temperature=temperature,
                               eos_id=end, generator=generator)
    values = chat_rewards(tokenizer, rows, reward_func, samples)(completions)
    return sum(values) / len(values)


def grpo_train(model: nn.Module, tokenizer: object, rows: Sequence[Mapping[str, object]],
               reward_funcs: Callable | Sequence[Callable], *, steps: int, batch_size: int,
               group_size: int, lr: float, max_new_tokens: int, seed: int = 0,
               ref_model: nn.Module | None = None, beta: float = 0.0, epsilon: float = 0.2,
               loss_type: str = "grpo", kl_correction: bool = False, num_iterations: int = 1,
               temperature: float = 1.0, advantage: str = "group",
               eval_rows: Sequence[Mapping[str, object]] | None = None,
               eval_reward: Callable | None = None, eval_every: int = 10,
               schedule: str | None = None, warmup_steps: int = 0,
               max_grad_norm: float | None = None) -> list[dict[str, float]]:
    """GRPO on chapter 16's chat format, with TRL-style rows and reward functions: ``steps``
    rounds of :func:`grpo_step` on ``batch_size`` prompts drawn in turn from ``rows`` (shuffled
    once with ``seed``), with AdamW at learning rate ``lr`` (no weight decay), in chapter 9's
    :class:`~minitransformer.training.TrainingLoop` (each of a round's ``num_iterations``
    updates is one of its steps), as SFT and DPO are trained.

    By default the rate is constant and the gradient is not clipped; ``schedule`` (a name in
    ``training.SCHEDULES``, with ``warmup_steps``) and ``max_grad_norm``
    turn them on, as TRL's ``GRPOTrainer`` has them.

    With ``eval_rows``, every ``eval_every`` steps (and before the first and after the last)
    the history records ``"held_out"``: the ``mean_reward`` of the greedy replies under
    ``eval_reward`` (default: the first reward function).

    Returns:
        one dict per step, :func:`grpo_step`'s with ``"step"`` (and ``"held_out"``), after
        ``{"step": 0, "held_out": ...}`` with ``eval_rows``.
    """
    from minitransformer.chat import end_of_turn_id
    from minitransformer.training import SCHEDULES, TrainingLoop

    _checks.check_int("steps", steps)
    _checks.check_int("batch_size", batch_size)
    _checks.check_int("eval_every", eval_every)
    _checks.check_number("lr", lr, positive=True)
    num_iterations = _checks.check_int("num_iterations", num_iterations)
    updates = steps * num_iterations
    if schedule is not None:
        _checks.check_choice("schedule", schedule, SCHEDULES)
    warmup_steps = _checks.check_int("warmup_steps", warmup_steps, low=0)
    if warmup_steps > updates:
        raise ValueError(f"warmup_steps={warmup_steps} is more than the {updates} updates")
    clip = math.inf if max_grad_norm is None else _checks.check_number(
        "max_grad_norm", max_grad_norm, positive=True)
    if not rows:
        raise ValueError("rows is empty: there is no prompt to learn from")
    eos = end_of_turn_id(tokenizer)
    funcs = _check_reward_funcs(reward_funcs)
    scorer = eval_reward or funcs[0]
    objective = GRPO(model, ref_model, beta=beta, epsilon=epsilon, loss_type=loss_type,
                     kl_correction=kl_correction, temperature=temperature)
    _checks.check_choice("advantage", advantage, ADVANTAGES)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    device = next(iter(model.parameters())).device
    generator = torch.Generator(device=device).manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    loop = TrainingLoop(objective, optimizer, steps=updates, lr=lr, warmup_steps=warmup_steps,
                        max_grad_norm=clip, eval_every=num_iterations,
                        schedule=_constant if schedule is None else schedule)
    history: list[dict[str, float]] = []
    rollouts: list[Rollout] = []

    def held_out() -> float:
        return mean_reward(model, tokenizer, eval_rows, scorer, max_new_tokens=max_new_tokens)

    def stream() -> Iterator[tuple[Rollout]]:
        for step in itertools.count(1):
            first = (step - 1) * batch_size
            batch = [rows[order[(first + k) % len(rows)]] for k in range(batch_size)]
            rollouts.append(objective.rollout(
                chat_prompts(tokenizer, batch), chat_rewards(tokenizer, batch, funcs, group_size),
                group_size=group_size, max_new_tokens=max_new_tokens, eos_id=eos,
                advantage=advantage, generator=generator))
            for _ in range(num_iterations):
                yield (rollouts[-1],)

    first_loss = 0.0

    def after_step(loop: TrainingLoop) -> None:
        nonlocal first_loss
        if (loop.step - 1) % num_iterations == 0:
            first_loss = objective.metrics["loss"]
        if loop.step % num_iterations:
            return
        step = loop.step // num_iterations
        stats = _round_stats(first_loss, rollouts.pop(), objective.metrics)
        stats["step"] = step
        if eval_rows and (step % eval_every == 0 or step == steps):
            stats["held_out"] = held_out()
        history.append(stats)

    if eval_rows:
        history.append({"step": 0, "held_out": held_out()})
    loop.run(stream(), after_step=after_step)
    return history


def _constant(step: int, *, steps: int, lr: float, warmup_steps: int) -> float:
    """A constant rate after a linear warm-up (TRL's ``lr_scheduler_type="constant"``)."""
    return lr * (step + 1) / warmup_steps if step < warmup_steps else lr
