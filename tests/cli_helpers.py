"""What the command-line tests share: run a command in-process, one thread for the module,
train a small base model, and read and compare saved tensors. (Imported by the ``test_cli_*``
modules; pytest puts this folder on ``sys.path``.)"""

from __future__ import annotations

from pathlib import Path

import torch

from helpers import one_thread, run  # noqa: F401 (one_thread: a fixture)


def train_base(text: Path, out: Path, flags: list, *extra) -> Path:
    """``train`` a small model on ``text`` into ``out`` with ``flags`` (and ``extra``), for the
    commands that start from a base model; ``out``."""
    status, _, stderr = run("train", "--data", text, "--out", out, *flags, *extra)
    assert status == 0, stderr
    return out


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file."""
    from safetensors.torch import load_file
    return load_file(path)


def equal(a: dict, b: dict) -> bool:
    """Whether two dicts of tensors hold the same names and the same values, bit for bit."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
