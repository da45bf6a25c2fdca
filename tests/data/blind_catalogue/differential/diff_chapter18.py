"""Checks that every wrong answer of chapter18.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter18.py
"""

import collections
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter18.py')
from harness import differs

cat = runpy.run_path(CATALOGUE)

def ref_pad(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, (mask.long().cumsum(-1) - 1).clamp(min=0)
def ref_grow(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]
def ref_free(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return sorted(set(block_tables[finished]) - in_use)
def ref_merge(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2); a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2

def mk_merge(n, d, seed, scale=1.0, grad=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(2):
            s = torch.randn(n, 5, generator=g) * scale; v = torch.randn(5, d, generator=g)
            m = s.max(-1).values; w = torch.exp(s - m[:, None])
            out += [m.clone().requires_grad_(grad), w.sum(-1).requires_grad_(grad), (w @ v).requires_grad_(grad)]
        return tuple(out)
    return f
big = int("1000"); big2 = int("1000")
M = {"18.1": (ref_pad, [lambda: ([[296, 287, 282, 386], [326, 297, 366, 58, 329, 264, 524, 277], [104, 105]], 560),
                        lambda: ([[5, 0, 7], [1, 2, 3, 4, 5], [9]], 0), lambda: ([[3, 4], [5, 6]], 9), lambda: ([[1], [2, 3, 4]], 0)]),
     "18.2": (ref_grow, [lambda: ([3, 4], 9, [7, 1, 9, 2], 4), lambda: ([], 16, [5, 2, 8, 0], 16), lambda: ([0], 17, [5, 2, 8], 16),
                         lambda: ([0, 1, 2], 5, [9, 8], 4), lambda: ([], 13, [6, 4, 2, 0, 9], 4), lambda: ([1], 3, [4, 2], 4),
                         lambda: ([0, 1], 9, [7, 6, 5], 4), lambda: ([], 5, [9, 3, 1], 2)]),
     "18.3": (ref_free, [lambda: ({0: [1, 2, 5], 1: [1, 2, 7], 2: [3]}, 1), lambda: ({3: [9, 4, 6, 2], 7: [9, 4, 8], 1: [6]}, 3),
                         lambda: ({big: [0, 1, 2], 5: [0, 3]}, big2), lambda: ({0: [5, 6, 7, 8]}, 0),
                         lambda: ({0: [1, 2, 3, 4], 1: [2, 3]}, 0), lambda: ({2: [1, 2, 3], 0: [4, 1]}, 2), lambda: ({0: [7, 3, 5], 1: [1]}, 0)]),
     "18.4": (ref_merge, [mk_merge(3, 5, 0), mk_merge(4, 4, 1, grad=True), mk_merge(1, 6, 2), mk_merge(2, 3, 3, scale=60.0)]),
}
counts = collections.Counter(); bad = 0
for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
    counts[label] += 1
    ref, makers = M[label]
    reasons = differs(ref, fn, makers, label, fn.__name__)
    if label == "18.2":
        for mk in makers:
            a = mk()
            try:
                out = fn(*a)
            except Exception:  # noqa: BLE001, S112 (raising is already a reason)
                continue
            if isinstance(out, tuple) and len(out) == 2 and (out[0] is a[0] or out[1] is a[2] or out[0] is a[2] or out[1] is a[0]):
                reasons.append("aliases input")
    bad += not reasons
    print(f"{label} {fn.__name__:40s} {'NOT WRONG!' if not reasons else ','.join(sorted({r[:60] for r in reasons}))}")
print(dict(counts), "not wrong:", bad)
