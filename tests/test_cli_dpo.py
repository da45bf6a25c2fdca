"""``minitransformer dpo`` (chapter 17): DPO from a JSONL file of preference pairs (TRL's
format, plain and conversational), in full or with LoRA; the same TrainingLoop and batches as
the package's ``DPO`` and ``dpo_batches``; the first loss printed is ln 2; a directory
transformers loads as a plain model (merged with LoRA); resume after an interruption bit for
bit; one-line refusals."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

from minitransformer import GPT, BPETokenizer  # noqa: E402
from minitransformer.cli import dpo as dpo_command  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from minitransformer.preferences import DPO, dpo_batches  # noqa: E402
from minitransformer.training import TrainingLoop, make_optimizer  # noqa: E402
# one_thread is an autouse fixture: imported, it runs this module on one thread; gpt_base,
# llama_base and plain_model come from conftest.py (cli_helpers.py's)
from cli_helpers import (  # noqa: E402, F401
    assert_same_run,
    equal,
    interrupt_after,
    kill_after_checkpoint,
    one_thread,
    run,
    tensors,
    text_folder,
    write,
)

QUICK = ["--steps", "6", "--batch-size", "4", "--lr", "1e-2", "--beta", "0.5", "--no-progress",
         "--device", "cpu", "--threads", "1", "--log-every", "3"]
WORDS = ["cat", "dog", "bird", "fish", "ant", "owl"]


def pair(k: int) -> dict:
    """Conversational pairs, and every third a plain-text one."""
    word, other = WORDS[k % len(WORDS)], WORDS[(k + 1) % len(WORDS)]
    if k % 3 == 2:
        return {"prompt": f"Say {word}:", "chosen": f" {word}", "rejected": f" {other}"}
    return {"prompt": [{"role": "user", "content": f"Say {word}"}],
            "chosen": [{"role": "assistant", "content": word}],
            "rejected": [{"role": "assistant", "content": other}]}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = text_folder(tmp_path_factory)
    write(folder / "pairs.jsonl", [pair(k) for k in range(12)])
    return folder


def test_help_lists_every_flag():
    status, stdout, _ = run("dpo", "--help")
    assert status == 0
    for flag in ("--model", "--data", "--out", "--beta", "--steps", "--lr", "--batch-size",
                 "--seed", "--lora-rank", "--lora-alpha", "--lora-targets", "--merge",
                 "--resume", "--save-every", "--log-every", "--threads"):
        assert flag in stdout, flag


def test_full_dpo_is_the_training_loop_on_dpo_batches(gpt_base, data, tmp_path):
    """The command adds files, checkpoints and printing, nothing else: its weights equal, bit
    for bit, TrainingLoop run on DPO and dpo_batches with the same seed; the first loss
    printed is ln 2; transformers loads the directory with our logits."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "full"
    status, stdout, stderr = run("dpo", "--model", gpt_base, "--data", data / "pairs.jsonl",
                                 "--out", out, *QUICK)
    assert status == 0, stderr
    assert "every weight" in stdout and "12 preference pairs" in stdout
    printed = re.findall(r"step (\d+): loss (\d\.\d{4}), reward accuracy (\d\.\d\d)", stdout)
    assert [int(s) for s, _, _ in printed] == [1, 3, 6]
    assert printed[0][1:] == ("0.6931", "0.00")
    assert float(printed[-1][1]) < 0.6931 and float(printed[-1][2]) > 0

    pairs = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    torch.manual_seed(0)
    policy, reference = GPT.from_pretrained(gpt_base), GPT.from_pretrained(gpt_base)
    model = DPO(policy, reference, beta=0.5)
    batches = dpo_batches(tokenizer, pairs, batch_size=4, context_length=64,
                          generator=torch.Generator().manual_seed(0))
    TrainingLoop(model, make_optimizer(model, 1e-2, 0.0), steps=6, lr=1e-2,
                 warmup_steps=1).run(batches)
    assert equal(GPT.from_pretrained(out).state_dict(), policy.state_dict())
    assert not equal(tensors(out / "model.safetensors"), tensors(gpt_base / "model.safetensors"))

    theirs = transformers.AutoModelForCausalLM.from_pretrained(out)
    idx = torch.tensor([tokenizer.encode("Say cat: cat")])
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, policy(idx)[0], atol=1e-5, rtol=1e-5)


def test_lora_writes_a_merged_model_transformers_loads(llama_base, data, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "lora"
    status, stdout, stderr = run("dpo", "--model", llama_base, "--data",
                                 data / "pairs.jsonl", "--out", out, *QUICK,
                                 "--lora-rank", "2")
    assert status == 0, stderr
    assert "LoRA of rank 2 on q_proj, v_proj" in stdout and "merged" in stdout
    assert "step 1: loss 0.6931, reward accuracy 0.00" in stdout
    assert not (out / "adapter_config.json").exists()
    assert tensors(out / "model.safetensors").keys() == \
        tensors(llama_base / "model.safetensors").keys()
    ours = Llama.from_pretrained(out)
    base = Llama.from_pretrained(llama_base)
    assert ours.state_dict().keys() == base.state_dict().keys()
    tokenizer = BPETokenizer.from_pretrained(out)
    idx = torch.tensor([tokenizer.apply_chat_template(pair(0)["prompt"] + pair(0)["chosen"])])
    with torch.no_grad():
        expected = ours(idx)[0]
        merged = transformers.AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(merged(idx).logits, expected, atol=1e-5, rtol=1e-5)
        assert (base(idx)[0] - expected).abs().max() > 1e-4          # it trained
    changed = [k for k, v in ours.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)


def test_lora_alpha_targets_and_merge_are_finetune_s(gpt_base, data, tmp_path):
    """--lora-alpha and --lora-targets reach LoRA (the weights equal TrainingLoop's on a policy
    with those LoRA layers, merged), and --merge also writes DIR/merged/, as finetune does."""
    out = tmp_path / "lora"
    status, stdout, stderr = run("dpo", "--model", gpt_base, "--data", data / "pairs.jsonl",
                                 "--out", out, *QUICK, "--lora-rank", "2", "--lora-alpha", "8",
                                 "--lora-targets", "out_proj", "--merge")
    assert status == 0, stderr
    assert "LoRA of rank 2 on out_proj" in stdout and f"{out / 'merged'}" in stdout
    from minitransformer.lora import add_lora, merge_lora

    pairs = [json.loads(line) for line in (data / "pairs.jsonl").read_text().splitlines()]
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    torch.manual_seed(0)
    reference = GPT.from_pretrained(gpt_base)
    policy = copy.deepcopy(reference)
    add_lora(policy, r=2, alpha=8.0, targets=["out_proj"])
    model = DPO(policy, reference, beta=0.5)
    batches = dpo_batches(tokenizer, pairs, batch_size=4, context_length=64,
                          generator=torch.Generator().manual_seed(0))
    TrainingLoop(model, make_optimizer(model, 1e-2, 0.0), steps=6, lr=1e-2,
                 warmup_steps=1).run(batches)
    expected = merge_lora(policy).state_dict()
    assert equal(GPT.from_pretrained(out).state_dict(), expected)
    assert equal(GPT.from_pretrained(out / "merged").state_dict(), expected)
    base = GPT.from_pretrained(gpt_base).state_dict()
    changed = [k for k, v in expected.items() if not torch.equal(v, base[k])]
    assert changed and all("out_proj" in k for k in changed)
    saved = json.loads((out / "ckpt-6" / "training_state.json").read_text())["args"]
    assert (saved["lora_alpha"], saved["lora_targets"]) == (8.0, ["out_proj"])


def test_interrupted_then_resumed_is_bit_identical(gpt_base, data, tmp_path, monkeypatch):
    """A LoRA run stopped (Ctrl-C) right after the checkpoint of step 3, then resumed: the
    weights, optimizer moments, LoRA matrices and RNG states equal the run never stopped."""
    flags = ["--model", gpt_base, "--data", data / "pairs.jsonl", *QUICK, "--lora-rank", "2"]
    straight = tmp_path / "straight"
    assert run("dpo", "--out", straight, *flags)[0] == 0
    out = tmp_path / "stopped"
    plain_save = interrupt_after(monkeypatch, dpo_command, 3)
    status, _, stderr = run("dpo", "--out", out, *flags, "--save-every", "1")
    assert status == 130 and "interrupted" in stderr
    plain_save()
    status, stdout, stderr = run("dpo", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert "resuming from step 3" in stdout and "step 6: loss" in stdout
    assert_same_run(out, straight, 6)
    status, stdout, _ = run("dpo", "--out", out, *flags, "--resume")
    assert status == 0 and "is complete" in stdout


def test_sigkill_then_resume_is_bit_identical(gpt_base, data, tmp_path):
    """A process killed at a random moment after a checkpoint (saved every step), then resumed
    in this process: the weights, optimizer moments and RNG states equal the run never
    stopped."""
    flags = ["--model", gpt_base, "--data", data / "pairs.jsonl", *QUICK, "--steps", "20"]
    straight = tmp_path / "straight"
    assert run("dpo", "--out", straight, *flags)[0] == 0
    out = tmp_path / "killed"
    step = kill_after_checkpoint("dpo", out, flags, steps=20)
    status, stdout, stderr = run("dpo", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert f"resuming from step {step}" in stdout
    assert_same_run(out, straight, 20)


def test_resume_refuses_another_flag_a_changed_file_and_another_run(gpt_base, data, tmp_path):
    pairs = write(tmp_path / "pairs.jsonl", [pair(k) for k in range(6)])
    flags = ["--model", gpt_base, "--data", pairs, *QUICK, "--steps", "2"]
    out = tmp_path / "run"
    assert run("dpo", "--out", out, *flags)[0] == 0
    cases = [(["--beta", "0.2", "--resume"], "--beta 0.2 differs from the checkpoint's 0.5"),
             (["--lora-rank", "2", "--resume"], "--lora-rank 2 differs"),
             ([], "pass --resume")]
    for extra, words in cases:
        status, _, stderr = run("dpo", "--out", out, *flags, *extra)
        assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
        assert words in stderr, stderr
    write(pairs, [pair(k) for k in range(7)])
    status, _, stderr = run("dpo", "--out", out, *flags, "--resume", "--steps", "3")
    assert status == 2 and f"--data {pairs} changed since the run began" in stderr, stderr
    status, _, stderr = run("dpo", "--out", gpt_base, *flags, "--resume")   # train's run
    assert status == 2 and "is not what dpo writes" in stderr
    status, _, stderr = run("dpo", "--out", tmp_path / "none", *flags, "--resume")
    assert status == 2 and "nothing to resume" in stderr


def test_resume_refuses_a_changed_reference(gpt_base, data, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(gpt_base, model)
    flags = ["--model", model, "--data", data / "pairs.jsonl", *QUICK, "--steps", "2"]
    out = tmp_path / "run"
    assert run("dpo", "--out", out, *flags)[0] == 0
    shutil.copyfile(out / "model.safetensors", model / "model.safetensors")
    status, _, stderr = run("dpo", "--out", out, *flags, "--resume", "--steps", "3")
    assert status == 2 and len(stderr.strip().splitlines()) == 1
    assert f"--model {model} changed since the run began" in stderr, stderr


def test_torchrun_is_refused_in_one_line(gpt_base, data, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    status, stdout, stderr = run("dpo", "--model", gpt_base, "--data", data / "pairs.jsonl",
                                 "--out", tmp_path / "out", *QUICK)
    assert status == 2 and stderr == "minitransformer: error: dpo runs in one process: " \
        "torchrun is not supported\n" and stdout == ""
    assert not (tmp_path / "out").exists()


CONVERSATIONAL = pair(0)
REFUSALS = {
    "not json": ([CONVERSATIONAL, CONVERSATIONAL, "{'prompt': 1}"], "{path}:3 is not JSON"),
    "missing key": ([CONVERSATIONAL, {"prompt": "a", "chosen": "b"}],
                    "{path}:2 has no 'rejected'"),
    "not an object": ([CONVERSATIONAL, ["a", "b", "c"]], "{path}:2 must be a dict"),
    "mixed": ([{"prompt": "a", "chosen": "b", "rejected": CONVERSATIONAL["rejected"]}],
              "{path}:1 mixes plain text and lists of messages"),
    "empty": (["", "  "], "--data {path} is empty"),
    "unknown role": ([{**CONVERSATIONAL, "prompt": [{"role": "bot", "content": "hi"}]}],
                     "{path}:1: messages[0] has role 'bot'"),
    "special token": ([{"prompt": "a", "chosen": "b <|user|>", "rejected": "c"}],
                      "{path}:1: chosen contains the special token '<|user|>'"),
    "user reply": ([{**CONVERSATIONAL, "chosen": [{"role": "user", "content": "x"}]}],
                   "{path}:1: chosen must begin with an assistant message"),
    "empty prompt": ([{"prompt": "", "chosen": "b", "rejected": "c"}],
                     "{path}:1: prompt is empty"),
    "too long": ([{**CONVERSATIONAL, "rejected": [{"role": "assistant", "content": "cat " * 40}]}],
                 "{path}:1: rejected is"),
    "nested too deeply": ([CONVERSATIONAL, "[" * 100000],
                          "{path}:2 is not JSON this program reads: it is nested too deeply"),
}


@pytest.mark.parametrize("name", [*REFUSALS, "not utf-8", "no such file", "no such model",
                                  "not a model", "an adapter", "no chat format", "beta 0",
                                  "beta -1", "beta nan", "beta inf", "beta 1e300", "lr 0",
                                  "no model", "lora-alpha 0", "lora-alpha without a rank",
                                  "merge without a rank", "lora-targets nowhere",
                                  "out is a file", "out not empty", "seed -1",
                                  "seed 100000000000000000000000"])
def test_bad_input_is_one_line_naming_it(name, gpt_base, plain_model, data, tmp_path):
    model, path, out = gpt_base, tmp_path / "data.jsonl", tmp_path / "out"
    write(path, [CONVERSATIONAL])
    extra = []
    if name in REFUSALS:
        lines, words = REFUSALS[name]
        write(path, lines)
        words = words.format(path=path)
    elif name == "not utf-8":
        path.write_bytes(json.dumps(CONVERSATIONAL).encode() + b"\n\xff\xfe\n")
        words = f"--data {path} is not UTF-8 text (invalid start byte at byte"
    elif name == "no such file":
        path, words = tmp_path / "nowhere.jsonl", "no such file"
    elif name == "no such model":
        model, words = tmp_path / "nowhere", "no such directory"
    elif name == "not a model":
        model = tmp_path / "texts"
        model.mkdir()
        (model / "notes.txt").write_text("hello", "utf-8")
        words = f"--model {model} is not a model directory (it has no config.json)"
    elif name == "an adapter":
        model = tmp_path / "adapter"
        model.mkdir()
        (model / "adapter_config.json").write_text("{}", "utf-8")
        words = f"--model {model} is a LoRA adapter, not a model"
    elif name == "no chat format":
        model, words = plain_model, f"--model {plain_model} has no chat format"
    elif name.startswith("seed"):
        extra, words = ["--seed", name.split()[1]], "--seed: must be a whole number from 0 to"
    elif name == "beta 1e300":
        extra, words = ["--beta", "1e300"], "--beta 1e+300 is past float32's largest number"
    elif name in ("beta nan", "beta inf"):
        extra, words = ["--beta", name.split()[1]], "--beta: must be a number, got"
    elif name.startswith(("beta", "lr")):
        flag, value = name.split()
        extra, words = [f"--{flag}", value], f"--{flag} must be positive, got"
    elif name == "lora-alpha 0":
        extra, words = ["--lora-rank", "2", "--lora-alpha", "0"], "--lora-alpha must be positive"
    elif name.endswith("without a rank"):
        flag = "--" + name.split()[0]
        extra = [flag, "4"] if flag == "--lora-alpha" else [flag]
        words = f"{flag} needs --lora-rank R"
    elif name == "lora-targets nowhere":
        extra, words = ["--lora-rank", "2", "--lora-targets", "nowhere"], "--lora-targets nowhere"
    elif name == "no model":
        model, words = None, "dpo needs --model"
    elif name == "out is a file":
        out.write_text("mine", "utf-8")
        words = f"--out {out} is a file"
    else:
        out.mkdir()
        (out / "mine.txt").write_text("mine", "utf-8")
        words = f"--out {out} is not empty"
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    argv = ["dpo", "--data", path, "--out", out, *QUICK, *extra]
    status, stdout, stderr = run(*argv, *(["--model", model] if model else []))
    assert status == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert words in stderr, stderr
    assert stdout == ""
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else None) == before


def test_a_line_separator_inside_a_json_string_is_text(tmp_path):
    # JSON Lines end at "\n" only: json.dumps(..., ensure_ascii=False) writes U+2028 and U+0085
    # as they are, and str.splitlines() would cut the line there (review of chapter 17)
    from minitransformer.cli.common import read_json_lines

    path = tmp_path / "pairs.jsonl"
    record = {"prompt": "a\u2028b\x85c\x1ed", "chosen": "x", "rejected": "y"}
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n\n" + json.dumps(record) + "\n",
                    encoding="utf-8")
    records, _ = read_json_lines(str(path))
    assert records == [(1, record), (3, record)]


def test_pairs_whose_chosen_is_rejected_are_warned_of_in_one_line(gpt_base, tmp_path):
    # issue 40: such pairs trained for nothing without a word
    same = write(tmp_path / "same.jsonl", [pair(0), {"prompt": "Say cat:", "chosen": " cat",
                                                     "rejected": " cat"}])
    status, _, stderr = run("dpo", "--model", gpt_base, "--data", same, "--out",
                            tmp_path / "out", *QUICK, "--steps", "1")
    assert status == 0, stderr
    assert stderr == (f"warning: --data {same}: 1 of 2 pairs have chosen equal to rejected "
                      f"(the first: line 2): DPO learns nothing from them\n")


def test_a_lora_rank_above_the_model_width_is_refused_in_one_line(gpt_base, data, tmp_path):
    # issue 40: --lora-rank 10000 on d_model 16 was accepted
    out = tmp_path / "out"
    status, stdout, stderr = run("dpo", "--model", gpt_base, "--data", data / "pairs.jsonl",
                                 "--out", out, *QUICK, "--lora-rank", "10000")
    assert status == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1
    assert "--lora-rank 10000: r=10000 is more than the smaller side of" in stderr
    assert not out.exists() or not any(out.iterdir())


def test_a_checkpoint_of_the_settings_as_a_dict_resumes(gpt_base, data, tmp_path,
                                                       monkeypatch):
    """Checkpoints written before the settings were a dataclass (issue 40) saved a run
    without LoRA with no lora_alpha and lora_targets: they resume, and equal the run never
    stopped; a key no version wrote is refused."""
    flags = ["--model", gpt_base, "--data", data / "pairs.jsonl", *QUICK]
    straight = tmp_path / "straight"
    assert run("dpo", "--out", straight, *flags)[0] == 0
    out = tmp_path / "old"
    save = dpo_command.save_checkpoint

    def save_then_stop(out, loop, *args, **kwargs):
        save(out, loop, *args, **kwargs)
        if loop.step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(dpo_command, "save_checkpoint", save_then_stop)
    assert run("dpo", "--out", out, *flags, "--save-every", "3")[0] == 130
    monkeypatch.setattr(dpo_command, "save_checkpoint", save)
    path = out / "ckpt-3" / "training_state.json"
    state = json.loads(path.read_text())
    state["args"] = {k: v for k, v in state["args"].items()
                     if k not in ("lora_alpha", "lora_targets")}
    assert set(state["args"]) == {"model", "data", "steps", "batch_size", "lr", "seed", "beta",
                                  "lora_rank", "warmup_steps"}
    path.write_text(json.dumps(state))
    wrong = {**state, "args": {**state["args"], "other": 1}}
    path.write_text(json.dumps(wrong))
    status, _, stderr = run("dpo", "--out", out, *flags, "--resume")
    assert status == 2 and "is not what dpo writes" in stderr, stderr
    path.write_text(json.dumps(state))
    status, stdout, stderr = run("dpo", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert "resuming from step 3" in stdout
    assert equal(tensors(out / "model.safetensors"), tensors(straight / "model.safetensors"))
