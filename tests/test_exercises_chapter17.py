"""The checkers of chapter 17: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it (not copied from the
checker's own list of mistakes). The mistakes the chapter names (chosen and rejected swapped,
the reference term missing, advantages normalised over the batch instead of the group,
log-probabilities summed over the prompt too) are each asserted to fail with their hint, and
the catalogue at the end measures the share of typical mistakes that get a hint of their own.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from minitransformer.exercises import chapter17
from minitransformer.exercises.chapter17 import (
    check_clipped_loss,
    check_dpo_loss,
    check_group_advantages,
    check_sequence_log_probs,
)

# --- correct answers, written the way a learner might -------------------------------------------


def my_sequence_log_probs(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    picked = log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(dim=-1)


def my_sequence_log_probs_with_cross_entropy(logits, ids, response_mask):
    targets = ids[:, 1:].masked_fill(~response_mask[:, 1:], -100)
    nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100,
                          reduction="none")
    return -nll.sum(dim=-1)


def my_sequence_log_probs_in_a_loop(logits, ids, response_mask):
    totals = []
    for b in range(ids.shape[0]):
        total = torch.tensor(0.0)
        for t in range(1, ids.shape[1]):
            if response_mask[b, t]:
                total = total + logits[b, t - 1].log_softmax(-1)[ids[b, t]]
        totals.append(total)
    return torch.stack(totals)


def my_sequence_log_probs_with_torch_where(logits, ids, response_mask):
    picked = torch.log_softmax(logits, -1)[:, :-1].gather(2, ids[:, 1:, None])[..., 0]
    return torch.where(response_mask[:, 1:], picked, 0.0).sum(1)


def my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    return -F.logsigmoid(beta * (chosen - rejected)).mean()


def my_dpo_loss_with_log_ratios(policy_chosen, policy_rejected, ref_chosen, ref_rejected,
                                beta):
    pi_logratios = policy_chosen - policy_rejected
    ref_logratios = ref_chosen - ref_rejected
    return -F.logsigmoid(beta * (pi_logratios - ref_logratios)).mean()


def my_dpo_loss_with_softplus(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return F.softplus(-beta * margin).mean()


def my_dpo_loss_with_log_of_sigmoid(policy_chosen, policy_rejected, ref_chosen,
                                    ref_rejected, beta):
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -torch.log(torch.sigmoid(beta * margin)).mean()


def my_dpo_loss_from_rewards(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    reward_chosen = beta * (policy_chosen - ref_chosen)
    reward_rejected = beta * (policy_rejected - ref_rejected)
    return -F.logsigmoid(reward_chosen - reward_rejected).mean()


def my_group_advantages(rewards, group_size):
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / (std + 1e-4)).flatten()


def my_group_advantages_as_trl(rewards, group_size):
    mean = rewards.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)
    std = rewards.view(-1, group_size).std(dim=1).repeat_interleave(group_size)
    return (rewards - mean) / (std + 1e-4)


def my_group_advantages_in_a_loop(rewards, group_size):
    out = torch.empty_like(rewards)
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        out[start:start + group_size] = (group - group.mean()) / (group.std() + 1e-4)
    return out


def my_group_advantages_with_split(rewards, group_size):
    return torch.cat([(g - g.mean()) / (g.std() + 1e-4)
                      for g in rewards.split(group_size)])


def my_clipped_loss(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages[:, None]
    unclipped = ratio * a
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * a
    per_token = -torch.min(unclipped, clipped)
    return (per_token * mask).sum() / mask.sum()


def my_clipped_loss_with_minimum(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = (log_probs - old_log_probs).exp()
    a = advantages.unsqueeze(-1)
    objective = torch.minimum(ratio * a, ratio.clip(1 - epsilon, 1 + epsilon) * a)
    return -objective[mask].mean()


def my_clipped_loss_as_a_max_of_losses(log_probs, old_log_probs, advantages, mask, epsilon):
    ratio = torch.exp(log_probs - old_log_probs)
    a = advantages.view(-1, 1)
    loss = torch.max(-ratio * a, -ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    return loss.masked_select(mask).mean()


CORRECT = {
    "log_probs": (check_sequence_log_probs, my_sequence_log_probs),
    "log_probs_cross_entropy": (check_sequence_log_probs,
                                my_sequence_log_probs_with_cross_entropy),
    "log_probs_loop": (check_sequence_log_probs, my_sequence_log_probs_in_a_loop),
    "log_probs_where": (check_sequence_log_probs, my_sequence_log_probs_with_torch_where),
    "dpo": (check_dpo_loss, my_dpo_loss),
    "dpo_log_ratios": (check_dpo_loss, my_dpo_loss_with_log_ratios),
    "dpo_softplus": (check_dpo_loss, my_dpo_loss_with_softplus),
    "dpo_rewards": (check_dpo_loss, my_dpo_loss_from_rewards),
    "advantages": (check_group_advantages, my_group_advantages),
    "advantages_trl": (check_group_advantages, my_group_advantages_as_trl),
    "advantages_loop": (check_group_advantages, my_group_advantages_in_a_loop),
    "advantages_split": (check_group_advantages, my_group_advantages_with_split),
    "clipped": (check_clipped_loss, my_clipped_loss),
    "clipped_minimum": (check_clipped_loss, my_clipped_loss_with_minimum),
    "clipped_max_of_losses": (check_clipped_loss, my_clipped_loss_as_a_max_of_losses),
}


def test_module_exports_every_checker():
    assert sorted(chapter17.__all__) == [
        "check_clipped_loss", "check_dpo_loss", "check_group_advantages",
        "check_sequence_log_probs"]


@pytest.mark.parametrize("name", CORRECT)
def test_accepts_correct_answers(name, capsys):
    checker, solution = CORRECT[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


# --- the references against independent float64 computations ---------------------------------

def test_the_log_prob_reference_is_a_product_of_probabilities():
    """exp of the reference is the product of the response tokens' probabilities."""
    for logits, ids, mask in check_sequence_log_probs.cases:
        probs = logits.double().softmax(-1)
        for b in range(ids.shape[0]):
            product = math.prod(probs[b, t - 1, ids[b, t]].item()
                                for t in range(1, ids.shape[1]) if mask[b, t])
            assert math.isclose(math.exp(check_sequence_log_probs.reference(
                logits, ids, mask)[b].item()), product, rel_tol=1e-4)


def test_the_dpo_reference_is_the_papers_formula_in_float64():
    for pc, pr, rc, rr, beta in check_dpo_loss.cases:
        expected = sum(-math.log(1 / (1 + math.exp(-beta * ((a - c) - (b - d)))))
                       for a, b, c, d in zip(*(x.double().tolist() for x in (pc, pr, rc, rr))))
        assert math.isclose(check_dpo_loss.reference(pc, pr, rc, rr, beta).item(),
                            expected / len(pc), rel_tol=1e-5)


def test_the_dpo_loss_is_ln_2_at_step_0(capsys):
    pc, pr, rc, rr, beta = check_dpo_loss.cases[-1]
    assert torch.equal(pc, rc) and torch.equal(pr, rr)
    assert math.isclose(check_dpo_loss.reference(pc, pr, rc, rr, beta).item(), math.log(2),
                        rel_tol=1e-6)


def test_the_advantage_reference_is_trls_formula():
    """TRL's GRPOTrainer: (r - mean) / (std + 1e-4), std with Bessel's correction
    (trl.trainer.utils.nanstd), per group of num_generations rewards."""
    from trl.trainer.utils import nanstd
    for rewards, group_size in check_group_advantages.cases:
        grouped = rewards.view(-1, group_size)
        mean = grouped.mean(dim=1).repeat_interleave(group_size)
        std = nanstd(grouped, dim=1).repeat_interleave(group_size)
        torch.testing.assert_close(check_group_advantages.reference(rewards, group_size),
                                   (rewards - mean) / (std + 1e-4))


def test_every_advantage_case_has_a_group_of_equal_rewards():
    for rewards, group_size in check_group_advantages.cases:
        grouped = rewards.view(-1, group_size)
        assert (grouped == grouped[:, :1]).all(dim=1).any()
        assert grouped.shape[0] != grouped.shape[1]


def test_the_clipped_reference_in_float64_by_hand():
    for lp, old, adv, mask, eps in check_clipped_loss.cases:
        total, count = 0.0, 0
        for b in range(lp.shape[0]):
            for t in range(lp.shape[1]):
                if mask[b, t]:
                    rho = math.exp(lp[b, t].item() - old[b, t].item())
                    a = adv[b].item()
                    total += -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
                    count += 1
        assert math.isclose(check_clipped_loss.reference(lp, old, adv, mask, eps).item(),
                            total / count, rel_tol=1e-5)


def test_the_clipped_cases_clip_on_both_sides():
    for lp, old, adv, mask, eps in check_clipped_loss.cases:
        ratio = torch.exp(lp - old)[mask]
        assert (ratio > 1 + eps).any() and (ratio < 1 - eps).any()
        assert (adv > 0).any() and (adv < 0).any()


def _hint(checker, function, capsys):
    assert not checker(function)
    out = capsys.readouterr().out
    assert out.startswith("✗"), out
    assert "Hint: " in out, out
    return out.rstrip("\n").split("Hint: ", 1)[1]


# --- the four mistakes the issue names ------------------------------------------------------

def test_dpo_with_chosen_and_rejected_swapped(capsys):
    def loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        return my_dpo_loss(policy_rejected, policy_chosen, ref_rejected, ref_chosen, beta)
    assert "swapping chosen with rejected" in _hint(check_dpo_loss, loss, capsys)


def test_dpo_without_the_reference(capsys):
    def loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        return -F.logsigmoid(beta * (policy_chosen - policy_rejected)).mean()
    assert "keep the reference" in _hint(check_dpo_loss, loss, capsys)


def test_advantages_over_the_batch(capsys):
    def advantages(rewards, group_size):
        return (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    assert "normalise within each group" in _hint(check_group_advantages, advantages, capsys)


def test_log_probs_summed_over_the_prompt(capsys):
    def log_probs(logits, ids, response_mask):
        lp = logits[:, :-1].log_softmax(-1)
        return lp.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)
    assert "over the prompt" in _hint(check_sequence_log_probs, log_probs, capsys)


def test_dpo_through_log_of_sigmoid_is_refused(capsys):
    """-log(sigmoid(x)) is -inf's mirror once sigmoid rounds to 0 (x below about -100 in
    float32): the cases hold such pairs, and F.logsigmoid is asked for."""
    assert "rounds to log(0) = -inf" in _hint(check_dpo_loss, my_dpo_loss_with_log_of_sigmoid,
                                             capsys)


def test_no_wrong_answer_passes_on_any_case_alone():
    """Each checker's cases tell every listed mistake from the reference: not only the first
    failing case, but each mistake differs on at least two cases (so that one edited case
    cannot let it through)."""
    from minitransformer.exercises import difference
    for checker in (check_sequence_log_probs, check_dpo_loss, check_group_advantages,
                    check_clipped_loss):
        for hint, wrong in checker.mistakes.items():
            differ = 0
            for case in checker.cases:
                try:
                    got = wrong(*case)
                except Exception:
                    differ += 1
                    continue
                differ += difference(checker.reference(*case), got) is not None
            assert differ >= 2, hint


# --- a catalogue of typical wrong answers, each with the hint it must get --------------------
# Written as a learner writes them. ``None``: a mistake no hint names; it must still fail, and
# get no hint at all rather than another mistake's. The share named is measured below.

L, D, A, C = (check_sequence_log_probs, check_dpo_loss, check_group_advantages,
              check_clipped_loss)


def _picked(logits, ids):
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _dpo(margin_to_loss):
    def my_dpo_loss(pc, pr, rc, rr, beta):
        return margin_to_loss((pc - rc) - (pr - rr), beta)
    return my_dpo_loss


def _clip(objective):
    def my_clipped_loss(lp, old, adv, mask, eps):
        ratio = torch.exp(lp - old)
        a = adv[:, None]
        per_token = objective(ratio, ratio.clamp(1 - eps, 1 + eps), a)
        return (per_token * mask).sum() / mask.sum()
    return my_clipped_loss


CATALOGUE = [
    # my_sequence_log_probs
    ("lp no shift", L, lambda logits, ids, m: (logits.log_softmax(-1).gather(
        2, ids[..., None])[..., 0] * m).sum(1), "score logits[:, :-1] on ids[:, 1:]"),
    ("lp whole row", L, lambda logits, ids, m: _picked(logits, ids).sum(1), "over the prompt"),
    ("lp mask off by one", L, lambda logits, ids, m: (_picked(logits, ids) * m[:, :-1]).sum(1),
     "not response_mask[:, :-1]"),
    ("lp mean", L, lambda logits, ids, m: _picked(logits, ids)[:, :].mul(m[:, 1:]).sum(1)
     / m.sum(1), "not their mean"),
    ("lp raw logits", L, lambda logits, ids, m: (logits[:, :-1].gather(
        2, ids[:, 1:, None]).squeeze(2) * m[:, 1:]).sum(1), "take log_softmax"),
    ("lp softmax", L, lambda logits, ids, m: (F.softmax(logits[:, :-1], -1).gather(
        2, ids[:, 1:, None]).squeeze(2) * m[:, 1:]).sum(1), "not probabilities"),
    ("lp dim 1", L, lambda logits, ids, m: (F.log_softmax(logits[:, :-1], 1).gather(
        2, ids[:, 1:, None]).squeeze(2) * m[:, 1:]).sum(1), "log_softmax over the vocabulary"),
    ("lp max", L, lambda logits, ids, m: (logits[:, :-1].log_softmax(-1).max(-1).values
                                          * m[:, 1:]).sum(-1), "not the largest"),
    ("lp batch sum", L, lambda logits, ids, m: (_picked(logits, ids) * m[:, 1:]).sum(),
     "not over the whole batch"),
    ("lp per token", L, lambda logits, ids, m: _picked(logits, ids) * m[:, 1:],
     "sum each row"),
    ("lp cross entropy sum", L, lambda logits, ids, m: F.cross_entropy(
        logits[:, :-1].transpose(1, 2), ids[:, 1:].masked_fill(~m[:, 1:], -100),
        reduction="none").sum(1), "negate it"),
    ("lp cross entropy mean", L, lambda logits, ids, m: F.cross_entropy(
        logits[:, :-1].transpose(1, 2), ids[:, 1:].masked_fill(~m[:, 1:], -100)),
     "cross_entropy gives -log p, and by default the mean"),
    ("lp other way", L, lambda logits, ids, m: (logits[:, 1:].log_softmax(-1).gather(
        2, ids[:, :-1, None]).squeeze(2) * m[:, :-1]).sum(1), "the other way"),
    ("lp shifted mask only", L, lambda logits, ids, m: (
        logits.log_softmax(-1).gather(2, ids[..., None]).squeeze(2)[:, 1:] * m[:, 1:]).sum(1),
     "shift the logits against the ids"),
    # my_dpo_loss
    ("dpo swapped", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(
        b * ((pr - rr) - (pc - rc))).mean(), "swapping chosen with rejected"),
    ("dpo policy and reference swapped", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(
        b * ((rc - pc) - (rr - pr))).mean(), "or the policy with the"),
    ("dpo softplus of the margin", D, lambda pc, pr, rc, rr, b: F.softplus(
        b * ((pc - rc) - (pr - rr))).mean(), "the sign is the wrong way round"),
    ("dpo no reference", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(b * (pc - pr)).mean(),
     "keep the reference"),
    ("dpo reference added", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(
        b * (pc - pr + rc - rr)).mean(), "subtract the reference's margin"),
    ("dpo chosen only", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(b * (pc - rc)).mean(),
     "keep the rejected answer's term"),
    ("dpo beta outside", D, _dpo(lambda m, b: -b * F.logsigmoid(m).mean()),
     "not the loss outside it"),
    ("dpo no beta", D, _dpo(lambda m, b: -F.logsigmoid(m).mean()),
     "multiply the margin by beta: -log"),
    ("dpo beta divides", D, _dpo(lambda m, b: -F.logsigmoid(m / b).mean()),
     "do not divide by it"),
    ("dpo sum", D, _dpo(lambda m, b: -F.logsigmoid(b * m).sum()), "not the sum"),
    ("dpo per pair", D, _dpo(lambda m, b: -F.logsigmoid(b * m)), "not one loss per pair"),
    ("dpo no minus", D, _dpo(lambda m, b: torch.log(torch.sigmoid(b * m)).mean()),
     "every value has the wrong sign"),
    ("dpo no log", D, _dpo(lambda m, b: -torch.sigmoid(b * m).mean()),
     "not -sigmoid(...)"),
    ("dpo one minus sigmoid", D, _dpo(lambda m, b: torch.mean(1 - torch.sigmoid(b * m))),
     "not 1 - sigmoid(...)"),
    ("dpo linear", D, _dpo(lambda m, b: torch.mean(-b * m)), "never stops pushing"),
    ("dpo hinge", D, _dpo(lambda m, b: torch.clamp(1 - b * m, min=0).mean()), "hinge loss"),
    ("dpo log ratio as division", D, lambda pc, pr, rc, rr, b: -F.logsigmoid(
        b * (pc / rc - pr / rr)).mean(), "not policy / reference"),
    ("dpo sigmoid of the difference of sigmoids", D, lambda pc, pr, rc, rr, b: -torch.log(
        torch.sigmoid(b * (pc - rc)) - torch.sigmoid(b * (pr - rr)) + 1).mean(), None),
    # my_group_advantages
    ("adv batch", A, lambda r, g: (r - r.mean()) / (r.std() + 1e-4), "an easier or harder one"),
    ("adv batch biased", A, lambda r, g: (r - r.mean()) / (r.std(correction=0) + 1e-4),
     "not over the whole batch (your standard deviation"),
    ("adv batch std", A, lambda r, g: (r - r.view(-1, g).mean(1).repeat_interleave(g))
     / (r.std() + 1e-4), "scale_rewards='batch'"),
    ("adv G rows", A, lambda r, g: ((r.view(g, -1) - r.view(g, -1).mean(1, keepdim=True))
                                    / (r.view(g, -1).std(1, keepdim=True) + 1e-4)).flatten(),
     "rows of the wrong length"),
    ("adv every G-th", A, lambda r, g: torch.cat([
        (r[k::g] - r[k::g].mean()) / (r[k::g].std() + 1e-4) for k in range(g)]).view(g, -1)
     .T.flatten(), "not down dim=0"),
    ("adv dim 0", A, lambda r, g: ((r.view(-1, g) - r.view(-1, g).mean(0))
                                   / (r.view(-1, g).std(0) + 1e-4)).flatten(), "not down dim=0"),
    ("adv biased std", A, lambda r, g: torch.cat([
        (x - x.mean()) / (x.std(unbiased=False) + 1e-4) for x in r.split(g)]),
     "Bessel's correction (dividing by G - 1)"),
    ("adv no eps", A, lambda r, g: torch.cat([(x - x.mean()) / x.std() for x in r.split(g)]),
     "add 1e-4"),
    ("adv no std", A, lambda r, g: r - r.view(-1, g).mean(1).repeat_interleave(g),
     "Dr. GRPO"),
    ("adv not centred", A, lambda r, g: torch.cat([x / (x.std() + 1e-4) for x in r.split(g)]),
     "subtract the group's mean first"),
    ("adv variance", A, lambda r, g: torch.cat([(x - x.mean()) / (x.var() + 1e-4)
                                                for x in r.split(g)]), "not the variance"),
    ("adv sign", A, lambda r, g: torch.cat([(x.mean() - x) / (x.std() + 1e-4)
                                            for x in r.split(g)]), "not mean minus reward"),
    ("adv 2-D", A, lambda r, g: (r.view(-1, g) - r.view(-1, g).mean(1, keepdim=True))
     / (r.view(-1, g).std(1, keepdim=True) + 1e-4), "flatten the (N, G) result"),
    ("adv min-max", A, lambda r, g: torch.cat([(x - x.min()) / (x.max() - x.min() + 1e-4)
                                               for x in r.split(g)]), None),
    # my_clipped_loss
    ("clip max", C, _clip(lambda r, rc, a: -torch.max(r * a, rc * a)), "torch.min"),
    ("clip only clipped", C, _clip(lambda r, rc, a: -rc * a), "keep the unclipped term"),
    ("clip no clip", C, _clip(lambda r, rc, a: -r * a), "clip the ratio:"),
    ("clip no minus", C, _clip(lambda r, rc, a: torch.min(r * a, rc * a)),
     "minus the objective"),
    ("clip ratio of logs", C, lambda lp, old, adv, mask, eps: -(torch.min(
        lp / old * adv[:, None], (lp / old).clamp(1 - eps, 1 + eps) * adv[:, None])
        * mask).sum() / mask.sum(), "not a ratio of log-probabilities"),
    ("clip inverted", C, lambda lp, old, adv, mask, eps: -(torch.min(
        (old - lp).exp() * adv[:, None], (old - lp).exp().clamp(1 - eps, 1 + eps)
        * adv[:, None]) * mask).sum() / mask.sum(), "not exp(old - new)"),
    ("clip the advantage", C, lambda lp, old, adv, mask, eps: -(torch.min(
        (lp - old).exp() * adv[:, None], (lp - old).exp() * adv[:, None].clamp(
            1 - eps, 1 + eps)) * mask).sum() / mask.sum(), "not the advantage"),
    ("clip around 0", C, lambda lp, old, adv, mask, eps: -(torch.min(
        (lp - old).exp() * adv[:, None], (lp - old).exp().clamp(-eps, eps)
        * adv[:, None]) * mask).sum() / mask.sum(), "not to [-epsilon, epsilon]"),
    ("clip per sequence", C, lambda lp, old, adv, mask, eps: (
        (-torch.min((lp - old).exp() * adv[:, None], (lp - old).exp().clamp(1 - eps, 1 + eps)
                    * adv[:, None]) * mask).sum(1) / mask.sum(1)).mean(), "loss_type='grpo'"),
    ("clip every position", C, lambda lp, old, adv, mask, eps: (
        -torch.min((lp - old).exp() * adv[:, None], (lp - old).exp().clamp(1 - eps, 1 + eps)
                   * adv[:, None]) * mask).mean(), "not by every position"),
    ("clip no mask", C, lambda lp, old, adv, mask, eps: (
        -torch.min((lp - old).exp() * adv[:, None], (lp - old).exp().clamp(1 - eps, 1 + eps)
                   * adv[:, None])).mean(), "use the mask"),
    ("clip sum", C, lambda lp, old, adv, mask, eps: (
        -torch.min((lp - old).exp() * adv[:, None], (lp - old).exp().clamp(1 - eps, 1 + eps)
                   * adv[:, None]) * mask).sum(), "not their sum"),
    ("clip no token axis", C, lambda lp, old, adv, mask, eps: -(torch.min(
        (lp - old).exp() * adv, (lp - old).exp().clamp(1 - eps, 1 + eps) * adv)
        * mask).sum() / mask.sum(), "give it a token axis"),
    ("clip eps as 1 + eps", C, lambda lp, old, adv, mask, eps: -(torch.min(
        (lp - old).exp() * adv[:, None], (lp - old).exp().clamp(1 - eps, eps)
        * adv[:, None]) * mask).sum() / mask.sum(), "around 1"),
    ("adv answer after answer", A, lambda r, g: torch.stack([
        (x - x.mean()) / (x.std() + 1e-4) for x in r.view(g, -1).T]).T.flatten(),
     "not answer after answer"),
]


def _message(checker, wrong):
    verdict = checker.run(wrong)
    assert not verdict, "a wrong answer passed"
    assert "\n" not in verdict.message
    return verdict.message


@pytest.mark.filterwarnings("ignore::UserWarning")      # std of one number, in a mistake
@pytest.mark.parametrize("name, checker, wrong, fragment", CATALOGUE,
                         ids=[entry[0] for entry in CATALOGUE])
def test_catalogue(name, checker, wrong, fragment):
    message = _message(checker, wrong)
    if fragment is None:
        assert "Hint: " not in message, message
        return
    assert "Hint: " in message, message
    hint = message.split("Hint: ", 1)[1]
    listed = [h for h in checker.mistakes if fragment in h]
    assert len(listed) <= 1, (fragment, listed)
    assert fragment in hint, (fragment, message)
    if listed:
        assert hint == listed[0]


def test_catalogue_coverage():
    """At least 90% of the catalogue's wrong answers get a hint that names them; every
    exercise has at least eight."""
    named = sum(fragment is not None for *_, fragment in CATALOGUE)
    share = named / len(CATALOGUE)
    print(f"chapter 17: {named} of {len(CATALOGUE)} typical mistakes named ({share:.0%})")
    assert share >= 0.9
    for checker in (L, D, A, C):
        assert sum(entry[1] is checker for entry in CATALOGUE) >= 8


# --- the references are the package's functions ------------------------------------------------

def test_the_log_prob_reference_is_the_packages_sequence_log_probs():
    from minitransformer.preferences import sequence_log_probs
    for logits, ids, mask in check_sequence_log_probs.cases:
        targets = torch.cat([ids[:, 1:].masked_fill(~mask[:, 1:], -100),
                             torch.full_like(ids[:, :1], -100)], dim=1)
        torch.testing.assert_close(check_sequence_log_probs.reference(logits, ids, mask),
                                   sequence_log_probs(logits, targets))


def test_the_dpo_reference_is_the_packages_dpo_loss():
    from minitransformer.preferences import dpo_loss
    for pc, pr, rc, rr, beta in check_dpo_loss.cases:
        torch.testing.assert_close(check_dpo_loss.reference(pc, pr, rc, rr, beta),
                                   dpo_loss(pc, pr, rc, rr, beta=beta))


def test_the_advantage_reference_is_the_packages_group_advantages():
    from minitransformer.grpo import group_advantages
    for rewards, group_size in check_group_advantages.cases:
        torch.testing.assert_close(check_group_advantages.reference(rewards, group_size),
                                   group_advantages(rewards, group_size))


def test_the_clipped_reference_is_the_packages_grpo_loss_as_dapo():
    from minitransformer.grpo import grpo_loss
    for lp, old, adv, mask, eps in check_clipped_loss.cases:
        torch.testing.assert_close(check_clipped_loss.reference(lp, old, adv, mask, eps),
                                   grpo_loss(lp, old, adv, mask, epsilon=eps, loss_type="dapo"))


# --- issue 40: answers that cannot be trained through; unreadable failures -------------------

def test_log_probs_through_item_fail_with_the_gradient_hint(capsys):
    def log_probs(logits, ids, response_mask):
        rows = []
        for b in range(ids.shape[0]):
            total = 0.0
            for t in range(1, ids.shape[1]):
                if response_mask[b, t]:
                    total += logits[b, t - 1].log_softmax(-1)[ids[b, t]].item()
            rows.append(total)
        return torch.tensor(rows)
    assert "does not carry a gradient" in _hint(check_sequence_log_probs, log_probs, capsys)


def test_a_dpo_loss_as_a_python_float_fails_with_the_gradient_hint(capsys):
    def loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        return my_dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta).item()
    assert "the result does not carry a gradient" in _hint(check_dpo_loss, loss, capsys)


def test_a_clipped_loss_with_the_ratio_detached_fails_with_the_gradient_hint(capsys):
    def loss(log_probs, old_log_probs, advantages, mask, epsilon):
        return my_clipped_loss(log_probs.detach(), old_log_probs, advantages, mask, epsilon)
    assert "does not carry a gradient" in _hint(check_clipped_loss, loss, capsys)


def test_advantages_that_look_equal_at_4_decimals_show_the_largest_difference(capsys):
    """1e-4 inside the root: the answers print alike at 4 decimals; the message shows where
    they differ most, with 7 digits, and the hint says a small term differs."""
    def advantages(rewards, group_size):
        g = rewards.view(-1, group_size)
        return ((g - g.mean(1, keepdim=True)) / (g.var(1, keepdim=True) + 1e-4).sqrt()).view(-1)
    assert not check_group_advantages(advantages)
    out = capsys.readouterr().out
    assert "the largest difference, " in out and "expected 0.8658754 but got" in out
    assert "a small term differs" in out
