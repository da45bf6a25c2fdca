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
from minitransformer.chat import CHAT_TOKENS
from minitransformer.cli.common import PROG, CommandLineError, device, model_class, threads

GRACE_SECONDS = 30


def run(args: argparse.Namespace) -> int:
    folder = Path(args.model)
    if not folder.is_dir():
        raise CommandLineError(f"--model {args.model}: no such directory")
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
    """The model and tokenizer of a model directory; with the chat tokens, also of a LoRA
    adapter directory that ``finetune`` wrote (as ``chat`` loads it)."""
    tokenizer = BPETokenizer.from_pretrained(folder)
    if all(token in tokenizer.special_tokens for token in CHAT_TOKENS):
        from minitransformer.cli import chat
        return chat.load(folder, where)
    return model_class(folder).from_pretrained(folder, device=where), tokenizer


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
