"""Test-wide settings: Hypothesis's profiles, and the devices a test runs on.

Hypothesis draws new random examples on every run by default. In CI (CI=true) the examples are
derandomized, so a run's verdict depends only on the code; run locally without CI to keep exploring.
"""

import ctypes
import gc
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# The tuning commands' base models and a model without chat tokens (test_cli_finetune, _dpo,
# _grpo), trained on the requesting module's `data` fixture: fixtures of every module.
from cli_helpers import base_flags, gpt_base, llama_base, plain_model  # noqa: F401
from helpers import file_order

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
# A long search for counterexamples, by hand: pytest --hypothesis-profile=thorough
settings.register_profile("thorough", max_examples=2000, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


# --- devices --------------------------------------------------------------------------------------
# A test that takes the `device` fixture runs once per device this machine has: on the CPU always,
# and on CUDA as well when PyTorch sees a GPU. On a CPU-only machine the suite therefore collects
# exactly the tests it always did, each with a "[cpu]" suffix. MINITRANSFORMER_TEST_DEVICES (for
# example "cuda" or "cpu,cuda") chooses the devices by hand; `make test-gpu` uses it.

# cuBLAS needs this set before its first call to be deterministic; harmless on the CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

TEST_DEVICES_VAR = "MINITRANSFORMER_TEST_DEVICES"


def available_devices() -> list[str]:
    """The devices the `device` fixture runs on, as strings ("cpu", "cuda")."""
    chosen = os.environ.get(TEST_DEVICES_VAR, "").strip()
    if chosen:
        return [name.strip() for name in chosen.split(",") if name.strip()]
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(params=available_devices())
def device(request) -> torch.device:
    """The device a test runs on.

    On CUDA, for the test's duration: TF32 matmuls off (the tests compare with references at
    float32's tolerances, which TF32's 10-bit mantissa would miss), and attention through
    scaled_dot_product_attention's math kernel, which computes what the CPU computes (the fused
    flash and memory-efficient kernels reorder the sums, so two paths the tests hold bit-for-bit
    equal could differ in the last bit)."""
    device = torch.device(request.param)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"{TEST_DEVICES_VAR} asks for {request.param!r} but PyTorch sees no GPU")
    if device.type != "cuda":
        yield device
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield device
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# --- the order of the test files ------------------------------------------------------------------
# `make test` runs two pytest-xdist workers with --dist loadscope --no-loadscope-reorder: each file
# goes whole to one worker (a notebook's cells share one kernel), in the order collected:
# helpers.file_order's, longest first from the seconds per file in tests/durations.json
# (tools/test_durations.py writes it), which keeps the two workers busy to the end. The built
# book's pages come once the book is likely built: `make test` builds it beside the tests, and
# those wait for it (helpers.wait_for_book).
DURATIONS = Path(__file__).resolve().parent / "durations.json"


def pytest_collection_modifyitems(session, config, items):
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    rank = {name: i for i, name in enumerate(file_order(files, seconds))}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file keeps its order


# --- memory, given back after a file that took much -----------------------------------------------
# A worker runs many files in one process. The TRL comparisons on SmolLM2 in float64 left a worker
# at 15.6 GB of memory (11.4 GB of it in reference cycles that only a collection frees, the rest
# kept by the C allocator), and the files after them ran up to three times slower on this 23 GB
# machine (the kill tests: 80 s against 23 s). After a file that leaves the worker above
# GIVE_BACK_ABOVE_MB, the cycles are collected and the allocator gives its free memory back to
# the system (1.2 GB left after those tests).
GIVE_BACK_ABOVE_MB = 3000


def _resident_mb() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0                                  # not Linux: nothing measured, nothing done


@pytest.fixture(scope="module", autouse=True)
def _give_memory_back():
    yield
    if _resident_mb() > GIVE_BACK_ABOVE_MB:
        gc.collect()
        if sys.platform.startswith("linux"):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
