"""The KV cache (chapter 11): the cache object itself, then the models that use it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from minitransformer.cache import KVCache


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32,
          device: torch.device | str = "cpu") -> torch.Tensor:
    """Drawn on the CPU, then moved: the same numbers on every device."""
    return torch.randn(*shape, dtype=dtype,
                       generator=torch.Generator().manual_seed(seed)).to(device)


# --- the cache object ---------------------------------------------------------------------------

@pytest.mark.parametrize("max_len", [None, 16])
def test_update_appends_and_returns_everything_held(max_len, device):
    cache = KVCache(2, max_len=max_len)
    k1, v1 = randn(2, 3, 4, 5, seed=1, device=device), randn(2, 3, 4, 5, seed=2, device=device)
    k2, v2 = randn(2, 3, 1, 5, seed=3, device=device), randn(2, 3, 1, 5, seed=4, device=device)
    keys, values = cache.update(0, k1, v1)
    assert torch.equal(keys, k1) and torch.equal(values, v1)
    assert cache.seq_len == 4
    keys, values = cache.update(0, k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert cache.seq_len == 5
    # layer 1 has its own slot, still empty
    keys, values = cache.update(1, k2, v2)
    assert torch.equal(keys, k2) and torch.equal(values, v2)
    assert cache.length(0) == 5 and cache.length(1) == 1 and cache.seq_len == 5


@pytest.mark.parametrize("max_len", [None, 8])
def test_the_cache_keeps_copies_not_the_callers_tensors(max_len):
    cache = KVCache(1, max_len=max_len)
    key, value = randn(1, 2, 3, 4), randn(1, 2, 3, 4)
    cache.update(0, key, value)
    key.zero_()
    value.zero_()
    assert cache.keys[0][:, :, :3].abs().sum() > 0 and cache.values[0][:, :, :3].abs().sum() > 0


def test_storage_is_allocated_on_the_first_update_with_max_len(device):
    cache = KVCache(3, max_len=10)
    assert cache.keys == [None] * 3 and cache.nbytes == 0
    key = randn(2, 4, 1, 8, dtype=torch.float64, device=device)
    cache.update(0, key, key)
    assert cache.keys[0].shape == (2, 4, 10, 8)
    assert cache.keys[0].dtype == torch.float64 and cache.keys[0].device == key.device
    # the held positions are views of the storage, not copies
    keys, _ = cache.update(0, key, key)
    assert keys.shape == (2, 4, 2, 8)
    assert keys.data_ptr() == cache.keys[0].data_ptr()


def test_writing_past_max_len_is_a_value_error_that_says_so():
    cache = KVCache(1, max_len=5)
    cache.update(0, randn(1, 1, 4, 2), randn(1, 1, 4, 2))
    with pytest.raises(ValueError, match=r"holds 4 positions of at most max_len=5; 2 more"):
        cache.update(0, randn(1, 1, 2, 2), randn(1, 1, 2, 2))
    assert cache.seq_len == 4                          # nothing was written
    cache.update(0, randn(1, 1, 1, 2), randn(1, 1, 1, 2))
    assert cache.seq_len == 5


def test_a_first_chunk_longer_than_max_len_is_refused():
    with pytest.raises(ValueError, match="max_len=3"):
        KVCache(1, max_len=3).update(0, randn(1, 1, 4, 2), randn(1, 1, 4, 2))


def test_reset_empties_the_cache():
    cache = KVCache(2, max_len=8)
    for layer in range(2):
        cache.update(layer, randn(1, 2, 3, 4), randn(1, 2, 3, 4))
    cache.reset()
    assert cache.seq_len == 0 and cache.nbytes == 0
    assert cache.keys == [None, None] and cache.values == [None, None]
    # a new batch size fits after a reset
    keys, _ = cache.update(0, randn(5, 2, 1, 4), randn(5, 2, 1, 4))
    assert keys.shape == (5, 2, 1, 4)


@pytest.mark.parametrize("max_len", [None, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_memory_equals_the_formula(max_len, dtype):
    layers, batch, heads, length, d_head = 3, 2, 4, 7, 8
    cache = KVCache(layers, max_len=max_len)
    for layer in range(layers):
        for step in range(length):
            new = randn(batch, heads, 1, d_head, seed=step).to(dtype)
            cache.update(layer, new, new)
    positions = length if max_len is None else max_len
    bytes_per_number = torch.finfo(dtype).bits // 8
    assert cache.nbytes == 2 * layers * batch * heads * positions * d_head * bytes_per_number
    held = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert cache.nbytes == held


@pytest.mark.parametrize("max_len", [None, 8])
@pytest.mark.parametrize("new, message", [
    ((2, 2, 1, 4), "batch, heads and width"),       # another batch size
    ((1, 3, 1, 4), "batch, heads and width"),       # another number of heads
    ((1, 2, 1, 6), "batch, heads and width"),       # another width
])
def test_new_keys_that_do_not_fit_are_refused(max_len, new, message):
    cache = KVCache(1, max_len=max_len)
    cache.update(0, randn(1, 2, 3, 4), randn(1, 2, 3, 4))
    with pytest.raises(ValueError, match=message):
        cache.update(0, randn(*new), randn(*new))
    assert cache.seq_len == 3


def test_a_dtype_change_is_refused_instead_of_converted():
    cache = KVCache(1, max_len=8)
    cache.update(0, randn(1, 2, 3, 4), randn(1, 2, 3, 4))
    new = randn(1, 2, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="float32 keys"):
        cache.update(0, new, new)


@pytest.mark.parametrize("key, value", [
    (randn(1, 2, 3, 4), randn(1, 2, 2, 4)),
    (randn(2, 3, 4), randn(2, 3, 4)),
    (randn(1, 2, 3, 4), randn(1, 2, 3, 4, dtype=torch.float64)),
])
def test_key_and_value_must_match_and_be_4d(key, value):
    with pytest.raises(ValueError, match=r"\(B, num_heads, T, d_head\)"):
        KVCache(1).update(0, key, value)


def test_bad_arguments():
    with pytest.raises(TypeError, match="num_layers"):
        KVCache(2.0)
    with pytest.raises(ValueError, match="num_layers"):
        KVCache(0)
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, max_len=0)
    with pytest.raises(TypeError):
        KVCache(1, 5)                                   # max_len is keyword-only
    with pytest.raises(ValueError, match=r"layer_idx must be an int in \[0, 2\)"):
        KVCache(2).update(2, randn(1, 1, 1, 2), randn(1, 1, 1, 2))
    with pytest.raises(TypeError, match="tensors"):
        KVCache(1).update(0, [1.0], [1.0])


def test_repr():
    cache = KVCache(2, max_len=4)
    cache.update(0, randn(1, 1, 3, 2), randn(1, 1, 3, 2))
    assert repr(cache) == "KVCache(num_layers=2, max_len=4, seq_len=3)"


# --- attention and layers with the cache --------------------------------------------------------

from minitransformer import (  # noqa: E402
    GPT,
    DecoderLayer,
    EncoderLayer,
    GPTConfig,
    MultiHeadAttention,
    causal_mask,
    generate,
)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("max_len", [None, 12])
def test_attend_one_position_at_a_time_equals_the_masked_full_pass(num_heads, max_len, device):
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, num_heads).eval().to(device)
    x = randn(2, 9, 16, seed=5, device=device)
    with torch.no_grad():
        full = attention(x, attn_mask=causal_mask(9, device=device))
        cache = KVCache(1, max_len=max_len)
        steps = [attention.attend(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], kv_cache=cache,
                                  layer_idx=0) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)
    assert cache.seq_len == 9


def test_multi_head_attention_forward_checks_the_mask_against_the_cached_length():
    attention = MultiHeadAttention(8, 2).eval()
    cache = KVCache(1)
    x = randn(1, 3, 8)
    attention(x, attn_mask=causal_mask(3), kv_cache=cache, layer_idx=0)
    new = randn(1, 2, 8, seed=1)
    out = attention(new, attn_mask=causal_mask(2, 5), kv_cache=cache, layer_idx=0)
    assert out.shape == (1, 2, 8) and cache.seq_len == 5
    with pytest.raises(ValueError, match=r"\(1, 2, 2, 7\)"):
        attention(new, attn_mask=causal_mask(2), kv_cache=cache, layer_idx=0)
    assert cache.seq_len == 5                                  # refused before the update
    with pytest.raises(TypeError, match="kv_cache must be a KVCache"):
        attention(new, kv_cache={}, layer_idx=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_and_decoder_layers_pass_the_cache_to_their_self_attention(norm_first, device):
    torch.manual_seed(0)
    encoder = EncoderLayer(16, 2, 32, norm_first=norm_first).eval().to(device)
    decoder = DecoderLayer(16, 2, 32, norm_first=norm_first).eval().to(device)
    x, memory = randn(2, 7, 16, seed=1, device=device), randn(2, 4, 16, seed=2, device=device)
    with torch.no_grad():
        full_encoder = encoder(x, attn_mask=causal_mask(7, device=device))
        full_decoder = decoder(x, memory, tgt_mask=causal_mask(7, device=device))
        encoder_cache, decoder_cache = KVCache(1), KVCache(1, max_len=7)
        chunks = [(0, 3), (3, 4), (4, 7)]
        encoded = [encoder(x[:, a:b], attn_mask=causal_mask(b - a, b, device=device),
                           kv_cache=encoder_cache, layer_idx=0) for a, b in chunks]
        decoded = [decoder(x[:, a:b], memory, tgt_mask=causal_mask(b - a, b, device=device),
                           kv_cache=decoder_cache, layer_idx=0) for a, b in chunks]
    torch.testing.assert_close(torch.cat(encoded, dim=1), full_encoder, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(decoded, dim=1), full_decoder, rtol=0, atol=1e-5)
    # the decoder cached its self-attention only: 7 positions, not the memory's 4
    assert decoder_cache.seq_len == 7 and decoder_cache.keys[0].shape[2] == 7


# --- the GPT with the cache ---------------------------------------------------------------------

def gpt(positional="learned", num_heads=2, context_length=24, seed=0, device="cpu"):
    """Initialised on the CPU, then moved: the same weights on every device."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=13, context_length=context_length, num_layers=2,
                       num_heads=num_heads, d_model=16, positional=positional)
    return GPT(config).eval().to(device)


def cached_logits(model, idx, chunk, max_len=None):
    cache = KVCache(model.config.num_layers, max_len=max_len)
    with torch.no_grad():
        pieces = [model(idx[:, start:start + chunk], kv_cache=cache)[0]
                  for start in range(0, idx.shape[1], chunk)]
    assert cache.seq_len == idx.shape[1]
    return torch.cat(pieces, dim=1)


TOKENS = torch.randint(13, (3, 24), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("chunk, max_len", [(1, None), (1, 24), (3, None), (5, 30), (24, None)])
def test_stepwise_and_chunked_logits_equal_the_full_pass(positional, num_heads, chunk, max_len,
                                                         device):
    model, tokens = gpt(positional, num_heads, device=device), TOKENS.to(device)
    with torch.no_grad():
        full, _ = model(tokens)
    torch.testing.assert_close(cached_logits(model, tokens, chunk, max_len), full, rtol=0,
                               atol=1e-5)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("chunk, max_len", [(1, None), (1, 24), (5, 30)])
def test_decode_step_computes_what_forward_computes_with_the_cache(positional, num_heads, chunk,
                                                                   max_len, device):
    model, tokens = gpt(positional, num_heads, device=device), TOKENS.to(device)
    cache = KVCache(model.config.num_layers, max_len=max_len)
    with torch.no_grad():
        fast = torch.cat([model.decode_step(tokens[:, s:s + chunk], cache)
                          for s in range(0, tokens.shape[1], chunk)], dim=1)
    assert cache.seq_len == tokens.shape[1]
    # the same operations on the same weights: the same numbers, bit for bit
    assert torch.equal(fast, cached_logits(model, tokens, chunk, max_len))


def test_decode_step_applies_no_dropout_even_in_training_mode():
    model = gpt("learned")
    trained = GPT(dataclasses.replace(model.config, dropout=0.5)).train()
    trained.load_state_dict(model.state_dict())
    with torch.no_grad():
        fast = trained.decode_step(TOKENS, KVCache(model.config.num_layers))
        assert torch.equal(fast, cached_logits(model, TOKENS, 24))


def test_generate_makes_one_decode_step_and_works_without_one():
    model = gpt("learned", context_length=64)

    class WithoutDecodeStep(nn.Module):      # a model that offers forward(kv_cache=) only
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, idx, targets=None, *, kv_cache=None):
            return self.inner(idx, targets, kv_cache=kv_cache)

    made, calls = [], []
    original = model.make_decode_step

    def counting_make_decode_step():
        step = original()
        made.append(step)
        return lambda idx, cache: calls.append(idx.shape) or step(idx, cache)

    model.make_decode_step = counting_make_decode_step
    fast = generate(model, TOKENS[:, :5], 20, temperature=0, fast=False)   # chapter 11's step
    assert len(made) == 1                                          # once per generation
    assert calls[0] == (3, 5) and calls[1:] == [(3, 1)] * 19       # prefill, then one per step
    generate(model, TOKENS[:, :5], 20, temperature=0, use_cache=False)
    assert len(made) == 1                                          # no cache, no step function
    del model.make_decode_step
    plain = generate(WithoutDecodeStep(model), TOKENS[:, :5], 20, temperature=0)
    assert torch.equal(fast, plain)


def test_a_step_function_sees_weights_updated_in_place():
    """The step holds the weight tensors, not copies: training (in place) after the step was
    made is seen; the logits stay those of forward."""
    model = gpt("learned")
    step = model.make_decode_step()
    with torch.no_grad():
        model.layers[1].self_attn.v_proj.weight.mul_(-2.0)
        model.layers[0].feed_forward.linear1.bias.add_(0.5)
        model.norm.weight.mul_(3.0)
        model.token_embedding.weight.add_(0.1)                      # and the tied head
        fast = torch.cat([step(TOKENS[:, s:s + 4], cache)
                          for cache in [KVCache(model.config.num_layers)]
                          for s in range(0, TOKENS.shape[1], 4)], dim=1)
    assert torch.equal(fast, cached_logits(model, TOKENS, 4))


def step_logits(step, idx, chunk, num_layers=2):
    cache = KVCache(num_layers)
    with torch.no_grad():
        return torch.cat([step(idx[:, s:s + chunk], cache)
                          for s in range(0, idx.shape[1], chunk)], dim=1)


def test_an_as_built_gpt_takes_the_fast_path_and_a_changed_one_forward(monkeypatch):
    """The equality tests pass whichever path runs; this one fails if the shortcut is never
    taken, or taken for a model it cannot follow."""
    model = gpt()
    calls = []
    original = EncoderLayer.encode
    monkeypatch.setattr(EncoderLayer, "encode",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    step_logits(model.make_decode_step(), TOKENS, 4)
    assert calls == []                                   # no block method: the fast path
    model.layers[0].norm_first = False
    step_logits(model.make_decode_step(), TOKENS, 4)
    assert calls                                         # a changed block: forward itself


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_the_step_is_forward_bit_for_bit_in_float64_and_after_to(positional):
    torch.manual_seed(0)
    model = GPT(gpt(positional).config, dtype=torch.float64).eval()
    assert torch.equal(step_logits(model.make_decode_step(), TOKENS, 5),
                       cached_logits(model, TOKENS, 5))
    model = gpt(positional)
    step = model.make_decode_step()
    model.to(torch.float64)                              # parameters converted in place
    fast = step_logits(step, TOKENS, 5)
    assert fast.dtype == torch.float64 and torch.equal(fast, cached_logits(model, TOKENS, 5))


class LoudLinear(nn.Linear):
    def forward(self, x):
        return 3 * super().forward(x)


class LoudEmbed(GPT):
    def embed(self, idx, *, offset=0):
        return 20 * super().embed(idx, offset=offset)


def _hook_on_model(model):
    return model.register_forward_hook(
        lambda module, args, out: (out[0].masked_fill(torch.arange(13) < 8, -1e9), out[1]))


def _pre_hook_on_a_projection(model):
    return model.layers[1].self_attn.q_proj.register_forward_pre_hook(
        lambda module, args: (2 * args[0],))


def _linear_subclass(model):
    old = model.layers[0].feed_forward.linear1
    new = LoudLinear(old.in_features, old.out_features)
    new.load_state_dict(old.state_dict())
    model.layers[0].feed_forward.linear1 = new


def _global_hook(model):
    return nn.modules.module.register_module_forward_hook(
        lambda module, args, out: 2 * out if isinstance(module, nn.Linear) else out)


def _subclass_with_its_own_embed(model):
    model.__class__ = LoudEmbed


@pytest.mark.parametrize("change", [_hook_on_model, _pre_hook_on_a_projection, _linear_subclass,
                                    _global_hook, _subclass_with_its_own_embed])
def test_cached_generation_follows_changes_the_shortcut_cannot_see(change):
    """Found in review (2026-11-22): hooks, parametrized weights, module subclasses and an
    overridden embed used to be skipped by the fast step (tokens differed)."""
    model = gpt(context_length=64)
    handle = change(model)
    try:
        cached, uncached = (generate(model, TOKENS[:, :5], 20, use_cache=use, temperature=0)
                            for use in (True, False))
        assert torch.equal(cached, uncached)
        assert torch.equal(step_logits(model.make_decode_step(), TOKENS, 4),
                           cached_logits(model, TOKENS, 4))
    finally:
        if handle is not None:
            handle.remove()


def test_a_step_follows_a_parametrized_weight_updated_in_place():
    """With weight_norm, ``out_proj.weight`` is computed from two parameters at every access:
    a step holding the computed weight would not see training update them."""
    model = gpt()
    nn.utils.parametrizations.weight_norm(model.layers[0].self_attn.out_proj)
    step = model.make_decode_step()
    with torch.no_grad():
        model.layers[0].self_attn.out_proj.parametrizations.weight.original0.mul_(2.0)
    assert torch.equal(step_logits(step, TOKENS, 4), cached_logits(model, TOKENS, 4))


def test_a_step_applies_no_dropout_on_the_fallback_path_either():
    model = GPT(dataclasses.replace(gpt().config, dropout=0.5)).train()
    for layer in model.layers:
        layer.norm_first = False                          # not as built: forward itself
    step = model.make_decode_step()
    assert torch.equal(step_logits(step, TOKENS, 24), step_logits(step, TOKENS, 24))
    assert model.training                                 # and the mode is given back


# Found in review (chapter 11, 2026-11-22): the shortcut must never disagree with forward.
def test_cached_generation_runs_a_subclass_that_changes_forward():
    class NoLowIds(GPT):                     # a GPT that never predicts ids below 8
        def forward(self, idx, targets=None, *, kv_cache=None):
            logits, loss = super().forward(idx, targets, kv_cache=kv_cache)
            return logits.masked_fill(torch.arange(13) < 8, -1e9), loss

    torch.manual_seed(0)
    model = NoLowIds(gpt().config).eval()
    cached, uncached = (generate(model, TOKENS[:, :3], 10, use_cache=use, temperature=0)
                        for use in (True, False))
    assert (uncached[:, 3:] >= 8).all()
    assert torch.equal(cached, uncached)


def test_cached_generation_follows_blocks_turned_post_norm():
    model = gpt(context_length=30)
    for layer in model.layers:
        layer.norm_first = False             # forward follows it (EncoderLayer.encode)
    cached, uncached = (generate(model, TOKENS[:, :3], 20, use_cache=use, temperature=0)
                        for use in (True, False))
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_decode_step_past_the_context_is_refused(positional):
    model = gpt(positional, context_length=10)
    cache = KVCache(2)
    model.decode_step(TOKENS[:, :10], cache)
    with pytest.raises(ValueError, match="11 positions, more than context_length=10"):
        model.decode_step(TOKENS[:, :1], cache)
    with pytest.raises(ValueError, match="positions 8 to 11 do not fit context_length=10"):
        model.embed(TOKENS[:, :4], offset=8)      # used to return an empty (B, 0, d) slice


def test_cached_generation_follows_a_block_given_another_activation():
    model = gpt(context_length=30)
    model.layers[1].feed_forward.activation = nn.ReLU()
    cached, uncached = (generate(model, TOKENS[:, :3], 20, use_cache=use, temperature=0)
                        for use in (True, False))
    assert torch.equal(cached, uncached)


@torch.no_grad()
def written_out_cached_pass(model, idx, cache, *, offset=True, upper_left=False):
    """GPT.forward's cached pass, with a switch for each of the two classic mistakes."""
    past, length = cache.seq_len, idx.shape[1]
    x = model.embed(idx, offset=past if offset else 0)
    if upper_left:                 # F.scaled_dot_product_attention(is_causal=True)'s alignment
        mask = torch.ones(length, past + length, dtype=torch.bool).tril()
    else:
        mask = causal_mask(length, past + length)
    for i, layer in enumerate(model.layers):
        x = layer.encode(x, attn_mask=mask, kv_cache=cache, layer_idx=i)
    return model.head(model.norm(x))


def written_out_logits(model, idx, chunk, **mistake):
    cache = KVCache(model.config.num_layers)
    return torch.cat([written_out_cached_pass(model, idx[:, s:s + chunk], cache, **mistake)
                      for s in range(0, idx.shape[1], chunk)], dim=1)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
@pytest.mark.parametrize("chunk", [1, 4])
def test_negative_controls_the_two_classic_mistakes_differ(positional, chunk):
    model = gpt(positional)
    with torch.no_grad():
        full, _ = model(TOKENS)
    right = written_out_logits(model, TOKENS, chunk)
    torch.testing.assert_close(right, full, rtol=0, atol=1e-5)     # the control is fair
    for mistake in ({"offset": False}, {"upper_left": True}):
        wrong = written_out_logits(model, TOKENS, chunk, **mistake)
        # the first chunk is right either way (position 0 onwards, no cached keys) ...
        torch.testing.assert_close(wrong[:, :chunk], full[:, :chunk], rtol=0, atol=1e-5)
        # ... and every later position is wrong
        assert ((wrong - full).abs().amax(dim=(0, 2))[chunk:] > 1e-3).all(), mistake


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_generation_is_identical_with_and_without_the_cache(positional, device):
    model = gpt(positional, context_length=64, device=device)
    prompt = TOKENS[:, :5].to(device)
    greedy = [generate(model, prompt, 40, use_cache=use, temperature=0) for use in (True, False)]
    assert torch.equal(*greedy)
    for top_k in (None, 4):
        sampled = [generate(model, prompt, 40, use_cache=use, temperature=1.3, top_k=top_k,
                            generator=torch.Generator(device).manual_seed(11))
                   for use in (True, False)]
        assert torch.equal(*sampled)
    # a one-token prompt, and a generation that fills the context exactly
    one = [generate(model, prompt[:, :1], 63, use_cache=use, temperature=0)
           for use in (True, False)]
    assert torch.equal(*one) and one[0].shape == (3, 64)


def test_use_cache_is_the_default_and_keyword_only():
    import inspect
    parameters = inspect.signature(generate).parameters
    assert parameters["use_cache"].default is True
    assert parameters["use_cache"].kind is inspect.Parameter.KEYWORD_ONLY


def test_overflow_past_context_length_names_the_cache():
    model = gpt(context_length=10)
    cache = KVCache(2)
    model(TOKENS[:, :8], kv_cache=cache)
    model(TOKENS[:, 8:10], kv_cache=cache)                        # exactly full: fine
    with pytest.raises(ValueError, match=r"cache holds 10 positions.*1 new.*11.*context_length=10"):
        model(TOKENS[:, :1], kv_cache=cache)
    assert cache.seq_len == 10                                    # checked before any update


def test_overflow_past_max_len():
    model = gpt()
    cache = KVCache(2, max_len=6)
    model(TOKENS[:, :4], kv_cache=cache)
    with pytest.raises(ValueError, match="max_len=6"):
        model(TOKENS[:, 4:7], kv_cache=cache)


def test_the_model_checks_the_cache_it_is_given():
    model = gpt()
    with pytest.raises(TypeError, match="kv_cache must be a KVCache"):
        model(TOKENS, kv_cache=[])
    with pytest.raises(ValueError, match="3 layers.*2 layers"):
        model(TOKENS, kv_cache=KVCache(3))
    cache = KVCache(2)
    model(TOKENS[:, :4], kv_cache=cache)
    with pytest.raises(ValueError, match="batch"):
        model(TOKENS[:2, 4:5], kv_cache=cache)                     # another batch size


def test_reset_makes_the_cache_reusable():
    model = gpt()
    cache = KVCache(2, max_len=24)
    first = torch.cat([model(TOKENS[:, t:t + 1], kv_cache=cache)[0] for t in range(10)], dim=1)
    cache.reset()
    assert cache.seq_len == 0
    again = torch.cat([model(TOKENS[:, t:t + 1], kv_cache=cache)[0] for t in range(10)], dim=1)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_memory_of_a_generation_equals_the_formula(dtype):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=13, context_length=40, num_layers=3, num_heads=4, d_model=32)
    model = GPT(config, dtype=dtype).eval()
    cache = KVCache(config.num_layers)
    model(TOKENS[:, :20], kv_cache=cache)
    d_head = config.d_model // config.num_heads
    bytes_per_number = torch.finfo(dtype).bits // 8
    assert cache.nbytes == 2 * 3 * 3 * 4 * 20 * d_head * bytes_per_number
    assert cache.keys[0].shape == (3, 4, 20, d_head)


def test_a_decode_step_checks_once_and_builds_no_mask(monkeypatch):
    """The cached step is overhead-bound: the model checks its input in forward, the layers do
    not check again, and a single new token needs no causal mask."""
    import minitransformer.gpt as gpt_module
    model = gpt()
    cache = KVCache(2, max_len=24)
    model(TOKENS[:, :5], kv_cache=cache)
    calls = []
    monkeypatch.setattr(MultiHeadAttention, "_check_inputs",
                        lambda *a, **k: calls.append("attention check"))
    monkeypatch.setattr(gpt_module, "causal_mask", lambda *a, **k: calls.append("mask"))
    logits, _ = model(TOKENS[:, 5:6], kv_cache=cache)
    assert logits.shape == (3, 1, 13) and calls == []


# --- the encoder-decoder with the cache ---------------------------------------------------------

from minitransformer.seq2seq import Seq2Seq, Seq2SeqConfig  # noqa: E402


def seq2seq(seed=0, device="cpu"):
    torch.manual_seed(seed)
    config = Seq2SeqConfig(src_vocab_size=15, tgt_vocab_size=17, context_length=20, num_layers=2,
                           num_heads=2, d_model=16)
    return Seq2Seq(config).eval().to(device)


SRC = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 11, 0, 0], [12, 0, 0, 0, 0]])


@pytest.mark.parametrize("cross_cached", [False, True])
@pytest.mark.parametrize("chunk", [1, 3])
def test_seq2seq_decoder_logits_through_the_cache_equal_the_full_pass(cross_cached, chunk,
                                                                      device):
    model, src = seq2seq(device=device), SRC.to(device)
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long),
                        torch.randint(3, 17, (3, 8), generator=torch.Generator().manual_seed(2))],
                       dim=1).to(device)
    with torch.no_grad():
        full, _ = model(src, tgt_in)
        source = model.read_source(src, use_cache=cross_cached)
        cache = KVCache(2)
        pieces = [model._decode(tgt_in[:, s:s + chunk], source.memory, source.mask,
                                keys_values=source.keys_values, kv_cache=cache)
                  for s in range(0, 9, chunk)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)
    assert cache.seq_len == 9                       # self-attention only: target positions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seq2seq_translation_is_identical_with_and_without_the_cache(seed, device):
    model, src = seq2seq(seed, device=device), SRC.to(device)
    cached = model.translate(src, 19, use_cache=True)
    uncached = model.translate(src, 19, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape[1] > 2                      # it wrote something to compare


def test_seq2seq_translation_feeds_the_decoder_one_token_a_step_through_the_cache(monkeypatch):
    # Equal outputs alone would not show that the cache is used: translate(use_cache=True)
    # must append every step's one new position to the decoder's self-attention cache, layer
    # by layer, and nothing of the source (cross-attention keys and values are kept apart).
    model, appended, caches = seq2seq(), [], []
    update = KVCache.update

    def recording_update(self, layer_idx, key, value):
        caches.append(self)
        appended.append((layer_idx, key.shape[2]))
        return update(self, layer_idx, key, value)

    monkeypatch.setattr(KVCache, "update", recording_update)
    out = model.translate(SRC, 19, use_cache=True)
    steps = out.shape[1] - 1                        # the last token written is never read
    assert appended == [(layer, 1) for _ in range(steps) for layer in range(2)]
    assert len(set(map(id, caches))) == 1 and caches[0].seq_len == steps
    appended.clear()
    model.translate(SRC, 19, use_cache=False)
    assert appended == []
