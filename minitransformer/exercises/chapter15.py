"""Checkers for the exercises of chapter 15, *Training for real*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_restore` -- ``my_restore(model, optimizer, generator, checkpoint)``: put back
  everything a checkpoint holds (weights, optimizer moments, the global RNG state that draws
  dropout, the data generator's state) and return the step to continue from. The checker trains
  a small model, stops it, restores a new program's objects with the learner's function, trains
  on, and compares the final weights, bit for bit, with the run that never stopped.
* :data:`check_ring_bytes` -- ``my_ring_allreduce_bytes(num_parameters, world_size,
  bytes_per_number)``: what each process sends in one ring all-reduce of the gradients,
  ``2 (N - 1) / N * num_parameters * bytes_per_number``.
* :data:`check_zero_bytes` -- ``my_zero_bytes_per_gpu(num_parameters, world_size, stage)``:
  the training memory of one GPU under ZeRO's stages 0-3 with mixed precision (2 bytes of
  weights, 2 of gradients, 12 of optimizer state per parameter), as a tuple of its three parts
  ``(weights, gradients, optimizer_state)``.
* :data:`check_average_gradients` -- ``my_average_gradients(model, num_sequences)``: called on
  every rank after ``backward()`` on its own ``num_sequences`` sequences, leave on every rank the
  gradient of the mean loss over all ranks' sequences, shares equal or not. The checker starts
  a two-process gloo group, runs the function on both ranks, and compares each rank's gradients
  with the gradient of the whole batch in one process.
"""

from __future__ import annotations

import copy
import datetime
import dis
import functools
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cloudpickle
import torch
import torch.distributed as dist
from torch import Tensor, nn

from minitransformer.exercises import FAIL, PASS, Checker, Verdict

__all__ = ["check_average_gradients", "check_restore", "check_ring_bytes", "check_zero_bytes"]


# --- my_restore(model, optimizer, generator, checkpoint) -----------------------------------------

_BATCH = 8


def _program(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.Generator]:
    """What a program builds when it starts: the same seed, so the same fresh objects."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    return model, optimizer, torch.Generator().manual_seed(seed)


def _data(seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(64, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def _train_step(model, optimizer, generator, data, step: int) -> None:
    """One update on a batch the data generator picks; the rate decays with the step."""
    x, y = data
    rows = torch.randint(len(x), (_BATCH,), generator=generator)
    for group in optimizer.param_groups:
        group["lr"] = 0.05 * 0.8 ** step
    optimizer.zero_grad()
    loss = ((model(x[rows]) - y[rows]) ** 2).mean()
    loss.backward()
    optimizer.step()


def _resumed_weights(restore: Callable) -> Callable:
    """Train ``steps_before`` steps, save a checkpoint, start a new program, ``restore`` it,
    train ``steps_after`` more steps: the final weights (``None`` if ``restore`` returned
    nothing). The caller's global random state is left as it was."""

    def resumed(seed: int, steps_before: int, steps_after: int) -> Tensor | None:
        with torch.random.fork_rng():
            data = _data(seed)
            model, optimizer, generator = _program(seed)
            model.train()
            for step in range(steps_before):
                _train_step(model, optimizer, generator, data, step)
            checkpoint = {"model": copy.deepcopy(model.state_dict()),
                          "optimizer": copy.deepcopy(optimizer.state_dict()),
                          "torch_rng": torch.get_rng_state(),
                          "data_rng": generator.get_state(),
                          "step": steps_before}
            model, optimizer, generator = _program(seed)       # a new program
            model.train()
            step = restore(model, optimizer, generator, checkpoint)
            if step is None:
                return None
            for s in range(step, step + steps_after):
                _train_step(model, optimizer, generator, data, s)
            return torch.cat([p.detach().flatten() for p in model.parameters()])

    return resumed


@functools.cache
def _known_weights(restore: Callable) -> Callable:
    """:func:`_resumed_weights` of a restore function the checker knows (its reference, a
    listed mistake), each case run once per process: checking one answer compares it with
    every one of them on every case, so this spares 21 runs of the program per case. An error
    is raised again on every call; the weights come as a copy."""
    resumed = functools.cache(_resumed_weights(restore))

    def weights(*case) -> Tensor | None:
        result = resumed(*case)
        return None if result is None else result.clone()

    return weights


def _restore(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def _restore_without(*parts: str) -> Callable:
    """A restore function that leaves ``parts`` out (``"step"``: returns 0; ``"return"``:
    returns nothing)."""
    def restore(model, optimizer, generator, checkpoint):
        if "model" not in parts:
            model.load_state_dict(checkpoint["model"])
        if "optimizer" not in parts:
            optimizer.load_state_dict(checkpoint["optimizer"])
        if "torch_rng" not in parts:
            torch.set_rng_state(checkpoint["torch_rng"])
        if "data_rng" not in parts:
            generator.set_state(checkpoint["data_rng"])
        if "return" in parts:
            return None
        return 0 if "step" in parts else checkpoint["step"]
    return restore


#: What each part of the checkpoint is for, in the order a hint names the missing ones.
_PART_HINTS = {
    "model": "the weights are not put back: model.load_state_dict(checkpoint['model'])",
    "optimizer": "the optimizer starts again from zero moments: AdamW's running averages of "
                 "the gradient and of its square (and its step count) are part of the run; "
                 "optimizer.load_state_dict(checkpoint['optimizer'])",
    "torch_rng": "dropout draws its masks from torch's global random generator, which the "
                 "new program seeded afresh: torch.set_rng_state(checkpoint['torch_rng'])",
    "data_rng": "the data generator starts again from its seed, so the batches already seen "
                "come again: its state is the data position, "
                "generator.set_state(checkpoint['data_rng'])",
}


def _restore_mistakes() -> dict[str, Callable]:
    """Every combination of missing parts, fewest first, each with a hint naming them all;
    then the two mistakes about the step."""
    mistakes = {}
    names = list(_PART_HINTS)
    for size in range(1, len(names) + 1):
        for missing in itertools.combinations(names, size):
            hint = "; and ".join(_PART_HINTS[part] for part in missing)
            mistakes[hint] = _restore_without(*missing)
    mistakes["return the step the checkpoint was taken at, checkpoint['step']: the run "
             "continues from there, and the learning rate depends on it (0 starts the "
             "schedule again)"] = _restore_without("step")
    mistakes["everything is restored, but the function returns nothing: return "
             "checkpoint['step'], the step to continue from"] = _restore_without("return")
    mistakes["return checkpoint['step'] itself, not one more: it counts the steps done, and "
             "steps are numbered from 0, so it is also the number of the next step"] = (
        _restore_step_plus_one)
    mistakes["the two generator states are swapped: checkpoint['torch_rng'] goes to "
             "torch.set_rng_state (dropout), checkpoint['data_rng'] to generator.set_state "
             "(the batches)"] = _restore_swapped_rngs
    return mistakes


#: Errors a learner's restore raises, each with its hint (matched by the error's message).
def _whole_checkpoint_into(target: str) -> Callable:
    def restore(model, optimizer, generator, checkpoint):
        {"model": model, "optimizer": optimizer}[target].load_state_dict(checkpoint)
        return _restore(model, optimizer, generator, checkpoint)
    return restore


def _restore_step_plus_one(model, optimizer, generator, checkpoint):
    return _restore(model, optimizer, generator, checkpoint) + 1


def _restore_swapped_rngs(model, optimizer, generator, checkpoint):
    swapped = {**checkpoint, "torch_rng": checkpoint["data_rng"],
               "data_rng": checkpoint["torch_rng"]}
    return _restore(model, optimizer, generator, swapped)


def _restored_parts(restore: Callable) -> str | None:
    """Which parts ``restore`` leaves unlike the checkpoint, read from the objects right after
    it returns (so that any way of getting a part wrong, a new seed too, is named): the hint
    of :func:`_restore_mistakes` for them, or ``None``."""
    with torch.random.fork_rng():
        data = _data(0)
        model, optimizer, generator = _program(0)
        model.train()
        for step in range(3):
            _train_step(model, optimizer, generator, data, step)
        checkpoint = {"model": copy.deepcopy(model.state_dict()),
                      "optimizer": copy.deepcopy(optimizer.state_dict()),
                      "torch_rng": torch.get_rng_state(), "data_rng": generator.get_state(),
                      "step": 3}
        saved = copy.deepcopy(checkpoint)
        model, optimizer, generator = _program(0)
        model.train()
        try:
            step = restore(model, optimizer, generator, checkpoint)
        except Exception:
            return None
        torch_state, data_state = torch.get_rng_state(), generator.get_state()
    wrong = []
    if not _same_state(model.state_dict(), saved["model"]):
        wrong.append("model")
    if not _same_state(optimizer.state_dict(), saved["optimizer"]):
        wrong.append("optimizer")
    swapped = torch.equal(torch_state, saved["data_rng"]) and torch.equal(
        data_state, saved["torch_rng"])
    if not torch.equal(torch_state, saved["torch_rng"]) and not swapped:
        wrong.append("torch_rng")
    if not torch.equal(data_state, saved["data_rng"]) and not swapped:
        wrong.append("data_rng")
    hints = list(_restore_mistakes())
    if wrong:
        return "; and ".join(_PART_HINTS[part] for part in wrong)
    if swapped:
        return hints[-1]
    if step is None:
        return hints[-3]
    if step == 0:
        return hints[-4]
    if step == 4:
        return hints[-2]
    return None


def _same_state(one, other) -> bool:
    """Two state dicts (nested dicts and lists of tensors and numbers) hold equal values."""
    if isinstance(one, Tensor) or isinstance(other, Tensor):
        return isinstance(one, Tensor) and isinstance(other, Tensor) and one.shape == \
            other.shape and torch.equal(one, other)
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_same_state(one[k], other[k]) for k in one)
    if isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)):
        return len(one) == len(other) and all(map(_same_state, one, other))
    return one == other


class _ResumeChecker(Checker):
    """A :class:`Checker` of restore functions: each function (the learner's, the reference,
    every listed mistake) is run inside the same train-stop-restore-train program, and the
    final weights are compared exactly. A wrong answer that no listed mistake matches on
    every case is named by the parts it leaves unlike the checkpoint."""

    def run(self, function: Callable) -> Verdict:
        if not callable(function):
            return super().run(function)
        inner = Checker(reference=_known_weights(self.reference), cases=self.cases,
                        mistakes={hint: _known_weights(wrong)
                                  for hint, wrong in self.mistakes.items()},
                        atol=0.0, rtol=0.0, match_every_case=True)
        verdict = inner.run(_resumed_weights(function))
        verdict.message = " ".join(verdict.message.split())     # load_state_dict's errors
        if verdict or "Hint: " in verdict.message or verdict.message.endswith(" yet"):
            return verdict
        hint = _restored_parts(function)
        return verdict if hint is None else Verdict(False, f"{verdict.message}. Hint: {hint}")


check_restore = _ResumeChecker(
    reference=_restore,
    cases=[(0, 3, 4), (1, 5, 2), (2, 1, 6)],
    mistakes={
        **_restore_mistakes(),
        "the checkpoint holds five things: give model.load_state_dict the weights' part, "
        "checkpoint['model']": _whole_checkpoint_into("model"),
        "the checkpoint holds five things: give optimizer.load_state_dict the optimizer's "
        "part, checkpoint['optimizer']": _whole_checkpoint_into("optimizer"),
    },
    atol=0.0,
    rtol=0.0,
)


# --- my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number) -----------------------

def _ring_bytes(num_parameters: int, world_size: int, bytes_per_number: int) -> float:
    return 2 * (world_size - 1) / world_size * num_parameters * bytes_per_number


check_ring_bytes = Checker(
    reference=_ring_bytes,
    # case 1's N does not divide the numbers: the answer is a fraction, not rounded
    cases=[(1000, 3, 4), (124_439_808, 8, 4), (36_096, 2, 2), (5000, 1, 4)],
    mistakes={
        "a ring all-reduce has two passes, reduce-scatter then all-gather, each sending "
        "(N - 1)/N of the numbers: multiply by 2":
            lambda p, n, b: (n - 1) / n * p * b,
        "each process sends only its share: (N - 1) chunks of 1/N of the numbers per pass, so "
        "(N - 1)/N of them, not all of them":
            lambda p, n, b: 2 * p * b,
        "the answer is in bytes: multiply the count of numbers by bytes_per_number":
            lambda p, n, b: 2 * (n - 1) / n * p,
        "each chunk is 1/N of the numbers: (N - 1) chunks make (N - 1)/N of them, divide "
        "by N (2 (N - 1) whole gradients is what all N processes send together)":
            lambda p, n, b: 2 * (n - 1) * p * b,
        "mind the brackets: n - 1 / n is n - (1/n); write (n - 1) / n":
            lambda p, n, b: 2 * (n - 1 / n) * p * b,
        "bytes, not bits: a float32 number is 4 bytes, no factor 8":
            lambda p, n, b: 2 * (n - 1) / n * p * b * 8,
        "(n - 1) // n is integer division, always 0 for n > 1: divide with / (or multiply "
        "first, 2 * (n - 1) * p * b / n)":
            lambda p, n, b: 2 * (n - 1) // n * p * b,
        "(N - 1)/N is already each process's share: (N - 1) chunks of 1/N; do not divide by "
        "N again":
            lambda p, n, b: 2 * (1 - 1 / n) / n * p * b,
        "the share is (N - 1)/N, below 1, not N/(N - 1): each process sends N - 1 of the N "
        "chunks":
            lambda p, n, b: 2 * n / (n - 1) * p * b,
        "each process sends N - 1 of the N chunks, a share below 1: N over N - 1 is above "
        "it (and one process sends nothing)":
            lambda p, n, b: 2 * n / (n - 1) * p * b if n > 1 else 0.0,
        "integer division rounds the share (world_size - 1) // world_size down to 0 for "
        "every world size: divide with /":
            lambda p, n, b: 2 * ((n - 1) // n) * p * b,
        "each pass sends N - 1 chunks of 1/N, not one chunk: 2 (N - 1) / N of the numbers":
            lambda p, n, b: 2 * p * b / n,
        "keep the exact number, 2 (N - 1) / N * P * b, a fraction where N does not divide "
        "P: int() cuts it": lambda p, n, b: int(2 * (n - 1) / n * p * b),
        "the formula counts P / N numbers a chunk, a fraction where N does not divide P: "
        "rounding each chunk up to whole numbers counts more than the gradient holds":
            lambda p, n, b: 2 * (n - 1) * -(-p // n) * b,
        "count what one process sends; what it receives is as much again, and not part of "
        "the answer":
            lambda p, n, b: 4 * (n - 1) / n * p * b,
        "sending the whole gradient to each of the N - 1 others is the naive all-reduce; the "
        "ring sends N - 1 chunks of 1/N in each of its two passes":
            lambda p, n, b: (n - 1) * p * b,
        "use bytes_per_number, not 4: a 16-bit number is 2 bytes":
            lambda p, n, b: 2 * (n - 1) / n * p * 4,
        "the answer is in bytes, not megabytes: no division by 1e6":
            lambda p, n, b: 2 * (n - 1) / n * p * b / 1e6,
        "the answer is in bytes, not MiB: no division by 2**20":
            lambda p, n, b: 2 * (n - 1) / n * p * b / 2 ** 20,
    },
    match_every_case=True,
    thorough=True,
)


# --- my_zero_bytes_per_gpu(num_parameters, world_size, stage) ------------------------------------

_PARTS = ("weights", "gradients", "optimizer")


def _zero_bytes(num_parameters: int, world_size: int, stage: int, *, weights: int = 2,
                gradients: int = 2, optimizer: int = 12,
                shard: tuple = ()) -> tuple[float, float, float]:
    """Bytes on one GPU of the weights, the gradients and the optimizer state: each part is
    divided by world_size from its stage on (``shard``: the parts divided instead)."""
    shard = shard or ("optimizer",) * (stage >= 1) + ("gradients",) * (stage >= 2) + (
        "weights",) * (stage >= 3)
    sizes = {"weights": weights, "gradients": gradients, "optimizer": optimizer}
    return tuple(float(num_parameters * sizes[kind] / (world_size if kind in shard else 1))
                 for kind in _PARTS)


def _zero_mistake(**changes) -> Callable:
    return lambda p, n, s: _zero_bytes(p, n, s, **changes)


def _zero_shards(table: dict[int, tuple]) -> Callable:
    return lambda p, n, s: _zero_bytes(p, n, s, shard=table[s] or ("none",))


def _as_floats(answer):
    """Three whole or fractional numbers, as floats: 2 * p and 2.0 * p are the same answer (a
    list stays a list, which the exercise's tuple is not)."""
    if isinstance(answer, (tuple, list)) and len(answer) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in answer):
        return type(answer)(float(v) for v in answer)
    return answer


class _PartsChecker(Checker):
    """A :class:`Checker` that takes a tuple of ints as the same floats."""

    def run(self, function: Callable) -> Verdict:
        if not callable(function):
            return super().run(function)

        def answer(*args):
            return _as_floats(function(*args))
        return super().run(answer)


_ALL = ("optimizer", "gradients", "weights")

check_zero_bytes = _PartsChecker(
    reference=lambda num_parameters, world_size, stage: _zero_bytes(num_parameters,
                                                                     world_size, stage),
    # case 2's 7 GPUs do not divide the bytes: the answer is a fraction
    cases=[(1000, 4, 1), (1000, 7, 2), (1000, 4, 3), (1000, 4, 0),
           (8_030_261_248, 8, 1), (124_439_808, 64, 3)],
    mistakes={
        "return the three parts, a tuple (weights, gradients, optimizer_state), not their "
        "sum: stages 1 to 3 differ in which part they divide":
            lambda p, n, s: sum(_zero_bytes(p, n, s)),
        "the parts come in the order weights, gradients, optimizer state":
            lambda p, n, s: _zero_bytes(p, n, s)[::-1],
        "multiply by num_parameters: the answer is the bytes of the whole model's state on "
        "one GPU, not per parameter":
            lambda p, n, s: _zero_bytes(1, n, s),
        "Adam's state in mixed precision is 12 bytes a parameter: a float32 master copy of the "
        "weights (4) as well as the two moments (4 + 4)":
            _zero_mistake(optimizer=8),
        "the float32 master copy of the weights is optimizer state, sharded from stage 1 with "
        "the moments (4 + 4 + 4 = 12 bytes); the weights part is the 16-bit weights, 2 bytes":
            _zero_mistake(weights=6, optimizer=8),
        "the weights and gradients are float16 (2 bytes each) in mixed precision; only the "
        "optimizer's 12 bytes are float32":
            _zero_mistake(weights=4, gradients=4),
        "stage 1 shards the optimizer state only; the gradients are split from stage 2 on":
            _zero_shards({0: (), 1: ("optimizer", "gradients"), 2: ("optimizer", "gradients"),
                          3: _ALL}),
        "stage 1 shards the optimizer state: 12 bytes a parameter divided by world_size, the "
        "weights and gradients kept whole":
            _zero_shards({0: (), 1: (), 2: ("optimizer", "gradients"), 3: _ALL}),
        "stage 2 shards the gradients as well as the optimizer state; only the weights stay "
        "whole":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer",), 3: _ALL}),
        "stage 2 shards the gradients, not the weights: each GPU keeps all the 16-bit weights "
        "for its forward and backward until stage 3":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer", "weights"), 3: _ALL}),
        "stage 3 shards everything, the weights too: 16 bytes a parameter divided by "
        "world_size":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"),
                          3: ("optimizer", "gradients")}),
        "that is float32 without a master copy (4 + 4 + 8); in mixed precision the weights "
        "and gradients are 2 bytes each and Adam's state 12 (master weights, m, v)":
            _zero_mistake(weights=4, gradients=4, optimizer=8),
        "the stages differ in what they shard: stage 1 divides only the optimizer's 12 bytes "
        "by world_size, stage 2 also the gradients' 2, stage 3 also the weights' 2":
            _zero_shards({0: (), 1: _ALL, 2: _ALL, 3: _ALL}),
        "the stages add up: stage 3 shards the weights as well as everything stage 2 shards "
        "(optimizer state and gradients)":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"),
                          3: ("weights",)}),
        "the stages add up: each one shards its own part and keeps sharding what the earlier "
        "stages shard (stage 2: optimizer and gradients; stage 3: all three)":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("gradients",), 3: ("weights",)}),
        "the answer is in bytes, not gigabytes: no division by 1e9":
            lambda p, n, s: tuple(v / 1e9 for v in _zero_bytes(p, n, s)),
        "stage 0 is plain data parallelism: every GPU holds all 16 bytes a parameter":
            _zero_shards({0: ("optimizer",), 1: ("optimizer",),
                          2: ("optimizer", "gradients"), 3: _ALL}),
        "each stage shards from its own number on: stage 1 already shards the optimizer state, "
        "stage 2 the gradients, stage 3 the weights (stage >= k, not stage > k)":
            _zero_shards({0: (), 1: (), 2: ("optimizer",), 3: ("optimizer", "gradients")}),
        "divide with /: the bytes on one GPU are a fraction when world_size does not divide "
        "them (case 2 has 7 GPUs), and // drops it": lambda p, n, s: tuple(
            float(p * size // (n if kind in shard else 1)) for size, kind in
            zip((2, 2, 12), _PARTS) for shard in [("optimizer",) * (s >= 1)
                                                  + ("gradients",) * (s >= 2)
                                                  + ("weights",) * (s >= 3)]),
        "a sharded part is divided among all world_size GPUs, each holding 1/world_size of "
        "it, not among world_size - 1": lambda p, n, s: _zero_bytes(p, max(n - 1, 1), s),
    },
    match_every_case=True,
    thorough=True,
)


# --- my_average_gradients(model, num_sequences) ---------------------------------------------------

#: The sequences rank 0 and rank 1 hold in each case: equal shares; a batch of 8 that splits 3
#: and 5 (the last slice is short when the batch does not divide by the world size); and a batch
#: of 5, so that no total can be written in.
_SHARES = [(4, 4), (3, 5), (1, 4)]
#: Seconds a rank waits for the other inside a collective before giving up, and the whole launch.
_WAIT, _LAUNCH = 20, 60


def _problem() -> tuple[nn.Module, Tensor, Tensor]:
    """The model and the 8 sequences every rank builds alike, in float64; the caller's random
    state is left alone."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    return model, x, x.sum(dim=1, keepdim=True).sin()


_NAMES = [name for name, _ in _problem()[0].named_parameters()]


def _gradients(rows: slice) -> list[Tensor]:
    """The gradient of the mean squared error over ``rows``, in one process."""
    model, x, y = _problem()
    ((model(x[rows]) - y[rows]) ** 2).mean().backward()
    return [p.grad for p in model.parameters()]


def _leave_with(parent: int, seconds: float) -> None:
    """End this process when its parent has gone (a kernel interrupted or restarted) or after
    ``seconds``: a rank must never outlive the checker that started it."""
    def watch() -> None:
        end = time.monotonic() + seconds
        while os.getppid() == parent and time.monotonic() < end:
            time.sleep(0.2)
        os._exit(3)
    threading.Thread(target=watch, daemon=True).start()


def _rank_main(folder: str, rank: int, parent: int) -> None:
    """One rank of the checker's gloo group (run as ``python -c``): for each function sent, for
    each case, the local backward, the function, and what it leaves, saved to
    ``folder/rank<rank>.pt`` after every case as one list per function of
    ``["grads", [tensor or "None", ...], [weight, ...]]`` per case, or
    ``["error", name, message]``. The file is written after each case, so that a rank that
    gloo aborts (a collective whose sizes differ between the ranks) leaves what it finished."""
    _leave_with(parent, _LAUNCH + 10)
    torch.set_num_threads(1)
    functions = cloudpickle.loads(Path(folder, "function.pkl").read_bytes())
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=_WAIT))
    results: list[list] = []
    path = Path(folder, f"rank{rank}.pt")
    torch.save(results, path)
    try:
        for function in functions:
            done: list = []
            results.append(done)
            for shares in _SHARES:
                model, x, y = _problem()
                rows = slice(sum(shares[:rank]), sum(shares[:rank + 1]))
                ((model(x[rows]) - y[rows]) ** 2).mean().backward()
                try:
                    function(model, shares[rank])
                except Exception as error:              # the learner's bug, reported
                    done.append(["error", type(error).__name__, " ".join(str(error).split())])
                    break
                done.append(["grads", [p.grad.detach().clone() if p.grad is not None
                                       else "None" for p in model.parameters()],
                             [p.detach().clone() for p in model.parameters()]])
                torch.save(results, path)
    finally:
        torch.save(results, path)
        dist.destroy_process_group()


def _is_stub(function: Callable) -> bool:
    """The exercise's untouched stub: a body that only raises NotImplementedError (comments
    leave no trace in the code), recognised without starting any process."""
    code = getattr(function, "__code__", None)
    if code is None or set(code.co_names) != {"NotImplementedError"}:
        return False
    names = {instruction.opname for instruction in dis.get_instructions(code)}
    return "RAISE_VARARGS" in names and names <= {
        "RESUME", "NOP", "CACHE", "LOAD_GLOBAL", "LOAD_CONST", "PUSH_NULL", "PRECALL", "CALL",
        "CALL_FUNCTION", "RAISE_VARARGS", "RETURN_VALUE", "RETURN_CONST", "EXTENDED_ARG"}


def _run_on_two_ranks(functions: list[Callable]) -> list[list] | str:
    """Run each function in turn on one fresh two-process gloo group: per rank, per function,
    per case, what :func:`_rank_main` saved; or why the launch failed, in words. (The checker
    sends one function; tests send several that make matching collectives.)"""
    try:
        payload = cloudpickle.dumps(list(functions))
    except Exception as error:
        return (f"your function cannot be sent to the two processes ({type(error).__name__}: "
                f"{' '.join(str(error).split())}): keep it to torch and dist, without open "
                f"files, locks or progress bars")
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    code = (f"from {__name__} import _rank_main; import sys; "
            f"_rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "function.pkl").write_bytes(payload)
        ranks = [subprocess.Popen([sys.executable, "-c", code, folder, str(rank),
                                   str(os.getpid())], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
                 for rank in (0, 1)]
        end = time.monotonic() + _LAUNCH * len(functions)
        try:
            errors = [rank.communicate(timeout=max(end - time.monotonic(), 0.1))[1]
                      for rank in ranks]
        except subprocess.TimeoutExpired:
            return (f"your function did not return within {_LAUNCH} s on at least one rank (an "
                    f"endless loop, or a wait for something the other rank never does)")
        finally:                                    # also on an interrupt: no rank outlives us
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                    rank.communicate()
        found = []
        for rank, error in enumerate(errors):
            path = Path(folder, f"rank{rank}.pt")
            if not path.exists():
                last = error.strip().splitlines()[-1] if error.strip() else "no message"
                return f"rank {rank} failed before it ran your function: {last}"
            found.append(torch.load(path, weights_only=True))
        return found


def _average_gradients(model: nn.Module, num_sequences: int) -> None:
    """Weight each rank's gradient by its sequences, add them up, divide by all sequences."""
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.grad)
        p.grad /= total


def _mean_of_means(model: nn.Module, num_sequences: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _sum_only(model: nn.Module, num_sequences: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _reduced_a_copy(model: nn.Module, num_sequences: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad * num_sequences)


def _reduced_the_weights(model: nn.Module, num_sequences: int) -> None:
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.data)
        p.grad /= total


def _averaged_and_the_weights_reduced(model: nn.Module, num_sequences: int) -> None:
    _average_gradients(model, num_sequences)
    for p in model.parameters():
        dist.all_reduce(p.data)


def _scaled_after_the_sum(model: nn.Module, num_sequences: int) -> None:
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad *= num_sequences / total


def _scaled_and_reduced_a_copy(model: nn.Module, num_sequences: int) -> None:
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.grad.clone())
        p.grad /= total


def _broadcast(model: nn.Module, num_sequences: int) -> None:
    for p in model.parameters():
        dist.broadcast(p.grad, src=0)


def _reduced_to_rank_0(model: nn.Module, num_sequences: int) -> None:
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= num_sequences
        dist.reduce(p.grad, dst=0)
        p.grad /= total


def _means_over_the_total(model: nn.Module, num_sequences: int) -> None:
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= total


def _weighted_by(divisor: Callable[[int], float]) -> Callable:
    """All-reduce each gradient times num_sequences, then divide by ``divisor(num_sequences)``."""
    def wrong(model: nn.Module, num_sequences: int) -> None:
        for p in model.parameters():
            p.grad *= num_sequences
            dist.all_reduce(p.grad)
            p.grad /= divisor(num_sequences)
    return wrong


#: Each mistake, and what it leaves on rank r from the ranks' own gradients g = (g0, g1) and the
#: shares n = (n0, n1), and (a third item, True) where it doubles the weights: the checker
#: matches the learner's gradients and weights against these.
_AVERAGING_MISTAKES = {
    "with unequal shares the mean of the ranks' means is not the mean over all sequences: "
    "multiply each rank's gradient by its num_sequences, all_reduce, and divide by the total "
    "number of sequences (ReduceOp.AVG has the same problem)":
        (_mean_of_means, lambda g, n, r: (g[0] + g[1]) / 2),
    "all_reduce adds the ranks' tensors: divide the sum by the number of sequences on all "
    "ranks together":
        (_sum_only, lambda g, n, r: g[0] + g[1]),
    "each rank still holds its own gradient: dist.all_reduce changes the tensor it is given, "
    "in place, so give it p.grad itself (p.grad * n is a new tensor, and p.data holds the "
    "weights) and scale p.grad in place (p.grad *= n)":
        (_reduced_a_copy, lambda g, n, r: g[r]),
    "the gradients were scaled but never added across the ranks: all_reduce p.grad (p.data "
    "holds the weights)":
        (_reduced_the_weights, lambda g, n, r: g[r] * n[r] / (n[0] + n[1]), True),
    "the gradients are right, but all_reduce also added the ranks' weights (p.data), so "
    "every weight doubled: reduce p.grad only, and leave the weights to the optimizer":
        (_averaged_and_the_weights_reduced,
         lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / (n[0] + n[1]), True),
    "each rank's gradient was scaled but never added across the ranks: all_reduce adds in "
    "place, into the tensor it is given, so give it p.grad itself, not a copy":
        (_scaled_and_reduced_a_copy, lambda g, n, r: g[r] * n[r] / (n[0] + n[1])),
    "scale before the all_reduce: afterwards every rank holds the same sum, and multiplying "
    "it by this rank's num_sequences weights the sum, not this rank's gradient":
        (_scaled_after_the_sum, lambda g, n, r: (g[0] + g[1]) * n[r] / (n[0] + n[1])),
    "dist.broadcast copies rank 0's tensor to every rank, so rank 1's sequences are lost: "
    "dist.all_reduce adds the ranks' tensors":
        (_broadcast, lambda g, n, r: g[0]),
    "dist.reduce leaves the sum on one rank (dst) only, and the other rank keeps its own "
    "gradient: dist.all_reduce leaves the sum on every rank":
        (_reduced_to_rank_0,
         lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / (n[0] + n[1]) if r == 0 else None),
    "backward() left each rank the mean over its own sequences: multiply it by num_sequences "
    "to get their sum before adding the ranks' gradients and dividing by the total":
        (_means_over_the_total, lambda g, n, r: (g[0] + g[1]) / (n[0] + n[1])),
    "divide by the number of sequences on all ranks (sum(num_sequences), another all_reduce), "
    "not by the world size":
        (_weighted_by(lambda n: 2), lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / 2),
    "divide by the number of sequences on all ranks (another all_reduce), not by this rank's "
    "own num_sequences: after the all_reduce the sum holds every rank's sequences":
        (_weighted_by(lambda n: n), lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / n[r]),
    "the sum of the weighted gradients still needs dividing by the number of sequences on all "
    "ranks":
        (_weighted_by(lambda n: 1), lambda g, n, r: n[0] * g[0] + n[1] * g[1]),
    "num_sequences * world_size is the total only when every rank holds as many sequences: "
    "all_reduce a tensor holding num_sequences to get the true total":
        (_weighted_by(lambda n: 2 * n),
         lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / (2 * n[r])),
    "the number of sequences changes from batch to batch (8, 8, then 5 here): all_reduce this "
    "rank's num_sequences to get the total, do not write it in":
        (_weighted_by(lambda n: 8), lambda g, n, r: (n[0] * g[0] + n[1] * g[1]) / 8),
}

_UNMATCHED_HINT = ("every rank must make the same collective calls, in the same order: an "
                   "all_reduce that only one rank makes waits for a partner that never comes "
                   "(no `if dist.get_rank() == 0:` around it)")
_RETURNED_NONE_HINT = ("dist.all_reduce works in place and returns None: do not assign its "
                       "result to p.grad (and do not zero the gradients afterwards)")
_NOT_A_TENSOR_HINT = ("dist.all_reduce needs a tensor: keep the count as "
                      "torch.tensor(num_sequences), and call .item() only after the all_reduce")


class _TwoRankChecker(Checker):
    """A :class:`Checker` that runs the function on both ranks of a two-process gloo group and
    compares every rank's gradients with the gradient of all the ranks' sequences together. A
    hint is given when a listed mistake leaves the same gradients on both ranks in every case:
    mistakes that agree with each other, or with the right answer, on equal shares differ on
    unequal ones."""

    def run(self, function: Callable) -> Verdict:
        if not callable(function):
            return super().run(function)
        if _is_stub(function):                      # no need to start two processes
            return Verdict(False, f"{FAIL} not implemented yet")
        found = _run_on_two_ranks([function])
        if isinstance(found, str):
            return Verdict(False, f"{FAIL} {found}")
        return self._verdict([rank[0] if rank else [] for rank in found])

    def run_many(self, functions: list[Callable]) -> list[Verdict]:
        """:meth:`run` for several functions on one two-process launch (for tests): each must
        make the same collective calls on both ranks and not raise, or the next ones are
        judged on a broken group."""
        found = _run_on_two_ranks(functions)
        if isinstance(found, str):
            return [Verdict(False, f"{FAIL} {found}")] * len(functions)
        return [self._verdict([rank[i] if len(rank) > i else [] for rank in found])
                for i in range(len(functions))]

    def _verdict(self, found: list[list]) -> Verdict:
        """The verdict on what one function left on the two ranks, case by case."""
        weights = [p.detach() for p in _problem()[0].parameters()]
        for number, shares in enumerate(self.cases, start=1):
            where = (f"case {number}: for input (model, num_sequences) with shares {shares} "
                     f"on ranks 0 and 1")
            problem = self._problem_in(found, number, where)
            if problem is not None:
                return Verdict(False, problem)
            whole = _gradients(slice(0, sum(shares)))
            for rank, what, wanted in [(0, "gradients", whole), (1, "gradients", whole),
                                       (0, "weights", weights), (1, "weights", weights)]:
                got = found[rank][number - 1][1 if what == "gradients" else 2]
                if not _same(got, wanted):
                    name, gap = max(((name, _gap(a, b)) for name, a, b in zip(_NAMES, got,
                                                                             wanted)),
                                    key=lambda item: item[1])
                    message = (f"{FAIL} {where}, rank {rank}'s gradients are not the gradient "
                               f"of the mean loss over all {sum(shares)} sequences ({name} "
                               f"differs by up to {gap:.1e})") if what == "gradients" else (
                        f"{FAIL} {where}, your function changed rank {rank}'s weights "
                        f"({name} differs from before by up to {gap:.1e}): it must change "
                        f"only the gradients")
                    hint = self._hint(found)
                    return Verdict(False, f"{message}. Hint: {hint}" if hint else message)
        return Verdict(True, f"{PASS} all {len(self.cases)} checks passed")

    def _problem_in(self, found: list[list], number: int, where: str) -> str | None:
        """What stopped case ``number`` before its gradients could be compared: the learner's
        own error on either rank first, then a collective only one rank made, then a gradient
        left as None; else None."""
        got = {rank: found[rank][number - 1] for rank in (0, 1) if len(found[rank]) >= number}
        errors = [(rank, result) for rank, result in got.items() if result[0] == "error"]
        for rank, (_, name, message) in errors:
            if name == "NotImplementedError":
                return f"{FAIL} not implemented yet"
        own = [(rank, result) for rank, result in errors if "gloo" not in result[2]]
        if own:
            rank, (_, name, message) = own[0]
            text = f"{FAIL} {where}: on rank {rank}, your function raised {name}: {message}"
            if name == "TypeError" and "Expected parameter `tensor`" in message:
                text += f". Hint: {_NOT_A_TENSOR_HINT}"
            return text
        stopped = [rank for rank in (0, 1) if rank not in got]
        if stopped:                 # gloo ended the process: the ranks' tensors differed
            return (f"{FAIL} {where}, rank {stopped[0]} was stopped inside a collective call "
                    f"that the other rank did not match. Hint: {_UNMATCHED_HINT}")
        if errors:
            return (f"{FAIL} {where}, rank {errors[0][0]} waited in vain for the other rank. "
                    f"Hint: {_UNMATCHED_HINT}")
        for rank in (0, 1):
            for name, grad in zip(_NAMES, got[rank][1]):
                if not isinstance(grad, Tensor):
                    return (f"{FAIL} {where}: after your function, p.grad of {name} is None on "
                            f"rank {rank}. Hint: {_RETURNED_NONE_HINT}")
        return None

    def _hint(self, found: list[list]) -> str | None:
        """The first mistake that leaves what the learner's function left, rank by rank, in
        every case it finished."""
        done = [(shares, local, number) for number, (shares, local) in enumerate(self._locals())
                if all(len(found[r]) > number and found[r][number][0] == "grads"
                       for r in (0, 1))]
        weights = [p.detach() for p in _problem()[0].parameters()]
        for hint, (_, left, *doubled) in _AVERAGING_MISTAKES.items():
            kept = [w * (2 if doubled else 1) for w in weights]
            if all(_left_alike(found[rank][number][1],
                               [left(pair, shares, rank) for pair in zip(*local)])
                   and _same(found[rank][number][2], kept)
                   for shares, local, number in done for rank in (0, 1)):
                return hint
        if done and all(_some_averaged(found[rank][number][1], local[rank],
                                       _gradients(slice(0, sum(shares))))
                        for shares, local, number in done for rank in (0, 1)):
            return _SOME_PARAMETERS_HINT
        return None

    def _locals(self) -> list[tuple[tuple, list[list[Tensor]]]]:
        """Each case's shares and the two ranks' own gradients before any averaging."""
        return [(shares, [_gradients(slice(sum(shares[:r]), sum(shares[:r + 1])))
                          for r in (0, 1)]) for shares in self.cases]


_SOME_PARAMETERS_HINT = ("only some parameters' gradients were averaged, the others are still "
                         "the rank's own: average every parameter's (a return inside the loop "
                         "over model.parameters() stops after the first)")


def _some_averaged(got: list, own: list, whole: list) -> bool:
    """Each gradient either the right one or the rank's own, the first right, some own."""
    right = [_same([a], [b]) for a, b in zip(got, whole)]
    kept = [_same([a], [b]) for a, b in zip(got, own)]
    return bool(right) and right[0] and all(r or k for r, k in zip(right, kept)) and \
        not all(right)


def _left_alike(got: list, expected: list) -> bool:
    """:func:`_same`, where ``None`` in ``expected`` (what gloo leaves on a rank that is not
    dist.reduce's destination) matches anything."""
    return any(e is None for e in expected) or _same(got, expected)


def _gap(got: Tensor, expected: Tensor) -> float:
    """The largest difference, infinite for a tensor of another shape."""
    if not isinstance(got, Tensor) or got.shape != expected.shape:
        return float("inf")
    return (got - expected).abs().max().item()


def _same(got: list, expected: list[Tensor]) -> bool:
    """Equal to float32's precision: a scale factor computed in float32 (a count tensor of the
    default dtype) is a right answer; every listed mistake is off by far more."""
    return len(got) == len(expected) and all(
        isinstance(a, Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-9)
        for a, b in zip(got, expected))


check_average_gradients = _TwoRankChecker(
    reference=_average_gradients,
    cases=_SHARES,
    mistakes={hint: function for hint, (function, *_) in _AVERAGING_MISTAKES.items()},
)
