"""``minitransformer chat``: talk with a fine-tuned model (chapter 16).

Each line of standard input is a user turn; ``/exit`` or the end of the input ends the chat. The
whole conversation so far goes through the chat template with the generation prompt, and the
reply is generated from one KV cache (:func:`~minitransformer.generation.stream_tokens`) and
printed as it comes, whole characters only, up to the end-of-turn token.
"""

from __future__ import annotations

import argparse
import sys

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.chat import CHAT_TOKENS, apply_chat_template
from minitransformer.cli.common import (
    CommandLineError,
    add_model_flags,
    add_sampling_flags,
    chat_tokens_of,
    device,
    load_model,
    print_stream,
    using_threads,
)
from minitransformer.generation import stream_tokens

EXIT = "/exit"
#: the longest reply when --max-new-tokens is not given (shorter where the context ends)
MAX_NEW_TOKENS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "An interactive chat: each line of standard input is a user turn (/exit or the end of "
        "input ends the chat); the reply is streamed as it is generated, and the conversation "
        "is kept.")
    parser.add_argument("--system", metavar="TEXT", help="a system message that begins the "
                        "conversation")
    add_model_flags(parser, "a model directory with the chat tokens (finetune's --out, its "
                    "merged/, or a LoRA adapter it wrote)", required=True)
    add_sampling_flags(parser, length=f"the longest reply (default {MAX_NEW_TOKENS}, or as "
                       f"many as the model's context leaves)")


def run(args: argparse.Namespace) -> int:
    where = device(args.device)
    with using_threads(args.threads):
        model, tokenizer = load_model(args.model, where)
        chat_tokens_of(tokenizer, args.model)
        return _converse(model, tokenizer, args, where)


def _converse(model: torch.nn.Module, tokenizer: BPETokenizer, args: argparse.Namespace,
              where: torch.device) -> int:
    """Read a turn, stream the reply, keep both; until /exit or the end of the input."""
    stops = {tokenizer.special_tokens[t] for t in CHAT_TOKENS}   # <|end|>, or any marker
    messages = [{"role": "system", "content": args.system}] if args.system else []
    generator = torch.Generator(where).manual_seed(args.seed)
    context = model.config.context_length
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == EXIT:
            return 0
        messages.append({"role": "user", "content": line.rstrip("\r\n")})
        try:
            ids = apply_chat_template(tokenizer, messages, add_generation_prompt=True)
        except ValueError as exc:
            raise CommandLineError(f"turn {len(messages)}: {exc}") from None
        if len(ids) >= context:
            raise CommandLineError(f"the conversation is now {len(ids)} tokens, the model's "
                                   f"context {context}: no room for a reply (start a new chat)")
        limit = min(args.max_new_tokens or MAX_NEW_TOKENS, context - len(ids))
        reply = _stream(model, tokenizer, ids, limit, args.temperature, generator, stops,
                        top_k=args.top_k)
        messages.append({"role": "assistant", "content": reply})


def _stream(model: torch.nn.Module, tokenizer: BPETokenizer, ids: list[int], limit: int,
            temperature: float, generator: torch.Generator, stops: set[int], *,
            top_k: int | None = None) -> str:
    """Generate up to ``limit`` tokens after ``ids`` from one KV cache, printing each as it
    comes, until a chat token (``<|end|>``); the reply's text."""
    tokens = stream_tokens(model, ids, limit, temperature=temperature, top_k=top_k,
                           stop_ids=stops, generator=generator)
    return print_stream(tokens, tokenizer, stops=stops)
