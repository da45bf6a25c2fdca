"""An OpenAI-compatible HTTP server over the continuous-batching engine (chapter 18).

The HTTP layer is thin: it checks a request, turns it into token ids (the model's chat
template for ``/v1/chat/completions``: chapter 16's, or a model's own Jinja template such as
SmolLM2's ChatML; the tokenizer for ``/v1/completions``), hands a
:class:`~minitransformer.serving.Request` to the :class:`~minitransformer.serving.Engine`, and
turns the engine's events back into OpenAI's JSON, whole or streamed as server-sent events
(``data: {...}`` lines, the last one ``data: [DONE]``). One worker thread calls
``engine.step()`` while there is work; each request waits on its own queue of events, so many
requests share every forward pass.

``/v1/completions`` takes a string, a list of strings, a list of token ids or a list of lists
of them; with ``n``, each prompt gets ``n`` choices (both endpoints), choice ``j`` seeded with
``seed + j``. A request's choices enter the engine together, so they run as one batch.
``logprobs`` (chat: ``logprobs`` and ``top_logprobs`` up to 20; completions: ``logprobs`` up to
5, and ``echo``, which with ``max_tokens: 0`` gives the prompt's own) are the model's raw
log-probabilities, ``log_softmax`` of its scores before temperature and penalties, as vLLM
gives them.

A bad request gets HTTP 400 and OpenAI's error JSON, ``{"error": {"message", "type", "param",
"code"}}``, before anything is generated (404 for a model it does not serve, 413 for a body
past its size, 503 with ``Retry-After`` when ``max_queue`` requests wait already). A client
that goes away is cancelled in the engine, which frees its cache blocks. Nothing one request
does blocks the others: the body's size is checked as it arrives, a prompt's length is bounded
from its bytes before it is tokenized, and tokenizing runs in a thread.

Beside OpenAI's routes: ``GET /health`` (200 while the engine runs), ``GET /metrics``
(Prometheus' text format), ``POST /tokenize`` and ``/detokenize`` (as vLLM names them). With
``api_key``, every ``/v1`` route asks for ``Authorization: Bearer KEY``; ``allowed_origins``
lets pages of those origins call the API (CORS). The engine's LoRA adapters are models of their
own names: a request's ``model`` chooses the base or an adapter.

``python -m minitransformer serve`` (:mod:`minitransformer.cli.serve`) runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse

from minitransformer import chat as chat_format
from minitransformer.chat import ROLE_TOKENS
from minitransformer._checks import check_int, check_type
from minitransformer.serving import Engine
from minitransformer.serving import Request as EngineRequest

__all__ = ["create_app"]

log = logging.getLogger("minitransformer.server")

#: Parameters of OpenAI's API that this server has no use for, accepted at these values only
#: (what a client sends when it means "off"); any other value is refused by name.
NEUTRAL = {"user": str,
           "logit_bias": (None, {}), "best_of": (None, 1),
           "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
           "response_format": (None, {"type": "text"}), "parallel_tool_calls": None,
           "store": (None, False), "metadata": None, "service_tier": None}
SAMPLING = ("max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
            "frequency_penalty", "n", "stream", "stream_options", "model")
CHAT_FIELDS = {"messages", "max_completion_tokens", "logprobs", "top_logprobs", *SAMPLING}
COMPLETION_FIELDS = {"prompt", "logprobs", "echo", "stop_token_ids", *SAMPLING}
#: The most alternatives per token that ``top_logprobs`` (chat) and ``logprobs``
#: (completions) may ask for, as OpenAI's API allows.
MAX_TOP_LOGPROBS = {"chat": 20, "completions": 5}
#: The most choices one request may ask for (``n`` times the prompts).
MAX_CHOICES = 128
#: The deepest a request's JSON may nest (OpenAI's requests need 5 levels).
MAX_DEPTH = 32
#: Requests that may wait for a row of the batch, past those that run, by default.
MAX_QUEUE = 64
#: The seconds a client is asked to wait (``Retry-After``) when the queue is full.
RETRY_AFTER = 1


class OpenAIError(Exception):
    """A request the server refuses: HTTP ``status`` with OpenAI's error JSON."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (
            message, param, code, status, kind)
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, param=self.param, code=self.code,
                              kind=self.kind, headers=self.headers)


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


def _model_not_found(name: object, served: Sequence[str]) -> OpenAIError:
    return OpenAIError(f"the model {_show(name)} does not exist: this server serves "
                       f"{', '.join(map(json.dumps, served))}", param="model",
                       code="model_not_found", status=404)


def _show(value: object, limit: int = 80) -> str:
    """A value of a request, as JSON, cut at ``limit`` characters (a number of 400 digits or a
    whole book in an error message helps nobody)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):   # ints past Python's digit limit, deep nesting
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----- metrics -------------------------------------------------------------------------------

class _Histogram:
    """A Prometheus histogram: counts of observations at or below each bound."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)      # the last: above every bound
        self.total, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip([*self.bounds, math.inf], self.counts):
            running += count
            le = "+Inf" if bound == math.inf else repr(float(bound))
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return out + [f"{name}_sum {self.total!r}", f"{name}_count {self.count}"]


LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                  0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


# ----- one worker thread steps the engine ---------------------------------------------------

class _Worker:
    """Calls ``engine.step()`` in a thread of its own while the engine has work, and hands each
    event to the queue of its request (on the event loop that submitted it)."""

    def __init__(self, engine, max_queue: int) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._lock = threading.Lock()     # a request's queue is known before its first event
        self._wake = threading.Event()
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self.draining = False             # the server stops: no new request is taken
        self._thread: threading.Thread | None = None
        # metrics: when each request was sent or wrote its last token
        self._last: dict[int, tuple[float, bool]] = {}
        self.tokens = self.requests = 0
        self.ttft = _Histogram(LATENCY_BOUNDS)
        self.itl = _Histogram(LATENCY_BOUNDS)

    @property
    def not_started(self) -> bool:
        return self._thread is None

    @property
    def serving(self) -> bool:
        """Whether the engine's thread runs and takes requests."""
        return (self._thread is not None and self._thread.is_alive() and not self._stopping
                and not self.draining)

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    def start(self) -> None:
        """Start the thread (again, when the app is served again after a stop)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the app is being served already: one server per app")
        self._stopping = self.draining = False
        self._thread = threading.Thread(target=self._run, name="minitransformer-engine",
                                        daemon=True)
        self._thread.start()

    def submit(self, requests: Sequence[EngineRequest], arrived: float | None = None
               ) -> tuple[list[int], asyncio.Queue]:
        """Queue the requests of one HTTP request (its choices) together, so that they are
        admitted in the same step and run as a batch; their ids, and the queue that gets all
        their events. ``arrived``: when the HTTP request came (``time.perf_counter()``), from
        which its time to first token counts (default: now)."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        limit = self.engine.max_batch + self.max_queue
        if len(requests) > limit:
            raise OpenAIError(f"the request asks for {len(requests)} choices (n times the "
                              f"prompts); this server takes at most {limit} at once",
                              param="n", code="invalid_value")
        with self._lock:
            if self._stopping or self.draining:
                raise OpenAIError("the server is shutting down", status=503,
                                  kind="server_error", code="shutting_down")
            if len(self._queues) + len(requests) > limit:
                raise OpenAIError(
                    f"the server is busy: {self.engine.max_batch} requests run and "
                    f"{self.max_queue} wait already; try again shortly", status=503,
                    kind="server_error", code="server_busy",
                    headers={"Retry-After": str(RETRY_AFTER)})
            ids: list[int] = []
            try:
                for request in requests:
                    ids.append(self.engine.submit(request))
            except ValueError as exc:       # longer than the context, or than the whole pool
                for request_id in ids:
                    self.engine.cancel(request_id)
                raise OpenAIError(str(exc), code="invalid_value") from None
            now = time.perf_counter() if arrived is None else arrived
            for request_id in ids:
                self._queues[request_id] = (loop, queue)
                self._last[request_id] = (now, False)
            self.requests += len(ids)
        self._wake.set()
        return ids, queue

    def cancel(self, request_id: int) -> None:
        """Stop a request that is still running (its client left); its blocks are freed."""
        with self._lock:
            self._last.pop(request_id, None)
            if self._queues.pop(request_id, None) is None:
                return                      # finished already
            self.engine.cancel(request_id)
        self._wake.set()

    def stop(self) -> None:
        """Cancel what is left and end the thread once the engine has freed its blocks (the
        server is shutting down)."""
        with self._lock:
            self._stopping = True
            for request_id in list(self._queues):
                self.engine.cancel(request_id)
            self._fail_all("the server shut down before the answer was finished")
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            self._wake.clear()
            if not self.engine.has_work:
                if self._stopping:
                    return
                self._wake.wait()
                continue
            try:
                events = self.engine.step()
            except Exception:               # a bug: fail every request, keep serving
                log.exception("engine.step() failed; the requests in flight are cancelled")
                with self._lock:
                    for request_id in list(self._queues):
                        self.engine.cancel(request_id)
                    self._fail_all("the engine failed; see the server's log")
                time.sleep(0.1)             # a failure that repeats must not spin
                continue
            now = time.perf_counter()
            with self._lock:
                for event in events:
                    self._time(event, now)
                    target = self._queues.get(event.request_id)
                    if target is None:
                        continue
                    if event.finish_reason is not None:
                        del self._queues[event.request_id]
                    _put(target, event)

    def _time(self, event, now: float) -> None:
        """Count a token, and the time it took (first token, or the gap since the last)."""
        if event.token_id is not None:
            self.tokens += 1
            if event.request_id in self._last:
                since, written = self._last[event.request_id]
                (self.itl if written else self.ttft).observe(now - since)
                self._last[event.request_id] = (now, True)
        if event.finish_reason is not None:
            self._last.pop(event.request_id, None)

    def _fail_all(self, message: str) -> None:
        for target in self._queues.values():
            _put(target, OpenAIError(message, status=500, kind="server_error"))
        self._queues.clear()
        self._last.clear()


def _put(target: tuple[asyncio.AbstractEventLoop, asyncio.Queue], item: object) -> None:
    loop, queue = target
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:                    # the loop is closed: nobody waits any more
        pass


_DISCONNECTED = object()


async def _events(worker: _Worker, request_ids: Sequence[int], queue: asyncio.Queue
                  ) -> AsyncIterator:
    """The engine's events for the requests of one HTTP request, up to the ones that finish
    them all. Leaving early (a disconnect, a cancelled task, one request's error) cancels the
    unfinished ones in the engine."""
    unfinished = set(request_ids)
    try:
        while unfinished:
            event = await queue.get()
            if event is _DISCONNECTED:
                return
            if isinstance(event, OpenAIError):
                raise event
            if event.finish_reason is not None:
                unfinished.discard(event.request_id)
            if event.finish_reason == "error":
                raise OpenAIError(
                    "the model's scores became NaN or infinite, so no token could be chosen: "
                    "the model is broken (its weights, or numbers past its precision); the "
                    "answer was stopped", status=422, kind="model_error",
                    code="non_finite_scores")
            yield event
    finally:
        for request_id in unfinished:
            worker.cancel(request_id)


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Put ``_DISCONNECTED`` on the queue when the client goes away (after the body was read,
    the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(_DISCONNECTED)


# ----- checking a request --------------------------------------------------------------------

def _number(body: dict, name: str, default: float | None, *, low: float | None = None,
            high: float | None = None, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpenAIError(f"{name} must be a number, got {_show(value)}", param=name,
                          code="invalid_type")
    try:
        number = float(value)
    except OverflowError:                   # an int of 400 digits is past every float
        number = math.inf
    if not math.isfinite(number):
        raise OpenAIError(f"{name} must be a finite number, got {_show(value)}", param=name,
                          code="invalid_value")
    too_low = low is not None and (number <= low if low_open else number < low)
    if too_low or (high is not None and number > high):
        lower = "more than" if low_open else "at least"
        bounds = (f"{lower} {low:g}" if high is None else
                  f"in {'(' if low_open else '['}{low:g}, {high:g}]")
        raise OpenAIError(f"{name} must be {bounds}, got {_show(value)}", param=name,
                          code="invalid_value")
    return number


def _integer(body: dict, name: str, default: int | None, *, low: int | None = None,
             high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(f"{name} must be an integer, got {_show(value)}", param=name,
                          code="invalid_type")
    if low is not None and value < low:
        raise OpenAIError(f"{name} must be at least {low}, got {_show(value)}", param=name,
                          code="invalid_value")
    if high is not None and value > high:
        raise OpenAIError(f"{name} must be at most {high}, got {_show(value)}", param=name,
                          code="invalid_value")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or not 1 <= len(stops) <= 4
            or not all(isinstance(s, str) and s for s in stops)):
        raise OpenAIError(f"stop must be a non-empty string or a list of 1 to 4 of them, got "
                          f"{_show(stop)}", param="stop", code="invalid_value")
    return tuple(stops)


def _stop_token_ids(body: dict, vocab_size: int) -> list[int]:
    """vLLM's ``stop_token_ids`` of a completion: token ids that end it, as ``stop`` strings
    do (a special token writes no text, so no string can stop at it)."""
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not _is_ids(ids) or not all(0 <= t < vocab_size for t in ids):
        raise OpenAIError(f"stop_token_ids must be a list of token ids in [0, {vocab_size}), "
                          f"got {_show(ids)}", param="stop_token_ids", code="invalid_value")
    return list(ids)


class _Settings:
    """The parameters common to both endpoints, checked."""

    def __init__(self, body: dict, fields: set[str], served: Sequence[str], *,
                 chat: bool) -> None:
        for name in body:
            if name in NEUTRAL:
                allowed = NEUTRAL[name]
                if isinstance(allowed, type):   # any value of this type (or null)
                    if body[name] is not None and not isinstance(body[name], allowed):
                        raise OpenAIError(f"{name} must be a string, got {_show(body[name])}",
                                          param=name, code="invalid_type")
                    continue
                allowed = allowed if isinstance(allowed, tuple) else (allowed,)
                if allowed != (None,) and body[name] not in allowed:
                    raise OpenAIError(f"{name} is not supported by this server (only "
                                      f"{json.dumps(allowed[-1])})", param=name,
                                      code="unsupported_parameter")
            elif name not in fields:
                raise OpenAIError(f"unknown parameter: {name}", param=name,
                                  code="unknown_parameter")
        model = body.get("model")
        if model is None:
            raise OpenAIError(f"model is missing: this server serves "
                              f"{', '.join(map(json.dumps, served))}", param="model",
                              code="missing_required_parameter")
        if not isinstance(model, str) or model not in served:
            raise _model_not_found(model, served)
        self.model = model                  # served[0] is the base; the others, adapters
        self.adapter = None if model == served[0] else model
        self.n = _integer(body, "n", 1, low=1, high=MAX_CHOICES)
        if chat:                         # logprobs: true|false, top_logprobs: 0 to 20
            wanted = body.get("logprobs")
            if wanted is not None and not isinstance(wanted, bool):
                raise OpenAIError(f"logprobs must be true or false, got {_show(wanted)}",
                                  param="logprobs", code="invalid_type")
            top = _integer(body, "top_logprobs", None, low=0, high=MAX_TOP_LOGPROBS["chat"])
            if top and not wanted:       # 0 without logprobs: what some clients send for off
                raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs",
                                  code="invalid_value")
            self.top = (top or 0) if wanted else None
            self.echo = False
        else:                            # logprobs: 0 to 5 alternatives; echo: true|false
            self.top = _integer(body, "logprobs", None, low=0,
                                high=MAX_TOP_LOGPROBS["completions"])
            echo = body.get("echo")
            if echo is not None and not isinstance(echo, bool):
                raise OpenAIError(f"echo must be true or false, got {_show(echo)}",
                                  param="echo", code="invalid_type")
            self.echo = bool(echo)
        self.temperature = _number(body, "temperature", 1.0, low=0.0)
        self.top_p = _number(body, "top_p", None, low=0.0, high=1.0, low_open=True)
        self.presence_penalty = _number(body, "presence_penalty", 0.0, low=-2.0, high=2.0)
        self.frequency_penalty = _number(body, "frequency_penalty", 0.0, low=-2.0, high=2.0)
        self.seed = _integer(body, "seed", None, low=0, high=2**63 - 1)
        self.stop = _stop(body)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise OpenAIError(f"stream must be true or false, got {_show(stream)}",
                              param="stream", code="invalid_type")
        self.stream = bool(stream)
        options = body.get("stream_options")
        if options is not None and (not isinstance(options, dict) or set(options)
                                    - {"include_usage"} or not self.stream):
            raise OpenAIError("stream_options must be {\"include_usage\": true|false}, with "
                              "stream: true", param="stream_options", code="invalid_value")
        self.include_usage = bool((options or {}).get("include_usage"))

    def request(self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int],
                choice: int = 0) -> EngineRequest:
        """The engine's request for choice ``choice`` (0 to ``n - 1``) of a prompt: seeded
        with ``seed + choice``, so that it is the request with ``n=1`` and that seed."""
        seed = None if self.seed is None else self.seed + choice
        try:
            return EngineRequest(prompt_ids, max_tokens=max_tokens,
                                 temperature=self.temperature, top_p=self.top_p,
                                 seed=seed, stop=self.stop,
                                 presence_penalty=self.presence_penalty,
                                 frequency_penalty=self.frequency_penalty,
                                 stop_token_ids=stop_token_ids, logprobs=self.top,
                                 prompt_logprobs=self.echo and self.top is not None,
                                 adapter=self.adapter)
        except (TypeError, ValueError) as exc:
            raise OpenAIError(str(exc), code="invalid_value") from None


def _max_tokens(body: dict, names: tuple[str, ...], prompt_tokens: int, context: int,
                default: int | None, *, low: int = 1) -> int:
    """The most tokens to write: the first of ``names`` given, else ``default``, else all the
    room the context leaves; refused past the context."""
    room = context - prompt_tokens
    given = {n: _integer(body, n, None, low=low) for n in names}      # each one is checked
    name = next((n for n in names if given[n] is not None), names[0])
    value = given[name]
    if value is None:
        value = room if default is None else min(default, room)
    if value > room:
        raise OpenAIError(f"{name} is {_show(value)}, but the prompt is {prompt_tokens} "
                          f"tokens and the model's context {context}: at most {room} new "
                          f"tokens fit",
                          param=name, code="context_length_exceeded")
    return value


def _chat_messages(body: dict) -> list[dict]:
    """OpenAI's messages as the chat template's ``{"role", "content"}`` dicts (content given as
    a list of text parts is joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list of {\"role\", \"content\"} "
                          f"objects, got {_show(messages)}", param="messages",
                          code="invalid_value")
    out = []
    for k, message in enumerate(messages):
        where = f"messages[{k}]"
        if not isinstance(message, dict):
            raise OpenAIError(f"{where} must be an object", param=where, code="invalid_type")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise OpenAIError(f"{where} has {extra}: the chat template holds only role and "
                              f"content", param=where, code="unsupported_parameter")
        role, content = message.get("role"), message.get("content")
        if role not in ROLE_TOKENS:
            raise OpenAIError(f"{where}.role is {_show(role)}; the roles are "
                              f"{', '.join(ROLE_TOKENS)}", param=f"{where}.role",
                              code="invalid_value")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) and set(p) == {"type", "text"}
                       for p in content):
                raise OpenAIError(f"{where}.content: only text parts ({{\"type\": \"text\", "
                                  f"\"text\": ...}}) are supported", param=f"{where}.content",
                                  code="invalid_value")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise OpenAIError(f"{where}.content must be a string, got {_show(content)}",
                              param=f"{where}.content", code="invalid_type")
        out.append({"role": role, "content": content})
    return out


async def _json_body(request: Request, limit: int) -> dict:
    """The request's JSON object, read up to ``limit`` bytes (413 past them) and parsed in a
    thread (a large body must not hold up the other requests)."""
    too_large = OpenAIError(f"the body is larger than this server takes, {limit:,} bytes: "
                            f"no prompt that fits the model's context needs more",
                            code="request_too_large", status=413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return await asyncio.to_thread(_parse_json, b"".join(chunks))


def _parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except ValueError as exc:               # also bytes that are not UTF-8
        raise OpenAIError(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        body = None
    if body is None or _depth(body) > MAX_DEPTH:
        raise OpenAIError(f"the body is nested more than {MAX_DEPTH} levels deep",
                          code="invalid_json")
    if not isinstance(body, dict):
        raise OpenAIError("the body must be a JSON object", code="invalid_json")
    return body


def _depth(value: object) -> int:
    """How deep lists and objects nest in ``value``, counted without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                     else value))
    return deepest


def _at_least_tokens(texts: Sequence[str], longest_token: int) -> int:
    """A lower bound on the tokens of ``texts``, from their bytes: no token holds more than
    ``longest_token`` bytes. (Counted before tokenizing, which a huge text would make slow.)"""
    return sum(-(-len(t.encode("utf-8", "surrogatepass")) // longest_token) for t in texts)


# ----- the app -------------------------------------------------------------------------------

def create_app(engine, tokenizer, *, model_name: str, max_queue: int = MAX_QUEUE,
               max_body_bytes: int | None = None, api_key: str | None = None,
               allowed_origins: Sequence[str] = ()) -> FastAPI:
    """The FastAPI app serving ``engine`` (a :class:`~minitransformer.serving.Engine`) as the
    model ``model_name``: ``POST /v1/chat/completions``, ``POST /v1/completions``,
    ``GET /v1/models``, the chat page at ``/``, and ``/health``, ``/metrics``, ``/tokenize``,
    ``/detokenize``. The engine is stepped by a thread that starts and stops with the app (its
    lifespan). A chat answer ends at the chat format's tokens
    (:func:`~minitransformer.chat.stop_token_ids`: ``<|end|>`` or a role marker for the
    course's format, ``<|im_end|>`` and the other special tokens for SmolLM2's template), as
    ``minitransformer chat`` does; a completion ends at no token, as ``minitransformer
    generate`` does, unless its ``stop_token_ids`` (vLLM's parameter) name some (``stop``
    strings end both). Special tokens write no text. ``/tokenize`` takes a text of any length
    that the body limit takes (an evaluation tokenizes a long text, then scores it in windows).

    The engine's LoRA adapters (``Engine(..., adapters=...)``) are served as models of their
    own names beside ``model_name``, as vLLM's ``--lora-modules``: ``/v1/models`` lists them
    with ``"parent"`` the base's name, and a request's ``model`` chooses one.

    Args:
        max_queue: the most requests that wait for a row of the batch; past them, 503.
        max_body_bytes: the largest body taken (413 past it); ``None``: what the longest
            prompt that fits the context can take, written as JSON.
        api_key: the key every ``/v1`` route asks for (``Authorization: Bearer KEY``);
            ``None``: none.
        allowed_origins: the origins whose pages may call the server (CORS), ``"*"`` for any;
            none by default.

    Raises:
        TypeError: an engine that is not an ``Engine``, a tokenizer that is not a
            ``BPETokenizer``, an option of the wrong type.
        ValueError: an empty name or key, an adapter named as the base, a negative queue, a
            body limit below 1.
    """
    check_type("engine", engine, Engine, "a minitransformer.serving.Engine")
    if not callable(getattr(tokenizer, "encode", None)) or not isinstance(
            getattr(tokenizer, "special_tokens", None), dict):
        raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    if not check_type("model_name", model_name, str, "a str").strip():
        raise ValueError("model_name is empty: clients ask for the model by this name")
    check_int("max_queue", max_queue, low=0)
    served = (model_name, *(() if engine.adapters is None else engine.adapters.names))
    if model_name in served[1:]:
        raise ValueError(f"an adapter is called {model_name!r}, the base model's name: "
                         f"clients could not ask for one or the other")
    if api_key is not None and not check_type("api_key", api_key, str, "a str or None"):
        raise ValueError("api_key is empty: give a key, or None for no key")
    check_type("allowed_origins", allowed_origins, (list, tuple), "a list of str")
    for origin in allowed_origins:
        check_type("allowed_origins[...]", origin, str, "a str")
    context = engine.config.context_length
    longest_token = max(len(tokenizer.token_bytes(i)) for i in range(len(tokenizer)))
    if max_body_bytes is None:          # JSON writes a byte as 6 at most (\u0001)
        max_body_bytes = (6 * longest_token + 64) * context + 2**16
    check_int("max_body_bytes", max_body_bytes)
    try:                                    # the course's chat tokens, or a model's template
        chat_stops = chat_format.stop_token_ids(tokenizer)
    except ValueError:
        chat_stops = None                   # no chat format: /v1/completions only
    worker = _Worker(engine, max_queue)
    vocab_size = engine.config.vocab_size
    form = _Logprobs(tokenizer, chat_stops or ())
    created = int(time.time())
    key_digest = None if api_key is None else hashlib.sha256(api_key.encode()).digest()

    async def lifespan(app: FastAPI):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="minitransformer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    if allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins),
                           allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(OpenAIError)
    async def refused(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(where) or None
        message = first.get("msg", "invalid request")
        return error_response(400, f"{param}: {message}" if param else message, param=param,
                              code="invalid_value")

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}",
                              code="not_found")

    @app.exception_handler(405)
    async def wrong_method(request: Request, exc: Exception) -> JSONResponse:
        return error_response(405, f"{request.method} is not allowed on {request.url.path}",
                              code="method_not_allowed")

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return error_response(400, "the request is nested too deeply", code="invalid_json")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, f"internal error: {type(exc).__name__}",
                              kind="server_error")

    async def authorize(request: Request) -> None:
        """With an API key, a ``/v1`` route asks for it (compared in constant time)."""
        if key_digest is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise OpenAIError("this server needs an API key: send the header "
                              "'Authorization: Bearer KEY'", code="invalid_api_key",
                              status=401, headers={"WWW-Authenticate": "Bearer"})
        digest = hashlib.sha256(given.strip().encode("utf-8", "surrogatepass")).digest()
        if not hmac.compare_digest(digest, key_digest):
            raise OpenAIError("incorrect API key provided", code="invalid_api_key",
                              status=401, headers={"WWW-Authenticate": "Bearer"})

    v1 = [Depends(authorize)]
    cards = {name: {"id": name, "object": "model", "created": created,
                    "owned_by": "minitransformer",     # vLLM's: an adapter's parent is the base
                    "parent": None if name == model_name else model_name} for name in served}

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict:
        return {"object": "list", "data": list(cards.values())}

    @app.get("/v1/models/{name:path}", dependencies=v1)
    async def model(name: str) -> dict:
        if name not in cards:
            raise _model_not_found(name, served)
        return cards[name]

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        page = resources.files("minitransformer").joinpath("static/chat.html")
        return HTMLResponse(page.read_text(encoding="utf-8"))

    def check_length(texts: Sequence[str], param: str) -> None:
        """Refuse, before tokenizing, texts too long for the context whatever their tokens."""
        _check_prompt(_at_least_tokens(texts, longest_token), context, param, at_least=True)

    async def chat_ids(messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        if chat_stops is None:
            raise OpenAIError(f"the model {model_name} has no chat format (its tokenizer has "
                              f"neither the chat tokens nor a chat template): use "
                              f"/v1/completions", param="model", code="model_not_supported")
        check_length([m["content"] for m in messages], "messages")
        try:
            ids = await asyncio.to_thread(chat_format.apply_chat_template, tokenizer, messages,
                                          add_generation_prompt=add_generation_prompt)
        except (TypeError, ValueError) as exc:
            raise OpenAIError(str(exc), param="messages", code="invalid_value") from None
        _check_prompt(len(ids), context, "messages")
        return ids

    async def encode(text: str, param: str, fit: bool = True) -> list[int]:
        if fit:
            check_length([text], param)
        try:
            ids = await asyncio.to_thread(tokenizer.encode, text)
        except (TypeError, ValueError) as error:  # a lone surrogate is not UTF-8, for one
            raise OpenAIError(f"{param} cannot be encoded: {error}", param=param,
                              code="invalid_value") from None
        return ids

    async def prompt_list(prompt: object, n: int = 1, fit: bool = True
                          ) -> list[tuple[list[int], str]]:
        """The prompts of a completion request, each as token ids and text: a string, a
        list of strings, a list of token ids, or a list of lists of them; ``fit``: each
        leaves room in the context for a new token."""
        if isinstance(prompt, str) or _is_ids(prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt or not (
                all(isinstance(p, str) for p in prompt) or all(_is_ids(p) for p in prompt)):
            raise OpenAIError("prompt must be a string, a list of strings, a list of token "
                              f"ids or a list of lists of token ids, got {_show(prompt)}",
                              param="prompt", code="invalid_type")
        if len(prompt) * n > MAX_CHOICES:
            raise OpenAIError(f"{len(prompt)} prompts times n={n} make {len(prompt) * n} "
                              f"choices; this server writes at most {MAX_CHOICES} per "
                              f"request", param="prompt", code="invalid_value")
        out = []
        for k, given in enumerate(prompt):
            param = "prompt" if len(prompt) == 1 else f"prompt[{k}]"
            if isinstance(given, str):
                ids, text = await encode(given, param, fit), given
            else:
                outside = next((t for t in given if not 0 <= t < vocab_size), None)
                if outside is not None:
                    raise OpenAIError(f"{param} holds the token id {_show(outside)}, outside "
                                      f"the vocabulary [0, {vocab_size})", param=param,
                                      code="invalid_value")
                ids = given
                text = await asyncio.to_thread(tokenizer.decode, ids) if ids else ""
            if not ids:
                raise OpenAIError(f"{param} is empty: give the text to continue",
                                  param=param, code="invalid_value")
            if fit:
                _check_prompt(len(ids), context, param)
            out.append((ids, text))
        return out

    async def prompt_ids(prompt: object) -> list[int]:
        prompts = await prompt_list(prompt, fit=False)
        if len(prompts) != 1:
            raise OpenAIError(f"prompt must be one prompt here, got {len(prompts)}",
                              param="prompt", code="invalid_value")
        return prompts[0][0]

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(request: Request):
        arrived = time.perf_counter()       # TTFT counts the reading and the tokenizing
        body = await _json_body(request, max_body_bytes)
        settings = _Settings(body, CHAT_FIELDS, served, chat=True)
        ids = await chat_ids(_chat_messages(body))
        limit = _max_tokens(body, ("max_completion_tokens", "max_tokens"), len(ids), context,
                            None)
        choices = [_Choice(j, settings.request(ids, limit, chat_stops, j))
                   for j in range(settings.n)]
        return await _answer(request, worker, choices, settings, chat=True,
                             model_name=settings.model, form=form, prompt_tokens=len(ids),
                             arrived=arrived)

    @app.post("/v1/completions", dependencies=v1)
    async def completions(request: Request):
        arrived = time.perf_counter()
        body = await _json_body(request, max_body_bytes)
        settings = _Settings(body, COMPLETION_FIELDS, served, chat=False)
        choices = []
        prompts = await prompt_list(body.get("prompt"), settings.n)
        stop_ids = _stop_token_ids(body, vocab_size)
        for ids, text in prompts:
            limit = _max_tokens(body, ("max_tokens",), len(ids), context, 16,
                                low=0 if settings.echo else 1)
            for j in range(settings.n):
                job = settings.request(ids, max(limit, 1), stop_ids, j)
                choices.append(_Choice(len(choices), job, keep=limit > 0,
                                       echo=text if settings.echo else None))
        return await _answer(request, worker, choices, settings, chat=False,
                             model_name=settings.model, form=form,
                             prompt_tokens=sum(len(ids) for ids, _ in prompts),
                             arrived=arrived)

    # ----- beside OpenAI's API: health, metrics, tokens (as vLLM names them) -----------------

    @app.get("/health")
    async def health() -> JSONResponse:
        if worker.serving:
            return JSONResponse({"status": "ok"})
        state = "starting" if worker.not_started else "stopping"
        return JSONResponse({"status": state}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(_metrics(worker), media_type="text/plain; version=0.0.4")

    def _check_fields(body: dict, fields: set[str]) -> None:
        for name in body:
            if name not in fields:
                raise OpenAIError(f"unknown parameter: {name}", param=name,
                                  code="unknown_parameter")
        if body.get("model") is not None and body["model"] not in served:
            raise _model_not_found(body["model"], served)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await _json_body(request, max_body_bytes)
        if "messages" in body:
            _check_fields(body, {"model", "messages", "add_generation_prompt"})
            generation_prompt = body.get("add_generation_prompt", True)
            if not isinstance(generation_prompt, bool):
                raise OpenAIError("add_generation_prompt must be true or false, got "
                                  f"{_show(generation_prompt)}", param="add_generation_prompt",
                                  code="invalid_type")
            ids = await chat_ids(_chat_messages(body), generation_prompt)
        else:
            _check_fields(body, {"model", "prompt", "add_special_tokens"})
            if body.get("add_special_tokens") not in (None, True, False):
                raise OpenAIError("add_special_tokens must be true or false",
                                  param="add_special_tokens", code="invalid_type")
            ids = await prompt_ids(body.get("prompt"))
        return {"count": len(ids), "max_model_len": context, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await _json_body(request, max_body_bytes)
        _check_fields(body, {"model", "tokens"})
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise OpenAIError(f"tokens must be a list of token ids, got {_show(tokens)}",
                              param="tokens", code="invalid_type")
        outside = next((t for t in tokens if not 0 <= t < len(tokenizer)), None)
        if outside is not None:
            raise OpenAIError(f"tokens holds {_show(outside)}, outside the vocabulary [0, "
                              f"{len(tokenizer)})", param="tokens", code="invalid_value")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, tokens)}

    return app


def _metrics(worker: _Worker) -> str:
    """The server's state in Prometheus' text format (version 0.0.4)."""
    engine = worker.engine
    free = engine.num_free_blocks
    lines = []

    def metric(name: str, kind: str, help_text: str, value: float | None = None) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        if value is not None:
            lines.append(f"{name} {value}")

    prefix = "minitransformer_"
    metric(prefix + "requests_running", "gauge", "Requests in the batch.", engine.num_running)
    metric(prefix + "requests_waiting", "gauge", "Requests waiting for a row of the batch.",
           engine.num_waiting)
    with worker._lock:
        metric(prefix + "requests_total", "counter", "Requests accepted.", worker.requests)
        metric(prefix + "generation_tokens_total", "counter", "Tokens generated.",
               worker.tokens)
        metric(prefix + "kv_blocks_used", "gauge", "KV cache blocks held by requests.",
               engine.num_blocks - free)
        metric(prefix + "kv_blocks_free", "gauge", "KV cache blocks free (the evictable "
               "ones included).", free)
        metric(prefix + "kv_blocks_evictable", "gauge", "Free KV cache blocks that keep a "
               "cached prefix, evicted least recently used first.", engine.pool.num_evictable)
        metric(prefix + "prefix_cache_queries_total", "counter", "Prompt tokens looked up in "
               "the prefix cache.", engine.prefix_queries)
        metric(prefix + "prefix_cache_hits_total", "counter", "Prompt tokens found in the "
               "prefix cache (not prefilled).", engine.prefix_hits)
        for name, histogram, help_text in (
                ("time_to_first_token_seconds", worker.ttft,
                 "Seconds from a request's arrival to its first token."),
                ("inter_token_latency_seconds", worker.itl,
                 "Seconds between a request's consecutive tokens.")):
            metric(prefix + name, "histogram", help_text)
            lines.extend(histogram.lines(prefix + name))
    return "\n".join(lines) + "\n"


def _check_prompt(prompt_tokens: int, context: int, param: str, *,
                  at_least: bool = False) -> None:
    if prompt_tokens >= context:
        what = "conversation" if param == "messages" else "prompt"
        raise OpenAIError(f"the {what} is {'at least ' * at_least}{prompt_tokens} tokens; the "
                          f"model's context is {context}, which leaves no room for an answer",
                          param=param, code="context_length_exceeded")


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


class _Choice:
    """One choice of an answer: its engine request, and what it has written so far."""

    def __init__(self, index: int, job: EngineRequest, *, keep: bool = True,
                 echo: str | None = None) -> None:
        self.index, self.job = index, job
        self.keep = keep            # False: max_tokens 0 (echo): the token written is not shown
        self.echo = echo            # the prompt's text, written before the answer (echo)
        self.pieces: list[str] = []
        self.logprobs: list = []    # the new tokens' TokenLogprob
        self.prompt_logprobs: list | None = None
        self.generated = 0
        self.reason: str | None = None
        self.job_id: int | None = None   # the engine's id, once submitted

    def add(self, event) -> None:
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        if event.token_id is not None and self.keep:
            self.generated += 1
            self.pieces.append(event.text)
            if event.logprob is not None:
                self.logprobs.append(event.logprob)
        self.reason = event.finish_reason

    def echo_items(self) -> list:
        """The prompt's ``(token_id, TokenLogprob or None)``, for ``echo`` with logprobs."""
        ids, given = self.job.prompt_ids, self.prompt_logprobs or [None] * len(self.job.prompt_ids)
        return list(zip(ids, given))


class _Logprobs:
    """OpenAI's ``logprobs`` objects: a completion's (``tokens``, ``token_logprobs``,
    ``top_logprobs``, ``text_offset``) and a chat's (``content``: one entry per token, with
    its ``bytes`` and ``top_logprobs``). A chat's end token has none (it is not content)."""

    def __init__(self, tokenizer, chat_stops: Sequence[int]) -> None:
        self.tokenizer, self.chat_stops = tokenizer, frozenset(chat_stops)

    def text(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def completion(self, items: Sequence, offset: int = 0) -> dict:
        """``items``: ``(token_id, TokenLogprob or None)``; the top alternatives' dict also
        holds the token itself, as vLLM writes it."""
        tokens, values, tops, offsets = [], [], [], []
        for token, entry in items:
            text = self.text(token)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            values.append(None if entry is None else entry.logprob)
            tops.append(None if entry is None else {
                **{self.text(t): v for t, v in entry.top}, text: entry.logprob})
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}

    def chat(self, entries: Sequence) -> dict:
        def one(token: int, value: float) -> dict:
            return {"token": self.text(token), "logprob": value,
                    "bytes": list(self.tokenizer.token_bytes(token))}

        return {"content": [{**one(e.token_id, e.logprob),
                             "top_logprobs": [one(t, v) for t, v in e.top]}
                            for e in entries if e.token_id not in self.chat_stops],
                "refusal": None}


async def _answer(request: Request, worker: _Worker, choices: list[_Choice],
                  settings: _Settings, *, chat: bool, model_name: str, form: _Logprobs,
                  prompt_tokens: int, arrived: float):
    """Submit the choices' requests together and answer them, as one JSON object or as a
    stream of events."""
    ids, queue = worker.submit([c.job for c in choices], arrived)
    by_id = dict(zip(ids, choices))
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_name}
    if settings.stream:
        chunks = _stream(worker, ids, by_id, queue, head, chat, prompt_tokens,
                         settings.include_usage, form, settings.top is not None)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    watcher = asyncio.ensure_future(_watch_disconnect(request, queue))
    try:
        async for event in _events(worker, ids, queue):
            by_id[event.request_id].add(event)
    finally:
        watcher.cancel()
    if any(c.reason is None or c.reason == "cancelled" for c in choices):
        raise OpenAIError("the request was cancelled before it finished", status=503,
                          kind="server_error", code="cancelled")
    out = []
    for c in choices:
        text = "".join(c.pieces)
        logprobs = None
        if chat:
            choice = {"index": c.index, "message": {"role": "assistant", "content": text}}
            if settings.top is not None:
                logprobs = form.chat(c.logprobs)
        else:
            choice = {"index": c.index, "text": (c.echo or "") + text}
            if settings.top is not None:
                items = c.echo_items() if c.echo is not None else []
                logprobs = form.completion([*items, *((e.token_id, e) for e in c.logprobs)])
        out.append({**choice, "logprobs": logprobs, "finish_reason": c.reason})
    return {**head, "choices": out,
            "usage": _usage(prompt_tokens, sum(c.generated for c in choices))}


async def _stream(worker: _Worker, ids: list[int], by_id: dict, queue: asyncio.Queue,
                  head: dict, chat: bool, prompt_tokens: int, include_usage: bool,
                  form: _Logprobs, logprobs: bool) -> AsyncIterator[str]:
    """Server-sent events: one ``data: {chunk}`` per piece of text of a choice (with its
    token's logprobs, if asked for), a last chunk per choice with its finish reason, the usage
    if asked for, then ``data: [DONE]``. With ``echo``, a choice's first chunk is its
    prompt."""
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    offsets = dict.fromkeys(ids, 0)

    def chunk(c: _Choice, text: str | None, reason: str | None, *, first: bool = False,
              items: Sequence = ()) -> str:
        lp = None
        if chat:
            delta = {"role": "assistant", "content": ""} if first else (
                {} if text is None else {"content": text})
            choice = {"index": c.index, "delta": delta}
            if logprobs and items:
                lp = form.chat([e for _, e in items])
        else:
            choice = {"index": c.index, "text": text or ""}
            if logprobs and items:
                lp = form.completion(items, offsets[c.job_id])
                offsets[c.job_id] += sum(len(t) for t in lp["tokens"])
        body = {**head, "choices": [{**choice, "logprobs": lp, "finish_reason": reason}]}
        if include_usage:
            body["usage"] = None
        return _sse(body)

    for request_id, c in by_id.items():
        c.job_id = request_id
    generated = 0
    try:
        if chat:
            for c in by_id.values():
                yield chunk(c, None, None, first=True)
        async for event in _events(worker, ids, queue):
            c = by_id[event.request_id]
            if event.finish_reason == "cancelled":
                raise OpenAIError("the request was cancelled before it finished",
                                  kind="server_error", code="cancelled")
            if c.echo is not None:
                c.add(event)                # for its prompt's logprobs
                items = c.echo_items() if logprobs else ()
                yield chunk(c, c.echo, None, items=items)
                c.echo = None
            if c.keep and event.token_id is not None:
                generated += 1
                items = [] if event.logprob is None else [(event.token_id, event.logprob)]
                if chat:
                    items = [i for i in items if i[0] not in form.chat_stops]
                if event.text or items:
                    yield chunk(c, event.text, None, items=items)
            if event.finish_reason is not None:
                yield chunk(c, None, event.finish_reason)
    except OpenAIError as exc:              # the status is sent already: say it in the stream
        yield _sse({"error": {"message": exc.message, "type": exc.kind, "param": exc.param,
                              "code": exc.code}})
        yield "data: [DONE]\n\n"
        return
    finally:                                # a disconnect cancels the task at a yield
        for request_id in ids:
            worker.cancel(request_id)
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(prompt_tokens, generated)})
    yield "data: [DONE]\n\n"


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
