"""Wrong answers to the exercises of chapter 17 (preferences and rewards), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
"""

import math
import statistics

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# 17.1  my_sequence_log_probs(logits, ids, response_mask)
# ---------------------------------------------------------------------------


def seq_unshifted(logits, ids, response_mask):
    log_probs = logits.log_softmax(-1)   # position t scored on its own token
    picked = log_probs.gather(-1, ids[..., None]).squeeze(-1)
    return (picked * response_mask).sum(-1)


def seq_mask_of_predicting_position(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, :-1]).sum(-1)   # mask not shifted


def seq_shift_reversed(logits, ids, response_mask):
    log_probs = logits[:, 1:].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, :-1, None]).squeeze(-1)
    return (picked * response_mask[:, :-1]).sum(-1)


def seq_mean_not_sum(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    m = response_mask[:, 1:].float()
    return (picked * m).sum(-1) / m.sum(-1)   # per-token average


def seq_no_mask(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)   # the prompt counted too
    return log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)


def seq_raw_logits(logits, ids, response_mask):
    picked = logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)   # no log_softmax


def seq_log_softmax_time_axis(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(1)   # over positions, not the vocabulary
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)


def seq_scalar_over_batch(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return picked[response_mask[:, 1:]].sum()   # one number for the batch


def seq_keepdim(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1, keepdim=True)   # (B, 1)


def seq_negative_log_likelihood(logits, ids, response_mask):
    targets = ids[:, 1:].masked_fill(~response_mask[:, 1:].bool(), -100)
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets,
                          reduction="none")
    return nll.sum(-1)                   # the loss, not the log-probability


def seq_item_loop(logits, ids, response_mask):
    totals = []
    for row in range(ids.shape[0]):
        total = 0.0
        for t in range(1, ids.shape[1]):
            if response_mask[row, t]:
                total += logits[row, t - 1].log_softmax(-1)[ids[row, t]].item()
        totals.append(total)
    return torch.tensor(totals)          # no gradient


def seq_in_place_normalise(logits, ids, response_mask):
    logits -= logits.logsumexp(-1, keepdim=True)   # the caller's logits change
    picked = logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)


def seq_rolled(logits, ids, response_mask):
    # roll instead of slice: the last position is scored on the first token
    log_probs = logits.log_softmax(-1)
    next_ids = torch.roll(ids, -1, dims=1)
    next_mask = torch.roll(response_mask, -1, dims=1)
    picked = log_probs.gather(-1, next_ids[..., None]).squeeze(-1)
    return (picked * next_mask).sum(-1)


def seq_log_of_softmax_sum(logits, ids, response_mask):
    probs = logits[:, :-1].softmax(-1)
    picked = probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.log((picked * response_mask[:, 1:]).sum(-1))   # log of a sum


def seq_float64(logits, ids, response_mask):
    log_probs = logits[:, :-1].double().log_softmax(-1)   # "for accuracy"
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)


def seq_first_response_token_dropped(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    m = response_mask[:, 1:] & response_mask[:, :-1]   # both ends in the response
    return (picked * m).sum(-1)


# ---------------------------------------------------------------------------
# 17.2  my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
# ---------------------------------------------------------------------------


def dpo_margin_reversed(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                        beta):
    margin = (policy_rejected - ref_rejected) - (policy_chosen - ref_chosen)
    return -F.logsigmoid(beta * margin).mean()


def dpo_no_minus(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return F.logsigmoid(beta * margin).mean()


def dpo_beta_outside(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                     beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -beta * F.logsigmoid(margin).mean()



def dpo_log_of_sigmoid(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                       beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -torch.log(torch.sigmoid(beta * margin)).mean()   # inf for large margins


def dpo_sum(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).sum()


def dpo_no_reference(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                     beta):
    return -F.logsigmoid(beta * (policy_chosen - policy_rejected)).mean()


def dpo_ratio_of_logs(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                      beta):
    # log pi / pi_ref read as a division of the log-probabilities
    margin = policy_chosen / ref_chosen - policy_rejected / ref_rejected
    return -F.logsigmoid(beta * margin).mean()


def dpo_softplus_wrong_sign(policy_chosen, policy_rejected, ref_chosen,
                            ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return F.softplus(beta * margin).mean()


def dpo_divided_by_beta(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                        beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(margin / beta).mean()


def dpo_mean_inside(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                    beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin.mean())   # mean of the margins first


def dpo_two_terms(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    # chosen up and rejected down as two separate sigmoid terms
    up = -F.logsigmoid(beta * (policy_chosen - ref_chosen))
    down = -F.logsigmoid(-beta * (policy_rejected - ref_rejected))
    return (up + down).mean()


def dpo_in_place(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    policy_chosen -= ref_chosen          # mutates the caller's tensors
    policy_rejected -= ref_rejected
    return -F.logsigmoid(beta * (policy_chosen - policy_rejected)).mean()


def dpo_returns_tuple(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                      beta):
    chosen = beta * (policy_chosen - ref_chosen)   # TRL-style triple
    rejected = beta * (policy_rejected - ref_rejected)
    return -F.logsigmoid(chosen - rejected).mean(), chosen, rejected


def dpo_per_pair(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin)   # no mean


def dpo_detached_policy(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                        beta):
    margin = (policy_chosen.detach() - ref_chosen) \
        - (policy_rejected.detach() - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def dpo_python_float(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                     beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return sum(-math.log(1 / (1 + math.exp(-beta * m))) for m in margin.tolist()) \
        / len(margin)


# ---------------------------------------------------------------------------
# 17.3  my_group_advantages(rewards, group_size)
# ---------------------------------------------------------------------------


def adv_population_std(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True, unbiased=False)   # divides by G
    return ((groups - mean) / (std + 1e-4)).view(-1)


def adv_eps_in_sqrt(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    var = groups.var(dim=1, keepdim=True)
    return ((groups - mean) / torch.sqrt(var + 1e-4)).view(-1)


def adv_over_batch(rewards, group_size):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


def adv_no_std(rewards, group_size):
    groups = rewards.view(-1, group_size)
    return (groups - groups.mean(dim=1, keepdim=True)).view(-1)


def adv_no_eps(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / std).view(-1)   # 0 / 0 for equal rewards


def adv_wrong_view(rewards, group_size):
    groups = rewards.view(group_size, -1)     # strided groups
    mean = groups.mean(dim=0, keepdim=True)
    std = groups.std(dim=0, keepdim=True)
    return ((groups - mean) / (std + 1e-4)).reshape(-1)


def adv_mean_over_wrong_dim(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=0, keepdim=True)   # over the prompts
    std = groups.std(dim=0, keepdim=True)
    return ((groups - mean) / (std + 1e-4)).view(-1)


def adv_not_flattened(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return (groups - mean) / (std + 1e-4)     # (N, G), not (N * G,)


def adv_precedence(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / std + 1e-4).nan_to_num(0.0).view(-1)


def adv_in_place(rewards, group_size):
    groups = rewards.view(-1, group_size)     # a view: shares the caller's storage
    groups -= groups.mean(dim=1, keepdim=True)
    groups /= groups.std(dim=1, keepdim=True) + 1e-4
    return groups.reshape(-1)


def adv_hard_coded_four(rewards, group_size):
    groups = rewards.view(-1, 4)              # the chapter's example's G
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / (std + 1e-4)).view(-1)


def adv_no_keepdim(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1)                 # (N,), broadcast along the wrong axis
    std = groups.std(dim=1)
    return ((groups - mean) / (std + 1e-4)).reshape(-1)


def adv_chunk(rewards, group_size):
    out = []                                  # group_size chunks, not chunks of G
    for group in torch.chunk(rewards, group_size):
        out.append((group - group.mean()) / (group.std() + 1e-4))
    return torch.cat(out)


def adv_numpy(rewards, group_size):
    groups = rewards.numpy().reshape(-1, group_size)
    mean = groups.mean(axis=1, keepdims=True)
    std = groups.std(axis=1, keepdims=True)   # ddof=0, and an ndarray back
    return ((groups - mean) / (std + 1e-4)).reshape(-1)


def adv_python_list(rewards, group_size):
    values = rewards.tolist()
    out = []
    for k in range(0, len(values), group_size):
        group = values[k:k + group_size]
        mean, std = statistics.mean(group), statistics.stdev(group)
        out += [(r - mean) / (std + 1e-4) for r in group]
    return out                                # a list of floats


def adv_batch_std_group_mean(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    return ((groups - mean) / (rewards.std() + 1e-4)).view(-1)


# ---------------------------------------------------------------------------
# 17.4  my_clipped_loss(log_probs, old_log_probs, advantages, mask, epsilon)
# ---------------------------------------------------------------------------


def clip_no_min(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = clipped * advantages[:, None]   # the clipped term alone
    return -(objective * mask).sum() / mask.sum()


def clip_max(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.max(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_ratio_of_logs(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = log_probs / old_log_probs        # pi / pi_old on the log scale
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_ratio_inverted(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(old_log_probs - log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_per_answer_mean(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)   # loss_type="grpo"
    return (-(objective * mask).sum(1) / mask.sum(1)).mean()



def clip_no_mask(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    return -torch.min(ratio * a, clipped * a).mean()


def clip_no_minus(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return (objective * mask).sum() / mask.sum()


def clip_log_ratio(log_probs, old_log_probs, advantages, mask, epsilon):
    log_ratio = (log_probs - old_log_probs).clamp(-epsilon, epsilon)
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    objective = torch.min(ratio * a, torch.exp(log_ratio) * a)
    return -(objective * mask).sum() / mask.sum()


def clip_the_product(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    objective = torch.min(ratio * a, (ratio * a).clamp(1 - epsilon, 1 + epsilon))
    return -(objective * mask).sum() / mask.sum()


def clip_advantages_wrong_axis(log_probs, old_log_probs, advantages, mask,
                               epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[None, :]                  # along the tokens: needs T == B
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_detached_ratio(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs).detach()
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_upper_only(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(max=1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_sum_per_answer(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum(1).mean()   # sum over tokens, mean over answers


def clip_hard_coded_epsilon(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(0.8, 1.2)          # the chapter's epsilon = 0.2
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_in_place(log_probs, old_log_probs, advantages, mask, epsilon):
    log_probs -= old_log_probs               # mutates the caller's tensor
    ratio = log_probs.exp()
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum() / mask.sum()


def clip_item(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = torch.min(ratio * a, clipped * a)
    return -(objective * mask).sum().item() / mask.sum().item()   # a float


WRONG_ANSWERS = [
    ("17.1", "check_sequence_log_probs", "logits not shifted: position t scored on ids[t]",
     seq_unshifted),
    ("17.1", "check_sequence_log_probs", "mask not shifted with the ids (mask[:, :-1])",
     seq_mask_of_predicting_position),
    ("17.1", "check_sequence_log_probs", "shift reversed: logits[1:] on ids[:-1]",
     seq_shift_reversed),
    ("17.1", "check_sequence_log_probs", "mean over the response tokens, not the sum",
     seq_mean_not_sum),
    ("17.1", "check_sequence_log_probs", "no mask: prompt and padding counted",
     seq_no_mask),
    ("17.1", "check_sequence_log_probs", "raw logits gathered, no log_softmax",
     seq_raw_logits),
    ("17.1", "check_sequence_log_probs", "log_softmax over the time axis",
     seq_log_softmax_time_axis),
    ("17.1", "check_sequence_log_probs", "one sum for the whole batch (boolean indexing)",
     seq_scalar_over_batch),
    ("17.1", "check_sequence_log_probs", "shape (B, 1) from keepdim=True",
     seq_keepdim),
    ("17.1", "check_sequence_log_probs", "cross-entropy: returns minus the log-probability",
     seq_negative_log_likelihood),
    ("17.1", "check_sequence_log_probs", ".item() loop: no gradient",
     seq_item_loop),
    ("17.1", "check_sequence_log_probs", "normalises the caller's logits in place",
     seq_in_place_normalise),
    ("17.1", "check_sequence_log_probs", "torch.roll wraps: the last logits score ids[0]",
     seq_rolled),
    ("17.1", "check_sequence_log_probs", "log of the summed probabilities",
     seq_log_of_softmax_sum),
    ("17.1", "check_sequence_log_probs", "float64 result", seq_float64),
    ("17.1", "check_sequence_log_probs", "first response token dropped (mask AND previous mask)",
     seq_first_response_token_dropped),

    ("17.2", "check_dpo_loss", "margin reversed: rejected minus chosen",
     dpo_margin_reversed),
    ("17.2", "check_dpo_loss", "minus sign missing", dpo_no_minus),
    ("17.2", "check_dpo_loss", "beta multiplies the loss, not the margin",
     dpo_beta_outside),
    ("17.2", "check_dpo_loss", "log(sigmoid(.)): inf for very negative margins",
     dpo_log_of_sigmoid),
    ("17.2", "check_dpo_loss", "sum over the pairs, not the mean", dpo_sum),
    ("17.2", "check_dpo_loss", "reference left out", dpo_no_reference),
    ("17.2", "check_dpo_loss", "log-probabilities divided, not subtracted",
     dpo_ratio_of_logs),
    ("17.2", "check_dpo_loss", "softplus(beta m): the sign inside is wrong",
     dpo_softplus_wrong_sign),
    ("17.2", "check_dpo_loss", "margin divided by beta", dpo_divided_by_beta),
    ("17.2", "check_dpo_loss", "mean of the margins inside the sigmoid",
     dpo_mean_inside),
    ("17.2", "check_dpo_loss", "two separate sigmoid terms for chosen and rejected",
     dpo_two_terms),
    ("17.2", "check_dpo_loss", "subtracts in place from the caller's tensors",
     dpo_in_place),
    ("17.2", "check_dpo_loss", "returns (loss, chosen rewards, rejected rewards) like TRL",
     dpo_returns_tuple),
    ("17.2", "check_dpo_loss", "per-pair losses, no mean", dpo_per_pair),
    ("17.2", "check_dpo_loss", "policy log-probabilities detached", dpo_detached_policy),
    ("17.2", "check_dpo_loss", "python float from math.exp", dpo_python_float),

    ("17.3", "check_group_advantages", "population std (divides by G)",
     adv_population_std),
    ("17.3", "check_group_advantages", "1e-4 added to the variance, inside the sqrt",
     adv_eps_in_sqrt),
    ("17.3", "check_group_advantages", "normalised over the whole batch",
     adv_over_batch),
    ("17.3", "check_group_advantages", "mean subtracted, no division by std",
     adv_no_std),
    ("17.3", "check_group_advantages", "no 1e-4: nan for a group of equal rewards",
     adv_no_eps),
    ("17.3", "check_group_advantages", "view(G, -1): strided groups", adv_wrong_view),
    ("17.3", "check_group_advantages", "mean and std over the prompts (dim 0)",
     adv_mean_over_wrong_dim),
    ("17.3", "check_group_advantages", "returns (N, G), not flattened",
     adv_not_flattened),
    ("17.3", "check_group_advantages", "precedence: (r - mean) / std + 1e-4",
     adv_precedence),
    ("17.3", "check_group_advantages", "in place on a view: the caller's rewards change",
     adv_in_place),
    ("17.3", "check_group_advantages", "group size hard-coded as 4 from the example",
     adv_hard_coded_four),
    ("17.3", "check_group_advantages", "no keepdim: mean broadcast along the wrong axis",
     adv_no_keepdim),
    ("17.3", "check_group_advantages", "torch.chunk(rewards, G): G chunks, not chunks of G",
     adv_chunk),
    ("17.3", "check_group_advantages", "numpy std (ddof 0), an ndarray back",
     adv_numpy),
    ("17.3", "check_group_advantages", "returns a python list", adv_python_list),
    ("17.3", "check_group_advantages", "group mean but the batch's std",
     adv_batch_std_group_mean),

    ("17.4", "check_clipped_loss", "only the clipped term, no min", clip_no_min),
    ("17.4", "check_clipped_loss", "max instead of min", clip_max),
    ("17.4", "check_clipped_loss", "ratio of log-probabilities, not exp of the difference",
     clip_ratio_of_logs),
    ("17.4", "check_clipped_loss", "ratio inverted: pi_old / pi", clip_ratio_inverted),
    ("17.4", "check_clipped_loss", "mean per answer then over answers (loss_type grpo)",
     clip_per_answer_mean),
    ("17.4", "check_clipped_loss", "mask ignored", clip_no_mask),
    ("17.4", "check_clipped_loss", "minus sign missing", clip_no_minus),
    ("17.4", "check_clipped_loss", "log-ratio clipped to [-eps, eps]", clip_log_ratio),
    ("17.4", "check_clipped_loss", "rho * A clipped instead of rho", clip_the_product),
    ("17.4", "check_clipped_loss", "advantages[None, :]: along the tokens",
     clip_advantages_wrong_axis),
    ("17.4", "check_clipped_loss", "ratio detached: no gradient", clip_detached_ratio),
    ("17.4", "check_clipped_loss", "only the upper clip", clip_upper_only),
    ("17.4", "check_clipped_loss", "sum over tokens, mean over answers",
     clip_sum_per_answer),
    ("17.4", "check_clipped_loss", "epsilon hard-coded as 0.2", clip_hard_coded_epsilon),
    ("17.4", "check_clipped_loss", "subtracts in place from the caller's log_probs",
     clip_in_place),
    ("17.4", "check_clipped_loss", ".item(): returns a python float", clip_item),
]
