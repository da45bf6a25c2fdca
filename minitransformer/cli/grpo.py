"""``minitransformer grpo``: group relative policy optimisation of a model that ``train``,
``finetune`` or ``dpo`` wrote (chapter 17), in full or with LoRA, with the checkpoints and
``--resume`` of ``dpo``.

The data is TRL's prompt-only format, one ``{"prompt": ...}`` per line, plain text or a list of
messages (then rendered with the model's chat template and the start of the assistant's turn).
``--reward`` names reward functions, ``module:function`` (the module importable from the
current directory) or one of the package's own (:data:`REWARDS`), called as TRL's
``GRPOTrainer`` calls them: ``f(prompts=..., completions=..., completion_ids=..., **columns)``,
the other columns of the lines repeated for each of a prompt's completions; each returns one
number per completion, or None where it cannot score one. The rounds are
:class:`~minitransformer.grpo.GRPO`'s (sample, score, compare within the group, the clipped
loss), in :class:`~minitransformer.training.TrainingLoop`. The run's directory is always a plain
model directory that transformers loads (with ``--lora-rank``, the adapter merged into it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import tqdm

from minitransformer import data as package_data
from minitransformer.chat import apply_chat_template, end_of_turn_id
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
    positive,
    read_json_lines,
    restore_checkpoint,
    save_checkpoint,
    set_threads,
    settings_defaults,
    tune_settings,
)
from minitransformer.cli.dpo import _load_lora, _lora_state
from minitransformer.cli.finetune import LORA_TARGETS, _add_lora, _write_merged
from minitransformer.grpo import GRPO, LOSS_TYPES, Rollout
from minitransformer.lora import ADAPTER_CONFIG_FILE, merge_lora, trainable_parameters
from minitransformer.training import BAR_FORMAT, TrainingLoop, make_optimizer

#: The package's own rewards, by the name --reward gives them (each reads an ``answer``
#: column but ``length``): chapter 17's exact check, its gameable partial credit, and length.
REWARDS = {"exact": package_data.reward_exact, "overlap": package_data.reward_overlap,
           "length": package_data.reward_length}
#: The columns TRL gives a reward function itself, never from the data.
OWN_KEYS = ("prompt", "completion", "completion_ids", "prompts", "completions")


@dataclass
class Settings(TuneSettings):
    """The flags that decide a ``grpo`` run: :class:`~minitransformer.cli.common.TuneSettings`'s
    (``steps`` counts rounds, ``batch_size`` prompts) and GRPO's own, with TRL's defaults
    (``GRPOConfig``) where a small model on a CPU allows them: its group of 8, temperature 1,
    no KL term (beta 0), clip 0.2, one update per round and the ``"dapo"`` loss; 64 new tokens
    (TRL: 512) and a learning rate of 1e-5 (TRL: 1e-6)."""

    lr: float = 1e-5
    batch_size: int = 4
    group_size: int = 8
    max_new_tokens: int = 64
    temperature: float = 1.0
    beta: float = 0.0
    epsilon: float = 0.2
    iterations: int = 1
    loss_type: str = "dapo"
    reward: list[str] = field(default_factory=list)


DEFAULTS = settings_defaults(Settings)
del DEFAULTS["reward"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Group relative policy optimisation on TRL's prompt format: one {\"prompt\": ...} per "
        "line, plain text or a list of messages, other columns passed to the reward. Each "
        "round samples --group-size replies to --batch-size prompts, scores them with "
        "--reward, and raises the replies better than their group's mean. --out is a model "
        "directory transformers loads (with --lora-rank, the adapter merged). Checkpoints and "
        "--resume work as for dpo.")
    parser.epilog = defaults_epilog(DEFAULTS)
    parser.add_argument("--data", metavar="FILE", help="the prompts, JSON lines")
    parser.add_argument("--reward", nargs="+", metavar="MODULE:FUNCTION", help="reward "
                        "functions, called as TRL calls them, f(prompts=..., completions=..., "
                        "completion_ids=..., **other_columns), returning one number (or None) "
                        "per completion; the sum is the reward. MODULE is imported from the "
                        "current directory; or a name of the package's own: "
                        + ", ".join(REWARDS) + " (these read an \"answer\" column)")
    group = parser.add_argument_group("GRPO")
    add = group.add_argument
    add("--group-size", type=positive, metavar="G", help="replies sampled per prompt, at "
        "least 2 (TRL's num_generations)")
    add("--max-new-tokens", type=positive, metavar="N", help="the longest reply, in tokens")
    add("--temperature", type=number, help="sampling temperature, > 0")
    add("--beta", type=number, help="weight of the KL term to a frozen copy of --model (0: "
        "none, and no copy is kept)")
    add("--epsilon", type=number, help="the clip range [1 - epsilon, 1 + epsilon] of the "
        "ratio")
    add("--iterations", type=positive, metavar="MU", help="updates on each round's replies "
        "(TRL's num_iterations; --steps counts rounds)")
    add("--loss-type", choices=LOSS_TYPES, help="how the tokens' losses are averaged "
        "(TRL's loss_type)")
    add_checkpoint_flags(parser, out="the run's directory, a model directory", steps="rounds")
    add_schedule_flags(parser, batch="prompts per round, each answered --group-size times",
                       seeds="seeds the prompts drawn and the sampling (and LoRA's A)",
                       log_every=10, logged="the rewards printed (the first round's always)",
                       steps="rounds: each samples and scores replies, then "
                       "takes --iterations updates on them")
    add_lora_flags(parser, targets=LORA_TARGETS, rank="--out is still a model directory, the "
                   "adapter merged into it")
    add_model_flags(parser, "the starting policy (and the reference with --beta): a "
                    "directory written by train, finetune or dpo",
                    threads="CPU threads (as for train)")


def run(args: argparse.Namespace) -> int:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:     # before any process group is made
        raise CommandLineError("grpo runs in one process: torchrun is not supported")
    return in_processes(_run, args)


def _check_values(given: dict) -> None:
    if "reward" not in given:
        raise CommandLineError("grpo needs --reward MODULE:FUNCTION (or one of "
                               + ", ".join(REWARDS) + ")")
    for key in ("lr", "temperature", "epsilon", "lora_alpha"):
        if key in given and not given[key] > 0:
            raise CommandLineError(f"--{key.replace('_', '-')} must be positive, got "
                                   f"{given[key]}")
    if given.get("beta", 0) < 0:
        raise CommandLineError(f"--beta must be 0 or more, got {given['beta']}")
    if given.get("group_size", 2) < 2:
        raise CommandLineError(f"--group-size must be at least 2 (a reply is compared with "
                               f"the others to its prompt), got {given['group_size']}")


def _check_state(state: dict, path: Path) -> None:
    """Refuse a ``training_state.json`` that is not what this command writes."""
    args, loop = state.get("args"), state.get("loop")
    whole = {"steps", "batch_size", "seed", "warmup_steps", "group_size", "max_new_tokens",
             "iterations"}
    ok = (isinstance(args, dict) and isinstance(loop, dict) and state.get("command") == "grpo"
          and all(isinstance(args.get(k), int) and args[k] >= 1 - (k == "seed") for k in whole)
          and all(isinstance(args.get(k), str) for k in ("model", "data", "loss_type"))
          and all(isinstance(args.get(k), (int, float)) and args[k] > 0
                  for k in ("lr", "temperature", "epsilon"))
          and isinstance(args.get("beta"), (int, float)) and args["beta"] >= 0
          and isinstance(args.get("reward"), list) and args["reward"]
          and all(isinstance(r, str) for r in args["reward"])
          and (args.get("lora_rank") is None or isinstance(args["lora_rank"], int))
          and isinstance(loop.get("step"), int) and isinstance(state.get("data_sha256"), str)
          and isinstance(state.get("model_sha256"), str))
    if not ok:
        raise CommandLineError(f"{path} is not what grpo writes (edited or damaged?)")


def load_reward(name: str) -> Callable:
    """``--reward``'s function: a name of :data:`REWARDS`, or ``module:function`` with the
    module imported from the current directory (put first on ``sys.path``)."""
    if ":" not in name:
        if name not in REWARDS:
            raise CommandLineError(f"--reward {name}: give MODULE:FUNCTION, or one of the "
                                   f"package's rewards: {', '.join(REWARDS)}")
        return REWARDS[name]
    module_name, _, function = name.rpartition(":")
    if not module_name or not function.isidentifier():
        raise CommandLineError(f"--reward {name}: give MODULE:FUNCTION, as my_rewards:correct")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise CommandLineError(f"--reward {name}: no module named {exc.name!r} (a "
                                   f"{exc.name.split('.')[-1]}.py in the current directory, "
                                   f"{here}, or an installed module)") from None
        raise CommandLineError(f"--reward {name}: importing {module_name} failed: "
                               f"ModuleNotFoundError: {exc}") from None
    except Exception as exc:      # whatever the user's module raises: one line, not a trace
        raise CommandLineError(f"--reward {name}: importing {module_name} failed: "
                               f"{type(exc).__name__}: {exc}") from None
    found = getattr(module, function, None)
    if found is None:
        raise CommandLineError(f"--reward {name}: {module_name} "
                               f"({getattr(module, '__file__', None) or 'a module'}) has no "
                               f"{function!r}")
    if not callable(found):
        raise CommandLineError(f"--reward {name}: {module_name}.{function} is "
                               f"{type(found).__name__}, not a function")
    return found


def _read_prompts(path: str) -> tuple[list[tuple[int, dict]], str]:
    """Each line's number and row (``prompt`` and the other columns), and the file's SHA-256.
    Every row has the first row's columns, and its kind of prompt (plain or messages)."""
    records, digest = read_json_lines(path)
    rows: list[tuple[int, dict]] = []
    for n, row in records:
        where = f"--data {path}:{n}"
        if not isinstance(row, dict) or "prompt" not in row:
            raise CommandLineError(f"{where} has no \"prompt\": each line must be {{\"prompt\": "
                                   f"...}}, plain text or a list of messages, and other columns")
        prompt = row["prompt"]
        if not isinstance(prompt, (str, list)):
            raise CommandLineError(f"{where}: the prompt must be text or a list of messages, got "
                                   f"{type(prompt).__name__}")
        for key in OWN_KEYS[1:]:
            if key in row:
                raise CommandLineError(f"{where} has a column {key!r}: TRL gives the reward that "
                                       f"argument itself; rename the column")
        if rows:
            first_n, first = rows[0]
            if set(row) != set(first):
                raise CommandLineError(f"{where} has the columns {sorted(row)}, line {first_n} "
                                       f"{sorted(first)}: every line needs the same (the "
                                       f"reward gets each column as a list)")
            if isinstance(prompt, str) != isinstance(first["prompt"], str):
                kind = "text" if isinstance(first["prompt"], str) else "a list of messages"
                raise CommandLineError(f"{where} mixes plain-text and conversational prompts "
                                       f"(line {first_n}'s is {kind})")
        rows.append((n, row))
    if not rows:
        raise CommandLineError(f"--data {path} is empty: it needs one {{\"prompt\": ...}} per "
                               f"line")
    return rows, digest


def _encode_prompts(tokenizer, rows: list[tuple[int, dict]], s: Settings,
                    context_length: int) -> list[list[int]]:
    """Each prompt's token ids, the messages in the model's chat template ending with the
    start of the assistant's turn; refused, by line, where it and ``--max-new-tokens`` do not
    fit the model's context."""
    ids = []
    for n, row in rows:
        prompt = row["prompt"]
        try:
            if isinstance(prompt, str):
                if not prompt:
                    raise ValueError("the prompt is empty")
                tokens = tokenizer.encode(prompt)
            else:
                tokens = apply_chat_template(tokenizer, prompt, add_generation_prompt=True)
        except (TypeError, ValueError) as exc:
            raise CommandLineError(f"--data {s.data}:{n}: {exc}") from None
        if len(tokens) + s.max_new_tokens - 1 > context_length:
            raise CommandLineError(f"--data {s.data}:{n}: the prompt is {len(tokens)} tokens; "
                                   f"with --max-new-tokens {s.max_new_tokens} that is more than "
                                   f"the model's context of {context_length} + 1")
        ids.append(tokens)
    return ids


def _name(function: Callable) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


def trl_reward(functions: list[Callable], rows: list[dict], tokenizer,
               group_size: int) -> Callable[[list[list[int]]], list[float | None]]:
    """A ``reward`` for :meth:`GRPO.rollout <minitransformer.grpo.GRPO.rollout>` on these
    ``rows``: it decodes the completions (special tokens left out) and calls each function as
    TRL's ``GRPOTrainer`` does, ``f(prompts=..., completions=..., completion_ids=...,
    **columns)``: each row's prompt and other columns repeated ``group_size`` times, the
    completions as text for plain prompts and as ``[{"role": "assistant", "content": ...}]``
    for conversational ones. The reward of a completion is the sum over the functions that
    scored it, None where none did (each may return None for one it cannot score). A function
    that raises or returns anything else is one line naming it."""
    repeat = [row for row in rows for _ in range(group_size)]
    columns = {key: [row[key] for row in repeat] for key in rows[0] if key != "prompt"}
    prompts = [row["prompt"] for row in repeat]
    chat = not isinstance(rows[0]["prompt"], str)
    specials = set(tokenizer.special_tokens.values())

    def reward(completion_ids: list[list[int]]) -> list[float | None]:
        texts = [tokenizer.decode([t for t in ids if t not in specials])
                 for ids in completion_ids]
        completions = ([[{"role": "assistant", "content": text}] for text in texts] if chat
                       else texts)
        totals: list[float | None] = [None] * len(texts)
        for f in functions:
            try:
                values = f(prompts=prompts, completions=completions,
                           completion_ids=completion_ids, **columns)
            except Exception as exc:      # the user's code: one line that names it
                raise CommandLineError(f"--reward: {_name(f)} raised {type(exc).__name__}: "
                                       f"{exc}") from None
            for i, value in enumerate(_check_values_of(f, values, len(texts))):
                if value is not None:
                    totals[i] = (totals[i] or 0.0) + value
        return totals

    return reward


def _check_values_of(f: Callable, values: object, count: int) -> list[float | None]:
    if callable(getattr(values, "tolist", None)) and getattr(values, "ndim", None) == 1:
        values = values.tolist()        # a NumPy array or a tensor, which TRL takes too
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (list, tuple)):
        raise CommandLineError(f"--reward: {_name(f)} returned {type(values).__name__}, not a "
                               f"list of {count} numbers (one per completion)")
    if len(values) != count:
        raise CommandLineError(f"--reward: {_name(f)} returned {len(values)} rewards for "
                               f"{count} completions: one per completion")
    checked = []
    for i, value in enumerate(values):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, numbers.Real)):
            raise CommandLineError(f"--reward: {_name(f)} returned {type(value).__name__} "
                                   f"({value!r}) at index {i}: a reward is a number, or None "
                                   f"for a completion it cannot score")
        if value is not None and not math.isfinite(value):
            raise CommandLineError(f"--reward: {_name(f)} returned {value} at index {i}: a "
                                   f"reward is a finite number, or None for a completion it "
                                   f"cannot score")
        checked.append(None if value is None else float(value))
    return checked


def _run(args: argparse.Namespace, procs: Processes) -> int:
    out = Path(args.out)
    s, resumed = tune_settings(Settings, "grpo", args, out, _check_state,
                               check_values=_check_values)
    lora = s.lora_rank is not None
    check_lora_flags(args, lora)
    functions = [load_reward(name) for name in s.reward]
    rows, digest = _read_prompts(s.data)
    if resumed and digest != resumed["state"]["data_sha256"]:
        raise CommandLineError(f"--data {s.data} changed since the run began (its SHA-256 "
                               f"differs): a resumed run must read the same prompts")
    count, how = set_threads(args.threads, resumed and resumed["state"].get("threads"), procs)

    folder = Path(s.model)
    if (folder.is_dir() and not (folder / "config.json").is_file()
            and not (folder / ADAPTER_CONFIG_FILE).is_file()):
        raise CommandLineError(f"--model {s.model} is not a model directory (it has no "
                               f"config.json): give one that train, finetune or dpo wrote")
    torch.manual_seed(s.seed)
    start, tokenizer = load_chat_model(s.model, procs.device)     # --model: refused by name
    model_file = folder / "model.safetensors"
    model_sha256 = file_sha256(model_file) if model_file.is_file() else ""
    if resumed and model_sha256 != resumed["state"]["model_sha256"]:
        raise CommandLineError(f"--model {s.model} changed since the run began (its "
                               f"model.safetensors differs): the run starts from it")
    reference = copy.deepcopy(start).requires_grad_(False) if s.beta > 0 else None
    if resumed and not lora:
        policy = type(start).from_pretrained(resumed["folder"], device=procs.device)
    else:
        policy = start
    if lora:
        if s.lora_alpha is None:        # PEFT's r = alpha
            s.lora_alpha = float(s.lora_rank)
        s.lora_targets = s.lora_targets or LORA_TARGETS[type(policy).__name__]
        _add_lora(policy, s)
        if resumed:
            _load_lora(policy, resumed["tensors"], resumed["folder"])
    prompt_ids = _encode_prompts(tokenizer, rows, s, policy.config.context_length)
    eos = end_of_turn_id(tokenizer)
    objective = GRPO(policy, reference, beta=s.beta, epsilon=s.epsilon, loss_type=s.loss_type,
                     kl_correction=True, temperature=s.temperature)    # TRL's defaults
    generator = torch.Generator(device=procs.device).manual_seed(s.seed)
    optimizer = make_optimizer(policy, s.lr, 0.0)       # no weight decay, as TRL
    loop = TrainingLoop(objective, optimizer, steps=s.steps * s.iterations, lr=s.lr,
                        warmup_steps=s.warmup_steps * s.iterations,
                        eval_every=args.log_every * s.iterations)
    if resumed:
        restore_checkpoint(out, resumed, loop, optimizer, generator, procs)
        print(f"resuming from round {loop.step // s.iterations}, {how}")
        if resumed["note"]:
            print(resumed["note"])
    else:
        out.mkdir(parents=True, exist_ok=True)
        trainable, total = trainable_parameters(policy)
        what = (f"LoRA of rank {s.lora_rank} on {', '.join(s.lora_targets)}" if lora
                else "every weight")
        print(f"GRPO of a {type(policy).__name__}: {trainable:,} of {total:,} parameters "
              f"train ({what}), on {len(rows):,} "
              f"{'plain' if isinstance(rows[0][1]['prompt'], str) else 'conversational'} "
              f"prompts, {s.batch_size} a round, {s.group_size} replies each, reward "
              f"{' + '.join(s.reward)}" + (f", beta {s.beta}" if s.beta else "") + f", {how}")

    def write_model(folder: Path) -> None:
        (merge_lora(copy.deepcopy(policy)) if lora else policy).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    rollouts: list[Rollout] = []

    def rounds() -> Iterator[tuple[Rollout]]:
        """Each round's prompts drawn from ``generator`` (its state is the data position and
        the sampling's), their replies sampled and scored, once per --iterations updates."""
        while True:
            picks = torch.randint(len(rows), (s.batch_size,), generator=generator,
                                  device=generator.device).tolist()
            chosen = [rows[i][1] for i in picks]
            rollouts.append(objective.rollout(
                [prompt_ids[i] for i in picks], trl_reward(functions, chosen, tokenizer,
                                                           s.group_size),
                group_size=s.group_size, max_new_tokens=s.max_new_tokens, eos_id=eos,
                generator=generator))
            for _ in range(s.iterations):
                yield (rollouts[-1],)

    totals = {"reward": 0.0, "scored": 0, "signal": 0.0, "length": 0.0, "unscored": 0,
              "kl": 0.0, "rounds": 0}

    def after_step(loop: TrainingLoop) -> None:
        if loop.step % s.iterations:
            return
        done = loop.step // s.iterations
        bar.update(1)
        rollout = rollouts.pop()
        stats = rollout.stats()
        signal = rollout.advantages.view(-1, s.group_size).ne(0).any(1)     # rewards differ
        if not math.isnan(stats["reward"]):         # NaN: every reply of the round unscored
            totals["reward"] += stats["reward"]
            totals["scored"] += 1
        totals["signal"] += signal.float().mean().item()
        totals["length"] += stats["length"]
        totals["unscored"] += stats.get("unscored", 0)
        totals["kl"] += objective.metrics.get("kl", 0.0)      # the round's last update's
        totals["rounds"] += 1
        if done == 1 or done % args.log_every == 0 or done == s.steps:
            k = totals["rounds"]
            tqdm.tqdm.write(
                f"round {done}: reward "
                + (f"{totals['reward'] / totals['scored']:.4f}" if totals["scored"] else "n/a")
                + f", groups with signal "
                f"{totals['signal'] / k:.2f}, reply length {totals['length'] / k:.1f}"
                + (f", KL to the reference {totals['kl'] / k:.3g}" if s.beta else "")
                + (f", {totals['unscored']} replies unscored" if totals["unscored"] else "")
                + (f" (mean of {k} rounds)" if k > 1 else ""), file=sys.stdout)
            totals.update(reward=0.0, scored=0, signal=0.0, length=0.0, unscored=0, kl=0.0,
                          rounds=0)
        if done % args.save_every == 0 or done == s.steps:
            save_checkpoint(out, loop, optimizer, generator, procs, write_model=write_model,
                            state={"command": "grpo", "args": asdict(s), "data_sha256": digest,
                                   "model_sha256": model_sha256, "threads": count},
                            tensors=_lora_state(policy) if lora else None)

    if loop.step < loop.steps:
        bar = tqdm.tqdm(total=s.steps, initial=loop.step // s.iterations, desc="grpo",
                        mininterval=0.5, bar_format=BAR_FORMAT, disable=args.no_progress)
        with contextlib.closing(bar):
            loop.run(rounds(), after_step=after_step)
        print(f"saved {out} at round {s.steps}: a model directory transformers loads"
              + (" (the LoRA adapter merged into it)" if lora else ""))
    else:
        print(f"the run in {out} is complete: {s.steps} of {s.steps} rounds")
    if args.merge:
        print(f"wrote the merged model also to {_write_merged(out, policy, tokenizer)}")
    return 0
