"""Checkers for the exercises of chapter 17, *Learning from preferences and rewards*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_sequence_log_probs` -- ``my_sequence_log_probs(logits, ids, response_mask)``:
  for each sequence, the sum of its response tokens' log-probabilities,
  ``log_softmax(logits[:, t - 1])[ids[:, t]]`` over the positions ``t`` where
  ``response_mask`` is True (the prompt and the padding are False).
* :data:`check_dpo_loss` -- ``my_dpo_loss(policy_chosen, policy_rejected, ref_chosen,
  ref_rejected, beta)``: the mean over the pairs of
  ``-log sigmoid(beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)))``.
* :data:`check_group_advantages` -- ``my_group_advantages(rewards, group_size)``: rewards laid
  out group after group; each minus its group's mean, divided by its group's standard deviation
  (``torch.std``'s default, with Bessel's correction, as TRL) plus ``1e-4``.
* :data:`check_clipped_loss` -- ``my_clipped_loss(log_probs, old_log_probs, advantages, mask,
  epsilon)``: minus the clipped objective ``min(rho A, clip(rho, 1 - eps, 1 + eps) A)``, with
  ``rho = exp(log_probs - old_log_probs)``, averaged over all the response tokens of the batch
  (TRL's default ``loss_type="dapo"`` on one process).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_clipped_loss", "check_dpo_loss", "check_group_advantages",
           "check_sequence_log_probs"]

EPS = 1e-4


# --- my_sequence_log_probs(logits, ids, response_mask) -----------------------------------------

def _token_log_probs(logits: Tensor, ids: Tensor) -> Tensor:
    """(B, T - 1): entry t is the log-probability of token t + 1 given the tokens up to t."""
    log_probs = logits[:, :-1].log_softmax(-1)
    return log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _sequence_log_probs(logits: Tensor, ids: Tensor, response_mask: Tensor) -> Tensor:
    return (_token_log_probs(logits, ids) * response_mask[:, 1:]).sum(-1)


def _log_prob_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(17)
    cases = []
    # (prompt length, response length) per row; the rest of each row is padding. A row of
    # cases 2 and 3 has no prompt: its first token, which nothing predicts, is left out
    for length, vocab, rows in ((6, 7, [(2, 3), (3, 3)]),
                                (8, 9, [(3, 5), (0, 3), (4, 2)]),
                                (7, 11, [(4, 3), (0, 3)])):
        ids = torch.randint(vocab, (len(rows), length), generator=generator)
        response_mask = torch.zeros(len(rows), length, dtype=torch.bool)
        for row, (prompt, response) in enumerate(rows):
            response_mask[row, prompt:prompt + response] = True
        logits = 2 * torch.randn(len(rows), length, vocab, generator=generator)
        cases.append((logits, ids, response_mask))
    return cases


def _masked(per_token, mask):
    return (per_token * mask).sum(-1)


check_sequence_log_probs = Checker(
    reference=_sequence_log_probs,
    cases=_log_prob_cases(),
    mistakes={
        "shift: the logits at position t - 1 give the probability of token t, so score "
        "logits[:, :-1] on ids[:, 1:] (and mask with response_mask[:, 1:]); without the shift "
        "each token is scored by the logits that already saw it":
            lambda logits, ids, m: _masked(
                logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1), m),
        "the shift goes the other way: logits[:, :-1] (every position but the last) scores "
        "ids[:, 1:] (every token but the first)": lambda logits, ids, m: _masked(
            logits[:, 1:].log_softmax(-1).gather(-1, ids[:, :-1].unsqueeze(-1)).squeeze(-1),
            m[:, :-1]),
        "count only the response's tokens (where response_mask is True): summed over the "
        "prompt (and the padding) too, the number scores the question as well as the answer, "
        "and the prompt's tokens, the same in the chosen and the rejected answer, are not what "
        "a preference is about": lambda logits, ids, m: _token_log_probs(logits, ids).sum(-1),
        "the mask goes with the token it scores: entry t of the shifted log-probabilities is "
        "token t + 1's, so mask it with response_mask[:, 1:], not response_mask[:, :-1]":
            lambda logits, ids, m: _masked(_token_log_probs(logits, ids), m[:, :-1]),
        "the sum, not the mean: a sequence's log-probability is the sum of its tokens' (the "
        "log of the product of their probabilities), as DPO and TRL use it":
            lambda logits, ids, m: _masked(_token_log_probs(logits, ids), m[:, 1:])
            / m[:, 1:].sum(-1),
        "a sequence's log-probability is the sum of its tokens', not their mean (divided by "
        "the response's length)": lambda logits, ids, m: _masked(
            _token_log_probs(logits, ids), m[:, 1:]) / m.sum(-1),
        "shift the logits against the ids: the logits at position t - 1 score token t, so "
        "logits[:, :-1] against ids[:, 1:]; masking with response_mask[:, 1:] alone scores "
        "each token by the logits that already saw it": lambda logits, ids, m: _masked(
            logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)[:, 1:], m[:, 1:]),
        "take log_softmax of the logits first: logits are not log-probabilities until they "
        "are normalised over the vocabulary": lambda logits, ids, m: _masked(
            logits[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1), m[:, 1:]),
        "log-probabilities, not probabilities: log_softmax, not softmax (the log of a "
        "product of probabilities is the sum of their logs)": lambda logits, ids, m: _masked(
            logits[:, :-1].softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1),
            m[:, 1:]),
        "log_softmax over the vocabulary, dim=-1 (the last axis), not over the positions":
            lambda logits, ids, m: _masked(
                logits[:, :-1].log_softmax(1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1),
                m[:, 1:]),
        "gather the log-probability of the token that is there (ids), not the largest one "
        "(that is the greedy choice's, whatever the text says)":
            lambda logits, ids, m: _masked(logits[:, :-1].log_softmax(-1).amax(-1), m[:, 1:]),
        "one number per sequence, shape (B,): sum over the positions (dim=-1), not over the "
        "whole batch": lambda logits, ids, m: _sequence_log_probs(logits, ids, m).sum(),
        "one number per sequence, shape (B,): sum each row over its positions (dim=-1)":
            lambda logits, ids, m: _token_log_probs(logits, ids) * m[:, 1:],
        "slice, do not roll: torch.roll wraps around, so the last position's logits score "
        "the first token, which has no logits before it; take logits[:, :-1] against "
        "ids[:, 1:]": lambda logits, ids, m: _masked(logits.log_softmax(-1).gather(
            -1, ids.roll(-1, dims=1).unsqueeze(-1)).squeeze(-1), m.roll(-1, dims=1)),
        "a sequence's log-probability is the sum of its tokens' log-probabilities (the log of "
        "the product of their probabilities), not the log of the sum of their probabilities":
            lambda logits, ids, m: torch.log(_masked(logits[:, :-1].softmax(-1).gather(
                -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1), m[:, 1:])),
        "the first response token counts too: it is scored by the last prompt position's "
        "logits, so mask with response_mask[:, 1:] alone, not also with response_mask[:, :-1]":
            lambda logits, ids, m: _masked(_token_log_probs(logits, ids), m[:, 1:] & m[:, :-1]),
        "a log-probability is negative (log p <= 0): cross_entropy gives -log p, so negate "
        "it": lambda logits, ids, m: -_sequence_log_probs(logits, ids, m),
        "one number per sequence, the sum of its response tokens' log-probabilities: not the "
        "mean over every response token of the batch, as cross_entropy gives by default":
            lambda logits, ids, m: (_token_log_probs(logits, ids)[m[:, 1:]]).mean(),
        "one number per sequence, the sum of its response tokens' log-probabilities: "
        "cross_entropy gives -log p, and by default the mean over the batch":
            lambda logits, ids, m: -(_token_log_probs(logits, ids)[m[:, 1:]]).mean(),
    },
    match_every_case=True,
    thorough=True,
    gradients=('logits',),
)


# --- my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) ------------

def _margin(pc: Tensor, pr: Tensor, rc: Tensor, rr: Tensor) -> Tensor:
    return (pc - rc) - (pr - rr)


def _dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor,
              ref_rejected: Tensor, beta: float) -> Tensor:
    margin = _margin(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def _dpo_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(170)
    cases = []
    # beta is never 1 (where beta inside and outside agree); the last case is step 0, where
    # the policy is the reference and the loss is ln 2 whatever the pairs
    for pairs, beta in ((3, 0.1), (4, 0.5), (2, 2.0)):
        chosen, rejected = -(2 + 18 * torch.rand(2, pairs, generator=generator))
        ref_chosen = chosen + torch.randn(pairs, generator=generator)
        ref_rejected = rejected + torch.randn(pairs, generator=generator)
        cases.append((chosen, rejected, ref_chosen, ref_rejected, beta))
    # the first pair of cases 2 and 3: a long chosen answer the policy finds far less likely
    # than the reference does, beta * margin = -150, where sigmoid rounds to 0 in float32
    pc, pr, rc, rr, beta = cases[1]
    pc[0], pr[0], rc[0], rr[0] = -400.0, -30.0, -110.0, -40.0
    pc, pr, rc, rr, beta = cases[2]
    pc[0], pr[0], rc[0], rr[0] = -250.0, -20.0, -180.0, -25.0
    chosen, rejected = -(2 + 18 * torch.rand(2, 3, generator=generator))
    cases.append((chosen, rejected, chosen.clone(), rejected.clone(), 0.3))
    return cases


def _dpo(loss_of_margin, margin=_margin):
    def loss(pc, pr, rc, rr, beta):
        return loss_of_margin(margin(pc, pr, rc, rr), beta)
    return loss


check_dpo_loss = Checker(
    reference=_dpo_loss,
    cases=_dpo_cases(),
    mistakes={
        "the sign is the wrong way round: the loss is -log sigmoid(beta * margin), which is "
        "softplus(-beta * margin) (softplus(beta * margin) is its mirror image), with margin = "
        "(policy - reference) of the chosen answer minus that of the rejected one; swapping "
        "chosen with rejected (or the policy with the reference) flips it too, and trains the "
        "model towards the rejected answers":
            _dpo(lambda m, beta: -F.logsigmoid(-beta * m).mean()),
        "one loss per pair, then the mean: -log sigmoid(beta * margin) of each pair's margin, "
        "not of the margins' mean": _dpo(lambda m, beta: -F.logsigmoid(beta * m.mean())),
        "one sigmoid of the difference, -log sigmoid(beta * (chosen's log-ratio - rejected's)): "
        "two separate terms, one pushing the chosen answer up and one the rejected down, are "
        "another loss": lambda pc, pr, rc, rr, beta: (
            -F.logsigmoid(beta * (pc - rc)) - F.logsigmoid(-beta * (pr - rr))).mean(),
        "log(sigmoid(x)) rounds to log(0) = -inf once x is below about -100 (cases 2 and 3 "
        "have a pair at -150): F.logsigmoid(x), or -F.softplus(-x), computes it without the "
        "round trip": _dpo(lambda m, beta: -torch.log(torch.sigmoid(beta * m)).mean()),
        "keep the reference: each log-probability is compared with the reference model's, "
        "(policy_chosen - ref_chosen) - (policy_rejected - ref_rejected); without it nothing "
        "holds the policy near the model it started from":
            _dpo(lambda m, beta: -F.logsigmoid(beta * m).mean(),
                 lambda pc, pr, rc, rr: pc - pr),
        "subtract the reference's margin, (policy_chosen - policy_rejected) - (ref_chosen - "
        "ref_rejected); adding it counts the reference's preference as the policy's":
            _dpo(lambda m, beta: -F.logsigmoid(beta * m).mean(),
                 lambda pc, pr, rc, rr: (pc - pr) + (rc - rr)),
        "keep the rejected answer's term, - (policy_rejected - ref_rejected): the loss is "
        "about the gap between the two answers, not the chosen one alone":
            _dpo(lambda m, beta: -F.logsigmoid(beta * m).mean(),
                 lambda pc, pr, rc, rr: pc - rc),
        "beta multiplies the margin inside the sigmoid, -log sigmoid(beta * margin), not the "
        "loss outside it": _dpo(lambda m, beta: -beta * F.logsigmoid(m).mean()),
        "multiply the margin by beta: -log sigmoid(beta * margin)":
            _dpo(lambda m, beta: -F.logsigmoid(m).mean()),
        "multiply the margin by beta, do not divide by it: -log sigmoid(beta * margin)":
            _dpo(lambda m, beta: -F.logsigmoid(m / beta).mean()),
        "the mean over the pairs, not the sum": _dpo(lambda m, beta: -F.logsigmoid(
            beta * m).sum()),
        "return one number, the mean over the pairs, not one loss per pair":
            _dpo(lambda m, beta: -F.logsigmoid(beta * m)),
        "the loss is minus the log-sigmoid (a log-likelihood to maximise becomes a loss to "
        "minimise): -log sigmoid(beta * margin)": _dpo(lambda m, beta: F.logsigmoid(
            beta * m).mean()),
        "take the log of the sigmoid: -log sigmoid(beta * margin), not -sigmoid(...), whose "
        "gradient vanishes when the model is most wrong":
            _dpo(lambda m, beta: -torch.sigmoid(beta * m).mean()),
        "take the log of the sigmoid: -log sigmoid(beta * margin), not 1 - sigmoid(...), whose "
        "gradient vanishes when the model is most wrong":
            _dpo(lambda m, beta: (1 - torch.sigmoid(beta * m)).mean()),
        "the margin goes through -log sigmoid: -beta * margin alone never stops pushing, "
        "however far apart the answers already are": _dpo(lambda m, beta: (-beta * m).mean()),
        "that is the hinge loss (TRL's loss_type='hinge'), max(0, 1 - beta * margin); DPO's is "
        "the sigmoid's, -log sigmoid(beta * margin)":
            _dpo(lambda m, beta: torch.relu(1 - beta * m).mean()),
        "these are log-probabilities: the log of a ratio is a difference, policy - reference, "
        "not policy / reference": _dpo(
            lambda m, beta: -F.logsigmoid(beta * m).mean(),
            lambda pc, pr, rc, rr: pc / rc - pr / rr),
    },
    match_every_case=True,
    thorough=True,
    gradients=('policy_chosen', 'policy_rejected'),
)


# --- my_group_advantages(rewards, group_size) ------------------------------------------------

def _group_advantages(rewards: Tensor, group_size: int) -> Tensor:
    grouped = rewards.view(-1, group_size)                       # (N, G): a row per prompt
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + EPS)).view(-1)


def _advantage_cases() -> list[tuple]:
    # each has a group whose rewards are all equal (every answer right, or every one wrong),
    # groups of different means, and more groups than answers per group or fewer
    return [(torch.tensor([1., 0., 0., 1., 1., 1., 1., 1., 0., 0., 1., 0.]), 4),
            (torch.tensor([0.2, 0.9, 0.4, 3.0, 1.0, 2.0, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0]), 3),
            (torch.tensor([0., 1., 1., 1., 0., 1., 2., 2., 2., 2., 2., 2.]), 6),
            (torch.tensor([1., 0., 0., 0., 2., 2., 0., 1.]), 2)]


def _advantages(*, mean=lambda g: g.mean(1, keepdim=True),
                std=lambda g: g.std(1, keepdim=True), eps=EPS, layout="rows",
                centre=True, flat=True, power=1):
    def advantages(rewards, group_size):
        if layout == "rows":
            grouped = rewards.view(-1, group_size)
        elif layout == "G rows":
            grouped = rewards.view(group_size, -1)
        else:                                       # "columns": answer k of every group
            grouped = rewards.view(group_size, -1).T
        centred = grouped - mean(grouped) if centre else grouped
        scale = 1.0 if std is None else std(grouped) ** power + eps
        result = centred / scale
        if layout == "columns":
            result = result.T
        return result.reshape(-1) if flat else result
    return advantages


check_group_advantages = Checker(
    reference=_group_advantages,
    cases=_advantage_cases(),
    mistakes={
        "normalise within each group (the answers to one prompt), not over the whole batch: "
        "an answer is good or bad compared with the other answers to its own prompt, not "
        "with those to an easier or harder one": _advantages(
            mean=lambda g: g.mean(), std=lambda g: g.std()),
        "normalise within each group (the answers to one prompt), not over the whole batch "
        "(your standard deviation is the batch's, without Bessel's correction)":
            _advantages(mean=lambda g: g.mean(), std=lambda g: g.std(correction=0)),
        "subtract each group's own mean and divide by its own standard deviation; the "
        "batch's standard deviation with the group's mean is a variant (TRL's "
        "scale_rewards='batch')": _advantages(std=lambda g: g.std()),
        "the rewards come group after group: rewards.view(-1, group_size) gives a row per "
        "group (view(group_size, -1) cuts the batch into rows of the wrong length)":
            _advantages(layout="G rows"),
        "the rewards come group after group (the G answers to the first prompt, then the G to "
        "the next), not answer after answer: group k is rewards[k * G:(k + 1) * G], a row of "
        "rewards.view(-1, group_size)":
            _advantages(layout="columns"),
        "take the mean and standard deviation along each group, dim=1 of "
        "rewards.view(-1, group_size) (a row per group), not down dim=0 (every G-th reward, "
        "the same answer number to different prompts)":
            _advantages(mean=lambda g: g.mean(0, keepdim=True),
                        std=lambda g: g.std(0, keepdim=True)),
        "use torch's std, with Bessel's correction (dividing by G - 1), as TRL does; "
        "std(correction=0) divides by G": _advantages(
            std=lambda g: g.std(1, keepdim=True, correction=0)),
        "add 1e-4 to the standard deviation: a group whose answers all get the same reward "
        "(all right, or all wrong) has std 0, and 0 / 0 is NaN; its advantages should be 0":
            _advantages(eps=0.0),
        "divide by the group's standard deviation (plus 1e-4): without it the advantages "
        "keep the rewards' scale (a variant, Dr. GRPO's, TRL's scale_rewards='none')":
            _advantages(std=None),
        "subtract the group's mean first: the advantage says how much better than its "
        "group's average an answer did, so some are negative": _advantages(centre=False),
        "divide by the standard deviation, not the variance":
            _advantages(std=lambda g: g.var(1, keepdim=True)),
        "the advantage is reward minus mean, not mean minus reward: a better answer gets a "
        "positive one": lambda rewards, group_size: -_group_advantages(
            rewards, group_size),
        "return one advantage per reward, in the rewards' order and shape (N * G,): flatten "
        "the (N, G) result with .view(-1)": _advantages(flat=False),
    },
    match_every_case=True,
    thorough=True,
)


# --- my_clipped_loss(log_probs, old_log_probs, advantages, mask, epsilon) --------------------

def _clipped_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor,
                  epsilon: float) -> Tensor:
    ratio = torch.exp(log_probs - old_log_probs)                 # (B, T)
    advantage = advantages.unsqueeze(1)                          # (B, 1)
    objective = torch.min(ratio * advantage,
                          ratio.clamp(1 - epsilon, 1 + epsilon) * advantage)
    return -(objective * mask).sum() / mask.sum()


def _clipped_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(1700)
    cases = []
    # batch != length, so that an advantage without its token axis cannot broadcast; the
    # ratios reach beyond the clip range on both sides, the advantages take both signs
    for batch, length, epsilon in ((3, 5, 0.2), (2, 4, 0.1), (4, 6, 0.3)):
        old = -3 * torch.rand(batch, length, generator=generator)
        new = old + 0.4 * torch.randn(batch, length, generator=generator)
        advantages = torch.randn(batch, generator=generator)
        mask = torch.ones(batch, length, dtype=torch.bool)
        for row in range(batch):            # a ragged end: the padding is False
            mask[row, length - row:] = False
        cases.append((new, old, advantages, mask, epsilon))
    return cases


def _clipped(*, ratio=lambda lp, old: torch.exp(lp - old), combine=torch.min,
             clip=lambda r, e: r.clamp(1 - e, 1 + e), clip_advantage=False, sign=-1,
             average="tokens"):
    def loss(log_probs, old_log_probs, advantages, mask, epsilon):
        rho = ratio(log_probs, old_log_probs)
        a = advantages.unsqueeze(1)
        if clip_advantage:
            clipped = rho * a.clamp(1 - epsilon, 1 + epsilon)
        else:
            clipped = clip(rho, epsilon) * a
        objective = combine(rho * a, clipped) if combine is not None else clipped
        per_token = sign * objective
        if average == "tokens":
            return (per_token * mask).sum() / mask.sum()
        if average == "sequences":
            return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
        if average == "every position":
            return (per_token * mask).sum() / mask.numel()
        if average == "no mask":
            return per_token.mean()
        if average == "sum per answer":
            return (per_token * mask).sum(-1).mean()
        return (per_token * mask).sum()
    return loss


check_clipped_loss = Checker(
    reference=_clipped_loss,
    cases=_clipped_cases(),
    mistakes={
        "the smaller of the two, torch.min: the clipped objective is a pessimistic bound, "
        "so a step never gains from moving the ratio beyond 1 +- epsilon":
            _clipped(combine=torch.max),
        "keep the unclipped term too, min(rho * A, clip(rho) * A): the clip alone also "
        "rewards a ratio that moved the wrong way": _clipped(combine=None),
        "clip the ratio: min(rho * A, clip(rho, 1 - epsilon, 1 + epsilon) * A); without the "
        "clip one step may move the policy arbitrarily far from the one that sampled":
            _clipped(clip=lambda r, e: r),
        "the loss is minus the objective (the objective is maximised, the loss minimised)":
            _clipped(sign=1),
        "the ratio of probabilities is exp(log_probs - old_log_probs), not a ratio of "
        "log-probabilities": _clipped(ratio=lambda lp, old: lp / old),
        "the ratio is new over old, exp(log_probs - old_log_probs), not exp(old - new)":
            _clipped(ratio=lambda lp, old: torch.exp(old - lp)),
        "clip the ratio, not the advantage: clip(rho, 1 - epsilon, 1 + epsilon) * A":
            _clipped(clip_advantage=True),
        "the ratio is clipped to [1 - epsilon, 1 + epsilon], around 1, not to "
        "[-epsilon, epsilon]": _clipped(clip=lambda r, e: r.clamp(-e, e)),
        "clip the ratio rho = exp(log_probs - old_log_probs) to [1 - epsilon, 1 + epsilon], "
        "not the log-ratio to [-epsilon, epsilon] (exp(eps) is not 1 + eps)":
            _clipped(clip=lambda r, e: torch.exp(torch.log(r).clamp(-e, e))),
        "clip the ratio, then multiply by the advantage: clip(rho, 1 - eps, 1 + eps) * A, not "
        "clip(rho * A, ...)": lambda lp, old, adv, mask, eps: -(torch.min(
            torch.exp(lp - old) * adv[:, None],
            (torch.exp(lp - old) * adv[:, None]).clamp(1 - eps, 1 + eps)) * mask).sum()
            / mask.sum(),
        "clip on both sides, ratio.clamp(1 - epsilon, 1 + epsilon): with a negative advantage "
        "the lower bound is the one that matters": _clipped(clip=lambda r, e: r.clamp(max=1 + e)),
        "average over all the response tokens of the batch at once, as TRL's default "
        "(loss_type='dapo'), not the mean of each sequence's mean (the GRPO paper's, TRL's "
        "loss_type='grpo')": _clipped(average="sequences"),
        "divide by the number of response tokens (mask.sum()), not by every position: the "
        "padding is not part of the mean": _clipped(average="every position"),
        "use the mask: the padding's tokens are not part of the response (average over the "
        "positions where mask is True)": _clipped(average="no mask"),
        "the mean over the response tokens, not their sum": _clipped(average="sum"),
        "average over all the response tokens of the batch at once (mask.sum()), not the sum "
        "of each answer's tokens averaged over the answers": _clipped(average="sum per answer"),
        "advantages is one number per sequence, shape (B,): give it a token axis, "
        "advantages.unsqueeze(1) (or advantages[:, None]), so that it multiplies each of its "
        "sequence's tokens": lambda lp, old, adv, mask, eps: -(torch.min(
            torch.exp(lp - old) * adv,
            torch.exp(lp - old).clamp(1 - eps, 1 + eps) * adv) * mask).sum() / mask.sum(),
    },
    match_every_case=True,
    thorough=True,
    gradients=('log_probs',),
)
