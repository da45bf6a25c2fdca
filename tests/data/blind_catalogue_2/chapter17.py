"""Blind catalogue 2: wrong answers to chapter 17's exercises (written from the book only)."""
# ruff: noqa: E501  (one wrong answer per line in WRONG_ANSWERS)

import torch
import torch.nn.functional as F


# 17.1 sequence_log_probs -----------------------------------------------------

def lp_no_shift(logits, ids, response_mask):
    picked = logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    return (picked * response_mask).sum(-1)


def lp_mask_unshifted(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, :-1]).sum(-1)


def lp_probabilities(logits, ids, response_mask):
    probs = logits[:, :-1].softmax(-1)
    picked = probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)


def lp_mean(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    mask = response_mask[:, 1:]
    return (picked * mask).sum(-1) / mask.sum(-1)


def lp_no_mask(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    return log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)


def lp_detached(logits, ids, response_mask):
    log_probs = logits[:, :-1].detach().log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)


# 17.2 dpo_loss ---------------------------------------------------------------

def dpo_sign_flipped(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pr - rr) - (pc - rc))).mean()


def dpo_beta_outside(pc, pr, rc, rr, beta):
    return -beta * F.logsigmoid((pc - rc) - (pr - rr)).mean()


def dpo_no_reference(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * (pc - pr)).mean()


def dpo_sum(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).sum()


def dpo_no_minus(pc, pr, rc, rr, beta):
    return F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()


def dpo_ref_added(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc + rc) - (pr + rr))).mean()


# 17.3 group_advantages -------------------------------------------------------

def adv_population_std(rewards, group_size):
    g = rewards.view(-1, group_size)
    std = g.std(dim=1, keepdim=True, unbiased=False)
    return ((g - g.mean(1, keepdim=True)) / (std + 1e-4)).view(-1)


def adv_no_eps(rewards, group_size):
    g = rewards.view(-1, group_size)
    return ((g - g.mean(1, keepdim=True)) / g.std(1, keepdim=True)).view(-1)


def adv_wrong_layout(rewards, group_size):
    g = rewards.view(group_size, -1)          # a column per prompt
    std = g.std(dim=0, keepdim=True)
    return ((g - g.mean(0, keepdim=True)) / (std + 1e-4)).reshape(-1)


def adv_global(rewards, group_size):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def adv_center_only(rewards, group_size):
    g = rewards.view(-1, group_size)
    return (g - g.mean(1, keepdim=True)).view(-1)


def adv_inplace(rewards, group_size):
    g = rewards.view(-1, group_size)
    std = g.std(dim=1, keepdim=True)
    g -= g.mean(1, keepdim=True)
    g /= std + 1e-4
    return rewards


# 17.4 clipped_loss -----------------------------------------------------------

def clip_no_min(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    obj = ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None]
    return -(obj * mask).sum() / mask.sum()


def clip_max(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    obj = torch.max(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    return -(obj * mask).sum() / mask.sum()


def clip_per_sequence(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    obj = torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    return -((obj * mask).sum(-1) / mask.sum(-1)).mean()


def clip_ratio_inverted(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(old_log_probs - log_probs)
    a = advantages[:, None]
    obj = torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    return -(obj * mask).sum() / mask.sum()


def clip_mean_all(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    obj = torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    return -(obj * mask).mean()


def clip_upper_only(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    obj = torch.min(ratio * a, ratio.clamp(max=1 + epsilon) * a)
    return -(obj * mask).sum() / mask.sum()


WRONG_ANSWERS = [
    ("17.1", "check_sequence_log_probs", "no shift: each token scored by its own position", lp_no_shift),
    ("17.1", "check_sequence_log_probs", "shifts the ids but not the mask", lp_mask_unshifted),
    ("17.1", "check_sequence_log_probs", "sums probabilities (softmax, not log_softmax)", lp_probabilities),
    ("17.1", "check_sequence_log_probs", "mean over the response tokens, not sum", lp_mean),
    ("17.1", "check_sequence_log_probs", "forgets the response mask", lp_no_mask),
    ("17.1", "check_sequence_log_probs", "gradient cut by .detach()", lp_detached),
    ("17.2", "check_dpo_loss", "chosen and rejected swapped (sign flipped)", dpo_sign_flipped),
    ("17.2", "check_dpo_loss", "beta multiplies the log-sigmoid, not its argument", dpo_beta_outside),
    ("17.2", "check_dpo_loss", "ignores the reference", dpo_no_reference),
    ("17.2", "check_dpo_loss", "sum over pairs, not mean", dpo_sum),
    ("17.2", "check_dpo_loss", "forgets the minus sign", dpo_no_minus),
    ("17.2", "check_dpo_loss", "adds the reference log-probs", dpo_ref_added),
    ("17.3", "check_group_advantages", "population std (divides by G)", adv_population_std),
    ("17.3", "check_group_advantages", "no 1e-4 (NaN on a constant group)", adv_no_eps),
    ("17.3", "check_group_advantages", "wrong layout: view(group_size, -1)", adv_wrong_layout),
    ("17.3", "check_group_advantages", "mean and std over all rewards, not per group", adv_global),
    ("17.3", "check_group_advantages", "centres but does not divide by std", adv_center_only),
    ("17.3", "check_group_advantages", "changes the rewards in place", adv_inplace),
    ("17.4", "check_clipped_loss", "only the clipped term, no min", clip_no_min),
    ("17.4", "check_clipped_loss", "max instead of min", clip_max),
    ("17.4", "check_clipped_loss", "mean per answer then over answers (GRPO, not DAPO)", clip_per_sequence),
    ("17.4", "check_clipped_loss", "ratio inverted: old / new", clip_ratio_inverted),
    ("17.4", "check_clipped_loss", "mean over all tokens, padding included", clip_mean_all),
    ("17.4", "check_clipped_loss", "clips only from above", clip_upper_only),
]
