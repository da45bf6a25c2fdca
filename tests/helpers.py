"""What many test modules share: one thread per module, running the command line in-process,
parameters moved off their initial values, and tiny models. (pytest puts this folder on
``sys.path``: ``from helpers import one_thread, run``. A fixture imported into a module is that
module's fixture.)"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, pretrained


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The module runs on one thread, and gives the thread count back after: tiny models run
    fastest so, a busy machine cannot slow them by making two threads wait for each other, and
    runs compare bit for bit with subprocesses started with OMP_NUM_THREADS=1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(*argv) -> tuple[int, str, str]:
    """``python -m minitransformer ARGV`` in this process: its exit status, stdout, stderr."""
    from minitransformer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter moved off its initial value, in eval mode: norms start at 1 and biases
    at 0, so a norm or bias mapped to the wrong tensor would pass unperturbed. Draws from its
    own generator, not PyTorch's global one."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model.eval()


TINY_GPT = dict(vocab_size=13, context_length=40, num_layers=2, num_heads=2, d_model=16)
TINY_LLAMA = dict(vocab_size=13, context_length=40, num_layers=2, num_heads=4, num_kv_heads=2,
                  d_model=16)


def tiny_gpt(*, seed: int = 0, dtype: torch.dtype | None = None, **changes) -> GPT:
    """A GPT of :data:`TINY_GPT`'s sizes (``changes`` replace them), drawn after
    ``torch.manual_seed(seed)``, in eval mode."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(**TINY_GPT | changes), dtype=dtype).eval()


def tiny_llama(*, seed: int = 0, dtype: torch.dtype | None = None, **changes) -> Llama:
    """A Llama of :data:`TINY_LLAMA`'s sizes (grouped-query attention; ``changes`` replace
    them), drawn after ``torch.manual_seed(seed)``, in eval mode."""
    torch.manual_seed(seed)
    return Llama(LlamaConfig(**TINY_LLAMA | changes), dtype=dtype).eval()


# --- SmolLM2 as transformers reads it, once per machine ----------------------------------------
# Reading the GGUF file, transformers parses its 49,152-token vocabulary in Python (about 4 s of
# CPU for the tokenizer) and dequantises 135M numbers in numpy (about 17 s for the model, 90 s on
# a loaded machine). Several modules compare against them, in both pytest-xdist workers and in
# every run. So what transformers read from the file is kept, as transformers writes a model
# directory, beside the file in the cache (keyed by the file's SHA-256 and transformers' version),
# and later processes load that directory: the same numbers, as transformers read them from the
# file. The first process writes it (to a folder of its own, renamed into place when complete, so
# that a process killed half way leaves nothing half done); later ones only read it.

def _transformers_reference() -> Path:
    import transformers

    return pretrained.cache_folder() / (f"reference-transformers-{transformers.__version__}-"
                                        f"{pretrained.SMOLLM2_SHA256[:16]}")


def _kept(name: str, read, write):
    """What transformers read from the file, loaded from the reference folder ``name``
    (``read(folder)``). When the folder is missing, it is read from the file first
    (``read(None)``) and written there (``write(thing, folder)``), into a fresh folder renamed
    into place. If another process renamed its folder first, that one stays (it holds the same)
    and ours is removed."""
    import shutil
    import tempfile

    final = _transformers_reference() / name
    if final.is_dir():
        return read(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=final.parent))
    try:
        write(read(None), partial)
        os.rename(partial, final)
    except OSError:
        pass
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return read(final)     # the same in every process, the first one too


def _read_tokenizer(folder: Path | None):
    from transformers import AutoTokenizer

    if folder is not None:
        return AutoTokenizer.from_pretrained(folder)
    path = pretrained.smollm2_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _read_model(folder: Path | None):
    from transformers import AutoModelForCausalLM

    if folder is not None:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    path = pretrained.smollm2_path()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()


def _write_model(model, folder: Path) -> None:
    """transformers refuses to save a model it read from GGUF ("quantized with gguf"), so the
    weights go in with safetensors and the configuration without its GGUF entry. Read back, it is
    a plain model (which TRL's trainers accept) holding the same float32 numbers."""
    import json

    from safetensors.torch import save_model

    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


@functools.cache
def _smollm2_transformers_tokenizer():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network
    return _kept("tokenizer", _read_tokenizer,
                 lambda tokenizer, folder: tokenizer.save_pretrained(folder))


def smollm2_transformers_tokenizer():
    """transformers' tokenizer read from SmolLM2's GGUF file: a copy of the one loaded once
    per process, for the caller to change as it likes (a chat template, ...)."""
    return copy.deepcopy(_smollm2_transformers_tokenizer())


@functools.cache
def smollm2_transformers_model():
    """transformers' model read from SmolLM2's GGUF file (float32, eval mode), loaded once per
    process and shared: never change it (copy its config before changing that)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network
    return _kept("model", _read_model, _write_model)


# --- the experiments' scripts, as modules -----------------------------------------------------

def experiment_module(name: str):
    """``experiments/<name>.py`` imported as a module (the folder is on ``sys.path`` only
    while it is imported, as the scripts import their shared helpers from beside them)."""
    import importlib
    import sys

    folder = str(Path(__file__).resolve().parent.parent / "experiments")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


# --- the order of the files, and the book built beside the tests ------------------------------
# The tests of the built pages, which wait for `make test`'s book build, and how many seconds of
# the other files' work come before them: the build takes about 3 minutes beside the tests, and
# 600 s of work on two workers about 5.
BOOK_PAGE_TESTS = ("tests/test_book_pages.py", "tests/test_api_page.py")
BOOK_PAGES_AFTER = 600.0


def file_order(files: list[str], seconds: dict[str, float]) -> list[str]:
    """The order in which the run hands out its test ``files`` (tests/conftest.py): longest
    first, by their measured ``seconds`` (one second when a file is not in the table), so that
    no worker is left with a long file at the end while the other waits; the built pages'
    tests once :data:`BOOK_PAGES_AFTER` seconds of the others' work are handed out."""
    longest = sorted((f for f in files if f not in BOOK_PAGE_TESTS),
                     key=lambda f: -seconds.get(f, 1.0))
    at, work = len(longest), 0.0
    for i, name in enumerate(longest):
        if work >= BOOK_PAGES_AFTER:
            at = i
            break
        work += seconds.get(name, 1.0)
    return longest[:at] + [f for f in files if f in BOOK_PAGE_TESTS] + longest[at:]


# `make test` builds the book in a process of its own while the tests run, and writes the build's
# exit status to the file this variable names once it is done (Makefile). The tests of the built
# pages run last (tests/conftest.py orders the files) and wait for it.
BOOK_STATUS_VAR = "MINITRANSFORMER_BOOK_STATUS"


def wait_for_book(*, timeout: float = 1800.0) -> None:
    """Wait for `make test`'s book build, when one is running; fail the test if it failed. Without
    MINITRANSFORMER_BOOK_STATUS (pytest run by hand) there is nothing to wait for."""
    status = os.environ.get(BOOK_STATUS_VAR)
    if not status:
        return
    path, deadline = Path(status), time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the book build wrote no status to {path} in {timeout:.0f} s")
        time.sleep(1)
    code = path.read_text(encoding="utf-8").strip()
    if code != "0":
        pytest.fail(f"the book build failed (exit status {code}): its log is _build/book.log")
