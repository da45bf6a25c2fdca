"""``minitransformer serve``: an OpenAI-compatible server for a model directory (chapter 18).

The model, its tokenizer and a :class:`~minitransformer.serving.Engine` go behind
:func:`minitransformer.server.create_app`, run by uvicorn on a socket bound here first, so that
a port in use is a one-line refusal. SIGTERM or Ctrl+C stops it cleanly: no new connection is
taken, the answers in flight are finished (those still running after ``GRACE_SECONDS`` are
cancelled, freeing their blocks), and the program exits with status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from pathlib import Path

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.cli.common import (
    PROG,
    CommandLineError,
    device,
    load_model,
    positive,
    threads,
)

GRACE_SECONDS = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "An OpenAI-compatible server: POST /v1/chat/completions (the chat template) and "
        "/v1/completions, streamed or not, GET /v1/models, and a chat page at /. Requests "
        "share every forward pass (continuous batching) and a paged KV cache. Needs the extra: "
        "pip install 'minitransformer[serve]'. SIGTERM or Ctrl+C finishes the answers in "
        "flight and exits.")
    add = parser.add_argument
    add("--model", metavar="DIR|FILE.gguf", required=True, help="a directory written by train "
        "or finetune (the chat endpoint needs the chat tokens), or a .gguf file")
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
    add("--device", help="default: minitransformer.default_device()")
    add("--threads", type=positive, help="CPU threads (default: OMP_NUM_THREADS, else the "
        "cores idle now)")


def run(args: argparse.Namespace) -> int:
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

    where = device(args.device)
    sock = listen(args.host, args.port)
    before = torch.get_num_threads()        # given back: main() may run inside a notebook
    try:
        torch.set_num_threads(threads(args.threads)[0])
        model, tokenizer = load(folder, where)
        engine = Engine(model.eval(), tokenizer, max_batch=args.max_batch,
                        kv_blocks=args.kv_blocks, pack_weights=not args.no_pack_weights)
        name = args.name or folder.resolve().name
        app = create_app(engine, tokenizer, model_name=name)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        print(f"serving {folder} as the model {name!r} at {url}/v1 (chat page: {url}/); "
              f"SIGTERM or Ctrl+C stops it", flush=True)
        serve(app, sock, uvicorn)
    finally:
        sock.close()
        torch.set_num_threads(before)
    return 0


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


def load(folder: Path, where: torch.device) -> tuple[torch.nn.Module, BPETokenizer]:
    """The model and tokenizer of a model directory, a LoRA adapter directory that ``finetune``
    wrote, or a .gguf file (as ``chat`` and ``generate`` load them)."""
    return load_model(str(folder), where)


def serve(app, sock: socket.socket, uvicorn) -> None:
    """Run ``app`` on ``sock`` until SIGTERM or SIGINT; uvicorn's graceful shutdown, with the
    exit status left to the caller (uvicorn re-raises the signal, which would kill the
    process with it after a clean stop)."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
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
