"""The server under hostile or heavy use (chapter 18; issues 40 and 43), with raw HTTP and the
official ``openai`` client.

No request gets a 500: a body nested 100,000 deep, numbers of 400 digits, bodies of 10 MB. No
request holds up the others: the size is checked before anything is parsed or tokenized, and
tokenizing runs off the event loop. A full queue answers 503 with ``Retry-After``; a model
whose scores turn NaN answers an error the client can read. Beside OpenAI's routes: /health,
/metrics (Prometheus' text format, read with ``prometheus_client``'s parser), /tokenize and
/detokenize (vLLM's names and fields), an API key, and CORS.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

fastapi = pytest.importorskip("fastapi", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx", reason="the openai client's httpx is not installed")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import minitransformer.server as server_module  # noqa: E402
from minitransformer.chat import END_OF_TURN  # noqa: E402
from minitransformer.server import create_app  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402
from test_server import build_model_dir, running, serve_model_dir, wait_until  # noqa: E402

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("limits-model"))


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


def post(url: str, body: bytes | str, **kwargs) -> httpx.Response:
    return httpx.post(url, content=body, timeout=60,
                      headers={"Content-Type": "application/json"}, **kwargs)


def assert_openai_error(reply: httpx.Response, status: int, code: str) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return error


# ----- no 500, ever --------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [100_000, 30_000, 40])
def test_a_body_nested_deep_is_a_400_not_a_recursion_error(served, depth):
    deep = "[" * depth + "]" * depth
    bodies = {"/v1/chat/completions": deep, "/v1/completions": deep,
              "user": f'{{"model": "{served.name}", "prompt": "x", "user": {deep}}}'}
    for where, body in bodies.items():
        reply = post(served.url + ("/v1/completions" if where == "user" else where), body)
        # 100,000 deep is also past the body's size limit: either refusal, never a 500
        assert reply.status_code in (400, 413), (where, reply.text)
        if depth < 100_000:
            assert "nested" in assert_openai_error(reply, 400, "invalid_json")["message"]


def test_messages_nested_within_the_limit_are_answered(served):
    body = {"model": served.name, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert post(served.url + "/v1/chat/completions", json.dumps(body)).status_code == 200


@pytest.mark.parametrize("name", ["temperature", "top_p", "presence_penalty",
                                  "frequency_penalty"])
@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_of_400_digits_is_a_400_not_an_overflow_error(served, name, sign):
    for path, field in [("/v1/completions", '"prompt": "x"'),
                        ("/v1/chat/completions", f'"messages": {json.dumps(HI)}')]:
        body = f'{{"model": "{served.name}", {field}, "{name}": {sign}{"9" * 400}}}'
        error = assert_openai_error(post(served.url + path, body), 400, "invalid_value")
        assert error["param"] == name and len(error["message"]) < 200, error


@pytest.mark.parametrize("name", ["seed", "max_tokens", "n"])
def test_a_huge_integer_option_is_refused_in_a_short_message(served, name):
    body = f'{{"model": "{served.name}", "prompt": "x", "{name}": {"9" * 400}}}'
    reply = post(served.url + "/v1/completions", body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == name, reply.text
    assert len(reply.json()["error"]["message"]) < 300


# ----- one request does not hold up the others -------------------------------------------------

def timed_small_request(served) -> float:
    start = time.perf_counter()
    answer = served.client.completions.create(model=served.name, prompt="x", max_tokens=3,
                                              temperature=0)
    assert answer.usage.completion_tokens == 3
    return time.perf_counter() - start


def test_bodies_of_10_mb_are_refused_by_size_and_hold_up_no_one(served):
    """Four 10 MB bodies were each tokenized before the length check, and a 3-token request
    waited 4.1 s behind them (0.05 s alone)."""
    alone = min(timed_small_request(served) for _ in range(3))
    big = json.dumps({"model": served.name, "prompt": "the cat sat " * 900_000})
    assert len(big) > 10_000_000
    barrier = threading.Barrier(5)

    def send_big(_):
        barrier.wait()
        return post(served.url + "/v1/completions", big)

    def send_small():
        barrier.wait()
        time.sleep(0.05)                    # the big bodies are on their way
        return timed_small_request(served)

    with ThreadPoolExecutor(5) as pool:
        bigs = [pool.submit(send_big, k) for k in range(4)]
        small = pool.submit(send_small)
        replies = [f.result() for f in bigs]
        took = small.result()
    for reply in replies:
        assert "10,000" not in reply.text
        assert_openai_error(reply, 413, "request_too_large")
    assert took < max(2.0, 10 * alone), (took, alone)


def test_a_prompt_too_long_by_its_bytes_is_refused_before_it_is_tokenized(served, monkeypatch):
    calls = []
    encode = served.tokenizer.encode
    monkeypatch.setattr(served.tokenizer, "encode", lambda *a, **k: calls.append(a) or encode(
        *a, **k))
    reply = post(served.url + "/v1/completions",
                 json.dumps({"model": served.name, "prompt": "the cat " * 2000}))
    error = assert_openai_error(reply, 400, "context_length_exceeded")
    assert "at least" in error["message"] and calls == []
    reply = post(served.url + "/v1/chat/completions", json.dumps(
        {"model": served.name, "messages": [{"role": "user", "content": "a b " * 2000}]}))
    assert_openai_error(reply, 400, "context_length_exceeded")
    assert calls == []


def test_tokenizing_runs_off_the_event_loop(served, monkeypatch):
    """A prompt that takes 4 s to tokenize (a long one of a large model) leaves the server
    free to answer a 3-token request meanwhile."""
    encode = served.tokenizer.encode

    def slow_encode(text, *args, **kwargs):
        if text.startswith("SLOW"):
            time.sleep(4.0)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(served.tokenizer, "encode", slow_encode)
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(served.client.completions.create, model=served.name,
                           prompt="SLOW x", max_tokens=2, temperature=0)
        time.sleep(0.3)
        took = timed_small_request(served)
        assert not slow.done()                        # the slow one is still tokenizing
        assert slow.result().usage.completion_tokens == 2
    assert took < 3.0, took


# ----- the queue -----------------------------------------------------------------------------

def test_past_max_queue_the_server_answers_503_with_retry_after(model_dir):
    record = serve_model_dir(model_dir)
    engine = Engine(record.engine.model, record.tokenizer, max_batch=2, kv_blocks=80)
    app = create_app(engine, record.tokenizer, model_name="m", max_queue=2)
    step = engine.step
    engine.step = lambda: (time.sleep(0.05), step())[1]       # 40 tokens: about 2 s
    with running(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        streams = [client.completions.create(model="m", prompt="Once upon", max_tokens=40,
                                             temperature=0, stream=True) for _ in range(4)]
        for kind in ("completion", "chat"):
            with pytest.raises(openai.APIStatusError) as caught:
                if kind == "chat":
                    client.chat.completions.create(model="m", messages=HI, max_tokens=2)
                else:
                    client.completions.create(model="m", prompt="x", max_tokens=2)
            assert caught.value.status_code == 503
            assert caught.value.response.headers["retry-after"] == "1"
            assert caught.value.body["code"] == "server_busy"
        raw = post(url + "/v1/completions", json.dumps({"model": "m", "prompt": "x"}))
        assert_openai_error(raw, 503, "server_busy")
        texts = ["".join(c.choices[0].text for c in stream) for stream in streams]
        assert len(set(texts)) == 1 and texts[0]          # the four accepted ones all finish
        # once they are done, the queue takes requests again
        assert client.completions.create(model="m", prompt="x", max_tokens=2).usage
    assert engine.num_free_blocks == engine.num_blocks


def test_200_concurrent_requests_are_not_all_accepted(model_dir):
    record = serve_model_dir(model_dir)
    app = create_app(record.engine, record.tokenizer, model_name="m")
    step = record.engine.step
    record.engine.step = lambda: (time.sleep(0.05), step())[1]      # 20 tokens: 1 s
    barrier = threading.Barrier(200)
    with running(app) as url:
        def ask(_):
            barrier.wait()
            return post(url + "/v1/completions", json.dumps(
                {"model": "m", "prompt": "x", "max_tokens": 20, "temperature": 0})).status_code

        with ThreadPoolExecutor(200) as pool:
            statuses = list(pool.map(ask, range(200)))
    assert set(statuses) == {200, 503}, statuses
    assert statuses.count(200) >= 16 + server_module.MAX_QUEUE


# ----- a model whose scores are not numbers ----------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_nan_scores_end_the_answer_with_an_error_the_client_reads(model_dir, stream):
    record = serve_model_dir(model_dir)
    with running(record.app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with torch.no_grad():                      # broken after the engine was made
            record.engine.model.token_embedding.weight[5] = float("nan")
        if stream:
            with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
                    "model": record.name, "prompt": "x", "max_tokens": 5,
                    "stream": True}) as reply:
                assert reply.status_code == 200
                events = reply.read().decode().split("\n\n")
            error = json.loads(events[-3].removeprefix("data: "))["error"]
            assert events[-2] == "data: [DONE]"
        else:
            with pytest.raises(openai.UnprocessableEntityError) as caught:
                client.completions.create(model=record.name, prompt="x", max_tokens=5,
                                          temperature=0)
            error = caught.value.body
        assert error["code"] == "non_finite_scores" and "NaN" in error["message"], error
    assert record.engine.num_free_blocks == record.engine.num_blocks


# ----- health, metrics, tokens -----------------------------------------------------------------

def test_health_is_200_while_the_engine_runs_and_503_before_and_after(model_dir):
    from fastapi.testclient import TestClient

    record = serve_model_dir(model_dir)
    app = record.app
    reply = TestClient(app).get("/health")                # no lifespan: not started
    assert (reply.status_code, reply.json()) == (503, {"status": "starting"})
    with TestClient(app) as http:
        reply = http.get("/health")
        assert (reply.status_code, reply.json()) == (200, {"status": "ok"})
        app.state.worker.draining = True                  # what SIGTERM sets
        reply = http.get("/health")
        assert (reply.status_code, reply.json()) == (503, {"status": "stopping"})
        assert http.post("/v1/completions", json={"model": record.name, "prompt": "x"}
                         ).status_code == 503
    reply = TestClient(app).get("/health")
    assert (reply.status_code, reply.json()) == (503, {"status": "stopping"})


def metrics(url: str) -> dict:
    reply = httpx.get(url + "/metrics", timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(reply.text)}


def value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    family = families[name]
    sample = sample or name
    return next(s.value for s in family.samples
                if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_requests_tokens_blocks_and_latencies(model_dir):
    record = serve_model_dir(model_dir)
    with running(record.app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        before = metrics(url)
        assert {f.type for f in before.values()} == {"gauge", "counter", "histogram"}
        assert value(before, "minitransformer_generation_tokens", "minitransformer_"
                     "generation_tokens_total") == 0
        tokens = sum(client.completions.create(model=record.name, prompt=p, max_tokens=n,
                                               temperature=0).usage.completion_tokens
                     for p, n in [("x", 5), ("Hello", 7), ("The cat", 3)])
        record.delay = 0.05
        stream = client.completions.create(model=record.name, prompt="Once upon",
                                           max_tokens=30, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)
        during = metrics(url)
        assert value(during, "minitransformer_requests_running") == 1
        assert value(during, "minitransformer_requests_waiting") == 0
        used = value(during, "minitransformer_kv_blocks_used")
        assert used >= 1 and used + value(during, "minitransformer_kv_blocks_free") == 80
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"
        assert wait_until(lambda: value(metrics(url), "minitransformer_kv_blocks_used") == 0)
        after = metrics(url)
    total = tokens + 30
    assert value(after, "minitransformer_generation_tokens",
                 "minitransformer_generation_tokens_total") == total
    assert value(after, "minitransformer_requests", "minitransformer_requests_total") == 4
    ttft = "minitransformer_time_to_first_token_seconds"
    itl = "minitransformer_inter_token_latency_seconds"
    assert value(after, ttft, ttft + "_count") == 4
    assert value(after, itl, itl + "_count") == total - 4
    assert value(after, itl, itl + "_bucket", le="+Inf") == total - 4
    # the stream's 29 gaps are at least its 50 ms steps
    assert value(after, itl, itl + "_bucket", le="0.025") <= total - 4 - 29
    assert value(after, itl, itl + "_sum") >= 29 * 0.05


def test_time_to_first_token_counts_from_the_request_s_arrival(model_dir, monkeypatch):
    """The TTFT histogram starts when the request arrives, so a prompt that takes 0.5 s to
    tokenize counts those 0.5 s (the client waited them too)."""
    record = serve_model_dir(model_dir)
    encode = record.tokenizer.encode

    def slow_encode(text, *args, **kwargs):
        time.sleep(0.5)
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(record.tokenizer, "encode", slow_encode)
    with running(record.app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        client.completions.create(model=record.name, prompt="x", max_tokens=2, temperature=0)
        after = metrics(url)
    ttft = "minitransformer_time_to_first_token_seconds"
    assert value(after, ttft, ttft + "_count") == 1
    assert value(after, ttft, ttft + "_sum") >= 0.5


def test_tokenize_and_detokenize_as_vllm_names_them(served):
    tokenizer = served.tokenizer
    reply = httpx.post(served.url + "/tokenize", json={"model": served.name,
                                                       "prompt": "Hello there"}).json()
    ids = tokenizer.encode("Hello there")
    assert reply == {"count": len(ids), "max_model_len": 64, "tokens": ids}
    long = "the cat " * 2000        # past the context: an evaluation scores it in windows
    reply = httpx.post(served.url + "/tokenize", json={"prompt": long}).json()
    assert reply["tokens"] == tokenizer.encode(long) and reply["count"] > 64
    reply = httpx.post(served.url + "/tokenize", json={"messages": HI}).json()
    assert reply["tokens"] == tokenizer.apply_chat_template(HI, add_generation_prompt=True)
    reply = httpx.post(served.url + "/tokenize", json={"messages": HI,
                                                       "add_generation_prompt": False}).json()
    assert reply["tokens"] == tokenizer.apply_chat_template(HI)
    end = tokenizer.special_tokens[END_OF_TURN]
    reply = httpx.post(served.url + "/detokenize", json={"tokens": [*ids, end]}).json()
    assert reply == {"prompt": "Hello there" + END_OF_TURN}
    for path, body, status, code in [
            ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model_not_found"),
            ("/tokenize", {"prompt": 3}, 400, "invalid_type"),
            ("/tokenize", {"prompt": "x", "stream": True}, 400, "unknown_parameter"),
            ("/tokenize", {"prompt": "the cat " * 100_000}, 413, "request_too_large"),
            ("/detokenize", {"tokens": [1, 300]}, 400, "invalid_value"),
            ("/detokenize", {"tokens": "abc"}, 400, "invalid_type"),
            ("/detokenize", {"tokens": [1, True]}, 400, "invalid_type")]:
        assert_openai_error(httpx.post(served.url + path, json=body), status, code)


# ----- an API key, and CORS --------------------------------------------------------------------

def test_with_an_api_key_every_v1_route_asks_for_it(model_dir, monkeypatch):
    record = serve_model_dir(model_dir)
    app = create_app(record.engine, record.tokenizer, model_name="m", api_key="s3cret-key")
    compared = []
    compare = server_module.hmac.compare_digest
    monkeypatch.setattr(server_module.hmac, "compare_digest",
                        lambda a, b: compared.append(1) or compare(a, b))
    with running(app) as url:
        good = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret-key", max_retries=0)
        assert good.models.list().data[0].id == "m"
        assert good.chat.completions.create(model="m", messages=HI, max_tokens=2).usage
        assert good.completions.create(model="m", prompt="x", max_tokens=2).usage
        assert compared                                 # checked in constant time
        bad = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret-kez", max_retries=0)
        for call in (lambda: bad.models.list(), lambda: bad.models.retrieve("m"),
                     lambda: bad.completions.create(model="m", prompt="x", max_tokens=2),
                     lambda: bad.chat.completions.create(model="m", messages=HI)):
            with pytest.raises(openai.AuthenticationError) as caught:
                call()
            assert caught.value.status_code == 401
            assert set(caught.value.body) == {"message", "type", "param", "code"}
            assert caught.value.body["code"] == "invalid_api_key"
            assert "s3cret" not in caught.value.body["message"]
        for headers in ({}, {"Authorization": "s3cret-key"}, {"Authorization": "Bearer"},
                        {"Authorization": "Basic s3cret-key"}):
            reply = httpx.get(url + "/v1/models", headers=headers)
            assert_openai_error(reply, 401, "invalid_api_key")
            assert reply.headers["www-authenticate"] == "Bearer"
        # outside /v1: the page, health, metrics and tokens (as vLLM)
        for path in ("/", "/health", "/metrics"):
            assert httpx.get(url + path).status_code == 200, path
    assert record.engine.num_free_blocks == record.engine.num_blocks


def test_cors_is_off_by_default_and_on_for_the_allowed_origins(model_dir, served):
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    reply = httpx.options(served.url + "/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in reply.headers
    reply = httpx.get(served.url + "/v1/models", headers={"Origin": "http://localhost:3000"})
    assert reply.status_code == 200 and "access-control-allow-origin" not in reply.headers

    record = serve_model_dir(model_dir)
    app = create_app(record.engine, record.tokenizer, model_name="m",
                     allowed_origins=["http://localhost:3000"])
    with running(app) as url:
        reply = httpx.options(url + "/v1/chat/completions", headers=preflight)
        assert reply.status_code == 200
        assert reply.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "authorization" in reply.headers["access-control-allow-headers"].lower()
        reply = httpx.get(url + "/v1/models", headers={"Origin": "http://localhost:3000"})
        assert reply.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = httpx.options(url + "/v1/chat/completions",
                              headers={**preflight, "Origin": "http://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "http://evil.example"


def test_create_app_refuses_bad_options(served):
    engine, tokenizer = served.engine, served.tokenizer
    for kwargs, error, words in [
            ({"max_queue": -1}, ValueError, "max_queue"),
            ({"max_queue": 1.5}, TypeError, "max_queue"),
            ({"api_key": ""}, ValueError, "api_key"),
            ({"api_key": 3}, TypeError, "api_key"),
            ({"allowed_origins": "http://a"}, TypeError, "allowed_origins"),
            ({"max_body_bytes": 0}, ValueError, "max_body_bytes")]:
        with pytest.raises(error, match=words):
            create_app(engine, tokenizer, model_name="m", **kwargs)


def test_stop_token_ids_end_a_completion_as_vllm_s_do(served):
    from minitransformer.generation import generate

    ids = served.tokenizer.encode("Hello there")
    new = generate(served.engine.model, torch.tensor([ids]), 6, temperature=0.0)[0, len(ids):]
    new = new.tolist()
    body = {"model": served.name, "prompt": ids, "max_tokens": 6, "temperature": 0}
    (choice,) = httpx.post(served.url + "/v1/completions", json=body).json()["choices"]
    assert (choice["text"], choice["finish_reason"]) == (served.tokenizer.decode(new),
                                                         "length")
    reply = httpx.post(served.url + "/v1/completions", timeout=60,
                       json={**body, "stop_token_ids": [new[0]]}).json()
    (choice,) = reply["choices"]
    assert choice["text"] == "" and choice["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == 1      # the stop token, which writes nothing
    for wrong in ([len(served.tokenizer) + 5], "7", [True]):
        assert_openai_error(httpx.post(served.url + "/v1/completions", timeout=60,
                                       json={**body, "stop_token_ids": wrong}),
                            400, "invalid_value")
