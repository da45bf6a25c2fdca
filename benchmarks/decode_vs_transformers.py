"""Is our cached greedy decoding as fast as transformers' on the same weights? (chapter 13)

Run from the repository root:
    .venv/bin/python benchmarks/decode_vs_transformers.py [--threads 2] [--rounds 5] [--size both]
        [--device cpu] [--json FILE]
(`make bench` runs it with the other benchmarks; tools/gpu_check.sh with --device cuda.)

For each size, a randomly initialised GPT is saved with ``save_pretrained`` and loaded by
``transformers.GPT2LMHeadModel.from_pretrained``: the same weights on both sides, float32, on
``--device`` (the CPU by default; on CUDA, TF32 is off and each timing waits for the GPU), batch 1. Each side continues a 32-token prompt by 64 greedy tokens: ours with
``minitransformer.generate(..., temperature=0)`` (KV cache, ``GPT.make_decode_step``), theirs
with ``model.generate(do_sample=False)`` (its own KV cache). The tokens must be equal.

Timing method: one untimed warm-up each, then ``--rounds`` rounds in which the two sides
alternate which goes first; the ratio is the median of the per-round ratios of tokens per second
(ours / theirs), robust to a slow spell of the machine. The load average is printed first:
timings on a busy machine mean little.

It also prints the fraction of the memory-bandwidth limit: each new token reads every weight
once, so at most ``bandwidth / (4 bytes * parameters)`` tokens per second; the bandwidth is
measured in the same run by summing a 512 MB tensor.

``--json FILE`` also writes the figures as JSON. Targets (issue 22, set for the CPU), at 2 threads: >= 1.0x at GPT-2 small's shape (12 layers, 12 heads,
d_model 768, 50,257 tokens, 124M parameters), >= 2x at the book's size (the chapter-11 model:
4 layers, 4 heads, d_model 128, 256 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from minitransformer import GPT, GPTConfig, generate  # noqa: E402
from minitransformer.gpt import count_parameters  # noqa: E402

SIZES = {
    "gpt2-small": (GPTConfig(vocab_size=50257, context_length=1024, num_layers=12,
                             num_heads=12, d_model=768, activation="gelu_tanh"), 1.0),
    "book": (GPTConfig(vocab_size=256, context_length=1024, num_layers=4, num_heads=4,
                       d_model=128), 2.0),
}
PROMPT, NEW = 32, 64


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


def compare(name: str, config: GPTConfig, target: float, rounds: int, bytes_per_s: float,
            figures: dict) -> bool:
    import transformers

    torch.manual_seed(0)
    ours = GPT(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        theirs = transformers.GPT2LMHeadModel.from_pretrained(folder).eval().to(DEVICE)
    ours.to(DEVICE)
    prompt = torch.randint(config.vocab_size, (1, PROMPT),
                           generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def run_ours() -> torch.Tensor:
        return generate(ours, prompt, NEW, temperature=0)

    def run_theirs() -> torch.Tensor:
        with torch.inference_mode():
            return theirs.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW,
                                   do_sample=False, pad_token_id=0)

    same = torch.equal(run_ours(), run_theirs())                     # also the warm-up
    ratios, our_rates, their_rates = [], [], []
    for r in range(rounds):
        pair = (run_ours, run_theirs) if r % 2 == 0 else (run_theirs, run_ours)
        times = {run: _seconds(run) for run in pair}
        our_rates.append(NEW / times[run_ours])
        their_rates.append(NEW / times[run_theirs])
        ratios.append(our_rates[-1] / their_rates[-1])
    params = count_parameters(ours)
    limit = bytes_per_s / (4 * params)
    ratio = statistics.median(ratios)
    print(f"{name}: {params:,} parameters, greedy tokens equal: {same}")
    print(f"  ours {statistics.median(our_rates):.1f} tok/s, transformers "
          f"{statistics.median(their_rates):.1f} tok/s, ratio {ratio:.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"  bandwidth limit {limit:.1f} tok/s: ours at "
          f"{statistics.median(our_rates) / limit:.0%}, transformers at "
          f"{statistics.median(their_rates) / limit:.0%}")
    print(f"  target >= {target}x: {ratio >= target}")
    figures[name] = {"parameters": params, "greedy_tokens_equal": same,
                     "ours_tokens_per_s": round(statistics.median(our_rates), 1),
                     "transformers_tokens_per_s": round(statistics.median(their_rates), 1),
                     "ratio": round(ratio, 3), "bandwidth_limit_tokens_per_s": round(limit, 1)}
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", choices=[*SIZES, "both"], default="both")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--json", help="also write the figures to this file, as JSON")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False       # float32 means float32 on a GPU too
    torch.set_num_threads(args.threads)
    where = (torch.cuda.get_device_name(DEVICE) if DEVICE.type == "cuda"
             else f"CPU, {args.threads} threads")
    print(f"load average {os.getloadavg()[0]:.2f}, {where}, torch {torch.__version__}, batch 1, "
          f"{PROMPT}-token prompt, {NEW} new tokens, float32")
    bytes_per_s = bandwidth()
    print(f"memory bandwidth (sum of a 512 MB tensor): {bytes_per_s / 1e9:.1f} GB/s")
    names = list(SIZES) if args.size == "both" else [args.size]
    figures: dict = {}
    same = all([compare(n, *SIZES[n], args.rounds, bytes_per_s, figures) for n in names])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"device": where, "bandwidth_GB_per_s": round(bytes_per_s / 1e9, 1),
                       **figures}, file, indent=1)
    if not same:
        raise SystemExit("greedy tokens differ between ours and transformers")


if __name__ == "__main__":
    main()
