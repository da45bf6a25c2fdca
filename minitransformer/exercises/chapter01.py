"""Checkers for the exercises of chapter 1, *One-hot vectors and dot products*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_one_hot_matrix` -- ``my_one_hot_matrix(ids, size)``: the one-hot matrix of a
  sentence.
* :data:`check_dot_product` -- ``my_dot_product(a, b)``: multiply pair by pair, then add.
* :data:`check_matmul` -- ``my_matmul(A, B)``: a matrix product built from dot products.
* :data:`check_lookup_rows` -- ``my_lookup_rows(table, ids)``: pull rows out of a table by
  multiplying it with one-hot rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minitransformer.exercises import Checker
from minitransformer.vocab import one_hot

__all__ = ["check_dot_product", "check_lookup_rows", "check_matmul", "check_one_hot_matrix"]


# --- one_hot_matrix(ids, size) -> (len(ids), size) float array -------------------------------

def _one_hot_matrix(ids: Sequence[int], size: int) -> np.ndarray:
    return one_hot(ids, size)


def _one_hot_transposed(ids, size):
    return one_hot(ids, size).T


def _one_hot_one_based(ids, size):
    # The learner treats the ids as counting from 1: id i lands in column i - 1 (numpy wraps -1).
    return np.eye(size)[np.asarray(ids) - 1]


def _one_hot_row_number(ids, size):
    # The learner writes matrix[row, row] = 1: the row's number instead of its id.
    return np.eye(len(ids), size)


check_one_hot_matrix = Checker(
    reference=_one_hot_matrix,
    cases=[
        # First a case that tells every listed mistake apart. On "find my files" ([1, 2, 0], 3)
        # the ids shifted down by one are [0, 1, 2], so counting from 1 and using the row's
        # number both give the identity matrix there.
        ([0, 0, 3], 4),              # a repeated word gets the same row twice
        ([1, 2, 0], 3),              # "find my files" with the vocabulary [files, find, my]
        ([6, 2, 3, 1, 5], 7),        # "show me my files please"
        ([1, 2], 4),
        ([4], 5),
    ],
    # A 1 one column too far right (column i + 1) raises IndexError on case 1, which the checker
    # reports as it is, so it needs no hint.
    mistakes={
        "the matrix is transposed: it needs one row per id and one column per vocabulary word":
            _one_hot_transposed,
        "off by one: ids count from 0, so id i sets column i (not column i - 1)":
            _one_hot_one_based,
        "row r has its 1 in column r, the row's own number; it belongs in the column of the "
        "row's id, ids[r]": _one_hot_row_number,
    },
)


# --- dot_product(a, b) -> a number --------------------------------------------------------

def _dot_product(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(x * y for x, y in zip(a, b)))


def _elementwise(a, b):
    return [x * y for x, y in zip(a, b)]


def _skips_first(a, b):
    return float(sum(a[i] * b[i] for i in range(1, len(a))))


def _skips_last(a, b):
    return float(sum(a[i] * b[i] for i in range(len(a) - 1)))


def _product_of_sums(a, b):
    return float(sum(a) * sum(b))


check_dot_product = Checker(
    reference=_dot_product,
    cases=[
        ([1, 2, 3], [4, 5, 6]),                          # 4 + 10 + 18 = 32
        ([1, 3, -5], [4, -2, -1]),                        # the book's example: 3
        ([0, 0, 1, 0], [0, 0, 1, 0]),                    # a one-hot vector with itself: 1
        ([0, 1, 0, 0], [0, 0, 1, 0]),                    # two different one-hot vectors: 0
        ([0.2, 0.7, 0.0, 0.1], [0, 1, 0, 0]),            # how much of word 1 is in the mix
        ([2.5], [-4.0]),
        ([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]),
    ],
    mistakes={
        "you returned the pair-by-pair products; add them up to get a single number": _elementwise,
        "off by one: your sum skips the first pair (a loop that starts at 1 instead of 0)":
            _skips_first,
        "off by one: your sum skips the last pair (range(len(a) - 1) stops one pair early)":
            _skips_last,
        "you multiplied the two sums; multiply pair by pair first, then add the products":
            _product_of_sums,
    },
)


# --- matmul(A, B) -> (n, m) float array, from A (n, k) and B (k, m) --------------------------

def _matmul(A, B) -> np.ndarray:
    return np.asarray(A, dtype=float) @ np.asarray(B, dtype=float)


def _matmul_transposed(A, B):
    return _matmul(A, B).T


def _elementwise_product(A, B):
    return np.asarray(A, dtype=float) * np.asarray(B, dtype=float)


def _wrong_order(A, B):
    return _matmul(B, A)


def _rows_of_b(A, B):
    return _matmul(A, np.asarray(B).T)


_A23 = np.array([[1.0, 2.0, 0.0], [-1.0, 0.5, 3.0]])
_B32 = np.array([[2.0, 1.0], [0.0, -1.0], [4.0, 0.5]])
_A33 = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]])
_B33 = np.array([[2.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, -2.0, 1.0]])

check_matmul = Checker(
    reference=_matmul,
    cases=[
        (_A33, _B33),                                                   # square, not symmetric
        (_A23, _B32),                                                   # the general case
        (np.array([[1.0, 3.0, -5.0]]), np.array([[4.0], [-2.0], [-1.0]])),  # 1x3 . 3x1
        (_A23, _B32[:, :1]),                                            # 2x3 . 3x1
        (_A23[:1], _B32),                                               # 1x3 . 3x2
        (np.array([[0.5, -1.0], [2.0, 0.0], [1.0, 1.0], [0.0, 3.0]]), _A23),  # 4x2 . 2x3
    ],
    mistakes={
        "the result is transposed: entry (i, j) is row i of A dotted with column j of B":
            _matmul_transposed,
        "that is the element-wise product A * B; a matrix product takes the dot product of each "
        "row of A with each column of B": _elementwise_product,
        "you computed B times A: the order matters, rows come from A and columns from B":
            _wrong_order,
        "you used the rows of B where its columns belong (A times B transposed)": _rows_of_b,
    },
)


# --- lookup_rows(table, ids) -> (len(ids), d) float array, from table (N, d) ---------------

def _lookup_rows(table, ids: Sequence[int]) -> np.ndarray:
    table = np.asarray(table, dtype=float)
    return one_hot(ids, len(table)) @ table


def _lookup_transposed(table, ids):
    return _lookup_rows(table, ids).T


def _lookup_one_based(table, ids):
    return np.asarray(table, dtype=float)[np.asarray(ids) - 1]


def _lookup_columns(table, ids):
    # one-hot rows as wide as a table row, times the transposed table: each id picks a column
    return one_hot(ids, np.shape(table)[1]) @ np.asarray(table, dtype=float).T


def _one_hot_as_wide_as_a_row(table, ids):
    # one-hot rows with d entries (a table row's width) instead of N (the number of rows)
    return one_hot(ids, np.shape(table)[1]) @ np.asarray(table, dtype=float)


def _one_hot_as_wide_as_the_ids(table, ids):
    # one-hot rows with len(ids) entries instead of N (the number of rows)
    return one_hot(ids, len(ids)) @ np.asarray(table, dtype=float)


def _index_columns(table, ids):
    return np.asarray(table, dtype=float)[:, ids]


def _only_one_hot(table, ids):
    return one_hot(ids, len(table))


# Row r of this table holds 10 r + 1, 10 r + 2, 10 r + 3: the tens digit names the row (1 to 4).
_TABLE = np.array([[11.0, 12.0, 13.0], [21.0, 22.0, 23.0], [31.0, 32.0, 33.0],
                   [41.0, 42.0, 43.0]])
_WORD_TABLE = np.array([[0.1, 0.9], [0.8, 0.3], [-0.5, 0.2], [0.4, -0.7],
                        [0.6, 0.6], [-0.2, -0.4], [1.0, 0.0]])          # 7 words, 2 features

check_lookup_rows = Checker(
    reference=_lookup_rows,
    cases=[
        (_TABLE, [1, 2]),      # first: ids below d = 3 tell a too-narrow one-hot from others
        (_TABLE, [0, 3, 2]),                      # rows 1, 4 and 3, as in the book
        (_TABLE[:3], [2, 0]),                     # a square table
        (_WORD_TABLE, [6, 2, 3, 1, 5]),           # "show me my files please"
        (_TABLE, [1, 1]),                         # the same row twice
        (_WORD_TABLE, [0]),
    ],
    mistakes={
        "the result is transposed: it needs one row per id": _lookup_transposed,
        "off by one: ids count from 0, so id 0 is the first row of the table": _lookup_one_based,
        "your one-hot rows are as wide as a row of the table (d entries); they need one entry "
        "per row of the table, N = len(table), so that (T, N) @ (N, d) fits: "
        "one_hot(ids, len(table))": _one_hot_as_wide_as_a_row,
        "your one-hot rows have one entry per id (len(ids)); they need one entry per row of "
        "the table, N = len(table): one_hot(ids, len(table))": _one_hot_as_wide_as_the_ids,
        "table[:, ids] picks columns of the table; each id should pick a row (table[ids], or "
        "the one-hot way: one_hot(ids, len(table)) @ table)": _index_columns,
        "you multiplied by the transposed table, so each id picked a column; keep the table as "
        "it is (one_hot(ids, len(table)) @ table) and each id picks a row": _lookup_columns,
        "you returned the one-hot matrix itself; multiply it by the table": _only_one_hot,
    },
)
