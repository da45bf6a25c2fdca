"""``chat`` and ``generate`` with a llama.cpp GGUF file (issue 41): ``--model FILE.gguf``, and
with no ``--model`` the SmolLM2-135M-Instruct file in the cache, so ``python -m
minitransformer chat`` is an assistant. The replies are the package's own greedy tokens
(Llama.from_gguf, the model's chat template, generate), cut at its end-of-turn token. The file
comes from ``python -m minitransformer download smollm2`` (or ``make``); without it these tests
fail, they are not skipped."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from cli_helpers import one_thread, run  # noqa: F401  (one_thread: autouse, one thread)

from minitransformer import pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import apply_chat_template, stop_token_ids
from minitransformer.generation import generate
from minitransformer.llama import Llama


@pytest.fixture(scope="module")
def smollm2():
    path = pretrained.smollm2_path()
    return path, Llama.from_gguf(path), BPETokenizer.from_gguf(path)


def chat(monkeypatch, text: str, *flags) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    return run("chat", "--device", "cpu", *flags)


def test_chat_with_no_model_is_smollm2_answering_as_the_package_does(smollm2, monkeypatch):
    _, model, tokenizer = smollm2
    turns = ["What is the capital of France?", "And of Germany?"]
    status, stdout, stderr = chat(monkeypatch, "".join(t + "\n" for t in turns),
                                  "--temperature", "0", "--max-new-tokens", "24")
    assert status == 0, stderr
    stops = stop_token_ids(tokenizer)
    assert stops[0] == tokenizer.special_tokens["<|im_end|>"]
    messages, expected = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        ids = apply_chat_template(tokenizer, messages, add_generation_prompt=True)
        new = generate(model, torch.tensor([ids]), 24, temperature=0.0)[0, len(ids):].tolist()
        cut = next((k for k, t in enumerate(new) if t in stops), len(new))
        assert cut < 24                                   # it stopped at <|im_end|>
        expected.append(tokenizer.decode(new[:cut]))
        messages.append({"role": "assistant", "content": expected[-1]})
    assert stdout == "".join(reply + "\n" for reply in expected)
    assert "Paris" in expected[0] and "Berlin" in expected[1]


def test_generate_takes_the_gguf_file_and_the_default_alike(smollm2):
    path, model, tokenizer = smollm2
    prompt = "The three primary colors are"
    argv = ["generate", "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0",
            "--device", "cpu"]
    status, stdout, stderr = run(*argv, "--model", path)
    assert status == 0, stderr
    ids = tokenizer.encode(prompt)
    expected = generate(model, torch.tensor([ids]), 8, temperature=0.0)[0].tolist()
    assert stdout == tokenizer.decode(expected) + "\n"
    assert run(*argv) == (0, stdout, "")


def test_without_the_file_the_refusal_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path))
    for argv in (["chat"], ["generate", "--prompt", "a"]):
        status, stdout, stderr = run(*argv)
        assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
        assert "no --model given, and the default model is not here" in stderr
        assert "python -m minitransformer download smollm2" in stderr


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF" + bytes(20))
    status, stdout, stderr = run("generate", "--model", fake, "--prompt", "a")
    assert status == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"minitransformer: error: --model {fake}: ")
