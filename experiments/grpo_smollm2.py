"""GRPO on SmolLM2-135M-Instruct: single-digit addition in a fixed answer format (chapter 17).

The task: "What is 6 + 7? Reply with the equation and its result only, like 3 + 4 = 7." The
reply is checked by a program: it is right when the first number after an "=" is the sum
(:func:`reward_correct`), and it has the format when it is the equation and nothing else
(``6 + 7 = 13``, a full stop allowed: :func:`reward_format`). SmolLM2 answers about half of
these right when greedy, so most groups of four sampled replies hold both right and wrong ones:
GRPO has something to compare.

The 79 problems ``a + b`` with ``a, b`` in 1..9 (without the example's 3 + 4 and 4 + 3) are
split once: ``--held-out`` of them are never trained on. Each run trains LoRA adapters (rank
16, the attention projections) with the package's ``grpo_train`` (groups of 4, replies of at
most 12 tokens, 4 prompts a step), for two rewards: the correctness alone, and the
correctness plus a format bonus of 0.5. Before and after, the greedy replies to the held-out
problems are scored (accuracy and format rate). Each step also records the share of groups
whose rewards are not all equal: only those carry a signal.

    python experiments/grpo_smollm2.py                 # the stored results, every setting
    python experiments/grpo_smollm2.py --steps 2 --seeds 0 --held-out 8 --out /tmp/g.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.chat import end_of_turn_id
from minitransformer.grpo import chat_prompts, chat_replies, grpo_train, sample_group
from minitransformer.llama import Llama
from minitransformer.lora import trainable_parameters
from smollm2_common import LORA, clock, load_smollm2, lora_copy, timing, write_results

EXAMPLE = "3 + 4 = 7"
QUESTION = "What is {a} + {b}? Reply with the equation and its result only, like {example}."
GROUP_SIZE = 4
MAX_NEW_TOKENS = 12
BONUS = 0.5
REWARDS = ("correct", "correct+format")


def problems(num_held_out: int, *, seed: int = 1234) -> tuple[list[dict], list[dict]]:
    """TRL-style rows ``{"prompt": [user message], "a", "b", "answer"}``, split into training
    and held-out problems (the same split for every run)."""
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10) if {a, b} != {3, 4}]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user",
                         "content": QUESTION.format(a=a, b=b, example=EXAMPLE)}],
             "a": a, "b": b, "answer": a + b} for a, b in pairs]
    return rows[num_held_out:], rows[:num_held_out]


def _result(reply: str) -> int | None:
    found = re.search(r"=\s*(-?\d+)", reply)
    return int(found.group(1)) if found else None


def reward_correct(completions: list[str], answer: list[int], **kwargs) -> list[float]:
    """1.0 where the first number after an "=" is the sum, else 0.0."""
    return [float(_result(reply) == right) for reply, right in zip(completions, answer)]


def reward_format(completions: list[str], a: list[int], b: list[int], **kwargs) -> list[float]:
    """1.0 where the reply is the question's equation and a number, nothing else."""
    return [float(re.fullmatch(rf"\s*{x} \+ {y} = \d+\.?\s*", reply) is not None)
            for reply, x, y in zip(completions, a, b)]


class Reward:
    """The training reward (the correctness, plus the format bonus with ``bonus``), called as
    TRL calls a reward function; it keeps each call's rewards to count the groups with a
    signal."""

    def __init__(self, bonus: bool) -> None:
        self.bonus = bonus
        self.__name__ = "correct+format" if bonus else "correct"
        self.calls: list[list[float]] = []

    def __call__(self, completions: list[str], answer: list[int], a: list[int], b: list[int],
                 **kwargs) -> list[float]:
        rewards = reward_correct(completions, answer)
        if self.bonus:
            rewards = [r + BONUS * f for r, f in zip(rewards, reward_format(completions, a, b))]
        self.calls.append(rewards)
        return rewards


def signal_fraction(rewards: list[float], group_size: int = GROUP_SIZE) -> float:
    """The share of groups whose rewards are not all equal (the others' advantages are 0)."""
    groups = [rewards[k:k + group_size] for k in range(0, len(rewards), group_size)]
    return sum(len(set(g)) > 1 for g in groups) / len(groups)


def evaluate(model: Llama, tokenizer: BPETokenizer, rows: list[dict]) -> dict:
    """The greedy replies to ``rows``: their accuracy and format rate, and the replies."""
    completions = sample_group(model, chat_prompts(tokenizer, rows), 1, MAX_NEW_TOKENS,
                               temperature=0.0, eos_id=end_of_turn_id(tokenizer))
    replies = chat_replies(tokenizer, completions)
    columns = {key: [row[key] for row in rows] for key in ("answer", "a", "b")}
    correct = reward_correct(replies, **columns)
    formatted = reward_format(replies, **columns)
    return {"accuracy": sum(correct) / len(rows), "format_rate": sum(formatted) / len(rows),
            "replies": replies}


def run(base: Llama, tokenizer: BPETokenizer, train_rows: list[dict], held_out: list[dict],
        *, bonus: bool, seed: int, steps: int, lr: float, batch_size: int) -> dict:
    model = lora_copy(base, seed)
    reward = Reward(bonus)
    start = time.perf_counter()
    history = grpo_train(model, tokenizer, train_rows, reward, steps=steps,
                         batch_size=batch_size, group_size=GROUP_SIZE, lr=lr,
                         max_new_tokens=MAX_NEW_TOKENS, seed=seed, temperature=1.0,
                         max_grad_norm=1.0)
    train_s = time.perf_counter() - start
    after = evaluate(model, tokenizer, held_out)
    for entry, rewards in zip(history, reward.calls):
        entry["signal_fraction"] = signal_fraction(rewards)
        entry["accuracy"] = sum(reward_correct_from(rewards, bonus)) / len(rewards)
    return {"reward": reward.__name__, "seed": seed, "after": after, "history": history,
            "train_seconds": round(train_s, 1),
            "trainable_parameters": trainable_parameters(model)[0]}


def reward_correct_from(rewards: list[float], bonus: bool) -> list[float]:
    """The correctness part of training rewards (the bonus is 0.5, the correctness 0 or 1)."""
    return [float(r >= 1.0) for r in rewards] if bonus else rewards


def summarise(base_eval: dict, runs: list[dict]) -> dict:
    out = {}
    for name in REWARDS:
        mine = [r for r in runs if r["reward"] == name]
        if not mine:
            continue
        after = [r["after"]["accuracy"] for r in mine]
        formats = [r["after"]["format_rate"] for r in mine]
        gain = sum(after) / len(after) - base_eval["accuracy"]
        spread = max(after) - min(after)
        signal = [h["signal_fraction"] for r in mine for h in r["history"]]
        out[name] = {"accuracy_before": base_eval["accuracy"], "accuracy_after": after,
                     "format_before": base_eval["format_rate"], "format_after": formats,
                     "gain": round(gain, 4), "seed_spread": round(spread, 4),
                     "gain_exceeds_spread": gain > spread,
                     "signal_fraction": round(sum(signal) / len(signal), 4)}
    return out


def arguments() -> argparse.ArgumentParser:
    """The command line; its defaults are the settings of the stored results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rewards", nargs="+", choices=REWARDS, default=list(REWARDS))
    parser.add_argument("--held-out", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=2, help="prompts a step")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/grpo_smollm2.json"))
    return parser


def main(argv: list[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    torch.set_num_threads(args.threads)
    start = clock()
    base, tokenizer = load_smollm2()
    train_rows, held_out = problems(args.held_out)
    base_eval = evaluate(base, tokenizer, held_out)
    print(f"base: held-out accuracy {base_eval['accuracy']:.3f}, format "
          f"{base_eval['format_rate']:.3f}", flush=True)
    runs: list[dict] = []

    def results() -> dict:
        return {
            "script": "experiments/grpo_smollm2.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "settings": {"steps": args.steps, "seeds": args.seeds, "rewards": args.rewards,
                         "batch_size": args.batch_size, "group_size": GROUP_SIZE,
                         "max_new_tokens": MAX_NEW_TOKENS, "lr": args.lr,
                         "lora": LORA,
                         "bonus": BONUS, "train_problems": len(train_rows),
                         "held_out_problems": len(held_out), "threads": args.threads,
                         "temperature": 1.0, "loss_type": "grpo", "beta": 0.0},
            "base": base_eval, "runs": runs, "summary": summarise(base_eval, runs),
            "complete": len(runs) == len(args.rewards) * len(args.seeds),
            **timing(start),
        }

    for name in args.rewards:
        for seed in args.seeds:
            result = run(base, tokenizer, train_rows, held_out, bonus=name != "correct",
                         seed=seed, steps=args.steps, lr=args.lr, batch_size=args.batch_size)
            runs.append(result)
            print(f"{name} seed {seed}: accuracy {result['after']['accuracy']:.3f}, format "
                  f"{result['after']['format_rate']:.3f}, {result['train_seconds']:.0f} s",
                  flush=True)
            write_results(args.out, results())  # after every run: a kill keeps what is done
    final = results()
    write_results(args.out, final)
    print(json.dumps(final["summary"], indent=1))
    print(f"{final['seconds']:.0f} s in all, load average {final['load_average']}")

if __name__ == "__main__":
    main()
