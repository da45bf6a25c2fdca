"""Checks that every wrong answer of chapter17.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter17.py
"""

import collections
import os
import runpy
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter17.py')
import torch.nn.functional as F
from harness import differs

cat = runpy.run_path(CATALOGUE)

def ref_seq(logits, ids, response_mask):
    log_probs = logits[:, :-1].log_softmax(-1)
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return (picked * response_mask[:, 1:]).sum(-1)
def ref_dpo(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()
def ref_adv(rewards, G):
    groups = rewards.view(-1, G)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
def ref_clip(lp, old, adv, mask, eps):
    ratio = torch.exp(lp - old); a = adv[:, None]
    obj = torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a)
    return -(obj * mask).sum() / mask.sum()

def mk_seq(B, T, V, seed, grad=True, first=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        lg = torch.randn(B, T, V, generator=g).requires_grad_(grad)
        ids = torch.randint(0, V, (B, T), generator=g)
        m = torch.zeros(B, T, dtype=torch.bool)
        for b in range(B):
            s = 1 + b % 2; e = T - (b % 3)
            m[b, s:e] = True
        if first: m[:, 0] = True
        return lg, ids, m
    return f
def mk_dpo(B, seed, scale=1.0, beta=0.1, grad=True):
    def f():
        g = torch.Generator().manual_seed(seed)
        t = [(-torch.rand(B, generator=g) * 20 * scale).requires_grad_(grad) for _ in range(4)]
        return (*t, beta)
    return f
def mk_adv(N, G, seed, ints=False):
    def f():
        g = torch.Generator().manual_seed(seed)
        r = torch.randint(0, 2, (N * G,), generator=g).float() if ints else torch.rand(N * G, generator=g)
        return r, G
    return f
def mk_clip(B, T, seed, eps=0.2, grad=True):
    def f():
        g = torch.Generator().manual_seed(seed)
        old = -torch.rand(B, T, generator=g) * 3
        lp = (old + 0.5 * torch.randn(B, T, generator=g)).requires_grad_(grad)
        adv = torch.randn(B, generator=g)
        mask = torch.zeros(B, T, dtype=torch.bool)
        for b in range(B): mask[b, : T - b % 3] = True
        return lp, old, adv, mask, eps
    return f
M = {"17.1": (ref_seq, [mk_seq(2, 6, 5, 0), mk_seq(3, 7, 9, 1, first=True), mk_seq(2, 5, 4, 2, grad=False)]),
     "17.2": (ref_dpo, [mk_dpo(4, 0), mk_dpo(3, 1, scale=100, beta=1.0), mk_dpo(5, 2, beta=0.5, grad=False),
                        lambda: (torch.tensor([-5.]), torch.tensor([-4.]), torch.tensor([-5.]), torch.tensor([-4.]), 0.1)]),
     "17.3": (ref_adv, [lambda: (torch.tensor([1., 0., 0., 0., 1., 1., 1., 1., 0., 0., 0., 0.]), 4), mk_adv(3, 8, 0, True), mk_adv(2, 3, 1), mk_adv(3, 3, 2), mk_adv(1, 5, 3)]),
     "17.4": (ref_clip, [mk_clip(3, 5, 0), mk_clip(4, 4, 1, eps=0.1), mk_clip(2, 6, 2, grad=False), mk_clip(5, 5, 3, eps=0.3)]),
}
counts = collections.Counter(); bad = 0
for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
    counts[label] += 1
    ref, makers = M[label]
    reasons = differs(ref, fn, makers, label, fn.__name__)
    bad += not reasons
    print(f"{label} {fn.__name__:40s} {'NOT WRONG!' if not reasons else ','.join(sorted({r[:60] for r in reasons}))}")
print(dict(counts), "not wrong:", bad)
