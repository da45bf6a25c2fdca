"""Checks that every wrong answer of chapter13.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter13.py
"""

import collections
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter13.py')
from harness import differs

from minitransformer.bpe import bytes_to_unicode

cat = runpy.run_path(CATALOGUE)
table = bytes_to_unicode()
def ref_conv(x, w, b): return x @ w + b
def ref_fuse(q, k, v): return torch.cat([q, k, v], 0).t()
def ref_count(V, T, L, d, dff):
    return V * d + T * d + L * (4 * d + 4 * (d * d + d) + d * dff + dff + dff * d + d) + 2 * d
def ref_byte(b): return table[b]
def mk_conv(shape, i, o, seed, grad=True):
    def f():
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, i, generator=g).requires_grad_(grad), torch.randn(i, o, generator=g).requires_grad_(grad),
                torch.randn(o, generator=g).requires_grad_(grad))
    return f
def mk_fuse(d, seed, grad=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(d, d, generator=g).requires_grad_(grad) for _ in range(3))
    return f
M = {"13.1": (ref_conv, [mk_conv((3,), 64, 256, 0), mk_conv((2, 5), 4, 6, 1), mk_conv((4,), 5, 5, 2), mk_conv((5,), 3, 7, 3, grad=False)]),
     "13.2": (ref_fuse, [mk_fuse(4, 0), mk_fuse(6, 1, True)]),
     "13.3": (ref_count, [lambda: (50257, 1024, 12, 768, 3072), lambda: (100, 32, 2, 64, 256), lambda: (100, 32, 2, 64, 100), lambda: (7, 5, 3, 4, 6)]),
     "13.4": (ref_byte, [(lambda b=b: (b,)) for b in range(256)]),
}
assert ref_count(50257, 1024, 12, 768, 3072) == 124_439_808
counts = collections.Counter(); bad = 0
for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
    counts[label] += 1
    ref, makers = M[label]
    reasons = differs(ref, fn, makers, label, fn.__name__)
    bad += not reasons
    print(f"{label} {fn.__name__:40s} {'NOT WRONG!' if not reasons else ','.join(sorted({r[:50] for r in reasons}))}")
print(dict(counts), "not wrong:", bad)
