"""Checks that every wrong answer of chapter14.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter14.py
"""

import collections
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter14.py')
import torch.nn.functional as F
from harness import differs

cat = runpy.run_path(CATALOGUE)
def ref_rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
def ref_rope(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    fr = theta ** (-torch.arange(0, d, 2) / d); pos = torch.arange(offset, offset + length)
    a = torch.outer(pos, fr); a = torch.cat([a, a], -1)
    f, s = x.chunk(2, -1)
    return x * a.cos() + torch.cat([-s, f], -1) * a.sin()
def ref_exp(kv, h): return kv.repeat_interleave(h // kv.shape[1], dim=1)
def ref_swi(x, g, u, dn): return (F.silu(x @ g.T) * (x @ u.T)) @ dn.T
def mk_rms(shape, seed, eps=1e-6, grad=True, scale=1.0):
    def f():
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g) * scale).requires_grad_(grad), torch.randn(shape[-1], generator=g).requires_grad_(grad), eps
    return f
def mk_rope(shape, offset, theta, seed, grad=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g).requires_grad_(grad), offset, theta
    return f
def mk_kv(shape, h, seed):
    def f():
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g), h
    return f
def mk_swi(shape, d, dff, seed, grad=True):
    def f():
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, d, generator=g).requires_grad_(grad), torch.randn(dff, d, generator=g).requires_grad_(grad),
                torch.randn(dff, d, generator=g).requires_grad_(grad), torch.randn(d, dff, generator=g).requires_grad_(grad))
    return f
M = {"14.1": (ref_rms, [mk_rms((2, 3, 8), 0), mk_rms((4, 4), 1, eps=0.5, scale=0.1), mk_rms((2, 5, 6), 2, grad=False), mk_rms((3, 6), 3, eps=1e-5, scale=100)]),
     "14.2": (ref_rope, [mk_rope((1, 2, 6, 16), 10, 10000.0, 0), mk_rope((2, 3, 4, 8), 0, 500000.0, 1), mk_rope((1, 4, 4, 4), 7, 100.0, 2)]),
     "14.3": (ref_exp, [mk_kv((1, 2, 3, 4), 4, 0), mk_kv((2, 2, 3, 4), 8, 1), mk_kv((1, 3, 2, 2), 9, 2), mk_kv((2, 1, 3, 2), 3, 3), mk_kv((1, 4, 2, 2), 4, 4)]),
     "14.4": (ref_swi, [mk_swi((3,), 4, 10, 0), mk_swi((2, 3), 5, 5, 1), mk_swi((2,), 6, 6, 2, grad=False)]),
}
counts = collections.Counter(); bad = 0
for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
    counts[label] += 1
    ref, makers = M[label]
    reasons = differs(ref, fn, makers, label, fn.__name__)
    bad += not reasons
    print(f"{label} {fn.__name__:40s} {'NOT WRONG!' if not reasons else ','.join(sorted({r[:50] for r in reasons}))}")
print(dict(counts), "not wrong:", bad)
