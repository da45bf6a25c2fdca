"""Checkers for the exercises of chapter 2, *Markov sequence models*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_build_transition_matrix` -- ``my_transition_matrix(sentences, vocab)``: count
  which word follows which, then turn each row into probabilities.
* :data:`check_next_word_probabilities` --
  ``my_next_word_probabilities(matrix, vocab, word)``: pull a word's row out of a transition
  matrix with a one-hot vector.
* :data:`check_second_order_row` -- ``my_second_order_row(matrix, vocab, earlier, recent)``:
  the row of a pair of words in a second-order matrix.
"""

from __future__ import annotations

import numpy as np

from minitransformer.exercises import Checker
from minitransformer.markov import second_order_matrix, transition_matrix
from minitransformer.vocab import Vocabulary, one_hot, tokenize

__all__ = ["check_build_transition_matrix", "check_next_word_probabilities",
           "check_second_order_row"]


# --- build_transition_matrix(sentences, vocab) -> (N, N) float array ------------------------

def _build_transition_matrix(sentences: list[str], vocab: Vocabulary) -> np.ndarray:
    return transition_matrix(sentences, vocab)


def _pair_counts(sentences, vocab):
    n = len(vocab)
    counts = np.zeros((n, n))
    for sentence in sentences:
        ids = vocab.encode(tokenize(sentence))
        for current, following in zip(ids, ids[1:]):
            counts[current, following] += 1
    return counts


def _columns_normalized(sentences, vocab):
    counts = _pair_counts(sentences, vocab)
    totals = counts.sum(axis=0, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def _zero_rows_divided(sentences, vocab):
    counts = _pair_counts(sentences, vocab)
    return counts / counts.sum(axis=1, keepdims=True)      # 0 / 0 = NaN for a word never followed


def _all_normalized(sentences, vocab):
    counts = _pair_counts(sentences, vocab)
    return counts / counts.sum()


_COMMANDS = ["Find my files.", "Find my photos.", "Open my files."]
_LOOP = ["the cat saw the dog", "the dog saw the cat", "the cat ran"]
_THREE = ["Show me my directories please.", "Show me my files please.",
          "Show me my photos please."]

check_build_transition_matrix = Checker(
    reference=_build_transition_matrix,
    cases=[
        (_COMMANDS, Vocabulary.from_sentences(_COMMANDS)),
        (_LOOP, Vocabulary.from_sentences(_LOOP)),   # words repeat, so rows mix counts
        (_THREE, Vocabulary.from_sentences(_THREE)),
        (["a b a c"], Vocabulary(["a", "b", "c", "d"])),  # d never occurs: a row of zeros
    ],
    mistakes={
        "rows of NaN: a word that is never followed by anything (the last word of a sentence) "
        "has a row total of 0, and 0 / 0 is NaN. Leave such a row as zeros, e.g. "
        "np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)":
            _zero_rows_divided,
        "these are the raw counts: divide each row by its total so it sums to one": _pair_counts,
        "you divided the counts by the total of the whole matrix; each row (current word) is its "
        "own probability distribution": _all_normalized,
        "you normalized the columns; the row is the current word and must sum to one":
            _columns_normalized,
        "the matrix is transposed: row = current word, column = next word":
            lambda sentences, vocab: transition_matrix(sentences, vocab).T,
    },
)


# --- next_word_probabilities(matrix, vocab, word) -> (N,) float array ----------------------

def _next_word_probabilities(matrix: np.ndarray, vocab: Vocabulary, word: str) -> np.ndarray:
    return one_hot([vocab.index(word)], len(vocab))[0] @ matrix


def _column_of(matrix, vocab, word):
    return np.asarray(matrix)[:, vocab.index(word)]


def _row_after(matrix, vocab, word):
    return np.asarray(matrix)[vocab.index(word) + 1]


_V3 = Vocabulary.from_sentences(_THREE)
_T3 = transition_matrix(_THREE, _V3, weights=[0.2, 0.3, 0.5])
_VLOOP = Vocabulary.from_sentences(_LOOP)
_TLOOP = transition_matrix(_LOOP, _VLOOP)

check_next_word_probabilities = Checker(
    reference=_next_word_probabilities,
    cases=[
        (_T3, _V3, "my"),          # the only branch: 0.2, 0.3, 0.5
        (_T3, _V3, "show"),
        (_TLOOP, _VLOOP, "the"),
        (_TLOOP, _VLOOP, "saw"),
        (_T3, _V3, "please"),      # the end of every sentence: all zeros
    ],
    mistakes={
        "you pulled out a column (which words lead *to* this word); the row says what comes next":
            _column_of,
        "off by one: the word with index i owns row i": _row_after,
    },
)


# --- second_order_row(matrix, vocab, earlier, recent) -> (N,) float array -----------------

def _second_order_row(matrix: np.ndarray, vocab: Vocabulary, earlier: str,
                      recent: str) -> np.ndarray:
    return np.asarray(matrix)[vocab.index(earlier) * len(vocab) + vocab.index(recent)]


def _telling(row: np.ndarray) -> np.ndarray:
    # An all-zero row matches many wrong answers; a hint is only given for a row that says more.
    if not row.any():
        raise ValueError("an all-zero row cannot tell this mistake apart")
    return row


def _swapped_pair(matrix, vocab, earlier, recent):
    return _telling(_second_order_row(matrix, vocab, recent, earlier))


def _first_order_row(matrix, vocab, earlier, recent):
    return _telling(np.asarray(matrix)[vocab.index(recent)])


def _multiplied_indices(matrix, vocab, earlier, recent):
    return _telling(np.asarray(matrix)[vocab.index(earlier) * vocab.index(recent)])


_RAN = ["Check whether the battery ran down please.", "Check whether the program ran please."]
_VRAN = Vocabulary.from_sentences(_RAN)
_SRAN = second_order_matrix(_RAN, _VRAN, weights=[0.4, 0.6])
_SLOOP = second_order_matrix(_LOOP, _VLOOP)
# The pair (c, b) -> a. Each mistake lands on a different row that holds a different word: the
# swapped pair (b, c) -> d; row b = 1, the pair (a, b), -> c; row c * b = 2, the pair (a, c), -> b.
_BOTH_WAYS = ["b c d", "c b a", "a c b", "a b c"]
_VBOTH = Vocabulary.from_sentences(_BOTH_WAYS)
_SBOTH = second_order_matrix(_BOTH_WAYS, _VBOTH)

check_second_order_row = Checker(
    reference=_second_order_row,
    cases=[
        (_SBOTH, _VBOTH, "c", "b"),
        (_SBOTH, _VBOTH, "b", "c"),
        (_SRAN, _VRAN, "battery", "ran"),     # certain: down
        (_SRAN, _VRAN, "program", "ran"),     # certain: please
        (_SRAN, _VRAN, "whether", "the"),     # the one branch left: battery 0.4, program 0.6
        (_SLOOP, _VLOOP, "cat", "saw"),
        (_SLOOP, _VLOOP, "saw", "the"),
    ],
    mistakes={
        "the pair is in the wrong order: the row of (earlier a, recent b) is a * N + b":
            _swapped_pair,
        "that is row `recent` only, as in a first-order model; a pair (a, b) owns row a * N + b":
            _first_order_row,
        "the row is a * N + b, not a * b: each earlier word a owns a block of N rows, and b picks "
        "the row inside the block": _multiplied_indices,
    },
)
