"""Checkers for the exercises of chapter 4, *Attention as matrix multiplication*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_attend` -- ``my_attend(masks, seen, recent)``: pull the most recent word's mask
  out of the stacked masks with a one-hot vector, and apply it to the words seen so far.
* :data:`check_feature_weights` -- ``my_feature_weights(present, absent, vocab_size)``: the
  weight row and bias of a hand-set feature that fires for one combination of words.
* :data:`check_feed_forward` -- ``my_feed_forward(x, w1, b1, w2, b2)``: feature creation, ReLU,
  transition.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from minitransformer.exercises import Checker
from minitransformer.markov import SkipModel
from minitransformer.vocab import Vocabulary

__all__ = ["check_attend", "check_feature_weights", "check_feed_forward"]

_SENTENCES = ["Check the program log and find out whether it ran please.",
              "Check the battery log and find out whether it ran down please."]
_VOCAB = Vocabulary.from_sentences(_SENTENCES)
_N = len(_VOCAB)


def _multi_hot(words: list[str], vocab: Vocabulary = _VOCAB) -> Tensor:
    vector = torch.zeros(len(vocab))
    vector[vocab.encode(words)] = 1.0
    return vector


def _random_cases(seed: int, count: int, n: int) -> list[tuple]:
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(count):
        masks = (torch.rand(n, n, generator=generator) < 0.5).float()
        seen = (torch.rand(n, generator=generator) < 0.6).float()
        recent = int(torch.randint(n, (1,), generator=generator))
        cases.append((masks, seen, recent))
    return cases


# --- attend(masks, seen, recent) -> (N,) float tensor ---------------------------------------

def _chapter_masks() -> Tensor:
    # The chapter's mask matrix: every word attends to itself, and "ran" also to battery and
    # program. With more than one non-zero row, seen @ masks (the masks of all seen words added
    # up) differs from the mask of the most recent word alone.
    masks = torch.eye(_N)
    masks[_VOCAB.index("ran"), _VOCAB.encode(["battery", "program"])] = 1.0
    return masks


def _attend(masks: Tensor, seen: Tensor, recent: int) -> Tensor:
    query = torch.zeros(masks.shape[0], dtype=masks.dtype)
    query[recent] = 1.0
    return seen * (query @ masks)


def _numpy_one_hot_as_tensor(masks, seen, recent):
    # np.eye / one_hot give float64; torch.tensor keeps it, and float64 @ float32 fails
    return seen * (torch.tensor(np.eye(masks.shape[0])[recent]) @ masks)


def _numpy_one_hot(masks, seen, recent):
    return seen * (np.eye(masks.shape[0])[recent] @ masks)   # numpy @ tensor: a TypeError


check_attend = Checker(
    reference=_attend,
    cases=[
        (_chapter_masks(), _multi_hot(["check", "the", "battery", "log", "and", "find", "out",
                                       "whether", "it", "ran"]), _VOCAB.index("ran")),
        (_chapter_masks(), _multi_hot(["check", "the", "program", "log", "and", "find", "out",
                                       "whether", "it", "ran"]), _VOCAB.index("ran")),
        *_random_cases(seed=4, count=3, n=5),
    ],
    mistakes={
        "that is the whole mask: multiply it element by element with the words seen so far":
            lambda masks, seen, recent: masks[recent].clone(),
        "you pulled out a column; the one-hot vector of the most recent word multiplies the mask "
        "matrix from the left (one_hot @ masks), which picks a row":
            lambda masks, seen, recent: seen * masks[:, recent],
        "a mask is applied by multiplying, not by adding":
            lambda masks, seen, recent: seen + masks[recent],
        "seen @ masks adds up the masks of every word seen so far; the one-hot vector of the "
        "most recent word picks its mask alone (one_hot @ masks), and that mask then multiplies "
        "seen element by element": lambda masks, seen, recent: seen @ masks,
        "your one-hot vector is float64 (numpy's default, kept by torch.tensor) and masks is "
        "float32; torch multiplies only equal dtypes. Build it as "
        "torch.zeros(len(masks), dtype=masks.dtype), or convert it with "
        "torch.as_tensor(vector, dtype=masks.dtype)": _numpy_one_hot_as_tensor,
        "your one-hot vector is a numpy array and masks a torch tensor, and @ does not mix them. "
        "Build it as a tensor: torch.zeros(len(masks), dtype=masks.dtype), then set entry "
        "recent to 1": _numpy_one_hot,
    },
)


# --- feature_weights(present, absent, vocab_size) -> (vocab_size + 1,) float tensor ---------

def _feature_weights(present: list[int], absent: list[int], vocab_size: int) -> Tensor:
    row = torch.zeros(vocab_size + 1)
    row[present] = 1.0
    row[absent] = -1.0
    row[-1] = 1.0 - len(present)
    return row


def _bias_minus_count(present, absent, vocab_size):
    row = _feature_weights(present, absent, vocab_size)
    row[-1] = -float(len(present))
    return row


def _absent_ignored(present, absent, vocab_size):
    row = _feature_weights(present, absent, vocab_size)
    row[absent] = 0.0
    return row


def _bias_minus_one(present, absent, vocab_size):
    # the chapter's example had two present words, so its bias was 1 - 2 = -1
    row = _feature_weights(present, absent, vocab_size)
    row[-1] = -1.0
    return row


def _no_bias(present, absent, vocab_size):
    row = _feature_weights(present, absent, vocab_size)
    row[-1] = 0.0
    return row


check_feature_weights = Checker(
    reference=_feature_weights,
    cases=[
        ([_VOCAB.index("battery"), _VOCAB.index("ran")], [_VOCAB.index("program")], _N),
        ([_VOCAB.index("program"), _VOCAB.index("ran")], [_VOCAB.index("battery")], _N),
        ([0, 2, 3], [], 5),
        ([4], [1, 2], 6),
    ],
    mistakes={
        "with a bias of minus the number of present words, the feature adds up to 0 even when "
        "every word is there; the bias is 1 - (number of present words)": _bias_minus_count,
        "a word that must be absent needs weight -1, so that its presence pulls the sum below 1":
            _absent_ignored,
        "the last entry is the bias: 1 - (number of present words)": _no_bias,
        "the bias is not always -1: the chapter's features had two present words, so 1 - 2 = -1; "
        "in general it is 1 - len(present)": _bias_minus_one,
    },
)


# --- feed_forward(x, w1, b1, w2, b2) -> (..., d_model) float tensor -------------------------

def _feed_forward(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    return torch.relu(x @ w1 + b1) @ w2 + b2


def _chapter_weights() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    battery, program, ran = _VOCAB.encode(["battery", "program", "ran"])
    w1 = torch.zeros(_N, 2)
    w1[[battery, program, ran], 0] = torch.tensor([1.0, -1.0, 1.0])
    w1[[battery, program, ran], 1] = torch.tensor([-1.0, 1.0, 1.0])
    b1 = torch.tensor([-1.0, -1.0])
    model = SkipModel(_SENTENCES, _VOCAB)
    rows = [model.feature_index("battery", "ran"), model.feature_index("program", "ran")]
    w2 = torch.tensor(model.table[rows], dtype=torch.float32)  # (2, N)
    return w1, b1, w2, torch.zeros(_N)


def _random_weights(seed: int, d_model: int, d_ff: int, batch: tuple[int, ...]) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, d_model, generator=generator)
    return (x, torch.randn(d_model, d_ff, generator=generator),
            torch.randn(d_ff, generator=generator),
            torch.randn(d_ff, d_model, generator=generator),
            torch.randn(d_model, generator=generator))


check_feed_forward = Checker(
    reference=_feed_forward,
    cases=[
        # Only "battery" seen: x @ w1 = [1, -1], so where the ReLU sits changes the answer.
        (_multi_hot(["battery"]), *_chapter_weights()),
        (_multi_hot(["battery", "ran"]), *_chapter_weights()),
        (_multi_hot(["program", "ran"]), *_chapter_weights()),
        _random_weights(seed=0, d_model=4, d_ff=4, batch=(3,)),
        _random_weights(seed=1, d_model=3, d_ff=6, batch=(2, 5)),
    ],
    mistakes={
        "the ReLU comes after the bias: relu(x @ w1 + b1). Applied before it, the bias can push "
        "a feature below zero again (here -1 instead of 0)":
            lambda x, w1, b1, w2, b2: (torch.relu(x @ w1) + b1) @ w2 + b2,
        "the ReLU is missing, so a feature can be negative and subtract votes: apply torch.relu "
        "to x @ w1 + b1": lambda x, w1, b1, w2, b2: (x @ w1 + b1) @ w2 + b2,
        "the ReLU belongs between the two layers, not after the second one":
            lambda x, w1, b1, w2, b2: torch.relu((x @ w1 + b1) @ w2 + b2),
        "you used w1.T: with x of shape (..., d_model), x @ w1 needs w1 of shape (d_model, d_ff)":
            lambda x, w1, b1, w2, b2: torch.relu(x @ w1.T + b1) @ w2 + b2,
        "a bias is missing: the features are relu(x @ w1 + b1), with b1 inside the ReLU":
            lambda x, w1, b1, w2, b2: torch.relu(x @ w1) @ w2 + b2,
        # The chapter's b2 is 0, so a missing b2 shows only on the random weights (case 4).
        "a bias is missing: the output is relu(x @ w1 + b1) @ w2 + b2, with b2 added at the end":
            lambda x, w1, b1, w2, b2: torch.relu(x @ w1 + b1) @ w2,
    },
)
