"""The command line says what it did instead of what was asked, and refuses in one line
(issue 29): a vocabulary the text cannot fill, a device this machine lacks, a bad flag under
torchrun printed by rank 0 alone."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer import BPETokenizer  # noqa: E402
from minitransformer.chat import CHAT_TOKENS  # noqa: E402
from minitransformer.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--steps", "1", "--batch-size", "2", "--context-length", "8", "--num-layers", "1",
        "--num-heads", "1", "--d-model", "8", "--no-progress", "--device", "cpu",
        "--threads", "1"]


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def test_a_vocabulary_larger_than_the_text_can_fill_is_the_size_learned_and_said(tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("the cat sat on the mat. " * 40, "utf-8")
    status, stdout, stderr = run("train", "--data", data, "--out", tmp_path / "run", *TINY,
                                 "--vocab-size", "100000")
    assert status == 0, stderr
    learned = len(BPETokenizer.from_pretrained(tmp_path / "run"))
    assert learned < 300
    assert f"--vocab-size 100,000: the text holds no more pairs to merge after " \
           f"{learned - 256 - len(CHAT_TOKENS)} merges, so the tokenizer and the model have " \
           f"{learned} tokens" \
        in stdout
    assert json.loads((tmp_path / "run" / "config.json").read_text())["vocab_size"] == learned
    status, _, stderr = run("train", "--data", data, "--out", tmp_path / "run", *TINY,
                            "--vocab-size", "100000", "--resume", "--steps", "2")
    assert status == 0, stderr      # the flag as given is the run's flag


@pytest.mark.parametrize("name, words", [
    ("mps", "--device mps: only cpu and cuda are supported"),
    ("xpu:0", "--device xpu:0: only cpu and cuda are supported"),
    ("cuda:7", "--device cuda:7: "),
    ("gpu", "--device gpu: not a device name"),
])
def test_a_device_this_machine_lacks_is_one_line_naming_it(tmp_path, name, words):
    data = tmp_path / "text.txt"
    data.write_text("the cat sat on the mat. " * 40, "utf-8")
    for argv in (["train", "--data", data, "--out", tmp_path / "run", *TINY, "--device", name],
                 ["generate", "--model", tmp_path, "--prompt", "a", "--device", name]):
        status, _, stderr = run(*argv)
        assert status == 2 and stderr.count("\n") == 1 and words in stderr, stderr
    if name == "cuda:7" and torch.cuda.is_available():
        assert f"this machine has {torch.cuda.device_count()} CUDA device" in stderr


def test_a_refusal_is_printed_by_rank_0_alone(monkeypatch, tmp_path):
    for rank, lines in (("1", 0), ("0", 1)):
        monkeypatch.setenv("RANK", rank)
        status, _, stderr = run("train", "--out", tmp_path, "--steps", "0")
        assert status == 2 and stderr.count("\n") == lines, (rank, stderr)


def test_under_torchrun_a_bad_flag_is_printed_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "minitransformer", "train", "--out", str(tmp_path), "--steps", "0"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert result.returncode != 0
    assert result.stderr.count("--steps: must be a whole number at least 1") == 1, result.stderr[-2000:]


@pytest.mark.parametrize("argv", [["train", "--dat", "x.txt", "--out", "o"],
                                  ["generate", "--mod", "m", "--prompt", "a"]])
def test_an_abbreviated_flag_is_refused_not_guessed(tmp_path, argv):
    """argparse would read --dat as --data: a misspelt flag must not silently run."""
    status, _, stderr = run(*argv)
    assert status == 2 and "\n" not in stderr.strip(), stderr
    assert "unrecognized arguments: --dat" in stderr or "required: --model" in stderr, stderr
