"""The KV cache (chapter 11): the cache object itself, then the models that use it."""

from __future__ import annotations

import pytest
import torch

from minitransformer.cache import KVCache


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


# --- the cache object ---------------------------------------------------------------------------

@pytest.mark.parametrize("max_len", [None, 16])
def test_update_appends_and_returns_everything_held(max_len):
    cache = KVCache(2, max_len=max_len)
    k1, v1 = randn(2, 3, 4, 5, seed=1), randn(2, 3, 4, 5, seed=2)
    k2, v2 = randn(2, 3, 1, 5, seed=3), randn(2, 3, 1, 5, seed=4)
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


def test_the_returned_tensors_are_not_aliased_to_the_input():
    cache = KVCache(1, max_len=8)
    key = randn(1, 2, 3, 4)
    cache.update(0, key, key.clone())
    key.zero_()
    assert cache.keys[0][:, :, :3].abs().sum() > 0


def test_storage_is_allocated_on_the_first_update_with_max_len():
    cache = KVCache(3, max_len=10)
    assert cache.keys == [None] * 3 and cache.nbytes == 0
    key = randn(2, 4, 1, 8, dtype=torch.float64)
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
