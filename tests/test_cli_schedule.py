"""Extending a finished run with ``--resume --steps N`` (issue 29): what it does to the cosine
schedule, and the warm-up-stable-decay schedule that extends bit for bit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer import checkpoints  # noqa: E402
from helpers import run

ROOT = Path(__file__).resolve().parent.parent
#: 40 steps of a tiny model with dropout (the global RNG matters), warm-up 4, decay from 32.
TINY = ["--batch-size", "4", "--context-length", "16", "--num-layers", "1", "--num-heads", "2",
        "--d-model", "16", "--vocab-size", "270", "--lr", "1e-2", "--dropout", "0.1",
        "--save-every", "10", "--eval-every", "10", "--no-progress", "--device", "cpu",
        "--threads", "1"]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def ckpt(folder: Path) -> tuple[dict, dict, dict]:
    """(weights, optimizer and RNG tensors, training_state.json) of a checkpoint."""
    from safetensors.torch import load_file
    state, tensors = checkpoints.load_tensors(folder)
    return load_file(folder / "model.safetensors"), tensors, state


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:4000], "utf-8")
    return path


@pytest.fixture(scope="module")
def sixty(data, tmp_path_factory) -> dict[str, Path]:
    """Runs of 60 steps begun as such, with the warm-up of a 40-step run (4 steps)."""
    found = {}
    for schedule in ("wsd", "cosine"):
        out = tmp_path_factory.mktemp("sixty") / schedule
        status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps", "60",
                                "--warmup-steps", "4", "--schedule", schedule)
        assert status == 0, stderr
        found[schedule] = out
    return found


def test_a_wsd_run_of_40_steps_extended_to_60_is_the_60_step_run_bit_for_bit(data, sixty,
                                                                             tmp_path):
    """The 40-step run keeps ckpt-32 (its decay begins after step 32). Extended, it goes back
    there and trains steps 33-60 as the 60-step run does: weights, optimizer moments, RNG
    states, the loop's history and running loss are all equal, bit for bit."""
    out = tmp_path / "wsd"
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps", "40",
                            "--schedule", "wsd")
    assert status == 0, stderr
    assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-32", "ckpt-40"]
    status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                                 "--steps", "60")
    assert status == 0, stderr
    assert "resuming from step 32" in stdout and "going back to step 32" in stdout
    extended, straight = ckpt(out / "ckpt-60"), ckpt(sixty["wsd"] / "ckpt-60")
    assert same(extended[0], straight[0]) and same(extended[1], straight[1])
    assert extended[2]["loop"] == straight[2]["loop"]         # history, running loss, step
    assert extended[2]["args"]["steps"] == 60
    assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-48", "ckpt-60"]
    status, stdout, _ = run("train", "--data", data, "--out", out, *TINY, "--resume")
    assert status == 0 and "is complete: 60 of 60 steps" in stdout


def test_a_cosine_run_extended_is_neither_run_and_says_so(data, sixty, tmp_path):
    out = tmp_path / "cosine"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "40")[0] == 0
    forty = ckpt(out / "ckpt-40")
    status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                                 "--steps", "60")
    assert status == 0, stderr
    assert "resuming from step 40" in stdout and "the cosine schedule is stretched" in stdout
    rates = ckpt(out / "ckpt-60")[2]["loop"]["history"]["learning_rates"]
    assert rates[:40] == forty[2]["loop"]["history"]["learning_rates"]
    assert rates[39] == pytest.approx(1e-3) and rates[40] > 3e-3     # back up, then down
    assert rates[59] == pytest.approx(1e-3)
    assert not same(ckpt(out / "ckpt-60")[0], ckpt(sixty["cosine"] / "ckpt-60")[0])


def test_steps_fewer_than_the_run_s_are_refused(data, tmp_path):
    out = tmp_path / "short"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "3")[0] == 0
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                            "--steps", "2")
    assert status == 2 and "a run can be extended, not shortened" in stderr
    assert stderr.count("\n") == 1
    status, _, stderr = run("train", "--data", data, "--out", tmp_path / "w", *TINY,
                            "--steps", "3", "--warmup-steps", "4")
    assert status == 2 and "--warmup-steps must be from 1 to --steps 3" in stderr
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 3
