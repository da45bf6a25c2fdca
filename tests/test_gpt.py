"""The small GPT (minitransformer.gpt, chapter 9): shapes, causality, initial loss, errors."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from minitransformer.gpt import GPT, GPTConfig, count_parameters
from minitransformer.masks import causal_mask


def small_config(**changes):
    sizes = dict(vocab_size=11, context_length=16, num_layers=2, num_heads=2, d_model=16)
    return GPTConfig(**{**sizes, **changes})


@pytest.fixture(params=["learned", "sinusoidal"])
def model(request):
    torch.manual_seed(0)
    return GPT(small_config(positional=request.param)).eval()


def test_logits_have_one_score_per_token_and_position(model):
    idx = torch.randint(11, (3, 7))
    logits, loss = model(idx)
    assert logits.shape == (3, 7, 11) and loss is None


def test_changing_later_tokens_leaves_earlier_logits_unchanged(model, device):
    model.to(device)
    generator = torch.Generator().manual_seed(1)
    idx = torch.randint(11, (2, 16), generator=generator).to(device)
    for t in range(15):
        changed = idx.clone()
        changed[:, t + 1:] = torch.randint(11, (2, 15 - t), generator=generator).to(device)
        before, _ = model(idx)
        after, _ = model(changed)
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


def test_positions_matter(model):
    """The same tokens in another order give other logits at the last position (no bag of
    words), for both kinds of positions."""
    idx = torch.tensor([[1, 2, 3, 4]])
    swapped = torch.tensor([[2, 1, 3, 4]])
    assert not torch.allclose(model(idx)[0][:, -1], model(swapped)[0][:, -1])


def test_loss_is_the_cross_entropy_of_the_logits(model, device):
    model.to(device)
    idx, targets = torch.randint(11, (2, 2, 9)).to(device)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 11), targets.flatten()))


def test_config_is_frozen_and_replace_checks_again():
    config = GPTConfig(vocab_size=47, context_length=32, num_layers=2, num_heads=4, d_model=64)
    assert config.d_ff == 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_heads = 3                       # would no longer divide d_model, unchecked
    with pytest.raises(ValueError, match="divisible"):
        dataclasses.replace(config, num_heads=3)
    assert dataclasses.replace(config, dropout=0.1).dropout == 0.1


def test_initial_loss_is_about_ln_vocab_size():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=47, context_length=32, num_layers=2, num_heads=4, d_model=64)
    idx, targets = torch.randint(47, (2, 16, 32))
    for positional in ("learned", "sinusoidal"):
        _, loss = GPT(dataclasses.replace(config, positional=positional))(idx, targets)
        assert abs(loss.item() - math.log(47)) < 0.5, positional


def test_pytorch_default_embedding_init_starts_far_above_ln_vocab_size():
    """What the chapter shows: N(0, 1) embeddings and a tied head predict the current token
    with great confidence, so the first loss is far above ln V."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=47, context_length=32, num_layers=2, num_heads=4, d_model=64)
    model = GPT(config)
    torch.nn.init.normal_(model.token_embedding.weight)
    idx, targets = torch.randint(47, (2, 16, 32))
    assert model(idx, targets)[1].item() > 10 * math.log(47)


def test_weights_start_as_gpt2s():
    torch.manual_seed(0)
    model = GPT(small_config(d_model=64, vocab_size=500))
    assert abs(model.token_embedding.weight.std().item() - 0.02) < 0.002
    assert abs(model.layers[0].feed_forward.linear1.weight.std().item() - 0.02) < 0.002
    assert model.layers[0].self_attn.q_proj.bias.abs().max() == 0
    assert torch.equal(model.norm.weight, torch.ones(64))


def test_head_is_tied_to_the_token_embedding():
    model = GPT(small_config())
    assert model.head.weight is model.token_embedding.weight
    with torch.no_grad():
        model.token_embedding.weight[3] += 1.0
    assert torch.equal(model.head.weight[3], model.token_embedding.weight[3])


def test_parameter_count_from_the_config():
    c = small_config(vocab_size=13, d_model=24, num_heads=3, d_ff=40, num_layers=3)
    d, f = c.d_model, c.d_ff
    block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    expected = c.vocab_size * d + c.context_length * d + c.num_layers * block + 2 * d
    assert count_parameters(GPT(c)) == expected
    sinusoidal = small_config(vocab_size=13, d_model=24, num_heads=3, d_ff=40, num_layers=3,
                              positional="sinusoidal")
    assert count_parameters(GPT(sinusoidal)) == expected - c.context_length * d


def test_attention_weights_are_computed_without_dropout_and_keep_the_mode():
    torch.manual_seed(0)
    model = GPT(small_config(dropout=0.5)).train()
    idx = torch.randint(11, (2, 6))
    first, again = model.attention_weights(idx), model.attention_weights(idx)
    assert model.training                              # the mode is restored
    for a, b in zip(first, again):                     # no dropout: the same weights twice,
        torch.testing.assert_close(a, b)               # rows of probabilities
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 6))


@pytest.mark.parametrize("norm_first", [True, False])
def test_attention_weights_are_each_blocks_own_even_when_blocks_change(norm_first):
    torch.manual_seed(0)
    model = GPT(small_config()).eval()
    for layer in model.layers:
        layer.norm_first = norm_first            # post-norm: attention reads x, not norm1(x)
        torch.nn.init.normal_(layer.norm1.weight)
    idx = torch.randint(11, (2, 6))
    mask = causal_mask(6)
    with torch.no_grad():
        x = model.embed(idx)
        for layer, got in zip(model.layers, model.attention_weights(idx)):
            h = layer.norm1(x) if norm_first else x
            expected = layer.self_attn(h, attn_mask=mask, return_weights=True)[1]
            torch.testing.assert_close(got, expected)
            x = layer(x, attn_mask=mask)


def test_attention_weights_restore_the_mode_after_an_error():
    model = GPT(small_config(dropout=0.1)).train()
    model.embed = lambda idx: 1 / 0                # an error after eval()
    with pytest.raises(ZeroDivisionError):
        model.attention_weights(torch.randint(11, (1, 4)))
    assert model.training


def test_d_ff_defaults_to_four_times_d_model():
    assert small_config().d_ff == 64
    assert small_config(d_ff=20).d_ff == 20


def test_attention_weights_are_causal_rows_of_probabilities(model, device):
    model.to(device)
    idx = torch.randint(11, (2, 6)).to(device)
    weights = model.attention_weights(idx)
    assert len(weights) == 2 and weights[0].shape == (2, 2, 6, 6)
    for w in weights:
        assert w.device.type == device.type
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 6, device=device))
        assert (w.triu(diagonal=1) == 0).all()


def test_float64_and_meta_device():
    model = GPT(small_config(), dtype=torch.float64)
    logits, _ = model(torch.randint(11, (1, 5)))
    assert logits.dtype == torch.float64
    meta = GPT(small_config(), device="meta")
    assert meta.head.weight.device.type == "meta"


def test_sequence_longer_than_the_context_is_a_value_error(model):
    with pytest.raises(ValueError, match="17 positions, more than context_length=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_token_out_of_range_is_a_value_error(model):
    with pytest.raises(ValueError, match=r"token id 11, outside the vocabulary \[0, 11\)"):
        model(torch.tensor([[1, 11]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="targets holds token id 12"):
        model(torch.tensor([[1, 2]]), torch.tensor([[1, 12]]))


def test_bad_inputs_are_named(model):
    with pytest.raises(TypeError, match="idx must be an integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"idx must have shape \(B, T\)"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(1, 3\)"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))


def test_bad_configs_are_rejected():
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads"):
        small_config(d_model=10, num_heads=4)
    with pytest.raises(ValueError, match="context_length must be at least 1"):
        small_config(context_length=0)
    with pytest.raises(TypeError, match="num_layers must be an int"):
        small_config(num_layers=2.0)
    with pytest.raises(ValueError, match="positional must be one of"):
        small_config(positional="rotary")
    with pytest.raises(ValueError, match="even d_model"):
        small_config(d_model=9, num_heads=3, positional="sinusoidal")
    with pytest.raises(ValueError, match="dropout"):
        small_config(dropout=1.0)
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        GPT(dict(vocab_size=11))
