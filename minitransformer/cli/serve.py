"""``minitransformer serve``: an OpenAI-compatible server for a model directory or a GGUF
file (chapter 18).

The model, its tokenizer and a :class:`~minitransformer.serving.Engine` go behind
:func:`minitransformer.server.create_app`, run by uvicorn on a socket bound here first, so that
a port in use is a one-line refusal. SIGTERM or Ctrl+C stops it cleanly: no new connection is
taken, the answers in flight are finished (those still running after ``GRACE_SECONDS`` are
cancelled, freeing their blocks), and the program exits with status 0. ``--lora NAME=DIR``
serves LoRA adapters beside the base model, each under its own name (an
:class:`~minitransformer.lora.AdapterSet`, one adapter merged at a time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import sys
import threading
from pathlib import Path

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.cli.common import (
    PROG,
    CommandLineError,
    add_dtype_flag,
    check_dtype_device,
    device,
    load_model,
    nonnegative,
    positive,
    threads,
)

GRACE_SECONDS = 30
#: The environment variable that gives the API key when ``--api-key`` does not.
API_KEY_VARIABLE = "MINITRANSFORMER_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "An OpenAI-compatible server: POST /v1/chat/completions (the chat template) and "
        "/v1/completions, streamed or not, GET /v1/models, and a chat page at /. Requests "
        "share every forward pass (continuous batching) and a paged KV cache. Needs the extra: "
        "pip install 'minitransformer[serve]'. SIGTERM or Ctrl+C finishes the answers in "
        "flight and exits.")
    add = parser.add_argument
    add("--model", metavar="DIR|FILE.gguf", help="a directory written by train or finetune, or "
        "a model's .gguf file (the chat endpoint needs a chat format); default: SmolLM2 from "
        "the cache (python -m minitransformer download smollm2)")
    add("--name", help="the model's id in the API (default: the directory's name)")
    add("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: "
        "this machine only)")
    add("--port", type=port, default=8000, help="(default 8000; 0 picks a free one)")
    add("--max-batch", type=positive, default=16, help="requests decoded together (default "
        "16)")
    add("--kv-blocks", type=positive, default=256, help="blocks of 16 tokens in the KV "
        "cache's pool (default 256)")
    add("--no-pack-weights", action="store_true", help="do not keep a GPT's weights also "
        "packed for the CPU's matrix products (half the memory, slower batches)")
    add("--lora", metavar="NAME=DIR", action="append", type=lora_module, default=[],
        help="also serve the LoRA adapter in DIR (what finetune --lora-rank writes, for this "
        "--model) as the model NAME; repeatable. The engine runs one adapter at a time, "
        "switching when the oldest waiting request asks for another (as vLLM's "
        "--lora-modules, without mixing adapters in a batch)")
    add("--prefix-caching", action="store_true", help="share the KV blocks of prompts that "
        "begin with the same tokens, and keep them after their requests end until the pool "
        "needs them, least recently used first (fewer positions to prefill)")
    add("--device", help="default: minitransformer.default_device()")
    add_dtype_flag(parser)
    add("--threads", type=positive, help="CPU threads (default: OMP_NUM_THREADS, else the "
        "cores idle now)")
    # the queue, the API key, CORS (issues 40 and 43)
    add("--max-queue", type=nonnegative, help="requests that may wait for a row of the "
        "batch; past them the server answers 503 with Retry-After (default 64)")
    add("--api-key", metavar="KEY", help="every /v1 route asks for 'Authorization: Bearer "
        f"KEY' (default: the variable {API_KEY_VARIABLE}, else no key)")
    add("--allowed-origins", metavar="ORIGIN", nargs="+", type=origin,
        help="let web pages of these origins call the API (CORS), e.g. "
        "http://localhost:3000, or * for any (default: none)")


def run(args: argparse.Namespace) -> int:
    if args.model is None:                       # the default model, as chat and generate
        from minitransformer import pretrained
        try:
            args.model = str(pretrained.smollm2_path())
        except FileNotFoundError as exc:
            raise CommandLineError(f"no --model given, and the default model is not here: "
                                   f"{exc}") from None
    folder = Path(args.model)
    if not folder.is_dir() and not (folder.is_file() and folder.suffix == ".gguf"):
        raise CommandLineError(f"--model {args.model}: no such directory or .gguf file")
    try:
        import uvicorn

        from minitransformer.server import create_app
    except ImportError as exc:
        raise CommandLineError(f"serve needs FastAPI and uvicorn ({exc}): pip install "
                               f"'minitransformer[serve]'") from None
    from minitransformer.serving import Engine

    from minitransformer.lora import ADAPTER_CONFIG_FILE

    if args.lora and (folder / ADAPTER_CONFIG_FILE).is_file():
        raise CommandLineError(f"--model {folder} is a LoRA adapter: with --lora, give its "
                               f"base as --model and the adapter as --lora NAME={folder}")
    if args.lora and args.dtype != "float32":
        raise CommandLineError(f"--dtype {args.dtype} with --lora: the adapters run over "
                               f"float32 linear layers; serve a merged model in int8 instead "
                               f"(finetune --merge)")
    where = device(args.device)
    check_dtype_device(args.dtype, where)             # before the socket: refused at once
    sock = listen(args.host, args.port)
    before = torch.get_num_threads()        # given back: main() may run inside a notebook
    try:
        torch.set_num_threads(threads(args.threads)[0])
        with answering_while_loading(sock):      # a probe meanwhile gets 503, not silence
            model, tokenizer = load(folder, where, dtype=args.dtype)
            name = args.name or (folder.resolve().stem if folder.is_file()
                                 else folder.resolve().name)
            adapters = load_adapters(model, tokenizer, args.lora, name)
            check_pool_fits(model, args.kv_blocks, where)
            try:
                engine = Engine(model.eval(), tokenizer, max_batch=args.max_batch,
                                kv_blocks=args.kv_blocks,
                                pack_weights=not args.no_pack_weights,
                                prefix_caching=args.prefix_caching, adapters=adapters)
            except (RuntimeError, MemoryError) as exc:   # the allocator's refusal
                raise CommandLineError(f"--kv-blocks {args.kv_blocks}: the KV cache could "
                                       f"not be allocated ({str(exc).splitlines()[0]})"
                                       ) from None
        api_key = args.api_key if args.api_key is not None else os.environ.get(
            API_KEY_VARIABLE) or None
        if args.api_key is not None and not args.api_key.strip():
            raise CommandLineError("--api-key is empty: give a key, or leave the flag out")
        queue = {} if args.max_queue is None else {"max_queue": args.max_queue}
        app = create_app(engine, tokenizer, model_name=name, api_key=api_key,
                         allowed_origins=args.allowed_origins or (), **queue)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        also = "".join(f", {n!r}" for n in (adapters.names if adapters else ()))
        print(f"serving {folder} as the model {name!r}{also} at {url}/v1 (chat page: "
              f"{url}/); SIGTERM or Ctrl+C stops it", flush=True)
        serve(app, sock, uvicorn)
    finally:
        sock.close()
        torch.set_num_threads(before)
    return 0


def lora_module(text: str) -> tuple[str, str]:
    """``--lora NAME=DIR``: the name clients ask for, and the adapter's directory."""
    name, equals, path = text.partition("=")
    if not equals or not name.strip() or not path:
        raise argparse.ArgumentTypeError(f"must be NAME=DIR, e.g. sql=runs/sql-lora, got "
                                         f"{text!r}")
    return name, path


def load_adapters(model: torch.nn.Module, tokenizer: BPETokenizer,
                  modules: list[tuple[str, str]], base_name: str):
    """The ``--lora`` adapters over ``model`` (``None`` without any), each refused in one
    line: a name taken twice or the base's, not an adapter directory, or one trained on
    another base (another shape, another vocabulary)."""
    if not modules:
        return None
    from minitransformer.lora import ADAPTER_CONFIG_FILE, AdapterSet

    adapters = AdapterSet(model)
    for name, path in modules:
        flag = f"--lora {name}={path}"
        if name == base_name:
            raise CommandLineError(f"{flag}: {name!r} is the base model's name (--name): "
                                   f"choose another")
        if name in adapters.names:
            raise CommandLineError(f"{flag}: two adapters are called {name!r}")
        if not (Path(path) / ADAPTER_CONFIG_FILE).is_file():
            raise CommandLineError(f"{flag}: {path} is not a LoRA adapter directory (no "
                                   f"{ADAPTER_CONFIG_FILE}; finetune --lora-rank writes one)")
        try:
            adapters.add(name, path)
        except (ValueError, OSError) as exc:
            raise CommandLineError(f"{flag}: {exc}") from None
        if any((Path(path) / f).is_file() for f in ("vocab.json", "tokenizer.json")):
            try:
                theirs = BPETokenizer.from_pretrained(path)
            except (ValueError, OSError) as exc:
                raise CommandLineError(f"{flag}: its tokenizer cannot be read ({exc})"
                                       ) from None
            if len(theirs) != len(tokenizer) or any(
                    theirs.token_bytes(i) != tokenizer.token_bytes(i)
                    for i in range(len(tokenizer))):
                raise CommandLineError(f"{flag}: its tokenizer differs from the base model's "
                                       f"(another vocabulary): it was trained on another base")
    return adapters


#: What every request gets while the model loads (``/health`` included): vLLM and Kubernetes
#: read a 503 as "not ready yet", where a connection left waiting looks like a hang.
LOADING_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 23\r\n\r\n"
                 b'{"status": "starting"}\n')


@contextlib.contextmanager
def answering_while_loading(sock: socket.socket, *, poll: float = 0.05):
    """While the body runs (the model loading), a thread answers every connection on the
    listening ``sock`` with :data:`LOADING_REPLY` and closes it; on exit it stops, and the
    socket, still listening, goes to uvicorn. A client that connected meanwhile is answered
    at once instead of waiting in the backlog until the server starts."""
    done = threading.Event()

    def answer() -> None:
        while not done.is_set():
            ready, _, _ = select.select([sock], [], [], poll)
            if not ready or done.is_set():
                continue
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, OSError):
                continue
            with conn:
                try:
                    conn.settimeout(1.0)
                    conn.recv(65536)                 # the request, read and ignored
                    conn.sendall(LOADING_REPLY)
                except OSError:
                    pass

    thread = threading.Thread(target=answer, name="answering-while-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def check_pool_fits(model: torch.nn.Module, kv_blocks: int, where: torch.device) -> None:
    """Refuse, in one line, a KV cache larger than the memory free on ``where``."""
    from minitransformer.paged_cache import BLOCK_SIZE

    c = model.config
    weight = model.token_embedding.weight
    per_block = (2 * c.num_layers * BLOCK_SIZE * getattr(c, "num_kv_heads", c.num_heads)
                 * (c.d_model // c.num_heads) * weight.element_size())
    free = free_memory(where)
    if free is not None and kv_blocks * per_block > free:
        raise CommandLineError(
            f"--kv-blocks {kv_blocks}: the KV cache would take {kv_blocks * per_block / 1e9:,.1f}"
            f" GB, more than the {free / 1e9:,.1f} GB of memory free on {where.type}; at most "
            f"{free // per_block:,} blocks fit")


def free_memory(where: torch.device) -> int | None:
    """The bytes free on the device (``None``: unknown): CUDA's free memory, or the memory
    Linux says a program may still take (MemAvailable)."""
    if where.type == "cuda":
        return torch.cuda.mem_get_info(where)[0]
    if where.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def origin(text: str) -> str:
    """``--allowed-origins``: ``*`` or ``scheme://host[:port]``, as a browser sends it."""
    if text != "*" and ("://" not in text or text.endswith("/") or text.count("/") != 2):
        raise argparse.ArgumentTypeError(f"must be * or an origin such as "
                                         f"http://localhost:3000, got {text!r}")
    return text


def port(text: str) -> int:
    """``--port``: 0 to 65535."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number, 0 to 65535, got {text!r}")
    return int(text)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: a free one), or a one-line refusal."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (OSError, UnicodeError) as exc:
        raise CommandLineError(f"--host {host}: not an address of this machine ({exc})"
                               ) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise CommandLineError(f"--host {host} --port {port}: cannot listen there "
                               f"({exc.strerror or exc}); choose another --port") from None
    sock.set_inheritable(True)
    return sock


def load(folder: Path, where: torch.device, *, dtype: str = "float32"
         ) -> tuple[torch.nn.Module, BPETokenizer]:
    """The model and tokenizer of a model directory, a LoRA adapter directory that ``finetune``
    wrote, or a .gguf file (as ``chat`` and ``generate`` load them), in ``--dtype``."""
    return load_model(str(folder), where, dtype=dtype)


def serve(app, sock: socket.socket, uvicorn) -> None:
    """Run ``app`` on ``sock`` until SIGTERM or SIGINT; uvicorn's graceful shutdown, with the
    exit status left to the caller (uvicorn re-raises the signal, which would kill the
    process with it after a clean stop)."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                app.state.worker.draining = True        # /health says so; no new request
                count = app.state.worker.in_flight
                print(f"{PROG}: stopping: {count} answer{'s' * (count != 1)} in flight "
                      f"{'finish' if count != 1 else 'finishes'} first (at most "
                      f"{GRACE_SECONDS} s)", file=sys.stderr, flush=True)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=GRACE_SECONDS,
                            lifespan="on")
    Server(config).run(sockets=[sock])
