"""The OpenAI-compatible server (chapter 18), through the official ``openai`` client.

The server runs in this process (uvicorn in a thread, on a free port of 127.0.0.1) over the
real engine. With temperature 0 its text is what ``python -m minitransformer generate`` writes
for the same prompt and what ``chat`` writes for the same conversation, alone or among 16
requests at once; bad requests get HTTP 400 with OpenAI's error JSON; a client that leaves
frees its blocks. The command line (and SIGTERM) is tested in test_cli_serve.py, the chat page
in test_chat_page.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

fastapi = pytest.importorskip("fastapi", reason="the serve extra is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx", reason="the openai client's httpx is not installed")

from minitransformer import GPT, BPETokenizer, GPTConfig  # noqa: E402
from minitransformer.bpe import GPT2_PATTERN  # noqa: E402
from minitransformer.chat import CHAT_TOKENS, END_OF_TURN  # noqa: E402
from minitransformer.cli import main  # noqa: E402
from minitransformer.cli import serve as serve_command  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.server import create_app  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 64
# Prompts whose greedy continuations differ from one another (checked below), so a server that
# mixed requests up would be caught. The model writes <|end|> after some of the chat turns.
PROMPTS = ["The cat", "Once upon", "Attention is", "token", "In the", "x", "Hello", "1 2 3",
           "We start", "cache", "Why", "layer norm"]
TURNS = ["Why attention?", "Take the token bank.", "There are two", "Hello there", "Hi",
         "and then?", "What is a cache?", "Tell me more", "Why?", "A story", "Be brief."]


# ----- shared with test_chat_page.py and test_cli_serve.py ------------------------------

def build_model_dir(folder: Path, *, context_length: int = CONTEXT, d_model: int = 64,
                    num_layers: int = 2, end_scale: float = 0.04) -> Path:
    """A model directory with chapter 16's chat tokens, untrained but made to write printable
    ASCII (every other byte token, and every special token but <|end|>, gets a zero embedding,
    so a zero score) and sometimes <|end|>: its greedy text varies with the prompt."""
    text = (ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:6000]
    tokenizer = BPETokenizer.train(text, 300, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=300, context_length=context_length,
                          num_layers=num_layers, num_heads=4, d_model=d_model))
    end = tokenizer.special_tokens[END_OF_TURN]
    with torch.no_grad():
        embedding = model.token_embedding.weight                 # tied to the head
        for i in range(len(tokenizer)):
            if (i in tokenizer.special_tokens.values()
                    or not all(32 <= byte < 127 for byte in tokenizer.token_bytes(i))):
                embedding[i] = 0
        embedding[end] = torch.randn(d_model) * end_scale
    model.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def running(app, *, grace: float | None = None):
    """Serve ``app`` with uvicorn in a thread on a free port of 127.0.0.1; its URL. On leaving,
    uvicorn shuts down as on SIGTERM, waiting ``grace`` seconds (None: as long as it takes)
    for the answers in flight."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=grace))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def serve_model_dir(folder: Path):
    """The engine and app that ``minitransformer serve --model folder`` runs, with ``step``
    recorded (and slowed by ``.delay`` seconds, for the tests that need time)."""
    model, tokenizer = serve_command.load(folder, torch.device("cpu"))
    engine = Engine(model.eval(), tokenizer, max_batch=16, kv_blocks=80)
    app = create_app(engine, tokenizer, model_name=folder.name)
    record = SimpleNamespace(events=[], in_flight=[], delay=0.0, fail=False, engine=engine,
                             tokenizer=tokenizer, app=app, name=folder.name)
    step = engine.step

    def recorded_step():
        record.in_flight.append(app.state.worker.in_flight)
        if record.fail:
            record.fail = False
            raise RuntimeError("a bug in the engine")
        events = step()
        record.events.extend(events)
        time.sleep(record.delay)
        return events

    engine.step = recorded_step
    return record


def cli_generate(folder: Path, prompt: str, max_new_tokens: int, *,
                 skip_special_tokens: bool = False) -> str:
    """What ``python -m minitransformer generate --temperature 0`` writes after the prompt;
    with ``skip_special_tokens``, without the chat tokens (as a completion writes it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["generate", "--model", str(folder), "--prompt", prompt, "--temperature",
                       "0", "--max-new-tokens", str(max_new_tokens), "--device", "cpu"])
    assert status == 0
    written = out.getvalue()
    assert written.startswith(prompt) and written.endswith("\n"), written
    written = written[len(prompt):-1]
    if skip_special_tokens:
        for token in CHAT_TOKENS:
            written = written.replace(token, "")
    return written


def cli_chat(folder: Path, turns: list[str], max_new_tokens: int, *,
             system: str | None = None) -> list[str]:
    """The replies that ``python -m minitransformer chat`` prints for these user turns."""
    out = io.StringIO()
    flags = ["--system", system] if system else []
    stdin = sys.stdin
    sys.stdin = io.StringIO("".join(turn + "\n" for turn in turns))
    try:
        with contextlib.redirect_stdout(out):
            status = main(["chat", "--model", str(folder), "--max-new-tokens",
                           str(max_new_tokens), "--temperature", "0", "--device", "cpu",
                           *flags])
    finally:
        sys.stdin = stdin
    assert status == 0
    replies = out.getvalue().split("\n")
    assert replies[-1] == "" and len(replies) == len(turns) + 1, out.getvalue()
    return replies[:-1]


def greedy_reply_length(folder: Path, ids: list[int], limit: int) -> tuple[int, str]:
    """How many tokens a greedy reply takes, counting the chat token that ends it, and why it
    ends: ("stop") at that token, or ("length") at ``limit`` tokens."""
    tokenizer = BPETokenizer.from_pretrained(folder)
    stops = {tokenizer.special_tokens[t] for t in CHAT_TOKENS}
    new = generate(GPT.from_pretrained(folder), torch.tensor([ids]), limit, temperature=0.0)
    for k, token in enumerate(new[0, len(ids):].tolist()):
        if token in stops:
            return k + 1, "stop"
    return limit, "length"


# ----- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_model_dir(tmp_path_factory.mktemp("served-model"))


@pytest.fixture(scope="module")
def served(model_dir):
    record = serve_model_dir(model_dir)
    with running(record.app) as url:
        record.url = url
        record.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield record
    assert record.engine.num_free_blocks == record.engine.num_blocks


@pytest.fixture(autouse=True)
def no_delay(request):
    yield
    if "served" in request.fixturenames:
        request.getfixturevalue("served").delay = 0.0


def stream_text(stream, *, chat: bool) -> tuple[str, str | None, object]:
    """The text, finish reason and usage of a streamed answer, read chunk by chunk."""
    pieces, reason, usage = [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text = choice.delta.content if chat else choice.text
            pieces.append(text or "")
            reason = choice.finish_reason or reason
    return "".join(pieces), reason, usage


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ----- the endpoints, against the command line -------------------------------------------------

def test_models_lists_the_served_model(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [served.name]
    assert served.client.models.retrieve(served.name).id == served.name
    with pytest.raises(openai.NotFoundError):
        served.client.models.retrieve("gpt-4")


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_model_is_a_404_model_not_found_as_openai_answers(served, stream):
    for create, kwargs in [(served.client.chat.completions.create,
                            {"messages": [{"role": "user", "content": "Hi"}]}),
                           (served.client.completions.create, {"prompt": "Hi"})]:
        with pytest.raises(openai.NotFoundError) as caught:
            create(model="gpt-4", max_tokens=3, stream=stream, **kwargs)
        assert caught.value.status_code == 404
        assert caught.value.body["code"] == "model_not_found"
        assert caught.value.body["param"] == "model" and "gpt-4" in caught.value.body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_greedy_completion_is_what_generate_writes(served, model_dir, stream):
    cases = [("Once upon", 12), ("In the", 20), ("x", 5), ("softmax", 8)]
    for prompt, max_tokens in cases:
        expected = cli_generate(model_dir, prompt, max_tokens, skip_special_tokens=True)
        # generate does not stop at <|end|>: neither does a completion (a chat does); the
        # text leaves the special tokens out, as transformers' decode(skip_special_tokens=True)
        assert (END_OF_TURN in cli_generate(model_dir, prompt, max_tokens)) == (
            prompt == "softmax"), expected
        answer = served.client.completions.create(
            model=served.name, prompt=prompt, max_tokens=max_tokens, temperature=0,
            stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}))
        if stream:
            text, reason, usage = stream_text(answer, chat=False)
        else:
            (choice,) = answer.choices
            text, reason, usage = choice.text, choice.finish_reason, answer.usage
        assert text == expected, (prompt, text, expected)
        assert reason == "length"
        prompt_tokens = len(served.tokenizer.encode(prompt))
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
            prompt_tokens, max_tokens, prompt_tokens + max_tokens)


def test_a_completion_leaves_the_special_tokens_out_as_transformers_decodes(served, model_dir):
    """A completion on a chat model once wrote 'se<|end|>pendendend': a special token's text is
    not the model's text. transformers' decode(skip_special_tokens=True) is the reference."""
    from transformers import AutoTokenizer

    ids = served.tokenizer.encode("softmax")
    new = generate(GPT.from_pretrained(model_dir), torch.tensor([ids]), 8,
                   temperature=0.0)[0, len(ids):].tolist()
    assert served.tokenizer.special_tokens[END_OF_TURN] in new        # <|end|> is written
    expected = AutoTokenizer.from_pretrained(model_dir).decode(new, skip_special_tokens=True)
    for stream in (False, True):
        answer = served.client.completions.create(model=served.name, prompt="softmax",
                                                  max_tokens=8, temperature=0, stream=stream)
        text = stream_text(answer, chat=False)[0] if stream else answer.choices[0].text
        assert text == expected and "<|" not in text, (text, expected)


@pytest.mark.parametrize("stream", [False, True])
def test_a_greedy_chat_is_what_chat_writes_turn_after_turn(served, model_dir, stream):
    system, turns, limit = "Be brief.", ["A story", "Why?", "Hi"], 10
    expected = cli_chat(model_dir, turns, limit, system=system)
    messages = [{"role": "system", "content": system}]
    reasons = []
    for turn, reply in zip(turns, expected):
        messages.append({"role": "user", "content": turn})
        answer = served.client.chat.completions.create(
            model=served.name, messages=messages, max_tokens=limit, temperature=0,
            stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}))
        if stream:
            text, reason, usage = stream_text(answer, chat=True)
        else:
            (choice,) = answer.choices
            assert choice.message.role == "assistant"
            text, reason, usage = choice.message.content, choice.finish_reason, answer.usage
        assert text == reply, (messages, text, reply)
        ids = served.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert usage.prompt_tokens == len(ids)
        # "stop": the model wrote <|end|>, which counts as a token and is not in the text
        assert (usage.completion_tokens, reason) == greedy_reply_length(model_dir, ids, limit)
        reasons.append(reason)
        messages.append({"role": "assistant", "content": text})
    assert reasons == ["length", "length", "stop"]    # both endings are exercised
    # the later replies depend on the conversation: a server that forgot it would differ
    assert cli_chat(model_dir, turns[2:], limit, system=system) != expected[2:]


def test_sixteen_requests_at_once_each_get_the_text_they_get_alone(served, model_dir):
    """Completions and chats, streamed and not, of different lengths, all in flight at once
    (the engine's step is slowed so that they overlap)."""
    jobs = []
    for k, prompt in enumerate(PROMPTS[:8]):
        jobs.append(("completion", prompt, 6 + 3 * k, k % 2 == 0))
    for k, turn in enumerate(TURNS[:8]):
        jobs.append(("chat", turn, 5 + 4 * k, k % 2 == 1))
    expected = [cli_generate(model_dir, what, n, skip_special_tokens=True)
                if kind == "completion" else
                cli_chat(model_dir, [what], n)[0] for kind, what, n, _ in jobs]
    assert len(set(expected)) >= 14, expected          # a mix-up would show
    barrier = threading.Barrier(len(jobs))

    def ask(job) -> str:
        kind, what, n, stream = job
        barrier.wait()
        if kind == "completion":
            answer = served.client.completions.create(
                model=served.name, prompt=what, max_tokens=n, temperature=0, stream=stream)
            return stream_text(answer, chat=False)[0] if stream else answer.choices[0].text
        answer = served.client.chat.completions.create(
            model=served.name, messages=[{"role": "user", "content": what}], max_tokens=n,
            temperature=0, stream=stream)
        return stream_text(answer, chat=True)[0] if stream else answer.choices[0].message.content

    served.delay, served.in_flight[:] = 0.01, []
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(ask, jobs))
    assert got == expected
    assert max(served.in_flight) >= 8, served.in_flight       # they did share steps
    assert wait_until(lambda: served.engine.num_free_blocks == served.engine.num_blocks)


def test_a_seeded_sample_is_the_same_alone_and_among_others(served):
    def ask(seed: int, prompt: str = "The cat") -> str:
        return served.client.completions.create(
            model=served.name, prompt=prompt, max_tokens=12, temperature=1.0, top_p=0.9,
            presence_penalty=0.5, frequency_penalty=0.5, seed=seed).choices[0].text

    alone = ask(3)
    with ThreadPoolExecutor(6) as pool:
        crowd = list(pool.map(lambda k: ask(3 if k % 2 else 10 + k, PROMPTS[k]), range(6)))
    assert ask(3) == alone
    assert [crowd[k] for k in (1, 3, 5)] == [ask(3, PROMPTS[k]) for k in (1, 3, 5)]
    others = {ask(seed) for seed in range(4, 8)}
    assert len(others | {alone}) > 1                    # the seed does change the sample


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_text_before_it(served, model_dir, stream):
    full = cli_generate(model_dir, "Hello", 20)       # 'ooooorerererere...'
    stop = full[7:10]
    assert stop and full.index(stop) < 17
    answer = served.client.completions.create(model=served.name, prompt="Hello",
                                              max_tokens=20, temperature=0, stop=[stop, "@@"],
                                              stream=stream)
    text, reason, _ = (stream_text(answer, chat=False) if stream else
                       (answer.choices[0].text, answer.choices[0].finish_reason, None))
    assert (text, reason) == (full[:full.index(stop)], "stop")


def test_the_stream_is_server_sent_events_ending_with_done(served):
    """The wire format, read raw: ``data: {json}`` events, then ``data: [DONE]``."""
    body = {"model": served.name, "prompt": "Why", "max_tokens": 4, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        raw = reply.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", raw
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


def test_a_lora_adapter_directory_is_served_as_chat_runs_it(model_dir, tmp_path):
    """``serve --model ADAPTER_DIR`` (what finetune --lora-rank writes): the base model with
    the adapter, whose greedy replies are chat's for that directory, not the base's."""
    from minitransformer.lora import add_lora, save_adapter

    model = GPT.from_pretrained(model_dir)
    add_lora(model, r=2, alpha=4.0, targets=["out_proj", "linear1", "linear2"])
    torch.manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)              # B = 0 would change nothing
    adapter = tmp_path / "adapter"
    save_adapter(model, adapter, base_model_name_or_path=str(model_dir))
    BPETokenizer.from_pretrained(model_dir).save_pretrained(adapter)
    turns = ["Hello there", "Why?", "Hi", "Tell me more"]
    expected = [cli_chat(adapter, [turn], 8)[0] for turn in turns]
    assert expected != [cli_chat(model_dir, [turn], 8)[0] for turn in turns]
    record = serve_model_dir(adapter)
    with running(record.app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = [client.chat.completions.create(
            model="adapter", messages=[{"role": "user", "content": turn}], max_tokens=8,
            temperature=0).choices[0].message.content for turn in turns]
    assert got == expected


# ----- refusals --------------------------------------------------------------------------------

BAD_CHATS = [
    ({"model": None}, "model", "missing"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "robot"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "string"),
    ({"messages": [{"role": "user", "content": "a <|end|> b"}]}, "messages", "<|end|>"),
    ({"max_tokens": CONTEXT}, "max_tokens", "context"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
    ({"temperature": -0.5}, "temperature", "-0.5"),
    ({"top_p": 0}, "top_p", "top_p"),
    ({"presence_penalty": 3}, "presence_penalty", "presence_penalty"),
    ({"n": 0}, "n", "at least 1"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "at most 20"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "1 to 4"),
    ({"seed": "7"}, "seed", "integer"),
    ({"seed": 2**64}, "seed", "at most"),
    ({"max_completion_tokens": 3, "max_tokens": -1}, "max_tokens", "at least 1"),
    ({"max_completion_tokens": -1, "max_tokens": 3}, "max_completion_tokens", "at least 1"),
    ({"user": ["a", "list"]}, "user", "string"),
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"messages": {"role": "user", "content": "Hi"}}, "messages", "list"),
    ({"messages": [{"role": "user", "content": "Hi", "name": "ann"}]}, "messages[0]",
     "role and content"),
    ({"logprobs": 1}, "logprobs", "true or false"),
    ({"messages": [{"role": "user", "content": "the cat sat " * 30}]}, "messages",
     "context"),
]


@pytest.mark.parametrize("change, param, words", BAD_CHATS, ids=[b[1] for b in BAD_CHATS])
def test_a_bad_chat_request_is_a_400_with_openai_s_error(served, change, param, words):
    request = {"model": served.name, "messages": [{"role": "user", "content": "Hi"}],
               **change}
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.chat.completions.create(**request)
    error = caught.value
    assert error.status_code == 400
    assert set(error.body) == {"message", "type", "param", "code"}
    assert error.body["type"] == "invalid_request_error"
    assert error.body["param"] == param and words in error.body["message"], error.body


BAD_COMPLETIONS = [
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": ["a", 1]}, "prompt", "a list of strings"),
    ({"prompt": ["a", ""]}, "prompt[1]", "empty"),
    ({"prompt": [[1, 2], [400]]}, "prompt[1]", "outside the vocabulary"),
    ({"prompt": ["a"] * 65, "n": 2}, "prompt", "at most 128"),
    ({"prompt": "the cat sat " * 30}, "prompt", "context"),
    ({"max_tokens": CONTEXT - 1}, "max_tokens", "at most"),
    ({"temperature": "hot"}, "temperature", "number"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"echo": 1}, "echo", "true or false"),
    ({"logprobs": 6}, "logprobs", "at most 5"),
    ({"logprobs": True}, "logprobs", "integer"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"best_of": 3}, "best_of", "not supported"),
]


@pytest.mark.parametrize("change, param, words", BAD_COMPLETIONS,
                         ids=[b[1] for b in BAD_COMPLETIONS])
def test_a_bad_completion_request_is_a_400_with_openai_s_error(served, change, param, words):
    request = {"model": served.name, "prompt": "The cat", **change}
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.completions.create(**request)
    assert caught.value.body["param"] == param and words in caught.value.body["message"], \
        caught.value.body


def test_an_unknown_parameter_is_refused_by_name(served):
    with pytest.raises(openai.BadRequestError) as caught:
        served.client.completions.create(model=served.name, prompt="x",
                                         extra_body={"temprature": 0})
    assert caught.value.body["param"] == "temprature"


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_a_400(served, body):
    # the openai client always sends JSON: this one request is written by hand
    for path in ("/v1/chat/completions", "/v1/completions"):
        reply = httpx.post(served.url + path, content=body, timeout=30,
                           headers={"Content-Type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_that_is_not_finite_is_a_400(served, value):
    # Python's json module reads these (the openai client refuses to write them)
    body = f'{{"model": "{served.name}", "prompt": "x", "top_p": {value}}}'
    reply = httpx.post(served.url + "/v1/completions", content=body.encode(), timeout=30,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "top_p", reply.text


@pytest.mark.parametrize("path, field", [("/v1/completions", '"prompt": "\\ud800 hi"'),
                                          ("/v1/chat/completions", '"messages": [{"role": '
                                           '"user", "content": "\\ud800"}]')])
def test_a_lone_surrogate_is_a_400_not_a_500(served, path, field):
    # JSON may escape half of a UTF-16 pair, which no UTF-8 text holds (review of chapter 18:
    # the completions endpoint answered 500); the openai client cannot write it
    body = f'{{"model": "{served.name}", {field}, "max_tokens": 3}}'
    reply = httpx.post(served.url + path, content=body.encode(), timeout=30,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_fastapi_s_own_validation_errors_are_400s_too(served):
    """A route with typed parameters (422 in FastAPI) answers as the API's routes do."""
    from fastapi.testclient import TestClient

    app = create_app(served.engine, served.tokenizer, model_name="probe")

    @app.get("/probe")
    async def probe(count: int) -> dict:
        return {"count": count}

    reply = TestClient(app).get("/probe", params={"count": "many"})   # no lifespan: no worker
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "query.count"
    assert TestClient(app).get("/nowhere").json()["error"]["code"] == "not_found"


def test_create_app_refuses_what_it_cannot_serve(served):
    engine, tokenizer = served.engine, served.tokenizer
    for args, kwargs, error, words in [
            ((engine.model, tokenizer), {"model_name": "m"}, TypeError, "engine"),
            ((engine, "gpt2"), {"model_name": "m"}, TypeError, "tokenizer"),
            ((engine, tokenizer), {"model_name": 3}, TypeError, "model_name"),
            ((engine, tokenizer), {"model_name": " "}, ValueError, "model_name")]:
        with pytest.raises(error, match=words):
            create_app(*args, **kwargs)


def test_a_model_without_the_chat_tokens_serves_completions_and_refuses_chats_twice():
    from fastapi.testclient import TestClient

    tokenizer = BPETokenizer.train("the cat sat on the mat " * 20, 262, pattern=GPT2_PATTERN)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), context_length=16, num_layers=1,
                          num_heads=2, d_model=8))
    app = create_app(Engine(model, tokenizer, kv_blocks=4), tokenizer, model_name="base")
    for _ in range(2):                                 # an app may be served, stopped, again
        with TestClient(app) as http:                  # runs the lifespan: the worker
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                                   max_retries=0, http_client=http)
            answer = client.completions.create(model="base", prompt="the cat", max_tokens=4)
            assert answer.choices[0].finish_reason == "length"
            assert answer.usage.completion_tokens == 4
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="base",
                                               messages=[{"role": "user", "content": "hi"}])
            assert caught.value.body["code"] == "model_not_supported"


def test_after_the_refusals_the_server_still_answers_and_no_block_is_held(served):
    assert served.engine.num_free_blocks == served.engine.num_blocks
    answer = served.client.completions.create(model=served.name, prompt="x", max_tokens=3,
                                              temperature=0)
    assert answer.choices[0].finish_reason == "length"


# ----- clients that leave -----------------------------------------------------------------------

def _finish_of(served, request_id: int) -> str | None:
    return next((e.finish_reason for e in served.events
                 if e.request_id == request_id and e.finish_reason), None)


def _new_request_id(served, before: int) -> int:
    assert wait_until(lambda: any(e.request_id not in before for e in served.events))
    return next(e.request_id for e in served.events if e.request_id not in before)


def test_a_client_that_leaves_mid_stream_frees_its_blocks(served):
    engine, before = served.engine, {e.request_id for e in served.events}
    served.delay = 0.02                        # 55 tokens would take more than a second
    stream = served.client.completions.create(model=served.name, prompt="Once upon",
                                              max_tokens=55, temperature=0, stream=True)
    chunks = iter(stream)
    next(chunks), next(chunks)
    request_id = _new_request_id(served, before)
    assert engine.num_free_blocks < engine.num_blocks           # it holds blocks now
    stream.close()                                             # the client leaves
    assert wait_until(lambda: engine.num_free_blocks == engine.num_blocks, 5)
    assert _finish_of(served, request_id) == "cancelled"
    assert sum(e.request_id == request_id for e in served.events) < 30


def test_a_client_that_leaves_before_a_whole_answer_frees_its_blocks(served):
    engine, before = served.engine, {e.request_id for e in served.events}
    served.delay = 0.02
    impatient = served.client.with_options(timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=served.name, max_tokens=40, temperature=0,
                                          messages=[{"role": "user", "content": "Why?"}])
    request_id = _new_request_id(served, before)
    assert wait_until(lambda: engine.num_free_blocks == engine.num_blocks, 5)
    assert _finish_of(served, request_id) == "cancelled"


def test_a_shutdown_out_of_patience_cancels_the_answers_in_flight_and_frees_their_blocks(
        model_dir):
    record = serve_model_dir(model_dir)
    record.delay = 0.05                                 # 55 tokens: about 3 s
    with running(record.app, grace=0.3) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model=record.name, prompt="Once upon",
                                           max_tokens=55, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)
        assert record.engine.num_free_blocks < record.engine.num_blocks
    # the server has stopped: the answer was cut, and the engine gave its blocks back
    assert record.engine.num_free_blocks == record.engine.num_blocks
    assert [e.finish_reason for e in record.events if e.finish_reason] == ["cancelled"]
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(chunks)


# ----- a failure inside -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_failure_is_a_500_not_a_hang_and_the_server_goes_on(served, stream):
    served.fail = True
    request = {"model": served.name, "prompt": "Why", "max_tokens": 5, "temperature": 0}
    if stream:
        with httpx.stream("POST", f"{served.url}/v1/completions", timeout=30,
                          json={**request, "stream": True}) as reply:
            events = reply.read().decode().split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        error = json.loads(events[-3].removeprefix("data: "))["error"]
        assert error["type"] == "server_error" and "engine failed" in error["message"]
    else:
        with pytest.raises(openai.InternalServerError) as caught:
            served.client.completions.create(**request)
        assert "engine failed" in caught.value.body["message"]
    assert served.client.completions.create(**request).choices[0].finish_reason == "length"
    assert wait_until(lambda: served.engine.num_free_blocks == served.engine.num_blocks)
