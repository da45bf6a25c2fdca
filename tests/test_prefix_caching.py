"""Prefix caching (issue 43): requests whose tokens begin the same way share the full blocks
of that beginning, by reference count.

The tokens are those of the same requests without sharing; fewer positions are prefilled; no
block is freed while a request holds it (each block's count of users is the number of block
tables that hold it, after every step), and none is left held or findable after 1,000 mixed
requests with cancellations and preemptions.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_serving_engine import VOCAB, gpt, llama

from minitransformer.serving import Engine, Request

STEM = [(7 * i + 3) % VOCAB for i in range(40)]        # 2 full blocks of 16 and 8 tokens


def check_shared_invariants(engine: Engine) -> None:
    """Each held block is allocated and counts exactly the tables that hold it; every block
    findable by its tokens is held."""
    tables = engine.block_tables()
    holders: dict[int, int] = {}
    for table in tables.values():
        assert len(table) == len(set(table)), tables
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    assert set(holders) == engine.pool.allocated, (holders, engine.pool.allocated)
    for block, count in holders.items():
        assert engine.pool.users(block) == count, (block, count, tables)
    assert set(engine._block_key) <= set(holders)
    assert engine.num_free_blocks + len(holders) == engine.num_blocks


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_shared_prefixes_give_the_tokens_they_give_unshared_and_prefill_less(make):
    model = make()
    requests = [Request(STEM + [i + 1, 2 * i + 5], max_tokens=6, temperature=0.0)
                for i in range(4)] + [
                Request(STEM[:20] + [9], max_tokens=5, temperature=0.9, seed=4),
                Request(STEM, max_tokens=5, temperature=0.0, logprobs=2, prompt_logprobs=True)]
    plain = Engine(model, kv_blocks=40, max_batch=8)
    expected = plain.run(requests)
    shared = Engine(model, kv_blocks=40, max_batch=8, prefix_caching=True)
    got = shared.run(requests)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert plain.prefilled == sum(len(r.prompt_ids) for r in requests)
    # the 3 requests after the first prefill 10 of their 42, the stem's 20 + 1 prefill 5
    assert shared.prefilled == plain.prefilled - 3 * 32 - 16
    assert got[-1].prompt_logprobs == expected[-1].prompt_logprobs is not None
    assert shared.num_free_blocks == shared.num_blocks and not shared._prefix


def test_no_block_freed_in_use_and_none_leaked_after_1000_mixed_requests():
    model = gpt()
    engine = Engine(model, kv_blocks=10, max_batch=6, prefix_caching=True)
    rng = random.Random(0)
    stems = [STEM, STEM[:33], [5] * 48]
    submitted, live, finished, prompt_tokens = 0, set(), 0, 0
    while finished < 1000:
        while submitted < 1000 and len(live) < 10:
            stem = rng.choice(stems)
            prompt = stem[:rng.randint(1, len(stem))] + [rng.randrange(VOCAB)
                                                          for _ in range(rng.randint(0, 5))]
            sampled = rng.random() < 0.5
            request = Request(prompt, max_tokens=rng.randint(1, 30),
                              temperature=0.8 if sampled else 0.0,
                              seed=rng.randrange(1000) if sampled else None,
                              logprobs=1 if rng.random() < 0.1 else None)
            live.add(engine.submit(request))
            prompt_tokens += len(prompt)
            submitted += 1
        if rng.random() < 0.05:
            engine.cancel(rng.choice(sorted(live)))
        for event in engine.step():
            if event.finish_reason is not None:
                live.discard(event.request_id)
                finished += 1
        check_shared_invariants(engine)
    assert not engine.has_work
    assert engine.num_free_blocks == engine.num_blocks and not engine._prefix
    assert engine.pool.allocated == frozenset()
    assert engine.preemptions > 0                       # the pool was short at times
    assert engine.prefilled < prompt_tokens             # and blocks were shared


def test_prefix_caching_is_a_bool():
    with pytest.raises(TypeError, match="prefix_caching"):
        Engine(gpt(), prefix_caching=1)
    assert torch.is_tensor(gpt().token_embedding.weight)
