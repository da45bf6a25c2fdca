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
from pathlib import Path

import torch

from minitransformer import checkpoints
from minitransformer.cli.common import CommandLineError

BIN = "pytorch_model.bin"
SAFETENSORS = "model.safetensors"


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
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        message = " ".join(str(exc).split())[:300]
        raise CommandLineError(f"{source} cannot be read with torch.load(weights_only=True), "
                               f"which runs no code from the file: {message}") from None
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


def _once(state: dict, source: Path) -> tuple[dict[str, torch.Tensor], list[tuple[str, str]]]:
    """The tensors to write, each tied tensor under its first name; and ``(dropped, kept)``."""
    kept: dict[tuple, str] = {}
    tensors, tied = {}, []
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise CommandLineError(f"{source} holds {name!r}: a {type(value).__name__}, not a "
                                   f"tensor (a state dict maps names to tensors)")
        view = (value.untyped_storage().data_ptr(), value.storage_offset(), value.dtype,
                tuple(value.shape), value.stride())
        if value.numel() and view in kept:
            tied.append((name, kept[view]))
            continue
        kept[view] = name
        tensors[name] = value.detach().clone().contiguous()    # no storage shared in the file
    return tensors, tied
