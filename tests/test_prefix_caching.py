"""Prefix caching (issue 43): requests whose tokens begin the same way share the full blocks
of that beginning, by reference count; a full block keeps its keys after its last user ends,
evictable, and a later request with the same beginning takes it back (vLLM's automatic prefix
caching); the pool hands out empty blocks first, then evicts the least recently used cached
ones.

The tokens are those of the same requests without caching; fewer positions are prefilled (the
hits counted by the engine and in /metrics); no block is freed or written while a request holds
it or while it is findable (each block's count of users is the number of block tables that hold
it, and a cached block's keys and values never change, after every step); none is left held
after 1,000 mixed requests with cancellations and preemptions (free and evictable make the
whole pool); eviction under pressure keeps the outputs, and takes the least recently used.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from test_server import build_model_dir
from test_serving_engine import VOCAB, gpt, llama

from minitransformer.cli import serve as serve_command
from minitransformer.paged_cache import BlockPool
from minitransformer.server import create_app
from minitransformer.serving import Engine, Request

STEM = [(7 * i + 3) % VOCAB for i in range(40)]        # 2 full blocks of 16 and 8 tokens


def check_pool(engine: Engine, contents: dict | None = None) -> None:
    """Each held block is allocated and counts exactly the tables that hold it; the held, the
    evictable and the empty blocks make the pool; every cached block is found by its key, and
    every evictable one is cached. With ``contents`` (block -> (key, keys and values), kept
    between calls): a block still found by the same key holds the same keys and values."""
    pool = engine.pool
    tables = engine.block_tables()
    holders: dict[int, int] = {}
    for table in tables.values():
        assert len(table) == len(set(table)), tables
        for block in table:
            holders[block] = holders.get(block, 0) + 1
    assert set(holders) == pool.allocated, (holders, pool.allocated)
    for block, count in holders.items():
        assert pool.users(block) == count, (block, count, tables)
    evictable = set(pool.evictable)
    assert len(evictable) == pool.num_evictable and not evictable & set(holders)
    assert len(holders) + pool.num_free == pool.num_blocks == engine.num_blocks
    assert all(pool.key_of(block) is not None for block in evictable)
    for block in range(pool.num_blocks):
        key = pool.key_of(block)
        assert key is None or pool.find(key) == block, block
    if contents is not None:
        for block in range(pool.num_blocks):
            key = pool.key_of(block)
            data = torch.stack([pool.keys[:, block], pool.values[:, block]])
            # the same key object: cached once, not evicted and cached again since
            if key is not None and block in contents and contents[block][0] is key:
                assert torch.equal(contents[block][1], data), f"cached block {block} changed"
            contents[block] = (key, data.clone())


def assert_idle(engine: Engine) -> None:
    """No request holds a block: the free ones (evictable included) are the whole pool."""
    assert not engine.has_work and engine.pool.allocated == frozenset()
    assert engine.num_free_blocks == engine.num_blocks
    check_pool(engine)


# --- the pool -----------------------------------------------------------------------------------

def test_pool_keeps_cached_blocks_evictable_and_evicts_the_least_recently_used():
    pool = BlockPool(4, 2, num_layers=1, num_kv_heads=1, head_dim=2)
    a = pool.allocate(3)
    d = pool.allocate(1)
    for i, block in enumerate(a):
        assert pool.cache(block, ("k", i))
    assert not pool.cache(a[0], ("other",)) and not pool.cache(d[0], ("k", 1))  # first stays
    pool.free(a)
    assert pool.evictable == (a[2], a[1], a[0])     # a prefix's end is evicted first
    assert pool.num_free == 3 and pool.num_evictable == 3
    assert [pool.find(("k", i)) for i in range(3)] == a
    pool.free(d)
    assert pool.num_free == 4
    assert pool.allocate(1) == d                    # an empty block before any cached one
    assert pool.evictions == 0
    assert pool.allocate(1) == [a[2]]               # then the least recently used
    assert pool.evictions == 1 and pool.find(("k", 2)) is None and pool.key_of(a[2]) is None
    pool.share([a[0]])                              # a hit revives it
    assert pool.users(a[0]) == 1 and pool.evictable == (a[1],)
    pool.share([a[0]])
    assert pool.free([a[0]]) == [] and pool.users(a[0]) == 1
    assert pool.free([a[0]]) == [a[0]] and pool.evictable == (a[1], a[0])  # used last
    assert pool.allocate(3) is None and pool.num_free == 2  # a refusal evicts nothing
    assert pool.allocate(1) == [a[1]] and pool.find(("k", 0)) == a[0]
    assert pool.find(("k", 1)) is None
    pool.free(d + [a[2], a[1]])                     # evicted and reused: no key, empty
    assert pool.evictable == (a[0],) and pool.num_free == 4
    with pytest.raises(ValueError, match="neither allocated nor cached"):
        pool.share([a[1]])                          # its keys are gone
    with pytest.raises(ValueError, match="not allocated"):
        pool.cache(d[0], ("late",))
    assert pool.num_free == 4 and pool.allocated == frozenset()


# --- the engine -----------------------------------------------------------------------------------

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
    assert plain.prefix_queries == plain.prefix_hits == 0
    # the 3 requests after the first prefill 10 of their 42, the stem's 20 + 1 prefill 5
    assert shared.prefilled == plain.prefilled - 3 * 32 - 16
    assert shared.prefix_hits == 3 * 32 + 16
    # the request with prompt_logprobs does not look its prompt up
    assert shared.prefix_queries == sum(len(r.prompt_ids) for r in requests[:-1])
    assert got[-1].prompt_logprobs == expected[-1].prompt_logprobs is not None
    assert_idle(shared)
    assert shared.pool.num_evictable > 0              # the blocks are kept for later requests


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_a_request_after_the_first_ended_finds_its_blocks_and_prefills_less(make):
    """Sequential requests: the second arrives after the first has ended, so nothing is
    shared while it runs; its time to first token is a prefill of what is not cached, here 16
    positions of 216 instead of all 216, counted rather than timed."""
    short = make()
    torch.manual_seed(0)                              # room for 216 + 4 positions
    model = type(short)(dataclasses.replace(short.config, context_length=256)).eval()
    rng = random.Random(1)
    prefix = [rng.randrange(VOCAB) for _ in range(200)]
    prompts = [prefix + [rng.randrange(VOCAB) for _ in range(16)] for _ in range(3)]
    sampled = {"temperature": 0.8, "seed": 3, "top_k": 20}
    requests = [Request(prompts[0], max_tokens=4, temperature=0.0),
                Request(prompts[1], max_tokens=4, **sampled),
                Request(prompts[2], max_tokens=4, temperature=0.0, logprobs=3)]
    plain, cached = (Engine(model, kv_blocks=20, prefix_caching=c) for c in (False, True))
    computed = {False: [], True: []}
    for engine in (plain, cached):
        for request in requests:                     # one at a time: each ends before the next
            before = engine.prefilled
            (completion,) = engine.run([request])
            computed[engine.prefix_caching].append((engine.prefilled - before, completion))
            assert_idle(engine)
    assert [n for n, _ in computed[False]] == [216, 216, 216]
    assert [n for n, _ in computed[True]] == [216, 216 - 192, 216 - 192]   # 12 blocks found
    for (_, one), (_, other) in zip(computed[False], computed[True]):
        assert one.token_ids == other.token_ids
    for one, other in zip(computed[False][2][1].logprobs, computed[True][2][1].logprobs):
        assert one.token_id == other.token_id
        assert one.logprob == pytest.approx(other.logprob, abs=1e-4)
    assert cached.prefix_hits == 2 * 192 and cached.prefix_queries == 3 * 216
    assert cached.pool.evictions == 0


def test_a_conversation_s_next_turn_finds_the_blocks_its_answer_filled():
    """Blocks that fill while decoding are cached too: a prompt that repeats a finished
    request's prompt and answer (a chat's next turn) finds the blocks of both."""
    model = gpt()
    engine = Engine(model, kv_blocks=12, prefix_caching=True)
    (first,) = engine.run([Request(STEM, max_tokens=30, temperature=0.0)])
    turn = STEM + first.token_ids + [1, 2]           # 40 + 30 + 2: 4 full blocks of 16
    before = engine.prefilled
    (second,) = engine.run([Request(turn, max_tokens=4, temperature=0.0)])
    assert engine.prefilled - before == len(turn) - 64
    (alone,) = Engine(model, kv_blocks=12).run([Request(turn, max_tokens=4, temperature=0.0)])
    assert second.token_ids == alone.token_ids
    assert_idle(engine)


def test_under_pressure_the_least_recently_used_prefix_is_evicted_tail_first():
    model = gpt()
    stems = {name: [rng.randrange(VOCAB) for _ in range(48)]
             for name, rng in (("a", random.Random(2)), ("b", random.Random(3)),
                               ("c", random.Random(4)))}

    def ask(engine, name, tail):
        before = engine.prefix_hits
        (out,) = engine.run([Request(stems[name] + tail, max_tokens=4, temperature=0.0)])
        assert_idle(engine)
        return engine.prefix_hits - before, out.token_ids

    # each request holds 4 blocks of 16 (48 + 2 + 4 - 1 positions); the pool holds 8
    cached, plain = Engine(model, kv_blocks=8, prefix_caching=True), Engine(model, kv_blocks=8)
    hits = []
    for name, tail in [("a", [1, 2]), ("b", [3, 4]), ("c", [5, 6]), ("b", [7, 8]),
                       ("a", [9, 10]), ("c", [11, 12])]:
        found, tokens = ask(cached, name, tail)
        assert tokens == ask(plain, name, tail)[1]
        hits.append(found)
    # c evicts a's last 2 blocks (a freed before b, its end before its start); b finds all 3;
    # a finds its first block only, and evicts 2 of c's; c then finds its first block
    assert hits == [0, 0, 0, 48, 16, 16]
    assert cached.pool.evictions == 2 + 2 + 2


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_a_crowded_pool_evicts_and_preempts_and_every_request_gets_its_tokens(make):
    """Many requests at once from a few prefixes, in a pool far too small for them: cached
    blocks are evicted and requests preempted while others share, and each request's tokens
    are those of the same requests without prefix caching."""
    model = make()
    rng = random.Random(5)
    stems = [[rng.randrange(VOCAB) for _ in range(40)] for _ in range(4)]
    requests = []
    for k in range(40):
        stem = stems[rng.randrange(4)]
        prompt = stem[:rng.randint(17, 40)] + [rng.randrange(VOCAB) for _ in range(3)]
        options = ({"temperature": 0.0} if k % 2 else
                   {"temperature": 0.9, "seed": k, "presence_penalty": 0.5})
        requests.append(Request(prompt, max_tokens=rng.randint(1, 20), **options))
    expected = Engine(model, kv_blocks=12, max_batch=5).run(requests)
    engine = Engine(model, kv_blocks=12, max_batch=5, prefix_caching=True)
    got = engine.run(requests)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert engine.pool.evictions > 0 and engine.preemptions > 0
    assert engine.prefix_hits > 0
    assert_idle(engine)


def test_no_block_freed_in_use_and_none_leaked_after_1000_mixed_requests():
    model = gpt()
    engine = Engine(model, kv_blocks=10, max_batch=6, prefix_caching=True)
    rng = random.Random(0)
    stems = [STEM, STEM[:33], [5] * 48]
    submitted, live, finished, prompt_tokens, contents = 0, set(), 0, 0, {}
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
        check_pool(engine, contents)
    assert_idle(engine)
    assert engine.pool.num_evictable > 0
    assert engine.preemptions > 0                       # the pool was short at times
    assert engine.pool.evictions > 0                    # and cached blocks were evicted
    assert 0 < engine.prefix_hits < engine.prefix_queries
    assert engine.prefilled < prompt_tokens             # and blocks were shared


def test_metrics_count_the_prefix_cache_s_hits_in_prometheus_text(tmp_path):
    folder = build_model_dir(tmp_path / "model")
    model, tokenizer = serve_command.load(folder, torch.device("cpu"))
    engine = Engine(model.eval(), tokenizer, kv_blocks=40, prefix_caching=True)
    app = create_app(engine, tokenizer, model_name=folder.name)
    prompt = "the cat sat on the mat and looked at the dog " * 2
    length = len(tokenizer.encode(prompt))
    assert 32 < length < 60                         # the model's context is 64
    with TestClient(app) as http:
        for _ in range(2):                             # one after the other
            reply = http.post("/v1/completions", json={"model": folder.name, "prompt": prompt,
                                                        "max_tokens": 2, "temperature": 0})
            assert reply.status_code == 200
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name, sample):
        (found,) = [s.value for s in families[name].samples if s.name == sample]
        return found

    name = "minitransformer_prefix_cache_"
    assert families[name + "hits"].type == families[name + "queries"].type == "counter"
    hits = (length - 1) // 16 * 16
    assert value(name + "queries", name + "queries_total") == 2 * length
    assert value(name + "hits", name + "hits_total") == hits == engine.prefix_hits
    assert value("minitransformer_kv_blocks_used", "minitransformer_kv_blocks_used") == 0
    evictable = value("minitransformer_kv_blocks_evictable",
                      "minitransformer_kv_blocks_evictable")
    assert evictable == engine.pool.num_evictable >= hits // 16


def test_prefix_caching_is_a_bool():
    with pytest.raises(TypeError, match="prefix_caching"):
        Engine(gpt(), prefix_caching=1)
    assert torch.is_tensor(gpt().token_embedding.weight)
