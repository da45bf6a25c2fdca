"""Where tensors live: the CPU, or a GPU when there is one.

Chapters 1-7 call :func:`default_device` once and create their tensors there; chapters 8-12 train
and time their models on one CPU thread, so that training repeats exactly. The package itself never
hard-codes a device and creates new tensors on the device of their inputs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from minitransformer import _checks

ENV_VAR = "MINITRANSFORMER_DEVICE"


def default_device() -> torch.device:
    """Return the device the course runs on.

    CUDA when PyTorch sees a GPU, otherwise the CPU. The environment variable
    ``MINITRANSFORMER_DEVICE`` (for example ``cpu`` or ``cuda:1``) overrides the choice.

    Raises:
        ValueError: the variable names something PyTorch does not recognise as a device, or a
            device this machine does not have (``mps`` off a Mac, ``cuda`` without a GPU).
    """
    name = os.environ.get(ENV_VAR, "").strip()
    if name:
        try:
            return _checks.check_device(name, name=ENV_VAR)
        except ValueError as exc:
            raise ValueError(str(exc).replace(f"{ENV_VAR} {name!r}", f"{ENV_VAR}={name!r}", 1)) \
                from None
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def deterministic_kernels(device: torch.device | str) -> Iterator[None]:
    """Within the block, on CUDA, kernels that repeat bit for bit, so that training repeats and
    a resumed run equals the run never stopped (chapter 15). On a GPU, embedding's backward
    adds with atomics in an order that changes from run to run, and so does the backward of
    ``scaled_dot_product_attention``'s fused memory-efficient kernel: this turns on PyTorch's
    deterministic algorithms (an operation without one warns) and runs attention through its
    math kernel (what the CPU computes), and sets ``CUBLAS_WORKSPACE_CONFIG`` to ``:4096:8``
    where it is unset, as cuBLAS's deterministic mode asks. The previous settings come back
    afterwards. On the CPU nothing changes: its kernels already repeat."""
    if torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
