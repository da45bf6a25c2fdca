"""``minitransformer prepare`` and ``train --data DATA_DIR`` (issue 31): a prepared directory
trains from memory maps, resumes bit for bit, two torchrun processes equal one, and every
mistake is one line on stderr with exit status 2."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer.token_files import TokenFiles  # noqa: E402
# one_thread is an autouse fixture: imported, it runs this module on one thread
from cli_helpers import one_thread, run  # noqa: E402, F401

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
DATA = Path(__file__).resolve().parent / "data"
TINY = ["--batch-size", "8", "--context-length", "16", "--num-layers", "2", "--num-heads", "2",
        "--d-model", "32", "--lr", "1e-2", "--eval-every", "10", "--no-progress", "--device",
        "cpu", "--threads", "1"]


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_bytes((ROOT / "book" / "data" / "corpus.txt").read_bytes()[:20000]
                     + (DATA / "multilingual.txt").read_bytes())
    out = tmp_path_factory.mktemp("prepared") / "data"
    status, stdout, stderr = run("prepare", "--data", text, "--out", out, "--vocab-size", "300",
                                 "--workers", "2", "--no-progress")
    assert status == 0, stderr
    assert stdout.startswith(f"prepared {out}: ") and "(uint16)" in stdout
    return out


def test_train_on_a_prepared_directory(prepared, tmp_path):
    out = tmp_path / "run"
    status, stdout, stderr = run("train", "--data", prepared, "--out", out, "--steps", "10",
                                 *TINY)
    assert status == 0, stderr
    files = TokenFiles(prepared)
    assert f"on {len(files.train):,} tokens ({len(files.val):,} held out)" in stdout
    assert (out / "vocab.json").read_bytes() == (prepared / "vocab.json").read_bytes()
    assert "val loss" in stdout


def saved_step(out: Path) -> int:
    try:
        return json.loads((out / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigkill_then_resume_on_a_prepared_directory_is_bit_identical(prepared, tmp_path):
    flags = ["--data", prepared, "--steps", "150", *TINY, "--dropout", "0.1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run("train", "--out", straight, *flags, "--save-every", "150")[0] == 0
    process = subprocess.Popen(
        [sys.executable, "-m", "minitransformer", "train", "--out", str(killed),
         *map(str, flags), "--save-every", "5"],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while saved_step(killed) < 5 and process.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    step = saved_step(killed)
    assert 5 <= step < 150, "the run ended before it could be killed"
    status, stdout, stderr = run("train", "--out", killed, *flags, "--save-every", "5",
                                 "--resume")
    assert status == 0, stderr
    assert f"resuming from step {step}" in stdout
    a, b = weights(straight), weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_torchrun_two_processes_equal_one_on_a_prepared_directory(prepared, tmp_path):
    flags = ["--data", prepared, "--steps", "10", *TINY]
    one = tmp_path / "one"
    assert run("train", "--out", one, *flags)[0] == 0
    two = tmp_path / "two"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "minitransformer", "train", "--out", str(two), *map(str, flags)],
        capture_output=True, text=True, timeout=300,
        env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    a, b = weights(one), weights(two)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-4


def test_every_mistake_is_one_line(prepared, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good text\n" * 10 + b"\xff")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    half = tmp_path / "half"
    shutil.copytree(prepared, half)
    (half / "prepare.partial").write_text("")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello")
    cases = {
        "not UTF-8": (["prepare", "--data", bad, "--out", tmp_path / "o1"],
                      f"{bad} is not UTF-8 text: invalid start byte at byte 100"),
        "empty": (["prepare", "--data", empty, "--out", tmp_path / "o2"], "the input is empty"),
        "missing": (["prepare", "--data", tmp_path / "nope", "--out", tmp_path / "o3"],
                    "no such file or directory"),
        "both": (["prepare", "--data", empty, "--out", tmp_path / "o4", "--vocab-size", "300",
                  "--tokenizer", prepared], "not allowed with argument"),
        "complete": (["prepare", "--data", DATA / "german.txt", "--out", prepared],
                     "already holds a prepared directory"),
        "half-written": (["train", "--data", half, "--out", tmp_path / "r1", *TINY],
                         "is half-written"),
        "not prepared": (["train", "--data", plain, "--out", tmp_path / "r2", *TINY],
                         "is not a prepared directory: no index.json"),
        "vocab": (["train", "--data", prepared, "--out", tmp_path / "r3", *TINY,
                   "--vocab-size", "400"], "--vocab-size 400 differs from the 300 tokens"),
        "context": (["train", "--data", prepared, "--out", tmp_path / "r4", *TINY,
                     "--context-length", "100000"], "too few for a window"),
        "fraction": (["prepare", "--data", DATA / "german.txt", "--out", tmp_path / "o5",
                   "--val-fraction", "1.5"], "val_fraction must be below 1"),
        "small vocabulary": (["prepare", "--data", DATA / "german.txt", "--out", tmp_path / "o6",
                              "--vocab-size", "260"], "--vocab-size must be at least 261 (the "
                             "256 byte tokens and the 5 chat tokens), got 260"),
        "file not UTF-8": (["train", "--data", bad, "--out", tmp_path / "r5", *TINY],
                           f"--data {bad} is not UTF-8 text: invalid start byte at byte 100"),
    }
    for name, (argv, expected) in cases.items():
        status, stdout, stderr = run(*argv)
        assert status == 2, name
        assert stderr.startswith("minitransformer") and stderr.count("\n") == 1, (name, stderr)
        assert expected in stderr, (name, stderr)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "r1").exists()
    assert not (tmp_path / "r5").exists()
    assert (plain / "notes.txt").read_text() == "hello"


# ----- train --data FILE: prepared into OUT/data first ------------------------------------------

@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    text = tmp_path_factory.mktemp("file") / "text.txt"
    text.write_bytes((ROOT / "book" / "data" / "corpus.txt").read_bytes()[:20000])
    return text


def test_train_on_a_file_prepares_it_into_out_data(text_file, tmp_path):
    """The text is tokenized once into OUT/data, and the run equals a run on that directory
    (so it reads memory maps, not the text in memory)."""
    flags = ["--steps", "10", *TINY, "--vocab-size", "300"]
    out = tmp_path / "run"
    status, stdout, stderr = run("train", "--data", text_file, "--out", out, *flags)
    assert status == 0, stderr
    files = TokenFiles(out / "data")
    assert files.index["sources"][0]["path"] == str(text_file)
    assert files.index["val_fraction"] == 0.1 and len(files.tokenizer) == 300
    assert f"on {len(files.train):,} tokens ({len(files.val):,} held out)" in stdout
    again = tmp_path / "again"
    assert run("train", "--data", out / "data", "--out", again, *flags)[0] == 0
    a, b = weights(out), weights(again)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_on_a_file_after_a_kill_during_its_prepare(text_file, prepared, tmp_path):
    """A run killed while it prepared OUT/data (or before its first checkpoint) left OUT/data:
    --resume says to start again, and the same command does, rewriting only prepare's files;
    a file that prepare did not write is kept, and the run refused."""
    flags = ["--steps", "2", *TINY, "--vocab-size", "300"]
    for kind in ("half-written", "complete", "with a file of mine"):
        out = tmp_path / kind
        data = out / "data"
        if kind == "complete":
            shutil.copytree(prepared, data)
        else:
            data.mkdir(parents=True)
            (data / "prepare.partial").write_text("")
            (data / "train.bin.partial").write_bytes(b"12")
        if kind == "with a file of mine":
            (data / "notes.txt").write_text("mine")
        status, _, stderr = run("train", "--data", text_file, "--out", out, *flags, "--resume")
        assert status == 2 and "without --resume starts the run" in stderr, (kind, stderr)
        status, stdout, stderr = run("train", "--data", text_file, "--out", out, *flags)
        if kind == "with a file of mine":
            assert status == 2 and "is not empty and holds no run" in stderr, stderr
            assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]
            assert (data / "notes.txt").read_text() == "mine"
            continue
        assert status == 0, (kind, stderr)
        files = TokenFiles(data)
        assert files.index["sources"][0]["path"] == str(text_file), kind
        assert not (data / "train.bin.partial").exists() and files.train.size


def test_train_on_a_huge_prepared_directory_reads_only_its_windows(prepared, tmp_path):
    """train.bin made a sparse file of 2 GiB: a run that read all of it would hold 2 GiB;
    memory maps hold the windows a batch touches."""
    big = tmp_path / "big"
    shutil.copytree(prepared, big)
    index = json.loads((big / "index.json").read_text())
    index["tokens"]["train"] = 1 << 30
    (big / "index.json").write_text(json.dumps(index))
    with open(big / "train.bin", "r+b") as f:
        f.truncate(2 << 30)                 # zeros (token 0) that take no room on the disk
    # the peak of this process's own memory (VmHWM, kB): ru_maxrss can keep the forking pytest
    # worker's peak across exec, 1 GB late in `make test`
    code = ("import re, sys\n"
            "from minitransformer.cli import main\n"
            "assert main(sys.argv[1:]) == 0\n"
            "status = open('/proc/self/status').read()\n"
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))")
    result = subprocess.run(
        [sys.executable, "-c", code, "train", "--data", str(big), "--out",
         str(tmp_path / "run"), "--steps", "2", *map(str, TINY)],
        capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "on 1,073,741,824 tokens" in result.stdout
    peak_mb = int(result.stdout.split()[-1]) / 1024
    assert peak_mb < 1024, peak_mb


def test_resume_prepares_a_removed_out_data_again_bit_identical(text_file, tmp_path):
    """A WSD run of 10 steps extended to 20 equals a 20-step run bit for bit (chapter 15), also
    when OUT/data was removed in between: the same prepare makes the same token files."""
    flags = ["--data", text_file, *TINY, "--vocab-size", "300", "--schedule", "wsd",
             "--warmup-steps", "2", "--save-every", "5"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run("train", "--out", straight, *flags, "--steps", "20")[0] == 0
    assert run("train", "--out", stopped, *flags, "--steps", "10")[0] == 0
    state = json.loads((stopped / "ckpt-10" / "training_state.json").read_text())
    assert state["prepared"] == "data"
    shutil.rmtree(stopped / "data")
    status, stdout, stderr = run("train", "--out", stopped, *flags, "--steps", "20", "--resume")
    assert status == 0, stderr
    assert "preparing" in stdout and TokenFiles(stopped / "data").train.size
    a, b = weights(straight), weights(stopped)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
