"""Checkers for the exercises of chapter 9, *Training a GPT*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_shift_pairs` -- ``my_shift_pairs(windows)``: the ``(inputs, targets)`` pairs of
  next-token prediction.
* :data:`check_cross_entropy` -- ``my_cross_entropy(logits, targets)``: the mean next-token loss,
  written out, as a tensor.
* :data:`check_parameter_count` -- ``my_parameter_count(config)``: a GPT's number of parameters
  from its config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from minitransformer.data import shift_pairs
from minitransformer.exercises import FAIL, Checker, Verdict, show, show_input
from minitransformer.gpt import GPTConfig

__all__ = ["check_cross_entropy", "check_parameter_count", "check_shift_pairs"]


# --- my_shift_pairs(windows) -> (inputs, targets) -------------------------------------------

check_shift_pairs = Checker(
    reference=shift_pairs,
    cases=[
        (torch.tensor([[5, 1, 4, 2, 3]]),),
        (torch.arange(12).reshape(2, 6),),
        (torch.tensor([[7, 7], [0, 3], [2, 1]]),),
    ],
    mistakes={
        "inputs and targets are swapped: the inputs are the first T tokens, the targets the last "
        "T (each target is the token after its input)":
            lambda w: (w[:, 1:], w[:, :-1]),
        "the windows are (B, T + 1): cut along the columns (dim 1), not the rows":
            lambda w: (w[:-1], w[1:]),
        "the targets are the window moved one token to the left (windows[:, 1:]), not the "
        "same tokens as the inputs":
            lambda w: (w[:, :-1], w[:, :-1]),
        "both are one token short, (B, T - 1): a slice stops before its end index, so "
        "windows[:, :-1] keeps all but the last token and windows[:, 1:] all but the first, "
        "T tokens each":
            lambda w: (w[:, :-2], w[:, 1:-1]),
        "the targets are one token short: they run to the end of the window, windows[:, 1:] "
        "(a slice stops before its end, so 1:-1 drops the last token too)":
            lambda w: (w[:, :-1], w[:, 1:-1]),
        "the inputs are one token short: they are all but the last token, windows[:, :-1] "
        "(a slice stops before its end, so :-2 drops two)":
            lambda w: (w[:, :-2], w[:, 1:]),
        "the inputs are all but the last token, windows[:, :-1]: the last token of a window "
        "has no next token in it to be its target":
            lambda w: (w, w[:, 1:]),
    },
)


# --- my_cross_entropy(logits, targets) -> scalar --------------------------------------------

def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _log_probs_of_targets(logits: Tensor, targets: Tensor, dim: int = -1) -> Tensor:
    return torch.log_softmax(logits, dim=dim).gather(-1, targets[..., None])[..., 0]


def _logit_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(9)
    return [
        (torch.tensor([[[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]]]), torch.tensor([[0, 2]])),
        (torch.randn(2, 4, 6, generator=generator) * 2, torch.randint(6, (2, 4),
                                                                      generator=generator)),
        (torch.randn(3, 5, 11, generator=generator), torch.randint(11, (3, 5),
                                                                   generator=generator)),
    ]


NOT_A_TENSOR_HINT = (
    "return the loss as a tensor, -picked.mean(), as F.cross_entropy does: .item() and "
    "float() turn it into a Python number, which carries no gradient, so loss.backward() "
    "could not train the model")


class _TensorChecker(Checker):
    """A :class:`Checker` that also wants every answer to be a tensor, as the exercise asks:
    a Python float with the right value passes the comparison of values."""

    def run(self, function: Callable[..., Any]) -> Verdict:
        answers = []

        def recorded(*args: Any) -> Any:
            answers.append(function(*args))
            return answers[-1]

        verdict = super().run(recorded if callable(function) else function)
        if not verdict:
            return verdict
        for number, (args, got) in enumerate(zip(self.cases, answers), start=1):
            if not isinstance(got, Tensor):
                return Verdict(False, f"{FAIL} case {number}: for input "
                               f"{show_input(args, self._names())} expected a tensor with "
                               f"one number but got a {type(got).__name__}, {show(got)}. "
                               f"Hint: {NOT_A_TENSOR_HINT}")
        return verdict


check_cross_entropy = _TensorChecker(
    reference=_cross_entropy,
    cases=_logit_cases(),
    mistakes={
        "the loss is the *negative* mean log-probability: it must be positive":
            lambda logits, t: _log_probs_of_targets(logits, t).mean(),
        "take the log of the probabilities (log-softmax), not the probabilities themselves":
            lambda logits, t: -torch.softmax(logits, -1).gather(-1, t[..., None]).mean(),
        "average over all B * T positions; you summed":
            lambda logits, t: -_log_probs_of_targets(logits, t).sum(),
        "softmax runs over the vocabulary (the last dimension), not over the positions":
            lambda logits, t: -_log_probs_of_targets(logits, t, dim=1).mean(),
        "take only the log-probability of each position's target (gather it at the targets' "
        "ids), not the mean over the whole vocabulary":
            lambda logits, t: -torch.log_softmax(logits, -1).mean(),
        "logits are not log-probabilities: subtract torch.logsumexp over the last dimension "
        "(keepdim=True) first":
            lambda logits, t: -logits.gather(-1, t[..., None]).mean(),
        "torch.logsumexp(logits, dim=-1) has shape (B, T), which does not line up with logits "
        "(B, T, N); keepdim=True gives (B, T, 1), which does":
            lambda logits, t: -(logits - torch.logsumexp(logits, -1)).gather(-1, t[..., None])
            .mean(),
        "gather wants an index with as many dimensions as log_probs (B, T, N): "
        "targets[..., None] is (B, T, 1), and [..., 0] drops the extra dimension of the result "
        "again":
            lambda logits, t: -torch.log_softmax(logits, -1).gather(-1, t).mean(),
        "gather along the vocabulary, the last dimension: log_probs.gather(-1, "
        "targets[..., None]); dimension 1 of (B, T, N) is the T positions, so gather(1, ...) "
        "uses the word ids as positions":
            lambda logits, t: -torch.log_softmax(logits, -1).gather(1, t[..., None])[..., 0]
            .mean(),
    },
    atol=1e-5,
)


# --- my_parameter_count(config) -> int ------------------------------------------------------

def _parameter_count(config: GPTConfig, *, tied: bool = True, biases: bool = True,
                     block_norms: bool = True, final_norm: bool = True,
                     norm_biases: bool = True, out_proj: bool = True,
                     positions: bool = True, sinusoidal_counted: bool = False,
                     d_ff: int | None = None, blocks: int | None = None) -> int:
    d, n = config.d_model, config.vocab_size
    f = config.d_ff if d_ff is None else d_ff
    norm = 2 * d if norm_biases else d
    projections = 4 if out_proj else 3
    attention = projections * (d * d + (d if biases else 0))
    feed_forward = 2 * d * f + (f + d if biases else 0)
    block = attention + feed_forward + (2 * norm if block_norms else 0)
    num_blocks = config.num_layers if blocks is None else blocks
    count = n * d + num_blocks * block + (norm if final_norm else 0)
    if positions and (config.positional == "learned" or sinusoidal_counted):
        count += config.context_length * d
    return count if tied else count + n * d


def _parameter_count_of(config: GPTConfig) -> int:
    return _parameter_count(config)


check_parameter_count = Checker(
    reference=_parameter_count_of,
    cases=[
        (GPTConfig(vocab_size=47, context_length=32, num_layers=2, num_heads=4, d_model=64),),
        (GPTConfig(vocab_size=10, context_length=8, num_layers=1, num_heads=1, d_model=4,
                   d_ff=6),),
        (GPTConfig(vocab_size=50, context_length=16, num_layers=3, num_heads=2, d_model=8,
                   d_ff=12, positional="sinusoidal"),),
    ],
    mistakes={
        "the head shares its weight matrix with the token embedding (weight tying): count it "
        "once":
            lambda c: _parameter_count(c, tied=False),
        "every linear layer of the blocks has a bias: d_model for each of the four attention "
        "projections, d_ff for linear1 and d_model for linear2":
            lambda c: _parameter_count(c, biases=False),
        "each block has two layer norms, and one more follows the last block; each has a weight "
        "and a bias of d_model numbers":
            lambda c: _parameter_count(c, block_norms=False, final_norm=False),
        "each block has two layer norms (norm1 before attention, norm2 before the feed-forward "
        "block)":
            lambda c: _parameter_count(c, block_norms=False),
        "one more layer norm follows the last block, before the head: 2 * d_model numbers":
            lambda c: _parameter_count(c, final_norm=False),
        "a layer norm has a bias as well as a weight: 2 * d_model numbers each":
            lambda c: _parameter_count(c, norm_biases=False),
        "attention has four projections (q_proj, k_proj, v_proj and out_proj), each a "
        "(d_model, d_model) weight and a bias":
            lambda c: _parameter_count(c, out_proj=False),
        "the model stacks num_layers blocks: multiply one block's count by num_layers":
            lambda c: _parameter_count(c, blocks=1),
        "use config.d_ff: it is 4 * d_model only when the config leaves it out":
            lambda c: _parameter_count(c, d_ff=4 * c.d_model),
        "learned positions are a (context_length, d_model) table of parameters":
            lambda c: _parameter_count(c, positions=False),
        "sinusoidal positions are computed by a formula, not learned: they add no parameters":
            lambda c: _parameter_count(c, sinusoidal_counted=True),
    },
)
