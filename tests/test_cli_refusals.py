"""The command line says what it did instead of what was asked, and refuses in one line
(issue 29): a vocabulary the text cannot fill, a device this machine lacks, a bad flag under
torchrun printed by rank 0 alone."""

from __future__ import annotations

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
from helpers import run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--steps", "1", "--batch-size", "2", "--context-length", "8", "--num-layers", "1",
        "--num-heads", "1", "--d-model", "8", "--no-progress", "--device", "cpu",
        "--threads", "1"]


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
    assert result.stderr.count("--steps: must be a whole number at least 1") == 1, \
        result.stderr[-2000:]


@pytest.mark.parametrize("argv", [["train", "--dat", "x.txt", "--out", "o"],
                                  ["generate", "--mod", "m", "--prompt", "a"]])
def test_an_abbreviated_flag_is_refused_not_guessed(tmp_path, argv):
    """argparse would read --dat as --data: a misspelt flag must not silently run."""
    status, _, stderr = run(*argv)
    assert status == 2 and "\n" not in stderr.strip(), stderr
    assert f"unrecognized arguments: {argv[1]}" in stderr, stderr


# ----- one set of flags and words across commands (issue 40) -----------------------------------

@pytest.mark.parametrize("argv, words", [
    (["train", "--out", "o", "--steps", "0"],
     "--steps: must be a whole number at least 1, got '0'"),
    (["train", "--out", "o", "--steps", "2.5"],
     "--steps: must be a whole number at least 1, got '2.5'"),
    (["finetune", "--out", "o", "--log-every", "x"],
     "--log-every: must be a whole number at least 1, got 'x'"),
    (["dpo", "--out", "o", "--lora-rank", "-2"],
     "--lora-rank: must be a whole number at least 1, got '-2'"),
    (["generate", "--model", "m", "--prompt", "a", "--max-new-tokens", "0"],
     "--max-new-tokens: must be a whole number at least 1, got '0'"),
    (["chat", "--model", "m", "--max-new-tokens", "0"],
     "--max-new-tokens: must be a whole number at least 1, got '0'"),
    (["chat", "--model", "m", "--top-k", "0"], "--top-k: must be a whole number at least 1"),
    (["chat", "--model", "m", "--threads", "٣"], "--threads: must be a whole number at least 1"),
    (["generate", "--model", "m", "--prompt", "a", "--seed", "-1"],
     "--seed: must be a whole number from 0 to 2**63 - 1, got '-1'"),
    (["prepare", "--data", "d", "--out", "o", "--seed", str(2 ** 63)],
     "--seed: must be a whole number from 0 to 2**63 - 1"),
    (["generate", "--model", "m", "--prompt", "a", "--temperature", "-1"],
     "--temperature: must be a number at least 0 (0 is greedy), got '-1'"),
    (["chat", "--model", "m", "--temperature", "nan"],
     "--temperature: must be a number, got 'nan'"),
    (["dpo", "--out", "o", "--beta", "inf"], "--beta: must be a number, got 'inf'"),
    (["grpo", "--out", "o", "--group-size", "0"],
     "--group-size: must be a whole number at least 1, got '0'"),
    (["grpo", "--out", "o", "--temperature", "nan"], "--temperature: must be a number, got"),
])
def test_a_bad_number_is_refused_in_the_same_words_by_every_command(argv, words):
    status, stdout, stderr = run(*argv)
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert words in stderr, stderr


def parse(*argv):
    from minitransformer.cli import build_parser
    return build_parser().parse_args([str(a) for a in argv])


def test_generate_and_chat_sample_alike_by_default():
    generate = parse("generate", "--model", "m", "--prompt", "a")
    chat = parse("chat", "--model", "m")
    for key in ("temperature", "top_k", "seed", "max_new_tokens", "threads", "device",
                "dtype"):
        assert getattr(generate, key) == getattr(chat, key), key
    assert generate.temperature == 0.8 and generate.top_k is None
    assert parse("chat", "--model", "m", "--top-k", "5").top_k == 5


@pytest.mark.parametrize("command", ["train", "finetune", "dpo", "grpo"])
def test_the_training_commands_share_their_flags_and_words(command):
    status, stdout, _ = run(command, "--help")
    assert status == 0
    for flag in ("--out", "--steps", "--lr", "--batch-size", "--seed", "--log-every",
                 "--save-every", "--resume", "--no-progress", "--device", "--threads"):
        assert flag in stdout, flag
    assert "--eval-every" not in stdout                     # train's old name: hidden
    assert ("--lora-rank" in stdout) == (command != "train")
    if command != "train":
        for flag in ("--lora-alpha", "--lora-targets", "--merge", "--model", "--data"):
            assert flag in stdout, flag
    given = parse(command, "--out", "o", "--eval-every", "7")  # the old spelling still works
    assert given.log_every == 7 and parse(command, "--out", "o", "--log-every", "7") == given


def test_every_command_declares_its_flags_in_its_own_module():
    from minitransformer.cli import COMMANDS, build_parser

    names = [name for name, _, _ in COMMANDS]
    assert names == ["prepare", "train", "generate", "finetune", "dpo", "grpo", "chat",
                     "serve", "eval", "quantize", "convert", "download"]
    for name, module, _ in COMMANDS:
        assert callable(module.add_arguments) and callable(module.run), name
    status, stdout, _ = run("--help")
    assert status == 0 and all(name in stdout for name in names)
    assert build_parser().parse_args(["download", "smollm2"]).name == "smollm2"
