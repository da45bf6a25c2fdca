"""How fast is our blocked attention next to PyTorch's own? (chapters 6 and 7)

Run from the repository root:  .venv/bin/python benchmarks/attention.py [--threads 2] [--repeats 25]
(`make bench` runs it with the other benchmarks.)

For B=4 sequences, 8 heads of width d_k=64 and T = 128, 512, 1024 positions, float32, it times
  * minitransformer.blocked_attention against torch.nn.functional.scaled_dot_product_attention,
    without a mask and with a causal mask (ours: causal_mask(T); PyTorch: is_causal=True),
  * minitransformer.scaled_dot_product_attention, the readable reference, for comparison,
  * minitransformer.MultiHeadAttention (no weights requested) against nn.MultiheadAttention
    (need_weights=False), both with the same weights, in eval mode,
all under torch.inference_mode() and with an explicit number of threads.

Timing method: both functions run in the same process on the same inputs, interleaved (ours then
theirs, then theirs then ours, ...), after WARM_UP untimed calls each. The table shows the median
time of each and the median of the per-repeat ratios ours / theirs, which is robust to other
programs slowing the machine down for a while. Targets on a 2-core CPU: ratio <= 1.5 for
blocked_attention without a mask at T=512 (printed on the last line), and <= 1.1 for multi-head
attention. Timings on a busy machine mean little: the load average is printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minitransformer import (
    MultiHeadAttention,
    blocked_attention,
    causal_mask,
    scaled_dot_product_attention,
)

BATCH, HEADS, D_K = 4, 8, 64
LENGTHS = (128, 512, 1024)
# Untimed calls of each before timing: the first calls of a size pay for allocations and caches.
WARM_UP = 5


def _time(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def compare(ours: Callable[[], object], theirs: Callable[[], object],
            repeats: int) -> tuple[float, float, float]:
    """Median seconds of ``ours`` and ``theirs`` and the median per-repeat ratio ours / theirs."""
    for _ in range(WARM_UP):
        ours(), theirs()
    ours_times, theirs_times, ratios = [], [], []
    for repeat in range(repeats):
        if repeat % 2 == 0:
            t_ours, t_theirs = _time(ours), _time(theirs)
        else:
            t_theirs, t_ours = _time(theirs), _time(ours)
        ours_times.append(t_ours)
        theirs_times.append(t_theirs)
        ratios.append(t_ours / t_theirs)
    return statistics.median(ours_times), statistics.median(theirs_times), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--repeats", type=int, default=25, help="timed repeats per size")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="sequence lengths T (default 128 512 1024; 512 is always included)")
    args = parser.parse_args()
    lengths = sorted(set(args.lengths) | {512})
    torch.set_num_threads(args.threads)
    _ = torch.manual_seed(0)
    d_model = HEADS * D_K
    torch_mha = nn.MultiheadAttention(d_model, HEADS, batch_first=True).eval()
    our_mha = MultiHeadAttention.from_torch(torch_mha).eval()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU, "
          f"B={BATCH}, heads={HEADS}, d_k={D_K}, {args.repeats} interleaved repeats, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'what':<34}{'T':>6}{'ours (ms)':>12}{'torch (ms)':>12}{'ratio':>8}")

    def report(what: str, length: int, ours, theirs) -> float:
        ours_s, theirs_s, ratio = compare(ours, theirs, args.repeats)
        print(f"{what:<34}{length:>6}{ours_s * 1e3:>12.2f}{theirs_s * 1e3:>12.2f}{ratio:>8.2f}",
              flush=True)
        return ratio

    ratios = {}
    with torch.inference_mode():
        for length in lengths:
            q, k, v = (torch.randn(BATCH, HEADS, length, D_K) for _ in range(3))
            mask = causal_mask(length)
            torch.testing.assert_close(blocked_attention(q, k, v),
                                       F.scaled_dot_product_attention(q, k, v))
            torch.testing.assert_close(blocked_attention(q, k, v, mask),
                                       F.scaled_dot_product_attention(q, k, v, is_causal=True))
            ratios[length] = report("blocked_attention", length,
                                    lambda: blocked_attention(q, k, v),
                                    lambda: F.scaled_dot_product_attention(q, k, v))
            report("blocked_attention, causal", length,
                   lambda: blocked_attention(q, k, v, mask),
                   lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            report("scaled_dot_product_attention", length,
                   lambda: scaled_dot_product_attention(q, k, v),
                   lambda: F.scaled_dot_product_attention(q, k, v))
        for length in lengths:
            x = torch.randn(BATCH, length, d_model)
            torch.testing.assert_close(our_mha(x), torch_mha(x, x, x, need_weights=False)[0])
            report("MultiHeadAttention", length, lambda: our_mha(x),
                   lambda: torch_mha(x, x, x, need_weights=False))
    ratio = ratios[512]
    print(f"blocked_attention / F.scaled_dot_product_attention at T=512, no mask: {ratio:.2f} "
          f"(target <= 1.5: {ratio <= 1.5})")


if __name__ == "__main__":
    main()
