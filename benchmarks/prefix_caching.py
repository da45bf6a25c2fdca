"""Time to first token with and without prefix caching (chapter 18, issue 43).

Run from the repository root:  .venv/bin/python benchmarks/prefix_caching.py [--repeats 7]

A request with a 200-token prompt runs (it decodes); a second request whose prompt begins with
the same 200 tokens and adds 8 arrives. Its time to first token is the step that admits it:
its prefill (all 208 positions without prefix caching; the 16 after the 12 shared blocks of 16
with it), plus the first request's decode, which both engines do alike. GPT, 6 layers of
d_model 384, float32, 1 thread; the two engines alternate, and the medians are printed with
their ratio. The load average is printed first: timings on a busy machine mean little.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from minitransformer import GPT, GPTConfig
from minitransformer.serving import Engine, Request


def ttft(engine: Engine, prefix: list[int], tail: list[int]) -> float:
    first = engine.submit(Request(prefix + [1], max_tokens=50, temperature=0.0))
    engine.step()                                   # its prefill
    engine.step()                                   # a decode: it runs
    start = time.perf_counter()
    second = engine.submit(Request(prefix + tail, max_tokens=1, temperature=0.0))
    while not any(e.request_id == second for e in engine.step()):
        pass
    seconds = time.perf_counter() - start
    engine.cancel(first)
    while engine.has_work:
        engine.step()
    return seconds


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
    engines = {False: Engine(model, kv_blocks=64), True: Engine(model, kv_blocks=64,
                                                                prefix_caching=True)}
    times = {False: [], True: []}
    for k in range(args.repeats):
        for caching in (False, True) if k % 2 else (True, False):
            times[caching].append(ttft(engines[caching], prefix, list(range(3, 11))))
    plain, shared = (statistics.median(times[c]) for c in (False, True))
    print(f"time to first token, 200 shared tokens + 8: without prefix caching "
          f"{plain * 1e3:.1f} ms, with {shared * 1e3:.1f} ms: {plain / shared:.1f}x lower")


if __name__ == "__main__":
    main()
