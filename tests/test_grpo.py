"""GRPO (chapter 17): group advantages, the clipped loss, batched sampling and a training step.

The loss is compared with TRL 1.16's ``GRPOTrainer._compute_loss`` (the function that
``GRPOTrainer.compute_loss`` calls) for ``loss_type`` ``"grpo"``, ``"bnpo"``, ``"dapo"`` and
``"dr_grpo"``, with and without the KL term (``beta``). TRL can be given fixed completions
there: ``_compute_loss`` takes the inputs dict that its generation step would build (prompt and
completion ids and masks, advantages, old and reference log-probabilities) and runs the policy
itself, here our GPT saved with ``save_pretrained`` and read by ``AutoModelForCausalLM``; the
losses and their gradients (embeddings and layer norms, stored alike in both) agree. The
advantages are compared with the formula TRL's ``_generate_and_score_completions`` applies
(``scale_rewards="group"``), rewritten in float64 in this file, since TRL computes them inside
its generation step, which samples.
"""

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, data, generate
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import CHAT_TOKENS, END_OF_TURN, write_chat_template
from minitransformer.grpo import (
    chat_prompts,
    chat_replies,
    chat_rewards,
    completion_batch,
    group_advantages,
    grpo_loss,
    grpo_step,
    grpo_train,
    mean_reward,
    per_token_log_probs,
    sample_group,
)


def tiny_gpt(vocab_size=16, context_length=32, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, context_length=context_length, d_model=16,
                         num_heads=2, num_layers=2))


# --- advantages ----------------------------------------------------------------------------------

def by_hand_advantages(rewards, group_size, normalize=True):
    """TRL's formula in float64, one group at a time: (r - mean) / (sample std + 1e-4)."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        out += [(r - mean) / (std + 1e-4) if normalize else r - mean for r in group]
    return out


def test_advantages_are_normalised_within_each_group():
    rewards = [0.0, 1.0, 0.0, 1.0, 5.0, 5.0, 6.0, 9.0, 0.0, 0.0, 0.0, 3.0]
    got = group_advantages(torch.tensor(rewards, dtype=torch.float64), 4)
    assert got.tolist() == pytest.approx(by_hand_advantages(rewards, 4), abs=1e-12)
    # each group sums to 0; normalising over the batch would not give these numbers
    assert got.view(3, 4).sum(1).abs().max() < 1e-12
    batch = torch.tensor(rewards)
    batch = (batch - batch.mean()) / (batch.std() + 1e-4)
    assert not torch.allclose(got.float(), batch, atol=1e-2)
    # [0, 1, 0, 1]: mean 0.5, sample std sqrt(1/3)
    assert got[0].item() == pytest.approx(-0.5 / (math.sqrt(1 / 3) + 1e-4))
    plain = group_advantages(torch.tensor(rewards, dtype=torch.float64), 4, normalize=False)
    assert plain.tolist() == pytest.approx(by_hand_advantages(rewards, 4, False), abs=1e-12)


def test_a_group_of_equal_rewards_has_zero_advantage():
    got = group_advantages(torch.tensor([3.0, 3.0, 3.0, 0.0, 1.0, 1.0]), 3)
    assert got[:3].tolist() == [0.0, 0.0, 0.0]
    assert (got[3:] != 0).all()


@pytest.mark.parametrize("rewards, group_size, kwargs, error, match", [
    (torch.ones(10), 4, {}, ValueError, r"rewards has 10 entries, not a positive multiple of "
                                        r"group_size=4"),
    (torch.ones(0), 2, {}, ValueError, "rewards has 0 entries"),
    (torch.tensor([0.0, float("nan"), 1.0, 1.0]), 2, {}, ValueError, r"rewards\[1\] is nan"),
    (torch.tensor([0.0, 1.0, float("inf"), 1.0]), 2, {}, ValueError, r"rewards\[2\] is inf"),
    (torch.ones(4), 1, {}, ValueError, "group_size must be at least 2.*got 1"),
    (torch.ones(4), 2.0, {}, TypeError, r"group_size must be an int, got float \(2.0\)"),
    (torch.ones(4), True, {}, TypeError, "group_size must be an int, got bool"),
    (torch.ones(4, dtype=torch.long), 2, {}, TypeError, "rewards must be a floating-point"),
    ([1.0, 0.0], 2, {}, TypeError, "rewards must be a floating-point tensor, got list"),
    (torch.ones(2, 2), 2, {}, ValueError, r"rewards must have 1 dimensions, got shape \(2, 2\)"),
    (torch.ones(4), 2, {"eps": 0.0}, ValueError, "eps must be positive, got 0.0"),
    (torch.ones(4), 2, {"normalize": 1}, TypeError, "normalize must be True or False"),
])
def test_advantage_refusals(rewards, group_size, kwargs, error, match):
    with pytest.raises(error, match=match):
        group_advantages(rewards, group_size, **kwargs)


# --- the loss ---------------------------------------------------------------------------------

def by_hand_loss(log_probs, old, advantages, mask, *, epsilon, beta=0.0, ref=None,
                 loss_type="grpo", correction=False):
    """The GRPO objective in float64 Python numbers, token by token."""
    rows, total, count = [], 0.0, 0
    for b in range(len(log_probs)):
        row_total, row_count = 0.0, 0
        for t in range(len(log_probs[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(log_probs[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - epsilon), 1 + epsilon)
            a = advantages[b]
            term = -min(ratio * a, clipped * a)
            if beta:
                d = ref[b][t] - log_probs[b][t]
                term += beta * (math.exp(d) - d - 1) * (ratio if correction else 1.0)
            row_total, row_count = row_total + term, row_count + 1
        rows.append(row_total / max(row_count, 1))
        total, count = total + row_total, count + row_count
    if loss_type == "grpo":
        return sum(rows) / len(rows)
    if loss_type in ("bnpo", "dapo"):
        return total / count
    return total / (len(log_probs) * len(log_probs[0]))


def loss_batch(seed=0, batch=6, length=5):
    g = torch.Generator().manual_seed(seed)
    log_probs = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    old = log_probs + 0.4 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    ref = log_probs + 0.3 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    advantages = torch.randn(batch, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4, 1, 5, 3])[:batch]
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return log_probs, old, ref, advantages, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta, correction", [(0.0, False), (0.05, False), (0.05, True)])
def test_loss_equals_the_float64_formula(loss_type, beta, correction):
    log_probs, old, ref, advantages, mask = loss_batch()
    got = grpo_loss(log_probs, old, advantages, mask, epsilon=0.2, beta=beta,
                    ref_log_probs=ref if beta else None, loss_type=loss_type,
                    kl_correction=correction)
    want = by_hand_loss(log_probs.tolist(), old.tolist(), advantages.tolist(), mask.tolist(),
                        epsilon=0.2, beta=beta, ref=ref.tolist(), loss_type=loss_type,
                        correction=correction)
    assert got.item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("epsilon", [1.0, 1.5])
def test_an_epsilon_of_1_or_more_turns_the_lower_clip_off(epsilon):
    """TRL accepts epsilon >= 1 (issue 40): 1 - epsilon <= 0 is below every ratio, so only the
    upper clip acts; the loss is the formula's, and a ratio far below 1 keeps its gradient."""
    log_probs, old, _, advantages, mask = loss_batch()
    got = grpo_loss(log_probs, old, advantages, mask, epsilon=epsilon)
    want = by_hand_loss(log_probs.tolist(), old.tolist(), advantages.tolist(), mask.tolist(),
                        epsilon=epsilon)
    assert got.item() == pytest.approx(want, abs=1e-12)
    low = torch.tensor([[math.log(0.01)]], dtype=torch.float64, requires_grad=True)
    grpo_loss(low, torch.zeros_like(low), torch.tensor([-1.0], dtype=torch.float64),
              torch.ones_like(low, dtype=torch.bool), epsilon=epsilon).backward()
    assert low.grad.item() == pytest.approx(0.01)       # d(-ratio * A)/d logp = ratio
    low.grad = None
    grpo_loss(low, torch.zeros_like(low), torch.tensor([-1.0], dtype=torch.float64),
              torch.ones_like(low, dtype=torch.bool), epsilon=0.2).backward()
    assert low.grad.item() == 0.0                        # the check can fail: clipped at 0.8


def test_first_loss_is_zero_on_policy():
    """Ratio 1 everywhere and group advantages summing to 0: the loss is 0, its gradient not."""
    log_probs, _, _, _, mask = loss_batch()
    log_probs.requires_grad_(True)
    advantages = group_advantages(torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 5.0],
                                               dtype=torch.float64), 3)
    loss = grpo_loss(log_probs, log_probs.detach(), advantages, mask)
    loss.backward()
    assert abs(loss.item()) < 1e-12
    assert log_probs.grad.abs().max() > 0.01


def test_clip_acts_only_outside_the_range_in_the_advantages_direction():
    """One token per row; d loss / d log_prob is 0 exactly where PPO's clip cuts the gradient:
    ratio > 1 + eps with A > 0, and ratio < 1 - eps with A < 0."""
    eps = 0.2
    ratios = torch.tensor([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 2.0], dtype=torch.float64)
    for sign in (1.0, -1.0):
        log_probs = ratios.log()[:, None].clone().requires_grad_(True)
        old = torch.zeros_like(log_probs)
        advantages = torch.full((len(ratios),), sign, dtype=torch.float64)
        mask = torch.ones_like(old, dtype=torch.bool)
        grpo_loss(log_probs, old, advantages, mask, epsilon=eps, loss_type="bnpo").backward()
        grad = log_probs.grad[:, 0]
        if sign > 0:
            cut = ratios > 1 + eps
        else:
            cut = ratios < 1 - eps
        assert (grad[cut] == 0).all() and (grad[~cut] != 0).all(), (sign, grad)
        # where it is not cut, the gradient is -A * ratio / n
        assert torch.allclose(grad[~cut], -sign * ratios[~cut] / len(ratios))


def test_only_the_policy_log_probs_are_differentiated():
    """The old and reference log-probabilities and the advantages are constants, even when
    they come with a gradient (computed by the same model): detached inside."""
    log_probs, old, ref, advantages, mask = loss_batch()
    inputs = [t.clone().requires_grad_(True) for t in (log_probs, old, ref, advantages)]
    grpo_loss(inputs[0], inputs[1], inputs[3], mask, beta=0.1, ref_log_probs=inputs[2],
              kl_correction=True).backward()
    assert inputs[0].grad is not None and inputs[0].grad.abs().max() > 0
    assert all(t.grad is None for t in inputs[1:])


def test_the_kl_term_is_k3_and_zero_at_the_reference():
    log_probs, old, ref, advantages, mask = loss_batch()
    zero = torch.zeros_like(advantages)
    same = grpo_loss(log_probs, old, zero, mask, beta=0.5, ref_log_probs=log_probs.clone())
    assert same.item() == 0.0
    moved = grpo_loss(log_probs, old, zero, mask, beta=0.5, ref_log_probs=ref)
    d = (ref - log_probs)[mask]
    k3 = torch.exp(d) - d - 1
    assert moved.item() > 0
    assert moved.item() == pytest.approx(
        by_hand_loss(log_probs.tolist(), old.tolist(), zero.tolist(), mask.tolist(),
                     epsilon=0.2, beta=0.5, ref=ref.tolist()), abs=1e-12)
    assert (k3 >= 0).all()


def test_loss_refusals():
    log_probs, old, ref, advantages, mask = loss_batch()
    cases = [
        ({"mask": mask.long()}, TypeError, "mask must be a boolean tensor"),
        ({"mask": torch.zeros_like(mask)}, ValueError, "mask is False everywhere"),
        ({"mask": mask[:, :3]}, ValueError, r"mask must have the shape of log_probs \(6, 5\)"),
        ({"old_log_probs": old[:, :3]}, ValueError, "old_log_probs must have the shape"),
        ({"old_log_probs": old.float()}, TypeError, "must have the same dtype"),
        ({"advantages": advantages[:4]}, ValueError, "advantages must hold one value per "
                                                     "completion, 6"),
        ({"advantages": advantages.clone().fill_(float("nan"))}, ValueError,
         "advantages must be finite"),
        ({"log_probs": log_probs.masked_fill(mask, float("nan"))}, ValueError,
         "log_probs must be finite on the completion tokens"),
        ({"beta": 0.1}, ValueError, "beta=0.1 weights a KL term to the reference"),
        ({"ref_log_probs": ref}, ValueError, "ref_log_probs given with beta=0"),
        ({"beta": -0.1, "ref_log_probs": ref}, ValueError, "beta must be at least 0.0"),
        ({"epsilon": 0}, ValueError, "epsilon must be positive, got 0"),
        ({"epsilon": "0.2"}, TypeError, "epsilon must be a number, got str"),
        ({"loss_type": "ppo"}, ValueError, r"loss_type must be one of .* got 'ppo'"),
        ({"log_probs": log_probs[0]}, ValueError, "log_probs must have 2 dimensions"),
    ]
    for change, error, match in cases:
        args = {"log_probs": log_probs, "old_log_probs": old, "advantages": advantages,
                "mask": mask, **change}
        with pytest.raises(error, match=match):
            grpo_loss(args.pop("log_probs"), args.pop("old_log_probs"), args.pop("advantages"),
                      args.pop("mask"), **args)


def test_masked_padding_does_not_change_the_loss():
    log_probs, old, _, advantages, mask = loss_batch()
    noisy = log_probs.masked_fill(~mask, -1e9)       # large junk where mask is False
    for loss_type in ("grpo", "bnpo", "dr_grpo"):
        assert grpo_loss(noisy, old, advantages, mask, loss_type=loss_type).item() == \
            pytest.approx(grpo_loss(log_probs, old, advantages, mask,
                                    loss_type=loss_type).item(), abs=1e-12)


# --- log-probabilities and batches -------------------------------------------------------------

def test_per_token_log_probs_equal_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g, dtype=torch.float64)
    targets = torch.tensor([[-100, 3, 6, -100], [0, -100, -100, 2]])
    got = per_token_log_probs(logits, targets)
    for b in range(2):
        for t in range(4):
            want = 0.0 if targets[b, t] < 0 else math.log(
                math.exp(logits[b, t, targets[b, t]].item())
                / sum(math.exp(x) for x in logits[b, t].tolist()))
            assert got[b, t].item() == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="targets holds token id 7, outside the vocabulary"):
        per_token_log_probs(logits, torch.full((2, 4), 7))
    with pytest.raises(ValueError, match=r"targets must be \(B, T\) = \(2, 4\)"):
        per_token_log_probs(logits, targets[:, :3])


def test_completion_batch_scores_only_the_completions():
    idx, targets = completion_batch([[1, 2, 3], [4]], [[5, 6], [7], [8, 9, 10], [11]])
    assert idx.tolist() == [[1, 2, 3, 5], [1, 2, 3, 0], [4, 8, 9, 0], [4, 0, 0, 0]]
    assert targets.tolist() == [[-100, -100, 5, 6], [-100, -100, 7, -100],
                                [8, 9, 10, -100], [11, -100, -100, -100]]
    with pytest.raises(ValueError, match="same number of completions for each of the 2"):
        completion_batch([[1], [2]], [[3], [4], [5]])
    with pytest.raises(ValueError, match=r"completions\[1\] is empty"):
        completion_batch([[1]], [[3], []])


# --- sampling -------------------------------------------------------------------------------

def count_forwards(model):
    """A hook that records the batch size of every forward call. A hooked GPT runs its own
    ``forward`` in ``generate`` (the fast decode step steps aside for hooks), so each step's
    model call is counted."""
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
    return calls


def tiny_llama(vocab_size=16, context_length=32):
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=vocab_size, context_length=context_length,
                             num_layers=2, num_heads=2, num_kv_heads=1, d_model=16))


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama])
def test_sampling_a_group_is_one_forward_per_step(make):
    model = make()
    calls = count_forwards(model)
    prompts = [[1, 2, 3], [4, 5, 6]]
    completions = sample_group(model, prompts, 8, 5, generator=torch.Generator().manual_seed(0))
    assert len(completions) == 16 and all(len(c) == 5 for c in completions)
    assert calls == [16] * 5                 # 5 steps, each one forward for all 2 x 8 rows
    # prompts of two lengths: one call per length
    calls.clear()
    sample_group(model, [[1, 2], [3, 4, 5], [6, 7]], 4, 3)
    assert calls == [8] * 3 + [4] * 3


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama])
def test_sampling_a_group_is_one_decode_step_per_token(make):
    """The same count on the fast path that an unhooked model takes: the prefill and each
    decode step are one call of the step function for all the rows."""
    model = make()
    calls, make_step = [], model.make_fast_decode_step        # generate's default step

    def counting_step():
        step = make_step()

        def counted(idx, cache):
            calls.append(tuple(idx.shape))
            return step(idx, cache)
        return counted

    model.make_fast_decode_step = counting_step
    sample_group(model, [[1, 2, 3], [4, 5, 6]], 8, 5)
    assert calls == [(16, 3)] + [(16, 1)] * 4


def test_group_samples_are_those_of_generate():
    model = tiny_gpt()
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    greedy = sample_group(model, prompts, 3, 6, temperature=0.0)
    want = generate(model, prompts, 6, temperature=0.0)[:, 3:].tolist()
    assert greedy == [want[0]] * 3 + [want[1]] * 3
    ours = sample_group(model, prompts, 4, 6, generator=torch.Generator().manual_seed(5))
    theirs = generate(model, prompts.repeat_interleave(4, dim=0), 6,
                      generator=torch.Generator().manual_seed(5))[:, 3:].tolist()
    assert ours == theirs
    assert len({tuple(c) for c in ours[:4]}) > 1         # sampled, not four copies


def test_completions_end_after_the_first_eos():
    model = tiny_gpt()
    completions = sample_group(model, [[1, 2]], 16, 8, eos_id=3,
                               generator=torch.Generator().manual_seed(0))
    for c in completions:
        assert 3 not in c[:-1] and (c[-1] == 3 or len(c) == 8)
    assert any(c[-1] == 3 and len(c) < 8 for c in completions)


@pytest.mark.parametrize("prompts, group_size, error, match", [
    ([], 2, ValueError, "prompt_ids is empty"),
    ([[1], []], 2, ValueError, r"prompt_ids\[1\] is empty"),
    ("abc", 2, TypeError, "prompt_ids must be a list of prompts"),
    ([[1, "a"]], 2, TypeError, r"a token of prompt_ids\[0\] must be an int"),
    ([[1, -2]], 2, ValueError, r"a token of prompt_ids\[0\] must be at least 0, got -2"),
    ([[1, 99]], 2, ValueError, "idx holds token id 99, outside the vocabulary"),
    ([[1]], 0, ValueError, "group_size must be at least 1, got 0"),
    ([[1] * 30], 2, ValueError, "more than context_length=32"),
])
def test_sampling_refusals(prompts, group_size, error, match):
    with pytest.raises(error, match=match):
        sample_group(tiny_gpt(), prompts, group_size, 4)


# --- training -------------------------------------------------------------------------------

def test_a_grpo_step_starts_at_zero_and_training_raises_the_reward():
    """Reward: the share of a completion's tokens that are token 5. On-policy, the first
    iteration's loss is 0; 25 steps raise the mean reward well above chance (1/16)."""
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)

    def reward(completions):
        return [sum(t == 5 for t in c) / len(c) for c in completions]

    first = grpo_step(model, optimizer, [[1, 2, 3], [4, 6, 7]], reward, group_size=8,
                      max_new_tokens=4, generator=g)
    assert abs(first["loss"]) < 1e-6
    history = [grpo_step(model, optimizer, [[1, 2, 3], [4, 6, 7]], reward, group_size=8,
                         max_new_tokens=4, generator=g, num_iterations=2) for _ in range(25)]
    assert first["reward"] < 0.2
    assert sum(h["reward"] for h in history[-5:]) / 5 > 0.6
    assert all(h["clip_fraction"] >= 0 for h in history)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_a_grpo_step_refuses_a_temperature_that_is_not_positive(temperature):
    # review of chapter 17: temperature 0 divided the logits by 0 and ended in a NaN message
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match=f"temperature must be positive, got {temperature}"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [1.0] * len(c), group_size=2,
                  max_new_tokens=2, temperature=temperature)


def test_a_grpo_step_with_a_reference_reports_the_kl():
    model, ref = tiny_gpt(), tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = grpo_step(model, optimizer, [[1, 2]], lambda c: [float(len(c)) for c in c],
                      group_size=4, max_new_tokens=3, ref_model=ref, beta=0.1,
                      generator=torch.Generator().manual_seed(0))
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)   # the same weights: no divergence
    # measured without being in the loss (beta=0), after the policy has moved
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    moved = [grpo_step(model, optimizer, [[1, 2]], lambda c: [float(sum(c)) for c in c],
                       group_size=4, max_new_tokens=3, ref_model=ref,
                       generator=torch.Generator().manual_seed(0)) for _ in range(3)]
    assert moved[0]["kl"] == pytest.approx(0.0, abs=1e-6) and moved[-1]["kl"] > 1e-3


def test_grpo_step_refusals():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ok = {"group_size": 2, "max_new_tokens": 2}
    with pytest.raises(ValueError, match="reward returned 3 numbers for 4 completions"):
        grpo_step(model, optimizer, [[1, 2], [3, 4]], lambda c: [0.0] * 3, **ok)
    with pytest.raises(ValueError, match=r"rewards\[1\] is nan"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0, float("nan")], **ok)
    with pytest.raises(TypeError, match=r"reward returned str \('1'\) at index 0"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: ["1", 0.0], **ok)
    with pytest.raises(TypeError, match="reward must be a function"):
        grpo_step(model, optimizer, [[1, 2]], [1.0, 0.0], **ok)
    with pytest.raises(ValueError, match="beta=0.1 needs a ref_model"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0, 1.0], beta=0.1, **ok)
    with pytest.raises(ValueError, match="advantage must be one of"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0, 1.0], advantage="none", **ok)
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1, got 0"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0, 1.0], group_size=2,
                  max_new_tokens=0)
    with pytest.raises(ValueError, match="group_size must be at least 2, got 1"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0], group_size=1, max_new_tokens=2)


def test_a_grpo_step_refuses_an_optimizer_over_another_model():
    # issue 40: it changed nothing and reported metrics
    model = tiny_gpt()
    optimizer = torch.optim.SGD(tiny_gpt().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="the optimizer holds none of the model's trainable"):
        grpo_step(model, optimizer, [[1, 2]], lambda c: [0.0, 1.0], group_size=2,
                  max_new_tokens=2)


def test_completion_batch_refuses_a_negative_token():
    # issue 40: a target of -3 was kept (and -100 would silently drop a token)
    with pytest.raises(ValueError, match=r"a token of completions\[1\] must be at least 0"):
        completion_batch([[1, 2]], [[3, 4], [5, -3]])


# --- the task and its rewards ----------------------------------------------------------------

def test_the_task_is_checked_by_a_program():
    train, val = data.verifiable_splits(40, 20, seed=0)
    assert (train, val) == data.verifiable_splits(40, 20, seed=0)
    assert {row["task"] for row in val} == set(data.INSTRUCTION_TASKS)
    for row in train + val:
        assert list(row) == ["prompt", "answer", "task"]
        assert [m["role"] for m in row["prompt"]] == ["user"]
        assert data.reward_exact([row["answer"]], [row["answer"]]) == [1.0]
    # held-out sentences never appear in chapter 16's training conversations (same seed)
    sft_train, _ = data.instruction_splits(3000, 0, seed=0)
    asked = {m["content"] for c in sft_train for m in c if m["role"] == "user"}
    held_out = [row["answer"] for row in val if row["task"] == "repeat"]    # the sentence
    trained = [row["answer"] for row in train if row["task"] == "repeat"]
    wordings = [w for ws in data.INSTRUCTION_TASKS.values() for w in ws]
    assert any(w.format(s) in asked for s in trained for w in wordings)     # the check can fail
    assert not any(w.format(s) in asked for s in held_out for w in wordings)
    with pytest.raises(ValueError, match="unknown task 'sum'"):
        data.verifiable_splits(1, 1, tasks=["sum"])
    with pytest.raises(TypeError, match="tasks must be a list"):
        data.verifiable_splits(1, 1, tasks="reverse")


def test_rewards():
    answers = ["bo logi kopa"] * 4
    replies = ["bo logi kopa", "bo  logi kopa ", "bo logi", "kopa bo logi bo logi kopa mia"]
    assert data.reward_exact(replies, answers) == [1.0, 1.0, 0.0, 0.0]
    assert data.reward_overlap(replies, answers) == [1.0, 1.0, pytest.approx(2 / 3), 1.0]
    assert data.reward_length(replies) == [3.0, 3.0, 2.0, 7.0]
    # TRL's conversational completions
    conversational = [[{"role": "assistant", "content": r}] for r in replies]
    assert data.reward_exact(conversational, answers) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="answer has 1 entries and completions 4"):
        data.reward_exact(replies, answers[:1])
    with pytest.raises(TypeError, match=r"completions\[1\] must be a str, got int"):
        data.reward_length(["a", 3])
    with pytest.raises(TypeError, match="completions must be a list of replies"):
        data.reward_exact("bo logi kopa", answers)


# --- chat-format training loop -------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_setup():
    train, val = data.verifiable_splits(24, 6, seed=0, tasks=["repeat"])
    text = " ".join(r["prompt"][0]["content"] + " " + r["answer"] for r in train + val)
    tok = BPETokenizer.train(text, 300, pattern=GPT2_PATTERN,
                             special_tokens=["<|endoftext|>", *CHAT_TOKENS])
    return tok, train, val


def _grpo_by_steps(model, tok, rows, reward_func, *, steps, batch_size, group_size, lr,
                   max_new_tokens, num_iterations, temperature, seed=0):
    """grpo_train as it was before issue 40: grpo_step in a plain loop, AdamW, no clipping."""
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    end = tok.special_tokens[END_OF_TURN]
    history = []
    for step in range(1, steps + 1):
        batch = [rows[order[((step - 1) * batch_size + k) % len(rows)]]
                 for k in range(batch_size)]
        stats = grpo_step(model, optimizer, chat_prompts(tok, batch),
                          chat_rewards(tok, batch, reward_func, group_size),
                          group_size=group_size, max_new_tokens=max_new_tokens, eos_id=end,
                          num_iterations=num_iterations, temperature=temperature,
                          generator=generator)
        history.append({**stats, "step": step})
    return history


def test_grpo_train_runs_on_chat_rows(chat_setup):
    tok, train, val = chat_setup
    model = tiny_gpt(len(tok), context_length=64)
    history = grpo_train(model, tok, train, [data.reward_overlap, data.reward_length], steps=3,
                         batch_size=2, group_size=3, lr=1e-3, max_new_tokens=6, eval_rows=val,
                         eval_reward=data.reward_exact, eval_every=2)
    assert [h["step"] for h in history] == [0, 1, 2, 3]
    again = grpo_train(tiny_gpt(len(tok), context_length=64), tok, train,
                       [data.reward_overlap, data.reward_length], steps=3, batch_size=2,
                       group_size=3, lr=1e-3, max_new_tokens=6, eval_rows=val,
                       eval_reward=data.reward_exact, eval_every=2)
    assert again == history                          # seeded: the same run twice
    assert "held_out" in history[0] and "held_out" in history[2] and "held_out" in history[3]
    assert abs(history[1]["loss"]) < 1e-6
    assert 0 <= history[-1]["held_out"] <= 1
    # issue 40: grpo_train runs in TrainingLoop; without clipping and schedule (the defaults)
    # it is the loop of grpo_step with AdamW it used to be, bit for bit, and not with them
    for iterations in (1, 2):
        options = dict(steps=3, batch_size=2, group_size=3, lr=1e-2, max_new_tokens=6,
                       num_iterations=iterations, temperature=0.9)
        models = [tiny_gpt(len(tok), context_length=64) for _ in range(3)]
        by_hand = _grpo_by_steps(models[0], tok, train, data.reward_length, **options)
        assert grpo_train(models[1], tok, train, data.reward_length, **options) == by_hand
        grpo_train(models[2], tok, train, data.reward_length, max_grad_norm=1e-3,
                   schedule="cosine", warmup_steps=1, **options)
        for mine, theirs, clipped in zip(*(m.parameters() for m in models)):
            assert torch.equal(mine, theirs)
        assert any(not torch.equal(a, b) for a, b in zip(models[0].parameters(),
                                                         tiny_gpt(len(tok), 64).parameters()))
        assert any(not torch.equal(a, b) for a, b in zip(models[0].parameters(),
                                                         models[2].parameters()))
    # mean_reward: the greedy replies, cut at <|end|>, scored
    end = tok.special_tokens[END_OF_TURN]
    words = []
    for row in val:
        prompt = torch.tensor([tok.apply_chat_template(row["prompt"],
                                                       add_generation_prompt=True)])
        new = generate(model, prompt, 6, temperature=0.0, eos_id=end)[0, prompt.shape[1]:]
        words.append(len(tok.decode([t for t in new.tolist() if t != end]).split()))
    assert mean_reward(model, tok, val, data.reward_length, max_new_tokens=6) == \
        pytest.approx(sum(words) / len(words))
    # or the mean over sampled replies, group after group
    drawn = sample_group(model, chat_prompts(tok, val), 3, 6, eos_id=end,
                         generator=torch.Generator().manual_seed(4))
    lengths = data.reward_length(chat_replies(tok, drawn))
    assert mean_reward(model, tok, val, data.reward_length, max_new_tokens=6, temperature=1.0,
                       samples=3, generator=torch.Generator().manual_seed(4)) == \
        pytest.approx(sum(lengths) / len(lengths))


# --- against TRL ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl_setup(chat_setup, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = chat_setup[0]
    model = tiny_gpt(len(tok), context_length=64, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))   # no unit norms or zero biases left
    path = tmp_path_factory.mktemp("grpo_trl")
    tok.save_pretrained(path)
    write_chat_template(path, tok)
    model.save_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    dataset = Dataset.from_list([{"prompt": "repeat: x"}] * 8)
    return model.eval(), hf, AutoTokenizer.from_pretrained(path), dataset, path


def trl_batch(vocab_size, end):
    """Four prompts of one length (TRL pads prompts on the left, whose positions transformers'
    GPT-2 does not shift), two completions each, right-padded; fixed rewards."""
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(3, vocab_size, (4, 5), generator=g)
    completions = torch.randint(3, vocab_size, (8, 6), generator=g)
    lengths = [6, 2, 4, 1, 6, 3, 5, 6]
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    completions = completions.masked_fill(~mask, end)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 2.0, 3.0, 1.0])
    return prompts, completions, mask, rewards


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta, correction", [(0.0, False), (0.04, False), (0.04, True)])
def test_loss_equals_trl_grpo_trainer(trl_setup, loss_type, beta, correction):
    from trl import GRPOConfig, GRPOTrainer

    ours, hf, hf_tok, dataset, path = trl_setup
    prompts, completions, mask, rewards = trl_batch(ours.config.vocab_size,
                                                    hf_tok.convert_tokens_to_ids(END_OF_TURN))
    group_size = 2
    advantages = group_advantages(rewards, group_size)
    prompt_rows = prompts.repeat_interleave(group_size, dim=0)               # (8, 5)
    idx, targets = completion_batch(prompts.tolist(),
                                    [c[m].tolist() for c, m in zip(completions, mask)])
    ours.zero_grad()
    log_probs = per_token_log_probs(ours(idx)[0], targets)[:, 4:]           # (8, 6)
    g = torch.Generator().manual_seed(1)
    noise = 0.3 * torch.randn((2, *log_probs.shape), generator=g)
    old = (log_probs.detach() + noise[0]).masked_fill(~mask, 0)
    ref = (log_probs.detach() + noise[1]).masked_fill(~mask, 0)
    args = GRPOConfig(output_dir=str(path / "out"), use_cpu=True, report_to=[],
                      save_strategy="no", disable_tqdm=True, loss_type=loss_type, beta=beta,
                      epsilon=0.2, num_generations=group_size, per_device_train_batch_size=8,
                      max_completion_length=6, temperature=1.0, bf16=False,
                      use_bias_correction_kl=correction)
    trainer = GRPOTrainer(model=hf, args=args, processing_class=hf_tok, train_dataset=dataset,
                          reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    trainer.model.eval()
    trainer.model.zero_grad()
    inputs = {"prompt_ids": prompt_rows, "prompt_mask": torch.ones_like(prompt_rows),
              "completion_ids": completions, "completion_mask": mask.long(),
              "advantages": advantages, "old_per_token_logps": old,
              "num_items_in_batch": mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref
    theirs = trainer._compute_loss(trainer.model, inputs)
    mine = grpo_loss(log_probs, old, advantages, mask, epsilon=0.2, beta=beta,
                     ref_log_probs=ref if beta else None, loss_type=loss_type,
                     kl_correction=correction)
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert abs(mine.item()) > 1e-3          # a loss that is not trivially 0 on both sides
    mine.backward()
    theirs.backward()
    body = trainer.model.transformer
    for our, their in [(ours.token_embedding, body.wte), (ours.position_embedding, body.wpe),
                       (ours.norm, body.ln_f), (ours.layers[0].norm1, body.h[0].ln_1)]:
        torch.testing.assert_close(our.weight.grad, their.weight.grad, atol=1e-5, rtol=1e-4)


def test_chat_reward_refusals(chat_setup):
    from minitransformer.grpo import chat_rewards

    tok, train, _ = chat_setup
    with pytest.raises(ValueError, match="reward function <lambda> must return one number for "
                                         "each of the 4 completions, got list of 3"):
        chat_rewards(tok, train[:2], lambda completions, **kw: [0.0] * 3, 2)([[5]] * 4)
    with pytest.raises(TypeError, match=r"reward function <lambda> returned NoneType \(None\) "
                                        r"at index 0"):
        chat_rewards(tok, train[:1], lambda completions, **kw: [None, 1], 2)([[5]] * 2)
    with pytest.raises(TypeError, match="reward_funcs must be a reward function or a list"):
        chat_rewards(tok, train[:1], [], 2)
    with pytest.raises(ValueError, match="rows is empty"):
        chat_rewards(tok, [], data.reward_exact, 2)
    with pytest.raises(ValueError, match=r"rows\[0\] must be a dict with a 'prompt'"):
        chat_rewards(tok, [{"answer": "x"}], data.reward_exact, 2)
    # TRL's signature: the other columns arrive as keyword arguments, repeated per completion
    seen = {}

    def spy(prompts, completions, answer, task, **kwargs):
        seen.update(prompts=prompts, answer=answer, task=task)
        return [1.0] * len(completions)

    assert chat_rewards(tok, train[:2], [spy, spy], 3)([[5]] * 6) == [2.0] * 6
    assert seen["answer"] == [train[0]["answer"]] * 3 + [train[1]["answer"]] * 3
    assert seen["prompts"][3] == train[1]["prompt"]


@pytest.mark.parametrize("advantage", ["group", "group_mean", "batch", "raw"])
def test_a_reward_of_none_is_unscored_as_in_trl(advantage):
    """None from the reward (TRL's unscorable completion): left out of its group's mean and
    spread, its advantage 0, as TRL's nanmean, nanstd and nan_to_num give (written here from
    its formulas); a group with one scored reply has no spread: advantage 0 too."""
    from minitransformer.grpo import GRPO

    values = [None, 1.0, 3.0, 0.5, None, None, 2.0, 2.0, 5.0]
    objective = GRPO(tiny_gpt(), temperature=1.0)
    rollout = objective.rollout([[1, 2], [3], [4, 5]], lambda c: values, group_size=3,
                                max_new_tokens=2, advantage=advantage,
                                generator=torch.Generator().manual_seed(0))
    r = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)
    rows = r.view(-1, 3) if advantage != "batch" else r.view(1, -1)

    def nanstd(x):
        mean = torch.nanmean(x, dim=1, keepdim=True)
        variance = torch.nanmean((x - mean) ** 2, dim=1, keepdim=True)
        count = torch.sum(~torch.isnan(x), dim=1, keepdim=True)
        return torch.sqrt(variance * count / (count - 1))

    expected = r if advantage == "raw" else rows - torch.nanmean(rows, dim=1, keepdim=True)
    if advantage in ("group", "batch"):
        expected = expected / (nanstd(rows) + 1e-4)
    expected = torch.nan_to_num(expected.reshape(-1), nan=0.0)
    torch.testing.assert_close(rollout.advantages.double(), expected, rtol=1e-6, atol=1e-6)
    assert rollout.advantages[[0, 4, 5]].eq(0).all()
    stats = rollout.stats()
    assert stats["unscored"] == 3 and stats["reward"] == pytest.approx(13.5 / 6)
    with pytest.raises(ValueError, match=r"rewards\[2\] is nan: every reward must be a finite "
                                         r"number \(None marks"):
        objective.rollout([[1, 2]], lambda c: [None, 1.0, math.nan], group_size=3,
                          max_new_tokens=2)
