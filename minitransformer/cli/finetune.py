"""``minitransformer finetune``: supervised fine-tuning of a model that ``train`` wrote, on
conversations (chapter 16), in full or with LoRA, with the checkpoints, ``--resume`` and
``torchrun`` of ``train``.

The data is TRL's and OpenAI's conversational format, one ``{"messages": [...]}`` per line. The
batches are :func:`~minitransformer.sft.sft_batch`'s (labels on the assistant's tokens and its
end-of-turn token only), and the loop is :class:`~minitransformer.training.TrainingLoop`.
Without ``--lora-rank`` the run's directory is a model directory as ``train`` writes; with it,
an adapter in PEFT's layout (and, with ``--merge``, the merged model in ``merged/``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import tqdm
from torch import nn

from minitransformer.bpe import BPETokenizer
from minitransformer.chat import encode_chat
from minitransformer.cli.common import (
    CommandLineError,
    Processes,
    TuneSettings,
    add_checkpoint_flags,
    add_lora_flags,
    add_model_flags,
    add_schedule_flags,
    defaults_epilog,
    distributed,
    in_processes,
    load_chat_model,
    mean_over_ranks,
    model_class,
    model_sha256,
    read_json_lines,
    restore_checkpoint,
    save_checkpoint,
    set_threads,
    settings_defaults,
    tune_settings,
)
from minitransformer.lora import (
    ADAPTER_WEIGHTS_FILE,
    LoRALinear,
    add_lora,
    merge_lora,
    peft_module_names,
    save_adapter,
    trainable_parameters,
)
from minitransformer.models import ARCHITECTURES
from minitransformer.sft import sft_batch
from minitransformer.training import BAR_FORMAT, TrainingLoop, make_optimizer


@dataclass
class Settings(TuneSettings):
    """The flags that decide a ``finetune`` run: those of
    :class:`~minitransformer.cli.common.TuneSettings`, with its defaults."""


#: What a new run uses for a flag that is not given.
DEFAULTS = settings_defaults(Settings)
#: LoRA's layers when --lora-targets is not given: PEFT's default for Llama (the query and
#: value projections); for GPT, whose query, key and value are one fused layer in GPT-2's
#: files (which PEFT cannot express as ours), the attention's output and the MLP's layers.
LORA_TARGETS = {a.model.__name__: list(a.lora_targets) for a in ARCHITECTURES.values()}
MERGED = "merged"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Supervised fine-tuning on conversations, one {\"messages\": [{\"role\": ..., "
        "\"content\": ...}, ...]} per line (TRL's and OpenAI's format): the loss counts the "
        "assistant's tokens and its end-of-turn token only. Checkpoints, --resume and torchrun "
        "work as for train.")
    parser.epilog = defaults_epilog(DEFAULTS)
    parser.add_argument("--data", metavar="FILE", help="the conversations, JSON lines")
    add_checkpoint_flags(parser, out="the run's directory: a model directory, or with "
                         "--lora-rank a PEFT adapter")
    add_schedule_flags(parser, batch="conversations per update, over all processes",
                       seeds="seeds the batches (and LoRA's A)", log_every=10,
                       logged="the training losses printed")
    add_lora_flags(parser, targets=LORA_TARGETS, rank="--out is then a PEFT adapter")
    add_model_flags(parser, "a directory written by train (its tokenizer has the chat "
                    "tokens), a .gguf file, or smollm2 (SmolLM2-135M-Instruct from the cache, "
                    "with its own chat template)", metavar="MODEL",
                    threads="CPU threads per process (as for train)")


def run(args: argparse.Namespace) -> int:
    return in_processes(_run, args)


def _settings(args: argparse.Namespace, out: Path, *,
              write: bool) -> tuple[Settings, dict | None]:
    """The run's flags and, with --resume, the checkpoint to continue (as in ``train``)."""
    s, resumed = tune_settings(Settings, "finetune", args, out, _check_state, write=write)
    if s.lora_rank is not None and s.lora_alpha is None:
        s.lora_alpha = float(s.lora_rank)           # PEFT's r = alpha = 8
    return s, resumed


def _check_state(state: dict, path: Path) -> None:
    """Refuse a ``training_state.json`` that is not what this command writes."""
    args = state.get("args")
    loop = state.get("loop")
    whole = {"steps", "batch_size", "seed", "warmup_steps"}
    ok = (isinstance(args, dict) and isinstance(loop, dict) and state.get("command") == "finetune"
          and all(isinstance(args.get(k), int) and args[k] >= 1 - (k == "seed") for k in whole)
          and all(isinstance(args.get(k), str) for k in ("model", "data"))
          and isinstance(args.get("lr"), (int, float)) and isinstance(loop.get("step"), int)
          and isinstance(state.get("data_sha256"), str))
    if ok and args.get("lora_rank") is not None:
        ok = (isinstance(args["lora_rank"], int) and isinstance(args.get("lora_alpha"), float)
              and isinstance(args.get("lora_targets"), list))
    if not ok:
        raise CommandLineError(f"{path} is not what finetune writes (edited or damaged?)")


def _read_conversations(path: str) -> tuple[list[tuple[int, list]], str]:
    """Each line's number and messages, and the file's SHA-256. Blank lines are skipped."""
    records, digest = read_json_lines(path)
    conversations = []
    for n, record in records:
        if not isinstance(record, dict) or "messages" not in record:
            raise CommandLineError(f"--data {path}:{n} has no \"messages\": each line must be "
                                   f"{{\"messages\": [{{\"role\": ..., \"content\": ...}}, "
                                   f"...]}}")
        conversations.append((n, record["messages"]))
    if not conversations:
        raise CommandLineError(f"--data {path} is empty: it needs one {{\"messages\": [...]}} "
                               f"per line")
    return conversations, digest


def _assistant_tokens(tokenizer: BPETokenizer, conversations: list[tuple[int, list]],
                      context_length: int, path: str) -> list[int]:
    """How many tokens each conversation has to learn (its labels that are not -100), after
    refusing, by file and line, one the chat format or the model's context cannot hold."""
    counts = []
    for n, messages in conversations:
        try:
            ids, mask = encode_chat(tokenizer, messages)
        except (TypeError, ValueError) as exc:
            raise CommandLineError(f"--data {path}:{n}: {exc}") from None
        if len(ids) - 1 > context_length:
            raise CommandLineError(f"--data {path}:{n}: the conversation is {len(ids)} tokens, "
                                   f"more than the model's context of {context_length} + 1")
        if not any(mask[1:]):
            raise CommandLineError(f"--data {path}:{n}: the conversation has no assistant "
                                   f"message to learn from")
        counts.append(sum(mask[1:]))
    return counts


class _Weighted(nn.Module):
    """``model(idx, targets)``, its loss times ``weight``. Each process's loss is the mean over
    its share's assistant tokens; weighted by ``world_size x`` its share of the batch's tokens,
    the mean over processes that DistributedDataParallel takes is the mean over the whole
    batch's tokens, as on one process (where the weight is 1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, weight: float):
        logits, loss = self.model(idx, targets)
        return logits, loss * weight


def _batches(conversations: list, counts: list[int], s: Settings, tokenizer: BPETokenizer,
             context_length: int, generator: torch.Generator,
             procs: Processes) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
    """Every process draws the same global batch of conversations from ``generator`` (its
    state is the data position) and keeps its slice."""
    share = s.batch_size // procs.world_size
    while True:
        picks = torch.randint(len(conversations), (s.batch_size,), generator=generator)
        mine = picks[procs.rank * share:(procs.rank + 1) * share].tolist()
        weight = procs.world_size * sum(counts[i] for i in mine) / sum(
            counts[i] for i in picks.tolist())
        idx, targets = sft_batch(tokenizer, [conversations[i][1] for i in mine],
                                 context_length=context_length, device=procs.device)
        yield idx, targets, weight


def _add_lora(model: nn.Module, s: TuneSettings) -> None:
    """LoRA on the run's targets, refused before training where PEFT's layout cannot hold it."""
    try:
        add_lora(model, r=s.lora_rank, alpha=s.lora_alpha, targets=s.lora_targets)
        peft_module_names(model)
    except (TypeError, ValueError) as exc:
        flag = (f"--lora-rank {s.lora_rank}" if str(exc).startswith(f"r={s.lora_rank} ")
                else f"--lora-targets {' '.join(s.lora_targets)}")
        raise CommandLineError(f"{flag}: {exc}") from None


def _load_adapter_weights(model: nn.Module, folder: Path) -> None:
    """The checkpoint's A and B into the LoRA layers that :func:`_add_lora` made, exactly."""
    from safetensors.torch import load_file

    tensors = load_file(folder / ADAPTER_WEIGHTS_FILE)
    names = peft_module_names(model)
    with torch.no_grad():
        for name, layer in model.named_modules():
            if not isinstance(layer, LoRALinear):
                continue
            for part in ("A", "B"):
                key = f"base_model.model.{names[name]}.lora_{part}.weight"
                if key not in tensors:
                    raise CommandLineError(f"{folder / ADAPTER_WEIGHTS_FILE} has no {key} "
                                           f"(edited or damaged?)")
                getattr(layer, f"lora_{part}").weight.copy_(tensors[key])


def _token_ids(tokenizer: BPETokenizer) -> dict:
    """``bos_token_id`` and ``eos_token_id`` for ``config.json`` (SmolLM2's 1 and 2: transformers'
    ``generate`` stops at the end of a turn)."""
    names = {"bos_token_id": tokenizer.bos_token, "eos_token_id": tokenizer.eos_token}
    return {k: tokenizer.special_tokens.get(v) for k, v in names.items()}


def _write_merged(out: Path, model: nn.Module, tokenizer: BPETokenizer) -> Path:
    """``out/merged/``: the LoRA layers folded into a copy of the model, written as a plain
    model directory, under a temporary name first, then renamed."""
    merged = merge_lora(copy.deepcopy(model))
    tmp, final = out / (MERGED + ".tmp"), out / MERGED
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(tmp, **_token_ids(tokenizer))
    tokenizer.save_pretrained(tmp)
    if final.exists():          # this command's own, from an earlier --merge
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def _run(args: argparse.Namespace, procs: Processes) -> int:
    out = Path(args.out)
    say = print if procs.main else (lambda *a, **k: None)
    s, resumed = _settings(args, out, write=procs.main)
    lora = s.lora_rank is not None
    for key in ("lora_alpha", "lora_targets", "merge"):
        if not lora and getattr(args, key) not in (None, False):
            raise CommandLineError(f"--{key.replace('_', '-')} needs --lora-rank R (a run "
                                   f"without it trains every weight)")
    if s.batch_size % procs.world_size:
        raise CommandLineError(f"--batch-size {s.batch_size} is not divisible by the world "
                               f"size {procs.world_size}")
    if not s.lr > 0:
        raise CommandLineError(f"--lr must be positive, got {s.lr}")
    if lora and not s.lora_alpha > 0:
        raise CommandLineError(f"--lora-alpha must be positive, got {s.lora_alpha}")
    conversations, digest = _read_conversations(s.data)
    if resumed and digest != resumed["state"]["data_sha256"]:
        raise CommandLineError(f"--data {s.data} changed since the run began (its SHA-256 "
                               f"differs): a resumed run must read the same conversations")
    count, how = set_threads(args.threads, resumed and resumed["state"].get("threads"), procs)

    torch.manual_seed(s.seed)
    if resumed and not lora:
        model = model_class(resumed["folder"]).from_pretrained(resumed["folder"],
                                                               device=procs.device)
        tokenizer = BPETokenizer.from_pretrained(resumed["folder"])
    else:
        model, tokenizer = load_chat_model(s.model, procs.device)
    base_sha256 = model_sha256(s.model)
    if lora:
        if resumed and base_sha256 != resumed["state"].get("model_sha256"):
            raise CommandLineError(f"--model {s.model} changed since the run began (its "
                                   f"model.safetensors differs): the adapter is for the other")
        s.lora_targets = s.lora_targets or LORA_TARGETS[type(model).__name__]
        _add_lora(model, s)
        if resumed:
            _load_adapter_weights(model, resumed["folder"])
    context = model.config.context_length
    counts = _assistant_tokens(tokenizer, conversations, context, s.data)
    generator = torch.Generator().manual_seed(s.seed)
    optimizer = make_optimizer(model, s.lr, 0.1)
    wrapped = distributed(_Weighted(model), procs)
    loop = TrainingLoop(wrapped, optimizer, steps=s.steps, lr=s.lr,
                        warmup_steps=s.warmup_steps, eval_every=args.log_every,
                        eval_model=model, mean_loss=mean_over_ranks(procs))
    trainable, total = trainable_parameters(model)
    if resumed:
        restore_checkpoint(out, resumed, loop, optimizer, generator, procs)
        was = resumed["trainer_state"]["world_size"]
        say(f"resuming from step {loop.step}, {how}" + (
            f" (the run began with world size {was}: equal to the uninterrupted run up to "
            f"rounding only)" if was != procs.world_size else ""))
        if resumed["note"]:
            say(resumed["note"])
    else:
        if procs.main:
            out.mkdir(parents=True, exist_ok=True)
        what = (f"LoRA of rank {s.lora_rank} on {', '.join(s.lora_targets)}" if lora
                else "every weight")
        say(f"fine-tuning a {type(model).__name__}: {trainable:,} of {total:,} parameters "
            f"train ({what}), on {len(conversations):,} conversations ({sum(counts):,} "
            f"assistant tokens), {procs.world_size} process{'es' * (procs.world_size > 1)} "
            f"of {how}")

    def write_model(folder: Path) -> None:
        if lora:
            save_adapter(model, folder, base_model_name_or_path=s.model)
        else:
            model.save_pretrained(folder, **_token_ids(tokenizer))
        tokenizer.save_pretrained(folder)

    def after_step(loop: TrainingLoop) -> None:
        h = loop.history
        if procs.main and h.steps and h.steps[-1] == loop.step:
            tqdm.tqdm.write(f"step {loop.step}: train loss {h.train_losses[-1]:.4f}",
                            file=sys.stdout)
        if procs.main and (loop.step % args.save_every == 0 or loop.step == s.steps):
            save_checkpoint(out, loop, optimizer, generator, procs, write_model=write_model,
                            state={"command": "finetune", "args": asdict(s), "data_sha256": digest,
                                   "model_sha256": base_sha256, "threads": count})

    if loop.step < s.steps:
        bar = tqdm.tqdm(total=s.steps, initial=loop.step, desc="fine-tuning",
                        mininterval=0.5, bar_format=BAR_FORMAT,
                        disable=not procs.main or args.no_progress)
        with contextlib.closing(bar):
            loop.run(_batches(conversations, counts, s, tokenizer, context, generator, procs),
                     bar=bar, after_step=after_step)
        say(f"saved {out} at step {loop.step}" + (
            f": train loss {loop.history.train_losses[-1]:.4f}"
            if loop.history.train_losses else "") + (
            f" (a LoRA adapter in PEFT's layout, for the base model {s.model})"
            if lora else ""))
    else:
        say(f"the run in {out} is complete: {loop.step} of {s.steps} steps")
    if args.merge and procs.main:
        say(f"merged the adapter into {_write_merged(out, model, tokenizer)}: a plain model "
            f"directory")
    return 0
