"""Training a model on batches and measuring it (chapter 9).

One loop trains every model of the book: each batch is a tuple passed as ``model(*batch)``, and
the model returns ``(logits, loss)``. A GPT's batches are ``(idx, targets)`` (chapter 9), an
encoder-decoder's ``(src, tgt_in, targets)`` (chapter 10).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field

import torch
import tqdm
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer._modes import eval_mode

#: A progress bar that fits a notebook's 79 columns, with the losses after it. No rate and no
#: elapsed time: a stored notebook must come out byte for byte the same when it runs again.
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar:10}| {n_fmt}/{total_fmt}{postfix}"


@dataclass
class TrainingHistory:
    """What :func:`train` measured, one entry per evaluation point.

    Attributes:
        steps: the step number of each point (1-based: after that many updates).
        train_losses: the mean training loss over the steps since the previous point.
        val_losses: the loss on the validation batches at each point (empty without them).
        learning_rates: the learning rate of each step, ``steps`` entries in all.
    """

    steps: list[int] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)


def learning_rate(step: int, *, steps: int, lr: float, warmup_steps: int) -> float:
    """The schedule of :func:`train`: a linear warm-up from ``lr / warmup_steps`` to ``lr`` over
    the first ``warmup_steps`` steps, then a cosine decay to ``lr / 10`` at the last step.
    ``step`` counts from 0, so step 0 already takes ``lr / warmup_steps``, not 0. A step past
    the last (``step >= steps``) stays at ``lr / 10``: the cosine is not followed back up."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, steps - 1 - warmup_steps))
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def wsd_decay_start(steps: int, *, warmup_steps: int) -> int:
    """The first step of :func:`wsd_learning_rate`'s decay: the last fifth of the run (at
    least one step), never inside the warm-up."""
    return max(warmup_steps, steps - max(1, steps // 5))


def wsd_learning_rate(step: int, *, steps: int, lr: float, warmup_steps: int) -> float:
    """The warm-up-stable-decay schedule (Hu et al., 2024; Hagele et al., 2024): the warm-up of
    :func:`learning_rate`, then ``lr`` unchanged until :func:`wsd_decay_start`, then a linear
    decay to ``lr / 10`` at the last step, and ``lr / 10`` after it.

    Before the decay the rate does not depend on ``steps``: a run made longer repeats the
    shorter run's steps exactly up to where the shorter one began to decay, which
    :func:`learning_rate`'s cosine, stretched over every step, cannot do."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    start = wsd_decay_start(steps, warmup_steps=warmup_steps)
    if step < start:
        return lr
    progress = min(1.0, (step - start + 1) / max(1, steps - start))
    return lr * (1.0 - 0.9 * progress)


#: The schedules a :class:`TrainingLoop` (and ``--schedule``) can follow, by name.
SCHEDULES = {"cosine": learning_rate, "wsd": wsd_learning_rate}


def _endless(batches: Iterable[tuple]) -> Iterator[tuple]:
    """The batches over and over: a list is reused, an iterator must not run out."""
    count = 0
    while True:
        before = count
        for batch in batches:
            count += 1
            yield batch
        if count == before:
            raise ValueError(f"batches ran out after {count} batches: pass a list (reused in "
                             f"turn) or an endless iterator such as data.random_batches"
                             if count else "batches is empty")


def _loss_of(model: nn.Module, batch: object) -> Tensor:
    if not isinstance(batch, tuple):
        raise TypeError(f"each batch must be a tuple of model inputs, e.g. (idx, targets), got "
                        f"{type(batch).__name__}")
    output = model(*batch)
    if not isinstance(output, tuple) or len(output) != 2 or output[1] is None:
        raise ValueError("model(*batch) must return (logits, loss) with a loss: do the batches "
                         "hold the targets?")
    return output[1]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; weight decay on the matrices only, not on biases and layer-norm parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def train(model: nn.Module, batches: Iterable[tuple], *, steps: int, lr: float,
          val_batches: Iterable[tuple] | None = None, eval_batches: int | None = None,
          eval_every: int = 100, warmup_steps: int | None = None, weight_decay: float = 0.1,
          max_grad_norm: float = 1.0, progress: bool = True) -> TrainingHistory:
    """Train ``model`` for ``steps`` updates with AdamW (Loshchilov and Hutter, 2019).

    Each step takes the next batch, computes ``loss = model(*batch)[1]``, clips the gradient to
    norm ``max_grad_norm`` and updates with the learning rate of :func:`learning_rate` (warm-up,
    then cosine decay). Every ``eval_every`` steps, and after the last, the history records the
    mean training loss since the previous point and, with ``val_batches``, :func:`evaluate`'s
    validation loss. The model is left in eval mode.

    Args:
        model: returns ``(logits, loss)`` for ``model(*batch)``.
        batches: tuples of tensors; a list is reused in turn, an iterator (such as
            :func:`~minitransformer.data.random_batches`) must last ``steps`` batches.
        steps: the number of updates.
        lr: the peak learning rate.
        val_batches: the batches of the validation loss: a list (or another sized
            collection), or an iterator together with ``eval_batches``.
        eval_batches: use only the first ``eval_batches`` validation batches, taken once, so
            that every evaluation point measures the same set; needed when ``val_batches`` is
            an iterator, which may never end (such as ``random_batches``).
        eval_every: steps between evaluation points.
        warmup_steps: steps of linear warm-up, at most ``steps``; default
            ``min(100, steps // 10)``, at least 1.
        weight_decay: AdamW's decoupled weight decay, applied to weight matrices only.
        max_grad_norm: the gradient's total norm is clipped to this.
        progress: show a tqdm progress bar (a plain text bar, so stored notebooks hold text).

    Returns:
        a :class:`TrainingHistory`. Runs repeat exactly with the same seed, batches and thread
        count on the same machine.

    Raises:
        TypeError, ValueError: bad arguments (``warmup_steps > steps``; an iterator as
            ``val_batches`` without ``eval_batches``), a batch that is not a tuple, a model that
            returns no loss, batches that run out, or a loss that becomes NaN or infinite.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    _checks.check_int("steps", steps)
    _checks.check_type("progress", progress, bool, "True or False")
    lr = _checks.check_number("lr", lr, positive=True)
    _checks.check_int("eval_every", eval_every)
    warmup_steps = (max(1, min(100, steps // 10)) if warmup_steps is None
                    else _checks.check_int("warmup_steps", warmup_steps))
    if warmup_steps > steps:
        raise ValueError(f"warmup_steps={warmup_steps} is more than steps={steps}: the learning "
                         f"rate would never reach lr")
    _checks.check_number("weight_decay", weight_decay, low=0.0)
    _checks.check_number("max_grad_norm", max_grad_norm, positive=True)
    val_batches = _validation_set(val_batches, eval_batches)

    optimizer = make_optimizer(model, lr, weight_decay)
    loop = TrainingLoop(model, optimizer, steps=steps, lr=lr, warmup_steps=warmup_steps,
                        max_grad_norm=max_grad_norm, val_batches=val_batches,
                        eval_every=eval_every)
    bar = tqdm.tqdm(total=steps, disable=not progress, desc="training", mininterval=0.5,
                    bar_format=BAR_FORMAT)
    history = loop.run(_endless(batches), bar=bar)
    bar.close()
    sys.stderr.flush()  # the bar's last newline before anything printed next (notebook order)
    model.eval()
    return history


class TrainingLoop:
    """The loop of :func:`train` as an object, so that a program can stop it, save its state
    and go on later (chapter 15's command line). :func:`train` and the command line both run
    this loop: one step takes ``grad_accum`` batches from the stream, adds their gradients
    (each loss divided by ``grad_accum``, so the update equals one batch that many times
    larger), clips, and updates with :func:`learning_rate`'s rate.

    A model wrapped in ``DistributedDataParallel`` is passed as ``model`` (its ``no_sync``
    skips the all-reduce of every micro-batch but the last); ``eval_model`` is then the bare
    model that :func:`evaluate` runs, and ``mean_loss`` turns each process's loss into the mean
    over all processes, so that the recorded training loss is the whole batch's. ``schedule``
    names the learning-rate schedule in ``SCHEDULES`` (``"cosine"`` or ``"wsd"``).
    ``step`` counts the updates done; :meth:`state_dict` and :meth:`load_state_dict` save and
    restore it with the running loss and the history.
    Arguments are checked by the caller (:func:`train`, the command line).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, steps: int,
                 lr: float, warmup_steps: int, max_grad_norm: float = 1.0,
                 grad_accum: int = 1, val_batches: list[tuple] | None = None,
                 eval_every: int = 100, eval_model: nn.Module | None = None,
                 schedule: str = "cosine",
                 mean_loss: Callable[[float], float] | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.schedule, self.mean_loss = SCHEDULES[schedule], mean_loss
        self.steps, self.lr, self.warmup_steps = steps, lr, warmup_steps
        self.max_grad_norm, self.grad_accum = max_grad_norm, grad_accum
        self.val_batches, self.eval_every = val_batches, eval_every
        self.eval_model = model if eval_model is None else eval_model
        self.step = 0
        self.history = TrainingHistory()
        self._running, self._since = 0.0, 0

    def run(self, stream: Iterator[tuple], *, bar: tqdm.tqdm | None = None,
            after_step: Callable[[TrainingLoop], None] | None = None) -> TrainingHistory:
        """Train from ``self.step`` to ``steps``; ``after_step(self)`` runs after each update
        (and after its evaluation, if the step has one)."""
        self.model.train()
        while self.step < self.steps:
            rate = self.schedule(self.step, steps=self.steps, lr=self.lr,
                                 warmup_steps=self.warmup_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = rate
            loss = self._gradients(stream)
            if self.mean_loss is not None:      # this process's loss -> the whole batch's
                loss = self.mean_loss(loss)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
            self.step += 1
            self.history.learning_rates.append(rate)
            self._running, self._since = self._running + loss, self._since + 1
            if bar is not None:
                bar.update(1)
            if self.step % self.eval_every == 0 or self.step == self.steps:
                self._evaluate(bar)
            if after_step is not None:
                after_step(self)
        return self.history

    def _gradients(self, stream: Iterator[tuple]) -> float:
        """Backward through the step's ``grad_accum`` batches; their mean loss."""
        self.optimizer.zero_grad(set_to_none=True)
        no_sync = getattr(self.model, "no_sync", contextlib.nullcontext)
        total = 0.0
        for micro in range(self.grad_accum):
            last = micro == self.grad_accum - 1
            with contextlib.nullcontext() if last else no_sync():
                loss = _loss_of(self.model, next(stream))
                if not torch.isfinite(loss):
                    raise ValueError(f"the loss became {loss.item()} at step {self.step + 1}: "
                                     f"try a lower lr")
                if self.grad_accum > 1:
                    loss = loss / self.grad_accum
                loss.backward()
            total += loss.item()
        return total

    def _evaluate(self, bar: tqdm.tqdm | None) -> None:
        history = self.history
        history.steps.append(self.step)
        history.train_losses.append(self._running / self._since)
        self._running, self._since = 0.0, 0
        postfix = {"train loss": f"{history.train_losses[-1]:.3f}"}
        if self.val_batches is not None:
            history.val_losses.append(evaluate(self.eval_model, self.val_batches))
            self.model.train()
            postfix["val loss"] = f"{history.val_losses[-1]:.3f}"
        if bar is not None:
            bar.set_postfix(postfix)

    def state_dict(self) -> dict:
        """The loop's own state as JSON-ready values (the model's and optimizer's are apart)."""
        return {"step": self.step, "running_loss": self._running, "since": self._since,
                "history": dataclasses.asdict(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.step = state["step"]
        self._running, self._since = state["running_loss"], state["since"]
        self.history = TrainingHistory(**state["history"])


def _validation_set(val_batches: Iterable[tuple] | None,
                    eval_batches: int | None) -> list[tuple] | None:
    """The fixed list of batches :func:`train` evaluates on: never ``list()`` of an iterator that
    may be endless."""
    if eval_batches is not None:
        _checks.check_int("eval_batches", eval_batches)
        if val_batches is None:
            raise ValueError("eval_batches needs val_batches to take the batches from")
    if val_batches is None:
        return None
    if isinstance(val_batches, (str, bytes)) or not isinstance(val_batches, Iterable):
        raise TypeError(f"val_batches must be a list of batches or an iterator of them, got "
                        f"{type(val_batches).__name__}")
    if eval_batches is None:
        if not isinstance(val_batches, Sized):
            raise ValueError("val_batches is an iterator, which may never end: pass a list, or "
                             "eval_batches=N to evaluate on its first N batches")
        return list(val_batches)
    taken = list(itertools.islice(val_batches, eval_batches))
    if len(taken) < eval_batches:
        raise ValueError(f"val_batches holds {len(taken)} batches, fewer than "
                         f"eval_batches={eval_batches}")
    return taken


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[tuple]) -> float:
    """The mean loss of ``model`` over ``batches``, in eval mode (no dropout), each batch
    weighted by its size (the first dimension of its first tensor). The model's mode is
    restored afterwards."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of batches, got {type(batches).__name__}")
    total, count = 0.0, 0
    with eval_mode(model):
        for batch in batches:
            size = batch[0].shape[0] if isinstance(batch, tuple) and batch else 0
            total += _loss_of(model, batch).item() * size
            count += size
    if count == 0:
        raise ValueError("evaluate needs at least one non-empty batch")
    return total / count
