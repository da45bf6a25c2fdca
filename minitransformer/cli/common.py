"""What every command shares: refusals, devices, processes and the model classes.

Bad input raises :class:`CommandLineError` (or ``ValueError``/``TypeError``/``OSError`` from the
package); :func:`minitransformer.cli.main` prints it as one line on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import os

import torch

from minitransformer.device import default_device
from minitransformer.gpt import GPT, GPTConfig

PROG = "minitransformer"


class CommandLineError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake raised as one line instead of a usage block and exit."""

    def error(self, message: str) -> None:
        raise CommandLineError(f"{self.prog}: {message} (see --help)")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nonnegative(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def device(name: str | None) -> torch.device:
    """``--device``, checked: a name torch knows, and CUDA only where it is available."""
    if not name:
        return default_device()
    try:
        found = torch.device(name)
    except (RuntimeError, ValueError):
        raise CommandLineError(f"--device {name}: not a device name (cpu, cuda, cuda:1, ...)")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise CommandLineError(f"--device {name}: CUDA is not available on this machine")
    if found.type not in ("cpu", "cuda"):
        raise CommandLineError(f"--device {name}: only cpu and cuda are supported")
    return found


def threads(given: int | None, *, processes: int = 1) -> tuple[int, str]:
    """The CPU threads of each process, and why: ``--threads``, else ``OMP_NUM_THREADS``, else
    the cores that are idle now, shared among this machine's ``processes``.

    PyTorch's default is one thread per core. Its threads meet at a barrier after every
    operation, so when another program holds one of the cores, every operation waits for the
    thread that got no core: on a busy 2-core machine the default ran 4-9 times slower than one
    thread. Counting only idle cores (the cores less the 1-minute load average) avoids that.
    """
    if given is not None:
        return given, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), f"OMP_NUM_THREADS={int(env)}"
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    idle = max(1, round(cores - busy))
    return max(1, idle // processes), (f"{cores} cores, {busy:.1f} busy, {processes} "
                                       f"process{'es' * (processes > 1)}; --threads N to choose")


class Processes:
    """This process's rank among ``world_size`` (torchrun's environment), and the process group
    when there is more than one: gloo on the CPU, NCCL on GPUs."""

    def __init__(self, name: str | None) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        found = device(name)
        if found.type == "cuda" and found.index is None and self.world_size > 1:
            found = torch.device("cuda", local)
        self.device = found
        self.group = False
        if self.world_size > 1:
            import torch.distributed as dist
            if not dist.is_initialized():
                dist.init_process_group("nccl" if found.type == "cuda" else "gloo")
                self.group = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        if self.group:
            import torch.distributed as dist
            dist.destroy_process_group()


def architecture(arch: str) -> tuple[type, type]:
    """The model class and its config class for ``--arch``."""
    if arch == "llama":
        from minitransformer.llama import Llama, LlamaConfig
        return Llama, LlamaConfig
    return GPT, GPTConfig
