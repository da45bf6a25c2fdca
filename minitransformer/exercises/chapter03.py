"""Checkers for the exercises of chapter 3, *Second order with skips, and masking*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_active_features` -- ``my_active_features(prefix, vocab)``: the 0/1 feature
  vector of a prefix, one 1 for each distinct earlier word paired with the most recent word.
* :data:`check_masked_votes` -- ``my_masked_votes(features, mask, table)``: hide features with
  a mask, then add up the rows of the ones left.
* :data:`check_design_mask` -- ``my_feature_mask(vocab, keep)``: a boolean mask that keeps only
  the listed (earlier, recent) features.
"""

from __future__ import annotations

import numpy as np

from minitransformer.exercises import Checker
from minitransformer.markov import SkipModel
from minitransformer.vocab import Vocabulary

__all__ = ["check_active_features", "check_design_mask", "check_masked_votes"]

_LOGS = ["Check the program log and find out whether it ran please.",
         "Check the battery log and find out whether it ran down please."]
_VLOGS = Vocabulary.from_sentences(_LOGS)
_SMALL = Vocabulary(["a", "b", "c", "d"])


# --- active_features(prefix, vocab) -> (N * N,) float array --------------------------------

def _active_features(prefix: list[str], vocab: Vocabulary) -> np.ndarray:
    n = len(vocab)
    active = np.zeros(n * n)
    recent = vocab.index(prefix[-1])
    for word in set(prefix[:-1]):
        active[vocab.index(word) * n + recent] = 1.0
    return active


def _with_itself(prefix, vocab):
    # every word of the prefix, the most recent one included, paired with the most recent word
    return _active_features(prefix + [prefix[-1]], vocab)


def _counts_repeats(prefix, vocab):
    n = len(vocab)
    active = np.zeros(n * n)
    recent = vocab.index(prefix[-1])
    for word in prefix[:-1]:
        active[vocab.index(word) * n + recent] += 1.0
    return active


def _recent_first(prefix, vocab):
    n = len(vocab)
    active = np.zeros(n * n)
    recent = vocab.index(prefix[-1])
    for word in set(prefix[:-1]):
        active[recent * n + vocab.index(word)] = 1.0
    return active


def _without_recent(prefix, vocab):
    # the most recent word is left out of the earlier words even when it also occurred earlier
    earlier = [word for word in prefix[:-1] if word != prefix[-1]]
    return _active_features(earlier + [prefix[-1]], vocab)


def _previous_only(prefix, vocab):
    n = len(vocab)
    active = np.zeros(n * n)
    active[vocab.index(prefix[-2]) * n + vocab.index(prefix[-1])] = 1.0
    return active


check_active_features = Checker(
    reference=_active_features,
    cases=[
        (["a", "b", "c"], _SMALL),
        (["c", "a", "d", "b"], _SMALL),
        (["a", "b", "a", "d"], _SMALL),           # "a" appears twice: it still counts once
        (["b", "d", "b"], _SMALL),                # the most recent word also appeared earlier
        ("check the program log and find out whether it ran".split(), _VLOGS),
    ],
    mistakes={
        "only the words *before* the most recent one pair with it; leave out the most recent "
        "word itself": _with_itself,
        "a feature is either active or not: a word seen twice earlier still gives a 1, not a 2":
            _counts_repeats,
        "the pair is in the wrong order: (earlier w, recent r) owns row w * N + r":
            _recent_first,
        # Before _previous_only: on ["b", "d", "b"] both give the single feature (d, b).
        "the most recent word pairs with itself too when it also appears earlier: in "
        "[b, d, b] the words before r = b are b and d, so (b, b) is active as well as (d, b)":
            _without_recent,
        "that is the plain second-order feature (previous word only); every earlier word "
        "should pair with the most recent one": _previous_only,
    },
)


# --- masked_votes(features, mask, table) -> (N,) float array ------------------------------

def _masked_votes(features: np.ndarray, mask: np.ndarray, table: np.ndarray) -> np.ndarray:
    return (np.asarray(features, dtype=float) * np.asarray(mask)) @ np.asarray(table, dtype=float)


def _mask_ignored(features, mask, table):
    return np.asarray(features, dtype=float) @ np.asarray(table, dtype=float)


def _mask_inverted(features, mask, table):
    keep = ~np.asarray(mask, dtype=bool)
    return (np.asarray(features, dtype=float) * keep) @ np.asarray(table, dtype=float)


def _mask_only(features, mask, table):
    return np.asarray(mask, dtype=float) @ np.asarray(table, dtype=float)


def _votes_case(prefix: str, keep: list[tuple[str, str]]):
    n = len(_VLOGS)
    mask = np.zeros(n * n, dtype=bool)
    for earlier, recent in keep:
        mask[_MODEL.feature_index(earlier, recent)] = True
    return _MODEL.features(prefix), mask, _MODEL.table


_MODEL = SkipModel(_LOGS, _VLOGS)
_KEEP = [("battery", "ran"), ("program", "ran")]
_rng = np.random.default_rng(3)
_SMALL_TABLE = np.round(_rng.random((16, 4)), 2)

check_masked_votes = Checker(
    reference=_masked_votes,
    cases=[
        (np.array([1.0, 0, 1, 1]), np.array([True, True, False, True]),
         np.array([[1.0, 0], [0, 1], [0.5, 0.5], [0.2, 0.8]])),
        (np.array([0.0, 1, 1, 0]), np.array([True, False, True, True]),
         np.array([[1.0, 0], [0, 1], [0.5, 0.5], [0.2, 0.8]])),
        (np.eye(16)[[1, 6, 11]].sum(axis=0), np.arange(16) % 3 == 0, _SMALL_TABLE),
        _votes_case("check the program log and find out whether it ran", _KEEP),
        _votes_case("check the battery log and find out whether it ran", _KEEP),
    ],
    mistakes={
        "the mask was not applied: multiply the features by it element-wise first": _mask_ignored,
        "the mask is the wrong way round: True (1) keeps a feature, False (0) hides it":
            _mask_inverted,
        "you used the mask alone; it must filter the active features (features * mask)":
            _mask_only,
    },
)


# --- design_mask(vocab, keep) -> (N * N,) boolean array ------------------------------------

def _design_mask(vocab: Vocabulary, keep: list[tuple[str, str]]) -> np.ndarray:
    n = len(vocab)
    mask = np.zeros(n * n, dtype=bool)
    for earlier, recent in keep:
        mask[vocab.index(earlier) * n + vocab.index(recent)] = True
    return mask


def _design_transposed(vocab, keep):
    return _design_mask(vocab, [(recent, earlier) for earlier, recent in keep])


def _design_inverted(vocab, keep):
    return ~_design_mask(vocab, keep)


check_design_mask = Checker(
    reference=_design_mask,
    cases=[
        (_SMALL, [("a", "b")]),
        (_SMALL, [("c", "d"), ("a", "c")]),
        (_SMALL, [("b", "b"), ("a", "d"), ("c", "a")]),
        (_VLOGS, _KEEP),
        (_SMALL, []),                              # keep nothing
    ],
    mistakes={
        "the pair is in the wrong order: (earlier w, recent r) owns position w * N + r":
            _design_transposed,
        "the mask is the wrong way round: True marks the features to keep": _design_inverted,
    },
)
