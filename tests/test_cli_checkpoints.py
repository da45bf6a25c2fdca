"""Checkpoints of the command line after a kill at any moment (issue 29): the first save is
no dead end, a later one leaves at most two checkpoints and resumes bit for bit, a save deletes
only what the program wrote, files are flushed (fsync) before the renames that publish them, and
a damaged training_state.json is one line.

A kill is simulated in this process: an exception that nothing catches (like SIGKILL, it runs
no cleanup in ``checkpoints.save``) raised just before the k-th file operation of a save, for
every k.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer import checkpoints  # noqa: E402
from helpers import run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--batch-size", "2", "--context-length", "8", "--num-layers", "1", "--num-heads", "1",
        "--d-model", "8", "--vocab-size", "257", "--dropout", "0.1", "--no-progress",
        "--device", "cpu", "--threads", "1", "--save-every", "1"]


class Killed(BaseException):
    """Not an Exception: main() does not catch it, as nothing catches SIGKILL."""


@contextlib.contextmanager
def kill_before(monkeypatch, k: int, *, in_save: int = 1):
    """Raise Killed before the k-th file operation (0-based) of the ``in_save``-th call of
    checkpoints.save; yields a list that ends up holding how many operations there were."""
    count, saves = [0], [0]
    armed = [False]

    def operation(real):
        def wrapper(*args, **kwargs):
            if armed[0]:
                if count[0] == k:
                    raise Killed
                count[0] += 1
            return real(*args, **kwargs)
        return wrapper

    real_open = builtins.open

    def opening(file, mode="r", *args, **kwargs):
        if armed[0] and any(c in mode for c in "wax"):
            return operation(real_open)(file, mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    real_save = checkpoints.save

    def save(*args, **kwargs):
        saves[0] += 1
        armed[0] = saves[0] == in_save
        try:
            return real_save(*args, **kwargs)
        finally:
            armed[0] = False

    for module, name in [(os, "rename"), (os, "replace"), (os, "unlink"), (shutil, "rmtree"),
                         (shutil, "copyfile"), (Path, "mkdir"), (Path, "write_text"),
                         (Path, "unlink"), (safetensors.torch, "save_file")]:
        monkeypatch.setattr(module, name, operation(getattr(module, name)))
    monkeypatch.setattr(builtins, "open", opening)
    monkeypatch.setattr(checkpoints, "save", save)
    yield count
    monkeypatch.undo()


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(folder / "model.safetensors")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def one_line(stderr: str) -> bool:
    return stderr.count("\n") == 1 and stderr.startswith("minitransformer") and (
        "Traceback" not in stderr)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:3000], "utf-8")
    return path


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """Two steps, never stopped."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "2")[0] == 0
    return out


@pytest.fixture
def no_disk_flush():
    """Flushes to the disk (os.fsync) skipped: a kill simulated in this process finds the
    files whether or not they reached the disk, and the two kill tests run about a hundred
    saves. (The order of flushes and renames is tested below, with real flushes.) Its own
    MonkeyPatch, which kill_before's undo leaves in place."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        yield


@pytest.mark.usefixtures("no_disk_flush")
def test_a_kill_at_any_moment_of_the_first_save_is_no_dead_end(data, reference, tmp_path,
                                                                monkeypatch):
    """Before trainer_state.json exists, what is there is not a run: the same command starts
    again (and --resume says so in one line). After, --resume finishes the run."""
    k, outcomes = 0, set()
    while True:
        out = tmp_path / f"k{k}"
        with kill_before(monkeypatch, k) as count:
            try:
                run("train", "--data", data, "--out", out, *TINY, "--steps", "1")
            except Killed:
                pass
            else:
                break
        left = sorted(p.name for p in out.iterdir())
        if (out / "trainer_state.json").exists():
            status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps",
                                    "1")
            assert status == 2 and "pass --resume" in stderr and one_line(stderr), (k, left)
            status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY,
                                         "--resume")
            assert status == 0 and "is complete" in stdout, (k, left, stderr)
            outcomes.add("resume")
        else:
            status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume")
            assert status == 2 and "without --resume starts the run" in stderr, (k, left)
            assert one_line(stderr)
            status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps",
                                    "1")
            assert status == 0, (k, left, stderr)
            outcomes.add("again")
        status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                                "--steps", "2")
        assert status == 0, (k, left, stderr)
        assert same(weights(out), weights(reference)), (k, left)     # the top level is whole
        assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-2"], (k, left)
        k += 1
    assert k == count[0] >= 10 and outcomes == {"again", "resume"}, (k, outcomes)


@pytest.mark.usefixtures("no_disk_flush")
def test_a_kill_in_a_later_save_leaves_at_most_two_checkpoints_and_resumes(data, reference,
                                                                          tmp_path,
                                                                          monkeypatch):
    """Killed while saving step 2: ckpt-1 is named until trainer_state.json names ckpt-2, and
    is removed only after that; between the two, the directory holds both."""
    k, both = 0, 0
    while True:
        out = tmp_path / f"k{k}"
        with kill_before(monkeypatch, k, in_save=2):
            try:
                run("train", "--data", data, "--out", out, *TINY, "--steps", "2")
            except Killed:
                pass
            else:
                break
        folders = sorted(p.name for p in out.glob("ckpt-*"))
        assert len(folders) <= 2, (k, folders)
        both += folders == ["ckpt-1", "ckpt-2"]
        status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume")
        assert status == 0, (k, stderr)
        assert same(weights(out), weights(reference)), k
        assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-2"], k
        k += 1
    assert both >= 2, both      # after the rename, and after trainer_state.json names ckpt-2


def test_a_save_deletes_only_what_the_program_wrote(data, tmp_path):
    out = tmp_path / "run"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "1")[0] == 0
    (out / "notes.tmp").write_text("mine", "utf-8")
    (out / "drafts.tmp").mkdir()
    (out / "ckpt-notes").mkdir()
    (out / "trainer_state.json.tmp").write_text("{}", "utf-8")      # as a kill leaves it
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                            "--steps", "2")
    assert status == 0, stderr
    assert (out / "notes.tmp").read_text("utf-8") == "mine" and (out / "drafts.tmp").is_dir()
    assert (out / "ckpt-notes").is_dir() and not (out / "trainer_state.json.tmp").exists()


def test_a_directory_of_someone_else_s_files_is_not_taken_for_leftovers(data, tmp_path):
    out = tmp_path / "mine"
    (out / "ckpt.tmp-3").mkdir(parents=True)
    (out / "notes.txt").write_text("mine", "utf-8")
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps", "1")
    assert status == 2 and "is not empty and holds no run" in stderr and one_line(stderr)
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.tmp-3", "notes.txt"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names fds by /proc")
def test_files_and_directories_are_flushed_before_the_renames_that_publish_them(
        data, tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (
        events.append(("rename", str(a), str(b))), real_rename(a, b))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (
        events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    out = (tmp_path / "run").resolve()
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "1")[0] == 0
    synced, published = set(), []
    for event in events:
        if event[0] == "fsync":
            synced.add(event[1])
        elif Path(event[2]).parent == out:      # a rename into the run's directory
            source = Path(event[2])             # it has the new name now
            files = [source, *source.iterdir()] if source.is_dir() else [source]
            assert {str(f).replace(source.name, Path(event[1]).name, 1) if f == source
                    else str(Path(event[1]) / f.name) for f in files} <= synced, event
            if source.name == "trainer_state.json":     # names a folder already on the disk
                assert str(out) in synced and "ckpt-1" in [Path(e[2]).name for e in
                                                           published], event
            published.append(event)
    assert len(published) >= 7      # the checkpoint, trainer_state.json, five top-level files
    assert events[-1] == ("fsync", str(out))       # the last replace is on the disk too


@pytest.mark.parametrize("damage", ["not JSON", "no args", "steps a string", "loop a list",
                                    "history without steps", "no world_size", "lr null"])
def test_a_damaged_training_state_is_one_line(data, tmp_path, damage):
    out = tmp_path / "run"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "1")[0] == 0
    path = out / "ckpt-1" / "training_state.json"
    state = json.loads(path.read_text())
    if damage == "not JSON":
        path.write_text("{'step': 1,", "utf-8")
    elif damage == "no world_size":
        top = out / "trainer_state.json"
        top.write_text(json.dumps({"step": 1, "checkpoint": "ckpt-1"}), "utf-8")
    else:
        if damage == "no args":
            del state["args"]
        elif damage == "steps a string":
            state["args"]["steps"] = "ten"
        elif damage == "lr null":
            state["args"]["lr"] = None
        elif damage == "loop a list":
            state["loop"] = [1]
        else:
            del state["loop"]["history"]["steps"]
        path.write_text(json.dumps(state), "utf-8")
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                            "--steps", "2")
    assert status == 2 and one_line(stderr), stderr
    assert "trainer_state.json" in stderr if damage == "no world_size" else (
        "training_state.json" in stderr)
    if damage in ("steps a string", "lr null"):     # what was found, with its article
        assert ("args.steps is a str, not an int" if damage == "steps a string" else
                "args.lr is null, not an int or a float") in stderr, stderr


@pytest.mark.parametrize("key, value", [("num_heads", 0), ("dtype", "float16"),
                                        ("arch", "bert"), ("n_embd", 64)])
def test_a_hand_edited_flag_in_training_state_is_one_line(data, tmp_path, key, value):
    out = tmp_path / "run"
    assert run("train", "--data", data, "--out", out, *TINY, "--steps", "1")[0] == 0
    path = out / "ckpt-1" / "training_state.json"
    state = json.loads(path.read_text())
    state["args"][key] = value
    path.write_text(json.dumps(state), "utf-8")
    status, _, stderr = run("train", "--data", data, "--out", out, *TINY, "--resume",
                            "--steps", "2")
    assert status == 2 and one_line(stderr) and f"args.{key} is" in stderr, stderr
