"""Where tensors live: the CPU, or a GPU when there is one.

Chapters 1-7 call :func:`default_device` once and create their tensors there; chapters 8-12 train
and time their models on one CPU thread, so that training repeats exactly. The package itself never
hard-codes a device and creates new tensors on the device of their inputs.
"""

from __future__ import annotations

import os

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
