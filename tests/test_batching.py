"""Batched generation (chapter 18): prompts of different lengths, left-padded with an attention
mask and position ids, give each prompt the logits (within float32 rounding) and the tokens
(greedy, and sampled with a per-prompt seed) it gets alone, for GPT and Llama."""

from __future__ import annotations

import pytest
import torch

from minitransformer import (GPT, GPTConfig, KVCache, Llama, LlamaConfig, generate,
                             generate_batch, left_pad)

VOCAB = 53


def gpt(positional="learned"):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, context_length=48, num_layers=2, num_heads=2,
                         d_model=32, positional=positional)).eval()


def llama():
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=VOCAB, context_length=48, num_layers=2, num_heads=4,
                             num_kv_heads=2, d_model=32)).eval()


MODELS = {"gpt": gpt, "gpt-sinusoidal": lambda: gpt("sinusoidal"), "llama": llama}


def prompts(lengths=(5, 1, 9, 3), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def alone(model, prompt, n, **options):
    out = generate(model, torch.tensor([prompt]), n, **options)
    return out[0, len(prompt):].tolist()


# --- left padding --------------------------------------------------------------------------------

def test_left_pad_puts_the_padding_first_and_counts_positions_from_the_first_token():
    idx, mask, positions = left_pad([[7, 8, 9], [4]], pad_id=0)
    assert idx.tolist() == [[7, 8, 9], [0, 0, 4]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert idx.dtype == positions.dtype == torch.long and mask.dtype == torch.bool


def test_left_pad_refuses_bad_prompts():
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        left_pad([[1], []], pad_id=0)
    with pytest.raises(ValueError, match="prompts is empty"):
        left_pad([], pad_id=0)
    with pytest.raises(TypeError, match=r"prompts\[0\]\[1\]"):
        left_pad([[1, 2.0]], pad_id=0)
    with pytest.raises(ValueError, match="pad_id"):
        left_pad([[1]], pad_id=-1)


# --- one forward pass ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_a_padded_batch_gives_each_prompt_its_logits_alone(name):
    model = MODELS[name]()
    batch = prompts()
    idx, mask, positions = left_pad(batch, pad_id=3)
    logits, _ = model(idx, attention_mask=mask, position_ids=positions)
    derived, _ = model(idx, attention_mask=mask)        # positions counted from the mask
    assert torch.equal(logits, derived)
    for row, prompt in enumerate(batch):
        single, _ = model(torch.tensor([prompt]))
        got = logits[row, idx.shape[1] - len(prompt):]
        assert (got - single[0]).abs().max() <= 1e-5
        assert torch.equal(got.argmax(-1), single[0].argmax(-1))


@pytest.mark.parametrize("name", MODELS)
def test_padding_without_the_mask_or_the_positions_changes_the_logits(name):
    """The test above can fail: without the mask the pads are read; with positions counted
    from the pad, a model with a position table adds other rows of it."""
    model = MODELS[name]()
    batch = prompts((6, 2))
    idx, mask, positions = left_pad(batch, pad_id=3)
    single, _ = model(torch.tensor([batch[1]]))
    unmasked, _ = model(idx, position_ids=positions)
    assert (unmasked[1, -2:] - single[0]).abs().max() > 1e-3
    from_pad = torch.arange(6).expand(2, 6)
    shifted, _ = model(idx, attention_mask=mask, position_ids=from_pad)
    gap = (shifted[1, -2:] - single[0]).abs().max()
    if name == "llama":     # rotary positions enter only as differences: a shift changes nothing
        assert gap <= 1e-5
    else:
        assert gap > 1e-3


@pytest.mark.parametrize("name", MODELS)
def test_decode_step_with_a_padded_cache_is_forward_bit_for_bit(name):
    model = MODELS[name]()
    idx, mask, positions = left_pad(prompts(), pad_id=0)
    step = model.make_decode_step()
    caches = KVCache(2), KVCache(2)
    fast = step(idx, caches[0], attention_mask=mask, position_ids=positions)
    slow, _ = model(idx, kv_cache=caches[1], attention_mask=mask, position_ids=positions)
    assert torch.equal(fast, slow)
    new = torch.tensor([[1], [2], [3], [4]])
    mask = torch.cat([mask, torch.ones(4, 1, dtype=torch.bool)], dim=1)
    fast = step(new, caches[0], attention_mask=mask)
    slow, _ = model(new, kv_cache=caches[1], attention_mask=mask)
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_bad_masks_and_positions_are_refused(name):
    model = MODELS[name]()
    idx, mask, positions = left_pad(prompts((3, 2)), pad_id=0)
    with pytest.raises(TypeError, match="attention_mask must be a boolean"):
        model(idx, attention_mask=mask.long())
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, cached \+ T\)"):
        model(idx, attention_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="position_ids holds 48"):
        model(idx, position_ids=positions + 46)
    with pytest.raises(ValueError, match="position_ids holds -1"):
        model(idx, position_ids=positions - 1)
    with pytest.raises(ValueError, match="position_ids must have the shape"):
        model(idx, position_ids=positions[:1])
    with pytest.raises(TypeError, match="position_ids"):
        model(idx, position_ids=positions.float())


# --- generation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_batched_greedy_tokens_are_the_tokens_alone(name):
    model = MODELS[name]()
    batch = prompts((5, 1, 9, 3, 12, 2))
    out = generate_batch(model, batch, 20, temperature=0)
    assert out == [alone(model, p, 20, temperature=0) for p in batch]


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_batched_sampling_with_seeds_is_sampling_alone(name):
    model = MODELS[name]()
    batch = prompts((5, 1, 9, 3))
    seeds = [11, 12, 13, 14]
    options = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "presence_penalty": 0.5,
               "frequency_penalty": 0.3}
    out = generate_batch(model, batch, 15, seeds=seeds, **options)
    assert out == [alone(model, p, 15, generator=torch.Generator().manual_seed(s), **options)
                   for p, s in zip(batch, seeds)]


def test_each_row_stops_at_eos_as_alone():
    model = gpt()
    batch = prompts((5, 1, 9, 3, 7, 4, 2, 8), seed=4)
    expected = [alone(model, p, 25, temperature=0.8, eos_id=7,
                      generator=torch.Generator().manual_seed(i)) for i, p in enumerate(batch)]
    assert any(len(e) < 25 for e in expected)        # some row does stop early
    out = generate_batch(model, batch, 25, temperature=0.8, eos_id=7, seeds=list(range(8)))
    assert out == expected


def test_generate_batch_refuses_bad_arguments():
    model = gpt()
    with pytest.raises(ValueError, match="more than context_length"):
        generate_batch(model, [[1] * 40], 9)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate_batch(model, [[1, VOCAB]], 2)
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        generate_batch(model, [[1], [2]], 2, seeds=[1])
    with pytest.raises(TypeError, match="GPT or a Llama"):
        generate_batch(torch.nn.Linear(2, 2), [[1]], 2)
    with pytest.raises(ValueError, match="temperature"):
        generate_batch(model, [[1]], 2, temperature=-1.0)
    assert generate_batch(model, [[1], [2]], 0) == [[], []]
