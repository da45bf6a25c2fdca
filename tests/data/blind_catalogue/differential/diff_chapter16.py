"""Checks that every wrong answer of chapter16.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter16.py
"""

import collections
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter16.py')
import torch.nn.functional as F
from harness import differs

cat = runpy.run_path(CATALOGUE)

def ref_labels(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [-100, *content, end_id]
        else:
            labels += [-100] * (len(content) + 2)
    return labels
def ref_loss(logits, labels):
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1), ignore_index=-100)
def ref_fwd(x, weight, A, B, alpha):
    r = A.shape[0]
    return x @ weight.T + (alpha / r) * (x @ A.T @ B.T)
def ref_merge(weight, A, B, alpha):
    return weight + (alpha / A.shape[0]) * (B @ A)
def ref_init(i, o, r, g):
    A = torch.randn(r, i, generator=g) / i ** 0.5
    return A, torch.zeros(o, r)
def ref_count(shapes, r):
    return sum(r * (d_in + d_out) for d_out, d_in in shapes)

ROLE = {"system": 602, "user": 603, "assistant": 604}
ex_turns = [("user", [114, 101, 112, 101, 97, 116, 58, 32, 465, 308, 462]), ("assistant", [465, 308, 462])]
M = {"16.1": (ref_labels, [
        lambda: (ex_turns, ROLE, 605),
        lambda: ([("system", [1, 2]), ("user", [3]), ("assistant", [4, 5]), ("user", [6, 7]), ("assistant", [8])], ROLE, 605),
        lambda: ([("system", [1, 2]), ("user", [3]), ("assistant", [0, 5]), ("user", [6, 7]), ("assistant", [8, 9, 10])], {"system": 7, "user": 9, "assistant": 8}, 11),
      ]),
}
def mk_loss(B, T, V, seed, scale=1.0, grad=True, zero=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        lg = (torch.randn(B, T, V, generator=g) * scale).requires_grad_(grad)
        lab = torch.randint(0, V, (B, T), generator=g)
        drop = torch.rand(B, T, generator=g) < 0.4
        lab[drop] = -100
        lab[:, 0] = -100
        if zero: lab[0, 2] = 0
        return lg, lab
    return f
M["16.2"] = (ref_loss, [mk_loss(1, 6, 5, 0), mk_loss(3, 7, 9, 1), mk_loss(2, 5, 4, 2, scale=100.0), mk_loss(2, 8, 6, 3, grad=False, zero=True),
             lambda: (mk_loss(2, 6, 5, 4)()[0], torch.randint(0, 5, (2, 6), generator=torch.Generator().manual_seed(9)))])
def mk_fwd(N, i, o, r, alpha, seed, grad=True):
    def f():
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(N, i, generator=g).requires_grad_(grad), torch.randn(o, i, generator=g).requires_grad_(grad),
                torch.randn(r, i, generator=g).requires_grad_(grad), torch.randn(o, r, generator=g).requires_grad_(grad), alpha)
    return f
M["16.3"] = (ref_fwd, [mk_fwd(5, 8, 6, 2, 4, 0), mk_fwd(3, 4, 4, 3, 4, 1), mk_fwd(3, 6, 6, 2, 4, 2, grad=False), mk_fwd(4, 5, 7, 4, 8, 3, grad=False)])
def mk_merge(i, o, r, alpha, seed, grad=False):
    def f():
        a = mk_fwd(1, i, o, r, alpha, seed, grad)()
        return a[1:]
    return f
M["16.4"] = (ref_merge, [mk_merge(8, 6, 2, 4, 0), mk_merge(5, 5, 3, 4, 1), mk_merge(5, 7, 4, 8, 2, grad=True)])
M["16.5"] = (ref_init, [lambda: (8, 6, 2, torch.Generator().manual_seed(0)), lambda: (5, 7, 3, torch.Generator().manual_seed(1))])
M["16.6"] = (ref_count, [lambda: ([(48, 48)] * 4 + [(128, 48), (128, 48), (48, 128)], 16), lambda: ([(6, 8), (6, 8)], 2), lambda: ([torch.Size([3, 5])], 1)])

# generator-based: harness compares returned A; generator state also matters for reseed
counts = collections.Counter()
bad = 0
for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
    counts[label] += 1
    ref, makers = M[label]
    reasons = differs(ref, fn, makers, label, fn.__name__)
    if not reasons:
        bad += 1
    print(f"{label} {fn.__name__:45s} {'NOT WRONG!' if not reasons else ','.join(sorted(set(reasons)))}")
print(dict(counts), "not wrong:", bad)
