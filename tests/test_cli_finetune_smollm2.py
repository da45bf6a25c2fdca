"""``finetune --model smollm2`` (chapter 16): LoRA on SmolLM2-135M-Instruct from the cached GGUF
file, with its own chat template (the assistant's tokens marked), a SIGKILL then ``--resume``
bit for bit, and ``--merge`` writing a directory that transformers loads with the same logits
and that ``serve`` loads. A few steps of one short conversation each, so it stays quick; the
tiny-model tests in ``test_cli_finetune.py`` cover the rest of the command."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch

from minitransformer import pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import apply_chat_template
from minitransformer.cli.common import load_model
from minitransformer.llama import Llama
from minitransformer.lora import load_adapter

from cli_helpers import equal, one_thread, run, tensors  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--model", "smollm2", "--steps", "4", "--batch-size", "1", "--lr", "1e-2",
         "--lora-rank", "2", "--no-progress", "--device", "cpu", "--threads", "1"]
CHATS = [[{"role": "user", "content": f"What is {a} plus {a}?"},
          {"role": "assistant", "content": json.dumps({"answer": str(2 * a)})}]
         for a in range(1, 5)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS), "utf-8")
    return path


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "straight"
    status, stdout, stderr = run("finetune", "--data", data, "--out", out, *FLAGS, "--merge")
    assert status == 0, stderr
    assert "LoRA of rank 2 on q_proj, v_proj" in stdout
    return out


def test_the_adapter_is_for_the_gguf_file_and_trained(straight):
    config = json.loads((straight / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(pretrained.smollm2_path())
    model = load_adapter(Llama.from_gguf(pretrained.smollm2_path()), straight)
    b = [m.lora_B.weight for m in model.modules() if hasattr(m, "lora_B")]
    assert len(b) == 60 and all(w.abs().max() > 0 for w in b)


def test_merged_is_a_directory_transformers_and_serve_load(straight):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = straight / "merged"
    config = json.loads((merged / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    tokenizer = BPETokenizer.from_pretrained(merged)
    messages = CHATS[0]
    ids = apply_chat_template(tokenizer, messages)
    assert ids == AutoTokenizer.from_pretrained(merged).apply_chat_template(
        messages, tokenize=True, return_dict=True)["input_ids"]
    idx = torch.tensor([ids])
    adapted = load_adapter(Llama.from_gguf(pretrained.smollm2_path()), straight).eval()
    served, _ = load_model(str(merged), torch.device("cpu"))   # what serve and chat read
    with torch.no_grad():
        expected = adapted(idx)[0]
        theirs = AutoModelForCausalLM.from_pretrained(merged).eval()(idx).logits
        torch.testing.assert_close(served(idx)[0], expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(theirs, expected, atol=1e-4, rtol=1e-4)
        base = Llama.from_gguf(pretrained.smollm2_path())(idx)[0]
    assert (base - expected).abs().max() > 1e-3                  # the adapter changed it


def saved_step(out: Path) -> int:
    try:
        return json.loads((out / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


def test_sigkill_then_resume_is_bit_identical(straight, data, tmp_path):
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "minitransformer", "finetune", "--out", str(out),
            "--data", str(data), *FLAGS, "--save-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 600
    while saved_step(out) < 1 and process.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, 0.2))
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    step = saved_step(out)
    assert process.returncode == -signal.SIGKILL and 1 <= step < 4, (step, stderr[-2000:])
    status, stdout, stderr = run("finetune", "--out", out, "--data", data, *FLAGS, "--resume")
    assert status == 0, stderr
    assert f"resuming from step {step}" in stdout
    weights = "adapter_model.safetensors"
    assert equal(tensors(out / weights), tensors(straight / weights))


def test_a_template_without_marks_is_refused_in_one_line(straight, tmp_path, data):
    model = tmp_path / "unmarked"       # refused before its weights are read: none here
    BPETokenizer.from_gguf(pretrained.smollm2_path()).save_pretrained(model)
    (model / "config.json").write_text((straight / "merged" / "config.json").read_text())
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    status, _, stderr = run("finetune", "--data", data, "--out", tmp_path / "x", *FLAGS[2:],
                            "--model", model)
    assert status == 2 and stderr.count("\n") == 1
    assert "no {% generation %} block" in stderr


def test_dpo_and_grpo_take_smollm2_too(tmp_path):
    """``--model smollm2`` resolves for dpo and grpo as for finetune (cli.common.model_path):
    DPO's first loss is ln 2 through SmolLM2's own template, GRPO samples and scores a round,
    and each writes a model directory whose weights differ from the file's only where LoRA
    was merged (q_proj, v_proj; GRPO's round may carry no signal, and then changes nothing)."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"Name a {thing}."}],
        "chosen": [{"role": "assistant", "content": f"{answer}."}],
        "rejected": [{"role": "assistant", "content": f"{answer} is a {thing} that many "
                      f"people know well."}]}) + "\n"
        for thing, answer in [("colour", "Blue"), ("fruit", "Apple")]), "utf-8")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"What is {a} + {a}? Reply with the number."}],
        "answer": str(2 * a)}) + "\n" for a in (2, 3)), "utf-8")
    small = ["--steps", "1", "--batch-size", "2", "--lora-rank", "2", "--no-progress",
             "--device", "cpu", "--threads", "1"]
    status, stdout, stderr = run("dpo", "--model", "smollm2", "--data", pairs, "--out",
                                 tmp_path / "dpo", *small)
    assert status == 0, stderr
    assert "step 1: loss 0.6931" in stdout
    status, stdout, stderr = run("grpo", "--model", "smollm2", "--data", prompts, "--reward",
                                 "exact", "--out", tmp_path / "grpo", "--group-size", "2",
                                 "--max-new-tokens", "4", *small)
    assert status == 0, stderr
    assert "round 1: reward" in stdout
    base = Llama.from_gguf(pretrained.smollm2_path()).state_dict()
    for name in ("dpo", "grpo"):
        changed = {k for k, v in Llama.from_pretrained(tmp_path / name).state_dict().items()
                   if not torch.equal(v, base[k])}
        assert all(".q_proj." in k or ".v_proj." in k for k in changed), name
        assert changed or name == "grpo"
