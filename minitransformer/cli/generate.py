"""``minitransformer generate``: continue a prompt with a model directory (``train``'s,
``finetune``'s or ``dpo``'s), printing the prompt, then each token as it comes."""

from __future__ import annotations

import argparse

import torch

from minitransformer.cli.common import (
    DEFAULT_MODEL,
    CommandLineError,
    add_dtype_flag,
    add_model_flags,
    add_sampling_flags,
    device,
    load_model,
    print_stream,
    using_threads,
)
from minitransformer.generation import stream_tokens

#: new tokens when --max-new-tokens is not given (fewer when the context has less room)
MAX_NEW_TOKENS = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Print the prompt and its continuation."
    parser.add_argument("--prompt", required=True, help="the text to continue")
    add_model_flags(parser, "a model directory (train's, finetune's or dpo's) or a .gguf file "
                    + DEFAULT_MODEL, metavar="DIR|FILE.gguf")
    add_sampling_flags(parser, length=f"the most new tokens (default {MAX_NEW_TOKENS}, or as "
                       f"many as the model's context leaves after the prompt)")
    add_dtype_flag(parser)


def run(args: argparse.Namespace) -> int:
    where = device(args.device)
    with using_threads(args.threads):
        model, tokenizer = load_model(args.model, where, dtype=args.dtype)
        ids = tokenizer.encode(args.prompt)
        if not ids:
            raise CommandLineError("--prompt is empty: give the text to continue")
        context = model.config.context_length
        if len(ids) > context:
            raise CommandLineError(f"--prompt is {len(ids)} tokens, more than the model's "
                                   f"context of {context}")
        room = context - len(ids)
        if args.max_new_tokens and args.max_new_tokens > room:
            raise CommandLineError(f"--max-new-tokens {args.max_new_tokens}: the prompt's "
                                   f"{len(ids)} tokens leave room for {room} in the model's "
                                   f"context of {context}")
        generator = torch.Generator(where).manual_seed(args.seed)
        tokens = stream_tokens(model, ids, args.max_new_tokens or min(MAX_NEW_TOKENS, room),
                               temperature=args.temperature, top_k=args.top_k,
                               generator=generator) if room else ()
        print_stream(tokens, tokenizer, before=ids)     # no stop: as serve's completions
    return 0
