"""Chapter 18 on the real model: SmolLM2-135M-Instruct served by the package's engine.

Every request is a chat prompt rendered with SmolLM2's own template, so each one begins with the
same default system prompt. Greedy, no end token, so each request writes exactly
``--max-tokens`` tokens. Measured in each round, in this order:

- sequential: one request after the other, each with ``generate`` (the fast decode step and its
  own KV cache);
- continuous: all requests arriving at once, served by ``Engine`` (``max_batch`` = the number of
  requests), without prefix caching and then with it;
- time to first token, requests sent one after the other, each after the previous has ended
  (``max_tokens=1``), with and without prefix caching: with it, the shared system prompt is
  found in the cache and not prefilled again.

Each continuous run's tokens are compared with the sequential ones. The ratios are the median
over ``--rounds`` rounds of each round's own ratio. Usage::

    python experiments/serving_smollm2.py                  # minutes, on one thread
    python experiments/serving_smollm2.py --requests 2 --max-tokens 2 --rounds 1 \\
        --out /tmp/serving.json                            # a smoke test (seconds)

The results go to ``--out`` (default ``experiments/results/serving_smollm2.json``), which
chapter 18 reads.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # the package of this checkout

from minitransformer import pretrained  # noqa: E402
from minitransformer.bpe import BPETokenizer  # noqa: E402
from minitransformer.chat import apply_chat_template  # noqa: E402
from minitransformer.checkpoints import write_json  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from minitransformer.serving import Engine, Request  # noqa: E402

OUT = HERE / "results" / "serving_smollm2.json"
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.",
    "Explain what a transformer is in one sentence.", "List three prime numbers.",
    "How do I reverse a list in Python?", "Translate 'good morning' into German.",
    "What is 12 times 7?", "Give me a name for a pet turtle.", "Why is the sky blue?",
    "Summarise Romeo and Juliet in two sentences.", "What does a compiler do?",
    "Name a planet with rings.", "How many legs does a spider have?",
    "Suggest a title for a story about a lost key.", "What is photosynthesis?",
    "Give one tip for sleeping well.",
]


def prompts(tokenizer: BPETokenizer, n: int) -> list[list[int]]:
    return [apply_chat_template(tokenizer, [{"role": "user", "content": q}],
                                add_generation_prompt=True)
            for q in (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]]


def requests(work: list[list[int]], max_tokens: int) -> list[Request]:
    return [Request(ids, max_tokens=max_tokens, temperature=0, stop_token_ids=[])
            for ids in work]


def sequential(model: Llama, work: list[list[int]], max_tokens: int) -> tuple[float, list]:
    began, out = time.perf_counter(), []
    with torch.no_grad():
        for ids in work:
            row = generate(model, torch.tensor([ids]), max_tokens, temperature=0)
            out.append(row[0, len(ids):].tolist())
    return time.perf_counter() - began, out


def continuous(model: Llama, tokenizer: BPETokenizer, work: list[list[int]], max_tokens: int,
               *, prefix_caching: bool) -> tuple[float, list, dict]:
    engine = Engine(model, tokenizer, max_batch=len(work), kv_blocks=64 * len(work),
                    prefix_caching=prefix_caching)
    began = time.perf_counter()
    done = engine.run(requests(work, max_tokens))
    seconds = time.perf_counter() - began
    return seconds, [c.token_ids for c in done], {"prefilled": engine.prefilled,
                                                  "prefix_hits": engine.prefix_hits}


def first_token_times(model: Llama, tokenizer: BPETokenizer, work: list[list[int]], *,
                      prefix_caching: bool) -> tuple[list[float], int]:
    """Each request alone, after the previous one ended: seconds to its one new token."""
    engine = Engine(model, tokenizer, max_batch=1, kv_blocks=64, prefix_caching=prefix_caching)
    times = []
    for request in requests(work, 1):
        began = time.perf_counter()
        engine.run([request])
        times.append(time.perf_counter() - began)
    return times, engine.prefilled


def flips(tokens: list[list[int]], reference: list[list[int]]) -> int:
    return sum(a != b for a, b in zip(tokens, reference))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="(default 1: on a shared machine, two threads that wait for "
                        "each other were slower)")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    began, load = time.perf_counter(), os.getloadavg()[0]
    path = pretrained.smollm2_path()
    model, tokenizer = Llama.from_gguf(path), BPETokenizer.from_gguf(path)
    work = prompts(tokenizer, args.requests)
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}: sequential", flush=True)
        seconds, reference = sequential(model, work, args.max_tokens)
        print(f"  {seconds:.1f} s; continuous", flush=True)
        plain, tokens, counts = continuous(model, tokenizer, work, args.max_tokens,
                                           prefix_caching=False)
        print(f"  {plain:.1f} s; continuous with prefix caching", flush=True)
        cached, cached_tokens, cached_counts = continuous(
            model, tokenizer, work, args.max_tokens, prefix_caching=True)
        print(f"  {cached:.1f} s; first tokens", flush=True)
        ttft_off, prefilled_off = first_token_times(model, tokenizer, work,
                                                    prefix_caching=False)
        ttft_on, prefilled_on = first_token_times(model, tokenizer, work, prefix_caching=True)
        new_tokens = args.requests * args.max_tokens
        rounds.append({
            "round": number + 1,
            "sequential_tokens_per_s": round(new_tokens / seconds, 2),
            "continuous_tokens_per_s": round(new_tokens / plain, 2),
            "continuous_cached_tokens_per_s": round(new_tokens / cached, 2),
            "continuous_over_sequential": round(seconds / plain, 3),
            "flips": flips(tokens, reference), "flips_cached": flips(cached_tokens, reference),
            "prefilled": counts["prefilled"], "prefilled_cached": cached_counts["prefilled"],
            "prefix_hits": cached_counts["prefix_hits"],
            # the first request of the cached run finds nothing: the median of the others
            "ttft_ms_median": round(1000 * statistics.median(ttft_off[1:] or ttft_off), 1),
            "ttft_ms_median_cached": round(1000 * statistics.median(ttft_on[1:] or ttft_on), 1),
            "ttft_prefilled": prefilled_off, "ttft_prefilled_cached": prefilled_on,
        })
        print(rounds[-1], flush=True)
    median = {key: statistics.median(r[key] for r in rounds)
              for key in rounds[0] if key != "round"}
    median["ttft_ratio"] = round(median["ttft_ms_median"] / median["ttft_ms_median_cached"], 2)
    results = {
        "settings": {"requests": args.requests, "max_tokens": args.max_tokens,
                     "rounds": args.rounds, "threads": args.threads, "dtype": "float32"},
        "prompt_tokens": [len(ids) for ids in work],
        "rounds": rounds, "median": median,
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__,
                    "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]},
        "seconds": round(time.perf_counter() - began, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, results)
    print("median:", median)
    return 0


if __name__ == "__main__":
    sys.exit(main())
