"""The command line: ``python -m minitransformer train|generate`` (chapter 15).

A thin layer: argparse turns flags into the package's own objects (a byte-level
:class:`~minitransformer.bpe.BPETokenizer`, a :class:`~minitransformer.gpt.GPTConfig`) and runs
the package's one training loop, :class:`~minitransformer.training.TrainingLoop`. The program
adds only what a program needs: files, checkpoints (:mod:`minitransformer.checkpoints`) and
processes (``torchrun`` and ``DistributedDataParallel``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
import tqdm

from minitransformer import checkpoints
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.data import random_batches, window_batches
from minitransformer.device import default_device
from minitransformer.generation import generate
from minitransformer.gpt import GPT, GPTConfig
from minitransformer.training import BAR_FORMAT, TrainingLoop, _optimizer

PROG = "minitransformer"
ARCHS = ("gpt", "llama")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
#: What a new run uses for a flag that is not given: a model that trains on the book's corpus
#: (175 kB) in about half a minute on two CPU cores (21.5 s measured on a quiet machine).
TRAIN_DEFAULTS = {
    "arch": "gpt", "steps": 300, "batch_size": 16, "context_length": 64, "num_layers": 2,
    "num_heads": 4, "d_model": 128, "vocab_size": 512, "lr": 3e-3, "seed": 0,
    "grad_accum": 1, "dropout": 0.0, "dtype": "float32",
}
#: Flags that decide the run: on --resume they come from the checkpoint, and a different value
#: given on the command line is refused (the result could no longer be bit-identical).
RUN_FLAGS = ("data", *TRAIN_DEFAULTS)
VAL_FRACTION = 0.1      # the end of the data, held out for the validation loss
EVAL_BATCHES = 20       # at most this many validation batches, the same at every evaluation


class CommandLineError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:      # one line, no usage block
        raise CommandLineError(f"{self.prog}: {message} (see --help)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _nonnegative(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``minitransformer train`` and ``minitransformer generate``."""
    parser = _Parser(prog=PROG, description="Train a small GPT on your own text, and sample "
                     "from it (the course Transformers from scratch, chapter 15).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    t = commands.add_parser(
        "train", help="train a GPT on a UTF-8 text file",
        description="Train a byte-level BPE tokenizer and a GPT on a UTF-8 text file, saving "
        "checkpoints that --resume continues bit for bit. Under torchrun, every process "
        "trains on its slice of the same global batch (DistributedDataParallel).",
        epilog="Defaults for a new run: " + ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in TRAIN_DEFAULTS.items()) + ".")
    add = t.add_argument
    add("--data", metavar="FILE", help="UTF-8 text to train on; its last 10%% is held out "
        "for the validation loss")
    add("--out", metavar="DIR", required=True, help="the run's directory: transformers "
        "loads it (config.json, model.safetensors, tokenizer files)")
    add("--arch", choices=ARCHS, help="the model: GPT-2's (chapter 9) or Llama's (chapter 14)")
    add("--steps", type=_positive, help="optimizer updates")
    add("--batch-size", type=_positive, help="the global batch: sequences per update, over "
        "all processes and accumulation steps")
    add("--context-length", type=_positive, help="tokens per sequence")
    add("--num-layers", type=_positive, help="transformer blocks")
    add("--num-heads", type=_positive, help="attention heads; must divide --d-model")
    add("--d-model", type=_positive, help="width of every token vector")
    add("--vocab-size", type=_positive, help="tokens of the BPE tokenizer, counting its 256 "
        "byte tokens")
    add("--lr", type=_float, help="peak learning rate (warm-up, then cosine decay)")
    add("--dropout", type=_float, help="dropout probability (processes agree exactly only "
        "with 0)")
    add("--seed", type=int, help="seeds the weights and the batches")
    add("--grad-accum", type=_positive, help="micro-batches per update (same update as one "
        "batch that many times larger)")
    add("--save-every", type=_positive, default=100, help="steps between checkpoints "
        "(default 100; the last step is always saved)")
    add("--eval-every", type=_positive, default=50, help="steps between validation losses "
        "(default 50)")
    add("--resume", action="store_true", help="continue the run in --out from its last "
        "checkpoint")
    add("--device", help="cpu, cuda, cuda:1, ... (default: minitransformer.default_device())")
    add("--dtype", choices=tuple(DTYPES), help="the weights' precision")
    add("--no-progress", action="store_true", help="no progress bar")

    g = commands.add_parser("generate", help="continue a prompt with a trained model",
                            description="Print the prompt and its continuation.")
    add = g.add_argument
    add("--model", metavar="DIR", required=True, help="a directory written by train")
    add("--prompt", required=True, help="the text to continue")
    add("--max-new-tokens", type=_nonnegative, default=None,
        help="(default: 40, or as many as the model's context leaves after the prompt)")
    add("--temperature", type=_float, default=1.0, help="0 is greedy (default 1.0)")
    add("--top-k", type=_positive, help="sample among the k likeliest tokens only")
    add("--seed", type=int, default=0, help="makes sampling repeatable (default 0)")
    add("--device", help="default: minitransformer.default_device()")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); the exit status.

    Bad input prints one line on stderr, ``minitransformer: error: ...``, and returns 2.
    """
    try:
        args = build_parser().parse_args(argv)
        return _train(args) if args.command == "train" else _generate(args)
    except SystemExit as exc:       # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CommandLineError, ValueError, TypeError, OSError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, FileNotFoundError) and exc.filename and exc.strerror:
            message = f"{exc.strerror}: {exc.filename}"
        if not message.startswith(PROG):
            message = f"{PROG}: error: {message}"
        print(message, file=sys.stderr)
        return 2


def _device(name: str | None) -> torch.device:
    """``--device``, checked: a name torch knows, and CUDA only where it is available."""
    if not name:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise CommandLineError(f"--device {name}: not a device name (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandLineError(f"--device {name}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise CommandLineError(f"--device {name}: only cpu and cuda are supported")
    return device


# ----- train ------------------------------------------------------------------------------------

class _Processes:
    """This process's rank among ``world_size`` (torchrun's environment), and the process group
    when there is more than one: gloo on the CPU, NCCL on GPUs."""

    def __init__(self, device: str | None) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = _device(device)
        if device.type == "cuda" and device.index is None and self.world_size > 1:
            device = torch.device("cuda", local)
        self.device = device
        self.group = False
        if self.world_size > 1:
            import torch.distributed as dist
            if not dist.is_initialized():
                dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
                self.group = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        if self.group:
            import torch.distributed as dist
            dist.destroy_process_group()


def _settings(args: argparse.Namespace, out: Path) -> tuple[dict, dict | None]:
    """The run's flags (``RUN_FLAGS``) and, with --resume, the checkpoint to continue:
    ``(settings, resumed)`` where ``resumed`` holds the trainer state, folder, state, tensors."""
    given = {k: getattr(args, k) for k in RUN_FLAGS if getattr(args, k) is not None}
    if "data" in given:
        given["data"] = os.path.abspath(given["data"])
    if not args.resume:
        if out.exists() and not out.is_dir():
            raise CommandLineError(f"--out {out} is a file, not a directory")
        if out.is_dir() and any(out.iterdir()):
            raise CommandLineError(f"--out {out} already holds a run: pass --resume to "
                                   f"continue it, or choose another directory")
        if "data" not in given:
            raise CommandLineError("train needs --data FILE, the UTF-8 text to train on")
        return {**TRAIN_DEFAULTS, **given}, None
    trainer_state, folder = checkpoints.latest(out)
    state, tensors = checkpoints.load_tensors(folder)
    settings = state["args"]
    for key, value in given.items():
        if value != settings[key]:
            flag = "--" + key.replace("_", "-")
            raise CommandLineError(f"{flag} {value} differs from the checkpoint's "
                                   f"{settings[key]}: a resumed run keeps the flags it began "
                                   f"with, or it would not equal the run never stopped")
    return settings, {"trainer_state": trainer_state, "folder": folder, "state": state,
                      "tensors": tensors}


def _check(s: dict, world_size: int) -> None:
    """Refuse flags that cannot make a run, naming them."""
    if s["d_model"] % s["num_heads"]:
        raise CommandLineError(f"--num-heads {s['num_heads']} does not divide --d-model "
                               f"{s['d_model']}")
    if s["vocab_size"] < 256:
        raise CommandLineError(f"--vocab-size must be at least 256 (the byte tokens), got "
                               f"{s['vocab_size']}")
    if not s["lr"] > 0:
        raise CommandLineError(f"--lr must be positive, got {s['lr']}")
    if not 0 <= s["dropout"] < 1:
        raise CommandLineError(f"--dropout must be in [0, 1), got {s['dropout']}")
    parts = world_size * s["grad_accum"]
    if s["batch_size"] % parts:
        raise CommandLineError(f"--batch-size {s['batch_size']} is not divisible by world "
                               f"size {world_size} x --grad-accum {s['grad_accum']} = {parts}")


def _read_text(path: str) -> tuple[str, str]:
    """The text of the data file and its SHA-256."""
    file = Path(path)
    if not file.is_file():
        raise CommandLineError(f"--data {path}: no such file")
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandLineError(f"--data {path} is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start})") from None
    if not text.strip():
        raise CommandLineError(f"--data {path} is empty")
    return text, hashlib.sha256(raw).hexdigest()


def _split(ids: list[int], context_length: int, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The token stream as training and validation parts (the last ``VAL_FRACTION``)."""
    window = context_length + 1
    n_val = max(int(len(ids) * VAL_FRACTION), window)
    if len(ids) - n_val < window:
        raise CommandLineError(f"--data {path} holds {len(ids)} tokens, too few for a training "
                               f"and a validation window of --context-length + 1 = {window} "
                               f"tokens each")
    stream = torch.tensor(ids, dtype=torch.long)
    return stream[:-n_val], stream[-n_val:]


def _micro_batches(stream: torch.Tensor, s: dict, generator: torch.Generator,
                   procs: _Processes) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every process draws the same global batch from the same generator and keeps its slice,
    cut into ``grad_accum`` micro-batches. The generator's state is the data position."""
    share = s["batch_size"] // procs.world_size
    micro = share // s["grad_accum"]
    for inputs, targets in random_batches(stream, batch_size=s["batch_size"],
                                          context_length=s["context_length"],
                                          generator=generator):
        mine = slice(procs.rank * share, (procs.rank + 1) * share)     # (B / world, T)
        inputs, targets = inputs[mine], targets[mine]
        for m in range(0, share, micro):
            yield (inputs[m:m + micro].to(procs.device), targets[m:m + micro].to(procs.device))


def _train(args: argparse.Namespace) -> int:
    procs = _Processes(args.device)
    try:
        return _run(args, procs)
    finally:
        procs.close()


def _run(args: argparse.Namespace, procs: _Processes) -> int:
    out = Path(args.out)
    say = print if procs.main else (lambda *a, **k: None)
    s, resumed = _settings(args, out)
    _check(s, procs.world_size)
    text, digest = _read_text(s["data"])
    if resumed:
        if digest != resumed["state"]["data_sha256"]:
            raise CommandLineError(f"--data {s['data']} changed since the run began (its "
                                   f"SHA-256 differs): a resumed run must read the same text")
        tokenizer = BPETokenizer.from_pretrained(resumed["folder"])
    else:
        tokenizer = BPETokenizer.train(text, s["vocab_size"], pattern=GPT2_PATTERN)
    train_ids, val_ids = _split(tokenizer.encode(text), s["context_length"], s["data"])
    dtype = DTYPES[s["dtype"]]

    torch.manual_seed(s["seed"])
    model_class, config_class = _architecture(s["arch"])
    if resumed:
        model = model_class.from_pretrained(resumed["folder"], device=procs.device, dtype=dtype)
    else:
        config = config_class(vocab_size=s["vocab_size"], context_length=s["context_length"],
                              num_layers=s["num_layers"], num_heads=s["num_heads"],
                              d_model=s["d_model"], dropout=s["dropout"])
        model = model_class(config, device=procs.device, dtype=dtype)
    generator = torch.Generator().manual_seed(s["seed"])
    optimizer = _optimizer(model, s["lr"], 0.1)
    wrapped = model
    if procs.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(
            model, device_ids=[procs.device.index] if procs.device.type == "cuda" else None)
    val = window_batches(val_ids, batch_size=s["batch_size"],
                         context_length=s["context_length"])[:EVAL_BATCHES]
    val = [(x.to(procs.device), y.to(procs.device)) for x, y in val]
    loop = TrainingLoop(wrapped, optimizer, steps=s["steps"], lr=s["lr"],
                        warmup_steps=max(1, min(100, s["steps"] // 10)),
                        grad_accum=s["grad_accum"], val_batches=val if procs.main else None,
                        eval_every=args.eval_every, eval_model=model)
    if resumed:
        checkpoints.load_optimizer(optimizer, resumed["tensors"])
        checkpoints.set_rng_states(resumed["tensors"], generator)
        loop.load_state_dict(resumed["state"]["loop"])
        was = resumed["trainer_state"]["world_size"]
        say(f"resuming from step {loop.step}" + (
            f" (the run began with world size {was}, now {procs.world_size}: equal to the "
            f"uninterrupted run up to rounding only)" if was != procs.world_size else ""))
        if loop.step >= s["steps"]:
            say(f"the run in {out} is complete: {loop.step} of {s['steps']} steps")
            return 0
    else:
        if procs.main:
            out.mkdir(parents=True, exist_ok=True)
        say(f"training a {model_class.__name__} of {_count(model):,} parameters on "
            f"{train_ids.numel():,} tokens ({val_ids.numel():,} held out), "
            f"{procs.world_size} process{'es' * (procs.world_size > 1)}")

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    def after_step(loop: TrainingLoop) -> None:
        h = loop.history
        if procs.main and h.steps and h.steps[-1] == loop.step:
            tqdm.tqdm.write(f"step {loop.step}: train loss {h.train_losses[-1]:.4f}, "
                            f"val loss {h.val_losses[-1]:.4f}", file=sys.stdout)
        if procs.main and (loop.step % args.save_every == 0 or loop.step == s["steps"]):
            tensors = {**checkpoints.optimizer_tensors(optimizer),
                       **checkpoints.rng_states(generator)}
            state = {"args": s, "data_sha256": digest, "loop": loop.state_dict()}
            checkpoints.save(out, step=loop.step, world_size=procs.world_size,
                             write_model=save, tensors=tensors, state=state)

    bar = tqdm.tqdm(total=s["steps"], initial=loop.step, desc="training", mininterval=0.5,
                    bar_format=BAR_FORMAT, disable=not procs.main or args.no_progress)
    with contextlib.closing(bar):
        loop.run(_micro_batches(train_ids, s, generator, procs), bar=bar,
                 after_step=after_step)
    say(f"saved {out} at step {loop.step}: validation loss "
        f"{loop.history.val_losses[-1]:.4f}" if loop.history.val_losses else f"saved {out}")
    return 0


def _architecture(arch: str) -> tuple[type, type]:
    """The model class and its config class for ``--arch``."""
    if arch == "llama":
        from minitransformer.llama import Llama, LlamaConfig
        return Llama, LlamaConfig
    return GPT, GPTConfig


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----- generate ---------------------------------------------------------------------------------

def _generate(args: argparse.Namespace) -> int:
    folder = Path(args.model)
    if not folder.is_dir():
        raise CommandLineError(f"--model {args.model}: no such directory")
    device = _device(args.device)
    tokenizer = BPETokenizer.from_pretrained(folder)
    config = folder / "config.json"
    model_type = checkpoints.read_json(config).get("model_type") if config.is_file() else None
    model_class = _architecture("llama" if model_type == "llama" else "gpt")[0]
    model = model_class.from_pretrained(folder, device=device)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise CommandLineError("--prompt is empty: give the text to continue")
    generator = torch.Generator(device).manual_seed(args.seed)
    room = model.config.context_length - len(ids)
    if room < 0:
        raise CommandLineError(f"--prompt is {len(ids)} tokens, more than the model's context "
                               f"of {model.config.context_length}")
    if args.max_new_tokens is None:          # the default: up to 40, as many as fit
        args.max_new_tokens = min(40, room)
    idx = torch.tensor([ids], device=device)
    out = generate(model, idx, args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, generator=generator)
    print(tokenizer.decode(out[0].tolist()))
    return 0
