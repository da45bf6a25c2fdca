"""Time to first token with and without prefix caching (chapter 18, issue 43).

Run from the repository root:  .venv/bin/python benchmarks/prefix_caching.py [--repeats 7]

Two cases, each a request whose prompt begins with the same 200 tokens as an earlier request's
and adds 8:
- *running*: the earlier request (its 200 tokens and 1) still runs (it decodes) when the second
  arrives, so they share the blocks by reference count;
- *sequential*: the earlier request has ended before the second arrives; its full blocks were
  kept, evictable, and the second takes them back.
Its time to first token is the steps until its first token: its prefill (all 208 positions
without prefix caching; the 16 after the 12 cached blocks of 16 with it), plus, when the first
runs, the first request's decode, which both engines do alike. GPT, 6 layers of d_model 384,
float32, 1 thread; the two engines alternate, and the medians are printed with their ratio and
the positions each prefilled. The load average is printed first: timings on a busy machine mean
little.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.serving import Engine, Request


def ttft(engine: Engine, prefix: list[int], tail: list[int], *,
         running: bool) -> tuple[float, int]:
    """The seconds to the first token of ``prefix + tail`` after ``prefix + [1]`` (still
    running, or ended), and the positions its admission prefilled."""
    first = engine.submit(Request(prefix + [1], max_tokens=50 if running else 1,
                                  temperature=0.0))
    engine.step()                                   # its prefill (and, sequential, its end)
    if running:
        engine.step()                               # a decode: it runs
    assert engine.has_work == running
    start, before = time.perf_counter(), engine.prefilled
    second = engine.submit(Request(prefix + tail, max_tokens=1, temperature=0.0))
    while not any(e.request_id == second for e in engine.step()):
        pass
    seconds = time.perf_counter() - start
    prefilled = engine.prefilled - before
    engine.cancel(first)
    while engine.has_work:
        engine.step()
    return seconds, prefilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average: {os.getloadavg()[0]:.1f}")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=2000, context_length=512, num_layers=6, num_heads=6,
                          d_model=384)).eval()
    prefix = torch.randint(0, 2000, (200,)).tolist()
    tail = list(range(3, 11))
    engines = {False: Engine(model, kv_blocks=64), True: Engine(model, kv_blocks=64,
                                                                prefix_caching=True)}
    for running, case in ((True, "while the first runs"), (False, "after the first ended")):
        times: dict[bool, list[float]] = {False: [], True: []}
        prefilled = {}
        for k in range(args.repeats):
            for caching in (False, True) if k % 2 else (True, False):
                seconds, prefilled[caching] = ttft(engines[caching], prefix, tail,
                                                   running=running)
                times[caching].append(seconds)
        plain, shared = (statistics.median(times[c]) for c in (False, True))
        print(f"time to first token, 200 shared tokens + 8, {case}: without prefix caching "
              f"{plain * 1e3:.1f} ms ({prefilled[False]} positions prefilled), with "
              f"{shared * 1e3:.1f} ms ({prefilled[True]}): {plain / shared:.1f}x lower")
    cached = engines[True]
    print(f"prefix cache: {cached.prefix_hits} of {cached.prefix_queries} prompt tokens found")


if __name__ == "__main__":
    main()
