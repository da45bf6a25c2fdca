"""What the command-line tests share: run a command in-process, one thread for the module,
train a small base model, read and compare saved tensors; and the scaffolding of the tuning
commands' tests (``finetune``, ``dpo``, ``grpo``): their base models, a model without chat
tokens, JSON-lines files, and a run stopped by Ctrl-C or SIGKILL after a checkpoint.
(Imported by the ``test_cli_*`` modules; pytest puts this folder on ``sys.path``. A fixture
imported into a module is that module's fixture; ``gpt_base`` and ``llama_base`` train on the
module's own ``data`` fixture, a folder holding ``text.txt``.)"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import one_thread, run  # noqa: F401 (one_thread: a fixture)
from minitransformer import GPT, BPETokenizer, GPTConfig, checkpoints
from minitransformer.bpe import GPT2_PATTERN

ROOT = Path(__file__).resolve().parent.parent
#: ``train``'s flags for the tuning commands' base models (``base_flags`` returns them).
BASE = ["--steps", "4", "--batch-size", "4", "--context-length", "64", "--num-layers", "1",
        "--num-heads", "2", "--d-model", "16", "--vocab-size", "280", "--no-progress",
        "--device", "cpu", "--threads", "1"]


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


def write(path: Path, lines: list) -> Path:
    """``lines`` as a JSON-lines file at ``path`` (a string is written as it is); ``path``."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines), "utf-8")
    return path


def text_folder(tmp_path_factory) -> Path:
    """A new folder holding ``text.txt``, the first 6,000 characters of the book's corpus: what
    a module's ``data`` fixture starts from."""
    folder = tmp_path_factory.mktemp("data")
    text = (ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:6000]
    (folder / "text.txt").write_text(text, "utf-8")
    return folder


@pytest.fixture(scope="module")
def base_flags() -> list:
    """``train``'s flags for ``gpt_base`` and ``llama_base``: :data:`BASE` unless the module
    defines its own ``base_flags``."""
    return BASE


@pytest.fixture(scope="module")
def gpt_base(data, base_flags, tmp_path_factory) -> Path:
    return train_base(data / "text.txt", tmp_path_factory.mktemp("base") / "gpt", base_flags)


@pytest.fixture(scope="module")
def llama_base(data, base_flags, tmp_path_factory) -> Path:
    return train_base(data / "text.txt", tmp_path_factory.mktemp("base") / "llama", base_flags,
                      "--arch", "llama")


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> Path:
    """A model directory whose tokenizer has no chat tokens (written by an older train)."""
    out = tmp_path_factory.mktemp("plain")
    tokenizer = BPETokenizer.train("the cat sat on the mat " * 20, 262, pattern=GPT2_PATTERN)
    tokenizer.save_pretrained(out)
    GPT(GPTConfig(vocab_size=len(tokenizer), context_length=16, num_layers=1, num_heads=2,
                  d_model=8)).save_pretrained(out)
    return out


# ----- a run stopped after a checkpoint, then resumed ------------------------------------------

def subprocess_env() -> dict[str, str]:
    """The environment of a command run as a process: one thread, this checkout's package."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def saved_step(out: Path) -> int:
    """The step of the last checkpoint in ``out`` (0 before the first, or mid-write)."""
    try:
        return json.loads((out / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def interrupt_after(monkeypatch, command, step: int):
    """Make the command module ``command`` raise KeyboardInterrupt (Ctrl-C) right after it saves
    the checkpoint of ``step``; returns a function that puts the plain save back."""
    save = command.save_checkpoint

    def save_then_stop(out, loop, *args, **kwargs):
        save(out, loop, *args, **kwargs)
        if loop.step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(command, "save_checkpoint", save_then_stop)
    return lambda: monkeypatch.setattr(command, "save_checkpoint", save)


def kill_after_checkpoint(command: str, out: Path, flags: list, *, steps: int,
                          pause: float = 0.05) -> int:
    """Run ``python -m minitransformer COMMAND --out OUT FLAGS --save-every 1`` as a process
    and SIGKILL it at a random moment (up to ``pause`` s) after its checkpoint of step 3, before
    the run of ``steps`` steps can end: the step of the last checkpoint it left."""
    process = subprocess.Popen(
        [sys.executable, "-m", "minitransformer", command, "--out", str(out), *map(str, flags),
         "--save-every", "1"], env=subprocess_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while saved_step(out) < 3 and process.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, pause))
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    step = saved_step(out)
    assert process.returncode == -signal.SIGKILL and 3 <= step < steps, (step, stderr[-2000:])
    return step


def assert_same_run(out: Path, straight: Path, steps: int,
                    weights: str = "model.safetensors") -> None:
    """The run in ``out`` ended as ``straight`` did, bit for bit: the saved ``weights`` and
    the last checkpoint's tensors (the weights, the optimizer's moments, the RNG states)."""
    assert equal(tensors(out / weights), tensors(straight / weights))
    assert equal(checkpoints.load_tensors(out / f"ckpt-{steps}")[1],
                 checkpoints.load_tensors(straight / f"ckpt-{steps}")[1])
