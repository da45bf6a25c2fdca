"""Checkers for the book's exercises (chapter 1 introduces them).

A checker runs the learner's function on a handful of inputs, compares each answer with the
reference solution's, and prints exactly one line:

* ``✓ all 5 checks passed``
* ``✗ not implemented yet`` (the stub still raises ``NotImplementedError``)
* ``✗ case 2: for input ([1, 2],) expected [...] but got [...]`` followed, where it helps, by a
  hint about the likely mistake (a transposed matrix, an off-by-one index, ...).

A wrong shape, a wrong kind of number, or an exception raised by the learner's code is reported
the same way and never crashes the notebook. Each chapter's checkers live in a module of this
package named after the chapter, e.g. :mod:`minitransformer.exercises.chapter01`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PASS = "✓"
FAIL = "✗"


class Verdict:
    """What a checker returns: truthy when every check passed.

    It compares equal to ``True``/``False`` and shows nothing of its own in a notebook (the checker
    has already printed its one line), so ``check_x(my_function)`` can end a cell.
    """

    def __init__(self, passed: bool, message: str):
        self.passed = bool(passed)
        self.message = message

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Verdict):
            return self.passed == other.passed
        if isinstance(other, bool):
            return self.passed == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.passed)

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed}, message={self.message!r})"

    def _ipython_display_(self) -> None:  # the line is already printed
        return None


def _to_numpy(value: Any) -> Any:
    """Tensors and nested lists of numbers become numpy arrays; everything else is kept."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)) and value and not any(isinstance(v, str) for v in value):
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            return value
        if array.dtype.kind in "biuf":
            return array
    return value


def show(value: Any, limit: int = 160) -> str:
    """A short, stable text for a value in a checker message (4 decimals, one line)."""
    if isinstance(value, tuple):  # the arguments of a case, shown one by one
        text = "(" + ", ".join(show(v, limit) for v in value) + ("," if len(value) == 1 else "") + ")"
        return text if len(text) <= limit else text[: limit - 1] + "…"
    value = _to_numpy(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":  # float64 first, or float32 prints as 12.300000190734863
            value = np.round(value.astype(np.float64), 4) + 0.0  # + 0.0 turns -0.0 into 0.0
        text = repr(value.tolist())
    elif isinstance(value, (float, np.floating)):
        text = f"{float(value):.4g}"
    elif isinstance(value, (np.integer, np.bool_)):  # 28, not np.int64(28)
        text = repr(value.item())
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k!r}: {show(v, limit)}" for k, v in value.items()) + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_KINDS = {"b": "boolean", "i": "integer", "u": "integer", "f": "float", "c": "complex"}


def difference(expected: Any, got: Any, *, atol: float = 1e-6, rtol: float = 1e-5) -> str | None:
    """Why ``got`` is not ``expected``, in words, or ``None`` when they agree.

    Arrays and tensors must have the same shape and kind of number (integer vs float vs boolean)
    and equal values within the tolerances; other values must compare equal.
    """
    got_type = type(got).__name__
    expected, got = _to_numpy(expected), _to_numpy(got)
    if isinstance(expected, np.ndarray):
        if got is None:
            return "got None (did you forget to return the result?)"
        try:
            got_array = np.asarray(got)
        except (ValueError, TypeError):
            return f"expected an array of shape {expected.shape} but got {type(got).__name__}"
        if got_array.dtype.kind not in _KINDS:
            return f"expected an array of numbers but got {type(got).__name__}"
        if got_array.shape != expected.shape:
            return f"expected shape {expected.shape} but got shape {got_array.shape}"
        want, have = _KINDS[expected.dtype.kind], _KINDS[got_array.dtype.kind]
        if want != have:
            return f"expected {want} values but got {have} values ({got_array.dtype})"
        if want == "float":
            same = np.allclose(got_array, expected, atol=atol, rtol=rtol, equal_nan=False)
        else:
            same = np.array_equal(got_array, expected)
        return None if same else "values differ"
    if isinstance(expected, (float, np.floating)) or (
        isinstance(expected, (int, np.integer)) and isinstance(got, (float, np.floating))
    ):
        if got is None or isinstance(got, (str, bytes)):
            return f"expected a number but got {show(got)}"
        try:
            same = bool(np.isclose(float(got), float(expected), atol=atol, rtol=rtol))
        except (TypeError, ValueError):
            return f"expected a number but got {got_type}"
        return None if same else "values differ"
    try:
        same = bool(got == expected)
    except Exception:  # a comparison that itself fails counts as a difference
        same = False
    return None if same else "values differ"


@dataclass
class Checker:
    """Check a learner's function against a reference on fixed cases.

    Args:
        reference: the correct function.
        cases: the inputs, each a tuple of positional arguments.
        mistakes: optional hints, ``{"hint text": wrong_function}``: when the learner's answer to a
            failing case equals what ``wrong_function`` returns (or both raise the same error),
            the hint is added to the message.
        atol, rtol: tolerances for float results.

    Calling the checker with the learner's function prints one line and returns a :class:`Verdict`.
    Arguments are deep-copied for every call, so a function that modifies its input in place
    cannot change later cases.
    """

    reference: Callable[..., Any]
    cases: Sequence[tuple]
    mistakes: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    atol: float = 1e-6
    rtol: float = 1e-5

    def __post_init__(self) -> None:
        if not self.cases:
            raise ValueError("a checker needs at least one case")
        for case in self.cases:
            if not isinstance(case, tuple):
                raise TypeError(f"each case must be a tuple of arguments, got {case!r}")

    def run(self, function: Callable[..., Any]) -> Verdict:
        """Check ``function`` without printing; the verdict carries the message."""
        if not callable(function):
            return Verdict(False, f"{FAIL} expected a function but got {type(function).__name__}")
        for number, args in enumerate(self.cases, start=1):
            expected = self.reference(*copy.deepcopy(args))
            try:
                got = function(*copy.deepcopy(args))
            except NotImplementedError:
                return Verdict(False, f"{FAIL} not implemented yet")
            except Exception as exc:  # the learner's bug, reported, never raised
                message = (f"{FAIL} case {number}: for input {show(args)} your function raised "
                           f"{type(exc).__name__}: {exc}")
                return Verdict(False, self._with_hint(message, args, error=exc))
            problem = difference(expected, got, atol=self.atol, rtol=self.rtol)
            if problem is None:
                continue
            message = (f"{FAIL} case {number}: for input {show(args)} expected {show(expected)} "
                       f"but got {show(got)}")
            if problem != "values differ":
                message += f" ({problem})"
            return Verdict(False, self._with_hint(message, args, got=got))
        return Verdict(True, f"{PASS} all {len(self.cases)} checks passed")

    def _with_hint(self, message: str, args: tuple, *, got: Any = None,
                   error: Exception | None = None) -> str:
        """Add the hint of the first known mistake that behaves like the learner's function.

        A mistake matches when it returns the same answer, or, for a learner's function that
        raised, when it raises the same kind of error with the same message.
        """
        for hint, wrong in self.mistakes.items():
            try:
                answer = wrong(*copy.deepcopy(args))
            except Exception as wrong_error:
                matches = error is not None and type(wrong_error) is type(error) \
                    and str(wrong_error) == str(error)
            else:
                matches = error is None and difference(answer, got, atol=self.atol,
                                                       rtol=self.rtol) is None
            if matches:
                return f"{message}. Hint: {hint}"
        return message

    def __call__(self, function: Callable[..., Any]) -> Verdict:
        verdict = self.run(function)
        print(verdict.message)
        return verdict
