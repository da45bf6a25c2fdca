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
* :data:`check_average_gradients` -- ``my_average_gradients(model, num_sequences)``: called on
  every rank after ``backward()`` on its own ``num_sequences`` sequences, leave on every rank the
  gradient of the mean loss over all ranks' sequences, shares equal or not. The checker starts
  a two-process gloo group, runs the function on both ranks, and compares each rank's gradients
  with the gradient of the whole batch in one process.
"""

from __future__ import annotations

import copy
import datetime
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
    """One rank of the checker's gloo group (run as ``python -c``): for each case, the local
    backward, the learner's function, and what it leaves, saved to ``folder/rank<rank>.pt`` as
    ``["grads", [tensor or "None", ...]]`` per case, or ``["error", name, message]``."""
    _leave_with(parent, _LAUNCH + 10)
    torch.set_num_threads(1)
    function = cloudpickle.loads(Path(folder, "function.pkl").read_bytes())
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=_WAIT))
    results = []
    try:
        for shares in _SHARES:
            model, x, y = _problem()
            rows = slice(sum(shares[:rank]), sum(shares[:rank + 1]))
            ((model(x[rows]) - y[rows]) ** 2).mean().backward()
            try:
                function(model, shares[rank])
            except Exception as error:              # the learner's bug, reported
                results.append(["error", type(error).__name__, " ".join(str(error).split())])
                break
            results.append(["grads", [p.grad.detach().clone() if p.grad is not None else "None"
                                      for p in model.parameters()]])
    finally:
        torch.save(results, Path(folder, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _run_on_two_ranks(function: Callable) -> list[list] | str:
    """Run ``function`` on a fresh two-process gloo group: per rank, per case, what
    :func:`_rank_main` saved; or why the launch failed, in words."""
    try:
        payload = cloudpickle.dumps(function)
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
        end = time.monotonic() + _LAUNCH
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
#: shares n = (n0, n1): the checker matches the learner's gradients against these.
_AVERAGING_MISTAKES = {
    "with unequal shares the mean of the ranks' means is not the mean over all sequences: "
    "multiply each rank's gradient by its num_sequences, all_reduce, and divide by the total "
    "number of sequences (ReduceOp.AVG has the same problem)":
        (_mean_of_means, lambda g, n, r: (g[0] + g[1]) / 2),
    "all_reduce adds the ranks' tensors: divide the sum by the number of sequences on all "
    "ranks together":
        (_sum_only, lambda g, n, r: g[0] + g[1]),
    "each rank still holds its own gradient: dist.all_reduce changes the tensor it is given, "
    "in place, so give it p.grad itself (p.grad * n is a new tensor) and scale p.grad in place "
    "(p.grad *= n)":
        (_reduced_a_copy, lambda g, n, r: g[r]),
    "the gradients were scaled but never added across the ranks: all_reduce p.grad (p.data "
    "holds the weights)":
        (_reduced_the_weights, lambda g, n, r: g[r] * n[r] / (n[0] + n[1])),
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
        found = _run_on_two_ranks(function)
        if isinstance(found, str):
            return Verdict(False, f"{FAIL} {found}")
        for number, shares in enumerate(self.cases, start=1):
            where = (f"case {number}: for input (model, num_sequences) with shares {shares} "
                     f"on ranks 0 and 1")
            problem = self._problem_in(found, number, where)
            if problem is not None:
                return Verdict(False, problem)
            whole = _gradients(slice(0, sum(shares)))
            for rank in (0, 1):
                got = found[rank][number - 1][1]
                if not _same(got, whole):
                    name, gap = max(((name, _gap(a, b)) for name, a, b in zip(_NAMES, got, whole)),
                                    key=lambda item: item[1])
                    message = (f"{FAIL} {where}, rank {rank}'s gradients are not the gradient "
                               f"of the mean loss over all {sum(shares)} sequences ({name} "
                               f"differs by up to {gap:.1e})")
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
        if errors or len(got) < 2:
            rank = errors[0][0] if errors else min(got, default=0)
            return (f"{FAIL} {where}, rank {rank} waited in vain for the other rank. "
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
        for hint, (_, left) in _AVERAGING_MISTAKES.items():
            if all(_same(found[rank][number][1],
                         [left(pair, shares, rank) for pair in zip(*local)])
                   for shares, local, number in done for rank in (0, 1)):
                return hint
        return None

    def _locals(self) -> list[tuple[tuple, list[list[Tensor]]]]:
        """Each case's shares and the two ranks' own gradients before any averaging."""
        return [(shares, [_gradients(slice(sum(shares[:r]), sum(shares[:r + 1])))
                          for r in (0, 1)]) for shares in self.cases]


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
    mistakes={hint: function for hint, (function, _) in _AVERAGING_MISTAKES.items()},
)
