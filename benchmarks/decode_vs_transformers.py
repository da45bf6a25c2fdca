"""Is our cached greedy decoding as fast as transformers' on the same weights? (chapters 13, 14)

Run from the repository root:
    .venv/bin/python benchmarks/decode_vs_transformers.py [--threads 2] [--rounds 5] [--size both]
        [--dtype float32] [--device cpu] [--json FILE]
(`make bench` runs it with the other benchmarks; tools/gpu_check.sh with --device cuda.)

For ``--size gpt2-small`` and ``--size book`` (``both``: the two), a randomly initialised GPT is
saved with ``save_pretrained`` and loaded by ``transformers.GPT2LMHeadModel.from_pretrained``.
``--size smollm2`` is a real model, SmolLM2-135M-Instruct's GGUF file (Q4_1, downloaded once by
``make`` or ``python -m minitransformer download smollm2``), read by ``Llama.from_gguf`` and by
``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``, both dequantising it. Either
way the same weights are on both sides, in ``--dtype`` (float32 by default; bfloat16 rounds the
same float32 weights on both sides), on ``--device`` (the CPU by default; on CUDA, TF32 is off
and each timing waits for the GPU), batch 1. Each side continues a 32-token prompt (random
token ids) by 64 greedy tokens (128 for smollm2): ours twice, with
``minitransformer.generate(..., temperature=0, fast=False)`` (KV cache, ``make_decode_step``,
bit for bit ``forward``: "ours") and with ``fast=True``, the default (``make_fast_decode_step``,
the same logits up to float rounding: "fast"); theirs with ``model.generate(do_sample=False)``
(its own KV cache, never stopping early). In float32 the tokens must be equal; in bfloat16 two
implementations round differently (and a random model's scores are close), so the script reports
how many of the new tokens agree before the first difference, and only ours and fast must be
equal.

Timing method: one untimed warm-up each, then ``--rounds`` rounds in which the three runs
take turns at going first; each ratio is the median of the per-round ratios of tokens per
second (ours / theirs), robust to a slow spell of the machine. The load average is printed
first and last: timings on a busy machine mean little.

It also prints the fraction of the memory-bandwidth limit: each new token reads every weight
once, so at most ``bandwidth / (bytes per number * parameters)`` tokens per second; the
bandwidth is measured in the same run by summing a 512 MB tensor, before the timings and again
after each size's; the limit uses the best measurement so far (a busy spell lowers it).

``--json FILE`` also writes the figures as JSON. Targets, on the CPU at 2 threads in float32:
issue 22, for ``make_decode_step``: >= 1.0x at GPT-2 small's shape (12 layers, 12 heads,
d_model 768, 50,257 tokens, 124M parameters), >= 2x at the book's size (the chapter-11 model:
4 layers, 4 heads, d_model 128, 256 tokens); issue 34, for the fast step at GPT-2 small's shape:
>= 1.3x and >= 50% of the bandwidth limit; issue 41, for the fast step on SmolLM2-135M: >= 1.3x
and >= 60% of the limit.

Measured on the course's CPU (2 threads, load about 1), the figures behind the fast step's
design and the constants of ``minitransformer/fast_decode.py``:

* ``F.linear`` of one row (a BLAS ``gemv``, which ran on one thread) read GPT-2 small's float32
  weights at well under half the memory bandwidth. The fast step ran twice as fast as the
  ordinary one, at 75% of the best bandwidth measured against the ordinary step's 37% (1.93x
  transformers); on a busy machine, two threads that wait for each other can be slower.
* ``FAST_PIECES = 8``: 4 to 16 blocks ran alike.
* ``FAST_MIN_NUMEL = 2 ** 18`` (1 MiB of float32): a smaller matrix is read in less time than
  the blocks' few extra calls take (about 8 microseconds), so ``F.linear`` is faster (the
  book's model, chapter 11).
* ``FAST_FEW_ROWS = 2``: the blocks on the left (``blocks @ x^T``) read GPT-2 small's matrices
  1.3-1.7x as fast at one row (the head: 5.2 against 7.5 ms) and up to 3x at two; from four
  rows on, ``x @ blocks^T`` was as fast or faster.
* ``FAST_LARGE_NUMEL = 2 ** 24``, ``FAST_LARGE_PIECES = 32``, ``FAST_LARGE_FEW_ROWS = 4``: at 8
  and 16 rows the head (38.6 million numbers) took 9.7-12.8 and 15-16 ms in 32 blocks against
  15 and 20 ms in 8, and at 4 rows 6.3-7.0 ms on the left against 9.2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")          # transformers' GGUF loader's progress bar

import torch  # noqa: E402

from minitransformer import GPT, GPTConfig, Llama, generate  # noqa: E402
from minitransformer.gpt import count_parameters  # noqa: E402
from minitransformer.pretrained import smollm2_path  # noqa: E402

SIZES = {
    "gpt2-small": (GPTConfig(vocab_size=50257, context_length=1024, num_layers=12,
                             num_heads=12, d_model=768, activation="gelu_tanh"), 1.0),
    "book": (GPTConfig(vocab_size=256, context_length=1024, num_layers=4, num_heads=4,
                       d_model=128), 2.0),
}
REAL = "smollm2"                    # SmolLM2-135M-Instruct, from its GGUF file
PROMPT, NEW, REAL_NEW = 32, 64, 128
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


DEVICE = torch.device("cpu")        # --device


def bandwidth() -> float:
    """Bytes per second that a sum over a 512 MB float32 tensor reads (best of 5)."""
    x = torch.ones(128 * 1024 * 1024, device=DEVICE)
    x.sum()
    best = min(_seconds(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best


def _wait() -> None:
    """A GPU runs what it is given in the background: wait for it before reading the clock."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _seconds(run) -> float:
    _wait()
    start = time.perf_counter()
    run()
    _wait()
    return time.perf_counter() - start


def models(name: str, dtype: torch.dtype) -> tuple:
    """``(ours, theirs)``, the same weights, on ``DEVICE`` in ``dtype``."""
    import transformers

    if name == REAL:
        path = smollm2_path()
        ours = Llama.from_gguf(path)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=dtype)
        return ours.to(DEVICE, dtype), theirs.eval().to(DEVICE)
    torch.manual_seed(0)
    ours = GPT(SIZES[name][0]).eval()
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        theirs = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=dtype)
    return ours.to(DEVICE, dtype), theirs.eval().to(DEVICE)


def compare(name: str, rounds: int, bandwidths: list[float], figures: dict,
            dtype: torch.dtype = torch.float32) -> bool:
    """Time one size; ``bandwidths``: the measurements so far, to which it adds one."""
    ours, theirs = models(name, dtype)
    new = REAL_NEW if name == REAL else NEW
    prompt = torch.randint(ours.config.vocab_size, (1, PROMPT),
                           generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def run_ours() -> torch.Tensor:
        return generate(ours, prompt, new, temperature=0, fast=False)

    def run_fast() -> torch.Tensor:
        return generate(ours, prompt, new, temperature=0, fast=True)

    def run_theirs() -> torch.Tensor:
        with torch.inference_mode():
            return theirs.generate(prompt, max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=0)

    runs = {"ours": run_ours, "fast": run_fast, "transformers": run_theirs}
    tokens = {side: run()[0, PROMPT:] for side, run in runs.items()}  # also the warm-up
    differ = (tokens["fast"] != tokens["transformers"]).nonzero()
    agree = int(differ[0, 0]) if len(differ) else new      # the new tokens equal until then
    same = torch.equal(tokens["ours"], tokens["fast"]) and (
        dtype != torch.float32 or agree == new)
    rates: dict[str, list[float]] = {side: [] for side in runs}
    order = list(runs)
    for r in range(rounds):
        for side in order[r % 3:] + order[:r % 3]:          # each run goes first in turn
            rates[side].append(new / _seconds(runs[side]))
    ratios = {side: [a / b for a, b in zip(rates[side], rates["transformers"])]
              for side in ("ours", "fast")}
    median = {side: statistics.median(values) for side, values in rates.items()}
    ratio = {side: statistics.median(values) for side, values in ratios.items()}
    params = count_parameters(ours)
    bandwidths.append(bandwidth())                # again after the timings
    bytes_per_s = max(bandwidths)                 # the best seen: a busy spell lowers it
    limit = bytes_per_s / (ours.token_embedding.weight.element_size() * params)
    print(f"{name}: {params:,} parameters, {str(dtype).removeprefix('torch.')}; greedy tokens: "
          f"ours = fast {torch.equal(tokens['ours'], tokens['fast'])}, fast = transformers "
          f"on the first {agree} of {new}")
    for side in ("ours", "fast"):
        print(f"  {side:>4} {median[side]:.1f} tok/s, transformers "
              f"{median['transformers']:.1f} tok/s, ratio {ratio[side]:.2f}x "
              f"(rounds: {', '.join(f'{x:.2f}' for x in ratios[side])})")
    print(f"  bandwidth limit {limit:.1f} tok/s ({bytes_per_s / 1e9:.1f} GB/s): ours at "
          f"{median['ours'] / limit:.0%}, fast at {median['fast'] / limit:.0%}, transformers "
          f"at {median['transformers'] / limit:.0%}")
    if dtype == torch.float32 and name == REAL:
        print(f"  target (issue 41) fast >= 1.3x: {ratio['fast'] >= 1.3}, and >= 60% of "
              f"the limit: {median['fast'] / limit >= 0.6}")
    elif dtype == torch.float32:
        target = SIZES[name][1]
        print(f"  target (issue 22) ours >= {target}x: {ratio['ours'] >= target}")
        if name == "gpt2-small":
            print(f"  target (issue 34) fast >= 1.3x: {ratio['fast'] >= 1.3}, and >= 50% of "
                  f"the limit: {median['fast'] / limit >= 0.5}")
    figures[name] = {"parameters": params, "dtype": str(dtype).removeprefix("torch."),
                     "new_tokens": new,
                     "greedy_tokens_equal": same,
                     "fast_tokens_equal_transformers": agree,
                     "ours_tokens_per_s": round(median["ours"], 1),
                     "fast_tokens_per_s": round(median["fast"], 1),
                     "transformers_tokens_per_s": round(median["transformers"], 1),
                     "ratio": round(ratio["ours"], 3), "fast_ratio": round(ratio["fast"], 3),
                     "bandwidth_GB_per_s": round(bytes_per_s / 1e9, 1),
                     "bandwidth_limit_tokens_per_s": round(limit, 1)}
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", choices=[*SIZES, REAL, "both"], default="both",
                        help=f"both: {' and '.join(SIZES)} (default); {REAL}: the real model")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32",
                        help="the weights' precision, on both sides (default float32)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--json", help="also write the figures to this file, as JSON")
    args = parser.parse_args()
    if args.size == REAL:
        try:
            smollm2_path()                              # before any timing: is it here?
        except FileNotFoundError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False       # float32 means float32 on a GPU too
    torch.set_num_threads(args.threads)
    where = (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda"
             else f"CPU, {args.threads} threads")
    dtype = DTYPES[args.dtype]
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}, {where}, torch {torch.__version__}, batch 1, "
          f"{PROMPT}-token prompt, {REAL_NEW if args.size == REAL else NEW} new tokens, "
          f"{args.dtype}")
    bandwidths = [bandwidth()]
    print(f"memory bandwidth (sum of a 512 MB tensor): {bandwidths[0] / 1e9:.1f} GB/s")
    names = list(SIZES) if args.size == "both" else [args.size]
    figures: dict = {}
    same = all([compare(n, args.rounds, bandwidths, figures, dtype) for n in names])
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"device": where, "dtype": args.dtype,
                       "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
                       "bandwidth_GB_per_s": round(max(bandwidths) / 1e9, 1), **figures},
                      file, indent=1)
    if not same:
        raise SystemExit("greedy tokens differ between ours and transformers (float32), or "
                         "between ours and the fast step")


if __name__ == "__main__":
    main()
