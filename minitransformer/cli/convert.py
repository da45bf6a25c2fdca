"""``minitransformer convert DIR``: ``DIR/pytorch_model.bin`` (a pickle) -> ``model.safetensors``.

The package reads only safetensors. ``torch.load(weights_only=True)`` unpickles tensors and plain
containers but refuses to run any other code a pickle may hold. Tensors that are one tensor under
two names (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) are stored once, under the
first name, as ``transformers`` does; the ``.bin`` file is kept.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import warnings
from pathlib import Path

import torch

from minitransformer import checkpoints
from minitransformer.cli.common import CommandLineError

BIN = "pytorch_model.bin"
SAFETENSORS = "model.safetensors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"Write DIR/{SAFETENSORS} from DIR/{BIN} (read with torch.load(weights_only=True), "
        f"which runs no code from the file); tied tensors are stored once, the .bin is kept.")
    parser.add_argument("dir", metavar="DIR", help=f"a directory with a {BIN}, or the file "
                        f"itself")


def run(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    source = folder if folder.is_file() else folder / BIN
    folder = source.parent
    target = folder / SAFETENSORS
    if not source.is_file():
        index = folder / (BIN + ".index.json")
        if index.is_file():
            raise CommandLineError(f"{args.dir}: a sharded checkpoint ({index.name}) is not "
                                   f"supported, only one {BIN}")
        raise CommandLineError(f"{args.dir}: no {BIN}")
    if target.exists():
        raise CommandLineError(f"{target} exists already: it is kept, and nothing is converted")
    state = _load(source)
    if not isinstance(state, dict) or not state:
        raise CommandLineError(f"{source} holds a {type(state).__name__}, not a state dict "
                               f"(names -> tensors)")
    tensors, tied = _once(state, source)
    from safetensors.torch import save_file
    part = target.with_name(target.name + ".tmp")
    save_file(tensors, part, metadata={"format": "pt"})
    checkpoints._fsync(part)
    os.replace(part, target)
    checkpoints._fsync(folder)
    same = "".join(f"; {a} stored once with {b}" for a, b in tied)
    print(f"wrote {target}: {len(tensors)} tensors{same}; {source.name} is kept")
    return 0


def _load(source: Path) -> object:
    """What ``torch.load(weights_only=True)`` reads from ``source``, torch's warnings silenced
    (the refusal says what went wrong, in one line)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(source, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError,
            OSError) as exc:      # AttributeError, OSError: a damaged file, deep in torch
        words = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))       # torch's bold type
        message = " ".join(words.split())[:300] or f"{type(exc).__name__} (an empty file?)"
        raise CommandLineError(f"{source} cannot be read with torch.load(weights_only=True), "
                               f"which runs no code from the file: {message}") from None


def _once(state: dict, source: Path) -> tuple[dict[str, torch.Tensor], list[tuple[str, str]]]:
    """The tensors to write, each tied tensor under its first name; and ``(dropped, kept)``."""
    kept: dict[tuple, str] = {}
    tensors, tied = {}, []
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            kind = type(value).__name__
            article = "an" if kind[0] in "aeiouAEIOU" else "a"
            raise CommandLineError(f"{source} holds {name!r}: {article} {kind}, not a tensor (a "
                                   f"state dict maps names to tensors)")
        if value.layout != torch.strided or value.is_nested:
            kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
            raise CommandLineError(f"{source} holds {name!r}: a {kind} tensor; safetensors "
                                   f"stores dense tensors only")
        view = (value.untyped_storage().data_ptr(), value.storage_offset(), value.dtype,
                tuple(value.shape), value.stride())
        if value.numel() and view in kept:
            tied.append((name, kept[view]))
            continue
        kept[view] = name
        tensors[name] = value.detach().clone().contiguous()    # no storage shared in the file
    return tensors, tied
