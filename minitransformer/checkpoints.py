"""Training checkpoints that survive a kill, and resuming from them bit for bit (chapter 15).

A run's directory, written by the command line (:mod:`minitransformer.cli.train`)::

    DIR/config.json, model.safetensors        the latest weights, as GPT-2's files (chapter 13)
    DIR/vocab.json, merges.txt, tokenizer.json, tokenizer_config.json   the tokenizer (ch. 12)
    DIR/trainer_state.json                    {"step": k, "world_size": n, "checkpoint": "ckpt-k"}
    DIR/ckpt-k/                               everything that decides the rest of the run:
        config.json, model.safetensors, vocab.json, merges.txt, tokenizer.json,
        tokenizer_config.json
        training_state.safetensors            optimizer moments, RNG states (tensors)
        training_state.json                   step, running loss, history, the run's flags

A checkpoint is several files, so one ``os.replace`` cannot make it atomic. :func:`save` writes
it into ``DIR/ckpt.tmp-<step>/``, flushes every file and the folder to the disk (``fsync``),
renames it to ``DIR/ckpt-<step>/``, then atomically replaces ``trainer_state.json`` to name it,
copies the model and tokenizer files to the top, and only then removes the older checkpoint.
:func:`latest` trusts only what ``trainer_state.json`` names, so a kill, or a power loss, at any
moment leaves the last complete checkpoint loadable. A kill between the rename and the removal
leaves two checkpoints, the older one still named or the newer one already; the next save, or
``--resume``, removes the one not named. Before the first ``trainer_state.json`` there is no run,
only leftovers (:func:`unfinished_first_save`). Only safetensors and JSON are read, never a pickle.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from torch import Tensor

STATE_FILE = "trainer_state.json"
TENSORS_FILE = "training_state.safetensors"
JSON_FILE = "training_state.json"
#: The top-level files refreshed after each checkpoint, the weights last.
TOP_LEVEL = ("config.json", "vocab.json", "merges.txt", "tokenizer.json",
             "tokenizer_config.json", "model.safetensors")
_NAME = re.compile(r"ckpt-(\d+)")
_CHECKPOINT = re.compile(r"ckpt(\.tmp)?-\d+")


def write_json(path: Path, data: dict, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` under a temporary name, flushed to the disk, then
    ``os.replace`` it: a reader sees the old file or the new one, never half of one. With
    ``sync``, the directory is flushed too, so that the replace itself is on the disk."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    _fsync(tmp)
    os.replace(tmp, path)
    if sync:
        _fsync(path.parent)


def read_json(path: Path) -> dict:
    """A JSON object from ``path``, or a ``ValueError`` naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def rng_states(generator: torch.Generator) -> dict[str, Tensor]:
    """Every random number generator that draws data or dropout: the data ``generator`` (its
    state is the data position), torch's global CPU generator and, with CUDA, each GPU's."""
    states = {"rng.data": generator.get_state(), "rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"rng.cuda.{i}"] = state
    return states


def set_rng_states(states: dict[str, Tensor], generator: torch.Generator) -> None:
    """Restore what :func:`rng_states` saved."""
    generator.set_state(states["rng.data"])
    torch.set_rng_state(states["rng.torch"])
    cuda = [states[f"rng.cuda.{i}"] for i in range(torch.cuda.device_count())
            if f"rng.cuda.{i}" in states]
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """The optimizer's per-parameter state (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``) as
    flat names, ``optim.<param index>.<key>``. The hyperparameters are not saved: the program
    builds the same optimizer again, and the loop sets the learning rate every step."""
    return {f"optim.{index}.{key}": value
            for index, state in optimizer.state_dict()["state"].items()
            for key, value in state.items()}


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor]) -> None:
    """Put :func:`optimizer_tensors`' tensors back into a freshly built ``optimizer``."""
    state: dict[int, dict[str, Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state,
                               "param_groups": optimizer.state_dict()["param_groups"]})


def save(out: Path, *, step: int, world_size: int, write_model, tensors: dict[str, Tensor],
         state: dict, keep: tuple[str, ...] = ()) -> Path:
    """Write the checkpoint of ``step`` into ``out`` with the protocol of this module's
    docstring, and return its folder. ``write_model(folder)`` writes the weights and the
    tokenizer files; ``tensors`` and ``state`` are the rest (safetensors and JSON). Older
    checkpoints are removed, except those named in ``keep``; nothing else is."""
    from safetensors.torch import save_file

    tmp = out / f"ckpt.tmp-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_model(tmp)
    save_file({name: t.detach().to("cpu").contiguous() for name, t in tensors.items()},
              tmp / TENSORS_FILE, metadata={"format": "pt"})
    write_json(tmp / JSON_FILE, state, sync=False)
    for file in tmp.iterdir():              # on the disk, not only in the page cache
        _fsync(file)
    _fsync(tmp)
    final = out / f"ckpt-{step}"
    if final.exists():      # written by a run killed before trainer_state.json named it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(out)                             # the rename, before a file names the folder
    write_json(out / STATE_FILE, {"step": step, "world_size": world_size,
                                  "checkpoint": final.name})
    publish(out, final)
    prune(out, final, keep=keep)
    return final


def prune(out: Path, folder: Path, *, keep: tuple[str, ...] = ()) -> None:
    """Remove from ``out`` every checkpoint but ``folder`` and those named in ``keep``, and
    the temporary files of :func:`save`; nothing that :func:`save` does not write."""
    for old in out.iterdir():
        if old != folder and old.name not in keep and _written_here(old.name, folder):
            shutil.rmtree(old) if old.is_dir() else old.unlink()


def publish(out: Path, folder: Path) -> None:
    """Copy the checkpoint's model and tokenizer files to the top of ``out``, each under a
    temporary name first, then moved into place with ``os.replace``, the weights last."""
    names = sorted((f.name for f in folder.iterdir() if f.name not in (TENSORS_FILE, JSON_FILE)),
                   key=lambda name: name == "model.safetensors")
    for name in names:
        part = out / (name + ".tmp")
        shutil.copyfile(folder / name, part)
        _fsync(part)
        os.replace(part, out / name)
    _fsync(out)


def _written_here(name: str, final: Path) -> bool:
    """Whether ``name`` in a run's directory is something :func:`save` writes and may remove:
    a checkpoint folder, or the temporary name of one of its files, never a user's file."""
    if _CHECKPOINT.fullmatch(name):
        return True
    ours = {STATE_FILE, *TOP_LEVEL, *(f.name for f in final.iterdir())}
    return name.endswith(".tmp") and name[:-len(".tmp")] in ours


def unfinished_first_save(out: Path) -> list[Path]:
    """What a kill during the first :func:`save` leaves in ``out``: checkpoint folders and
    ``trainer_state.json.tmp``, with no ``trainer_state.json``. Empty if ``out`` holds anything
    else (then it is a run, or a user's files)."""
    if not out.is_dir() or (out / STATE_FILE).exists():
        return []
    found = list(out.iterdir())
    ok = all(_CHECKPOINT.fullmatch(p.name) and p.is_dir() or p.name == STATE_FILE + ".tmp"
             for p in found)
    return found if ok else []


def _fsync(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to the disk: a power loss, not only a kill,
    then finds what was written before. Directories cannot be opened on Windows: skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except (PermissionError, IsADirectoryError):
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def point_to(out: Path, folder: Path, *, world_size: int) -> None:
    """Make ``trainer_state.json`` name the whole checkpoint ``folder`` (one atomic replace): a
    run goes back to it, as when a WSD run is extended from where its decay began."""
    step = int(_NAME.fullmatch(folder.name).group(1))
    write_json(out / STATE_FILE, {"step": step, "world_size": world_size,
                                  "checkpoint": folder.name})


def latest(out: Path, *, name: str | None = None) -> tuple[dict, Path]:
    """``(trainer_state, checkpoint folder)`` of the run in ``out``: the folder that
    ``trainer_state.json`` names, and nothing else; or, with ``name``, that older checkpoint
    of the run (one that :func:`save` kept).

    Raises:
        FileNotFoundError: no ``trainer_state.json``, or the folder it names is gone.
        ValueError: a ``trainer_state.json`` that is not what :func:`save` writes.
    """
    wanted = name
    path = out / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume in {out}: it has no {STATE_FILE}")
    state = read_json(path)
    name = state.get("checkpoint")
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None or int(match.group(1)) != state.get("step"):
        raise ValueError(f"{path} does not name a checkpoint ckpt-<step> of its step")
    size = state.get("world_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"{path} has no world_size (a whole number >= 1): it is not what "
                         f"checkpoints.save writes (edited or damaged?)")
    if wanted is not None:
        name = wanted
        if not (out / name).is_dir():
            raise FileNotFoundError(f"{out} has no {name}")
    folder = out / name
    if not folder.is_dir():
        raise FileNotFoundError(f"{path} names {name}, which is not in {out}")
    return state, folder


def load_tensors(folder: Path) -> tuple[dict, dict[str, Tensor]]:
    """``(state, tensors)`` that :func:`save` wrote into ``folder``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(folder / TENSORS_FILE, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{folder / TENSORS_FILE} is not a readable safetensors file "
                         f"({exc})") from None
    return read_json(folder / JSON_FILE), tensors
