"""``minitransformer chat``: talk with a fine-tuned model (chapter 16).

Each line of standard input is a user turn; ``/exit`` or the end of the input ends the chat. The
whole conversation so far goes through the chat template with the generation prompt, and the
reply is generated one token at a time and printed as it comes, up to the end-of-turn token.
A token can end in the middle of a character: the bytes go through an incremental UTF-8
decoder, which prints a character once all its bytes are there.
"""

from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path

import torch

from minitransformer import checkpoints
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import CHAT_TOKENS, apply_chat_template
from minitransformer.cli.common import CommandLineError, chat_tokens_of, device, model_class
from minitransformer.generation import generate
from minitransformer.lora import ADAPTER_CONFIG_FILE, load_adapter

EXIT = "/exit"


def load(folder: Path, where: torch.device) -> tuple[torch.nn.Module, BPETokenizer]:
    """The model and tokenizer of a model directory, or of a LoRA adapter directory that
    ``finetune`` wrote (its base model, read from ``base_model_name_or_path``, with the
    adapter)."""
    tokenizer = BPETokenizer.from_pretrained(folder)
    chat_tokens_of(tokenizer, str(folder))
    adapter = folder / ADAPTER_CONFIG_FILE
    if adapter.is_file() and not (folder / "config.json").is_file():
        base = checkpoints.read_json(adapter).get("base_model_name_or_path")
        if not isinstance(base, str) or not Path(base).is_dir():
            raise CommandLineError(f"{adapter}: its base model {base!r} is not a directory "
                                   f"here")
        model = model_class(Path(base)).from_pretrained(base, device=where)
        load_adapter(model, folder)
    else:
        model = model_class(folder).from_pretrained(folder, device=where)
    return model, tokenizer


def run(args: argparse.Namespace) -> int:
    folder = Path(args.model)
    if not folder.is_dir():
        raise CommandLineError(f"--model {args.model}: no such directory")
    if not args.temperature >= 0:
        raise CommandLineError(f"--temperature must be 0 or more, got {args.temperature}")
    where = device(args.device)
    model, tokenizer = load(folder, where)
    model.eval()
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
        reply = _stream(model, tokenizer, ids, min(args.max_new_tokens, context - len(ids)),
                        args.temperature, generator, stops)
        messages.append({"role": "assistant", "content": reply})


def _stream(model: torch.nn.Module, tokenizer: BPETokenizer, ids: list[int], limit: int,
            temperature: float, generator: torch.Generator, stops: set[int]) -> str:
    """Generate up to ``limit`` tokens after ``ids``, printing each as it comes, until a chat
    token (``<|end|>``); the reply's text."""
    idx = torch.tensor([ids], device=generator.device)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = []
    for _ in range(limit):
        idx = generate(model, idx, 1, temperature=temperature, generator=generator)
        token = idx[0, -1].item()
        if token in stops:
            break
        pieces.append(decoder.decode(tokenizer.token_bytes(token)))
        print(pieces[-1], end="", flush=True)
    pieces.append(decoder.decode(b"", final=True))
    print(pieces[-1], flush=True)
    return "".join(pieces)

