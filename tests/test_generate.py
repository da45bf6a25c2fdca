"""sample_next (minitransformer.generation): greedy, temperature and top-k choice, chapter 5."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer import sample_next

FRANCE = torch.tensor([12.3, 4.8, 3.1, -2.0])  # Paris, London, city, banana


def test_temperature_zero_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 4.0, 4.5]])
    got = sample_next(logits, temperature=0)
    assert got.dtype == torch.long and got.tolist() == [1, 0]
    assert sample_next(FRANCE, temperature=0).item() == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=2), st.integers(1, 30),
       st.integers(0, 2**31 - 1))
def test_greedy_equals_argmax_for_any_batch_shape(batch, vocab, seed):
    logits = torch.randn(*batch, vocab, generator=torch.Generator().manual_seed(seed))
    got = sample_next(logits, temperature=0.0)
    assert got.shape == tuple(batch)
    assert torch.equal(got, logits.argmax(dim=-1))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 30), st.integers(0, 2**31 - 1), st.data())
def test_top_k_never_returns_a_word_outside_the_top_k(vocab, seed, data):
    k = data.draw(st.integers(1, vocab))
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, vocab, generator=generator)
    ids = sample_next(logits, temperature=10.0, top_k=k, generator=generator)
    allowed = logits.topk(k, dim=-1).indices
    assert (ids[:, None] == allowed).any(dim=-1).all()


def test_top_k_1_is_greedy():
    logits = torch.randn(50, 7, generator=torch.Generator().manual_seed(3))
    ids = sample_next(logits, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, logits.argmax(dim=-1))


def test_same_seed_same_samples_different_seed_different_samples():
    logits = torch.zeros(200, 10)
    first = sample_next(logits, generator=torch.Generator().manual_seed(7))
    again = sample_next(logits, generator=torch.Generator().manual_seed(7))
    other = sample_next(logits, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_samples_follow_the_softmax_probabilities():
    generator = torch.Generator().manual_seed(0)
    ids = sample_next(FRANCE.expand(20000, 4), temperature=5.0, generator=generator)
    freq = torch.bincount(ids, minlength=4).float() / ids.numel()
    expected = torch.softmax(FRANCE / 5.0, dim=-1)
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)


def test_low_temperature_sharpens_high_temperature_flattens():
    generator = torch.Generator().manual_seed(1)
    cold = sample_next(FRANCE.expand(2000, 4), temperature=0.5, generator=generator)
    hot = sample_next(FRANCE.expand(2000, 4), temperature=50.0, generator=generator)
    assert (cold == 0).all()
    assert len(set(hot.tolist())) == 4


def test_minus_infinity_scores_are_never_chosen():
    logits = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")]).expand(500, 4)
    ids = sample_next(logits, generator=torch.Generator().manual_seed(0))
    assert set(ids.tolist()) == {0, 2}


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-0.5), ValueError, "temperature must be at least 0.0, got -0.5"),
    (dict(temperature=float("nan")), ValueError, "temperature must be finite, got nan"),
    (dict(temperature=float("inf")), ValueError, "temperature must be finite, got inf"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_k=0), ValueError, "top_k must be at least 1, got 0"),
    (dict(top_k=5), ValueError, "top_k must be at most the vocabulary size 4, got 5"),
    (dict(top_k=2.0), TypeError, r"top_k must be an int, got float \(2.0\)"),
])
def test_bad_arguments_name_themselves_as_in_generate(kwargs, error, message):
    with pytest.raises(error, match=message):
        sample_next(FRANCE, **kwargs)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bad_scores_are_value_errors(temperature):
    with pytest.raises(ValueError, match="NaN"):
        sample_next(torch.tensor([0.0, float("nan")]), temperature=temperature)
    with pytest.raises(ValueError, match="all -inf"):
        sample_next(torch.full((2, 3), float("-inf")), temperature=temperature)


def test_non_float_logits_are_type_errors():
    with pytest.raises(TypeError, match=r"logits must be a floating-point tensor, got a tensor "
                                        r"of dtype torch.int64"):
        sample_next(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"at least 1 dimensions, got shape \(\)"):
        sample_next(torch.tensor(1.0))
    with pytest.raises(TypeError, match="got list"):
        sample_next([1.0, 2.0])


def test_a_tiny_temperature_is_nearly_greedy_not_an_overflow():
    logits = torch.tensor([[1.0, 3.0, 2.0], [50.0, -10.0, 49.0]])
    ids = sample_next(logits, temperature=1e-37, generator=torch.Generator().manual_seed(0))
    assert ids.tolist() == [1, 0]


def test_stays_on_the_logits_device_and_accepts_float64(device):
    logits = FRANCE.double().to(device)
    ids = sample_next(logits, top_k=2, generator=torch.Generator(device).manual_seed(0))
    assert ids.dtype == torch.long and ids.device == logits.device and ids.item() in (0, 1)


# --- generate (chapter 9) -------------------------------------------------------------------

from minitransformer.generation import generate  # noqa: E402
from minitransformer.gpt import GPT, GPTConfig  # noqa: E402


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=9, context_length=12, num_layers=1, num_heads=2,
                         d_model=16))


def test_generate_appends_tokens_to_the_prompt(gpt):
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = generate(gpt, prompt, 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 8) and out.dtype == torch.long
    assert torch.equal(out[:, :3], prompt)
    assert ((0 <= out) & (out < 9)).all()


def test_temperature_zero_is_greedy(gpt, device):
    gpt = copy.deepcopy(gpt).to(device)
    out = generate(gpt, torch.tensor([[1, 2]], device=device), 6, temperature=0)
    idx = torch.tensor([[1, 2]], device=device)
    for _ in range(6):  # the greedy loop written out
        logits, _ = gpt(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, idx)


def test_generate_repeats_with_a_seed_and_keeps_to_top_k(gpt, device):
    gpt = copy.deepcopy(gpt).to(device)
    prompt = torch.tensor([[3, 1]], device=device).expand(50, 2)
    first = generate(gpt, prompt, 4, temperature=2.0,
                     generator=torch.Generator(device).manual_seed(1))
    again = generate(gpt, prompt, 4, temperature=2.0,
                     generator=torch.Generator(device).manual_seed(1))
    assert torch.equal(first, again)
    greedy = generate(gpt, prompt, 4, top_k=1, generator=torch.Generator(device).manual_seed(2))
    assert torch.equal(greedy, generate(gpt, prompt, 4, temperature=0))


def test_generate_restores_training_mode(gpt):
    gpt.train()
    generate(gpt, torch.tensor([[1]]), 2)
    assert gpt.training
    gpt.eval()


def test_generated_tokens_can_be_trained_on(gpt):
    # generate runs under inference_mode; a tensor made there cannot be saved for backward
    # (an embedding lookup saves its ids), so generate must hand back an ordinary tensor
    for use_cache in (True, False):
        out = generate(gpt, torch.tensor([[1, 2]]), 4, use_cache=use_cache)
        assert not out.is_inference()
        gpt.train()
        _, loss = gpt(out[:, :-1], out[:, 1:])
        loss.backward()
        gpt.zero_grad()
        gpt.eval()


def test_too_many_tokens_for_the_context_is_a_value_error(gpt):
    assert generate(gpt, torch.tensor([[1, 2]]), 10).shape == (1, 12)
    with pytest.raises(ValueError, match="2 tokens plus max_new_tokens=11 make 13, more than "
                                         "context_length=12"):
        generate(gpt, torch.tensor([[1, 2]]), 11)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-1.0), ValueError, "temperature must be at least 0"),
    (dict(top_k=0), ValueError, "top_k must be at least 1"),
    (dict(top_k=10), ValueError, "top_k must be at most the vocabulary size 9"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be at least 0"),
    (dict(idx=torch.tensor([[1, 9]])), ValueError, "token id 9"),
    (dict(idx=torch.tensor([1, 2])), ValueError, r"shape \(B, T\)"),
    (dict(use_cache="yes"), TypeError, "use_cache must be True or False, got str"),
    (dict(use_cache=None), TypeError, "use_cache must be True or False, got None"),
])
def test_generate_names_bad_arguments(gpt, kwargs, error, message):
    args = dict(idx=torch.tensor([[1, 2]]), max_new_tokens=2) | kwargs
    with pytest.raises(error, match=message):
        generate(gpt, args.pop("idx"), args.pop("max_new_tokens"), **args)
