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
  weights, 2 of gradients, 12 of optimizer state per parameter).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
from torch import Tensor, nn

from minitransformer.exercises import Checker, Verdict

__all__ = ["check_restore", "check_ring_bytes", "check_zero_bytes"]


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


def _restore_step_plus_one(model, optimizer, generator, checkpoint):
    return _restore(model, optimizer, generator, checkpoint) + 1


def _restore_swapped_rngs(model, optimizer, generator, checkpoint):
    swapped = {**checkpoint, "torch_rng": checkpoint["data_rng"],
               "data_rng": checkpoint["torch_rng"]}
    return _restore(model, optimizer, generator, swapped)


class _ResumeChecker(Checker):
    """A :class:`Checker` of restore functions: each function (the learner's, the reference,
    every listed mistake) is run inside the same train-stop-restore-train program, and the
    final weights are compared exactly."""

    def run(self, function: Callable) -> Verdict:
        if not callable(function):
            return super().run(function)
        inner = Checker(reference=_resumed_weights(self.reference), cases=self.cases,
                        mistakes={hint: _resumed_weights(wrong)
                                  for hint, wrong in self.mistakes.items()},
                        atol=0.0, rtol=0.0)
        return inner.run(_resumed_weights(function))


check_restore = _ResumeChecker(
    reference=_restore,
    cases=[(0, 3, 4), (1, 5, 2), (2, 1, 6)],
    mistakes=_restore_mistakes(),
    atol=0.0,
    rtol=0.0,
)


# --- my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number) -----------------------

def _ring_bytes(num_parameters: int, world_size: int, bytes_per_number: int) -> float:
    return 2 * (world_size - 1) / world_size * num_parameters * bytes_per_number


check_ring_bytes = Checker(
    reference=_ring_bytes,
    cases=[(1000, 4, 4), (124_439_808, 8, 4), (36_096, 2, 2), (5000, 1, 4)],
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
        "by N":
            lambda p, n, b: 2 * (n - 1) * p * b,
        "mind the brackets: n - 1 / n is n - (1/n); write (n - 1) / n":
            lambda p, n, b: 2 * (n - 1 / n) * p * b,
        "bytes, not bits: a float32 number is 4 bytes, no factor 8":
            lambda p, n, b: 2 * (n - 1) / n * p * b * 8,
        "(n - 1) // n is integer division, always 0 for n > 1: divide with / (or multiply "
        "first, 2 * (n - 1) * p * b / n)":
            lambda p, n, b: 2 * (n - 1) // n * p * b,
    },
)


# --- my_zero_bytes_per_gpu(num_parameters, world_size, stage) ------------------------------------

def _zero_bytes(num_parameters: int, world_size: int, stage: int, *, weights: int = 2,
                gradients: int = 2, optimizer: int = 12, shard: tuple = ()) -> float:
    """Bytes on one GPU: each kind of state is divided by world_size from its stage on."""
    shard = shard or ("optimizer",) * (stage >= 1) + ("gradients",) * (stage >= 2) + (
        "weights",) * (stage >= 3)
    sizes = {"weights": weights, "gradients": gradients, "optimizer": optimizer}
    return float(sum(num_parameters * size / (world_size if kind in shard else 1)
                     for kind, size in sizes.items()))


def _zero_mistake(**changes) -> Callable:
    return lambda p, n, s: _zero_bytes(p, n, s, **changes)


def _zero_shards(table: dict[int, tuple]) -> Callable:
    return lambda p, n, s: _zero_bytes(p, n, s, shard=table[s] or ("none",))


check_zero_bytes = Checker(
    reference=lambda num_parameters, world_size, stage: _zero_bytes(num_parameters,
                                                                     world_size, stage),
    cases=[(1000, 4, 1), (1000, 4, 2), (1000, 4, 3), (1000, 4, 0),
           (8_030_261_248, 8, 1), (124_439_808, 64, 3)],
    mistakes={
        "Adam's state in mixed precision is 12 bytes a parameter: a float32 master copy of the "
        "weights (4) as well as the two moments (4 + 4)":
            _zero_mistake(optimizer=8),
        "the weights and gradients are float16 (2 bytes each) in mixed precision; only the "
        "optimizer's 12 bytes are float32":
            _zero_mistake(weights=4, gradients=4),
        "stage 1 shards the optimizer state only; the gradients are split from stage 2 on":
            _zero_shards({0: (), 1: ("optimizer", "gradients"), 2: ("optimizer", "gradients"),
                          3: ("optimizer", "gradients", "weights")}),
        "stage 1 shards the optimizer state: 12 bytes a parameter divided by world_size, the "
        "weights and gradients kept whole":
            _zero_shards({0: (), 1: (), 2: ("optimizer", "gradients"),
                          3: ("optimizer", "gradients", "weights")}),
        "stage 2 shards the gradients as well as the optimizer state; only the weights stay "
        "whole":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer",),
                          3: ("optimizer", "gradients", "weights")}),
        "stage 3 shards everything, the weights too: 16 bytes a parameter divided by "
        "world_size":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"),
                          3: ("optimizer", "gradients")}),
        "that is float32 without a master copy (4 + 4 + 8); in mixed precision the weights "
        "and gradients are 2 bytes each and Adam's state 12 (master weights, m, v)":
            _zero_mistake(weights=4, gradients=4, optimizer=8),
        "the stages differ in what they shard: stage 1 divides only the optimizer's 12 bytes "
        "by world_size, stage 2 also the gradients' 2, stage 3 also the weights' 2":
            lambda p, n, s: 16 * p / (n if s >= 1 else 1),
        "the stages add up: stage 3 shards the weights as well as everything stage 2 shards "
        "(optimizer state and gradients)":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"),
                          3: ("weights",)}),
        "the stages add up: each one shards its own part and keeps sharding what the earlier "
        "stages shard (stage 2: optimizer and gradients; stage 3: all three)":
            _zero_shards({0: (), 1: ("optimizer",), 2: ("gradients",), 3: ("weights",)}),
        "the answer is in bytes, not gigabytes: no division by 1e9":
            lambda p, n, s: _zero_bytes(p, n, s) / 1e9,
        "stage 0 is plain data parallelism: every GPU holds all 16 bytes a parameter":
            _zero_shards({0: ("optimizer",), 1: ("optimizer",),
                          2: ("optimizer", "gradients"),
                          3: ("optimizer", "gradients", "weights")}),
    },
)
