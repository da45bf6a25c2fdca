"""What every command shares: refusals, the groups of flags that several commands declare (one
name, one meaning, one wording), devices, processes, loading a model, printing a stream of
tokens; and what the training commands share: the run directory, threads, checkpoints.

Bad input raises :class:`CommandLineError` (or ``ValueError``/``TypeError``/``OSError`` from the
package); :func:`minitransformer.cli.main` prints it as one line on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import hashlib
import json
import math
import os
import shutil
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from minitransformer import checkpoints  # by the module: tests replace its functions
from minitransformer.device import default_device, deterministic_kernels
from minitransformer.models import ARCHITECTURES, architecture_for

if TYPE_CHECKING:
    from minitransformer.bpe import BPETokenizer

PROG = "minitransformer"


class CommandLineError(Exception):
    """Bad input: printed as one line on stderr, exit status 2 (under torchrun, by rank 0
    only: every rank reads the same flags and files, so every rank would say the same)."""


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake raised as one line instead of a usage block and exit, and no
    abbreviated flags (``--dat`` would silently be ``--data``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:
        raise CommandLineError(f"{self.prog}: {message} (see --help)")


def whole_number(least: int, most: int | None = None, *, most_as: str | None = None):
    """The type of an integer flag from ``least`` (to ``most``, written ``most_as``): its
    refusals share one wording, ``must be a whole number at least 1, got '0'``."""
    bounds = f"at least {least}" if most is None else f"from {least} to {most_as or most}"

    def check(text: str) -> int:
        digits = text.strip()
        value = int(digits) if digits.lstrip("+-").isdigit() and digits.isascii() else None
        if value is None or value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"must be a whole number {bounds}, got {text!r}")
        return value
    return check


positive = whole_number(1)
nonnegative = whole_number(0)
#: ``--seed``: a whole number that ``torch.manual_seed`` takes, 0 to 2**63 - 1.
seed = whole_number(0, 2 ** 63 - 1, most_as="2**63 - 1")


# ----- the flags that commands share: one name, one meaning, one wording ------------------------

DEFAULT_DEVICE = "default: minitransformer.default_device()"
THREADS = "CPU threads (default: OMP_NUM_THREADS, else the cores idle now)"
#: generate's and chat's: sampling at 0.8 (the book's), the whole vocabulary unless --top-k
TEMPERATURE = 0.8


def add_model_flags(parser: argparse.ArgumentParser, model: str | None, *,
                    metavar: str = "DIR", threads: str = THREADS) -> None:
    """``--model`` (where ``model`` says what it is; none for ``train``), ``--device``,
    ``--threads``."""
    group = parser.add_argument_group("model and device")
    if model is not None:
        group.add_argument("--model", metavar=metavar, help=model)
    group.add_argument("--device", help=f"cpu, cuda, cuda:1, ... ({DEFAULT_DEVICE})")
    group.add_argument("--threads", type=positive, help=threads)


#: --dtype of chat, generate and serve: the weights' precision while decoding
DECODE_DTYPES = ("float32", "int8", "int4")


def add_dtype_flag(parser: argparse.ArgumentParser) -> None:
    """``--dtype float32|int8|int4`` of ``chat``, ``generate`` and ``serve``
    (:func:`load_model`'s ``dtype``)."""
    parser.add_argument("--dtype", choices=DECODE_DTYPES, default="float32",
                        help="the weights while decoding: float32 (default); int8: every "
                        "linear layer's weight in 8 bits with one scale per row; int4: in 4 "
                        "bits with a scale and an offset per block of 32 (a Q4_1 file's "
                        "weights exactly), a tied head in int8; both multiplied without a "
                        "float copy, in bfloat16 inside the kernel (weight-only, chapter 19; "
                        "the CPU only)")


def add_sampling_flags(parser: argparse.ArgumentParser, *, length: str) -> None:
    """``--max-new-tokens`` (``length`` says its default), ``--temperature``, ``--top-k``,
    ``--seed``: the same for ``generate`` and ``chat``."""
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-new-tokens", type=positive, metavar="N", help=length)
    group.add_argument("--temperature", type=temperature, default=TEMPERATURE,
                       help=f"0 is greedy (default {TEMPERATURE})")
    group.add_argument("--top-k", type=positive, metavar="K", help="sample among the K "
                       "likeliest tokens only (default: all)")
    group.add_argument("--seed", type=seed, default=0, help="makes sampling repeatable "
                       "(default 0)")


def add_schedule_flags(parser: argparse.ArgumentParser, *, batch: str, seeds: str,
                       log_every: int, logged: str,
                       steps: str = "optimizer updates") -> argparse._ArgumentGroup:
    """``--steps`` (``steps`` says what it counts), ``--lr``, ``--batch-size`` (``batch`` says
    of what), ``--seed`` (what it ``seeds``), ``--log-every`` (``logged`` says what is printed;
    ``--eval-every``, train's old name, is its hidden alias). Their defaults are the command's
    ``DEFAULTS``: None here, so that ``--resume`` sees which were given. The group, for a
    command's own schedule flags."""
    group = parser.add_argument_group("training schedule")
    group.add_argument("--steps", type=positive, help=f"{steps}; with --resume, a larger "
                       f"number extends a run")
    group.add_argument("--lr", type=number, help="peak learning rate")
    group.add_argument("--batch-size", type=positive, help=batch)
    group.add_argument("--seed", type=seed, help=seeds)
    group.add_argument("--log-every", type=positive, default=log_every, metavar="N",
                       help=f"steps between {logged} (default {log_every})")
    group.add_argument("--eval-every", type=positive, dest="log_every",
                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return group


def add_checkpoint_flags(parser: argparse.ArgumentParser, *, out: str,
                         steps: str = "steps") -> None:
    """``--out`` (``out`` says what it becomes), ``--save-every`` (in ``steps``), ``--resume``,
    ``--no-progress``."""
    group = parser.add_argument_group("run directory and checkpoints")
    group.add_argument("--out", metavar="DIR", required=True, help=out)
    group.add_argument("--save-every", type=positive, default=100, metavar="N", help=f"{steps} "
                       f"between checkpoints (default 100; the last {steps[:-1]} is always "
                       f"saved)")
    group.add_argument("--resume", action="store_true", help="continue the run in --out from "
                       "its last checkpoint")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_lora_flags(parser: argparse.ArgumentParser, *, targets: dict[str, list[str]],
                   rank: str) -> None:
    """``--lora-rank`` (``rank`` says what the run then writes), ``--lora-alpha``,
    ``--lora-targets`` (default: ``targets`` by model class), ``--merge``."""
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora-rank", type=positive, metavar="R", help="train a LoRA adapter "
                       f"of rank R instead of every weight: {rank}")
    group.add_argument("--lora-alpha", type=number, metavar="A", help="LoRA's scale is A / R "
                       "(default A = R)")
    group.add_argument("--lora-targets", nargs="+", metavar="NAME", help="the linear layers "
                       "LoRA wraps (default: " + "; ".join(
                           f"{k}: {' '.join(v)}" for k, v in targets.items()) + ")")
    group.add_argument("--merge", action="store_true", help="with --lora-rank: also write the "
                       "merged model to DIR/merged/, a plain model directory")


def check_lora_flags(args: argparse.Namespace, lora: bool) -> None:
    """Refuse ``--lora-alpha``, ``--lora-targets`` or ``--merge`` in a run without LoRA."""
    for key in ("lora_alpha", "lora_targets", "merge"):
        if not lora and getattr(args, key) not in (None, False):
            raise CommandLineError(f"--{key.replace('_', '-')} needs --lora-rank R (a run "
                                   f"without it trains every weight)")


def defaults_epilog(defaults: dict) -> str:
    """``Defaults for a new run: --steps 300, ...``: a training command's --help epilog."""
    return "Defaults for a new run: " + ", ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in defaults.items()) + "."


def is_rank_zero() -> bool:
    """Whether this process prints: always, except a rank other than 0 under torchrun."""
    return os.environ.get("RANK", "0") == "0"


def number(text: str) -> float:
    """The type of a real-valued flag: a finite number."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
    return value


def temperature(text: str) -> float:
    """``--temperature``: a finite number, 0 (greedy) or more."""
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number at least 0 (0 is greedy), got "
                                         f"{text!r}")
    return value


def device(name: str | None) -> torch.device:
    """``--device``, checked: a name torch knows, and CUDA only where it is available."""
    if not name:
        return default_device()
    try:
        found = torch.device(name)
    except (RuntimeError, ValueError):
        raise CommandLineError(f"--device {name}: not a device name (cpu, cuda, cuda:1, ...)")
    if found.type not in ("cpu", "cuda"):
        raise CommandLineError(f"--device {name}: only cpu and cuda are supported")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise CommandLineError(f"--device {name}: CUDA is not available on this machine")
    count = torch.cuda.device_count() if found.type == "cuda" else 0
    if found.type == "cuda" and found.index is not None and found.index >= count:
        raise CommandLineError(f"--device {name}: this machine has {count} CUDA "
                               f"device{'s' * (count != 1)} (cuda:0 to cuda:{count - 1})")
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
    return ARCHITECTURES[arch].model, ARCHITECTURES[arch].config


def model_class(folder: Path) -> type:
    """The model class of a directory that ``save_pretrained`` wrote: Llama for
    ``"model_type": "llama"`` in its ``config.json``, else GPT."""
    config = folder / "config.json"
    model_type = checkpoints.read_json(config).get("model_type") if config.is_file() else None
    return architecture_for(model_type).model


#: --model's words where it may be left out: generate and chat then use SmolLM2
DEFAULT_MODEL = ("(default: SmolLM2-135M-Instruct, the GGUF file that `python -m "
                 "minitransformer download smollm2` puts in the cache)")


def check_dtype_device(dtype: str, where: torch.device) -> None:
    """``--dtype int8`` runs on the CPU only: refused in one line on another device."""
    if dtype != "float32" and where.type != "cpu":
        raise CommandLineError(f"--dtype {dtype} decodes on the CPU only (its kernel is "
                               f"PyTorch's CPU one), not on --device {where}: give --device cpu")


def load_model(path: str | None, where: torch.device, *, dtype: str = "float32"
               ) -> tuple[torch.nn.Module, BPETokenizer]:
    """The model and tokenizer of ``--model``: a model directory (``save_pretrained``'s), a
    LoRA adapter directory that ``finetune`` wrote (its base model, read from
    ``base_model_name_or_path``, with the adapter), or a llama.cpp ``.gguf`` file (a Llama,
    dequantised to float32, and the tokenizer in its metadata). ``None``: SmolLM2-135M-Instruct
    from the cache (:func:`minitransformer.pretrained.smollm2_path`), never the network.

    ``dtype`` is ``--dtype``: ``"int8"`` replaces every linear layer by its
    :class:`~minitransformer.quantize.Int8Linear`, ``"int4"`` by its
    :class:`~minitransformer.quantize.Int4Linear` (a tied head by an ``Int8Linear``)
    (:func:`~minitransformer.quantize.quantize_linears`), refused in one line on another
    device than the CPU and for a LoRA adapter directory (merge it first)."""
    from minitransformer.lora import ADAPTER_CONFIG_FILE

    check_dtype_device(dtype, where)
    if (dtype != "float32" and path is not None and (Path(path) / ADAPTER_CONFIG_FILE).is_file()
            and not (Path(path) / "config.json").is_file()):
        raise CommandLineError(f"--dtype {dtype} --model {path}: a LoRA adapter's layers are "
                               f"not quantized; merge it first (finetune --merge writes "
                               f"merged/)")
    model, tokenizer = _load_model(path, where)
    if dtype == "float32":
        return model, tokenizer
    from minitransformer.quantize import quantize_linears
    return quantize_linears(model, bits=4 if dtype == "int4" else 8), tokenizer


def _load_model(path: str | None, where: torch.device) -> tuple[torch.nn.Module, BPETokenizer]:
    from minitransformer.bpe import BPETokenizer
    from minitransformer.lora import ADAPTER_CONFIG_FILE, load_adapter

    if path is None:
        from minitransformer import pretrained
        try:
            path = str(pretrained.smollm2_path())
        except FileNotFoundError as exc:
            raise CommandLineError(f"no --model given, and the default model is not here: "
                                   f"{exc}") from None
    folder = Path(path)
    if folder.is_file() and folder.suffix == ".gguf":
        from minitransformer.llama import Llama
        try:
            tokenizer = BPETokenizer.from_gguf(folder)
            model = Llama.from_gguf(folder, device=where)
        except ValueError as exc:
            raise CommandLineError(f"--model {path}: {exc}") from None
        return model.eval(), tokenizer
    if not folder.is_dir():
        raise CommandLineError(f"--model {path}: no such directory or .gguf file")
    adapter = folder / ADAPTER_CONFIG_FILE
    if adapter.is_file() and not (folder / "config.json").is_file():
        base = checkpoints.read_json(adapter).get("base_model_name_or_path")
        if isinstance(base, str) and Path(base).is_file() and base.endswith(".gguf"):
            from minitransformer.llama import Llama
            model = Llama.from_gguf(base, device=where)   # finetune --model smollm2's
        elif not isinstance(base, str) or not Path(base).is_dir():
            raise CommandLineError(f"{adapter}: its base model {base!r} is not a directory "
                                   f"or .gguf file here")
        else:
            model = model_class(Path(base)).from_pretrained(base, device=where)
        load_adapter(model, folder)
    elif (folder / "config.json").is_file():
        model = model_class(folder).from_pretrained(folder, device=where)
    else:
        raise CommandLineError(f"--model {path} is not a model directory: it has no "
                               f"config.json (train, finetune and dpo write one)")
    return model.eval(), BPETokenizer.from_pretrained(folder)


def print_stream(tokens: Iterable[int], tokenizer: BPETokenizer, *,
                 stops: Collection[int] = (), before: Sequence[int] = ()) -> str:
    """Print the text of ``before``, then of each token of ``tokens`` as it comes, up to (not
    including) a token of ``stops``, and a newline; the text printed, without the newline.

    A token can end in the middle of a character: the bytes go through an incremental UTF-8
    decoder, which prints a character once all its bytes are there (broken bytes print as
    U+FFFD, as :meth:`BPETokenizer.decode` does)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(tokenizer.decode_bytes(list(before)))]
    print(pieces[-1], end="", flush=True)
    for token in tokens:
        if token in stops:
            break
        pieces.append(decoder.decode(tokenizer.token_bytes(token)))
        print(pieces[-1], end="", flush=True)
    pieces.append(decoder.decode(b"", final=True))
    print(pieces[-1], flush=True)
    return "".join(pieces)


@contextlib.contextmanager
def using_threads(given: int | None):
    """Run the block on ``--threads`` CPU threads (:func:`threads`), giving torch's count back
    after: ``main()`` may run inside a notebook or a test."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads(given)[0])
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----- what a training command shares (train, finetune) -----------------------------------------

def check_new_out(out: Path, *, write: bool) -> None:
    """Refuse an ``--out`` that cannot take a new run: a file, a run already (use --resume), a
    directory of other files. What a kill during the run's first save left is removed (by the
    process that ``write``s) and said."""
    leftovers = checkpoints.unfinished_first_save(out)
    if out.exists() and not out.is_dir():
        raise CommandLineError(f"--out {out} is a file, not a directory")
    if (out / checkpoints.STATE_FILE).exists():
        raise CommandLineError(f"--out {out} already holds a run: pass --resume to "
                               f"continue it, or choose another directory")
    if out.is_dir() and any(out.iterdir()) and not leftovers:
        raise CommandLineError(f"--out {out} is not empty and holds no run: choose a new "
                               f"or an empty directory")
    if leftovers and write:     # a kill during the first save: not a run, start again
        for path in leftovers:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        print(f"removed {', '.join(sorted(p.name for p in leftovers))}: the first "
              f"checkpoint of a run killed while writing it")


def check_resumable(out: Path) -> None:
    """Refuse ``--resume`` where no checkpoint was finished."""
    if checkpoints.unfinished_first_save(out) or not out.is_dir() or not any(out.iterdir()):
        raise CommandLineError(f"nothing to resume in {out}: no checkpoint was finished "
                               f"there; the same command without --resume starts the run")


def check_same_flags(given: dict, settings: dict) -> None:
    """On --resume, a flag given with another value than the checkpoint's is refused, except a
    larger --steps (which extends the run)."""
    for key, value in given.items():
        if key == "steps" and value >= settings["steps"]:
            continue
        if value != settings.get(key):
            flag = "--" + key.replace("_", "-")
            why = ("a run can be extended, not shortened" if key == "steps" else
                   "a resumed run keeps the flags it began with, or it would not equal the "
                   "run never stopped")
            raise CommandLineError(f"{flag} {value} differs from the checkpoint's "
                                   f"{settings.get(key)}: {why}")


def set_threads(given: int | None, began: int | None, procs: Processes) -> tuple[int, str]:
    """Set and return the CPU threads of this process, and the words that say why: as the
    resumed run ``began`` unless ``--threads`` or ``OMP_NUM_THREADS`` says otherwise."""
    if began and given is None and "OMP_NUM_THREADS" not in os.environ:
        count, why = began, "as the run began"
    else:
        count, why = threads(given, processes=procs.local_world_size)
    torch.set_num_threads(count)
    return count, f"{count} thread{'s' * (count > 1)} ({why})"


def distributed(model: torch.nn.Module, procs: Processes) -> torch.nn.Module:
    """``model`` in ``DistributedDataParallel`` when there is more than one process."""
    if procs.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(
        model, device_ids=[procs.device.index] if procs.device.type == "cuda" else None)


def mean_over_ranks(procs: Processes):
    """A step's loss on this rank -> the mean over all ranks: the whole global batch's loss,
    as the shares are equal (float64, so the mean of the same numbers on every rank is equal)."""
    import torch.distributed as dist

    def mean(loss: float) -> float:
        total = torch.tensor([loss], dtype=torch.float64, device=procs.device)
        dist.all_reduce(total)
        return total.item() / procs.world_size
    return mean if procs.world_size > 1 else None


def save_checkpoint(out: Path, loop, optimizer: torch.optim.Optimizer,
                    generator: torch.Generator, procs: Processes, *, write_model,
                    state: dict, keep: tuple[str, ...] = (),
                    tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Write the checkpoint of ``loop.step`` (:func:`minitransformer.checkpoints.save`): the
    model (``write_model(folder)``), the optimizer's moments, every RNG, ``state`` and the
    loop's own state; and the command's own ``tensors`` (``dpo``'s LoRA matrices)."""
    tensors = {**(tensors or {}), **checkpoints.optimizer_tensors(optimizer),
               **checkpoints.rng_states(generator)}
    checkpoints.save(out, step=loop.step, world_size=procs.world_size, write_model=write_model,
         tensors=tensors, state={**state, "loop": loop.state_dict()}, keep=keep)


def restore_checkpoint(out: Path, resumed: dict, loop, optimizer: torch.optim.Optimizer,
                       generator: torch.Generator, procs: Processes, *,
                       keep: tuple[str, ...] = ()) -> None:
    """Put a checkpoint's optimizer moments, RNG states and loop state back, and finish what a
    kill inside its save may have cut short (the top-level files, the older checkpoints)."""
    checkpoints.load_optimizer(optimizer, resumed["tensors"])
    checkpoints.set_rng_states(resumed["tensors"], generator)
    loop.load_state_dict(resumed["state"]["loop"])
    if procs.main:
        checkpoints.publish(out, resumed["folder"])
        checkpoints.prune(out, resumed["folder"], keep=keep)


def chat_tokens_of(tokenizer, model: str) -> dict[str, int]:
    """The chat format's special tokens of ``--model``'s tokenizer, or one line saying which
    are missing and which program writes a model that has them."""
    from minitransformer.chat import CHAT_TOKENS, check_chat_tokenizer
    try:
        return check_chat_tokenizer(tokenizer)
    except ValueError:
        missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
        raise CommandLineError(
            f"--model {model} has no chat format: its tokenizer lacks the special tokens "
            f"{', '.join(missing)}; `python -m minitransformer train` reserves them in every "
            f"model it trains (version 0.6 on), so train the base model with it") from None


def in_processes(command, args: argparse.Namespace) -> int:
    """``command(args, processes)`` with this run's processes (torchrun's, or this one), on
    deterministic kernels (a GPU's too: a resumed run equals the run never stopped), giving
    torch's thread count back afterwards: ``main()`` may run inside a notebook or a test."""
    procs = Processes(args.device)
    before = torch.get_num_threads()
    try:
        with deterministic_kernels(procs.device):
            return command(args, procs)
    finally:
        torch.set_num_threads(before)
        procs.close()


def read_text(path: str) -> tuple[str, str]:
    """The UTF-8 text of ``--data`` and its SHA-256 (a resumed run must read the same bytes)."""
    file = Path(path)
    if not file.is_file():
        raise CommandLineError(f"--data {path}: no such file")
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandLineError(f"--data {path} is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start})") from None
    return text, hashlib.sha256(raw).hexdigest()


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: ``--model`` words that name a model in the cache rather than a path
MODEL_NAMES = {"smollm2": "smollm2_path"}


def model_path(text: str) -> str:
    """``--model`` as an absolute path: a path that exists as it is given, else one of
    :data:`MODEL_NAMES` (``smollm2``: SmolLM2-135M-Instruct's GGUF file in the cache, never the
    network), else the path as given (refused later by what reads it)."""
    if not os.path.exists(text) and text in MODEL_NAMES:
        from minitransformer import pretrained
        try:
            return str(getattr(pretrained, MODEL_NAMES[text])())
        except FileNotFoundError as exc:
            raise CommandLineError(f"--model {text}: {exc}") from None
    return os.path.abspath(text)


def model_sha256(path: str) -> str:
    """The SHA-256 of ``--model``'s weights (a directory's ``model.safetensors`` or the
    ``.gguf`` file), for a resumed LoRA run to check its base; empty when there is none."""
    file = Path(path)
    file = file if file.suffix == ".gguf" else file / "model.safetensors"
    return file_sha256(file) if file.is_file() else ""


def check_chat_format(tokenizer, model: str) -> None:
    """Refuse ``--model`` unless its tokenizer has a chat format that says which tokens are the
    assistant's: the course's chat tokens, or a template with ``{% generation %}`` marks or
    one whose marked twin the package has (SmolLM2's)."""
    from minitransformer.chat import has_chat_tokens, jinja_chat_template, training_chat_template

    template = tokenizer.chat_template
    if template is None or (has_chat_tokens(tokenizer.special_tokens)
                            and template == jinja_chat_template(list(tokenizer.special_tokens))):
        chat_tokens_of(tokenizer, model)
        return
    try:
        training_chat_template(template)
    except ValueError as exc:
        raise CommandLineError(f"--model {model}: {exc}") from None


def load_chat_model(path: str, device: torch.device) -> tuple[torch.nn.Module, BPETokenizer]:
    """The model and tokenizer of ``--model`` (a model directory or a llama.cpp ``.gguf``
    file such as SmolLM2's), refused by name without a chat format that marks the assistant's
    tokens."""
    from minitransformer.bpe import BPETokenizer
    from minitransformer.lora import ADAPTER_CONFIG_FILE

    folder = Path(path)
    if folder.is_file() and folder.suffix == ".gguf":
        from minitransformer.llama import Llama
        try:
            tokenizer = BPETokenizer.from_gguf(folder)
            check_chat_format(tokenizer, path)
            return Llama.from_gguf(folder, device=device), tokenizer
        except ValueError as exc:
            raise CommandLineError(f"--model {path}: {exc}") from None
    if not folder.is_dir():
        raise CommandLineError(f"--model {path}: no such directory or .gguf file")
    if (folder / ADAPTER_CONFIG_FILE).is_file() and not (folder / "config.json").is_file():
        raise CommandLineError(f"--model {path} is a LoRA adapter, not a model: "
                               f"start from its merged model ({folder / 'merged'}, written by "
                               f"--merge) or its base model")
    if not (folder / "config.json").is_file():
        raise CommandLineError(f"--model {path} is not a model directory: it has no "
                               f"config.json (train, finetune and dpo write one)")
    tokenizer = BPETokenizer.from_pretrained(folder)
    check_chat_format(tokenizer, path)
    specials = tokenizer.special_tokens
    model = model_class(folder).from_pretrained(folder, device=device)
    if max(specials.values()) >= model.config.vocab_size:
        raise CommandLineError(f"--model {path}: its tokenizer's ids reach "
                               f"{max(specials.values())}, beyond the model's vocabulary of "
                               f"{model.config.vocab_size}")
    return model, tokenizer


def read_json_lines(path: str) -> tuple[list[tuple[int, object]], str]:
    """Each non-blank line's number and JSON value, and the file's SHA-256 (JSON Lines: one
    value per ``\\n``-ended line; a line separator such as U+2028 inside a string is text, as
    ``json.dumps(..., ensure_ascii=False)`` writes it). A line that is not JSON, or nested too
    deeply to read, is refused with its number."""
    text, digest = read_text(path)
    records = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise CommandLineError(f"--data {path}:{n} is not JSON ({exc.msg}, column "
                                   f"{exc.colno})") from None
        except RecursionError:
            raise CommandLineError(f"--data {path}:{n} is not JSON this program reads: it is "
                                   f"nested too deeply") from None
    return records, digest


@dataclass
class TuneSettings:
    """The flags that decide a run of ``finetune``, ``dpo`` or ``grpo`` (each command's
    ``Settings`` adds its own and its defaults): a new run's from the command line, else the
    defaults; a resumed run's from its checkpoint, where they are saved as ``args``. The LoRA
    fields are None without ``--lora-rank``; ``lora_alpha`` and ``lora_targets`` are filled in
    (alpha = rank, the model's default layers) when the run begins."""

    model: str
    data: str
    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-3
    seed: int = 0
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: list[str] | None = None
    warmup_steps: int | None = None     # None: a tenth of the run, 1 to 100 steps

    def __post_init__(self) -> None:
        if self.warmup_steps is None:
            self.warmup_steps = max(1, min(100, self.steps // 10))


#: TuneSettings' fields that are no flag with a default of its own (not in --help's defaults)
_NOT_DEFAULTS = ("model", "data", "lora_rank", "lora_alpha", "lora_targets", "warmup_steps")


def settings_defaults(settings: type[TuneSettings]) -> dict:
    """What a new run of a command with these ``settings`` uses for a flag not given: its
    ``--help`` epilog (:func:`defaults_epilog`)."""
    return {f.name: f.default for f in fields(settings) if f.name not in _NOT_DEFAULTS}


def tune_settings(settings: type[TuneSettings], command: str, args: argparse.Namespace,
                  out: Path, check_state, *, write: bool = True,
                  check_values=None) -> tuple[TuneSettings, dict | None]:
    """The run's ``settings`` and, with ``--resume``, the checkpoint to continue
    (:func:`resumed_run`): ``(settings, resumed)``. A new run needs ``--model`` (a path made
    absolute, or a name of :data:`MODEL_NAMES`) and ``--data`` (made absolute), has its flags
    checked by ``check_values(given)`` and a new ``--out`` (:func:`check_new_out`, files
    removed only where ``write``)."""
    given = {f.name: getattr(args, f.name) for f in fields(settings)
             if getattr(args, f.name, None) is not None}
    if "model" in given:
        given["model"] = model_path(given["model"])       # smollm2: the cached GGUF file
    if "data" in given:
        given["data"] = os.path.abspath(given["data"])
    if not args.resume:
        for key in ("model", "data"):
            if key not in given:
                raise CommandLineError(f"{command} needs --{key}")
        if check_values is not None:
            check_values(given)
        check_new_out(out, write=write)
        return settings(**given), None

    def check(state: dict, path: Path) -> None:
        check_state(state, path)
        names = {f.name for f in fields(settings)}
        if not set(state["args"]) <= names or not {"model", "data"} <= set(state["args"]):
            raise CommandLineError(f"{path} is not what {command} writes (edited or damaged?)")

    saved, resumed = resumed_run(out, given, check)
    return settings(**saved), resumed


def resumed_run(out: Path, given: dict, check_state) -> tuple[dict, dict]:
    """``--resume`` of ``finetune`` and ``dpo``: the run's settings from its latest checkpoint
    (checked by the command's ``check_state(state, path)``, with the flags given now the same,
    or ``--steps`` larger: the run is extended) and what to restore."""
    check_resumable(out)
    trainer_state, folder = checkpoints.latest(out)
    state, tensors = checkpoints.load_tensors(folder)
    check_state(state, folder / checkpoints.JSON_FILE)
    settings = state["args"]
    check_same_flags(given, settings)
    note = ""
    if given.get("steps", settings["steps"]) > settings["steps"]:
        note = (f"extending the run from {settings['steps']} to {given['steps']} steps: the "
                f"cosine schedule is stretched, so the learning rate rises and decays again")
        settings["steps"] = given["steps"]
    return settings, {"trainer_state": trainer_state, "folder": folder, "state": state,
                      "tensors": tensors, "note": note}
