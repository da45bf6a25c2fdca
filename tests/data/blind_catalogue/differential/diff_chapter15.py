"""Checks that every wrong answer of chapter15.py differs from the book's solution.

My own differential check, written with the catalogue (not the book's checkers):
run from the repository root with
PYTHONPATH=$PWD .venv/bin/python tests/data/blind_catalogue/differential/diff_chapter15.py
"""

import collections
import copy
import os
import runpy
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'chapter15.py')
from harness import differs

CAT = CATALOGUE

def ref_restore(model, optimizer, generator, ck):
    model.load_state_dict(ck["model"]); optimizer.load_state_dict(ck["optimizer"])
    torch.set_rng_state(ck["torch_rng"]); generator.set_state(ck["data_rng"]); return ck["step"]
def ref_ring(P, N, b): return 2 * (N - 1) / N * P * b
def ref_zero(P, N, s):
    f = lambda e, sh: P * e / (N if sh else 1)
    return f(2, s >= 3), f(2, s >= 2), f(12, s >= 1)
def ref_avg(model, n):
    import torch.distributed as dist
    total = torch.tensor(float(n)); dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= n; dist.all_reduce(p.grad); p.grad /= total

DATA = torch.randn(200, 6)
def program():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    return model, opt, gen
def step(model, opt, gen):
    i = torch.randint(0, 200, (8,), generator=gen)
    loss = model(DATA[i]).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
def resumed(fn, total=10, stop=5):
    model, opt, gen = program()
    for _ in range(stop): step(model, opt, gen)
    ck = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(opt.state_dict()),
          "torch_rng": torch.get_rng_state(), "data_rng": gen.get_state(), "step": stop}
    for _ in range(3): torch.rand(1)           # the old program's further draws
    model, opt, gen = program()
    s = fn(model, opt, gen, ck)
    for _ in range(s, total): step(model, opt, gen)
    return torch.cat([p.detach().flatten() for p in model.parameters()])

def avg_worker(rank, name, counts, out):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = "29533"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    fns = runpy.run_path(CAT); fns["ref"] = ref_avg
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(sum(counts), 4, generator=torch.Generator().manual_seed(1))
    start = sum(counts[:rank]); mine = x[start:start + counts[rank]]
    model(mine).pow(2).sum(-1).mean().backward()
    fns[name](model, counts[rank])
    torch.save({"grads": [p.grad.clone() for p in model.parameters()], "weights": [p.detach().clone() for p in model.parameters()]}, f"{out}/{rank}.pt")
    dist.destroy_process_group()

def run_avg(name, counts):
    import torch.multiprocessing as mp
    out = tempfile.mkdtemp()
    try:
        mp.spawn(avg_worker, args=(name, counts, out), nprocs=2)
    except Exception:  # noqa: BLE001
        return "raises"
    return [torch.load(f"{out}/{r}.pt") for r in range(2)]

if __name__ == "__main__":
    cat = runpy.run_path(CAT)
    counts = collections.Counter(); bad = 0
    ref_weights = resumed(ref_restore)
    model, opt, gen = program()
    for _ in range(10): step(model, opt, gen)
    assert torch.equal(ref_weights, torch.cat([p.detach().flatten() for p in model.parameters()])), "reference resume not bit-equal"
    refs_avg = {c: run_avg("ref", c) for c in [(4, 4), (3, 5), (1, 4)]}
    for label, checker, desc, fn in cat["WRONG_ANSWERS"]:
        counts[label] += 1
        if label == "15.1":
            try:
                w = resumed(fn); reasons = [] if torch.equal(w, ref_weights) else ["weights differ"]
            except Exception as e:  # noqa: BLE001 (any failure counts)
                reasons = ["raises " + repr(e)[:40]]
        elif label == "15.2":
            reasons = differs(ref_ring, fn, [lambda: (124439808, 8, 4), lambda: (10, 3, 1), lambda: (1000, 1, 2), lambda: (36096, 2, 4), lambda: (7, 4, 2)], label, fn.__name__)
        elif label == "15.4":
            reasons = differs(ref_zero, fn, [(lambda s=s, n=n: (8030261248, n, s)) for s in range(4) for n in (1, 3, 8)], label, fn.__name__)
        else:
            reasons = []
            for c, ref in refs_avg.items():
                got = run_avg(fn.__name__, c)
                if got == "raises": reasons.append("raises"); continue
                for r in range(2):
                    if any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(got[r]["grads"], ref[r]["grads"])): reasons.append(f"grads {c}")
                    if any(not torch.equal(a, b) for a, b in zip(got[r]["weights"], ref[r]["weights"])): reasons.append(f"weights {c}")
        bad += not reasons
        print(f"{label} {fn.__name__:32s} {'NOT WRONG!' if not reasons else ','.join(sorted(set(reasons)))}", flush=True)
    print(dict(counts), "not wrong:", bad)
