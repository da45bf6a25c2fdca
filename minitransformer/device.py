"""Where tensors live: the CPU, or a GPU when there is one.

Chapters 1-7 call :func:`default_device` once and create their tensors there; chapters 8-12 train
and time their models on one CPU thread, so that training repeats exactly. The package itself never
hard-codes a device and creates new tensors on the device of their inputs.
"""

from __future__ import annotations

import os

import torch

ENV_VAR = "MINITRANSFORMER_DEVICE"


def default_device() -> torch.device:
    """Return the device the course runs on.

    CUDA when PyTorch sees a GPU, otherwise the CPU. The environment variable
    ``MINITRANSFORMER_DEVICE`` (for example ``cpu`` or ``cuda:1``) overrides the choice.

    Raises:
        ValueError: the variable names something PyTorch does not recognise as a device.
    """
    name = os.environ.get(ENV_VAR, "").strip()
    if name:
        try:
            return torch.device(name)
        except RuntimeError as exc:
            raise ValueError(f"{ENV_VAR}={name!r} is not a device PyTorch knows: {exc}") from None
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
