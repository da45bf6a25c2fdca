"""``python -m minitransformer convert DIR``: pytorch_model.bin -> model.safetensors (issue 29),
read with torch.load(weights_only=True), tied tensors stored once, the .bin kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minitransformer import GPT  # noqa: E402
from helpers import run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def gpt2_bin(tmp_path) -> tuple[Path, object]:
    """A tiny GPT-2 of transformers', its weights as the pickle older transformers wrote
    (torch.save of the state dict: lm_head.weight and transformer.wte.weight one tensor).
    transformers 5's save_pretrained writes safetensors only."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    torch.save(state, tmp_path / "pytorch_model.bin")
    return tmp_path, model


def test_convert_writes_safetensors_that_both_libraries_load_with_equal_logits(gpt2_bin):
    transformers = pytest.importorskip("transformers")
    folder, theirs = gpt2_bin
    before = (folder / "pytorch_model.bin").read_bytes()
    status, stdout, stderr = run("convert", folder)
    assert status == 0, stderr
    assert "lm_head.weight stored once with transformer.wte.weight" in stdout
    assert (folder / "pytorch_model.bin").read_bytes() == before          # kept, unchanged
    from safetensors.torch import load_file
    stored = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in stored and "transformer.wte.weight" in stored
    idx = torch.tensor([[1, 5, 7, 3, 9]])
    with torch.no_grad():
        expected = theirs(idx).logits
        again = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        torch.testing.assert_close(again(idx).logits, expected, rtol=0, atol=0)
        torch.testing.assert_close(GPT.from_pretrained(folder)(idx)[0], expected,
                                   rtol=1e-5, atol=1e-5)
    status, _, stderr = run("convert", folder)       # never overwrites
    assert status == 2 and "exists already" in stderr and stderr.count("\n") == 1


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("content, words", [
    ({"w": torch.ones(2), "note": "a string"}, "holds 'note': a str, not a tensor"),
    ([torch.ones(2)], "holds a list, not a state dict"),
    (Payload(), "cannot be read with torch.load(weights_only=True)"),
    (None, "no pytorch_model.bin"),
])
def test_what_convert_refuses_is_one_line(tmp_path, content, words):
    if content is not None:
        torch.save(content, tmp_path / "pytorch_model.bin")
    status, stdout, stderr = run("convert", tmp_path)
    assert status == 2 and stderr.count("\n") == 1 and words in stderr, stderr
    assert "pwned" not in stdout and not (tmp_path / "model.safetensors").exists()


def write_damaged(path: Path, kind: str) -> None:
    """A pytorch_model.bin that torch.load(weights_only=True) cannot read, or reads into what
    safetensors cannot store (each was a traceback, or torch's warning, before issue 40)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # torch warns of CSR tensors when saving
        if kind == "sparse_csr":
            torch.save({"w": torch.eye(3).to_sparse_csr()}, path)
        elif kind == "sparse_coo":
            torch.save({"w": torch.eye(3).to_sparse()}, path)
        elif kind == "nested":
            torch.save({"w": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, path)
        elif kind == "legacy storage":
            torch.save({"w": torch.ones(2).untyped_storage()}, path,
                       _use_new_zipfile_serialization=False)
        elif kind == "truncated":
            torch.save({"w": torch.ones(2000)}, path)
            path.write_bytes(path.read_bytes()[:4000])
        else:
            path.write_bytes(b"")


@pytest.mark.parametrize("kind, words", [
    ("sparse_csr", "holds 'w': a sparse_csr tensor; safetensors stores dense tensors only"),
    ("sparse_coo", "holds 'w': a sparse_coo tensor"),
    ("nested", "holds 'w': a nested tensor"),
    ("legacy storage", "cannot be read with torch.load(weights_only=True)"),
    ("truncated", "cannot be read with torch.load(weights_only=True)"),
    ("empty", "cannot be read with torch.load(weights_only=True), which runs no code from the "
              "file: EOFError"),
])
def test_a_damaged_or_unstorable_file_is_one_line(tmp_path, kind, words):
    write_damaged(tmp_path / "pytorch_model.bin", kind)
    status, stdout, stderr = run("convert", tmp_path)
    assert status == 2 and stderr.count("\n") == 1 and words in stderr, stderr
    assert "\x1b" not in stderr and not (tmp_path / "model.safetensors").exists()


def test_torchs_warning_is_not_printed_before_the_refusal(tmp_path):
    """Loading a CSR tensor makes torch warn ("Sparse CSR tensor support is in beta state"),
    two lines on stderr before the refusal: silenced, even where warnings are always shown."""
    write_damaged(tmp_path / "pytorch_model.bin", "sparse_csr")
    result = subprocess.run([sys.executable, "-m", "minitransformer", "convert", str(tmp_path)],
                            capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT),
                                 "PYTHONWARNINGS": "always", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Warning" not in result.stderr, result.stderr
    assert result.stderr.startswith("minitransformer: error: ")


def test_convert_runs_as_a_program(gpt2_bin):
    folder, _ = gpt2_bin
    result = subprocess.run([sys.executable, "-m", "minitransformer", "convert", str(folder)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "model.safetensors" in result.stdout, result.stderr
