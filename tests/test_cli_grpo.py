"""``minitransformer grpo`` (chapter 17): GRPO from a JSONL file of prompts (TRL's format,
plain and conversational) and reward functions named ``module:function`` (called as TRL calls
them) or by the package's names; the same TrainingLoop and rounds as the package's ``GRPO``; a
directory transformers loads (merged with LoRA); resume after an interruption or a SIGKILL bit
for bit; one-line refusals."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

from minitransformer import GPT, BPETokenizer  # noqa: E402
from minitransformer.chat import END_OF_TURN, apply_chat_template  # noqa: E402
from minitransformer.cli import grpo as grpo_command  # noqa: E402
from minitransformer.data import reward_length  # noqa: E402
from minitransformer.grpo import GRPO  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from minitransformer.training import TrainingLoop, make_optimizer  # noqa: E402
# one_thread is an autouse fixture: imported, it runs this module on one thread; gpt_base,
# llama_base and plain_model come from conftest.py (cli_helpers.py's)
from cli_helpers import (  # noqa: E402, F401
    ROOT,
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

QUICK = ["--steps", "6", "--batch-size", "3", "--group-size", "4", "--max-new-tokens", "6",
         "--lr", "1e-2", "--no-progress", "--device", "cpu", "--threads", "1",
         "--log-every", "3"]
WORDS = ["cat", "dog", "bird", "fish", "ant", "owl"]


def chat_row(k: int) -> dict:
    word = WORDS[k % len(WORDS)]
    return {"prompt": [{"role": "user", "content": f"Say {word}"}], "answer": word, "k": k}


def plain_row(k: int) -> dict:
    word = WORDS[k % len(WORDS)]
    return {"prompt": f"Say {word}:", "answer": word}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = text_folder(tmp_path_factory)
    write(folder / "prompts.jsonl", [chat_row(k) for k in range(6)])
    write(folder / "plain.jsonl", [plain_row(k) for k in range(6)])
    return folder


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """The test runs in ``tmp_path`` (where --reward's modules are written), and forgets the
    modules it imported from there (and sys.path, where the command puts it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", "") and \
                str(tmp_path) in str(sys.modules[name].__file__):
            del sys.modules[name]


def test_help_lists_every_flag():
    status, stdout, _ = run("grpo", "--help")
    assert status == 0
    for flag in ("--model", "--data", "--reward", "--out", "--steps", "--lr", "--batch-size",
                 "--group-size", "--max-new-tokens", "--temperature", "--beta", "--epsilon",
                 "--iterations", "--loss-type", "--seed", "--lora-rank", "--lora-alpha",
                 "--lora-targets", "--merge", "--resume", "--save-every", "--log-every",
                 "--threads", "exact", "overlap", "length"):
        assert flag in stdout, flag


def test_grpo_is_the_training_loop_on_grpo_rounds(gpt_base, data, tmp_path):
    """The command adds files, checkpoints and printing, nothing else: its weights equal, bit
    for bit, TrainingLoop run on GRPO's rollouts of prompts drawn with the same generator,
    scored by the package's reward_length on the decoded replies (--reward length)."""
    out = tmp_path / "run"
    status, stdout, stderr = run("grpo", "--model", gpt_base, "--data", data / "prompts.jsonl",
                                 "--reward", "length", "--out", out, *QUICK)
    assert status == 0, stderr
    assert "every weight" in stdout and "6 conversational prompts" in stdout
    printed = re.findall(r"round (\d+): reward (\d+\.\d{4}), groups with signal (\d\.\d\d)",
                         stdout)
    assert [int(r) for r, _, _ in printed] == [1, 3, 6]

    rows = [json.loads(line) for line in (data / "prompts.jsonl").read_text().splitlines()]
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    end = tokenizer.special_tokens[END_OF_TURN]
    specials = set(tokenizer.special_tokens.values())
    ids = [apply_chat_template(tokenizer, row["prompt"], add_generation_prompt=True)
           for row in rows]
    torch.manual_seed(0)
    policy = GPT.from_pretrained(gpt_base)
    objective = GRPO(policy, loss_type="dapo", kl_correction=True)
    generator = torch.Generator().manual_seed(0)
    first = []

    def reward(completions):
        texts = [tokenizer.decode([t for t in c if t not in specials]) for c in completions]
        values = reward_length(texts)
        first.append(sum(values) / len(values))
        return values

    def rounds():
        while True:
            picks = torch.randint(6, (3,), generator=generator).tolist()
            yield (objective.rollout([ids[i] for i in picks], reward, group_size=4,
                                     max_new_tokens=6, eos_id=end, generator=generator),)

    TrainingLoop(objective, make_optimizer(policy, 1e-2, 0.0), steps=6, lr=1e-2,
                 warmup_steps=1).run(rounds())
    assert equal(GPT.from_pretrained(out).state_dict(), policy.state_dict())
    assert not equal(tensors(out / "model.safetensors"), tensors(gpt_base / "model.safetensors"))
    assert float(printed[0][1]) == pytest.approx(first[0], abs=1e-4)


def test_lora_writes_a_merged_model_transformers_loads(llama_base, data, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "lora"
    status, stdout, stderr = run("grpo", "--model", llama_base, "--data", data / "plain.jsonl",
                                 "--reward", "length", "--out", out, *QUICK, "--lora-rank", "2",
                                 "--merge", "--beta", "0.1")
    assert status == 0, stderr
    assert "LoRA of rank 2 on q_proj, v_proj" in stdout and "6 plain prompts" in stdout
    kls = [float(k) for k in re.findall(r"KL to the reference (\S+?)[,\s]", stdout)]
    assert len(kls) == 3 and kls[0] == 0.0 and kls[-1] > 0       # round 1: the reference
    assert not (out / "adapter_config.json").exists()
    ours, base = Llama.from_pretrained(out), Llama.from_pretrained(llama_base)
    assert ours.state_dict().keys() == base.state_dict().keys()
    assert equal(Llama.from_pretrained(out / "merged").state_dict(), ours.state_dict())
    tokenizer = BPETokenizer.from_pretrained(out)
    idx = torch.tensor([tokenizer.encode("Say cat: cat")])
    with torch.no_grad():
        expected = ours(idx)[0]
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(theirs(idx).logits, expected, atol=1e-5, rtol=1e-5)
        assert (base(idx)[0] - expected).abs().max() > 1e-4          # it trained
    changed = [k for k, v in ours.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed)
    saved = json.loads((out / "ckpt-6" / "training_state.json").read_text())["args"]
    assert (saved["lora_alpha"], saved["lora_targets"], saved["beta"]) == (2.0, ["q_proj",
                                                                             "v_proj"], 0.1)


SPY = '''
import json


def spy(prompts, completions, completion_ids, **columns):
    with open("calls.jsonl", "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions,
                            "completion_ids": completion_ids, "columns": columns}) + "\\n")
    return [None if n == 0 else float(len(c if isinstance(c, str) else c[0]["content"]))
            for n, c in enumerate(completions)]
'''


@pytest.mark.parametrize("kind", ["conversational", "plain"])
def test_a_reward_module_in_the_current_directory_is_called_as_trl_calls_it(
        kind, gpt_base, data, in_tmp):
    """prompts and each other column repeated for a prompt's replies, the completions as text
    (plain) or as one assistant message (conversational), their ids, and None accepted (TRL's
    unscorable completion)."""
    module = f"spy_{kind}"
    (in_tmp / f"{module}.py").write_text(SPY, "utf-8")
    source = data / ("prompts.jsonl" if kind == "conversational" else "plain.jsonl")
    status, stdout, stderr = run("grpo", "--model", gpt_base, "--data", source, "--reward",
                                 f"{module}:spy", "--out", in_tmp / "out", *QUICK,
                                 "--steps", "2")
    assert status == 0, stderr
    assert "replies unscored" in stdout
    calls = [json.loads(line) for line in (in_tmp / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    rows = {json.dumps(row["prompt"]): row for row in
            (json.loads(line) for line in source.read_text().splitlines())}
    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    specials = set(tokenizer.special_tokens.values())
    for call in calls:
        prompts, completions = call["prompts"], call["completions"]
        assert len(prompts) == len(completions) == len(call["completion_ids"]) == 12
        assert all(prompts[i] == prompts[i - i % 4] for i in range(12))     # groups of 4
        wanted = ["answer", "k"] if kind == "conversational" else ["answer"]
        assert sorted(call["columns"]) == wanted
        for i, prompt in enumerate(prompts):
            row = rows[json.dumps(prompt)]
            assert all(call["columns"][key][i] == row[key] for key in wanted)
            text = tokenizer.decode([t for t in call["completion_ids"][i] if t not in specials])
            if kind == "conversational":
                assert completions[i] == [{"role": "assistant", "content": text}]
            else:
                assert completions[i] == text


def test_interrupted_then_resumed_is_bit_identical(gpt_base, data, tmp_path, monkeypatch):
    """A LoRA run with a KL term and two updates a round, stopped (Ctrl-C) right after the
    checkpoint of round 3, then resumed: the weights, optimizer moments, LoRA matrices and RNG
    states equal the run never stopped."""
    flags = ["--model", gpt_base, "--data", data / "prompts.jsonl", "--reward", "length",
             *QUICK, "--lora-rank", "2", "--beta", "0.1", "--iterations", "2"]
    straight = tmp_path / "straight"
    assert run("grpo", "--out", straight, *flags)[0] == 0
    out = tmp_path / "stopped"
    plain_save = interrupt_after(monkeypatch, grpo_command, 6)
    status, _, stderr = run("grpo", "--out", out, *flags, "--save-every", "1")
    assert status == 130 and "interrupted" in stderr
    plain_save()
    status, stdout, stderr = run("grpo", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert "resuming from round 3" in stdout and "round 6: reward" in stdout
    assert_same_run(out, straight, 12)
    status, stdout, _ = run("grpo", "--out", out, *flags, "--resume")
    assert status == 0 and "is complete" in stdout


def test_sigkill_then_resume_is_bit_identical(gpt_base, data, tmp_path):
    """A process killed at a random moment after a checkpoint (saved every round), then
    resumed in this process: the weights, optimizer moments and RNG states equal the run never
    stopped."""
    flags = ["--model", gpt_base, "--data", data / "prompts.jsonl", "--reward", "length",
             *QUICK, "--steps", "20"]
    straight = tmp_path / "straight"
    assert run("grpo", "--out", straight, *flags)[0] == 0
    out = tmp_path / "killed"
    step = kill_after_checkpoint("grpo", out, flags, steps=20)
    status, stdout, stderr = run("grpo", "--out", out, *flags, "--resume")
    assert status == 0, stderr
    assert f"resuming from round {step}" in stdout
    assert_same_run(out, straight, 20)


def test_resume_refuses_another_flag_a_changed_file_and_another_run(gpt_base, data, tmp_path):
    prompts = write(tmp_path / "prompts.jsonl", [chat_row(k) for k in range(6)])
    flags = ["--model", gpt_base, "--data", prompts, "--reward", "length", *QUICK,
             "--steps", "2"]
    out = tmp_path / "run"
    assert run("grpo", "--out", out, *flags)[0] == 0
    cases = [(["--group-size", "2", "--resume"], "--group-size 2 differs from the checkpoint's 4"),
             (["--reward", "exact", "--resume"], "--reward ['exact'] differs"),
             ([], "pass --resume")]
    for extra, words in cases:
        status, _, stderr = run("grpo", "--out", out, *flags, *extra)
        assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
        assert words in stderr, stderr
    write(prompts, [chat_row(k) for k in range(7)])
    status, _, stderr = run("grpo", "--out", out, *flags, "--resume", "--steps", "3")
    assert status == 2 and f"--data {prompts} changed since the run began" in stderr, stderr
    status, _, stderr = run("grpo", "--out", gpt_base, *flags, "--resume")   # train's run
    assert status == 2 and "is not what grpo writes" in stderr
    status, _, stderr = run("grpo", "--out", tmp_path / "none", *flags, "--resume")
    assert status == 2 and "nothing to resume" in stderr


ROW = chat_row(0)
#: --data files refused before anything runs: lines, words ({path}: the file)
DATA_REFUSALS = {
    "not json": ([ROW, "{'prompt': 1}"], "{path}:2 is not JSON"),
    "no prompt": ([ROW, {"answer": "x"}], "{path}:2 has no \"prompt\""),
    "not an object": ([ROW, ["a"]], "{path}:2 has no \"prompt\""),
    "prompt a number": ([{"prompt": 3}], "{path}:1: the prompt must be text or a list of "
                                         "messages, got int"),
    "mixed": ([ROW, {**ROW, "prompt": "Say cat:"}],
              "{path}:2 mixes plain-text and conversational prompts"),
    "other columns": ([ROW, {"prompt": ROW["prompt"], "answer": "x"}],
                      "{path}:2 has the columns ['answer', 'prompt'], line 1"),
    "a completions column": ([{**ROW, "completions": "x"}], "{path}:1 has a column "
                                                           "'completions'"),
    "empty": (["", "  "], "--data {path} is empty"),
    "empty prompt": ([{"prompt": ""}], "{path}:1: the prompt is empty"),
    "unknown role": ([{**ROW, "prompt": [{"role": "bot", "content": "hi"}]}],
                     "{path}:1: messages[0] has role 'bot'"),
    "too long": ([{**ROW, "prompt": [{"role": "user", "content": "cat " * 80}]}],
                 "{path}:1: the prompt is"),
    "nested too deeply": ([ROW, "[" * 100000],
                          "{path}:2 is not JSON this program reads: it is nested too deeply"),
}
#: --reward modules refused before anything runs: the module's text, the flag, words
MODULE_REFUSALS = {
    "no module": (None, "nowhere_at_all:f", "no module named 'nowhere_at_all'"),
    "no function": ("x = 1\n", "{module}:missing", "has no 'missing'"),
    "not a function": ("missing = 1\n", "{module}:missing", "is int, not a function"),
    "import raises": ("raise RuntimeError('boom')\n", "{module}:f",
                      "importing {module} failed: RuntimeError: boom"),
    "syntax error": ("def f(:\n", "{module}:f", "importing {module} failed: SyntaxError"),
    "not a name": (None, "nothing", "--reward nothing: give MODULE:FUNCTION, or one of the "
                                    "package's rewards: exact, overlap, length"),
}
#: reward functions refused at the first round: the function's body, words
REWARD_REFUSALS = {
    "wrong count": ("return [1.0] * 3", "f returned 3 rewards for 12 completions"),
    "nan": ("return [float('nan')] * len(completions)", "f returned nan at index 0"),
    "inf": ("return [0.0] + [float('inf')] * 11", "f returned inf at index 1"),
    "a string": ("return ['1'] * len(completions)", "f returned str ('1') at index 0"),
    "a bool": ("return [True] * len(completions)", "f returned bool (True) at index 0"),
    "a number": ("return 1.0", "f returned float, not a list of 12 numbers"),
    "raises": ("return 1 / 0", "--reward: f raised ZeroDivisionError: division by zero"),
    "a missing column": ("return [float(len(a)) for a in kwargs['solution']]",
                         "--reward: f raised KeyError: 'solution'"),
}


@pytest.mark.parametrize("name", [*DATA_REFUSALS, *MODULE_REFUSALS, "not utf-8",
                                  "no such file", "no such model", "not a model",
                                  "no chat format", "group-size 1", "temperature 0",
                                  "epsilon 0", "lr 0", "beta -1", "no model", "no data",
                                  "no reward", "lora-alpha without a rank",
                                  "merge without a rank", "lora-targets nowhere",
                                  "out is a file", "out not empty", "seed -1"])
def test_bad_input_is_one_line_naming_it(name, gpt_base, plain_model, data, in_tmp):
    model, path, out = gpt_base, in_tmp / "data.jsonl", in_tmp / "out"
    write(path, [ROW])
    reward, extra, given = "exact", [], {"model", "data"}
    if name in DATA_REFUSALS:
        lines, words = DATA_REFUSALS[name]
        write(path, lines)
        words = words.format(path=path)
    elif name in MODULE_REFUSALS:
        module = "refused_" + re.sub(r"\W", "_", name)
        text, reward, words = (s.format(module=module) if s else s
                               for s in MODULE_REFUSALS[name])
        if text is not None:
            (in_tmp / f"{module}.py").write_text(text, "utf-8")
    elif name == "not utf-8":
        path.write_bytes(json.dumps(ROW).encode() + b"\n\xff\xfe\n")
        words = f"--data {path} is not UTF-8 text (invalid start byte at byte"
    elif name == "no such file":
        path, words = in_tmp / "nowhere.jsonl", "no such file"
    elif name == "no such model":
        model, words = in_tmp / "nowhere", "no such directory"
    elif name == "not a model":
        model = in_tmp / "texts"
        model.mkdir()
        (model / "notes.txt").write_text("hello", "utf-8")
        words = f"--model {model} is not a model directory (it has no config.json)"
    elif name == "no chat format":
        model, words = plain_model, f"--model {plain_model} has no chat format"
    elif name == "group-size 1":
        extra, words = ["--group-size", "1"], "--group-size must be at least 2"
    elif name == "beta -1":
        extra, words = ["--beta", "-1"], "--beta must be 0 or more, got -1.0"
    elif name.split()[0] in ("temperature", "epsilon", "lr"):
        flag, value = name.split()
        extra, words = [f"--{flag}", value], f"--{flag} must be positive, got 0.0"
    elif name == "seed -1":
        extra, words = ["--seed", "-1"], "--seed: must be a whole number from 0 to"
    elif name.startswith("no "):
        given.discard(name[3:])
        words = f"grpo needs --{name[3:]}"
        reward = None if name == "no reward" else reward
    elif name.endswith("without a rank"):
        flag = "--" + name.split()[0]
        extra = [flag, "4"] if flag == "--lora-alpha" else [flag]
        words = f"{flag} needs --lora-rank R"
    elif name == "lora-targets nowhere":
        extra, words = ["--lora-rank", "2", "--lora-targets", "nowhere"], "--lora-targets nowhere"
    elif name == "out is a file":
        out.write_text("mine", "utf-8")
        words = f"--out {out} is a file"
    else:
        out.mkdir()
        (out / "mine.txt").write_text("mine", "utf-8")
        words = f"--out {out} is not empty"
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    argv = ["grpo", "--out", out, *QUICK, *extra]
    argv += ["--model", model] if "model" in given else []
    argv += ["--data", path] if "data" in given else []
    argv += ["--reward", reward] if reward else []
    status, stdout, stderr = run(*argv)
    assert status == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert words in stderr, stderr
    assert stdout == ""
    assert (sorted(p.name for p in out.iterdir()) if out.is_dir() else None) == before


@pytest.mark.parametrize("name", list(REWARD_REFUSALS))
def test_a_reward_that_fails_is_one_line_naming_it(name, gpt_base, data, in_tmp):
    body, words = REWARD_REFUSALS[name]
    module = "failing_" + re.sub(r"\W", "_", name)
    (in_tmp / f"{module}.py").write_text(f"def f(completions, **kwargs):\n    {body}\n", "utf-8")
    out = in_tmp / "out"
    status, _, stderr = run("grpo", "--model", gpt_base, "--data", data / "prompts.jsonl",
                            "--reward", f"{module}:f", "--out", out, *QUICK)
    assert status == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert words in stderr, stderr
    assert not out.exists() or not any(out.iterdir())       # no checkpoint: a new run starts


def test_torchrun_is_refused_in_one_line(gpt_base, data, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    status, stdout, stderr = run("grpo", "--model", gpt_base, "--data", data / "prompts.jsonl",
                                 "--reward", "exact", "--out", tmp_path / "out", *QUICK)
    assert status == 2 and stderr == "minitransformer: error: grpo runs in one process: " \
        "torchrun is not supported\n" and stdout == ""
    assert not (tmp_path / "out").exists()


def test_the_reward_gets_what_trl_s_grpo_trainer_gives_it(gpt_base):
    """The same reward function, given the same rows and completion ids, is called with the
    same arguments by the command and by TRL's GRPOTrainer._calculate_rewards (TRL's own
    trainer_state, log_extra and log_metric aside), the completions decoded by transformers'
    tokenizer; and gets the same rewards, None as NaN."""
    from types import SimpleNamespace

    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    PartialState(cpu=True)      # TRL's logger warns of the None row through accelerate

    tokenizer = BPETokenizer.from_pretrained(gpt_base)
    end = tokenizer.special_tokens[END_OF_TURN]
    rows, group = [chat_row(0), chat_row(1)], 3
    completion_ids = [tokenizer.encode(text) + [end] * (n % 2) for n, text in enumerate(
        [" cat", " the dog sat", " bird", "", " a fish and", " owl"])]
    calls = []

    def spy(**kwargs):
        calls.append(kwargs)
        return [None if n == 1 else float(n) for n in range(len(kwargs["completions"]))]

    ours = grpo_command.trl_reward([spy], rows, tokenizer, group)(completion_ids)
    inputs = [dict(row) for row in rows for _ in range(group)]
    texts = AutoTokenizer.from_pretrained(gpt_base).batch_decode(completion_ids,
                                                                 skip_special_tokens=True)
    stub = SimpleNamespace(
        accelerator=SimpleNamespace(device="cpu", is_main_process=True), reward_funcs=[spy],
        reward_processing_classes=[None], reward_func_names=["spy"], environments=None,
        state=SimpleNamespace(global_step=0), args=SimpleNamespace(report_to=[]),
        _log_completion_extra=None, _log_metric=None)
    theirs = GRPOTrainer._calculate_rewards(
        stub, inputs, [row["prompt"] for row in inputs],
        [[{"role": "assistant", "content": text}] for text in texts], completion_ids)
    mine, trl_kwargs = calls
    for key in ("trainer_state", "log_extra", "log_metric"):
        del trl_kwargs[key]
    assert mine == trl_kwargs
    assert [None if v != v else v for v in theirs[:, 0].tolist()] == ours


@pytest.mark.parametrize("values", ["torch.arange(len(completions)) % 2",
                                    "numpy.arange(len(completions)) % 3",
                                    "tuple(range(len(completions)))"])
def test_a_reward_may_return_an_array_or_a_tuple_as_trl_takes(values, gpt_base, data, in_tmp):
    module = "returns_" + values.split(".")[0].split("(")[0]
    (in_tmp / f"{module}.py").write_text(f"import numpy\nimport torch\n\n\n"
                                         f"def f(completions, **kwargs):\n"
                                         f"    return {values}\n", "utf-8")
    status, stdout, stderr = run("grpo", "--model", gpt_base, "--data", data / "plain.jsonl",
                                 "--reward", f"{module}:f", "--out", in_tmp / "out", *QUICK,
                                 "--steps", "1")
    assert status == 0, stderr
    assert "groups with signal 1.00" in stdout


def test_replies_no_reward_can_score_move_nothing(gpt_base, data, in_tmp):
    """Every reply unscored (None, as TRL allows): the rounds carry no signal, the reward is
    n/a, and the weights stay the model's."""
    (in_tmp / "nothing_scored.py").write_text("def f(completions, **kwargs):\n"
                                              "    return [None] * len(completions)\n", "utf-8")
    out = in_tmp / "out"
    status, stdout, stderr = run("grpo", "--model", gpt_base, "--data", data / "plain.jsonl",
                                 "--reward", "nothing_scored:f", "--out", out, *QUICK,
                                 "--steps", "2")
    assert status == 0, stderr
    assert "round 1: reward n/a, groups with signal 0.00" in stdout
    assert "12 replies unscored" in stdout
    assert equal(tensors(out / "model.safetensors"), tensors(gpt_base / "model.safetensors"))
