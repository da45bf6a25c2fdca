"""optim.AdamW and optim.clip_grad_norm, chapter 9's optimizer pieces, against PyTorch's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from minitransformer import GPT, GPTConfig
from minitransformer.optim import AdamW, clip_grad_norm


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 3)).double()


def _loss(model, seed):
    x = torch.randn(16, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return model(x).pow(2).mean()


def _groups(model, weight_decay):
    # as training.make_optimizer: decay the matrices only
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def _run(model, optimizer, steps, first_seed=0, lrs=None):
    for step in range(steps):
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[step]
        optimizer.zero_grad()
        _loss(model, first_seed + step).backward()
        optimizer.step()


@pytest.mark.parametrize("options", [
    {},
    {"lr": 0.05, "weight_decay": 0.1},
    {"lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-6, "weight_decay": 0.5},
    {"lr": 0.02, "betas": (0.0, 0.0), "weight_decay": 0.0},
])
def test_adamw_equals_pytorch_after_several_steps(options):
    ours_model = _model()
    theirs_model = copy.deepcopy(ours_model)
    _run(ours_model, AdamW(ours_model.parameters(), **options), 7)
    _run(theirs_model, torch.optim.AdamW(theirs_model.parameters(), **options), 7)
    for ours, theirs in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    moved = [not torch.equal(p, q) for p, q in zip(ours_model.parameters(), _model().parameters())]
    assert all(moved)


def test_adamw_with_param_groups_and_a_changing_lr_as_the_training_loop_uses_it():
    ours_model = _model()
    theirs_model = copy.deepcopy(ours_model)
    lrs = [0.01, 0.02, 0.03, 0.02, 0.005]
    _run(ours_model, AdamW(_groups(ours_model, 0.1), lr=0.0, betas=(0.9, 0.95)), 5, lrs=lrs)
    _run(theirs_model, torch.optim.AdamW(_groups(theirs_model, 0.1), lr=0.0, betas=(0.9, 0.95)),
         5, lrs=lrs)
    for ours, theirs in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_adamw_bias_correction_and_decay_on_one_number():
    # step 1 by hand: m_hat = g, v_hat = g**2, so w moves by lr * sign(g), after decay
    w = nn.Parameter(torch.tensor([2.0], dtype=torch.float64))
    optimizer = AdamW([w], lr=0.1, weight_decay=0.5, eps=0.0)
    w.grad = torch.tensor([-3.0], dtype=torch.float64)
    optimizer.step()
    assert w.item() == pytest.approx(2.0 * (1 - 0.1 * 0.5) + 0.1)


def test_adamw_state_dict_loads_into_pytorch_and_back():
    ours_model = _model()
    theirs_model = copy.deepcopy(ours_model)
    theirs = torch.optim.AdamW(theirs_model.parameters(), lr=0.03)
    _run(theirs_model, theirs, 3)
    ours_model.load_state_dict(theirs_model.state_dict())
    ours = AdamW(ours_model.parameters(), lr=0.03)
    ours.load_state_dict(copy.deepcopy(theirs.state_dict()))  # not shared
    _run(ours_model, ours, 3, first_seed=3)
    _run(theirs_model, theirs, 3, first_seed=3)
    for a, b in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    back = torch.optim.AdamW(theirs_model.parameters(), lr=0.03)
    back.load_state_dict(ours.state_dict())
    assert back.state_dict()["state"][0]["step"].item() == 6


def test_adamw_skips_parameters_without_gradient_and_returns_the_closure_loss():
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    optimizer = AdamW([a, b], lr=0.1)
    a.grad = torch.ones(2)
    assert optimizer.step(lambda: 1.5) == 1.5
    assert torch.equal(b, torch.ones(2)) and not torch.equal(a, torch.ones(2))


@pytest.mark.parametrize("options, error, words", [
    ({"lr": -1.0}, ValueError, "lr"),
    ({"lr": float("nan")}, ValueError, "lr"),
    ({"lr": "0.1"}, TypeError, "lr"),
    ({"betas": 0.9}, TypeError, "betas"),
    ({"betas": (0.9, 1.0)}, ValueError, "betas[1]"),
    ({"betas": (-0.1, 0.9)}, ValueError, "betas[0]"),
    ({"eps": -1e-8}, ValueError, "eps"),
    ({"weight_decay": -0.1}, ValueError, "weight_decay"),
])
def test_adamw_bad_arguments_are_refused_by_name(options, error, words):
    with pytest.raises(error) as raised:
        AdamW([nn.Parameter(torch.ones(2))], **options)
    assert words in str(raised.value)


def test_adamw_empty_parameter_list_is_refused():
    with pytest.raises(ValueError, match="empty parameter list"):
        AdamW([])


def test_adamw_refuses_a_nan_gradient_before_it_reaches_the_weights():
    w = nn.Parameter(torch.ones(3))
    w.grad = torch.tensor([1.0, float("nan"), 0.0])
    with pytest.raises(ValueError, match="NaN or infinity"):
        AdamW([w]).step()
    assert torch.equal(w, torch.ones(3))


def _grads_model(scale):
    model = _model()
    (_loss(model, 0) * scale).backward()
    return model


@pytest.mark.parametrize("scale, max_norm", [(1.0, 1e3), (1e3, 1.0), (1.0, 0.01)])
def test_clip_grad_norm_equals_pytorch(scale, max_norm):
    ours, theirs = _grads_model(scale), _grads_model(scale)
    norm = clip_grad_norm(ours.parameters(), max_norm)
    reference = nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    torch.testing.assert_close(norm, reference)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours.parameters()]))
    assert clipped.item() <= max_norm * (1 + 1e-6) or norm.item() <= max_norm


def test_clip_grad_norm_on_a_gpt_in_float32_and_one_tensor():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=13, context_length=8, num_layers=2, num_heads=2, d_model=16)
    ours, theirs = GPT(config), GPT(config)
    theirs.load_state_dict(ours.state_dict())
    idx = torch.randint(13, (4, 8))
    for model in (ours, theirs):
        model(idx, idx)[1].backward()
    torch.testing.assert_close(clip_grad_norm(ours.parameters(), 0.1),
                               nn.utils.clip_grad_norm_(theirs.parameters(), 0.1))
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    w = nn.Parameter(torch.ones(4))
    w.grad = torch.full((4,), 3.0)
    assert clip_grad_norm(w, 1.0).item() == pytest.approx(6.0)
    assert w.grad.norm().item() == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_without_gradients_is_zero_as_in_pytorch():
    params = [nn.Parameter(torch.ones(2))]
    assert clip_grad_norm(params, 1.0).item() == 0.0
    assert nn.utils.clip_grad_norm_(params, 1.0).item() == 0.0


@pytest.mark.parametrize("args, error, words", [
    ((lambda: [nn.Parameter(torch.ones(2))], 0.0), ValueError, "max_norm"),
    ((lambda: [nn.Parameter(torch.ones(2))], float("inf")), ValueError, "max_norm"),
    ((lambda: [nn.Parameter(torch.ones(2))], "1"), TypeError, "max_norm"),
    ((lambda: 3, 1.0), TypeError, "parameters"),
    ((lambda: [1.0], 1.0), TypeError, "parameters must hold tensors"),
])
def test_clip_grad_norm_bad_arguments_are_refused_by_name(args, error, words):
    make, max_norm = args
    with pytest.raises(error) as raised:
        clip_grad_norm(make(), max_norm)
    assert words in str(raised.value)


def test_clip_grad_norm_refuses_a_nonfinite_norm_and_leaves_the_gradients():
    w = nn.Parameter(torch.ones(2))
    w.grad = torch.tensor([float("inf"), 1.0])
    with pytest.raises(ValueError, match="global norm is inf"):
        clip_grad_norm([w], 1.0)
    assert w.grad[1].item() == 1.0


def test_nothing_is_created_on_the_default_device():
    w = nn.Parameter(torch.ones(2, device="cpu"))
    w.grad = torch.ones(2, device="cpu")
    bare = nn.Parameter(torch.ones(1, device="cpu"))
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        optimizer = AdamW([w])
        optimizer.step()
        no_gradient_norm = clip_grad_norm([bare], 1.0)
        norm = clip_grad_norm([w], 1.0)
    finally:
        torch.set_default_device(previous)
    assert optimizer.state[w]["step"].device.type == "cpu"
    assert no_gradient_norm.device.type == "cpu" and norm.device.type == "cpu"
    assert w.device.type == "cpu" and torch.isfinite(w).all()
