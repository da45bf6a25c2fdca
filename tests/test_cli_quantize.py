"""``python -m minitransformer quantize MODEL --to TYPE --out FILE.gguf`` (chapter 19): a model
directory or a GGUF file written as gguf.save_llama writes it, with its tokenizer; every
mistake one line on stderr and exit 2, an existing file kept, nothing half written."""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import perturbed, run  # noqa: E402
from minitransformer import GPT, GPTConfig  # noqa: E402
from minitransformer.bpe import SMOLLM_PATTERN, BPETokenizer  # noqa: E402
from minitransformer.gguf import GGUFFile, save_llama  # noqa: E402
from minitransformer.llama import Llama, LlamaConfig  # noqa: E402

TEXT = "Small words for a small tokenizer, 12 and 345, and more small words. " * 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Llama model directory with its tokenizer, as train --arch llama writes one."""
    path = tmp_path_factory.mktemp("quantize") / "tiny-llama"
    torch.manual_seed(0)
    model = perturbed(Llama(LlamaConfig(vocab_size=300, context_length=32, num_layers=2,
                                        num_heads=4, num_kv_heads=2, d_model=64, d_ff=96)))
    model.save_pretrained(path)
    tokenizer = BPETokenizer.train(TEXT, 300, pattern=SMOLLM_PATTERN)
    tokenizer.save_pretrained(path)
    return path, model, BPETokenizer.from_pretrained(path)


@pytest.mark.parametrize("to", ["q4_1", "Q8_0", "f16"])
def test_a_directory_is_written_as_save_llama_writes_it(tmp_path, folder, to):
    path, model, tokenizer = folder
    status, stdout, stderr = run("quantize", path, "--to", to, "--out", tmp_path / "m.gguf")
    assert status == 0, stderr
    assert stdout.startswith(f"wrote {tmp_path / 'm.gguf'}: {to.upper()}, 21 tensors, with its "
                             f"tokenizer")
    save_llama(model, tmp_path / "ref.gguf", type=to.upper(), tokenizer=tokenizer,
               metadata={"general.name": "tiny-llama"})
    assert (tmp_path / "m.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    assert BPETokenizer.from_gguf(tmp_path / "m.gguf") == tokenizer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "ref.gguf"]


def test_a_gguf_file_is_requantised_keeping_its_names(tmp_path, folder):
    path, model, tokenizer = folder
    save_llama(model, tmp_path / "q8.gguf", type="Q8_0", tokenizer=tokenizer,
               metadata={"general.name": "tiny", "general.license": "apache-2.0"})
    status, stdout, stderr = run("quantize", tmp_path / "q8.gguf", "--to", "q4_0", "--out",
                                 tmp_path / "q4.gguf")
    assert status == 0, stderr
    written = GGUFFile(tmp_path / "q4.gguf")
    assert written.metadata["general.name"] == "tiny"
    assert written.metadata["general.license"] == "apache-2.0"
    assert written.metadata["general.file_type"] == 2
    assert {t.type for t in written.tensors.values()} == {"Q4_0", "F32"}
    # Q4_0 of the numbers the Q8_0 file stores
    save_llama(Llama.from_gguf(tmp_path / "q8.gguf"), tmp_path / "ref.gguf", type="Q4_0",
               tokenizer=tokenizer, metadata={"general.name": "tiny",
                                              "general.license": "apache-2.0"})
    assert (tmp_path / "q4.gguf").read_bytes() == (tmp_path / "ref.gguf").read_bytes()


def test_mistakes_are_one_line_and_nothing_is_written(tmp_path, folder):
    path, _, _ = folder
    out = tmp_path / "out.gguf"
    gpt = tmp_path / "gpt"
    GPT(GPTConfig(vocab_size=13, context_length=8, num_layers=1, num_heads=2,
                  d_model=16)).save_pretrained(gpt)
    narrow = tmp_path / "narrow"
    Llama(LlamaConfig(vocab_size=13, context_length=8, num_layers=1, num_heads=2,
                      d_model=16)).save_pretrained(narrow)
    (tmp_path / "text.txt").write_text("not a model")
    cases = [
        ((path, "--to", "q4_k", "--out", out), "invalid choice: 'q4_k'"),
        ((path, "--out", out), "the following arguments are required: --to"),
        ((tmp_path / "nothing", "--to", "q8_0", "--out", out), "no such file or directory"),
        ((tmp_path / "text.txt", "--to", "q8_0", "--out", out), "is not a GGUF file"),
        ((gpt, "--to", "q8_0", "--out", out), "holds a 'gpt2' model; quantize writes Llamas"),
        ((tmp_path, "--to", "q8_0", "--out", out), "has no config.json"),
        ((narrow, "--to", "q8_0", "--out", out), "token_embd.weight.*multiple of 32"),
        ((path, "--to", "q8_0", "--out", tmp_path / "no" / "x.gguf"), "no directory"),
    ]
    for argv, message in cases:
        status, stdout, stderr = run("quantize", *argv)
        assert status == 2 and stderr.count("\n") == 1, (argv, stderr)
        assert stderr.startswith("minitransformer") and "Traceback" not in stderr
        assert re.search(message, stderr), (message, stderr)
        assert not out.exists() and not list(tmp_path.glob("*.partial"))
    out.write_bytes(b"mine")
    status, _, stderr = run("quantize", path, "--to", "q8_0", "--out", out)
    assert status == 2 and "exists already: it is kept" in stderr
    assert out.read_bytes() == b"mine"
