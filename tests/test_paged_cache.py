"""The paged KV cache (chapter 18): the block pool hands out, frees and reuses blocks and refuses
a double free; gathering a request's blocks gives its contiguous cache; attention over blocks by
online softmax (merging per-block partials) equals attention over the contiguous keys; a model
run through a PagedView of the pool gives the logits of its own KVCache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minitransformer import GPT, GPTConfig, KVCache, Llama, LlamaConfig
from minitransformer.paged_cache import (BlockPool, PagedView, gather_blocks, merge_partials,
                                         paged_attention)


def pool(num_blocks=8, block_size=4, **sizes):
    sizes = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, **sizes}
    return BlockPool(num_blocks, block_size, **sizes)


# --- the pool -------------------------------------------------------------------------------------

def test_blocks_for_rounds_up():
    p = pool(block_size=16)
    assert [p.blocks_for(n) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_allocate_free_and_reuse():
    p = pool(num_blocks=6)
    a = p.allocate(2)
    b = p.allocate(3)
    assert len(set(a) | set(b)) == 5 and p.num_free == 1
    assert p.allocated == frozenset(a + b)
    p.free(a)
    assert p.num_free == 3
    c = p.allocate(2)
    assert set(c) == set(a)                 # the freed blocks are handed out again first
    assert not set(c) & set(b)
    p.free(b)
    p.free(c)
    assert p.num_free == 6 and p.allocated == frozenset()


def test_allocate_gives_none_when_short_and_takes_nothing():
    p = pool(num_blocks=4)
    held = p.allocate(3)
    assert p.allocate(2) is None
    assert p.num_free == 1                  # a refused allocation takes no block
    assert p.allocate(1) is not None
    p.free(held)


def test_double_free_and_foreign_blocks_are_refused():
    p = pool(num_blocks=4)
    blocks = p.allocate(2)
    p.free(blocks)
    with pytest.raises(ValueError, match="not allocated"):
        p.free(blocks)
    with pytest.raises(ValueError, match="not allocated"):
        p.free([3])                          # never handed out
    kept = p.allocate(2)
    with pytest.raises(ValueError, match="twice"):
        p.free([kept[0], kept[0]])
    assert p.num_free == 2                   # a refused free frees nothing
    with pytest.raises(ValueError, match="not allocated"):
        p.free([kept[0], p.null_block])      # all or nothing
    assert p.num_free == 2
    with pytest.raises(TypeError, match="block"):
        p.free(kept[0])


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_blocks"):
        pool(num_blocks=0)
    with pytest.raises(TypeError, match="block_size"):
        BlockPool(4, 2.5, num_layers=1, num_kv_heads=1, head_dim=4)
    with pytest.raises(ValueError, match="n must be"):
        pool().allocate(-1)


def test_memory_is_counted():
    p = pool(num_blocks=3, block_size=4, num_layers=2, num_kv_heads=2, head_dim=8)
    per_block = 2 * 2 * 4 * 2 * 8 * 4        # keys and values, layers, positions, heads, dims
    assert p.block_nbytes == per_block
    assert p.nbytes == 4 * per_block         # with the null block


# --- gathering and paged attention ---------------------------------------------------------------

def filled(num_blocks, block_size, heads, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, heads, width)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


@pytest.mark.parametrize("length", [1, 4, 5, 11, 16])
def test_gather_blocks_is_the_contiguous_cache(length):
    keys, _ = filled(6, 4, 3, 5)
    table = [4, 0, 5, 2]
    got = gather_blocks(keys, table, length)
    # position p lives in block table[p // 4] at offset p % 4
    expected = torch.stack([keys[table[p // 4], p % 4] for p in range(length)], dim=1)
    assert got.shape == (3, length, 5)
    assert torch.equal(got, expected)


def test_gather_blocks_refuses_a_table_too_short():
    keys, _ = filled(6, 4, 3, 5)
    with pytest.raises(ValueError, match="do not fit"):
        gather_blocks(keys, [1, 2], 9)
    with pytest.raises(ValueError, match="outside"):
        gather_blocks(keys, [1, 6], 5)


def contiguous_attention(query, keys, values):
    """softmax(q k^T / sqrt(d)) v with PyTorch's kernel: query (h, d), keys (h_kv, L, d)."""
    group = query.shape[0] // keys.shape[0]
    keys = keys.repeat_interleave(group, dim=0)
    values = values.repeat_interleave(group, dim=0)
    return F.scaled_dot_product_attention(query[:, None], keys, values)[:, 0]


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("length", [1, 2, 16, 17, 40])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_paged_attention_equals_contiguous_attention(block_size, length, heads, kv_heads):
    width = 8
    num_blocks = math.ceil(40 / block_size) + 3
    keys, values = filled(num_blocks, block_size, kv_heads, width, seed=length)
    table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    table = table[:math.ceil(length / block_size) + 1]       # one block more than needed
    query = torch.randn(heads, width, generator=torch.Generator().manual_seed(2))
    got = paged_attention(query, keys, values, table, length)
    expected = contiguous_attention(query, gather_blocks(keys, table, length),
                                    gather_blocks(values, table, length))
    assert (got - expected).abs().max() <= 1e-6


def test_paged_attention_takes_a_scale():
    keys, values = filled(4, 4, 2, 8)
    query = torch.randn(2, 8)
    got = paged_attention(query, keys, values, [1, 3], 6, scale=0.5)
    k, v = gather_blocks(keys, [1, 3], 6), gather_blocks(values, [1, 3], 6)
    expected = torch.softmax(torch.einsum("hd,hnd->hn", query, k) * 0.5, -1)
    assert torch.allclose(got, torch.einsum("hn,hnd->hd", expected, v), atol=1e-6)


def test_paged_attention_ignores_positions_past_length():
    keys, values = filled(4, 4, 2, 8)
    query = torch.randn(2, 8)
    before = paged_attention(query, keys, values, [2, 0], 6)
    keys[0, 2:] = 1e6                          # stale positions of the last block
    values[0, 2:] = float("nan")
    assert torch.equal(paged_attention(query, keys, values, [2, 0], 6), before)


def test_paged_attention_refuses_bad_input():
    keys, values = filled(4, 4, 2, 8)
    with pytest.raises(ValueError, match="does not fit"):
        paged_attention(torch.randn(3, 8), keys, values, [0], 2)
    with pytest.raises(TypeError, match="dtype"):
        paged_attention(torch.randn(2, 8, dtype=torch.float64), keys, values, [0], 2)
    with pytest.raises(ValueError, match="length"):
        paged_attention(torch.randn(2, 8), keys, values, [0], 5)


def partial(scores, values):
    """(m, l, o) of scores (n,) over values (n, d), relative to the largest score."""
    m = scores.max()
    w = torch.exp(scores - m)
    return m, w.sum(), w @ values


def test_merge_partials_is_the_softmax_over_both():
    g = torch.Generator().manual_seed(0)
    scores, values = torch.randn(9, generator=g) * 4, torch.randn(9, 5, generator=g)
    m, total, out = merge_partials(*partial(scores[:4], values[:4]),
                                   *partial(scores[4:], values[4:]))
    assert torch.allclose(out / total, torch.softmax(scores, 0) @ values, atol=1e-6)
    assert m == scores.max()


def test_merge_partials_takes_an_empty_partial():
    m, total, out = partial(torch.tensor([0.5, 2.0]), torch.eye(2))
    empty = (torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(2))
    for merged in (merge_partials(*empty, m, total, out), merge_partials(m, total, out, *empty)):
        assert torch.allclose(merged[2] / merged[1], out / total)
    both = merge_partials(*empty, *empty)
    assert both[1] == 0 and not torch.isnan(both[2]).any()


def test_merge_partials_refuses_shapes_that_do_not_fit():
    m, total, out = partial(torch.tensor([0.5, 2.0]), torch.eye(2))
    with pytest.raises(ValueError, match="one shape"):
        merge_partials(m, total, out, m, total, out[:1, None])


# --- a model through a paged view ----------------------------------------------------------------

def models():
    torch.manual_seed(0)
    return [GPT(GPTConfig(vocab_size=41, context_length=40, num_layers=2, num_heads=2,
                          d_model=16)).eval(),
            Llama(LlamaConfig(vocab_size=41, context_length=40, num_layers=2, num_heads=4,
                              num_kv_heads=2, d_model=32)).eval()]


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "inference"])
@pytest.mark.parametrize("model", models(), ids=["gpt", "llama"])
def test_a_paged_batch_gives_each_row_its_own_cache_logits(model, inference):
    # autograd: update gathers into fresh tensors; inference: into the pool's one buffer
    with torch.inference_mode(inference):
        _paged_batch_gives_each_row_its_own_cache_logits(model)


def _paged_batch_gives_each_row_its_own_cache_logits(model):
    c = model.config
    kv_heads = getattr(c, "num_kv_heads", c.num_heads)
    p = BlockPool(12, 4, num_layers=c.num_layers, num_kv_heads=kv_heads,
                  head_dim=c.d_model // c.num_heads)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 41, (n,), generator=g).tolist() for n in (7, 1, 12)]
    tables = [p.allocate(p.blocks_for(len(x) + 1)) for x in prompts]
    for prompt, table in zip(prompts, tables):       # each prefill alone, into its blocks
        model(torch.tensor([prompt]), kv_cache=p.view([table], [0], len(prompt)))
    view = p.view(tables, [len(x) for x in prompts], 1)
    assert isinstance(view, PagedView) and view.seq_len == 12
    new = torch.tensor([[5], [6], [7]])
    logits, _ = model(new, kv_cache=view, attention_mask=view.attention_mask,
                      position_ids=view.position_ids)
    assert view.position_ids.flatten().tolist() == [7, 1, 12]
    for row, prompt in enumerate(prompts):
        alone, _ = model(torch.tensor([prompt + [5 + row]]))
        assert (logits[row, -1] - alone[0, -1]).abs().max() <= 1e-5
        # the blocks hold the row's keys: layer 0 of the contiguous cache
        cache = KVCache(c.num_layers)
        model(torch.tensor([prompt + [5 + row]]), kv_cache=cache)
        assert torch.allclose(gather_blocks(p.keys[0], tables[row], len(prompt) + 1),
                              cache.keys[0][0], atol=1e-6)


def test_update_gathers_every_layer_into_one_buffer_without_autograd():
    p = BlockPool(6, 4, num_layers=2, num_kv_heads=2, head_dim=3)
    table = p.allocate(2)
    new = [torch.randn(1, 2, 5, 3) for _ in range(4)]
    with torch.inference_mode():
        view = p.view([table], [0], 5)
        k0, v0 = view.update(0, new[0], new[1])
        assert torch.equal(k0, new[0]) and torch.equal(v0, new[1])
        k1, v1 = view.update(1, new[2], new[3])
    assert torch.equal(k1, new[2]) and torch.equal(v1, new[3])
    assert k0.data_ptr() == k1.data_ptr() and v0.data_ptr() == v1.data_ptr()   # reused
    assert torch.equal(k0, new[2])                 # so layer 0's are gone: valid until then
    # with autograd, a gradient reaches the new keys through the gathered ones
    q = BlockPool(6, 4, num_layers=1, num_kv_heads=2, head_dim=3)
    key = torch.randn(1, 2, 5, 3, requires_grad=True)
    keys, _ = q.view([q.allocate(2)], [0], 5).update(0, key, torch.randn(1, 2, 5, 3))
    (2 * keys).sum().backward()
    assert torch.equal(key.grad, torch.full_like(key, 2.0))
    with pytest.raises(ValueError, match="slots must be"):
        p.gathered(-1)
    # made in inference mode, the buffer still takes writes under no_grad
    with torch.no_grad():
        k2, _ = p.view([table], [0], 5).update(0, new[1], new[0])
    assert torch.equal(k2, new[1])
    # it grows at least twofold, so that a batch that widens a position a step seldom
    # allocates: 40 slots fit exactly, 41 double it, and then up to 80 fit
    p.gathered(40)
    grown = p.gathered(41)[0].data_ptr()
    assert p.gathered(80)[0].data_ptr() == grown
    # keys and values of another shape are refused, naming the shapes
    with pytest.raises(ValueError, match="3 heads|heads of size 3"):
        p.view([table], [0], 5).update(0, torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))


def test_a_view_refuses_rows_without_room():
    p = pool(num_blocks=4, block_size=4)
    table = p.allocate(1)
    with pytest.raises(ValueError, match="allocate first"):
        p.view([table], [4], 1)              # position 4 needs a second block
