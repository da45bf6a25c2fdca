"""The command line's thread count (issue 29): chosen so that a busy machine cannot make the
threads wait for each other, printed, and taken from --threads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer.cli.common import threads  # noqa: E402
from helpers import run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--steps", "2", "--batch-size", "4", "--context-length", "16", "--num-layers", "1",
        "--num-heads", "2", "--d-model", "16", "--vocab-size", "260", "--no-progress",
        "--device", "cpu"]


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cores`` cores and a 1-minute load average of ``load``."""
    def set_machine(cores: int, load: float) -> None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)),
                            raising=False)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)
    return set_machine


def test_only_idle_cores_get_a_thread(machine):
    machine(2, 1.8)         # another program holds a core: one thread, not two
    assert threads(None)[0] == 1
    machine(2, 0.1)
    assert threads(None)[0] == 2
    machine(16, 3.2)        # 13 idle cores for two torchrun processes
    assert threads(None, processes=2)[0] == 6
    machine(4, 9.0)         # overloaded: still one
    assert threads(None, processes=4)[0] == 1
    assert threads(3)[0] == 3 and threads(3)[1] == "--threads"


def test_omp_num_threads_is_obeyed(machine, monkeypatch):
    machine(8, 0.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads(None) == (3, "OMP_NUM_THREADS=3")


def test_the_run_prints_its_threads_uses_them_and_gives_them_back(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    data = tmp_path / "text.txt"
    data.write_text((ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:3000], "utf-8")
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n, real=torch.set_num_threads: (
        seen.append(n), real(n)))
    before = torch.get_num_threads()
    status, stdout, stderr = run("train", "--data", data, "--out", tmp_path / "a", *TINY,
                                 "--threads", "2")
    assert status == 0, stderr
    assert "1 process of 2 threads (--threads)" in stdout.splitlines()[0]
    assert seen[0] == 2 and torch.get_num_threads() == before
    status, stdout, stderr = run("train", "--data", data, "--out", tmp_path / "a", *TINY,
                                 "--resume", "--steps", "2")
    assert status == 0 and "2 threads (as the run began)" in stdout, stderr
    status, stdout, _ = run("train", "--data", data, "--out", tmp_path / "a", *TINY,
                            "--resume", "--threads", "1")
    assert "the run began with 2 threads per process, now 1" in stdout
    status, _, stderr = run("train", "--data", data, "--out", tmp_path / "b", *TINY,
                            "--threads", "0")
    assert status == 2 and "--threads: must be a whole number at least 1" in stderr
