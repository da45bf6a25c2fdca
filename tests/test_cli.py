"""The command line (minitransformer.cli, chapter 15): train and generate, checkpoints that survive
SIGKILL, resuming bit for bit, gradient accumulation, torchrun data parallelism, and one-line
errors. Runs call ``main(argv)`` in-process, except where a process is the point (kill, torchrun).
"""

from __future__ import annotations

import contextlib
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

from minitransformer import GPT, BPETokenizer, checkpoints  # noqa: E402
from helpers import one_thread, run  # noqa: F401 (one_thread: a fixture)

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
#: The test model: 35k parameters, 30 steps of 8 windows of 16 tokens.
TINY = ["--steps", "30", "--batch-size", "8", "--context-length", "16", "--num-layers", "2",
        "--num-heads", "2", "--d-model", "32", "--vocab-size", "300", "--lr", "1e-2",
        "--save-every", "10", "--log-every", "10", "--no-progress", "--device", "cpu",
        "--threads", "1"]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(folder / "model.safetensors")


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:12000], "utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_run(data, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("runs") / "seed0"
    status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY)
    assert status == 0, stderr
    return out, stdout


def test_help_lists_the_commands_and_every_flag():
    status, stdout, _ = run("--help")
    assert status == 0 and "train" in stdout and "generate" in stdout
    status, stdout, _ = run("train", "--help")
    assert status == 0
    for flag in ("--data", "--out", "--steps", "--batch-size", "--context-length",
                 "--num-layers", "--num-heads", "--d-model", "--vocab-size", "--lr", "--seed",
                 "--save-every", "--resume", "--grad-accum", "--device", "--dtype", "--arch"):
        assert flag in stdout, flag
    status, stdout, _ = run("generate", "--help")
    for flag in ("--model", "--prompt", "--max-new-tokens", "--temperature", "--top-k",
                 "--seed"):
        assert flag in stdout, flag


def test_a_tiny_run_is_a_directory_transformers_loads_with_our_logits(tiny_run):
    transformers = pytest.importorskip("transformers")
    out, stdout = tiny_run
    assert "val loss" in stdout and "step 30:" in stdout
    state = json.loads((out / "trainer_state.json").read_text())
    assert state == {"step": 30, "world_size": 1, "checkpoint": "ckpt-30"}
    assert sorted(p.name for p in out.glob("ckpt*")) == ["ckpt-30"]      # older ones pruned
    assert equal(weights(out), weights(out / "ckpt-30"))
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    text = "The cat sat on the mat, and the dog ran."
    ours_tok = BPETokenizer.from_pretrained(out)
    ids = ours_tok.encode(text)
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == ids
    idx = torch.tensor([ids[:16]])                               # the context length
    ours = GPT.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, ours(idx)[0], atol=1e-5, rtol=1e-5)


def test_arch_llama_writes_a_llama_transformers_loads_and_generate_runs(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "llama"
    status, stdout, stderr = run("train", "--data", data, "--out", out, *TINY, "--steps", "5",
                                 "--arch", "llama")
    assert status == 0, stderr
    assert "training a Llama" in stdout
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out)
    idx = torch.tensor([BPETokenizer.from_pretrained(out).encode("The old man")[:16]])
    from minitransformer.llama import Llama
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, Llama.from_pretrained(out)(idx)[0],
                                   atol=1e-5, rtol=1e-5)
    status, stdout, stderr = run("generate", "--model", out, "--prompt", "The",
                                 "--max-new-tokens", "5", "--temperature", "0")
    assert status == 0 and stdout.startswith("The"), stderr


def test_the_same_seed_gives_the_same_weights_and_another_seed_others(tiny_run, data, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    assert run("train", "--data", data, "--out", again, *TINY)[0] == 0
    assert run("train", "--data", data, "--out", other, *TINY, "--seed", "1")[0] == 0
    assert equal(weights(again), weights(tiny_run[0]))
    assert not equal(weights(other), weights(tiny_run[0]))


def test_grad_accum_equals_the_big_batch(data, tmp_path):
    """In float64, so that only the order of additions differs (float32: 4e-5 after 30 steps,
    as Adam divides tiny gradients by their tiny moments). Forgetting to divide each
    micro-batch's loss by --grad-accum moves the weights by 0.06."""
    found = {}
    for accum in ("1", "4"):
        status, _, stderr = run("train", "--data", data, "--out", tmp_path / accum, *TINY,
                                "--dtype", "float64", "--grad-accum", accum)
        assert status == 0, stderr
        found[accum] = weights(tmp_path / accum)
    assert max_difference(found["1"], found["4"]) <= 1e-10


def test_generate_greedy_equals_transformers_pipeline(tiny_run):
    transformers = pytest.importorskip("transformers")
    out = tiny_run[0]
    prompt = "The old"
    status, stdout, stderr = run("generate", "--model", out, "--prompt", prompt,
                                 "--max-new-tokens", "8", "--temperature", "0")
    assert status == 0, stderr
    pipe = transformers.pipeline("text-generation", model=str(out), tokenizer=str(out),
                                 device="cpu")
    greedy = pipe(prompt, max_new_tokens=8, do_sample=False)[0]["generated_text"]
    assert stdout == greedy + "\n"
    # The tiny model may continue with spaces only: what counts is that text was added.
    assert stdout.startswith(prompt) and len(stdout.rstrip("\n")) > len(prompt)


def test_generate_with_a_seed_repeats_its_sample(tiny_run):
    argv = ("generate", "--model", tiny_run[0], "--prompt", "The", "--max-new-tokens", "12",
            "--temperature", "1.0", "--top-k", "50")
    first, again = run(*argv, "--seed", "3"), run(*argv, "--seed", "3")
    assert first[0] == 0 and first == again
    # streamed token by token, the sample is generate's with that seed, bit for bit
    from minitransformer.generation import generate
    tokenizer = BPETokenizer.from_pretrained(tiny_run[0])
    ids = torch.tensor([tokenizer.encode("The")])
    sample = generate(GPT.from_pretrained(tiny_run[0]), ids, 12, temperature=1.0, top_k=50,
                      generator=torch.Generator().manual_seed(3))
    assert first[1] == tokenizer.decode(sample[0].tolist()) + "\n"
    assert run(*argv, "--seed", "4")[1] != first[1]


@pytest.fixture
def bad_inputs(data, tiny_run, tmp_path) -> dict[str, tuple[list, str]]:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", "utf-8")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    new = ["train", "--data", data, "--out", tmp_path / "new", *TINY]
    again = ["train", "--data", data, "--out", tiny_run[0], *TINY]
    return {
        "a missing data file": (["train", "--data", tmp_path / "nope.txt", "--out",
                                 tmp_path / "a"], "nope.txt: no such file"),
        "an empty data file": (["train", "--data", empty, "--out", tmp_path / "b"],
                               "is empty"),
        "a data file that is not UTF-8": (["train", "--data", latin, "--out", tmp_path / "c"],
                                          "is not UTF-8"),
        "heads that do not divide the width": ([*new, "--num-heads", "3"],
                                               "--num-heads 3 does not divide --d-model 32"),
        "--steps 0": ([*new, "--steps", "0"], "--steps: must be a whole number at least 1"),
        "a batch not divisible by grad-accum": ([*new, "--grad-accum", "3"],
                                                "--batch-size 8 is not divisible"),
        "a missing model directory": (["generate", "--model", tmp_path / "none", "--prompt",
                                       "a"], "no such directory"),
        "an existing --out without --resume": (again, "already holds a run"),
        "--resume with another --lr": ([*again, "--resume", "--lr", "0.5"], "--lr 0.5 differs"),
        "--resume of nothing": ([*new, "--resume"], "nothing to resume"),
        "no command": ([], "required"),
        "an unknown device": ([*new, "--device", "foo"], "--device foo: not a device name"),
        "a device this machine lacks": ([*new, "--device", "meta"],
                                        "only cpu and cuda are supported"),
        "a prompt longer than the context": (["generate", "--model", tiny_run[0], "--prompt",
                                              "word " * 200], "more than the model's context"),
    }


def test_every_bad_input_exits_with_one_line_naming_the_problem(bad_inputs, tiny_run):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_run[0].iterdir()}
    for name, (argv, words) in bad_inputs.items():
        status, stdout, stderr = run(*argv)
        assert status != 0, name
        assert stderr.count("\n") == 1 and stderr.startswith("minitransformer"), (name, stderr)
        assert words in stderr, (name, stderr)
        assert "Traceback" not in stderr
    assert {p.name: p.stat().st_mtime_ns for p in tiny_run[0].iterdir()} == before


# ----- processes ----------------------------------------------------------------------------

def subprocess_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def torchrun(*argv) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "minitransformer", *map(str, argv)]


@pytest.fixture(scope="module")
def ddp_run(data, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One torchrun launch of the test model on two processes, never stopped."""
    out = tmp_path_factory.mktemp("ddp") / "straight"
    result = subprocess.run(torchrun("train", "--data", data, "--out", out, *TINY),
                            capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out, result


def test_torchrun_two_processes_equal_one(tiny_run, ddp_run):
    out, result = ddp_run
    # float32 rounding only: the all-reduce sums in another order, and Adam turns a gradient
    # near zero into a step of about lr. Measured: 5e-5 to 1.6e-4 in float32, 1.4e-13 with
    # --dtype float64; a wrong slice of the batch gives about lr = 1e-2
    assert max_difference(weights(out), weights(tiny_run[0])) <= 1e-3
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == 30 and state["world_size"] == 2
    assert result.stdout.count("training a GPT") == 1      # rank 0 alone prints
    assert result.stdout.count("step 30: train loss") == 1
    # the train loss printed is the whole batch's, the mean over the ranks (not rank 0's half)
    two, one = train_losses(result.stdout), train_losses(tiny_run[1])
    assert len(two) == len(one) == 3
    assert all(abs(a - b) <= 2e-4 for a, b in zip(two, one)), (two, one)


def train_losses(stdout: str) -> list[float]:
    return [float(line.split("train loss ")[1].split(",")[0])
            for line in stdout.splitlines() if "train loss" in line]


def wait_for(condition, process: subprocess.Popen, timeout: float = 120) -> bool:
    """Poll until ``condition()`` or the process ends; whether the condition came true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and process.poll() is None:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def saved_step(out: Path) -> int:
    try:
        return json.loads((out / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigkill_twice_then_resume_is_bit_identical_to_the_run_never_stopped(data, tmp_path):
    """Two processes killed at random moments after a checkpoint (saved every step, so a kill
    often lands inside one), then the run resumed to its end in this process. --save-every
    is not a run flag: the run never stopped saves only at its end."""
    flags = ["--data", data, *TINY, "--steps", "60", "--save-every", "1", "--dropout", "0.1"]
    straight = tmp_path / "straight"
    assert run("train", "--out", straight, *flags, "--save-every", "60")[0] == 0
    out = tmp_path / "killed"
    argv = [PYTHON, "-m", "minitransformer", "train", "--out", str(out), *map(str, flags)]
    moments = random.Random()       # other moments each run; the verdict must not depend on them
    kills = []
    for attempt in range(2):
        process = subprocess.Popen(argv + ["--resume"] * attempt, env=subprocess_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        before = saved_step(out)
        wait_for(lambda: saved_step(out) > before, process)
        time.sleep(moments.uniform(0.0, 0.3))
        process.send_signal(signal.SIGKILL)
        process.communicate()
        kills.append((process.returncode, saved_step(out)))
        state, folder = checkpoints.latest(out)           # the last checkpoint is whole
        assert GPT.from_pretrained(folder) is not None
    status, stdout, stderr = run("train", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert f"resuming from step {kills[-1][1]}" in stdout
    assert equal(weights(out), weights(straight)), kills
    assert equal(checkpoints.load_tensors(out / "ckpt-60")[1],
                 checkpoints.load_tensors(straight / "ckpt-60")[1])   # optimizer, RNGs
    assert any(code == -signal.SIGKILL for code, _ in kills), kills


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid``, and theirs (Linux's /proc). torchrun starts its ranks
    in sessions of their own, so killing the launcher's process group would not reach them."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the ranks in /proc")
def test_torchrun_killed_then_resumed_under_torchrun_is_bit_identical(ddp_run, data, tmp_path):
    """Both processes and their launcher killed together after a checkpoint (saved every step),
    then `torchrun ... --resume`: the weights equal the two-process run never stopped."""
    out = tmp_path / "killed"
    flags = ["train", "--data", data, "--out", out, *TINY, "--save-every", "1"]
    process = subprocess.Popen(torchrun(*flags), env=subprocess_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = wait_for(lambda: saved_step(out) >= 5, process)
    for pid in [*descendants(process.pid), process.pid]:   # both ranks, then the launcher
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, stderr = process.communicate()
    step = saved_step(out)
    assert stopped and 5 <= step < 30, (step, stderr[-2000:])
    result = subprocess.run(torchrun(*flags, "--resume"), capture_output=True, text=True,
                            env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count(f"resuming from step {step},") == 1   # rank 0 alone
    assert equal(weights(out), weights(ddp_run[0]))
    assert json.loads((out / "trainer_state.json").read_text())["world_size"] == 2


def test_generate_s_default_length_fits_the_context(tiny_run):
    """The default (40 new tokens) shrinks to what the context leaves after the prompt."""
    context = json.loads((tiny_run[0] / "config.json").read_text())["n_positions"]
    prompt = "the " * max(1, context - 3)
    status, stdout, stderr = run("generate", "--model", tiny_run[0], "--prompt", prompt,
                                 "--temperature", "0")
    assert status == 0, stderr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_run_resumed_on_each_device_is_bit_identical(data, tmp_path, monkeypatch, device, dtype):
    """--device on every device this machine has (the `device` fixture: CUDA too, when present),
    in float32 and bfloat16: a run stopped right after its step-10 checkpoint, then resumed, ends
    with the weights, optimizer and random states of the run never stopped, dropout included.
    On CUDA the command turns on deterministic kernels itself (embedding's backward otherwise
    adds in a varying order): the test leaves PyTorch's setting as it is."""
    import shutil
    flags = ["--data", data, *TINY, "--steps", "20", "--save-every", "10", "--dropout", "0.1",
             "--device", str(device), "--dtype", dtype]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    save = checkpoints.save

    def save_and_copy(out, *, step, **kwargs):       # the state a kill after step 10 leaves
        folder = save(out, step=step, **kwargs)
        if step == 10:
            shutil.copytree(out, stopped)
        return folder

    monkeypatch.setattr(checkpoints, "save", save_and_copy)
    assert not torch.are_deterministic_algorithms_enabled()
    status, _, stderr = run("train", "--out", straight, *flags)
    assert status == 0, stderr
    status, stdout, stderr = run("train", "--out", stopped, *flags, "--resume")
    assert status == 0, stderr
    assert "resuming from step 10" in stdout
    assert not torch.are_deterministic_algorithms_enabled()     # given back afterwards
    status, text, stderr = run("generate", "--model", stopped, "--prompt", "The",
                               "--max-new-tokens", "4", "--temperature", "0",
                               "--device", str(device))
    assert status == 0 and text.startswith("The"), stderr
    assert {t.dtype for t in weights(stopped).values()} == {getattr(torch, dtype)}
    assert equal(weights(stopped), weights(straight))
    assert equal(checkpoints.load_tensors(stopped / "ckpt-20")[1],
                 checkpoints.load_tensors(straight / "ckpt-20")[1])   # optimizer, RNGs
