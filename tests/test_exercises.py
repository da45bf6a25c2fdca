"""The checker framework behind every exercise (minitransformer.exercises)."""

import numpy as np
import pytest
import torch

from minitransformer.exercises import (
    DTYPE_HINT,
    Checker,
    Verdict,
    difference,
    first_difference,
    show,
    show_input,
    summary,
)


def _double(x):
    return 2 * np.asarray(x, dtype=float)


def _square(m):
    return np.asarray(m, dtype=float) @ np.asarray(m, dtype=float)


CHECK_DOUBLE = Checker(_double, cases=[([1, 2],), ([0.5, -1, 3],)])


def test_accepts_the_reference_and_says_how_many_checks(capsys):
    verdict = CHECK_DOUBLE(_double)
    assert capsys.readouterr().out == "✓ all 2 checks passed\n"
    assert verdict and verdict == True  # noqa: E712  (a Verdict compares equal to the bool)
    assert verdict.passed is True


def test_accepts_an_equivalent_torch_answer(capsys):
    assert CHECK_DOUBLE(lambda x: torch.tensor(x, dtype=torch.float32) * 2)
    assert capsys.readouterr().out.startswith("✓")


def test_stub_is_reported_as_not_implemented(capsys):
    def stub(x):
        raise NotImplementedError

    verdict = CHECK_DOUBLE(stub)
    assert capsys.readouterr().out == "✗ not implemented yet\n"
    assert not verdict and verdict == False  # noqa: E712


def test_wrong_values_name_the_case_input_and_both_answers(capsys):
    assert not CHECK_DOUBLE(lambda x: np.asarray(x, dtype=float) + 2)
    assert capsys.readouterr().out == "✗ case 1: for input ([1, 2],) expected [2.0, 4.0] but got [3.0, 4.0]\n"


def test_wrong_shape_dtype_and_none_are_explained(capsys):
    CHECK_DOUBLE(lambda x: _double(x)[None, :])
    assert "(expected shape (2,) but got shape (1, 2))" in capsys.readouterr().out
    CHECK_DOUBLE(lambda x: 2 * np.asarray(x, dtype=int))
    assert "(expected float values but got integer values (int64))" in capsys.readouterr().out
    CHECK_DOUBLE(lambda x: None)
    assert "did you forget to return the result?" in capsys.readouterr().out


def test_an_exception_in_the_learners_code_is_reported_not_raised(capsys):
    verdict = CHECK_DOUBLE(lambda x: x.shape)
    assert not verdict
    assert capsys.readouterr().out == (
        "✗ case 1: for input ([1, 2],) your function raised AttributeError: "
        "'list' object has no attribute 'shape'\n")


def test_a_matching_known_mistake_adds_its_hint(capsys):
    check = Checker(_square, cases=[(np.array([[1.0, 2.0], [3.0, 4.0]]),)],
                    mistakes={"did you multiply element-wise (*) instead of with @?": lambda m: m * m})
    check(lambda m: m * m)
    assert capsys.readouterr().out.endswith("Hint: did you multiply element-wise (*) instead of with @?\n")
    check(lambda m: m + 1)
    assert "Hint" not in capsys.readouterr().out


def test_inputs_are_copied_so_a_mutating_function_cannot_spoil_later_cases(capsys):
    original = np.array([1.0, 2.0])
    check = Checker(_double, cases=[(original,), (original,)])

    def in_place(x):
        x *= 2
        return x

    assert check(in_place)
    assert original.tolist() == [1.0, 2.0]


def test_scalars_strings_and_non_functions(capsys):
    check = Checker(lambda a, b: float(np.dot(a, b)), cases=[([1, 3, -5], [4, -2, -1])])
    assert check(lambda a, b: 3)
    assert not check(lambda a, b: 4.0)
    assert not check(lambda a, b: "3")
    words = Checker(lambda s: s.split(), cases=[("find my files",)])
    assert words(str.split)
    assert not words(lambda s: s.split()[::-1])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "✗ case 1: for input ([1, 3, -5], [4, -2, -1]) expected 3 but got 4"
    assert out[2] == "✗ case 1: for input ([1, 3, -5], [4, -2, -1]) expected 3 but got '3' (expected a number but got '3')"
    assert not check(42)
    assert capsys.readouterr().out == "✗ expected a function but got int\n"


def test_verdict_shows_nothing_of_its_own_in_a_notebook():
    verdict = Verdict(True, "✓ all 1 checks passed")
    assert verdict._ipython_display_() is None
    assert "passed=True" in repr(verdict)
    assert {verdict: 1}[True] == 1


def test_checker_needs_tuple_cases():
    with pytest.raises(ValueError, match="at least one case"):
        Checker(_double, cases=[])
    with pytest.raises(TypeError, match="tuple of arguments"):
        Checker(_double, cases=[[1, 2]])


def test_show_and_difference_are_stable():
    assert show(np.array([0.123456, -0.0])) == "[0.1235, 0.0]"
    assert show(torch.tensor([[1, 2]])) == "[[1, 2]]"
    assert show(torch.tensor([12.3, -2.0])) == "[12.3, -2.0]"  # float32, shown without float noise
    assert show("x" * 500) == repr("x" * 500)  # nothing is cut off
    assert show("x" * 500, limit=160).endswith("…") and len(show("x" * 500, limit=160)) == 160
    assert difference(np.eye(2), np.eye(2) + 1e-9) is None
    assert difference(np.eye(2), "eye") == "expected an array of numbers but got str"


def test_tuples_of_arrays_are_compared_value_by_value_not_stacked():
    a = np.arange(3.0)
    # returning two results where one array is expected used to read "expected shape (3,) but got
    # shape (2, 3)", because numpy stacked the tuple
    assert difference(a, (a, a)) == ("expected an array of shape (3,) but got a tuple of 2 values "
                                     "(return one result, not several)")
    assert difference((a, a), a) == "expected a tuple of 2 values but got an array of shape (3,)"
    assert difference((a, a), (a,)) == "expected a tuple of 2 values but got a tuple of 1 value"
    assert difference((a, a), (a, torch.tensor([0.0, 1.0, 5.0]))) == (
        "value 1 of the tuple: values differ")
    assert difference((a, 2), (torch.tensor([0.0, 1.0, 2.0]), 2.0)) is None
    assert difference(a, (0.0, 1.0, 2.0)) is None          # a tuple of numbers is still an array


def test_a_known_mistake_that_raises_the_same_error_adds_its_hint(capsys):
    def rows_as_columns(table, ids):
        return np.asarray(table)[:, ids]

    check = Checker(lambda table, ids: np.asarray(table)[ids], cases=[(np.arange(6.0).reshape(3, 2), [2, 0])],
                    mistakes={"you picked columns; pick rows": rows_as_columns})
    assert not check(rows_as_columns)
    out = capsys.readouterr().out
    assert "your function raised IndexError" in out and out.endswith("Hint: you picked columns; pick rows\n")
    assert not check(lambda table, ids: 1 / 0)  # a different error gets no hint
    assert "Hint" not in capsys.readouterr().out


# --- the deciding input is always shown (issue 14) ---------------------------------------


def test_large_arrays_are_summarised_by_dtype_kind_and_shape():
    assert summary(torch.zeros(13, 13)) == "float32 tensor of shape (13, 13)"
    assert summary(np.zeros((7, 7), dtype=bool)) == "bool array of shape (7, 7)"
    assert show(np.arange(16.0)).startswith("[0.0, 1.0")  # up to 16 entries: in full
    assert show(np.arange(17.0)) == "float64 array of shape (17,)"


def test_small_inputs_keep_their_order_large_ones_put_the_short_arguments_first():
    assert show_input(([1, 2], 3)) == "([1, 2], 3)"
    assert show_input((torch.ones(13, 13), [0.0, 1.0], 10), ["masks", "seen", "recent"]) == (
        "(recent=10, seen=[0.0, 1.0], masks=float32 tensor of shape (13, 13))")
    assert show_input((np.zeros((5, 5)), "ran")) == (
        "(argument 2='ran', argument 1=float64 array of shape (5, 5))")


def test_a_long_deciding_argument_is_never_cut(capsys):
    words = ["check", "the", "program", "log", "and", "find", "out", "whether", "it", "ran"]
    check = Checker(lambda table, prefix: np.asarray(table).sum() + len(prefix),
                    cases=[(np.ones((20, 20)), words)])
    assert not check(lambda table, prefix: 0.0)
    out = capsys.readouterr().out
    assert "prefix=['check', 'the', 'program', 'log', 'and', 'find', 'out', 'whether', 'it', " \
           "'ran'], table=float64 array of shape (20, 20))" in out
    assert "…" not in out


def test_a_large_wrong_answer_names_its_first_wrong_entry(capsys):
    check = Checker(lambda n: np.eye(n), cases=[(5,)])
    assert not check(lambda n: np.eye(n)[::-1])
    assert capsys.readouterr().out == (
        "✗ case 1: for input (5,) expected float64 array of shape (5, 5) but got float64 array "
        "of shape (5, 5): at [0, 0] expected 1 but got 0 (8 of 25 entries differ)\n")
    assert first_difference(np.eye(2), np.zeros(2)) is None  # small: shown in full instead


def test_nan_in_an_answer_is_named(capsys):
    check = Checker(lambda x: np.zeros(2), cases=[(1,)])
    assert not check(lambda x: np.array([np.nan, 0.0]))
    assert capsys.readouterr().out.endswith("(your answer contains NaN)\n")
    assert difference(np.array([np.nan]), np.array([np.nan]), equal_nan=True) is None


@pytest.mark.parametrize("wrong", [
    lambda masks, i: torch.tensor(np.eye(len(masks))[i]) @ masks,     # float64 @ float32
    lambda masks, i: np.eye(len(masks))[i] @ masks,                   # numpy @ torch
    lambda masks, i: torch.relu(np.eye(len(masks))[i]),               # numpy into torch
])
def test_mixing_numpy_and_torch_or_float64_and_float32_gets_a_dtype_hint(wrong, capsys):
    check = Checker(lambda masks, i: masks[i], cases=[(torch.eye(3), 1)])
    assert not check(wrong)
    out = capsys.readouterr().out
    assert "your function raised" in out and out.endswith(f"Hint: {DTYPE_HINT}\n")


def test_other_errors_get_no_dtype_hint(capsys):
    check = Checker(lambda masks, i: masks[i], cases=[(torch.eye(3), 1)])
    assert not check(lambda masks, i: masks[i + 5])
    assert "Hint" not in capsys.readouterr().out


def test_first_difference_of_a_long_list_against_a_dict_is_no_crash():
    # A learner who returns a list of pairs where a Counter is expected (chapter 12) must get
    # a verdict, not an AttributeError from inside the checker.
    from collections import Counter

    from minitransformer.exercises import first_difference

    expected = Counter({(i, i + 1): 1 for i in range(40)})
    assert first_difference(expected, [(i, i + 1) for i in range(40)]) is None
    assert first_difference(list(range(40)), list(range(39)) + [7]) == (
        "at [39] expected 39 but got 7 (1 of 40 entries differ)")
