"""``minitransformer dpo``: direct preference optimisation of a model that ``train`` or
``finetune`` wrote (chapter 17), in full or with LoRA, with the checkpoints and ``--resume`` of
``finetune``.

The data is TRL's preference format, one ``{"prompt": ..., "chosen": ..., "rejected": ...}``
per line, as plain strings or as lists of messages (chapter 16's template). The reference is
``--model`` itself, frozen; the batches are :func:`~minitransformer.preferences.dpo_batch`'s and
the loss :class:`~minitransformer.preferences.DPO`'s, in
:class:`~minitransformer.training.TrainingLoop`. The run's directory is always a plain model
directory that transformers loads: with ``--lora-rank``, the adapter merged into the weights
(its A and B are kept in the checkpoint's training state, for ``--resume``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import tqdm

from minitransformer import checkpoints
from minitransformer.cli.common import (
    CommandLineError,
    Processes,
    TuneSettings,
    add_checkpoint_flags,
    add_lora_flags,
    add_model_flags,
    add_schedule_flags,
    check_lora_flags,
    defaults_epilog,
    file_sha256,
    in_processes,
    load_chat_model,
    number,
    read_json_lines,
    restore_checkpoint,
    save_checkpoint,
    set_threads,
    settings_defaults,
    tune_settings,
)
from minitransformer.cli.finetune import LORA_TARGETS, _add_lora, _write_merged
from minitransformer.lora import (
    ADAPTER_CONFIG_FILE,
    merge_lora,
    trainable_parameters,
)
from minitransformer.preferences import (
    DPO,
    check_pair,
    dpo_batches,
    encode_pair,
    identical_pairs_warning,
)
from minitransformer.training import BAR_FORMAT, TrainingLoop, make_optimizer


@dataclass
class Settings(TuneSettings):
    """The flags that decide a ``dpo`` run: :class:`~minitransformer.cli.common.TuneSettings`'s
    and beta (TRL's default)."""

    lr: float = 1e-4
    beta: float = 0.1


#: What a new run uses for a flag that is not given.
DEFAULTS = settings_defaults(Settings)
#: The LoRA matrices' names in the checkpoint's training state.
LORA_PREFIX = "lora."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Direct preference optimisation against a frozen copy of --model, on TRL's preference "
        "format: one {\"prompt\": ..., \"chosen\": ..., \"rejected\": ...} per line, plain "
        "strings or lists of messages. Prints the loss (ln 2 = 0.6931 at the first step) and "
        "the reward accuracy; --out is a model directory transformers loads (with --lora-rank, "
        "the adapter merged). Checkpoints and --resume work as for finetune.")
    parser.epilog = defaults_epilog(DEFAULTS)
    parser.add_argument("--data", metavar="FILE", help="the preference pairs, JSON lines")
    parser.add_argument("--beta", type=number, help="how strongly the policy is held near "
                        "the reference (> 0)")
    add_checkpoint_flags(parser, out="the run's directory, a model directory")
    add_schedule_flags(parser, batch="preference pairs per update", seeds="seeds the batches "
                       "(and LoRA's A)", log_every=10, logged="the losses printed (the first "
                       "step is always printed)")
    add_lora_flags(parser, targets=LORA_TARGETS, rank="--out is still a model directory, the "
                   "adapter merged into it")
    add_model_flags(parser, "the starting policy and the reference: a directory written by "
                    "train or finetune (its tokenizer has the chat tokens)",
                    threads="CPU threads (as for train)")


def run(args: argparse.Namespace) -> int:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:     # before any process group is made
        raise CommandLineError("dpo runs in one process: torchrun is not supported")
    return in_processes(_run, args)


def _settings(args: argparse.Namespace, out: Path) -> tuple[Settings, dict | None]:
    """The run's flags and, with --resume, the checkpoint to continue (as ``finetune``)."""
    return tune_settings(Settings, "dpo", args, out, _check_state, check_values=_check_values)


def _check_values(given: dict) -> None:
    for key in ("beta", "lr", "lora_alpha"):
        if key in given and not 0 < given[key] < math.inf:     # also refuses nan
            raise CommandLineError(f"--{key.replace('_', '-')} must be positive, got "
                                   f"{given[key]}")
    largest = torch.finfo(torch.float32).max
    if given.get("beta", 0) > largest:
        raise CommandLineError(f"--beta {given['beta']} is past float32's largest number "
                               f"({largest:.3g}): the loss would be nan from the first step "
                               f"(TRL's default is 0.1)")


def _check_state(state: dict, path: Path) -> None:
    """Refuse a ``training_state.json`` that is not what this command writes."""
    args, loop = state.get("args"), state.get("loop")
    whole = {"steps", "batch_size", "seed", "warmup_steps"}
    ok = (isinstance(args, dict) and isinstance(loop, dict) and state.get("command") == "dpo"
          and all(isinstance(args.get(k), int) and args[k] >= 1 - (k == "seed") for k in whole)
          and all(isinstance(args.get(k), str) for k in ("model", "data"))
          and all(isinstance(args.get(k), (int, float)) and args[k] > 0 for k in ("lr", "beta"))
          and (args.get("lora_rank") is None or isinstance(args["lora_rank"], int))
          and isinstance(loop.get("step"), int) and isinstance(state.get("data_sha256"), str)
          and isinstance(state.get("model_sha256"), str))
    if not ok:
        raise CommandLineError(f"{path} is not what dpo writes (edited or damaged?)")


def _read_pairs(path: str) -> tuple[list[tuple[int, dict]], str]:
    """Each line's number and preference pair, and the file's SHA-256. Blank lines are
    skipped."""
    records, digest = read_json_lines(path)
    pairs = []
    for n, record in records:
        try:
            check_pair(record, f"--data {path}:{n}")
        except (TypeError, ValueError) as exc:
            raise CommandLineError(str(exc)) from None
        pairs.append((n, record))
    if not pairs:
        raise CommandLineError(f"--data {path} is empty: it needs one {{\"prompt\": ..., "
                               f"\"chosen\": ..., \"rejected\": ...}} per line")
    return pairs, digest


def _check_pairs(tokenizer, pairs: list[tuple[int, dict]], context_length: int,
                 path: str) -> int:
    """Refuse, by file and line, a pair that the template or the model's context cannot hold;
    the number of response tokens."""
    count = 0
    for n, pair in pairs:
        try:
            _, chosen, rejected = encode_pair(tokenizer, pair, context_length=context_length)
        except (TypeError, ValueError) as exc:
            raise CommandLineError(f"--data {path}:{n}: {exc}") from None
        count += len(chosen) + len(rejected)
    return count


def _lora_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {LORA_PREFIX + k: v for k, v in model.state_dict().items() if ".lora_" in k}


def _load_lora(model: torch.nn.Module, tensors: dict, folder: Path) -> None:
    """The checkpoint's A and B into the LoRA layers just added, exactly."""
    mine = _lora_state(model)
    saved = {k: v for k, v in tensors.items() if k.startswith(LORA_PREFIX)}
    if saved.keys() != mine.keys() or any(saved[k].shape != v.shape for k, v in mine.items()):
        raise CommandLineError(f"{folder / checkpoints.TENSORS_FILE} does not hold this run's "
                               f"LoRA matrices (edited or damaged?)")
    model.load_state_dict({k[len(LORA_PREFIX):]: v for k, v in saved.items()}, strict=False)


def _run(args: argparse.Namespace, procs: Processes) -> int:
    out = Path(args.out)
    s, resumed = _settings(args, out)
    lora = s.lora_rank is not None
    check_lora_flags(args, lora)
    pairs, digest = _read_pairs(s.data)
    if resumed and digest != resumed["state"]["data_sha256"]:
        raise CommandLineError(f"--data {s.data} changed since the run began (its SHA-256 "
                               f"differs): a resumed run must read the same pairs")
    count, how = set_threads(args.threads, resumed and resumed["state"].get("threads"), procs)

    folder = Path(s.model)
    if (folder.is_dir() and not (folder / "config.json").is_file()
            and not (folder / ADAPTER_CONFIG_FILE).is_file()):
        raise CommandLineError(f"--model {s.model} is not a model directory (it has no "
                               f"config.json): give one that train or finetune wrote")
    torch.manual_seed(s.seed)
    reference, tokenizer = load_chat_model(s.model, procs.device)      # --model: refused by name
    model_file = Path(s.model) / "model.safetensors"
    model_sha256 = file_sha256(model_file) if model_file.is_file() else ""
    if resumed and model_sha256 != resumed["state"]["model_sha256"]:
        raise CommandLineError(f"--model {s.model} changed since the run began (its "
                               f"model.safetensors differs): it is the run's reference")
    if resumed and not lora:
        policy = type(reference).from_pretrained(resumed["folder"], device=procs.device)
    else:
        policy = copy.deepcopy(reference)
    if lora:
        if s.lora_alpha is None:     # PEFT's r = alpha; runs before the flag: the same
            s.lora_alpha = float(s.lora_rank)
        s.lora_targets = s.lora_targets or LORA_TARGETS[type(policy).__name__]
        _add_lora(policy, s)
        if resumed:
            _load_lora(policy, resumed["tensors"], resumed["folder"])
    context = policy.config.context_length
    tokens = _check_pairs(tokenizer, pairs, context, s.data)
    same = identical_pairs_warning([pair for _, pair in pairs],
                                   labels=[f"line {n}" for n, _ in pairs])
    if same is not None and not resumed:
        print(f"warning: --data {s.data}: {same}", file=sys.stderr)
    dpo = DPO(policy, reference, beta=s.beta)
    generator = torch.Generator().manual_seed(s.seed)
    optimizer = make_optimizer(dpo, s.lr, 0.0)       # no weight decay, as TRL
    loop = TrainingLoop(dpo, optimizer, steps=s.steps, lr=s.lr,
                        warmup_steps=s.warmup_steps, eval_every=args.log_every)
    if resumed:
        restore_checkpoint(out, resumed, loop, optimizer, generator, procs)
        print(f"resuming from step {loop.step}, {how}")
        if resumed["note"]:
            print(resumed["note"])
    else:
        out.mkdir(parents=True, exist_ok=True)
        trainable, total = trainable_parameters(policy)
        what = (f"LoRA of rank {s.lora_rank} on "
                f"{', '.join(s.lora_targets)}" if lora else "every weight")
        print(f"DPO of a {type(policy).__name__} against its frozen copy (beta {s.beta}): "
              f"{trainable:,} of {total:,} parameters train ({what}), on {len(pairs):,} "
              f"preference pairs ({tokens:,} response tokens), {how}")

    def write_model(folder: Path) -> None:
        (merge_lora(copy.deepcopy(policy)) if lora else policy).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    totals = {"loss": 0.0, "reward_accuracy": 0.0, "steps": 0}

    def after_step(loop: TrainingLoop) -> None:
        for key in ("loss", "reward_accuracy"):
            totals[key] += dpo.metrics[key]
        totals["steps"] += 1
        if loop.step == 1 or loop.step % args.log_every == 0 or loop.step == s.steps:
            k = totals["steps"]
            tqdm.tqdm.write(f"step {loop.step}: loss {totals['loss'] / k:.4f}, reward "
                            f"accuracy {totals['reward_accuracy'] / k:.2f}"
                            + (f" (mean of {k} steps)" if k > 1 else ""), file=sys.stdout)
            totals.update(loss=0.0, reward_accuracy=0.0, steps=0)
        if loop.step % args.save_every == 0 or loop.step == s.steps:
            save_checkpoint(out, loop, optimizer, generator, procs, write_model=write_model,
                            state={"command": "dpo", "args": asdict(s), "data_sha256": digest,
                                   "model_sha256": model_sha256, "threads": count},
                            tensors=_lora_state(policy) if lora else None)

    if loop.step < s.steps:
        batches = dpo_batches(tokenizer, [pair for _, pair in pairs],
                              batch_size=s.batch_size, generator=generator,
                              context_length=context, device=procs.device)
        bar = tqdm.tqdm(total=s.steps, initial=loop.step, desc="dpo", mininterval=0.5,
                        bar_format=BAR_FORMAT, disable=args.no_progress)
        with contextlib.closing(bar):
            loop.run(batches, bar=bar, after_step=after_step)
        print(f"saved {out} at step {loop.step}: a model directory transformers loads"
              + (" (the LoRA adapter merged into it)" if lora else ""))
    else:
        print(f"the run in {out} is complete: {loop.step} of {s.steps} steps")
    if args.merge:
        print(f"wrote the merged model also to {_write_merged(out, policy, tokenizer)}")
    return 0
