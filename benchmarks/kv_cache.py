"""How much faster is generation with a KV cache? (chapter 11)

Run from the repository root:  .venv/bin/python benchmarks/kv_cache.py [--threads 2] [--repeats 3]
    [--device cpu] [--json FILE]
(`make bench` runs it with the other benchmarks; tools/gpu_check.sh with --device cuda.)

A randomly initialised GPT (vocab 256, d_model 128, 4 layers, 4 heads, context_length 1024,
float32, CPU) continues a 4-token prompt greedily with ``generate(..., use_cache=True)`` and
``use_cache=False``; the two must give the same tokens. With the cache, ``generate`` steps through
the function ``GPT.make_decode_step()`` returns (``fast=False``: chapter 11's step), the speed path
(the cached forward pass on weights looked up once, without the blocks' method and module calls;
tests hold it bit-for-bit equal to ``GPT.forward(..., kv_cache=...)``). It prints
  * the total time of each and the speed-up for 64, 256, 512 and 1,000 new tokens, at ``--threads``
    threads and then again at 1 thread (with 2 threads the uncached pass, a big matrix product,
    runs in parallel, while a cached step is too small to gain from a second thread);
  * how flat the cached cost per token stays: one 1,000-token generation timed token by token,
    the last 64 tokens against the first 64.

Then the same for a Llama (chapter 14) of the GPT's size (vocab 256, d_model 128, 4 layers, 4
query heads sharing 2 key/value heads, RMSNorm, rotary positions, SwiGLU with d_ff 344, untied
head; context 1024): its cached speed-up at 512 new tokens, generated through
``Llama.make_decode_step()``, and the bytes its cache holds against the GPT's at that length.

Timing method: cached and uncached runs alternate (cached first, then uncached first, ...) after
one untimed warm-up each; the speed-up is the median of the per-repeat ratios, which is robust to
other programs slowing the machine down for a while. Targets (issue 12), at 2 threads: >= 3.5x at
256 new tokens, >= 7x at 512, and last-64 / first-64 <= 1.5; printed on the last lines. Timings on
a busy machine mean little: the load average is printed first.

``--device cuda`` runs it all on a GPU (TF32 off, and each timing waits for the GPU); threads then
mean nothing and the 1-thread pass is left out. The targets were set for the CPU. ``--json FILE``
also writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from torch import nn

from minitransformer import (GPT, GPTConfig, KVCache, Llama, LlamaConfig, generate,
                             sample_next)

CONFIG = GPTConfig(vocab_size=256, context_length=1024, num_layers=4, num_heads=4, d_model=128)
LLAMA_CONFIG = LlamaConfig(vocab_size=256, context_length=1024, num_layers=4, num_heads=4,
                           d_model=128, num_kv_heads=2)
LLAMA_TOKENS = 512
PROMPT_LENGTH = 4
NEW_TOKENS = (64, 256, 512, 1000)
TARGETS = {256: 3.5, 512: 7.0}
FLAT_WINDOW, FLAT_TARGET = 64, 1.5
DEVICE = torch.device("cpu")        # --device


def _wait() -> None:
    """A GPU runs what it is given in the background: wait for it before reading the clock."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _time(model: nn.Module, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    _wait()
    start = time.perf_counter()
    generate(model, prompt, new_tokens, use_cache=use_cache, temperature=0, fast=False)
    _wait()
    return time.perf_counter() - start


def speed_up(model: nn.Module, prompt: torch.Tensor, new_tokens: int,
             repeats: int) -> tuple[float, float, float]:
    """Median seconds with and without the cache, and the median per-repeat ratio."""
    cached = generate(model, prompt, new_tokens, use_cache=True, temperature=0, fast=False)
    uncached = generate(model, prompt, new_tokens, use_cache=False, temperature=0)
    if not torch.equal(cached, uncached):
        raise AssertionError(f"cached and uncached generation differ at {new_tokens} tokens")
    with_cache, without, ratios = [], [], []
    for repeat in range(repeats):
        if repeat % 2 == 0:
            c, u = _time(model, prompt, new_tokens, True), _time(model, prompt, new_tokens, False)
        else:
            u, c = _time(model, prompt, new_tokens, False), _time(model, prompt, new_tokens, True)
        with_cache.append(c)
        without.append(u)
        ratios.append(u / c)
    return statistics.median(with_cache), statistics.median(without), statistics.median(ratios)


@torch.inference_mode()
def per_token_times(model: GPT, prompt: torch.Tensor, new_tokens: int) -> list[float]:
    """Seconds for each cached decode step of one generation (the prefill not included), each
    step as ``generate`` takes it: ``sample_next``, then the model's step function."""
    cache = KVCache(CONFIG.num_layers, max_len=PROMPT_LENGTH + new_tokens)
    step = model.make_decode_step()
    logits = step(prompt, cache)
    times = []
    for _ in range(new_tokens):
        _wait()
        start = time.perf_counter()
        next_id = sample_next(logits[:, -1], temperature=0)
        logits = step(next_id[:, None], cache)
        _wait()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per length")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=list(NEW_TOKENS),
                        help="lengths to time (default 64 256 512 1000; 256 and 512 always)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--json", help="also write the figures to this file, as JSON")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False       # float32 means float32 on a GPU too
    lengths = sorted(set(args.new_tokens) | set(TARGETS))
    _ = torch.manual_seed(0)
    model = GPT(CONFIG).eval().to(DEVICE)
    prompt = torch.randint(0, CONFIG.vocab_size, (1, PROMPT_LENGTH)).to(DEVICE)
    where = torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda" else "CPU"

    print(f"torch {torch.__version__}, float32, {where}, GPT vocab {CONFIG.vocab_size}, d_model "
          f"{CONFIG.d_model}, {CONFIG.num_layers} layers, {CONFIG.num_heads} heads, context "
          f"{CONFIG.context_length}, {PROMPT_LENGTH}-token prompt, greedy, {args.repeats} "
          f"interleaved repeats, load average {os.getloadavg()[0]:.2f}")
    print(f"{'threads':>7}{'new tokens':>12}{'cached (s)':>12}{'uncached (s)':>14}"
          f"{'ms/token cached':>17}{'speed-up':>10}")
    torch.set_num_threads(args.threads)
    per_token_times(model, prompt, FLAT_WINDOW)                          # warm-up
    times = per_token_times(model, prompt, NEW_TOKENS[-1])
    first = statistics.median(times[:FLAT_WINDOW])
    last = statistics.median(times[-FLAT_WINDOW:])
    flat = sum(times[-FLAT_WINDOW:]) / sum(times[:FLAT_WINDOW])
    flat_line = (f"cached decode, {args.threads} threads: first {FLAT_WINDOW} tokens "
                 f"{first * 1e3:.2f} ms/token (median), last {FLAT_WINDOW} {last * 1e3:.2f} "
                 f"ms/token; last / first (totals) {flat:.2f} (target <= {FLAT_TARGET}: "
                 f"{flat <= FLAT_TARGET})")
    ratios: dict[int, dict[int, float]] = {}
    for threads in dict.fromkeys([args.threads] + ([1] if DEVICE.type == "cpu" else [])):
        torch.set_num_threads(threads)
        generate(model, prompt, 16, use_cache=True, temperature=0, fast=False)       # warm-up
        generate(model, prompt, 16, use_cache=False, temperature=0)
        for new_tokens in lengths:
            cached, uncached, ratio = speed_up(model, prompt, new_tokens, args.repeats)
            ratios.setdefault(threads, {})[new_tokens] = ratio
            print(f"{threads:>7}{new_tokens:>12}{cached:>12.3f}{uncached:>14.3f}"
                  f"{cached / new_tokens * 1e3:>17.2f}{ratio:>9.2f}x", flush=True)

    print(flat_line)
    main_ratios = ratios[args.threads]
    for new_tokens, target in TARGETS.items():
        one = f"; 1 thread: {ratios[1][new_tokens]:.2f}x" if 1 in ratios else ""
        print(f"speed-up at {new_tokens} new tokens, {args.threads} threads: "
              f"{main_ratios[new_tokens]:.2f}x (target >= {target}x: "
              f"{main_ratios[new_tokens] >= target}){one}")
    llama_figures = llama(prompt, args.threads, args.repeats)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"device": where, "threads": args.threads,
                       "speed_up": {str(t): {str(n): round(r, 2) for n, r in by.items()}
                                    for t, by in ratios.items()},
                       "last_over_first_64": round(flat, 2), **llama_figures}, file, indent=1)


def cache_bytes(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> int:
    """``KVCache.nbytes`` after a generation of ``new_tokens`` (storage for every position)."""
    cache = KVCache(model.config.num_layers, max_len=PROMPT_LENGTH + new_tokens)
    step = model.make_decode_step()
    with torch.inference_mode():
        step(prompt, cache)
    return cache.nbytes


def llama(prompt: torch.Tensor, threads: int, repeats: int) -> dict:
    """The Llama's cached speed-up at ``LLAMA_TOKENS`` new tokens, and its cache's bytes."""
    _ = torch.manual_seed(0)
    model = Llama(LLAMA_CONFIG).eval().to(DEVICE)
    c = LLAMA_CONFIG
    print(f"Llama of the same size: {c.num_heads} query heads, {c.num_kv_heads} KV heads, "
          f"d_ff {c.d_ff}, untied head, load average {os.getloadavg()[0]:.2f}")
    torch.set_num_threads(threads)
    generate(model, prompt, 16, use_cache=True, temperature=0, fast=False)           # warm-up
    generate(model, prompt, 16, use_cache=False, temperature=0)
    cached, uncached, ratio = speed_up(model, prompt, LLAMA_TOKENS, repeats)
    print(f"{threads:>7}{LLAMA_TOKENS:>12}{cached:>12.3f}{uncached:>14.3f}"
          f"{cached / LLAMA_TOKENS * 1e3:>17.2f}{ratio:>9.2f}x", flush=True)
    gpt_bytes = cache_bytes(GPT(CONFIG).eval().to(DEVICE), prompt, LLAMA_TOKENS)
    llama_bytes = cache_bytes(model, prompt, LLAMA_TOKENS)
    print(f"Llama cached speed-up at {LLAMA_TOKENS} new tokens, {threads} threads: "
          f"{ratio:.2f}x; its cache holds {llama_bytes:,} bytes, the GPT's {gpt_bytes:,} "
          f"({gpt_bytes / llama_bytes:.1f}x: {c.num_heads} heads / {c.num_kv_heads} KV heads)")
    return {"llama_speed_up_512": round(ratio, 2), "llama_cache_bytes": llama_bytes,
            "gpt_cache_bytes": gpt_bytes}


if __name__ == "__main__":
    main()
