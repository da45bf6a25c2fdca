"""The wrong-input sweep of tests/test_wrong_input_sweep.py, for chapter 9's training pieces:
functional.cross_entropy, optim.AdamW and optim.clip_grad_norm. One argument at a time is
replaced by each wrong value; the call must work or raise TypeError/ValueError, never a crash
from inside torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from minitransformer.functional import cross_entropy
from minitransformer.optim import AdamW, clip_grad_norm

WRONG = [None, "x", -1, 0, 2.5, True, [], [[]], [[-1]], {}, torch.tensor([]),
         torch.zeros(0, 0), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long),
         torch.full((2, 3), -7), torch.zeros(2, 3, 4), np.zeros((2, 3)), float("nan"), object()]


def _params():
    w = nn.Parameter(torch.ones(2, 3))
    w.grad = torch.full((2, 3), 0.5)
    return [w]


def _adamw_step(params, **options):
    AdamW(params, **options).step()


CALLS = {
    "cross_entropy": (cross_entropy, (torch.randn(2, 3, 5), torch.randint(5, (2, 3))),
                      {"ignore_index": -100, "label_smoothing": 0.1}),
    "AdamW": (_adamw_step, (_params(),), {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8,
                                          "weight_decay": 0.1}),
    "clip_grad_norm": (clip_grad_norm, (_params(), 1.0), {}),
}


def _variants(args, kwargs):
    for i in range(len(args)):
        for wrong in WRONG:
            yield f"arg {i} = {wrong!r:.30}", args[:i] + (wrong,) + args[i + 1:], kwargs
    for key in kwargs:
        for wrong in WRONG:
            yield f"{key} = {wrong!r:.30}", args, {**kwargs, key: wrong}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_wrong_arguments_get_a_type_or_value_error(name):
    function, args, kwargs = CALLS[name]
    function(*args, **kwargs)
    crashes = []
    for described, a, k in _variants(args, kwargs):
        try:
            function(*a, **k)
        except (TypeError, ValueError):
            pass
        except Exception as error:  # noqa: BLE001 - the point of the sweep
            crashes.append(f"{described}: {type(error).__name__}: {str(error)[:120]}")
    assert not crashes, f"{name}:\n" + "\n".join(crashes[:10])
