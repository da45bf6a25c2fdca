"""functional.cross_entropy, chapter 9's loss from its equation, against F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minitransformer.functional import cross_entropy


def _reference(logits, targets, **options):
    n = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, n), targets.reshape(-1).long(), **options)


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(11, (3, 6), generator=gen)
    targets[0, :4] = -100                                   # some positions left out
    targets[2, 5] = -100
    return logits, targets


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.5, 1.0])
def test_equals_pytorch_with_ignore_index_and_label_smoothing(batch, label_smoothing):
    logits, targets = batch
    ours = cross_entropy(logits, targets, label_smoothing=label_smoothing)
    torch.testing.assert_close(ours, _reference(logits, targets,
                                                label_smoothing=label_smoothing))


def test_gradients_equal_pytorch(batch):
    logits, targets = batch
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    cross_entropy(a, targets, label_smoothing=0.2).backward()
    _reference(b, targets, label_smoothing=0.2).backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_another_ignore_index_and_int32_targets(batch):
    logits, targets = batch
    targets = torch.where(targets == -100, 7, targets).to(torch.int32)
    torch.testing.assert_close(cross_entropy(logits, targets, ignore_index=7),
                               _reference(logits, targets, ignore_index=7))


def test_two_dimensional_logits_as_pytorch_takes_them():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    targets = torch.tensor([0, 2])
    torch.testing.assert_close(cross_entropy(logits, targets), F.cross_entropy(logits, targets))


@pytest.mark.parametrize("scale", [1e3, 1e6, 1e30])
def test_large_logits_do_not_overflow(batch, scale):
    logits, targets = batch
    big = logits.float() * scale
    ours = cross_entropy(big, targets, label_smoothing=0.1)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, _reference(big, targets, label_smoothing=0.1))
    naive = -torch.log(torch.exp(big) / torch.exp(big).sum(-1, keepdim=True))
    assert not torch.isfinite(naive).all()                  # what the log-sum-exp avoids


def test_a_masked_score_of_minus_infinity_is_probability_zero():
    logits = torch.tensor([[0.0, float("-inf"), 1.0]])
    targets = torch.tensor([2])
    torch.testing.assert_close(cross_entropy(logits, targets), F.cross_entropy(logits, targets))


@pytest.mark.parametrize("call, error, words", [
    (lambda z, t: cross_entropy(z.long(), t), TypeError, "floating-point"),
    (lambda z, t: cross_entropy(z, t.float()), TypeError, "integer"),
    (lambda z, t: cross_entropy(z, t.to(torch.uint8)), TypeError, "int64 or int32"),
    (lambda z, t: cross_entropy(z, t[:, :5]), ValueError, "shape"),
    (lambda z, t: cross_entropy(z, t + 11), ValueError, "outside [0, 11)"),
    (lambda z, t: cross_entropy(z, torch.full_like(t, -100)), ValueError, "every target"),
    (lambda z, t: cross_entropy(z, t, label_smoothing=1.5), ValueError, "[0, 1]"),
    (lambda z, t: cross_entropy(z, t, label_smoothing=-0.1), ValueError, "at least 0"),
    (lambda z, t: cross_entropy(z, t, label_smoothing=float("nan")), ValueError, "finite"),
    (lambda z, t: cross_entropy(z, t, ignore_index=1.5), TypeError, "ignore_index"),
    (lambda z, t: cross_entropy(z.index_fill(-1, torch.tensor([3]), float("nan")), t),
     ValueError, "NaN"),
    (lambda z, t: cross_entropy(torch.full_like(z, float("-inf")), t), ValueError, "all -inf"),
    (lambda z, t: cross_entropy(z[..., :0], t), ValueError, "no token"),
])
def test_bad_input_is_refused_by_name(batch, call, error, words):
    logits, targets = batch
    with pytest.raises(error, match=None) as raised:
        call(logits, targets)
    assert words in str(raised.value)
