"""``minitransformer train``: a tokenizer and a model trained on a text file, with checkpoints
that ``--resume`` continues bit for bit, on one process or several under ``torchrun``.

``--data FILE`` is first prepared into ``OUT/data`` (token files, as ``prepare`` writes them)
and read from there as memory maps, as ``--data DATA_DIR`` is: memory does not grow with the
text. A run begun before this (no ``OUT/data``) resumes as it began, from the text in memory."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import tqdm

from minitransformer import checkpoints
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import CHAT_TOKENS
from minitransformer.cli.common import (
    CommandLineError,
    Processes,
    add_checkpoint_flags,
    add_model_flags,
    add_schedule_flags,
    architecture,
    check_new_out,
    check_resumable,
    check_same_flags,
    defaults_epilog,
    distributed,
    in_processes,
    mean_over_ranks,
    number,
    positive,
    read_text,
    restore_checkpoint,
    save_checkpoint,
    set_threads,
)
from minitransformer.data import random_batches, window_batches
from minitransformer.models import ARCHITECTURES
from minitransformer.token_files import (
    INDEX_FILE,
    LEAST_VOCAB_SIZE,
    MARKER,
    TokenFiles,
    discard,
    prepare,
    random_windows,
    val_windows,
)
from minitransformer.training import (
    BAR_FORMAT,
    SCHEDULES,
    TrainingLoop,
    make_optimizer,
    wsd_decay_start,
)

ARCHS = tuple(ARCHITECTURES)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass
class Settings:
    """The flags that decide a run: a new run's from the command line, else the defaults
    below (a model that trains on the book's corpus, 175 kB, in about half a minute on two
    CPU cores: 21.5 s measured on a quiet machine); a resumed run's from its checkpoint, where
    they are saved as ``args``."""

    data: str
    arch: str = "gpt"
    steps: int = 300
    batch_size: int = 16
    context_length: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_model: int = 128
    vocab_size: int = 512
    lr: float = 3e-3
    seed: int = 0
    grad_accum: int = 1
    dropout: float = 0.0
    dtype: str = "float32"
    schedule: str = "cosine"
    warmup_steps: int | None = None     # None: a tenth of the run, 1 to 100 steps

    def __post_init__(self) -> None:
        if self.warmup_steps is None:
            self.warmup_steps = max(1, min(100, self.steps // 10))


#: What a new run uses for a flag that is not given (its --help lists them).
DEFAULTS = {f.name: f.default for f in fields(Settings) if f.name not in ("data", "warmup_steps")}
#: Flags that decide the run: on --resume they come from the checkpoint, and a different value
#: given on the command line is refused (the result could no longer be bit-identical), except
#: a larger --steps, which extends the run (see _extend).
RUN_FLAGS = tuple(f.name for f in fields(Settings))
VAL_FRACTION = 0.1      # the end of the data, held out for the validation loss
DATA_DIR = "data"       # --data FILE is prepared into this directory of --out, then read
EVAL_BATCHES = 20       # at most this many validation batches, the same at every evaluation


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train a byte-level BPE tokenizer and a GPT on a UTF-8 text file, saving checkpoints "
        "that --resume continues bit for bit. Under torchrun, every process trains on its "
        "slice of the same global batch (DistributedDataParallel).")
    parser.epilog = defaults_epilog(DEFAULTS)
    parser.add_argument("--data", metavar="FILE|DATA_DIR", help="UTF-8 text to train on, "
                        "tokenized first into OUT/data (its last 10%% held out for the "
                        "validation loss); or a directory made by prepare, read as memory maps")
    add_checkpoint_flags(parser, out="the run's directory: transformers loads it (config.json, "
                         "model.safetensors, tokenizer files)")
    model = parser.add_argument_group("the model")
    add = model.add_argument
    add("--arch", choices=ARCHS, help="the model: GPT-2's (chapter 9) or Llama's (chapter 14)")
    add("--context-length", type=positive, help="tokens per sequence")
    add("--num-layers", type=positive, help="transformer blocks")
    add("--num-heads", type=positive, help="attention heads; must divide --d-model")
    add("--d-model", type=positive, help="width of every token vector")
    add("--vocab-size", type=positive, help="tokens of the BPE tokenizer, counting its 256 "
        "byte tokens and the 5 special tokens of the chat format that it reserves for "
        "finetune")
    add("--dropout", type=number, help="dropout probability (processes agree exactly only "
        "with 0)")
    add("--dtype", choices=tuple(DTYPES), help="the weights' precision")
    schedule = add_schedule_flags(parser, batch="the global batch: sequences per update, over all "
                       "processes and accumulation steps", seeds="seeds the weights and the "
                       "batches", log_every=50, logged="the losses printed, training and "
                       "validation")
    add = schedule.add_argument
    add("--schedule", choices=tuple(SCHEDULES), help="the learning rate after the warm-up: a "
        "cosine decay to lr/10, or warm-up-stable-decay (lr, then a linear decay to lr/10 "
        "over the last fifth), which --resume --steps N extends bit for bit")
    add("--warmup-steps", type=positive, help="steps of linear warm-up (default: a tenth of "
        "--steps, 1 to 100)")
    add("--grad-accum", type=positive, help="micro-batches per update (same update as one "
        "batch that many times larger)")
    add_model_flags(parser, None, threads="CPU threads per process (default: OMP_NUM_THREADS, "
                    "else the cores idle now; a resumed run keeps its count)")


def run(args: argparse.Namespace) -> int:
    return in_processes(_run, args)


def _settings(args: argparse.Namespace, out: Path, *,
              write: bool) -> tuple[Settings, dict | None]:
    """The run's flags (``RUN_FLAGS``) and, with --resume, the checkpoint to continue:
    ``(settings, resumed)`` where ``resumed`` holds the trainer state, folder, state, tensors
    and a note to print. ``write``: this process may write files (rank 0)."""
    given = {k: getattr(args, k) for k in RUN_FLAGS if getattr(args, k) is not None}
    if "data" in given:
        given["data"] = os.path.abspath(given["data"])
    if not args.resume:
        if "data" not in given:
            check_new_out(out, write=False)
            raise CommandLineError("train needs --data FILE, the UTF-8 text to train on, or "
                                   "--data DATA_DIR, a directory made by prepare")
        left = not Path(given["data"]).is_dir() and _discard_data(out, write=write)
        if write or not left:   # the other processes leave the rest to the writing one
            check_new_out(out, write=write)
        return Settings(**given), None
    if _discard_data(out, write=False):     # OUT/data of a run killed before its first save
        raise CommandLineError(f"nothing to resume in {out}: no checkpoint was finished "
                               f"there; the same command without --resume starts the run")
    check_resumable(out)
    trainer_state, folder = checkpoints.latest(out)
    state, tensors = checkpoints.load_tensors(folder)
    _check_state(state, folder / checkpoints.JSON_FILE)
    settings = Settings(**state["args"])        # runs saved before --schedule: cosine
    check_same_flags(given, asdict(settings))
    resumed = {"trainer_state": trainer_state, "folder": folder, "state": state,
               "tensors": tensors, "note": ""}
    if given.get("steps", settings.steps) > settings.steps:
        resumed = _extend(out, settings, given["steps"], resumed, write=write)
        settings.steps = given["steps"]
    return settings, resumed


def _discard_data(out: Path, *, write: bool) -> bool:
    """Whether ``out`` holds no run but a prepared ``out/data`` (complete or not): what a new
    run with --data FILE killed before its first checkpoint leaves. The writing process
    removes it (``prepare``'s files only), to prepare it again."""
    data = out / DATA_DIR
    if (out / checkpoints.STATE_FILE).exists() or not (
            (data / MARKER).exists() or (data / INDEX_FILE).exists()):
        return False
    if write:
        discard(data)
    return True


def _a(name: str) -> str:
    """``name`` with its article: 'an int', 'a str'."""
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _check_state(state: dict, path: Path) -> None:
    """Refuse a ``training_state.json`` that is not what this program writes (edited by hand,
    or damaged), naming the first key that is missing or of the wrong type."""
    whole, number = (int,), (int, float)
    expected = {
        "args": dict, "data_sha256": str, "loop": dict,
        "args.data": str, **{f"args.{k}": (number if isinstance(v, float) else type(v))
                             for k, v in DEFAULTS.items()},
        "loop.step": whole, "loop.running_loss": number, "loop.since": whole,
        "loop.history": dict, **{f"loop.history.{k}": list for k in
                                 ("steps", "train_losses", "val_losses", "learning_rates")},
    }
    optional = {"args.schedule", "args.warmup_steps", "threads"}     # older runs lack them
    expected.update({"args.warmup_steps": whole, "threads": whole})
    absent = object()
    for key, kind in expected.items():
        value, parts = state, key.split(".")
        for part in parts:
            value = value.get(part, absent) if isinstance(value, dict) else absent
        if value is absent and key in optional:
            continue
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            found = ("missing" if value is absent else "null" if value is None
                     else _a(type(value).__name__))
            raise CommandLineError(f"{path} is not what this program writes (edited or "
                                   f"damaged?): {key} is {found}, not "
                                   f"{' or '.join(_a(k.__name__) for k in kinds)}")
    args = state["args"]
    unknown = sorted(set(args) - set(RUN_FLAGS))
    if unknown:
        raise CommandLineError(f"{path} is not what this program writes (edited or "
                               f"damaged?): args.{unknown[0]} is not a flag of train")
    choices = {"arch": ARCHS, "dtype": tuple(DTYPES), "schedule": tuple(SCHEDULES)}
    for key, allowed in choices.items():
        if args.get(key, allowed[0]) not in allowed:
            raise CommandLineError(f"{path} is not what this program writes (edited or "
                                   f"damaged?): args.{key} is {args[key]!r}, not one of "
                                   f"{', '.join(allowed)}")
    for key in ("steps", "batch_size", "context_length", "num_layers", "num_heads", "d_model",
                "vocab_size", "grad_accum", "warmup_steps"):
        if args.get(key, 1) < 1:
            raise CommandLineError(f"{path} is not what this program writes (edited or "
                                   f"damaged?): args.{key} is {args[key]}, not at least 1")
    history = state["loop"]["history"]
    if not all(isinstance(x, (int, float)) for k in history for x in history[k]) or (
            len(history["learning_rates"]) != state["loop"]["step"]):
        raise CommandLineError(f"{path} is not what this program writes (edited or "
                               f"damaged?): loop.history does not match loop.step")
    if set(history) != {"steps", "train_losses", "val_losses", "learning_rates"}:
        raise CommandLineError(f"{path} is not what this program writes (edited or "
                               f"damaged?): loop.history has other keys")


def _extend(out: Path, s: Settings, steps: int, resumed: dict, *, write: bool) -> dict:
    """``--resume --steps N`` beyond the run's ``--steps``: the checkpoint to go on from.

    The cosine schedule depends on the run's length at every step, so a stretched run goes on
    from its last checkpoint on a new curve: the rate jumps back up and decays again, and the
    result equals neither the shorter run nor a run begun with N steps. The WSD schedule's
    rates do not depend on the length before its decay, so a WSD run goes back to the
    checkpoint kept where its decay began and is from there on the N-step run, bit for bit."""
    step, old = resumed["state"]["loop"]["step"], s.steps
    if s.schedule != "wsd":
        rate = SCHEDULES["cosine"]
        was = rate(min(step, old - 1), steps=old, lr=s.lr, warmup_steps=s.warmup_steps)
        now = rate(step, steps=steps, lr=s.lr, warmup_steps=s.warmup_steps)
        resumed["note"] = (f"extending the run from {old} to {steps} steps: the cosine "
                           f"schedule is stretched, so the learning rate goes from {was:.3g} "
                           f"to {now:.3g} at step {step + 1} and decays again; the result is "
                           f"neither the {old}-step run nor a {steps}-step one (--schedule wsd "
                           f"extends without changing the steps before its decay)")
        return resumed
    start = wsd_decay_start(old, warmup_steps=s.warmup_steps)
    note = (f"extending the run from {old} to {steps} steps: the stable phase goes on, the "
            f"decay moves to the end")
    if step <= start:
        resumed["note"] = note
        return resumed
    name = f"ckpt-{start}"
    try:
        _, folder = checkpoints.latest(out, name=name)
    except FileNotFoundError:
        raise CommandLineError(f"cannot extend the run in {out}: its checkpoint {name}, where "
                               f"its decay began, is gone") from None
    state, tensors = checkpoints.load_tensors(folder)
    _check_state(state, folder / checkpoints.JSON_FILE)
    if state["args"]["steps"] != old:
        raise CommandLineError(f"cannot extend the run in {out}: {name} is not the one this "
                               f"run kept where its decay began")
    if write:
        checkpoints.point_to(out, folder, world_size=resumed["trainer_state"]["world_size"])
    return {"trainer_state": resumed["trainer_state"], "folder": folder, "state": state,
            "tensors": tensors, "note": f"{note}: going back to step {start}, where the decay "
            f"began ({name}), to train steps {start + 1}-{steps} as a {steps}-step run does"}


def _check(s: Settings, world_size: int) -> None:
    """Refuse flags that cannot make a run, naming them."""
    if s.d_model % s.num_heads:
        raise CommandLineError(f"--num-heads {s.num_heads} does not divide --d-model "
                               f"{s.d_model}")
    if s.vocab_size < 256:
        raise CommandLineError(f"--vocab-size must be at least 256 (the byte tokens), got "
                               f"{s.vocab_size}")     # and the chat tokens: see _size_note
    if not 1 <= s.warmup_steps <= s.steps:
        raise CommandLineError(f"--warmup-steps must be from 1 to --steps {s.steps}, got "
                               f"{s.warmup_steps}")
    if not s.lr > 0:
        raise CommandLineError(f"--lr must be positive, got {s.lr}")
    if not 0 <= s.dropout < 1:
        raise CommandLineError(f"--dropout must be in [0, 1), got {s.dropout}")
    parts = world_size * s.grad_accum
    if s.batch_size % parts:
        raise CommandLineError(f"--batch-size {s.batch_size} is not divisible by world "
                               f"size {world_size} x --grad-accum {s.grad_accum} = {parts}")


def _check_file(path: str) -> None:
    """Refuse a --data FILE that is missing, or empty (nothing but white space), reading no
    more of it than the first stretch that is not white space."""
    file = Path(path)
    if not file.is_file():
        raise CommandLineError(f"--data {path}: no such file")
    with open(file, "rb") as f:
        while block := f.read(1 << 20):
            if block.strip():
                return
    raise CommandLineError(f"--data {path} is empty")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _prepare_file(path: str, prepared: Path, s: Settings, procs: Processes, *,
                  progress: bool, again: bool = False) -> None:
    """--data FILE: the writing process tokenizes the text once into ``prepared`` (``OUT/data``:
    a prepared directory, as ``prepare`` makes, read as memory maps like --data DATA_DIR), so
    memory stays bounded whatever the file's size; the others wait for it and share its
    outcome. The tokenizer is learned with --vocab-size tokens (at least the bytes and the chat
    tokens) from ``prepare``'s sample: the whole text up to 8 MB. ``again``: what ``prepare``
    wrote there before is removed first; a directory it did not write is refused."""
    error = None
    if procs.main:
        made = not prepared.parent.exists()
        try:
            if again and prepared.exists() and not discard(prepared):
                error = (f"{prepared} is not a prepared directory: move it away, and --resume "
                         f"prepares the run's text there again")
            else:
                prepare(path, prepared, vocab_size=max(s.vocab_size, LEAST_VOCAB_SIZE),
                        val_fraction=VAL_FRACTION, seed=s.seed, progress=progress)
        except (ValueError, OSError) as exc:
            error = f"--data {exc}"
        if error is not None and made and prepared.parent.is_dir() and not any(
                prepared.parent.iterdir()):
            prepared.parent.rmdir()            # --out, made by prepare and left empty
    error = _from_rank_zero(error, procs)
    if error is not None:
        raise CommandLineError(error)


def _complete(prepared: Path, digest: str) -> bool:
    """Whether ``prepared`` is a complete prepared directory of the text of SHA-256 ``digest``."""
    try:
        files = TokenFiles(prepared)
    except ValueError:
        return False
    return [source["sha256"] for source in files.index["sources"]] == [digest]


def _from_rank_zero(value, procs: Processes):
    """``value`` as the writing process has it, in every process (one decision for all)."""
    if procs.world_size == 1:
        return value
    import torch.distributed as dist
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _size_note(vocab_size: int, tokenizer: BPETokenizer) -> str:
    """What the run says when its tokenizer does not have the --vocab-size asked for."""
    if vocab_size < LEAST_VOCAB_SIZE:
        return (f"--vocab-size {vocab_size:,}: the 256 byte tokens and the "
                f"{len(CHAT_TOKENS)} chat tokens need {LEAST_VOCAB_SIZE}, so the tokenizer and "
                f"the model have {len(tokenizer)} tokens")
    if len(tokenizer) < vocab_size:
        return (f"--vocab-size {vocab_size:,}: the text holds no more pairs to merge after "
                f"{len(tokenizer.merges):,} merges, so the tokenizer and the model have "
                f"{len(tokenizer):,} tokens")
    return ""


def _read_text(path: str) -> tuple[str, str]:
    """The text of the data file and its SHA-256."""
    text, digest = read_text(path)
    if not text.strip():
        raise CommandLineError(f"--data {path} is empty")
    return text, digest


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


def _micro_batches(stream: torch.Tensor, s: Settings, generator: torch.Generator,
                   procs: Processes) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every process draws the same global batch from the same generator and keeps its slice,
    cut into ``grad_accum`` micro-batches. The generator's state is the data position."""
    share = s.batch_size // procs.world_size
    micro = share // s.grad_accum
    for inputs, targets in random_batches(stream, batch_size=s.batch_size,
                                          context_length=s.context_length,
                                          generator=generator):
        mine = slice(procs.rank * share, (procs.rank + 1) * share)     # (B / world, T)
        inputs, targets = inputs[mine], targets[mine]
        for m in range(0, share, micro):
            yield (inputs[m:m + micro].to(procs.device), targets[m:m + micro].to(procs.device))


def _prepared(path: str | Path, s: Settings, vocab_given: bool, *,
              vocab: bool = True) -> tuple[TokenFiles, str]:
    """The prepared directory ``--data DATA_DIR`` (made by ``prepare``) and the SHA-256 of its
    index; ``s.vocab_size`` becomes its tokenizer's (unless not ``vocab``: --data FILE,
    where it stays the size asked for)."""
    try:
        files = TokenFiles(path)
    except ValueError as exc:
        raise CommandLineError(f"--data {exc}") from None
    if vocab_given and s.vocab_size != len(files.tokenizer):
        raise CommandLineError(f"--vocab-size {s.vocab_size} differs from the "
                               f"{len(files.tokenizer)} tokens of {path}'s tokenizer (leave "
                               f"--vocab-size out with a prepared directory)")
    if vocab:
        s.vocab_size = len(files.tokenizer)
    window = s.context_length + 1
    for part, tokens in (("train", files.train), ("val", files.val)):
        if len(tokens) < window:
            raise CommandLineError(f"--data {path} holds {len(tokens)} {part} tokens, too few "
                                   f"for a window of --context-length + 1 = {window} tokens")
    digest = hashlib.sha256((Path(path) / INDEX_FILE).read_bytes()).hexdigest()
    return files, digest


def _prepared_micro_batches(tokens, s: Settings, generator: torch.Generator,
                            procs: Processes) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """As ``_micro_batches``, from the memory map: the same global batch in every process,
    each reading only its own rows."""
    share = s.batch_size // procs.world_size
    micro = share // s.grad_accum
    for inputs, targets in random_windows(tokens, batch_size=s.batch_size,
                                          context_length=s.context_length,
                                          generator=generator, rank=procs.rank,
                                          world_size=procs.world_size):
        for m in range(0, share, micro):
            yield (inputs[m:m + micro].to(procs.device), targets[m:m + micro].to(procs.device))


def _run(args: argparse.Namespace, procs: Processes) -> int:
    out = Path(args.out)
    say = print if procs.main else (lambda *a, **k: None)
    s, resumed = _settings(args, out, write=procs.main)
    _check(s, procs.world_size)
    generator = torch.Generator().manual_seed(s.seed)
    size_note = ""
    prepared = out / DATA_DIR
    if Path(s.data).is_dir():
        files, digest = _prepared(s.data, s, args.vocab_size is not None and not resumed)
    elif resumed and resumed["state"].get("prepared") != DATA_DIR:
        files = None            # a run begun before train prepared its text: as it began
        text, digest = _read_text(s.data)
    else:
        _check_file(s.data)
        if resumed:
            digest = _sha256(s.data)
            if digest != resumed["state"]["data_sha256"]:
                raise CommandLineError(f"--data {s.data} changed since the run began (its "
                                       f"SHA-256 differs): a resumed run must read the same "
                                       f"text")
        again = bool(resumed) and _from_rank_zero(not _complete(prepared, digest), procs)
        if again:           # OUT/data removed or damaged: the same prepare makes the same files
            say(f"preparing {prepared} again: it is missing or incomplete")
        if not resumed or again:
            _prepare_file(s.data, prepared, s, procs, progress=not args.no_progress,
                          again=again)
        files, _ = _prepared(prepared, s, False, vocab=False)
        digest = files.index["sources"][0]["sha256"]
        if resumed and (prepared / "vocab.json").read_bytes() != (
                resumed["folder"] / "vocab.json").read_bytes():
            raise CommandLineError(f"{prepared} holds another tokenizer than the run's "
                                   f"checkpoint: resume in the version of the program that "
                                   f"began the run")
        size_note = _size_note(s.vocab_size, files.tokenizer)
    if resumed and digest != resumed["state"]["data_sha256"]:
        raise CommandLineError(f"--data {s.data} changed since the run began (its "
                               f"SHA-256 differs): a resumed run must read the same text")
    if files is not None:
        tokenizer = files.tokenizer
        batches = _prepared_micro_batches(files.train, s, generator, procs)
        val = val_windows(files.val, batch_size=s.batch_size,
                          context_length=s.context_length, max_batches=EVAL_BATCHES)
        counts = len(files.train), len(files.val)
    else:
        tokenizer = BPETokenizer.from_pretrained(resumed["folder"])
        train_ids, val_ids = _split(tokenizer.encode(text), s.context_length, s.data)
        batches = _micro_batches(train_ids, s, generator, procs)
        val = window_batches(val_ids, batch_size=s.batch_size,
                             context_length=s.context_length)[:EVAL_BATCHES]
        counts = train_ids.numel(), val_ids.numel()
    prepared_file = files is not None and not Path(s.data).is_dir()
    began = resumed["state"].get("threads") if resumed else None
    count, how = set_threads(args.threads, began, procs)
    dtype = DTYPES[s.dtype]

    torch.manual_seed(s.seed)
    model_class, config_class = architecture(s.arch)
    if resumed:
        model = model_class.from_pretrained(resumed["folder"], device=procs.device, dtype=dtype)
    else:
        config = config_class(vocab_size=len(tokenizer), context_length=s.context_length,
                              num_layers=s.num_layers, num_heads=s.num_heads,
                              d_model=s.d_model, dropout=s.dropout)
        model = model_class(config, device=procs.device, dtype=dtype)
    optimizer = make_optimizer(model, s.lr, 0.1)
    wrapped = distributed(model, procs)
    val = [(x.to(procs.device), y.to(procs.device)) for x, y in val]
    loop = TrainingLoop(wrapped, optimizer, steps=s.steps, lr=s.lr,
                        warmup_steps=s.warmup_steps, schedule=s.schedule,
                        grad_accum=s.grad_accum, val_batches=val if procs.main else None,
                        eval_every=args.log_every, eval_model=model,
                        mean_loss=mean_over_ranks(procs))
    #: WSD: the checkpoint where the decay begins is kept, to extend the run from (_extend)
    stable = (wsd_decay_start(s.steps, warmup_steps=s.warmup_steps)
              if s.schedule == "wsd" else None)
    keep = () if stable is None else (f"ckpt-{stable}",)
    if resumed:
        restore_checkpoint(out, resumed, loop, optimizer, generator, procs, keep=keep)
        was = resumed["trainer_state"]["world_size"]
        changed = [f"world size {was}, now {procs.world_size}"] if was != procs.world_size else []
        if began and began != count:
            changed.append(f"{began} threads per process, now {count}")
        say(f"resuming from step {loop.step}, {how}" + (
            f" (the run began with {' and '.join(changed)}: equal to the uninterrupted run up "
            f"to rounding only)" if changed else ""))
        if resumed["note"]:
            say(resumed["note"])
        if loop.step >= s.steps:
            say(f"the run in {out} is complete: {loop.step} of {s.steps} steps")
            return 0
    else:
        if procs.main:
            out.mkdir(parents=True, exist_ok=True)
        say(f"training a {model_class.__name__} of {_count(model):,} parameters on "
            f"{counts[0]:,} tokens ({counts[1]:,} held out), "
            f"{procs.world_size} process{'es' * (procs.world_size > 1)} of {how}")
        if size_note:
            say(size_note)

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    def after_step(loop: TrainingLoop) -> None:
        h = loop.history
        if procs.main and h.steps and h.steps[-1] == loop.step:
            tqdm.tqdm.write(f"step {loop.step}: train loss {h.train_losses[-1]:.4f}, "
                            f"val loss {h.val_losses[-1]:.4f}", file=sys.stdout)
        if procs.main and (loop.step % args.save_every == 0 or loop.step in (s.steps, stable)):
            save_checkpoint(out, loop, optimizer, generator, procs, write_model=save,
                            state={"args": asdict(s), "data_sha256": digest, "threads": count,
                                   **({"prepared": DATA_DIR} if prepared_file else {})},
                            keep=keep)

    bar = tqdm.tqdm(total=s.steps, initial=loop.step, desc="training", mininterval=0.5,
                    bar_format=BAR_FORMAT, disable=not procs.main or args.no_progress)
    with contextlib.closing(bar):
        loop.run(batches, bar=bar, after_step=after_step)
    say(f"saved {out} at step {loop.step}: validation loss "
        f"{loop.history.val_losses[-1]:.4f}" if loop.history.val_losses else f"saved {out}")
    return 0


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
