"""Differential harness (mine, not the checkers): each wrong answer must differ from the
book's solution on some input, in value, type, dtype, gradient, input state or determinism."""
import numpy as np
import torch


def same(a, b):
    if isinstance(b, torch.Generator):
        return isinstance(a, torch.Generator) and torch.equal(a.get_state(), b.get_state())
    if type(a) is not type(b):
        return False
    if isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape: return False
        if b.requires_grad != a.requires_grad: return False
        if a.dtype.is_floating_point:
            return bool(torch.allclose(a.detach(), b.detach(), atol=1e-5, rtol=1e-4, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.allclose(a, b)
    if isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    if isinstance(b, float):
        return abs(a - b) <= 1e-6 * max(1, abs(b))
    return a == b

def leaves(obj):
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad else []
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in leaves(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in leaves(x)]
    return []

def outs(obj):
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad and obj.dtype.is_floating_point else []
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in outs(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in outs(x)]
    return []

def run_case(fn, make):
    args = make()
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 (any failure counts)
        return "raise", repr(e)[:80], args, None
    grads = None
    os_ = outs(out)
    if os_:
        try:
            total = sum((o.float() * torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape)).sum() for o in os_)
            ls = leaves(args)
            grads = torch.autograd.grad(total, ls, allow_unused=True) if ls else ()
            grads = [None if g is None else g.detach() for g in grads]
        except Exception as e:  # noqa: BLE001 (any failure counts)
            grads = "grad error " + repr(e)[:40]
    return "ok", out, args, grads

def differs(ref, wrong, makers, label, name):
    reasons = []
    for mk in makers:
        st_r, out_r, args_r, g_r = run_case(ref, mk)
        if st_r != "ok":
            raise RuntimeError(f"reference fails on {label}: {out_r}")
        st_w, out_w, args_w, g_w = run_case(wrong, mk)
        if st_w != "ok":
            reasons.append("raises " + out_w); continue
        if not same(args_w, args_r):
            reasons.append("input state"); continue
        if not same(out_w, out_r):
            reasons.append("value/type"); continue
        if g_r is not None and (g_w is None or isinstance(g_w, str) or len(g_w) != len(g_r)
                                or any((a is None) != (b is None) or (a is not None and not torch.allclose(a, b, atol=1e-5))
                                       for a, b in zip(g_w, g_r))):
            reasons.append("gradient"); continue
        st2, out2, _, _ = run_case(wrong, mk)
        if st2 != "ok" or not same(out2, out_w):
            reasons.append("nondeterministic"); continue
    return reasons
