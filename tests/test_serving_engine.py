"""The continuous-batching engine (chapter 18): every request gets the tokens it gets alone
(greedy, and sampled with its own seed), whatever runs beside it, even when the pool runs out
and requests wait or are preempted; waiting requests are admitted as soon as running ones
finish; the scheduler never gives a block to two requests and gets every block back after
requests finish or are cancelled; submit and cancel work from other threads; the text comes out
incrementally, whole characters only, without end tokens or stop strings."""

from __future__ import annotations

import threading

import pytest
import torch

from minitransformer import GPT, BPETokenizer, GPTConfig, Llama, LlamaConfig, generate
from minitransformer.chat import CHAT_TOKENS, END_OF_TURN
from minitransformer.serving import Engine, Event, Request

VOCAB = 61


def gpt(context_length=96):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, context_length=context_length, num_layers=2,
                         num_heads=2, d_model=32)).eval()


def llama():
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=VOCAB, context_length=96, num_layers=2, num_heads=4,
                             num_kv_heads=2, d_model=32)).eval()


def random_prompts(n, seed=0, longest=25):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (n,), generator=g).tolist()
    return [torch.randint(0, VOCAB, (k,), generator=g).tolist() for k in lengths]


def mixed_requests(n, seed=0):
    """Greedy and seeded sampled requests, some with penalties, of mixed lengths."""
    requests = []
    for i, prompt in enumerate(random_prompts(n, seed)):
        options = {"temperature": 0.0} if i % 3 == 0 else {
            "temperature": 0.9, "seed": 100 + i, "top_k": 30 if i % 2 else None,
            "top_p": 0.9 if i % 4 == 1 else None,
            "presence_penalty": 0.4 if i % 5 == 2 else 0.0,
            "frequency_penalty": 0.3 if i % 5 == 2 else 0.0}
        requests.append(Request(prompt, max_tokens=3 + (7 * i) % 30, **options))
    return requests


def alone(model, request, eos_ids=()):
    """The request's tokens from chapter 9's generate, alone; cut after an end token."""
    r = request
    generator = None if r.seed is None else torch.Generator().manual_seed(r.seed)
    out = generate(model, torch.tensor([r.prompt_ids]), r.max_tokens,
                   temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                   presence_penalty=r.presence_penalty, frequency_penalty=r.frequency_penalty,
                   generator=generator)[0, len(r.prompt_ids):].tolist()
    for i, token in enumerate(out):
        if token in eos_ids:
            return out[:i + 1]
    return out


def check_invariants(engine):
    """No block held twice; held + free = all; no more rows than max_batch."""
    tables = engine.block_tables()
    held = [b for table in tables.values() for b in table]
    assert len(held) == len(set(held)), f"a block is owned twice: {tables}"
    assert set(held) == engine.pool.allocated
    assert engine.num_free_blocks + len(held) == engine.num_blocks
    assert engine.num_running <= engine.max_batch


def drive(engine, ids):
    """Step until the requests ``ids`` are done, checking the invariants after every step;
    each request's events."""
    events = {i: [] for i in ids}
    for _ in range(10_000):
        if all(e and e[-1].finish_reason for e in events.values()):
            return events
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
        check_invariants(engine)
    raise AssertionError("the requests never finished")


# --- tokens as alone -----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_every_request_gets_its_tokens_alone(make):
    model = make()
    requests = mixed_requests(14)
    engine = Engine(model, max_batch=5, kv_blocks=64, block_size=4, eos_ids=[5])
    done = engine.run(requests)
    for request, completion in zip(requests, done):
        expected = alone(model, request, eos_ids={5})
        assert completion.token_ids == expected
        assert completion.finish_reason == ("stop" if expected[-1] == 5 and
                                             len(expected) <= request.max_tokens
                                             and 5 in expected else "length")
        assert completion.prompt_tokens == len(request.prompt_ids)
        assert completion.completion_tokens == len(expected)
    assert {c.finish_reason for c in done} == {"stop", "length"}
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_work


@pytest.mark.parametrize("pack_weights", [True, False])
def test_a_gpt_runs_through_the_fast_step(monkeypatch, pack_weights):
    """A GPT's engine decodes with make_fast_decode_step: one or two rows through its blocks of
    weight rows (here every matrix is cut, as GPT-2 small's are), more through the packed copy
    of the weights (``pack_weights``, the default). It prefills through the packed copy too,
    within float32 rounding of forward; with ``pack_weights=False``, through make_decode_step,
    bit for bit forward. A one-token prompt included, every request's tokens are its own."""
    import minitransformer.fast_decode as fast_module

    monkeypatch.setattr(fast_module, "FAST_MIN_NUMEL", 0)
    monkeypatch.setattr(fast_module, "FAST_CHOICE", "blocks")   # whichever is faster here
    calls = {"blocks": 0, "packed": 0}
    row_product, packed_call = fast_module.row_product, fast_module.PackedWeight.__call__

    def counted(*args, **kwargs):
        calls["blocks"] += 1
        return row_product(*args, **kwargs)

    def counted_packed(self, x, bias):
        out = packed_call(self, x, bias)
        calls["packed"] += out is not None
        return out

    monkeypatch.setattr(fast_module, "row_product", counted)
    monkeypatch.setattr(fast_module.PackedWeight, "__call__", counted_packed)
    model = gpt()
    requests = [Request([7], max_tokens=6, temperature=0.0), *mixed_requests(9, seed=3)]
    engine = Engine(model, max_batch=4, kv_blocks=64, block_size=4, eos_ids=[5],
                    pack_weights=pack_weights)
    prefills = []
    prefill_step = engine._prefill_step
    engine._prefill_step = lambda idx, view: prefills.append(prefill_step(idx, view)) or \
        prefills[-1]
    done = engine.run(requests)
    assert calls["blocks"] > 0                   # the decode steps of one or two rows, or all
    assert (calls["packed"] > 0) == pack_weights
    for request, completion, logits in zip(requests, done, prefills):
        assert completion.token_ids == alone(model, request, eos_ids={5})
        with torch.no_grad():
            exact = model(torch.tensor([request.prompt_ids]))[0]
        if pack_weights:                         # float32 rounding: 32 eps of the largest
            bound = 32 * torch.finfo(torch.float32).eps * exact.abs().max()
            assert (logits - exact).abs().max() <= bound
        else:
            assert torch.equal(logits, exact)                   # bit for bit


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_a_short_pool_makes_requests_wait_or_be_recomputed_not_fail(make):
    model = make()
    requests = mixed_requests(10, seed=1)
    longest = max(len(r.prompt_ids) + r.max_tokens for r in requests)
    engine = Engine(model, max_batch=8, kv_blocks=-(-longest // 4) + 2, block_size=4)
    ids = [engine.submit(r) for r in requests]
    events = drive(engine, ids)
    assert engine.preemptions > 0                       # the pool did run out
    for i, request in zip(ids, requests):
        assert [e.token_id for e in events[i]] == alone(model, request)
    assert engine.num_free_blocks == engine.num_blocks


def test_a_waiting_request_starts_as_soon_as_a_running_one_finishes():
    engine = Engine(gpt(), max_batch=2, kv_blocks=32, block_size=4)
    prompts = random_prompts(3)
    ids = [engine.submit(Request(p, max_tokens=n, temperature=0))
           for p, n in zip(prompts, (3, 12, 4))]
    first, last = {}, {}
    for step in range(20):
        for event in engine.step():
            first.setdefault(event.request_id, step)
            if event.finish_reason:
                last[event.request_id] = step
        assert engine.num_running <= 2
    assert first[ids[0]] == first[ids[1]] == 0
    assert last[ids[0]] == 2
    assert first[ids[2]] == 3          # the step after the first one ended, not after the batch
    assert last[ids[1]] == 11 and last[ids[2]] == 6


def test_the_engine_admits_what_fits_and_reports_its_state():
    engine = Engine(gpt(), max_batch=3, kv_blocks=40, block_size=4)
    assert engine.num_blocks == 40 and not engine.has_work
    ids = [engine.submit(Request(p, max_tokens=5, temperature=0)) for p in random_prompts(5)]
    assert engine.has_work and engine.num_waiting == 5
    engine.step()
    assert engine.num_running == 3 and engine.num_waiting == 2
    check_invariants(engine)
    drive(engine, ids)
    assert engine.num_free_blocks == 40 and not engine.has_work


# --- cancellation and threads --------------------------------------------------------------------

def test_cancel_frees_the_blocks_of_running_and_waiting_requests():
    model = gpt()
    engine = Engine(model, max_batch=2, kv_blocks=40, block_size=4)
    requests = [Request(p, max_tokens=20, temperature=0) for p in random_prompts(4, seed=2)]
    ids = [engine.submit(r) for r in requests]
    early = engine.step() + engine.step()
    free = engine.num_free_blocks
    assert engine.cancel(ids[0]) and engine.cancel(ids[3])   # running, waiting
    events = engine.step()
    cancelled = [e for e in events if e.finish_reason == "cancelled"]
    assert sorted(e.request_id for e in cancelled) == [ids[0], ids[3]]
    assert all(e.token_id is None and e.text == "" for e in cancelled)
    assert engine.num_free_blocks >= free            # request 0's blocks came back
    assert not engine.cancel(ids[0])                 # finished: nothing to cancel
    assert not engine.cancel(12345)
    rest = drive(engine, ids[1:3])
    for k in (1, 2):
        tokens = [e.token_id for e in early + events + rest[ids[k]]
                  if e.request_id == ids[k]]
        assert tokens == alone(model, requests[k])
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_work


def test_submit_and_cancel_from_other_threads():
    model = gpt()
    engine = Engine(model, max_batch=4, kv_blocks=48, block_size=4)
    requests = mixed_requests(24, seed=3)
    ids: dict[int, int] = {}
    events: dict[int, list[Event]] = {}
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            if engine.has_work:
                for event in engine.step():
                    events.setdefault(event.request_id, []).append(event)
            else:
                stop.wait(0.001)

    def client(part):
        for k in part:
            ids[k] = engine.submit(requests[k])
            if k % 6 == 5:
                engine.cancel(ids[k])

    thread = threading.Thread(target=worker)
    thread.start()
    clients = [threading.Thread(target=client, args=(range(j, 24, 3),)) for j in range(3)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    for _ in range(2000):
        if len(events) == 24 and all(e[-1].finish_reason for e in events.values()):
            break
        stop.wait(0.01)
    stop.set()
    thread.join()
    assert len(events) == 24
    for k, request in enumerate(requests):
        got = events[ids[k]]
        assert got[-1].finish_reason in ("length", "cancelled")
        if got[-1].finish_reason == "length":
            assert [e.token_id for e in got] == alone(model, request)
    assert any(e[-1].finish_reason == "cancelled" for e in events.values())
    assert engine.num_free_blocks == engine.num_blocks


# --- refusals ------------------------------------------------------------------------------------

def test_requests_that_cannot_run_are_refused():
    engine = Engine(gpt(context_length=40), max_batch=2, kv_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="more than the model's context_length=40"):
        engine.submit(Request([1] * 30, max_tokens=11))
    with pytest.raises(ValueError, match="more than the pool's kv_blocks=4"):
        engine.submit(Request([1] * 10, max_tokens=8))
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] is 61, outside"):
        engine.submit(Request([1, VOCAB], max_tokens=2))
    with pytest.raises(TypeError, match="request must be a Request"):
        engine.submit([1, 2])
    with pytest.raises(ValueError, match="top_k"):
        engine.submit(Request([1], max_tokens=2, top_k=VOCAB + 1))
    assert not engine.has_work and engine.num_free_blocks == 4
    engine.submit(Request([1] * 10, max_tokens=7))      # 16 positions: just fits


def test_a_run_with_a_refused_request_leaves_nothing_behind():
    # review of chapter 18: the requests submitted before the refused one stayed in the engine
    # and ran during the next run, holding blocks
    engine = Engine(gpt(context_length=32), max_batch=4, kv_blocks=8, block_size=4)
    with pytest.raises(ValueError, match=r"requests\[1\]: the prompt's 30 tokens"):
        engine.run([Request([1, 2, 3], max_tokens=5, temperature=0.0),
                    Request([1] * 30, max_tokens=5, temperature=0.0)])
    assert not engine.has_work and engine.num_free_blocks == 8
    (done,) = engine.run([Request([4, 5], max_tokens=3, temperature=0.0)])
    assert done.completion_tokens == 3 and not engine.has_work


def test_a_run_that_fails_in_a_step_cancels_its_requests(monkeypatch):
    engine = Engine(gpt(), max_batch=4, kv_blocks=16, block_size=4)
    calls = []
    step = engine.step

    def failing_step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a step failed")
        return step()

    monkeypatch.setattr(engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="a step failed"):
        engine.run(mixed_requests(6))
    assert not engine.has_work and engine.num_free_blocks == 16
    check_invariants(engine)


def test_bad_requests_and_engines_are_refused():
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        Request([], max_tokens=3)
    with pytest.raises(ValueError, match="max_tokens"):
        Request([1], max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        Request([1], max_tokens=1, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        Request([1], max_tokens=1, top_p=0.0)
    with pytest.raises(ValueError, match="empty string"):
        Request([1], max_tokens=1, stop=["x", ""])
    with pytest.raises(TypeError, match="stop"):
        Request([1], max_tokens=1, stop=[3])
    with pytest.raises(TypeError, match="GPT or a Llama"):
        Engine(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="eos_ids"):
        Engine(gpt(), eos_ids=[VOCAB])
    with pytest.raises(TypeError, match="pack_weights must be True or False"):
        Engine(gpt(), pack_weights="yes")


# --- text ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    """Bytes and the chat tokens, no merges: every byte is a token, so a two-byte character
    takes two tokens."""
    return BPETokenizer.train("no merges here", 256 + len(CHAT_TOKENS),
                              special_tokens=CHAT_TOKENS)


def scripted(tokenizer, script):
    """A GPT whose greedy choice after position ``p`` is ``script[p]``, whatever the tokens:
    its blocks add nothing, its token vectors are small and its position vectors point at the
    scripted token."""
    vocab = len(tokenizer)
    model = GPT(GPTConfig(vocab_size=vocab, context_length=len(script) + 1, num_layers=1,
                          num_heads=2, d_model=vocab + 1)).eval()
    with torch.no_grad():
        for layer in model.layers:
            for linear in (layer.self_attn.out_proj, layer.feed_forward.linear2):
                linear.weight.zero_()
                linear.bias.zero_()
        model.token_embedding.weight.copy_(0.01 * torch.eye(vocab, vocab + 1))
        model.position_embedding.weight.zero_()
        for p, token in enumerate(script):
            model.position_embedding.weight[p, token] = 10.0
    return model


def script_of(tokenizer, prompt, answer):
    """Prompt ids, then the ids of ``answer`` (a str, or a list of str and special tokens)."""
    ids = tokenizer.encode(prompt)
    parts = [answer] if isinstance(answer, str) else answer
    out = []
    for part in parts:
        out += ([tokenizer.special_tokens[part]] if part in tokenizer.special_tokens
                else list(tokenizer.encode(part)))
    return ids, ids[1:] + out


def run_script(tokenizer, answer, *, stop=(), max_tokens=None, prompt="Hi"):
    ids, script = script_of(tokenizer, prompt, answer)
    engine = Engine(scripted(tokenizer, script), tokenizer, kv_blocks=8, block_size=4)
    limit = len(script) - len(ids) + 1 if max_tokens is None else max_tokens
    rid = engine.submit(Request(ids, max_tokens=limit, temperature=0, stop=stop))
    events = drive(engine, [rid])[rid]
    assert engine.num_free_blocks == engine.num_blocks
    return events


def test_a_character_split_over_tokens_comes_out_whole(tokenizer):
    events = run_script(tokenizer, "café!")
    assert [e.text for e in events] == ["c", "a", "f", "", "é", "!"]
    assert events[-1].finish_reason == "length"


def test_the_end_of_turn_token_ends_the_text_without_showing(tokenizer):
    events = run_script(tokenizer, ["ok", END_OF_TURN, "more"])
    assert "".join(e.text for e in events) == "ok"
    assert events[-1].finish_reason == "stop"
    assert events[-1].token_id == tokenizer.special_tokens[END_OF_TURN]
    assert len(events) == 3


def test_a_stop_string_is_held_back_and_left_out(tokenizer):
    events = run_script(tokenizer, "ab\nSx\nSTOP more", stop=["\nSTOP", "zz"])
    texts = [e.text for e in events]
    assert "".join(texts) == "ab\nSx"
    assert texts[:6] == ["a", "b", "", "", "\nSx", ""]   # "\nS" held until "x" rules it out
    assert events[-1].finish_reason == "stop" and len(events) == 10   # up to "\nSTOP"


def test_a_partial_stop_string_at_the_end_is_let_out(tokenizer):
    events = run_script(tokenizer, "ab\nST", stop="\nSTOP")
    assert "".join(e.text for e in events) == "ab\nST"
    assert [e.text for e in events][-1] == "\nST"
    assert events[-1].finish_reason == "length"


def test_the_text_is_the_chat_commands_text(tokenizer, capsys):
    """Greedy, among other requests: the text chapter 16's ``chat`` prints (bytes of a random
    model, so broken characters too)."""
    from minitransformer.cli.chat import _stream

    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), context_length=64, num_layers=2,
                          num_heads=2, d_model=32)).eval()
    stops = {tokenizer.special_tokens[t] for t in CHAT_TOKENS}
    prompts = [tokenizer.encode(text) for text in ("Hello", "Grüße, wie geht's?", "日本", "x")]
    engine = Engine(model, tokenizer, max_batch=3, kv_blocks=40, block_size=4)
    done = engine.run([Request(p, max_tokens=30, temperature=0) for p in prompts])
    for prompt, completion in zip(prompts, done):
        expected = _stream(model, tokenizer, prompt, 30, 0.0, torch.Generator(), stops)
        capsys.readouterr()
        assert completion.text == expected


@pytest.mark.parametrize("make", [gpt, llama], ids=["gpt", "llama"])
def test_a_model_the_decode_step_cannot_follow_runs_through_forward(make):
    """A LoRA-wrapped model (chapter 16) takes ``forward`` with the paged view: same tokens."""
    from minitransformer.lora import add_lora

    model = make()
    add_lora(model, r=2, alpha=4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_b" in name.lower():
                parameter.normal_(std=0.5)               # an adapter that changes the tokens
    model.eval()
    assert not model._is_as_built()
    requests = [Request(p, max_tokens=8, temperature=0) for p in random_prompts(4, seed=5)]
    done = Engine(model, max_batch=2, kv_blocks=24, block_size=4).run(requests)
    assert [c.token_ids for c in done] == [alone(model, r) for r in requests]


def test_special_tokens_write_no_text_where_they_do_not_stop(tokenizer):
    """A completion on a chat model ignores the end of turn (``stop_token_ids=[]``): its
    special tokens are still not text ('se<|end|>pendendend'), as in transformers'
    ``decode(skip_special_tokens=True)``."""
    ids, script = script_of(tokenizer, "Hi", ["se", END_OF_TURN, "p", "<|user|>", "end"])
    engine = Engine(scripted(tokenizer, script), tokenizer, kv_blocks=8, block_size=4)
    rid = engine.submit(Request(ids, max_tokens=len(script) - len(ids) + 1, temperature=0,
                                stop_token_ids=[]))
    events = drive(engine, [rid])[rid]
    assert "".join(e.text for e in events) == "sepend"
    assert tokenizer.special_tokens[END_OF_TURN] in [e.token_id for e in events]
    assert events[-1].finish_reason == "length"


# --- a model that writes NaN --------------------------------------------------------------------

def test_weights_with_nan_or_infinity_are_refused_by_name():
    for value in (float("nan"), float("inf")):
        model = gpt()
        with torch.no_grad():
            model.layers[1].feed_forward.linear1.weight[3, 4] = value
        with pytest.raises(ValueError, match=r"layers\.1\.feed_forward\.linear1\.weight holds "
                                             r"NaN or infinity"):
            Engine(model)


def test_nan_scores_end_that_request_with_an_error_and_the_others_go_on(monkeypatch):
    """Weights that turn NaN after the engine was made (or numbers past the dtype): greedy
    decoding used to return token 0 and '\\x00\\x00\\x00'."""
    model = gpt()
    engine = Engine(model, max_batch=4, kv_blocks=32, block_size=4)
    prefill, mark = engine._prefill_step, VOCAB - 1

    def broken_prefill(idx, view, **kwargs):
        logits = prefill(idx, view, **kwargs)
        return logits.masked_fill((idx == mark).any(), float("nan"))

    monkeypatch.setattr(engine, "_prefill_step", broken_prefill)
    prompts = [[1, 2, 3], [4, mark, 5], [6, 7]]
    requests = [Request(p, max_tokens=6, temperature=t) for p, t in zip(prompts, (0, 0, 0.8))]
    ids = [engine.submit(r) for r in requests]
    events = drive(engine, ids)
    assert [(e.token_id, e.text, e.finish_reason) for e in events[ids[1]]] == [
        (None, "", "error")]
    assert [e.token_id for e in events[ids[0]]] == alone(model, requests[0])
    assert len(events[ids[2]]) == 6 and events[ids[2]][-1].finish_reason == "length"
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_work

    with pytest.raises(FloatingPointError, match=r"requests\[1\]: the model's scores became "
                                                 r"NaN or infinite"):
        engine.run(requests)
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_work


def test_nan_scores_in_a_decode_step_end_the_request_too(monkeypatch):
    model = gpt()
    engine = Engine(model, max_batch=4, kv_blocks=32, block_size=4)
    decode = engine._decode_step

    def broken_decode(idx, view, **kwargs):
        logits = decode(idx, view, **kwargs)
        return logits.masked_fill((kwargs["position_ids"][:, -1:] == 4)[..., None], float("nan"))

    monkeypatch.setattr(engine, "_decode_step", broken_decode)
    short, long = Request([1], max_tokens=8, temperature=0), Request(
        list(range(1, 9)), max_tokens=8, temperature=0)
    ids = [engine.submit(short), engine.submit(long)]
    events = drive(engine, ids)
    # the short prompt's row reaches position 4 at its fourth decode step; the long one never
    assert [e.finish_reason for e in events[ids[0]]] == [None] * 4 + ["error"]
    assert [e.token_id for e in events[ids[1]]] == alone(model, long)
    assert engine.num_free_blocks == engine.num_blocks


def test_a_seed_past_what_a_generator_takes_is_refused_by_its_range():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64 - 1\]"):
        Request([1], max_tokens=1, seed=2**64)
    with pytest.raises(ValueError, match="seed must be at least 0"):
        Request([1], max_tokens=1, seed=-1)
    done = Engine(gpt()).run([Request([1, 2], max_tokens=4, seed=2**64 - 1)])
    g = torch.Generator().manual_seed(2**64 - 1)
    expected = generate(gpt(), torch.tensor([[1, 2]]), 4, generator=g)[0, 2:].tolist()
    assert done[0].token_ids == expected
