"""``minitransformer generate``: continue a prompt with a directory that ``train`` wrote."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from minitransformer import checkpoints
from minitransformer.bpe import BPETokenizer
from minitransformer.cli.common import CommandLineError, architecture, device
from minitransformer.generation import generate


def run(args: argparse.Namespace) -> int:
    folder = Path(args.model)
    if not folder.is_dir():
        raise CommandLineError(f"--model {args.model}: no such directory")
    where = device(args.device)
    tokenizer = BPETokenizer.from_pretrained(folder)
    config = folder / "config.json"
    model_type = checkpoints.read_json(config).get("model_type") if config.is_file() else None
    model_class = architecture("llama" if model_type == "llama" else "gpt")[0]
    model = model_class.from_pretrained(folder, device=where)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise CommandLineError("--prompt is empty: give the text to continue")
    generator = torch.Generator(where).manual_seed(args.seed)
    room = model.config.context_length - len(ids)
    if room < 0:
        raise CommandLineError(f"--prompt is {len(ids)} tokens, more than the model's context "
                               f"of {model.config.context_length}")
    new_tokens = min(40, room) if args.max_new_tokens is None else args.max_new_tokens
    idx = torch.tensor([ids], device=where)
    out = generate(model, idx, new_tokens, temperature=args.temperature, top_k=args.top_k,
                   generator=generator)
    print(tokenizer.decode(out[0].tolist()))
    return 0
