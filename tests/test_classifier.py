"""The sentence classifier of chapter 10 (classifier.py): what the head reads, padding, shapes,
errors, and where its tensors are created."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import minitransformer as mt
from minitransformer.classifier import EncoderClassifier, EncoderConfig
from minitransformer.training import train
from helpers import one_thread  # noqa: F401 (a fixture)

PAD = 0


def config(**overrides) -> EncoderConfig:
    sizes = {"vocab_size": 13, "context_length": 8, "num_layers": 2, "num_heads": 2,
             "d_model": 16}
    return EncoderConfig(**{**sizes, **overrides})


def model(pooling: str = "cls", seed: int = 0, **overrides) -> EncoderClassifier:
    torch.manual_seed(seed)
    return EncoderClassifier(config(**overrides), 3, pooling=pooling).eval()


def ids() -> torch.Tensor:
    """Three sentences of 6, 4 and 2 tokens, padded on the right."""
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(1, 13, (3, 6), generator=g)
    idx[1, 4:] = PAD
    idx[2, 2:] = PAD
    return idx


def replace_final_vectors(classifier: EncoderClassifier, change) -> None:
    """Make the last block's output pass through ``change(x)`` before the final norm and the
    head: the way to alter what the head could read, position by position."""
    last = classifier.layers[-1]
    encode = last.encode

    def changed(x, **kwargs):
        return change(encode(x, **kwargs))

    last.encode = changed


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_shapes(pooling):
    m = model(pooling)
    logits, loss = m(ids())
    assert logits.shape == (3, 3) and loss is None
    width = 7 if pooling == "cls" else 6          # the [CLS] token comes in front
    assert m.encode(ids()).shape == (3, width, 16)
    logits, loss = m(ids(), torch.tensor([0, 2, 1]))
    assert loss.shape == () and torch.isfinite(loss)


def test_the_head_reads_the_cls_position_and_nothing_else():
    m = model("cls")
    with torch.no_grad():
        before = m(ids())[0]

        def other_positions(x):
            x = x.clone()
            x[:, 1:] = torch.randn_like(x[:, 1:]) * 10   # every position but [CLS]
            return x

        replace_final_vectors(m, other_positions)
        assert torch.equal(m(ids())[0], before)

        def cls_position(x):
            x = x.clone()
            x[:, 0] = torch.randn_like(x[:, 0]) * 10
            return x

        m = model("cls")                                 # a fresh copy of the same model
        replace_final_vectors(m, cls_position)
        after = m(ids())[0]
    assert (after - before).abs().min() > 1e-4, "every sentence's scores must follow [CLS]"


def test_the_cls_head_reads_the_learned_token_put_in_front():
    m = model("cls")
    with torch.no_grad():
        first = m.encode(ids())[:, 0]
        m.cls_token.add_(1.0)
        assert not torch.allclose(m.encode(ids())[:, 0], first)
    assert m.cls_token.shape == (16,)
    assert model("mean").cls_token is None


def test_mean_pooling_is_the_mean_of_the_real_tokens():
    m = model("mean")
    idx = ids()
    with torch.no_grad():
        vectors = m.encode(idx)                                     # (B, T, d_model)
        lengths = (idx != PAD).sum(1).tolist()
        means = torch.stack([v[:n].mean(0) for v, n in zip(vectors, lengths)])
        torch.testing.assert_close(m(idx)[0], m.head(means))


def test_mean_pooling_ignores_what_stands_at_padded_positions():
    m = model("mean")
    idx = ids()
    with torch.no_grad():
        before = m(idx)[0]

        def padded_positions(x):
            x = x.clone()
            x[idx == PAD] = 1e3                                     # only padded positions
            return x

        replace_final_vectors(m, padded_positions)
        torch.testing.assert_close(m(idx)[0], before, rtol=0, atol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_more_padding_changes_nothing(pooling):
    m = model(pooling)
    idx = ids()
    longer = torch.cat([idx, torch.zeros(3, 2, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(m(longer)[0], m(idx)[0], rtol=0, atol=1e-6)


def test_each_sentence_is_classified_on_its_own():
    m = model("cls")
    idx = ids()
    with torch.no_grad():
        together = m(idx)[0]
        alone = torch.cat([m(idx[i:i + 1, :n])[0]
                           for i, n in enumerate((idx != PAD).sum(1).tolist())])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)


def test_both_poolings_start_from_the_same_weights_under_one_seed():
    cls_model, mean_model = model("cls"), model("mean")
    cls_params = dict(cls_model.named_parameters())
    for name, p in mean_model.named_parameters():
        assert torch.equal(p, cls_params[name]), name
    assert set(cls_params) - set(dict(mean_model.named_parameters())) == {"cls_token"}


def test_the_loss_is_the_cross_entropy_and_training_learns():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 13, (64, 6), generator=g)
    y = (x == 5).any(1).long()                       # does the sentence hold token 5?
    m = EncoderClassifier(config(), 2, pooling="cls")
    logits, loss = m(x, y)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, y))
    train(m, [(x, y)], steps=40, lr=3e-3, progress=False)
    m.eval()
    with torch.no_grad():
        assert (m(x)[0].argmax(-1) == y).float().mean() > 0.9


def test_errors():
    with pytest.raises(TypeError, match="config must be an EncoderConfig"):
        EncoderClassifier(mt.GPTConfig(13, 8, 1, 2, 16), 2)
    with pytest.raises(TypeError, match="num_classes must be an int"):
        EncoderClassifier(config(), 2.0)
    with pytest.raises(ValueError, match="num_classes must be at least 2"):
        EncoderClassifier(config(), 1)
    with pytest.raises(ValueError, match="pooling must be one of"):
        EncoderClassifier(config(), 2, pooling="max")
    with pytest.raises(TypeError, match="pooling must be one of"):
        EncoderClassifier(config(), 2, pooling=None)
    with pytest.raises(ValueError, match="pad_id=13 must be a token"):
        config(pad_id=13)
    with pytest.raises(ValueError, match="divisible"):
        config(num_heads=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config().d_model = 8
    assert config().d_ff == 64
    m = model("cls")
    with pytest.raises(TypeError, match="idx must be an integer tensor"):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="more than context_length=8"):
        m(torch.ones(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 13, outside"):
        m(torch.full((1, 3), 13))
    with pytest.raises(ValueError, match="idx row 1 is all padding"):
        m(torch.tensor([[3, 4], [0, 0]]))
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        m(ids(), torch.zeros(3))
    with pytest.raises(ValueError, match=r"labels must have shape \(B,\) = \(3,\)"):
        m(ids(), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="labels holds class 3, outside"):
        m(ids(), torch.tensor([0, 1, 3]))
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        EncoderClassifier(config(), 2, dtype=torch.long)


def test_device_and_dtype_keywords():
    m = EncoderClassifier(config(), 2, pooling="cls", device="cpu", dtype=torch.float64)
    assert {p.dtype for p in m.parameters()} == {torch.float64}
    assert {p.device.type for p in m.parameters()} == {"cpu"}
    assert m(ids())[0].dtype == torch.float64


def test_the_package_exports_it():
    assert mt.EncoderClassifier is EncoderClassifier
    assert "EncoderClassifier" in mt.__all__


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_nothing_lands_on_the_default_device(pooling):
    """As tests/test_meta_device.py checks every public name: with the default device set to
    "meta", a model made with device="cpu" and run on CPU ids has every tensor on the CPU."""
    idx, labels = ids(), torch.tensor([0, 1, 1])
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        assert torch.empty(1).device.type == "meta"              # the trap is set
        m = EncoderClassifier(config(), 2, pooling=pooling, device="cpu")
        logits, loss = m(idx, labels)
        tensors = [*m.parameters(), *m.buffers(), logits, loss, m.encode(idx)]
    finally:
        torch.set_default_device(previous)
    assert all(t.device.type == "cpu" for t in tensors)
