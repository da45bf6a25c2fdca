"""The checkers of chapter 1: they accept correct answers and explain the plausible wrong ones."""

import numpy as np
import pytest

from minitransformer import one_hot
from minitransformer.exercises import chapter01
from minitransformer.exercises.chapter01 import (
    check_dot_product,
    check_lookup_rows,
    check_matmul,
    check_one_hot_matrix,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def one_hot_matrix(ids, size):
    matrix = np.zeros((len(ids), size))
    for row, i in enumerate(ids):
        matrix[row, i] = 1.0
    return matrix


def dot_product(a, b):
    total = 0
    for x, y in zip(a, b):
        total += x * y
    return total


def matmul(A, B):
    n, m = len(A), len(B[0])
    C = np.zeros((n, m))
    for i in range(n):
        for j in range(m):
            C[i, j] = dot_product(A[i], B[:, j])
    return C


def lookup_rows(table, ids):
    return one_hot(ids, len(table)) @ table


CHECKERS = {
    "one_hot_matrix": (check_one_hot_matrix, one_hot_matrix),
    "dot_product": (check_dot_product, dot_product),
    "matmul": (check_matmul, matmul),
    "lookup_rows": (check_lookup_rows, lookup_rows),
}


def test_module_exports_every_checker():
    assert sorted(chapter01.__all__) == sorted(f"check_{name}" for name in CHECKERS)


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    verdict = checker(solution)
    assert verdict == True  # noqa: E712 (a Verdict, compared the way the docs promise)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_every_hint_is_reachable():
    """Each wrong function differs from the reference, or raises, on some case (else its hint is
    dead: a too-narrow one-hot, for one, can only raise or, on a square table, be right)."""
    for checker, _ in CHECKERS.values():
        for hint, wrong in checker.mistakes.items():
            differs = False
            for args in checker.cases:
                try:
                    got = wrong(*args)
                except Exception:
                    differs = True
                    break
                want = checker.reference(*args)
                if np.shape(got) != np.shape(want) or not np.allclose(got, want):
                    differs = True
                    break
            assert differs, hint


def test_hints_are_unambiguous_on_the_first_case():
    """Where several wrong functions run on case 1, they give different answers there."""
    for checker, _ in CHECKERS.values():
        answers = []
        for wrong in checker.mistakes.values():
            try:
                answers.append(np.asarray(wrong(*checker.cases[0]), dtype=float))
            except Exception:
                continue
        answers.append(np.asarray(checker.reference(*checker.cases[0]), dtype=float))
        for i, first in enumerate(answers):
            for second in answers[i + 1:]:
                assert first.shape != second.shape or not np.allclose(first, second)


# --- one_hot_matrix ------------------------------------------------------------------------

FIRST_ONE_HOT = ("for input ([0, 0, 3], 4) "
                 "expected [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]")


def test_one_hot_transposed(capsys):
    assert not check_one_hot_matrix(lambda ids, size: one_hot_matrix(ids, size).T)
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} but got "
        "[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]] "
        "(expected shape (3, 4) but got shape (4, 3)). "
        "Hint: the matrix is transposed: it needs one row per id and one column per "
        "vocabulary word\n")


def test_one_hot_counting_from_one(capsys):
    assert not check_one_hot_matrix(lambda ids, size: np.eye(size)[np.array(ids) - 1])
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} but got "
        "[[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]. "
        "Hint: off by one: ids count from 0, so id i sets column i (not column i - 1)\n")


def test_one_hot_row_number_instead_of_the_id(capsys):
    """matrix[row, row] = 1 used to be told it counted from 1: on "find my files", [1, 2, 0],
    both mistakes give the identity matrix, so case 1 is now one that tells them apart."""
    def by_row_number(ids, size):
        matrix = np.zeros((len(ids), size))
        for row, i in enumerate(ids):
            matrix[row, row] = 1.0
        return matrix

    assert not check_one_hot_matrix(by_row_number)
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} but got "
        "[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]. "
        "Hint: row r has its 1 in column r, the row's own number; it belongs in the column of "
        "the row's id, ids[r]\n")


def test_one_hot_one_column_too_far(capsys):
    def shifted(ids, size):
        matrix = np.zeros((len(ids), size))
        for row, i in enumerate(ids):
            if i + 1 < size:
                matrix[row, i + 1] = 1.0
        return matrix

    assert not check_one_hot_matrix(shifted)
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} "
        "but got [[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]\n")


def test_one_hot_integer_matrix(capsys):
    assert not check_one_hot_matrix(lambda ids, size: np.eye(size, dtype=int)[ids])
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} but got [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]] "
        "(expected float values but got integer values (int64))\n")


def test_one_hot_single_vector(capsys):
    assert not check_one_hot_matrix(lambda ids, size: np.eye(size)[ids[0]])
    assert capsys.readouterr().out == (
        f"✗ case 1: {FIRST_ONE_HOT} but got [1.0, 0.0, 0.0, 0.0] "
        "(expected shape (3, 4) but got shape (4,))\n")


def test_one_hot_off_by_one_past_the_end_is_reported(capsys):
    assert not check_one_hot_matrix(lambda ids, size: np.eye(size)[np.array(ids) + 1])
    assert capsys.readouterr().out == (
        "✗ case 1: for input ([0, 0, 3], 4) your function raised IndexError: "
        "index 4 is out of bounds for axis 0 with size 4\n")


# --- dot_product ---------------------------------------------------------------------------

FIRST_DOT = "✗ case 1: for input ([1, 2, 3], [4, 5, 6]) expected 32"


@pytest.mark.parametrize("wrong, got, hint", [
    (lambda a, b: [x * y for x, y in zip(a, b)], "[4, 10, 18] (expected a number but got list)",
     "you returned the pair-by-pair products; add them up to get a single number"),
    (lambda a, b: sum(a[i] * b[i] for i in range(1, len(a))), "28",
     "off by one: your sum skips the first pair (a loop that starts at 1 instead of 0)"),
    (lambda a, b: sum(a[i] * b[i] for i in range(len(a) - 1)), "14",
     "off by one: your sum skips the last pair (range(len(a) - 1) stops one pair early)"),
    (lambda a, b: sum(a) * sum(b), "90",
     "you multiplied the two sums; multiply pair by pair first, then add the products"),
], ids=["no sum", "skips first", "skips last", "product of sums"])
def test_dot_product_mistakes(wrong, got, hint, capsys):
    assert not check_dot_product(wrong)
    assert capsys.readouterr().out == f"{FIRST_DOT} but got {got}. Hint: {hint}\n"


def test_dot_product_numpy_answers_are_shown_as_plain_numbers(capsys):
    assert not check_dot_product(lambda a, b: np.dot(a[1:], b[1:]))      # np.int64(28)
    assert not check_dot_product(lambda a, b: np.array(a) * np.array(b))
    assert capsys.readouterr().out == (
        f"{FIRST_DOT} but got 28. Hint: off by one: your sum skips the first pair "
        "(a loop that starts at 1 instead of 0)\n"
        f"{FIRST_DOT} but got [4, 10, 18] (expected a number but got ndarray). "
        "Hint: you returned the pair-by-pair products; add them up to get a single number\n")


def test_dot_product_sign_error_on_the_book_example(capsys):
    # Adding every product as a positive number is right for case 1 and wrong for the book's case.
    assert not check_dot_product(lambda a, b: sum(abs(x * y) for x, y in zip(a, b)))
    assert capsys.readouterr().out == (
        "✗ case 2: for input ([1, 3, -5], [4, -2, -1]) expected 3 but got 15\n")


def test_dot_product_accepts_numpy_and_integer_answers(capsys):
    assert check_dot_product(lambda a, b: np.dot(a, b))
    assert check_dot_product(lambda a, b: float(np.asarray(a) @ np.asarray(b)))
    assert capsys.readouterr().out == "✓ all 7 checks passed\n" * 2


# --- matmul --------------------------------------------------------------------------------

SQUARE = ("✗ case 1: for input ([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0], [3.0, 0.0, 1.0]], "
          "[[2.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, -2.0, 1.0]]) "
          "expected [[4.0, 2.0, 1.0], [1.0, 3.0, -1.0], [6.0, -2.0, 4.0]]")


@pytest.mark.parametrize("wrong, got, hint", [
    (lambda A, B: (A @ B).T, "[[4.0, 1.0, 6.0], [2.0, 3.0, -2.0], [1.0, -1.0, 4.0]]",
     "the result is transposed: entry (i, j) is row i of A dotted with column j of B"),
    (lambda A, B: A * B, "[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]",
     "that is the element-wise product A * B; a matrix product takes the dot product of each "
     "row of A with each column of B"),
    (lambda A, B: B @ A, "[[5.0, 4.0, 1.0], [1.0, 3.0, -1.0], [3.0, -2.0, 3.0]]",
     "you computed B times A: the order matters, rows come from A and columns from B"),
    (lambda A, B: A @ B.T, "[[2.0, 3.0, -4.0], [-1.0, 1.0, -3.0], [7.0, 3.0, 1.0]]",
     "you used the rows of B where its columns belong (A times B transposed)"),
], ids=["transposed", "element-wise", "wrong order", "rows of B"])
def test_matmul_mistakes(wrong, got, hint, capsys):
    assert not check_matmul(wrong)
    assert capsys.readouterr().out == f"{SQUARE} but got {got}. Hint: {hint}\n"


def test_matmul_transposed_result_on_a_column(capsys):
    def transposed_unless_square(A, B):
        C = A @ B
        return C if C.shape[0] == C.shape[1] else C.T

    assert not check_matmul(transposed_unless_square)
    assert capsys.readouterr().out == (
        "✗ case 4: for input ([[1.0, 2.0, 0.0], [-1.0, 0.5, 3.0]], [[2.0], [0.0], [4.0]]) "
        "expected [[2.0], [10.0]] but got [[2.0, 10.0]] (expected shape (2, 1) but got shape "
        "(1, 2)). Hint: the result is transposed: entry (i, j) is row i of A dotted with column j "
        "of B\n")


def test_matmul_that_forgets_rows(capsys):
    # Only the first row of A: right for the 1 x 3 cases, wrong as soon as A has more rows.
    assert not check_matmul(lambda A, B: A[:1] @ B)
    out = capsys.readouterr().out
    assert out.startswith(f"{SQUARE} but got [[4.0, 2.0, 1.0]] ")
    assert out.endswith("(expected shape (3, 3) but got shape (1, 3))\n")


def test_matmul_accepts_torch_tensors(capsys):
    torch = pytest.importorskip("torch")
    assert check_matmul(lambda A, B: torch.tensor(A) @ torch.tensor(B))
    assert capsys.readouterr().out == "✓ all 6 checks passed\n"


# --- lookup_rows ---------------------------------------------------------------------------

TABLE_CASE = ("✗ case 1: for input ([[11.0, 12.0, 13.0], [21.0, 22.0, 23.0], [31.0, 32.0, 33.0], "
              "[41.0, 42.0, 43.0]], [1, 2]) "
              "expected [[21.0, 22.0, 23.0], [31.0, 32.0, 33.0]]")


@pytest.mark.parametrize("wrong, got, hint", [
    (lambda t, ids: (one_hot(ids, len(t)) @ t).T,
     "[[21.0, 31.0], [22.0, 32.0], [23.0, 33.0]] (expected shape (2, 3) but got shape (3, 2))",
     "the result is transposed: it needs one row per id"),
    (lambda t, ids: t[np.array(ids) - 1],
     "[[11.0, 12.0, 13.0], [21.0, 22.0, 23.0]]",
     "off by one: ids count from 0, so id 0 is the first row of the table"),
    (lambda t, ids: one_hot(ids, len(t)),
     "[[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]] "
     "(expected shape (2, 3) but got shape (2, 4))",
     "you returned the one-hot matrix itself; multiply it by the table"),
    (lambda t, ids: np.asarray(t)[:, ids].T,          # indexing columns
     "[[12.0, 22.0, 32.0, 42.0], [13.0, 23.0, 33.0, 43.0]] "
     "(expected shape (2, 3) but got shape (2, 4))",
     "you multiplied by the transposed table, so each id picked a column; keep the table as "
     "it is (one_hot(ids, len(table)) @ table) and each id picks a row"),
], ids=["transposed", "counting from one", "one-hot only", "columns"])
def test_lookup_mistakes(wrong, got, hint, capsys):
    assert not check_lookup_rows(wrong)
    assert capsys.readouterr().out == f"{TABLE_CASE} but got {got}. Hint: {hint}\n"


WIDTH_HINT = ("Hint: your one-hot rows are as wide as a row of the table (d entries); they need "
              "one entry per row of the table, N = len(table), so that (T, N) @ (N, d) fits: "
              "one_hot(ids, len(table))\n")


def test_lookup_with_a_one_hot_as_wide_as_a_row_gets_the_width_hint(capsys):
    # issue 14: this learner used to be told "you pulled out columns"
    assert not check_lookup_rows(lambda t, ids: one_hot(ids, t.shape[1]) @ t)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[11.0, 12.0, 13.0], ")
    assert "your function raised ValueError: matmul" in out and out.endswith(WIDTH_HINT)
    assert "columns" not in out


def test_lookup_with_the_learners_own_one_hot_of_width_d_gets_the_width_hint(capsys):
    def narrow_one_hot_matrix(ids, size):
        matrix = np.zeros((len(ids), size))
        for row, i in enumerate(ids):
            matrix[row, i] = 1.0
        return matrix

    assert not check_lookup_rows(lambda t, ids: narrow_one_hot_matrix(ids, t.shape[1]) @ t)
    assert capsys.readouterr().out.endswith(WIDTH_HINT)


def test_lookup_by_indexing_is_also_right(capsys):
    assert check_lookup_rows(lambda t, ids: np.asarray(t)[ids])
    assert capsys.readouterr().out == "✓ all 6 checks passed\n"


def test_lookup_by_indexing_columns_gets_the_columns_hint(capsys):
    assert not check_lookup_rows(lambda t, ids: np.asarray(t)[:, ids])
    assert capsys.readouterr().out == (
        f"{TABLE_CASE} but got [[12.0, 13.0], [22.0, 23.0], [32.0, 33.0], [42.0, 43.0]] "
        "(expected shape (2, 3) but got shape (4, 2)). Hint: table[:, ids] picks columns of the "
        "table; each id should pick a row (table[ids], or the one-hot way: "
        "one_hot(ids, len(table)) @ table)\n")


def test_lookup_with_a_one_hot_as_wide_as_the_ids_gets_its_hint(capsys):
    assert not check_lookup_rows(lambda t, ids: one_hot(ids, len(ids)) @ t)
    out = capsys.readouterr().out
    assert "your function raised ValueError" in out
    assert out.endswith("Hint: your one-hot rows have one entry per id (len(ids)); they need one "
                        "entry per row of the table, N = len(table): one_hot(ids, len(table))\n")
