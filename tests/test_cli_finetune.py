"""``minitransformer finetune`` (chapter 16): supervised fine-tuning from a JSONL file of
conversations, in full or with LoRA; the same TrainingLoop and labels as the package's
``sft_batch``; adapters PEFT loads and merged models transformers loads, with our logits;
resume after SIGKILL bit for bit; torchrun; one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

from minitransformer import GPT, BPETokenizer  # noqa: E402
from minitransformer.chat import CHAT_TOKENS  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from minitransformer.lora import load_adapter  # noqa: E402
from minitransformer.sft import sft_batch  # noqa: E402
from minitransformer.training import TrainingLoop, make_optimizer  # noqa: E402
# one_thread is an autouse fixture: imported, it runs this module on one thread; gpt_base,
# llama_base and plain_model come from conftest.py (cli_helpers.py's)
from cli_helpers import (  # noqa: E402, F401
    ROOT,
    assert_same_run,
    equal,
    kill_after_checkpoint,
    one_thread,
    run,
    subprocess_env,
    tensors,
    text_folder,
    write,
)

PYTHON = sys.executable
BASE = ["--steps", "4", "--batch-size", "4", "--context-length", "48", "--num-layers", "1",
        "--num-heads", "2", "--d-model", "16", "--vocab-size", "280", "--no-progress",
        "--device", "cpu", "--threads", "1"]
QUICK = ["--steps", "6", "--batch-size", "4", "--lr", "1e-2", "--no-progress", "--device",
         "cpu", "--threads", "1", "--log-every", "3"]
WORDS = ["cat", "dog", "bird", "fish", "ant", "owl"]


def conversation(k: int) -> dict:
    word = WORDS[k % len(WORDS)]
    messages = [{"role": "user", "content": f"Say {word}"},
                {"role": "assistant", "content": word}]
    if k % 3 == 0:
        messages = [{"role": "system", "content": "Be brief."}, *messages,
                    {"role": "user", "content": "Again"}, {"role": "assistant", "content": word}]
    return {"messages": messages}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = text_folder(tmp_path_factory)
    jsonl = folder / "chats.jsonl"
    jsonl.write_text("".join(json.dumps(conversation(k)) + "\n" for k in range(24)), "utf-8")
    return folder


@pytest.fixture(scope="module")
def base_flags() -> list:
    """The base models' flags: a context of 48 (the sft_batch reference below uses it)."""
    return BASE


def test_train_reserves_the_chat_tokens(gpt_base):
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    assert all(token in tokenizer.special_tokens for token in CHAT_TOKENS)
    assert len(tokenizer) == 280 == GPT.from_pretrained(gpt_base).config.vocab_size
    config = json.loads((gpt_base / "tokenizer_config.json").read_text())
    assert "chat_template" in config and config["eos_token"] == "<|end|>"


def test_help_lists_every_flag():
    status, stdout, _ = run("finetune", "--help")
    assert status == 0
    for flag in ("--model", "--data", "--out", "--steps", "--lr", "--batch-size", "--seed",
                 "--lora-rank", "--lora-alpha", "--lora-targets", "--merge", "--threads",
                 "--resume", "--save-every"):
        assert flag in stdout, flag


def test_full_fine_tuning_is_the_training_loop_on_sft_batches(gpt_base, data, tmp_path):
    """The command adds files and checkpoints, nothing else: its weights equal, bit for bit,
    TrainingLoop run on sft_batch's batches (labels on the assistant's tokens only) with the
    same seed; and transformers loads the directory with our logits."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "full"
    status, stdout, stderr = run("finetune", "--model", gpt_base, "--data",
                                 data / "chats.jsonl", "--out", out, *QUICK)
    assert status == 0, stderr
    assert "every weight" in stdout and "step 6: train loss" in stdout

    conversations = [json.loads(line)["messages"]
                     for line in (data / "chats.jsonl").read_text().splitlines()]
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    torch.manual_seed(0)
    model = GPT.from_pretrained(gpt_base)
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            picks = torch.randint(len(conversations), (4,), generator=generator).tolist()
            yield sft_batch(tokenizer, [conversations[i] for i in picks], context_length=48)

    TrainingLoop(model, make_optimizer(model, 1e-2, 0.1), steps=6, lr=1e-2,
                 warmup_steps=1).run(batches())
    assert equal(GPT.from_pretrained(out).state_dict(), model.state_dict())
    assert not equal(tensors(out / "model.safetensors"), tensors(gpt_base / "model.safetensors"))

    theirs = transformers.AutoModelForCausalLM.from_pretrained(out)
    idx = torch.tensor([tokenizer.apply_chat_template(conversations[0])[:32]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, GPT.from_pretrained(out)(idx)[0],
                                   atol=1e-5, rtol=1e-5)


def test_lora_writes_an_adapter_peft_loads_and_a_merged_model_transformers_loads(
        llama_base, data, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    out = tmp_path / "lora"
    status, stdout, stderr = run("finetune", "--model", llama_base, "--data",
                                 data / "chats.jsonl", "--out", out, *QUICK, "--lora-rank", "2",
                                 "--lora-alpha", "4", "--merge")
    assert status == 0, stderr
    assert "LoRA of rank 2 on q_proj, v_proj" in stdout
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["lora_alpha"] == 4
    assert config["base_model_name_or_path"] == str(llama_base.resolve())
    assert not (out / "model.safetensors").exists()
    assert tensors(out / "merged" / "model.safetensors").keys() == \
        tensors(llama_base / "model.safetensors").keys()

    ours = load_adapter(Llama.from_pretrained(llama_base), out).eval()
    b = [m.lora_B.weight for m in ours.modules() if hasattr(m, "lora_B")]
    assert b and all(w.abs().max() > 0 for w in b)          # the adapter trained
    tokenizer = BPETokenizer.from_pretrained(out)
    idx = torch.tensor([tokenizer.apply_chat_template(conversation(0)["messages"])[:32]])
    with torch.no_grad():
        expected = ours(idx)[0]
        base = transformers.AutoModelForCausalLM.from_pretrained(llama_base)
        adapted = peft.PeftModel.from_pretrained(base, out).eval()
        torch.testing.assert_close(adapted(idx).logits, expected, atol=1e-5, rtol=1e-5)
        merged = transformers.AutoModelForCausalLM.from_pretrained(out / "merged")
        torch.testing.assert_close(merged(idx).logits, expected, atol=1e-5, rtol=1e-5)
        plain = transformers.AutoModelForCausalLM.from_pretrained(llama_base)
        assert (plain(idx).logits - expected).abs().max() > 1e-4


def test_lora_on_gpt_s_fused_query_key_value_is_refused_before_training(gpt_base, data,
                                                                         tmp_path):
    out = tmp_path / "qv"
    status, stdout, stderr = run("finetune", "--model", gpt_base, "--data",
                                 data / "chats.jsonl", "--out", out, *QUICK,
                                 "--lora-rank", "2", "--lora-targets", "q_proj", "v_proj")
    assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "--lora-targets q_proj v_proj" in stderr and "c_attn" in stderr
    assert not out.exists() and stdout == ""


@pytest.mark.parametrize("name", ["not json", "missing role", "unknown role", "too long",
                                  "no chat format", "empty", "no messages", "no assistant",
                                  "merge without lora", "no such model", "an adapter",
                                  "no config"])
def test_bad_input_is_one_line_naming_it(name, gpt_base, plain_model, data, tmp_path):
    good = conversation(1)
    model, path = gpt_base, tmp_path / "data.jsonl"
    extra = []
    if name == "not json":
        write(path, [good, good, "{'messages': []}"])
        words = f"{path}:3 is not JSON"
    elif name == "missing role":
        write(path, [good, {"messages": [{"content": "hi"}]}])
        words = f"{path}:2: messages[0] has no 'role'"
    elif name == "unknown role":
        write(path, ["", {"messages": [{"role": "bot", "content": "hi"}]}])
        words = f"{path}:2: messages[0] has role 'bot'"
    elif name == "too long":
        write(path, [{"messages": [{"role": "user", "content": "cat " * 80},
                                   {"role": "assistant", "content": "ok"}]}])
        words = f"{path}:1: the conversation is"
    elif name == "no chat format":
        write(path, [good])
        model, words = plain_model, (f"--model {plain_model} has no chat format: its "
                                     f"tokenizer lacks the special tokens <|system|>")
    elif name == "empty":
        write(path, ["", "  "])
        words = f"--data {path} is empty"
    elif name == "no messages":
        write(path, [{"prompt": "hi"}])
        words = f"{path}:1 has no \"messages\""
    elif name == "no assistant":
        write(path, [{"messages": [{"role": "user", "content": "hi"}]}])
        words = f"{path}:1: the conversation has no assistant message"
    elif name == "merge without lora":
        write(path, [good])
        extra, words = ["--merge"], "--merge needs --lora-rank"
    elif name == "an adapter":
        write(path, [good])
        model = tmp_path / "adapter"
        model.mkdir()
        (model / "adapter_config.json").write_text("{}", "utf-8")
        words = f"--model {model} is a LoRA adapter, not a model"
    elif name == "no config":
        write(path, [good])
        model = tmp_path / "tokenizer_only"
        model.mkdir()
        for name in ("vocab.json", "merges.txt"):
            (model / name).write_bytes((gpt_base / name).read_bytes())
        words = f"--model {model} is not a model directory: it has no config.json"
    else:
        write(path, [good])
        model, words = tmp_path / "nowhere", "no such directory"
    out = tmp_path / "out"
    status, _, stderr = run("finetune", "--model", model, "--data", path, "--out", out, *QUICK,
                            *extra)
    assert status == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert words in stderr, stderr
    assert not out.exists() or not any(out.iterdir())


# ----- processes ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["full", "lora"])
def test_sigkill_then_resume_is_bit_identical(mode, llama_base, data, tmp_path):
    """A process killed at a random moment after a checkpoint (saved every step), then resumed
    in this process: the weights, optimizer moments and RNG states equal the run never
    stopped. With LoRA, the resumed run adds the layers before loading A and B."""
    lora = ["--lora-rank", "2"] if mode == "lora" else []
    flags = ["--model", llama_base, "--data", data / "chats.jsonl", *QUICK, "--steps", "30",
             *lora]
    straight = tmp_path / "straight"
    assert run("finetune", "--out", straight, *flags)[0] == 0
    out = tmp_path / "killed"
    step = kill_after_checkpoint("finetune", out, flags, steps=30, pause=0.2)
    status, stdout, stderr = run("finetune", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert f"resuming from step {step}" in stdout
    assert_same_run(out, straight, 30,
                    "adapter_model.safetensors" if lora else "model.safetensors")
    # the run is complete; --merge afterwards writes the merged model (LoRA only)
    status, stdout, stderr = run("finetune", "--out", out, *flags, "--resume",
                                 *(["--merge"] if lora else []))
    assert status == 0 and "is complete" in stdout, stderr
    assert (out / "merged" / "model.safetensors").exists() == bool(lora)


def test_resume_refuses_another_flag_and_a_changed_file(llama_base, data, tmp_path):
    flags = ["--model", llama_base, "--data", data / "chats.jsonl", *QUICK, "--steps", "2",
             "--lora-rank", "2"]
    out = tmp_path / "run"
    assert run("finetune", "--out", out, *flags)[0] == 0
    status, _, stderr = run("finetune", "--out", out, *flags, "--lora-rank", "4", "--resume")
    assert status == 2 and "--lora-rank 4 differs from the checkpoint's 2" in stderr
    changed = write(tmp_path / "other.jsonl", [conversation(1)])
    status, _, stderr = run("finetune", "--out", out, *flags, "--data", changed, "--resume")
    assert status == 2 and "--data" in stderr and len(stderr.strip().splitlines()) == 1
    status, _, stderr = run("finetune", "--out", out, *flags)
    assert status == 2 and "pass --resume" in stderr
    status, _, stderr = run("finetune", "--out", llama_base, *flags, "--resume")   # train's
    assert status == 2 and "is not what finetune writes" in stderr
    status, _, stderr = run("train", "--out", out, "--resume")
    assert status == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_torchrun_two_processes_equal_one(gpt_base, data, tmp_path):
    """Each process's loss is weighted by its share of the batch's assistant tokens, so two
    processes take the step of one over the whole batch (not the mean of two means)."""
    flags = ["finetune", "--model", gpt_base, "--data", data / "chats.jsonl", *QUICK]
    one = tmp_path / "one"
    assert run(*flags, "--out", one)[0] == 0
    two = tmp_path / "two"
    result = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
         "minitransformer", *map(str, flags), "--out", str(two)],
        capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("fine-tuning a GPT") == 1
    a, b = tensors(one / "model.safetensors"), tensors(two / "model.safetensors")
    gap = max((a[k] - b[k]).abs().max().item() for k in a)
    assert gap <= 1e-4


def test_a_lora_rank_above_the_model_width_is_refused_in_one_line(gpt_base, data, tmp_path):
    # issue 40: --lora-rank 10000 on a model of width 16 was accepted
    status, stdout, stderr = run("finetune", "--model", gpt_base, "--data",
                                 data / "chats.jsonl", "--out", tmp_path / "out", *QUICK,
                                 "--lora-rank", "10000")
    assert status == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1
    assert "--lora-rank 10000: r=10000 is more than the smaller side of" in stderr
