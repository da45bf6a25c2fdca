"""An OpenAI-compatible HTTP server over the continuous-batching engine (chapter 18).

The HTTP layer is thin: it checks a request, turns it into token ids (chapter 16's chat template
for ``/v1/chat/completions``, the tokenizer for ``/v1/completions``), hands a
:class:`~minitransformer.serving.Request` to the :class:`~minitransformer.serving.Engine`, and
turns the engine's events back into OpenAI's JSON, whole or streamed as server-sent events
(``data: {...}`` lines, the last one ``data: [DONE]``). One worker thread calls
``engine.step()`` while there is work; each request waits on its own queue of events, so many
requests share every forward pass.

A bad request gets HTTP 400 and OpenAI's error JSON, ``{"error": {"message", "type", "param",
"code"}}``, before anything is generated. A client that goes away is cancelled in the engine,
which frees its cache blocks.

``python -m minitransformer serve`` (:mod:`minitransformer.cli.serve`) runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from minitransformer.chat import CHAT_TOKENS, ROLE_TOKENS, check_chat_tokenizer
from minitransformer._checks import check_type
from minitransformer.serving import Engine
from minitransformer.serving import Request as EngineRequest

__all__ = ["create_app"]

log = logging.getLogger("minitransformer.server")

#: Parameters of OpenAI's API that this server has no use for, accepted at these values only
#: (what a client sends when it means "off"); any other value is refused by name.
NEUTRAL = {"user": None, "logprobs": (None, False), "top_logprobs": (None, 0),
           "logit_bias": (None, {}), "echo": (None, False), "best_of": (None, 1),
           "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none"),
           "response_format": (None, {"type": "text"}), "parallel_tool_calls": None,
           "store": (None, False), "metadata": None, "service_tier": None}
SAMPLING = ("max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
            "frequency_penalty", "n", "stream", "stream_options", "model")
CHAT_FIELDS = {"messages", "max_completion_tokens", *SAMPLING}
COMPLETION_FIELDS = {"prompt", *SAMPLING}


class OpenAIError(Exception):
    """A request the server refuses: HTTP ``status`` with OpenAI's error JSON."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = (
            message, param, code, status, kind)

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, param=self.param, code=self.code,
                              kind=self.kind)


def error_response(status: int, message: str, *, param: str | None = None,
                   code: str | None = None, kind: str = "invalid_request_error"
                   ) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


# ----- one worker thread steps the engine ---------------------------------------------------

class _Worker:
    """Calls ``engine.step()`` in a thread of its own while the engine has work, and hands each
    event to the queue of its request (on the event loop that submitted it)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()     # a request's queue is known before its first event
        self._wake = threading.Event()
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def in_flight(self) -> int:
        return len(self._queues)

    def start(self) -> None:
        """Start the thread (again, when the app is served again after a stop)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("the app is being served already: one server per app")
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="minitransformer-engine",
                                        daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> tuple[int, asyncio.Queue]:
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        with self._lock:
            if self._stopping:
                raise OpenAIError("the server is shutting down", status=503,
                                  kind="server_error", code="shutting_down")
            try:
                request_id = self.engine.submit(request)
            except ValueError as exc:       # longer than the context, or than the whole pool
                raise OpenAIError(str(exc), code="invalid_value") from None
            self._queues[request_id] = (loop, queue)
        self._wake.set()
        return request_id, queue

    def cancel(self, request_id: int) -> None:
        """Stop a request that is still running (its client left); its blocks are freed."""
        with self._lock:
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
            with self._lock:
                for event in events:
                    target = self._queues.get(event.request_id)
                    if target is None:
                        continue
                    if event.finish_reason is not None:
                        del self._queues[event.request_id]
                    _put(target, event)

    def _fail_all(self, message: str) -> None:
        for target in self._queues.values():
            _put(target, OpenAIError(message, status=500, kind="server_error"))
        self._queues.clear()


def _put(target: tuple[asyncio.AbstractEventLoop, asyncio.Queue], item: object) -> None:
    loop, queue = target
    try:
        loop.call_soon_threadsafe(queue.put_nowait, item)
    except RuntimeError:                    # the loop is closed: nobody waits any more
        pass


_DISCONNECTED = object()


async def _events(worker: _Worker, request_id: int, queue: asyncio.Queue) -> AsyncIterator:
    """The engine's events for one request, up to the one that finishes it. Leaving early
    (a disconnect, a cancelled task) cancels the request in the engine."""
    finished = False
    try:
        while True:
            event = await queue.get()
            if event is _DISCONNECTED:
                return
            if isinstance(event, OpenAIError):
                raise event
            finished = event.finish_reason is not None
            yield event
            if finished:
                return
    finally:
        if not finished:
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise OpenAIError(f"{name} must be a number, got {json.dumps(value)}", param=name,
                          code="invalid_type")
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        lower = "more than" if low_open else "at least"
        bounds = (f"{lower} {low:g}" if high is None else
                  f"in {'(' if low_open else '['}{low:g}, {high:g}]")
        raise OpenAIError(f"{name} must be {bounds}, got {value}", param=name,
                          code="invalid_value")
    return float(value)


def _integer(body: dict, name: str, default: int | None, *, low: int | None = None,
             high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpenAIError(f"{name} must be an integer, got {json.dumps(value)}", param=name,
                          code="invalid_type")
    if low is not None and value < low:
        raise OpenAIError(f"{name} must be at least {low}, got {value}", param=name,
                          code="invalid_value")
    if high is not None and value > high:
        raise OpenAIError(f"{name} must be at most {high}, got {value}", param=name,
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
                          f"{json.dumps(stop)}", param="stop", code="invalid_value")
    return tuple(stops)


class _Settings:
    """The parameters common to both endpoints, checked."""

    def __init__(self, body: dict, fields: set[str], model_name: str) -> None:
        for name in body:
            if name in NEUTRAL:
                allowed = NEUTRAL[name]
                allowed = allowed if isinstance(allowed, tuple) else (allowed,)
                if allowed != (None,) and body[name] not in allowed:
                    raise OpenAIError(f"{name} is not supported by this server (only "
                                      f"{json.dumps(allowed[-1])})", param=name,
                                      code="unsupported_parameter")
            elif name not in fields:
                raise OpenAIError(f"unknown parameter: {name}", param=name,
                                  code="unknown_parameter")
        model = body.get("model")
        if model != model_name:
            raise OpenAIError(f"the model {json.dumps(model)} does not exist: this server "
                              f"serves {json.dumps(model_name)}", param="model",
                              code="model_not_found")
        n = _integer(body, "n", 1, low=1)
        if n != 1:
            raise OpenAIError(f"n must be 1: this server writes one choice per request, got "
                              f"n={n} (send {n} requests, with different seeds)", param="n",
                              code="unsupported_value")
        self.temperature = _number(body, "temperature", 1.0, low=0.0)
        self.top_p = _number(body, "top_p", None, low=0.0, high=1.0, low_open=True)
        self.presence_penalty = _number(body, "presence_penalty", 0.0, low=-2.0, high=2.0)
        self.frequency_penalty = _number(body, "frequency_penalty", 0.0, low=-2.0, high=2.0)
        self.seed = _integer(body, "seed", None, low=0, high=2**63 - 1)
        self.stop = _stop(body)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise OpenAIError(f"stream must be true or false, got {json.dumps(stream)}",
                              param="stream", code="invalid_type")
        self.stream = bool(stream)
        options = body.get("stream_options")
        if options is not None and (not isinstance(options, dict) or set(options)
                                    - {"include_usage"} or not self.stream):
            raise OpenAIError("stream_options must be {\"include_usage\": true|false}, with "
                              "stream: true", param="stream_options", code="invalid_value")
        self.include_usage = bool((options or {}).get("include_usage"))

    def request(self, prompt_ids: list[int], max_tokens: int, stop_token_ids: list[int]
                ) -> EngineRequest:
        try:
            return EngineRequest(prompt_ids, max_tokens=max_tokens,
                                 temperature=self.temperature, top_p=self.top_p,
                                 seed=self.seed, stop=self.stop,
                                 presence_penalty=self.presence_penalty,
                                 frequency_penalty=self.frequency_penalty,
                                 stop_token_ids=stop_token_ids)
        except (TypeError, ValueError) as exc:
            raise OpenAIError(str(exc), code="invalid_value") from None


def _max_tokens(body: dict, names: tuple[str, ...], prompt_tokens: int, context: int,
                default: int | None) -> int:
    """The most tokens to write: the first of ``names`` given, else ``default``, else all the
    room the context leaves; refused past the context."""
    room = context - prompt_tokens
    name = next((n for n in names if body.get(n) is not None), names[0])
    value = _integer(body, name, None, low=1)
    if value is None:
        value = room if default is None else min(default, room)
    if value > room:
        raise OpenAIError(f"{name} is {value}, but the prompt is {prompt_tokens} tokens and "
                          f"the model's context {context}: at most {room} new tokens fit",
                          param=name, code="context_length_exceeded")
    return value


def _chat_messages(body: dict) -> list[dict]:
    """OpenAI's messages as the chat template's ``{"role", "content"}`` dicts (content given as
    a list of text parts is joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages must be a non-empty list of {\"role\", \"content\"} "
                          f"objects, got {json.dumps(messages)[:80]}", param="messages",
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
            raise OpenAIError(f"{where}.role is {json.dumps(role)}; the roles are "
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
            raise OpenAIError(f"{where}.content must be a string, got {json.dumps(content)}",
                              param=f"{where}.content", code="invalid_type")
        out.append({"role": role, "content": content})
    return out


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:               # also bytes that are not UTF-8
        raise OpenAIError(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise OpenAIError("the body must be a JSON object", code="invalid_json")
    return body


# ----- the app -------------------------------------------------------------------------------

def create_app(engine, tokenizer, *, model_name: str) -> FastAPI:
    """The FastAPI app serving ``engine`` (a :class:`~minitransformer.serving.Engine`) as the
    model ``model_name``: ``POST /v1/chat/completions``, ``POST /v1/completions``,
    ``GET /v1/models`` and the chat page at ``/``. The engine is stepped by a thread that
    starts and stops with the app (its lifespan). A chat answer ends at the chat format's
    tokens (``<|end|>`` or a role marker), as ``minitransformer chat`` does; a completion ends
    at no token, as ``minitransformer generate`` does (``stop`` strings end both).

    Raises:
        TypeError: an engine that is not an ``Engine``, a tokenizer that is not a
            ``BPETokenizer``, a name that is not a str.
        ValueError: an empty name.
    """
    check_type("engine", engine, Engine, "a minitransformer.serving.Engine")
    if not callable(getattr(tokenizer, "encode", None)) or not isinstance(
            getattr(tokenizer, "special_tokens", None), dict):
        raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    if not check_type("model_name", model_name, str, "a str").strip():
        raise ValueError("model_name is empty: clients ask for the model by this name")
    context = engine.config.context_length
    try:
        specials = check_chat_tokenizer(tokenizer)
        chat_stops = [specials[token] for token in CHAT_TOKENS]
    except ValueError:
        specials = None                     # no chat format: /v1/completions only
    worker = _Worker(engine)
    created = int(time.time())

    async def lifespan(app: FastAPI):
        worker.start()
        yield
        worker.stop()

    app = FastAPI(title="minitransformer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker

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

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, f"internal error: {type(exc).__name__}",
                              kind="server_error")

    model_card = {"id": model_name, "object": "model", "created": created,
                  "owned_by": "minitransformer"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict:
        if name != model_name:
            raise OpenAIError(f"the model {json.dumps(name)} does not exist: this server "
                              f"serves {json.dumps(model_name)}", param="model",
                              code="model_not_found", status=404)
        return model_card

    @app.get("/", response_class=HTMLResponse)
    async def chat_page() -> HTMLResponse:
        page = resources.files("minitransformer").joinpath("static/chat.html")
        return HTMLResponse(page.read_text(encoding="utf-8"))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _json_body(request)
        settings = _Settings(body, CHAT_FIELDS, model_name)
        messages = _chat_messages(body)
        if specials is None:
            raise OpenAIError(f"the model {model_name} has no chat format (its tokenizer lacks "
                              f"the chat tokens): use /v1/completions", param="model",
                              code="model_not_supported")
        try:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except (TypeError, ValueError) as exc:
            raise OpenAIError(str(exc), param="messages", code="invalid_value") from None
        _check_prompt(len(ids), context, "messages")
        limit = _max_tokens(body, ("max_completion_tokens", "max_tokens"), len(ids), context,
                            None)
        return await _answer(request, worker, settings.request(ids, limit, chat_stops),
                             settings, chat=True, model_name=model_name)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _json_body(request)
        settings = _Settings(body, COMPLETION_FIELDS, model_name)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise OpenAIError("prompt must be a string (one prompt per request), got "
                              f"{json.dumps(prompt)[:80]}", param="prompt", code="invalid_type")
        try:
            ids = tokenizer.encode(prompt)
        except (TypeError, ValueError) as error:  # a lone surrogate is not UTF-8, for one
            raise OpenAIError(f"prompt cannot be encoded: {error}", param="prompt",
                              code="invalid_value") from None
        if not ids:
            raise OpenAIError("prompt is empty: give the text to continue", param="prompt",
                              code="invalid_value")
        _check_prompt(len(ids), context, "prompt")
        limit = _max_tokens(body, ("max_tokens",), len(ids), context, 16)
        return await _answer(request, worker, settings.request(ids, limit, []), settings,
                             chat=False, model_name=model_name)

    return app


def _check_prompt(prompt_tokens: int, context: int, param: str) -> None:
    if prompt_tokens >= context:
        what = "conversation" if param == "messages" else "prompt"
        raise OpenAIError(f"the {what} is {prompt_tokens} tokens; the model's context is "
                          f"{context}, which leaves no room for an answer", param=param,
                          code="context_length_exceeded")


async def _answer(request: Request, worker: _Worker, job: EngineRequest, settings: _Settings,
                  *, chat: bool, model_name: str):
    """Submit the request and answer it, as one JSON object or as a stream of events."""
    ids = job.prompt_ids
    request_id, queue = worker.submit(job)
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_name}
    if settings.stream:
        chunks = _stream(worker, request_id, queue, head, chat, len(ids),
                         settings.include_usage)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    watcher = asyncio.ensure_future(_watch_disconnect(request, queue))
    pieces, generated, reason = [], 0, None
    try:
        async for event in _events(worker, request_id, queue):
            pieces.append(event.text)
            generated += event.token_id is not None
            reason = event.finish_reason
    finally:
        watcher.cancel()
    if reason is None or reason == "cancelled":
        raise OpenAIError("the request was cancelled before it finished", status=503,
                          kind="server_error", code="cancelled")
    text = "".join(pieces)
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat else
              {"index": 0, "text": text})
    return {**head, "choices": [{**choice, "logprobs": None, "finish_reason": reason}],
            "usage": _usage(len(ids), generated)}


async def _stream(worker: _Worker, request_id: int, queue: asyncio.Queue, head: dict,
                  chat: bool, prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: one ``data: {chunk}`` per piece of text, a last chunk with the
    finish reason, the usage if asked for, then ``data: [DONE]``."""
    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}

    def chunk(text: str | None, reason: str | None, *, first: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else (
                {} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        body = {**head, "choices": [{**choice, "logprobs": None, "finish_reason": reason}]}
        if include_usage:
            body["usage"] = None
        return _sse(body)

    generated = 0
    try:
        if chat:
            yield chunk(None, None, first=True)
        async for event in _events(worker, request_id, queue):
            generated += event.token_id is not None
            if event.finish_reason == "cancelled":
                raise OpenAIError("the request was cancelled before it finished",
                                  kind="server_error", code="cancelled")
            if event.text:
                yield chunk(event.text, None)
            if event.finish_reason is not None:
                yield chunk(None, event.finish_reason)
    except OpenAIError as exc:              # the status is sent already: say it in the stream
        yield _sse({"error": {"message": exc.message, "type": exc.kind, "param": exc.param,
                              "code": exc.code}})
        yield "data: [DONE]\n\n"
        return
    finally:                                # a disconnect cancels the task at a yield
        worker.cancel(request_id)
    if include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(prompt_tokens, generated)})
    yield "data: [DONE]\n\n"


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
