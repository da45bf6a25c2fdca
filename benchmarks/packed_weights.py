"""How fast does each way multiply a few rows by GPT-2 small's matrices? (chapter 18)

Run from the repository root:
    .venv/bin/python benchmarks/packed_weights.py [--threads 2] [--rows 1 2 3 4 8 16 64]

``GPT.make_fast_decode_step`` multiplies rows by a weight matrix one of three ways, and this
script times each, for GPT-2 small's matrices in float32 on the CPU:

* ``F.linear``: the ordinary step's product (and the fast step's for small matrices);
* blocks: :func:`minitransformer.fast_decode.row_product`, the matrix cut into blocks of rows
  that the threads share (the fast step's way for one or two rows);
* packed: the copy that oneDNN packed when the step was made (``pack_weights=True``, the
  serving engine's way from :data:`~minitransformer.fast_decode.PACKED_MIN_ROWS` rows on).

The matrices are those of GPT-2 small: 12 layers' query (768 x 768, the key, value and output
projections are alike), first (3072 x 768) and second (768 x 3072) feed-forward matrix, and the
head (50,257 x 768). Each layer matrix is timed over 12 copies in turn, as a forward pass
reads them, so that they come from memory rather than from the CPU's caches, as in a model.
Printed: milliseconds per product for each way and row count, the packed way's time as a
fraction of the better of the two others, and the time to pack a whole GPT-2 small. The
median of ``--repeats`` timings is kept. The load average is printed first and last: timings on
a busy machine mean little.

Measured on the course's CPU (2 threads), the figures behind the constants of
``minitransformer/fast_decode.py``:

* ``PACKED_MIN_ROWS = 3``: at three rows GPT-2 small's first feed-forward matrix took 0.46 ms
  packed against the blocks' 0.74; at two rows 0.55 against 0.38. The packed copy took 0.6-0.9
  of the blocks' time at 3 to 16 rows, and the head 0.44 of ``F.linear``'s at 64 prompt
  positions; packing a whole GPT-2 small took 0.23 s.
* ``PACKED_ROWS_HINT = 16``: packed for 4, 16 or 64 rows, the products of 4 to 128 rows ran
  alike.
* ``benchmarks/serving.py``: the engine that runs the packed step served 16 requests of GPT-2
  small's shape at 3.6-3.7 times the tokens per second of the fast step running them one after
  another.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minitransformer import GPT, GPTConfig  # noqa: E402
from minitransformer.fast_decode import PackedWeight, row_product  # noqa: E402

GPT2_SMALL = GPTConfig(vocab_size=50257, context_length=1024, num_layers=12, num_heads=12,
                       d_model=768, activation="gelu_tanh")
MATRICES = {"query": (768, 768), "feed-forward 1": (3072, 768), "feed-forward 2": (768, 3072),
            "head": (50257, 768)}


def median_ms(product, copies: list, repeats: int) -> float:
    """The median over ``repeats`` of the time of one product, in ms, each timing a pass over
    every copy (after one pass that is not timed)."""
    for copy in copies:
        product(copy)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for copy in copies:
            product(copy)
        times.append((time.perf_counter() - start) / len(copies))
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads < 1 or args.repeats < 1 or min(args.rows) < 1:
        parser.error("--threads, --repeats and every --rows must be at least 1")
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} threads, torch "
          f"{torch.__version__}, oneDNN {torch.backends.mkldnn.is_available()}", flush=True)
    g = torch.Generator().manual_seed(0)
    print(f"{'matrix':15} {'rows':>4} {'F.linear':>9} {'blocks':>8} {'packed':>8} "
          f"{'packed / best other':>20}")
    for name, (out, width) in MATRICES.items():
        count = 1 if name == "head" else GPT2_SMALL.num_layers
        with torch.inference_mode(False):
            weights = [torch.randn(out, width, generator=g) * 0.02 for _ in range(count)]
            packs = [PackedWeight(w) for w in weights]
            for pack in packs:
                pack.current()
        bias = None if name == "head" else torch.zeros(out)
        for rows in args.rows:
            x = torch.randn(rows, width, generator=g)
            ms = {"linear": median_ms(lambda w: F.linear(x, w, bias), weights, args.repeats),
                  "blocks": median_ms(lambda w: row_product(x, w, bias), weights,
                                      args.repeats),
                  "packed": median_ms(lambda p: p(x, bias), packs, args.repeats)}
            best = min(ms["linear"], ms["blocks"])
            print(f"{name:15} {rows:4d} {ms['linear']:9.3f} {ms['blocks']:8.3f} "
                  f"{ms['packed']:8.3f} {ms['packed'] / best:20.2f}", flush=True)
        del weights, packs
    with torch.inference_mode(False):
        model = GPT(GPT2_SMALL).eval()
    start = time.perf_counter()
    model.make_fast_decode_step(pack_weights=True)
    print(f"packing GPT-2 small ({sum(p.numel() for p in model.parameters()):,} parameters): "
          f"{time.perf_counter() - start:.2f} s")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
