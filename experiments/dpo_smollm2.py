"""DPO on SmolLM2-135M-Instruct: answers that stop after one sentence (chapter 17).

Asked "Tell me about a volcano.", SmolLM2 writes on and on. The preference pairs come from the
model itself (on-policy): for each prompt its greedy reply is cut at its first sentence for the
chosen answer, and at its last complete sentence (two or more) for the rejected one. Both sides
are the model's own words; they differ only in where the answer ends.

Each run trains LoRA adapters (rank 16, the attention projections) with the package's
``dpo_train`` against the frozen model, for two values of beta and two seeds. On held-out
prompts it measures, before and after:

- the preference accuracy: how often the implicit reward of the chosen answer is above the
  rejected one's (TRL's ``rewards/accuracies``; 0 before training, where every reward is 0);
- the implicit reward margin, ``beta * (chosen log-ratio - rejected log-ratio)``;
- the KL to the reference, summed over the answers' tokens (exact, over the vocabulary);
- the behaviour: the probability of ending the turn right after the first sentence (what a
  sampled reply does), the greedy reply's length in words, and the share of greedy replies
  that stop (end of turn) after one sentence.

    python experiments/dpo_smollm2.py                  # the stored results, every setting
    python experiments/dpo_smollm2.py --steps 2 --seeds 0 --betas 0.1 --held-out 4 --out /tmp/d.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.chat import end_of_turn_id
from minitransformer.grpo import chat_prompts, chat_replies, sample_group
from minitransformer.llama import Llama
from minitransformer.lora import trainable_parameters
from minitransformer.preferences import (
    dpo_batch,
    dpo_train,
    implicit_rewards,
    kl_estimate,
    preference_accuracy,
    sequence_log_probs,
)
from smollm2_common import LORA, clock, load_smollm2, lora_copy, timing, write_results

TOPICS = (
    "a volcano", "rain", "the moon", "a bicycle", "bread", "a library", "a rainbow", "coffee",
    "the ocean", "a piano", "snow", "a forest", "the sun", "a river", "a clock", "an apple",
    "a castle", "thunder", "a desert", "a bridge", "tea", "a camera", "honey", "a glacier",
    "a lighthouse", "chess", "a telescope", "wind", "a garden", "an island", "a candle",
    "a train", "a mountain", "cheese", "a violin", "the sky", "a museum", "a map", "salt",
    "a beehive", "a compass", "a waterfall", "a kite", "a windmill", "paper", "a dolphin",
    "an owl", "a cactus", "a tiger", "a penguin", "a storm", "a market", "a lake", "a cloud",
    "a spider", "a harbour",
)
QUESTION = "Tell me about {topic}."
MAX_NEW_TOKENS = 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def prompt_rows(topics: list[str]) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": QUESTION.format(topic=t)}]} for t in topics]


def sentences(reply: str) -> list[str]:
    """The complete sentences at the start of ``reply`` (an unfinished one is dropped)."""
    parts = _SENTENCE_END.split(reply.strip())
    return [p for p in parts if re.search(r"[.!?]$", p)] if parts else []


def greedy(model: Llama, tokenizer: BPETokenizer, rows: list[dict]) -> list[tuple[str, bool]]:
    """Each greedy reply, and whether it ended (end of turn) within ``MAX_NEW_TOKENS``."""
    end = end_of_turn_id(tokenizer)
    completions = sample_group(model, chat_prompts(tokenizer, rows), 1, MAX_NEW_TOKENS,
                               temperature=0.0, eos_id=end)
    return list(zip(chat_replies(tokenizer, completions), (c[-1] == end for c in completions)))


def behaviour(replies: list[tuple[str, bool]]) -> dict:
    """The mean reply length in words and the share that stop after one sentence."""
    one = [ended and len(_SENTENCE_END.split(reply.strip())) == 1 for reply, ended in replies]
    return {"words": sum(len(r.split()) for r, _ in replies) / len(replies),
            "one_sentence_rate": sum(one) / len(one)}


def make_pairs(rows: list[dict], replies: list[tuple[str, bool]]) -> list[dict]:
    """TRL's conversational pairs: the first sentence chosen, all complete ones rejected.
    Prompts whose reply has fewer than two complete sentences make no pair."""
    pairs = []
    for row, (reply, _) in zip(rows, replies):
        done = sentences(reply)
        if len(done) >= 2:
            pairs.append({"prompt": row["prompt"],
                          "chosen": [{"role": "assistant", "content": done[0]}],
                          "rejected": [{"role": "assistant", "content": " ".join(done)}]})
    return pairs


def stop_probability(logits: torch.Tensor, targets: torch.Tensor, end: int) -> float:
    """The mean probability of ending the turn right after the first sentence: at the
    chosen rows' first scored end of turn. ``(2B, T, V)``, ``(2B, T)`` -> a float."""
    chosen, chosen_targets = logits[:len(logits) // 2], targets[:len(targets) // 2]
    probs = []
    for row, target in zip(chosen, chosen_targets):
        where = int((target == end).nonzero()[0])
        probs.append(row[where].softmax(-1)[end].item())
    return sum(probs) / len(probs)


def measure(policy: Llama, reference: Llama, tokenizer: BPETokenizer, pairs: list[dict], *,
            beta: float) -> dict:
    """Held-out preference accuracy, mean implicit reward margin, mean KL to the reference
    (per answer, over chosen and rejected answers) and the probability of stopping after the
    first sentence, the policy's and the reference's."""
    idx, targets = dpo_batch(tokenizer, pairs)
    end = end_of_turn_id(tokenizer)
    with torch.no_grad():
        logits, ref_logits = policy(idx)[0], reference(idx)[0]
        rewards = implicit_rewards(sequence_log_probs(logits, targets),
                                   sequence_log_probs(ref_logits, targets), beta=beta)
        chosen, rejected = rewards.chunk(2)
        kl = kl_estimate(logits, ref_logits, targets)
    return {"preference_accuracy": preference_accuracy(chosen, rejected),
            "margin": (chosen - rejected).mean().item(), "kl": kl.mean().item(),
            "stop_probability": stop_probability(logits, targets, end),
            "reference_stop_probability": stop_probability(ref_logits, targets, end)}


def train_policy(base: Llama, tokenizer: BPETokenizer, train_pairs: list[dict], *, beta: float,
                 seed: int, steps: int, lr: float, batch_size: int) -> tuple[Llama, object]:
    """The recipe: a LoRA copy of ``base`` (:func:`smollm2_common.lora_copy`) trained by DPO
    against ``base``; returns the policy and its training history. (``forgetting_smollm2.py``
    trains the same way.)"""
    policy = lora_copy(base, seed)
    history = dpo_train(policy, tokenizer, train_pairs, reference=base, beta=beta, steps=steps,
                        lr=lr, batch_size=batch_size, seed=seed, progress=False)
    return policy, history


def preference_data(base: Llama, tokenizer: BPETokenizer, prompts: int, held_out: int
                    ) -> tuple[list[dict], list, list[dict], list[dict]]:
    """The on-policy data: the first ``prompts`` topics' rows, ``base``'s greedy replies to
    them, and the pairs made from the first ``held_out`` (held out) and from the others
    (training)."""
    rows = prompt_rows(list(TOPICS[:prompts]))
    replies = greedy(base, tokenizer, rows)              # the model's own answers: the data
    return (rows, replies, make_pairs(rows[:held_out], replies[:held_out]),
            make_pairs(rows[held_out:], replies[held_out:]))


def run(base: Llama, tokenizer: BPETokenizer, train_pairs: list[dict], held_out: list[dict],
        held_out_rows: list[dict], *, beta: float, seed: int, steps: int, lr: float,
        batch_size: int) -> dict:
    start = time.perf_counter()
    policy, history = train_policy(base, tokenizer, train_pairs, beta=beta, seed=seed,
                                   steps=steps, lr=lr, batch_size=batch_size)
    train_s = time.perf_counter() - start
    replies = greedy(policy, tokenizer, held_out_rows)
    return {"beta": beta, "seed": seed, "train_losses": history.train_losses,
            "after": {**measure(policy, base, tokenizer, held_out, beta=beta),
                      **behaviour(replies)},
            "replies": [r for r, _ in replies[:4]], "train_seconds": round(train_s, 1),
            "trainable_parameters": trainable_parameters(policy)[0]}


def summarise(before: dict, runs: list[dict]) -> dict:
    out = {}
    for beta in sorted({r["beta"] for r in runs}):
        mine = [r["after"] for r in runs if r["beta"] == beta]
        entry = {}
        for key in ("preference_accuracy", "margin", "kl", "stop_probability", "words",
                    "one_sentence_rate"):
            values = [m[key] for m in mine]
            entry[key] = {"before": before.get(key), "after": values,
                          "spread": max(values) - min(values)}
        for key in ("one_sentence_rate", "stop_probability"):
            rate = entry[key]
            rate["gain"] = sum(rate["after"]) / len(rate["after"]) - before[key]
            rate["gain_exceeds_spread"] = rate["gain"] > rate["spread"]
        out[str(beta)] = entry
    return out


def arguments() -> argparse.ArgumentParser:
    """The command line; its defaults are the settings of the stored results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument("--held-out", type=int, default=12, help="prompts held out")
    parser.add_argument("--prompts", type=int, default=40, help="prompts in all")
    parser.add_argument("--batch-size", type=int, default=2, help="pairs a step")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/dpo_smollm2.json"))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    start = clock()
    base, tokenizer = load_smollm2()
    rows, replies, held_out, train_pairs = preference_data(base, tokenizer, args.prompts,
                                                           args.held_out)
    held_rows = rows[:args.held_out]
    before = behaviour(replies[:args.held_out])
    before.update(preference_accuracy=0.0, margin=0.0, kl=0.0)  # the policy is the reference
    before["stop_probability"] = measure(base, base, tokenizer, held_out,
                                         beta=1.0)["stop_probability"]
    print(f"{len(train_pairs)} training pairs, {len(held_out)} held out; before: "
          f"{before['words']:.1f} words, one sentence {before['one_sentence_rate']:.2f}",
          flush=True)
    runs: list[dict] = []

    def results() -> dict:
        return {
            "script": "experiments/dpo_smollm2.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "settings": {"steps": args.steps, "seeds": args.seeds, "betas": args.betas,
                         "batch_size": args.batch_size, "lr": args.lr,
                         "lora": LORA,
                         "max_new_tokens": MAX_NEW_TOKENS, "train_pairs": len(train_pairs),
                         "held_out_pairs": len(held_out), "held_out_prompts": len(held_rows),
                         "threads": args.threads},
            "example_pair": train_pairs[0] if train_pairs else None,
            "before": before, "before_replies": [r for r, _ in replies[:4]], "runs": runs,
            "summary": summarise(before, runs) if runs else {},
            "complete": len(runs) == len(args.betas) * len(args.seeds),
            **timing(start),
        }

    for beta in args.betas:
        for seed in args.seeds:
            result = run(base, tokenizer, train_pairs, held_out, held_rows, beta=beta,
                         seed=seed, steps=args.steps, lr=args.lr, batch_size=args.batch_size)
            runs.append(result)
            a = result["after"]
            print(f"beta {beta} seed {seed}: accuracy {a['preference_accuracy']:.2f}, margin "
                  f"{a['margin']:.2f}, KL {a['kl']:.2f}, {a['words']:.1f} words, one sentence "
                  f"{a['one_sentence_rate']:.2f}, {result['train_seconds']:.0f} s", flush=True)
            write_results(args.out, results())  # after every run: a kill keeps what is done
    final = results()
    write_results(args.out, final)
    print(json.dumps(final["summary"], indent=1))
    print(f"{final['seconds']:.0f} s in all, load average {final['load_average']}")


if __name__ == "__main__":
    main()
