"""``--dtype int8`` of ``chat``, ``generate`` and ``serve`` (issue 44, chapter 19): the model's
linear layers as int8 weights (``quantize_linears``), on a small course model and on
SmolLM2-135M-Instruct (its GGUF file from ``python -m minitransformer download smollm2``;
without it these tests fail, they are not skipped). Each command writes what the package's own
``generate`` writes with the same int8 model; against float32, SmolLM2's greedy tokens agree
wherever float32's two best logits are further apart than int8 moved them; and the bad
combinations are refused in one line."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch
from cli_helpers import one_thread, run  # noqa: F401  (one_thread: autouse, one thread)
from test_cli_serve import Served
from test_server import build_model_dir

from minitransformer import GPT, pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import apply_chat_template, stop_token_ids
from minitransformer.cli import common
from minitransformer.generation import generate
from minitransformer.llama import Llama
from minitransformer.quantize import Int4Linear, Int8Linear, quantize_linears


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("int8-cli"))


@pytest.fixture(scope="module")
def smollm2():
    path = pretrained.smollm2_path()
    return path, BPETokenizer.from_gguf(path)


def greedy(model, ids: list[int], n: int, stops=()) -> list[int]:
    new = generate(model.eval(), torch.tensor([ids]), n, temperature=0.0)[0, len(ids):]
    new = new.tolist()
    return new[:next((k for k, t in enumerate(new) if t in stops), len(new))]


@pytest.mark.parametrize("command", ["chat", "generate", "serve"])
def test_the_three_commands_take_dtype_float32_by_default(command):
    status, stdout, _ = run(command, "--help")
    assert status == 0 and "--dtype {float32,int8,int4}" in stdout
    from minitransformer.cli import build_parser
    argv = {"generate": ["--prompt", "a"]}.get(command, [])
    assert build_parser().parse_args([command, *argv]).dtype == "float32"


def test_load_model_quantizes_every_linear_layer(model_dir):
    model, _ = common.load_model(str(model_dir), torch.device("cpu"), dtype="int8")
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 2 * 6 + 1


def test_load_model_in_int4_keeps_a_tied_head_in_int8(model_dir):
    model, _ = common.load_model(str(model_dir), torch.device("cpu"), dtype="int4")
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 2 * 6
    assert isinstance(model.head, Int8Linear)             # tied to the token embedding


def test_smollm2_in_int4_through_generate(smollm2):
    """int4 holds SmolLM2's 210 Q4_1 matrices exactly (the head, Q8_0, is int8), and generate
    in int4 writes what the int4 model generates."""
    path, tokenizer = smollm2
    model = quantize_linears(Llama.from_gguf(path), bits=4)
    f32 = dict(Llama.from_gguf(path).named_modules())
    int4 = {name: m for name, m in model.named_modules() if isinstance(m, Int4Linear)}
    assert len(int4) == 210 and isinstance(model.head, Int8Linear)
    assert all(torch.equal(m.dequantized(), f32[name].weight) for name, m in int4.items())
    prompt = "The three primary colors are"
    status, stdout, stderr = run("generate", "--prompt", prompt, "--max-new-tokens", "8",
                                 "--temperature", "0", "--device", "cpu", "--dtype", "int4")
    assert status == 0, stderr
    ids = tokenizer.encode(prompt)
    assert stdout == tokenizer.decode(ids + greedy(model, ids, 8)) + "\n"


def test_generate_and_chat_in_int8_write_what_the_int8_model_generates(model_dir, monkeypatch):
    tokenizer = BPETokenizer.from_pretrained(model_dir)
    model = quantize_linears(GPT.from_pretrained(model_dir))
    prompt = "Once upon"
    status, stdout, stderr = run("generate", "--model", model_dir, "--prompt", prompt,
                                 "--temperature", "0", "--max-new-tokens", "12",
                                 "--device", "cpu", "--dtype", "int8")
    assert status == 0, stderr
    ids = tokenizer.encode(prompt)
    assert stdout == tokenizer.decode(ids + greedy(model, ids, 12)) + "\n"

    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello there\n"))
    status, stdout, stderr = run("chat", "--model", model_dir, "--temperature", "0",
                                 "--max-new-tokens", "10", "--device", "cpu", "--dtype", "int8")
    assert status == 0, stderr
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "Hello there"}],
                              add_generation_prompt=True)
    stops = set(stop_token_ids(tokenizer))
    assert stdout == tokenizer.decode(greedy(model, ids, 10, stops)) + "\n"


def test_serve_in_int8_answers_as_generate_in_int8(model_dir):
    status, expected, stderr = run("generate", "--model", model_dir, "--prompt", "Once upon",
                                   "--temperature", "0", "--max-new-tokens", "9",
                                   "--device", "cpu", "--dtype", "int8")
    assert status == 0, stderr
    served = Served(model_dir, "--dtype", "int8")
    try:
        answer = served.client.completions.create(model=model_dir.name, prompt="Once upon",
                                                  max_tokens=9, temperature=0)
        assert "Once upon" + answer.choices[0].text + "\n" == expected
        status, err = served.stop()
        assert status == 0, err
    finally:
        served.close()


def test_smollm2_in_int8_through_generate_and_chat(smollm2, monkeypatch):
    path, tokenizer = smollm2
    model = quantize_linears(Llama.from_gguf(path))
    prompt = "The three primary colors are"
    status, stdout, stderr = run("generate", "--prompt", prompt, "--max-new-tokens", "8",
                                 "--temperature", "0", "--device", "cpu", "--dtype", "int8")
    assert status == 0, stderr
    ids = tokenizer.encode(prompt)
    assert stdout == tokenizer.decode(ids + greedy(model, ids, 8)) + "\n"

    monkeypatch.setattr(sys, "stdin", io.StringIO("What is the capital of France?\n"))
    status, stdout, stderr = run("chat", "--model", path, "--temperature", "0",
                                 "--max-new-tokens", "12", "--device", "cpu", "--dtype", "int8")
    assert status == 0, stderr
    ids = apply_chat_template(tokenizer, [{"role": "user",
                                           "content": "What is the capital of France?"}],
                              add_generation_prompt=True)
    reply = tokenizer.decode(greedy(model, ids, 12, set(stop_token_ids(tokenizer))))
    assert stdout == reply + "\n" and "Paris" in reply


def test_smollm2_int8_picks_float32_s_tokens_but_near_ties(smollm2):
    """Float32's greedy continuation (32 tokens) fed to both models: int8 moves the logits by
    under 10% of the largest (``benchmarks/int8_decode.py`` measured 4-6% on five prompts),
    picks float32's best token at 30 or more of the 32 positions (307 of 320 on the five), and
    differs only where float32's two best logits were within 0.5 (0.41 at most measured)."""
    path, tokenizer = smollm2
    f32 = Llama.from_gguf(path).eval()
    int8 = quantize_linears(Llama.from_gguf(path)).eval()
    ids = apply_chat_template(tokenizer, [{"role": "user",
                                           "content": "How many legs does a spider have?"}],
                              add_generation_prompt=True)
    with torch.no_grad():
        whole = generate(f32, torch.tensor([ids]), 32, temperature=0.0)
        a, b = f32(whole)[0][0, len(ids) - 1:-1], int8(whole)[0][0, len(ids) - 1:-1]  # (32, N)
    assert float((b - a).abs().max() / a.abs().max()) < 0.10
    same = a.argmax(-1) == b.argmax(-1)
    top = a.topk(2, dim=-1).values
    assert int(same.sum()) >= 30, int(same.sum())
    assert bool(((top[:, 0] - top[:, 1])[~same] < 0.5).all())


def test_bad_combinations_are_refused_in_one_line(model_dir, tmp_path, monkeypatch, capsys):
    def refused(*argv) -> str:
        status, stdout, stderr = run(*argv)
        assert status == 2 and stdout == "" and len(stderr.splitlines()) == 1, stderr
        assert "Traceback" not in stderr
        return stderr

    assert "int2" in refused("generate", "--model", model_dir, "--prompt", "a",
                             "--dtype", "int2")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"base_model_name_or_path": str(model_dir)}))
    for command in (["generate", "--prompt", "a"], ["chat"]):
        assert "merge it first" in refused(*command, "--model", adapter, "--device", "cpu",
                                           "--dtype", "int8")
    assert "--lora" in refused("serve", "--model", model_dir, "--lora", f"x={adapter}",
                               "--dtype", "int8", "--port", "0")
    with pytest.raises(common.CommandLineError, match="CPU only.*--device cpu"):
        common.load_model(str(model_dir), torch.device("cuda"), dtype="int8")
    import minitransformer.cli.generate as generate_module
    import minitransformer.cli.serve as serve_module
    for module in (generate_module, serve_module):
        monkeypatch.setattr(module, "device", lambda name: torch.device("cuda"))
    assert "CPU only" in refused("generate", "--model", model_dir, "--prompt", "a",
                                 "--dtype", "int8")
    assert "CPU only" in refused("serve", "--model", model_dir, "--port", "0",
                                 "--dtype", "int8")
