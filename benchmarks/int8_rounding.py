"""Which rounding parts SmolLM2's greedy tokens from float32's (issue 44, chapter 19).

Run from the repository root:
    .venv/bin/python benchmarks/int8_rounding.py [--tokens 64] [--only NAME ...]

The float32 model, with each linear product replaced by a rounded one, one change at a time;
on the five chat prompts of ``benchmarks/int8_decode.py``, greedy tokens against float32's
(how many prompts stay equal over ``--tokens``, where they part and float32's margin there), and
float32's continuation fed to both (at how many positions the best token is float32's, the
largest logit difference). The changes:

* ``int8_weights``: per-row absmax int8 weights, the product exact in float32
  (``quantize.int8_linear``): the weights' rounding alone;
* ``rows_8_bits``, ``outputs_8_bits``, ``both_8_bits``: the weights as they are, the rows
  and/or the outputs rounded to 8 significant bits (bfloat16's, what PyTorch's fast int8 and
  int4 CPU kernels do);
* ``both_11_bits``: rows and outputs rounded to 11 significant bits (float16's).

Measured on the course's CPU (one thread, torch 2.13, 2026-11-28), 64 tokens:

=============== =============== ================= ============ ==================
change          prompts equal   parted at         teacher-     largest logit
                                (float32's        forced agree change, of the
                                margin)                        largest logit
=============== =============== ================= ============ ==================
int8_weights    1/5             59 (0.45), 31     309/320      5.0%
                                (0.041), 9 (0.19),
                                6 (0.0072)
rows_8_bits     3/5             6 (0.013), 6      319/320      0.88%
                                (0.0072)
outputs_8_bits  2/5             0 (0.082), 6      315/320      0.95%
                                (0.013), 6 (0.0072)
both_8_bits     1/5             0 (0.082), 50     316/320      1.6%
                                (0.25), 6, 6
both_11_bits    5/5             -                 320/320      0.14%
=============== =============== ================= ============ ==================

So equal greedy tokens need the weights exact (SmolLM2's are Q4_1: ``quantize.Int4Linear``
holds them exactly, per-row int8 does not) and about 11 significant bits in the product.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from int8_decode import models, quality  # noqa: E402

from minitransformer import quantize  # noqa: E402


def rounded(bits: int):
    """Round to ``bits`` significant bits, to nearest (ties to even)."""
    def round_to(t: torch.Tensor) -> torch.Tensor:
        mantissa, exponent = torch.frexp(t)
        return torch.ldexp(torch.round(mantissa * 2 ** bits) / 2 ** bits, exponent)
    return round_to


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--only", nargs="+", help="run only these changes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    named, prompts = models("smollm2")
    f32, int8 = named["float32"], named["int8"]
    weights = {id(b.weight_int8): a.weight.detach() for a, b in
               zip((m for m in f32.modules() if type(m) is torch.nn.Linear),
                   (m for m in int8.modules() if isinstance(m, quantize.Int8Linear)))}
    keep = lambda t: t                                            # noqa: E731

    def product(rows=keep, outputs=keep):
        """A stand-in for ``int8_linear_fast``: float32's weight, rounded rows/outputs."""
        return lambda x, q, scale, bias=None: outputs(F.linear(rows(x), weights[id(q)], bias))

    changes = {"int8_weights": quantize.int8_linear,
               "rows_8_bits": product(rows=rounded(8)),
               "outputs_8_bits": product(outputs=rounded(8)),
               "both_8_bits": product(rounded(8), rounded(8)),
               "both_11_bits": product(rounded(11), rounded(11))}
    original = quantize.int8_linear_fast
    with torch.no_grad():
        for name in args.only or changes:
            quantize.int8_linear_fast = changes[name]          # what Int8Linear.forward calls
            try:
                q = quality(f32, int8, prompts, args.tokens)
            finally:
                quantize.int8_linear_fast = original
            parts = ", ".join(f"{p['parted_at']} ({p['float32_margin']})" for p in q["parted"])
            print(f"{name}: equal on {q['prompts_equal']}/{q['prompts']} prompts"
                  + (f", parted at {parts}" if parts else "")
                  + f"; teacher-forced {q['teacher_forced_agree']}/"
                  f"{q['teacher_forced_positions']}; largest logit difference "
                  f"{q['max_logit_difference_relative']:.2%} of the largest logit", flush=True)


if __name__ == "__main__":
    main()
