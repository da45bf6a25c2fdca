"""``minitransformer chat``: talk with a fine-tuned model (chapter 16), or with a GGUF file's
model, SmolLM2-135M-Instruct when no ``--model`` is given (chapter 19).

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
from minitransformer.chat import apply_chat_template, stop_token_ids
from minitransformer.cli.common import (
    DEFAULT_MODEL,
    CommandLineError,
    add_dtype_flag,
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
MAX_NEW_TOKENS = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "An interactive chat: each line of standard input is a user turn (/exit or the end of "
        "input ends the chat); the reply is streamed as it is generated, and the conversation "
        "is kept.")
    parser.add_argument("--system", metavar="TEXT", help="a system message that begins the "
                        "conversation")
    add_model_flags(parser, "a model with a chat format: a model directory with the chat "
                    "tokens (finetune's --out, its merged/, or a LoRA adapter it wrote), or a "
                    f".gguf file with a chat template {DEFAULT_MODEL}", metavar="DIR|FILE.gguf")
    add_sampling_flags(parser, length=f"the longest reply (default {MAX_NEW_TOKENS}, or as "
                       f"many as the model's context leaves)")
    add_dtype_flag(parser)


def run(args: argparse.Namespace) -> int:
    where = device(args.device)
    with using_threads(args.threads):
        model, tokenizer = load_model(args.model, where, dtype=args.dtype)
        return _converse(model, tokenizer, _stops(tokenizer, args.model), args, where)


def _stops(tokenizer: BPETokenizer, model: str | None) -> set[int]:
    """The tokens that end a reply: the end-of-turn token (``<|end|>``, SmolLM2's
    ``<|im_end|>``) and every other special token; refused where there is no chat format."""
    try:
        return set(stop_token_ids(tokenizer))
    except ValueError as exc:
        if tokenizer.chat_template is None:
            chat_tokens_of(tokenizer, str(model))       # the refusal naming what is missing
        raise CommandLineError(f"--model {model}: {exc}") from None


def _converse(model: torch.nn.Module, tokenizer: BPETokenizer, stops: set[int],
              args: argparse.Namespace, where: torch.device) -> int:
    """Read a turn, stream the reply, keep both; until /exit or the end of the input."""
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
    comes, until a token of ``stops``; the reply's text."""
    tokens = stream_tokens(model, ids, limit, temperature=temperature, top_k=top_k,
                           stop_ids=stops, generator=generator)
    return print_stream(tokens, tokenizer, stops=stops)
