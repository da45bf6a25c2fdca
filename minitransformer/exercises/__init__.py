"""Checkers for the book's exercises (chapter 1 introduces them).

A checker runs the learner's function on a handful of inputs, compares each answer with the
reference solution's, and prints exactly one line:

* ``✓ all 5 checks passed``
* ``✗ not implemented yet`` (the stub still raises ``NotImplementedError``)
* ``✗ case 2: for input ([1, 2],) expected [...] but got [...]`` followed, where it helps, by a
  hint about the likely mistake (a transposed matrix, an off-by-one index, ...).

The message names the deciding input in full. Small arguments are printed as they are; when an
argument is a large array, the numbers and short arguments come first, each with its name, and
the large arrays are summarised by dtype, kind and shape
(``masks=float32 tensor of shape (13, 13)``). A large answer is summarised the same way, followed
by the first entry where it differs from the expected one. A wrong shape, a wrong kind of number,
NaN in the answer, or an exception raised by the learner's code is reported the same way and
never crashes the notebook; an error from mixing numpy arrays with torch tensors, or float64 with
float32, comes with a hint about dtypes.
From chapter 13 on, the checkers are ``thorough``: an answer with the right values must also
be of the reference's type (a float32 tensor, not a numpy array, nested lists, a Python number
or float64; a tuple, not a list), leave its arguments as they were, and, where training
differentiates the result, carry the reference's gradient (``gradients``); and a failure no
listed mistake explains gets a hint from what the answer is (see :class:`Checker`).
Each chapter's checkers live in a module of this package named after the chapter, e.g.
:mod:`minitransformer.exercises.chapter01`.
"""

from __future__ import annotations

import copy
import inspect
import re
import warnings
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


#: Arrays with more entries than this are summarised by kind, dtype and shape in messages.
SHOW_AT_MOST = 16


def _is_large(value: Any) -> bool:
    array = _to_numpy(value)
    return isinstance(array, np.ndarray) and array.size > SHOW_AT_MOST


def summary(value: Any) -> str:
    """``float32 tensor of shape (13, 13)``: what a large array is, without its numbers."""
    if hasattr(value, "detach") and hasattr(value, "dtype"):
        kind, dtype = "tensor", str(value.dtype).removeprefix("torch.")
    else:
        array = np.asarray(value)
        kind = "array" if isinstance(value, np.ndarray) else type(value).__name__
        dtype = str(array.dtype)
    return f"{dtype} {kind} of shape {tuple(np.shape(_to_numpy(value)))}"


def show(value: Any, limit: int | None = None) -> str:
    """A stable one-line text for a value in a checker message (4 decimals).

    Arrays of more than :data:`SHOW_AT_MOST` entries are summarised (:func:`summary`); everything
    else is shown in full. ``limit``, if given, cuts the text to that many characters.
    """
    if isinstance(value, tuple):  # the arguments of a case, shown one by one
        text = "(" + ", ".join(show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    elif _is_large(value):
        text = summary(value)
    else:
        value = _to_numpy(value)
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "f":  # float64 first, or float32 prints as 12.300000190734863
                value = np.round(value.astype(np.float64), 4) + 0.0  # + 0.0: -0.0 becomes 0.0
            text = repr(value.tolist())
        elif isinstance(value, (float, np.floating)):
            text = f"{float(value):.4g}"
        elif isinstance(value, (np.integer, np.bool_)):  # 28, not np.int64(28)
            text = repr(value.item())
        elif isinstance(value, dict):
            text = "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in value.items()) + "}"
        else:
            text = repr(value)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, np.integer, np.floating, np.bool_))


def show_input(args: tuple, names: Sequence[str] | None = None) -> str:
    """The arguments of a case, so that the one that decides is always readable.

    Small arguments are shown as a tuple, in order: ``([1, 2], 3)``. When one of them is a large
    array, the arguments are named and reordered: numbers and strings first, then the other small
    ones, then the large arrays by their :func:`summary`:
    ``(recent=10, seen=[...], masks=float32 tensor of shape (13, 13))``.
    """
    if not any(_is_large(value) for value in args):
        return show(tuple(args))
    if names is None or len(names) != len(args):
        names = [f"argument {number}" for number in range(1, len(args) + 1)]
    order = sorted(range(len(args)),
                   key=lambda i: (0 if _is_scalar(args[i]) else 2 if _is_large(args[i]) else 1, i))
    return "(" + ", ".join(f"{names[i]}={show(args[i])}" for i in order) + ")"


_KINDS = {"b": "boolean", "i": "integer", "u": "integer", "f": "float", "c": "complex"}


def difference(expected: Any, got: Any, *, atol: float = 1e-6, rtol: float = 1e-5,
               equal_nan: bool = False) -> str | None:
    """Why ``got`` is not ``expected``, in words, or ``None`` when they agree.

    Arrays and tensors must have the same shape and kind of number (integer vs float vs boolean)
    and equal values within the tolerances; other values must compare equal. NaN never equals
    anything unless ``equal_nan`` (used to compare two wrong answers with each other).
    """
    if _holds_arrays(expected) or _holds_arrays(got):
        return _tuple_difference(expected, got, atol=atol, rtol=rtol, equal_nan=equal_nan)
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
            same = np.allclose(got_array, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
        else:
            same = np.array_equal(got_array, expected)
        if same:
            return None
        if want == "float" and np.isnan(got_array).any() and not np.isnan(expected).any():
            return "your answer contains NaN"
        return "values differ"
    if isinstance(expected, (float, np.floating)) or (
        isinstance(expected, (int, np.integer)) and isinstance(got, (float, np.floating))
    ):
        if got is None or isinstance(got, (str, bytes)):
            return f"expected a number but got {show(got)}"
        try:
            same = bool(np.isclose(float(got), float(expected), atol=atol, rtol=rtol,
                                   equal_nan=equal_nan))
        except (TypeError, ValueError):
            return f"expected a number but got {got_type}"
        return None if same else "values differ"
    try:
        same = bool(got == expected)
    except Exception:  # a comparison that itself fails counts as a difference
        same = False
    return None if same else "values differ"


def _a(noun: str) -> str:
    """``a list``, ``an int``."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


#: Said when a count comes back as a float (``whole_numbers=True``).
WHOLE_NUMBER_HINT = ("a count is a whole number: return an int. Multiply whole numbers, and "
                     "divide with //, which keeps an int, not /, which always gives a float")


def _int(value: Any) -> bool:
    """A whole number's type: a Python or numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _holds_arrays(value: Any) -> bool:
    """A tuple with an array or tensor in it: several results, not one array to stack."""
    return isinstance(value, tuple) and any(getattr(v, "ndim", 0) >= 1 for v in value)


def _values(count: int) -> str:
    return f"{count} value" if count == 1 else f"{count} values"


def _tuple_difference(expected: Any, got: Any, **tolerances: Any) -> str | None:
    """:func:`difference` for results that are tuples of arrays, one value at a time."""
    if not isinstance(expected, tuple):
        shown = f"an array of shape {tuple(np.shape(_to_numpy(expected)))}" \
            if isinstance(_to_numpy(expected), np.ndarray) else show(expected)
        return (f"expected {shown} but got a tuple of {_values(len(got))} (return one result, "
                f"not several)")
    if not isinstance(got, tuple) or len(got) != len(expected):
        what = f"a tuple of {_values(len(got))}" if isinstance(got, tuple) else (
            f"an array of shape {tuple(np.shape(_to_numpy(got)))}"
            if isinstance(_to_numpy(got), np.ndarray) else type(got).__name__)
        return f"expected a tuple of {_values(len(expected))} but got {what}"
    for i, (want, have) in enumerate(zip(expected, got)):
        problem = difference(want, have, **tolerances)
        if problem is not None:
            return f"value {i} of the tuple: {problem}"
    return None


def first_difference(expected: Any, got: Any, *, atol: float = 1e-6,
                     rtol: float = 1e-5) -> str | None:
    """Where two large arrays of the same shape first differ, e.g. ``at [5, 0] expected 0.0 but
    got nan (7 of 49 entries differ)``; ``None`` for anything else."""
    if not (_is_large(expected) or _is_large(got)):
        return None
    want, have = _to_numpy(expected), _to_numpy(got)
    try:
        want, have = np.asarray(want), np.asarray(have)
        if have.shape != want.shape or have.dtype.kind not in "biuf":
            return None
        wrong = ~np.isclose(have.astype(float), want.astype(float), atol=atol, rtol=rtol)
    except (TypeError, ValueError):
        return None
    if not wrong.any():
        return None
    where = tuple(int(i) for i in np.argwhere(wrong)[0])
    return (f"at {list(where)} expected {show(want[where])} but got {show(have[where])} "
            f"({int(wrong.sum())} of {wrong.size} entries differ)")


def largest_difference(expected: Any, got: Any) -> str | None:
    """Where two numbers, or arrays of the same shape, differ most, with enough digits to see
    it: ``the largest difference, 3.2e-04, is at [5]: expected 0.8659254 but got 0.8662456``;
    ``None`` for anything else. For answers whose 4-decimal texts look equal."""
    try:
        want = np.asarray(_to_numpy(expected), dtype=np.float64)
        have = np.asarray(_to_numpy(got), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if want.shape != have.shape or want.size == 0:
        return None
    gaps = np.abs(want - have)
    if not np.isfinite(gaps).all() or not gaps.any():
        return None
    where = np.unravel_index(int(np.argmax(gaps)), gaps.shape)
    at = f" at {[int(i) for i in where]}" if want.ndim else ""
    return (f"the largest difference, {gaps[where]:.1e}, is{at}: expected {want[where]:.7g} "
            f"but got {have[where]:.7g}")


# Errors that come from mixing numpy arrays with torch tensors, or float64 with float32.
_DTYPE_ERRORS = re.compile(
    r"dtype|scalar type|Double|Float|Half|Long"  # torch: "same dtype, but got: double != float"
    r"|numpy\.ndarray' and 'Tensor|Tensor' and 'numpy\.ndarray"  # numpy @ tensor
    r"|must be Tensor, not numpy|not numpy\.ndarray|can't convert np\.ndarray")

DTYPE_HINT = ("torch will not mix numpy arrays with tensors, or float64 (double) with float32 "
              "(float) numbers: build every array as a tensor of the inputs' dtype and device, "
              "e.g. torch.zeros(n, dtype=x.dtype, device=x.device), or convert one with "
              "torch.as_tensor(a, dtype=x.dtype)")


def dtype_hint(error: BaseException) -> str | None:
    """The hint for an error that comes from mixing dtypes or numpy with torch, else ``None``."""
    if isinstance(error, (RuntimeError, TypeError)) and _DTYPE_ERRORS.search(str(error)):
        return DTYPE_HINT
    return None


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "requires_grad")


def _dtype(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.")


NUMPY_HINT = ("return a torch tensor, not a numpy array: the next step multiplies it with the "
              "model's tensors (B @ A, x @ weight), which refuses numpy arrays and float64; build "
              "it with torch's own functions (torch.randn, torch.zeros, torch.tensor), or convert "
              "with torch.as_tensor(a, dtype=torch.float32)")
LIST_HINT = ("return a tensor, not Python lists: the model and every step after this one take "
             "tensors (build it with torch.full, torch.zeros or torch.tensor(rows), and fill "
             "it in)")
NUMBER_HINT = ("return a tensor, not a Python number: .item() and float() take the number out "
               "of torch")
NUMBER_GRADIENT_HINT = ("the result does not carry a gradient: .item() and float() turn it into "
                        "a Python number, which training cannot call backward() on; return the "
                        "tensor that the torch operations give")
FLOAT64_HINT = ("float64 (double) where the inputs are float32: numpy's functions, "
                "torch.tensor of numpy values and .double() give float64, and torch refuses to "
                "multiply a float64 tensor with the float32 model (expected both to have the "
                "same dtype); keep float32, the inputs' dtype (torch's functions give it by "
                "default), or convert with .float()")
INTEGER_DTYPE_HINT = ("ids, positions and indices are int64 (torch.long), what torch.tensor of "
                      "Python ints, torch.full with an int and torch.arange give: gather and "
                      "the embedding tables index with int64")
OTHER_DTYPE_HINT = ("the answer's dtype is {dtype}, the inputs' own (or, for a mask, bool): "
                    "convert with .to(torch.{dtype}), or build it so from the start")


def type_problem(expected: Any, got: Any, *, gradient: bool = False
                 ) -> tuple[str, str] | None:
    """Why an answer with the right values is still of the wrong type: ``(what, hint)``, e.g.
    ``("expected a float32 tensor but got a numpy array (float64)", NUMPY_HINT)``, or
    ``None``. A tensor is expected where the reference returns one, of its dtype; tuples are
    looked into value by value. ``gradient``: the hint for a Python number says that it
    carries no gradient."""
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) \
            and type(got) is not type(expected):
        return (f"expected {_a(type(expected).__name__)} but got {_a(type(got).__name__)}",
                _container_hint(expected, got))
    if isinstance(expected, tuple) and isinstance(got, (tuple, list)) \
            and len(got) == len(expected):
        for i, (want, have) in enumerate(zip(expected, got)):
            found = type_problem(want, have, gradient=gradient)
            if found is not None:
                return f"value {i} of the tuple: {found[0]}", found[1]
        return None
    if type(expected) is int and isinstance(got, np.integer):
        return (f"expected a Python int but got a numpy {got.dtype}",
                "return a Python int: np.prod, np.sum and numpy's arithmetic give numpy "
                "integers, which overflow silently past their width (int64) and are not "
                "Python ints (json refuses them); convert with int(...)")
    if not _is_tensor(expected):
        return None
    wanted = f"expected {_a(_dtype(expected))} tensor"
    if not _is_tensor(got):
        if isinstance(got, (np.ndarray, np.generic)):
            kind = "array" if isinstance(got, np.ndarray) else "number"
            return f"{wanted} but got a numpy {kind} ({got.dtype})", NUMPY_HINT
        if isinstance(got, tuple) and got and _tensors(got):
            return f"{wanted} but got a tuple of {_values(len(got))}", SEVERAL_HINT
        if isinstance(got, (list, tuple)):
            return f"{wanted} but got {_a(type(got).__name__)}", LIST_HINT
        if isinstance(got, (int, float, bool)):
            return (f"{wanted} but got the Python {type(got).__name__} {show(got)}",
                    NUMBER_GRADIENT_HINT if gradient else NUMBER_HINT)
        return (f"{wanted} but got {_a(type(got).__name__)}",
                f"return a tensor, not {_a(type(got).__name__)}: the exercise asks for the "
                f"numbers themselves (a module's are its .weight)")
    if got.dtype == expected.dtype:
        return None
    if _dtype(got) == "float64" and _dtype(expected) == "float32":
        hint = FLOAT64_HINT
    elif _dtype(expected) == "int64" and got.dtype.is_floating_point:
        hint = INTEGER_HINT
    elif _dtype(expected) == "int64":
        hint = INTEGER_DTYPE_HINT
    else:
        hint = OTHER_DTYPE_HINT.format(dtype=_dtype(expected))
    return f"{wanted} but got {_a(_dtype(got))} tensor", hint


NO_GRADIENT_HINT = ("the result does not carry a gradient: .item(), float(), .tolist(), "
                    ".detach(), .numpy() and torch.tensor(...) of computed numbers cut it from "
                    "autograd's graph (so does torch.no_grad()), and training calls backward() "
                    "on it: compute every step with torch operations on the input tensors")
CUT_GRADIENT_HINT = ("part of the computation is cut from the gradient: a value taken out "
                     "through .item(), float(), .detach() or .numpy() and put back "
                     "(torch.tensor(...), a Python loop that collects numbers) is a constant to "
                     "autograd, so backward() differentiates another function: keep every step "
                     "that depends on {names} a torch operation")


def _tensors(value: Any) -> list:
    """The tensors of an answer: itself, or those of a tuple or list."""
    if isinstance(value, (tuple, list)):
        return [v for item in value for v in _tensors(item)]
    return [value] if _is_tensor(value) else []


def _weighted_sum(outputs: list, weights: list) -> Any:
    return sum((out * weight).sum() for out, weight in zip(outputs, weights))


def _output_weights(outputs: list) -> list:
    """Fixed weights, one per entry of each output, so that a gradient of their weighted sum
    tells the entries apart (-2.5, -1.5, ... 3.5, cycling)."""
    import torch
    return [((torch.arange(out.numel()) % 7) - 2.5).to(out.dtype).view(out.shape)
            for out in outputs]


KEEP_ARGUMENTS_HINT = ("leave the arguments as they were: an in-place operation on one (+=, "
                       "-=, .add_(), x[...] = ..., .append) changes the caller's own tensor or "
                       "list, which it still uses afterwards (the reference's log-probabilities, "
                       "the frozen weight, the conversation); compute a new one instead "
                       "(x = x - y, not x -= y; labels + [...], not .append)")


def _same_value(one: Any, other: Any) -> bool:
    """Equal, looking into tuples, lists and dicts, tensors and arrays compared as such (NaN
    equal to NaN; a generator always, as its state is there to change)."""
    if _is_tensor(one) or _is_tensor(other):
        import torch
        return (_is_tensor(one) and _is_tensor(other) and one.shape == other.shape
                and one.dtype == other.dtype
                and bool(torch.equal(one, other) or torch.allclose(one, other, rtol=0, atol=0,
                                                                  equal_nan=True)))
    if isinstance(one, np.ndarray) or isinstance(other, np.ndarray):
        return np.array_equal(np.asarray(one), np.asarray(other), equal_nan=True)
    if isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)):
        return type(one) is type(other) and len(one) == len(other) and all(
            map(_same_value, one, other))
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_same_value(one[k], other[k]) for k in one)
    if hasattr(one, "get_state"):       # a generator: drawing from it is what it is for
        return True
    try:
        return bool(one == other)
    except Exception:       # a comparison that itself fails counts as a change
        return False


RANDOM_HINT = ("your function gives different answers to the same input: randomness (dropout, "
               "torch.randn or torch.rand without the generator it is given) has no place "
               "here; the same input must give the same answer")
SEVERAL_HINT = ("return one result, not a tuple of several: the exercise asks for the one "
                "value alone (a trainer may return more, the exercise does not)")
INTEGER_HINT = ("these are whole numbers (ids, labels, counts): return integers, as the "
                "exercise does; torch.zeros, torch.full with a float and torch.tensor of floats "
                "make float32, which cross_entropy's targets, gather and indexing refuse")


def _container_hint(expected: Any, got: Any) -> str | None:
    """The hint for a list where a tuple is expected, or the other way, at the top or inside a
    tuple of results."""
    kinds = (list, tuple, set, dict)
    if isinstance(expected, kinds) and isinstance(got, kinds) \
            and type(expected) is not type(got):
        return (f"return {_a(type(expected).__name__)}, not {_a(type(got).__name__)}, as the "
                f"exercise does (the caller may compare it, or add to it, as "
                f"{_a(type(expected).__name__)})")
    if isinstance(expected, tuple) and isinstance(got, tuple) and len(got) == len(expected):
        for i, (want, have) in enumerate(zip(expected, got)):
            found = _container_hint(want, have) if isinstance(want, kinds) else None
            if found is not None:
                return f"value {i} of the tuple: {found}"
    return None


def _integer_hint(expected: Any, got: Any) -> str | None:
    """:data:`INTEGER_HINT` for floats where whole numbers are expected."""
    want, have = _to_numpy(expected), _to_numpy(got)
    if isinstance(want, np.ndarray) and want.dtype.kind in "iu":
        try:
            have = np.asarray(have)
        except (TypeError, ValueError):
            return None
        return INTEGER_HINT if have.dtype.kind == "f" and have.size else None
    return None


NON_FINITE_HINT = ("your answer holds inf or NaN where the expected one is finite: in float32, "
                   "exp() overflows to inf above about 88, and log(0) is -inf (the sigmoid or "
                   "softmax of a large negative number rounds to 0); use the stable forms, "
                   "which subtract the largest value first: log_softmax, logsumexp, "
                   "F.logsigmoid, F.softplus, cross_entropy")


def _non_finite(expected: Any, got: Any) -> bool:
    try:
        want = np.asarray(_to_numpy(expected), dtype=np.float64)
        have = np.asarray(_to_numpy(got), dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(want).all() and not np.isfinite(have).all())


_MATMUL = re.compile(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b "
                        r"\((\d+)\) at non-singleton dimension (\d+)")


def error_hint(error: BaseException) -> str | None:
    """A hint for the errors that a kind of mistake raises, whatever the exercise: a matrix
    product or a broadcast of shapes that do not fit, .view of a slice, Python's if, max or
    math functions on a tensor of several numbers, mixed dtypes; else ``None``."""
    text = str(error)
    found = _MATMUL.search(text)
    if found:
        a, b, c, d = map(int, found.groups())
        if b == d:
            return (f"the shapes do not fit a matrix product ({a}x{b} @ {c}x{d}): the second "
                    f"factor is the wrong way round. A weight stored as nn.Linear's, "
                    f"(out_features, in_features), multiplies as x @ weight.T")
        return (f"the shapes do not fit a matrix product ({a}x{b} @ {c}x{d}): the first's "
                f"columns must equal the second's rows; print each factor's .shape, a factor "
                f"is transposed or in the wrong place")
    found = _BROADCAST.search(text)
    if found:
        return (f"two tensors whose shapes do not line up ({found.group(1)} against "
                f"{found.group(2)} at dimension {found.group(3)}): a reduction without "
                f"keepdim=True, a missing [:, None], or a factor transposed; print each "
                f".shape")
    if "view size is not compatible" in text:
        return ("use .reshape, not .view: a slice such as logits[:, :-1] is not contiguous in "
                "memory, and .view cannot regroup it")
    if "Boolean value of Tensor with more than one value" in text or (
            "only one element tensors can be converted" in text):
        return ("Python's if, max, min, math.exp and float() take one number at a time: use "
                "the tensor operations, which work on every entry at once (torch.maximum, "
                "torch.where, torch.exp)")
    if "object is not callable" in text or "has no attribute" in text:
        return None
    return dtype_hint(error)


def shape_hint(expected: Any, got: Any) -> str | None:
    """A hint for an answer of the wrong shape: a dimension of size 1 too many or too few, the
    dimensions in another order, one number for all where one per row is expected (or the
    other way), one entry too many or too few; else ``None``."""
    want, have = _to_numpy(expected), _to_numpy(got)
    if not isinstance(want, np.ndarray):
        return None
    try:
        have = np.asarray(have)
    except (TypeError, ValueError):
        return None
    if have.dtype.kind not in _KINDS or want.shape == have.shape:
        return None
    squeezed = tuple(n for n in have.shape if n != 1)
    if squeezed == tuple(n for n in want.shape if n != 1):
        if have.ndim > want.ndim:
            return (f"your answer has a dimension of size 1 too many, shape {have.shape} for "
                    f"{want.shape}: a reduction with keepdim=True, or an index with None, left "
                    f"it; squeeze it, or reduce without keepdim")
        return (f"your answer lacks a dimension of size 1, shape {have.shape} for {want.shape}: "
                f"keepdim=True, or unsqueeze")
    if have.ndim == want.ndim and sorted(have.shape) == sorted(want.shape):
        if have.ndim >= 2 and have.shape == want.shape[:-2] + want.shape[:-3:-1] and \
                np.allclose(np.swapaxes(have, -1, -2), want, equal_nan=True):
            return (f"your answer is the expected one transposed, shape {have.shape} for "
                    f"{want.shape}: swap the last two dimensions back (or transpose the other "
                    f"factor)")
        return (f"the dimensions are in another order, shape {have.shape} for {want.shape}: "
                f"a transpose or a permute too many or too few")
    if have.size == want.size and have.ndim != want.ndim:
        return (f"the right number of entries in another shape, {have.shape} for "
                f"{want.shape}: torch.stack adds a dimension where torch.cat joins along one, "
                f"or a reshape or view groups them otherwise")
    if have.ndim == 0 and want.ndim >= 1:
        return (f"one number for the whole batch where one per row is expected, shape "
                f"{want.shape}: reduce over the last dimension only (dim=-1), not over all")
    if want.ndim == 0 and have.ndim >= 1:
        return (f"return one number, shape (), not one per row ({have.shape}): the mean or sum "
                f"is over all of them")
    if have.ndim == want.ndim and have.ndim >= 1:
        gaps = [(d, h - w) for d, (h, w) in enumerate(zip(have.shape, want.shape)) if h != w]
        if len(gaps) == 1 and abs(gaps[0][1]) == 1:
            dim, gap = gaps[0]
            longer, shorter = (have, want) if gap > 0 else (want, have)
            for end, part in (("first", np.take(longer, range(1, longer.shape[dim]), dim)),
                              ("last", np.take(longer, range(longer.shape[dim] - 1), dim))):
                if part.shape == shorter.shape and np.allclose(part, shorter, equal_nan=True):
                    return (f"one entry too {'many' if gap > 0 else 'few'} along dimension "
                            f"{dim}, the {end} (shape {have.shape} for {want.shape}): an "
                            f"off-by-one, a slice that starts or stops one too early or late")
    if have.ndim > want.ndim:
        return (f"your answer has more dimensions than expected, shape {have.shape} for "
                f"{want.shape}: two tensors that broadcast against each other (a (B,) with a "
                f"(B, 1)), or a dimension not reduced")
    return None


def relation_hint(pairs: list, names: Sequence[str] | None = None) -> str | None:
    """A hint from how the answers relate to the expected ones in every case (``pairs``:
    ``(case, expected, answer)``): the sign flipped, a constant factor or one that is a number
    argument, a constant offset, the right values in another order, close but not equal."""
    arrays = []
    for case, want, have in pairs:
        try:
            want = np.asarray(_to_numpy(want), dtype=np.float64)
            have = np.asarray(_to_numpy(have), dtype=np.float64)
        except (TypeError, ValueError):
            return None
        if want.shape != have.shape or want.size == 0:
            return None
        if np.isfinite(want).all() and np.isfinite(have).all():    # the others say nothing
            arrays.append((case, want.ravel(), have.ravel()))
    if len(arrays) < min(2, len(pairs)):
        return None
    wrong = [(case, w, h) for case, w, h in arrays if not np.allclose(h, w, rtol=1e-5, atol=1e-6)]
    if not wrong:
        return None
    def close(a, b):
        return np.allclose(a, b, rtol=1e-4, atol=1e-5)
    if all(close(h, -w) for _, w, h in arrays):
        return ("every value has the wrong sign: one minus too many, or one missing (a loss is "
                "minus what is maximised; a difference the other way round)")
    several = all(w.size >= 2 for _, w, _ in arrays)    # a relation within each answer
    ratios = []
    for case, w, h in arrays:
        big = int(np.argmax(np.abs(w)))
        if abs(w[big]) < 1e-9 or abs(h[big]) < 1e-9 or not close(h, h[big] / w[big] * w):
            ratios = None
            break
        ratios.append(h[big] / w[big])
    if ratios and any(not np.isclose(r, 1) for r in ratios) and len(arrays) >= 2:
        if np.allclose(ratios, ratios[0], rtol=1e-4):
            return (f"every answer is {ratios[0]:.4g} times the expected one: a constant factor "
                    f"is extra or missing (a scale, a count of bytes or of passes, a mean "
                    f"for a sum)")
        for i, name in enumerate(names or []):
            values = [case[i] if i < len(case) else None for case, _, _ in arrays]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                       for v in values):
                continue
            for power, said in ((1, "times"), (-1, "divided by"), (0.5, "times the root of"),
                                (-0.5, "divided by the root of"), (2, "times the square of")):
                if np.allclose(ratios, [v ** power for v in values], rtol=1e-4):
                    return (f"every answer is the expected one {said} {name}: {name} is "
                            f"{'counted' if power > 0 else 'divided'} once too often, or in "
                            f"the wrong place")
        if several:
            return (f"each answer is the expected one times a factor that changes from case "
                    f"to case ({', '.join(f'{r:.3g}' for r in ratios[:4])}): a scale that "
                    f"depends on the sizes is wrong (a mean for a sum, a division by the wrong "
                    f"count)")
    offsets = [h - w for _, w, h in arrays]
    firsts = [o[0] for o in offsets]
    if all(np.allclose(o, o[0], rtol=1e-4, atol=1e-6) for o in offsets) and (
            several or (len(arrays) >= 2 and np.allclose(firsts, firsts[0], rtol=1e-4))):
        same = np.allclose(firsts, firsts[0], rtol=1e-4)
        return (f"every value is off by the same amount, "
                f"{f'{firsts[0]:.4g}' if same else 'one per case'}: a constant added or left "
                f"out (a + 1, an eps, a bias, a term of the formula)")
    if any(w.size >= 2 for _, w, _ in arrays) and all(
            np.allclose(np.sort(h), np.sort(w), rtol=1e-5, atol=1e-6) for _, w, h in arrays):
        return ("the right values, in another order: a transpose, reshape or view that "
                "regroups the numbers, a concatenation in another order, or the wrong axis")
    if all(np.allclose(h, w, rtol=2e-2, atol=1e-3) for _, w, h in arrays):
        gap = max(float(np.max(np.abs(h - w) / np.maximum(np.abs(w), 1e-3)))
                  for _, w, h in arrays)
        return (f"close to the expected values, but not equal (up to {gap:.1e} relative): a "
                f"small term differs, such as an eps of another size or in another place, or "
                f"a bracket that moves it")
    return None


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
        whole_numbers: where the reference returns an ``int`` (a count: bytes, positions), the
            answer must be an integer too; a float of the same value fails with a hint.
        match_every_case: a mistake's hint is given only when the mistake gives the learner's
            answer (or raises the learner's error) on every case, not only on the failing one,
            so that two mistakes that agree on one small case are told apart by the others.
        thorough: an answer with the right values must also be of the reference's type: a
            tensor of its dtype where the reference returns a tensor (not a numpy array, nested
            lists, a Python number or float64), with a hint that names the type
            (:func:`type_problem`); it must leave its arguments as they were (as with
            ``keep_arguments``); and a failure that no listed mistake explains gets a hint
            from what the answer is (:meth:`_general_hint`): of another type, infinite or NaN,
            right for another value of a number argument (a value written in), of a shape
            with a dimension too many or too few, or transposed, with the sign flipped, a
            factor or an offset off, the right values in another order, or close to the
            expected ones.
        keep_arguments: an answer with the right values that changed its arguments (in place)
            or returned one of its list or dict arguments as its own result fails, with this
            hint (``True``: :data:`KEEP_ARGUMENTS_HINT`).
        shapes: ``{hint: predicate}``, tried when no listed mistake explains a failing answer;
            ``predicate(cases, answers)`` is True when the learner's answers (one per case)
            have the mistake's shape, whatever the rest of them.
        gradients: the names of the reference's arguments that training differentiates (the
            logits of a loss, the input and the weights of a layer). Once every value is
            right, each case runs again with those arguments requiring a gradient, and the
            answer's gradient must reach them and equal the reference's: an answer computed
            through ``.item()``, ``.detach()`` or a Python loop of numbers fails with a hint.

    Calling the checker with the learner's function prints one line and returns a :class:`Verdict`.
    Arguments are deep-copied for every call, so a function that modifies its input in place
    cannot change later cases.
    """

    reference: Callable[..., Any]
    cases: Sequence[tuple]
    mistakes: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    atol: float = 1e-6
    rtol: float = 1e-5
    whole_numbers: bool = False
    match_every_case: bool = False
    thorough: bool = False
    gradients: Sequence[str] = ()
    keep_arguments: bool | str = False
    shapes: Mapping[str, Callable[[list, list], bool]] = field(default_factory=dict)

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
        not_whole = wrong_type = changed = None
        keep = self.keep_arguments or self.thorough
        answers: list[tuple[str, Any]] = []      # for match_every_case
        for number, args in enumerate(self.cases, start=1):
            expected = self.reference(*copy.deepcopy(args))
            shown = show_input(args, self._names())
            call = copy.deepcopy(args)
            try:
                got = function(*call)
            except NotImplementedError:
                return Verdict(False, f"{FAIL} not implemented yet")
            except Exception as exc:  # the learner's bug, reported, never raised
                text = " ".join(str(exc).splitlines())      # one line, always
                message = (f"{FAIL} case {number}: for input {shown} your function raised "
                           f"{type(exc).__name__}: {text}")
                answers.append(("error", exc))
                return Verdict(False, self._hint_for(function, answers, message, args, error=exc))
            answers.append(("value", got))
            problem = difference(expected, got, atol=self.atol, rtol=self.rtol)
            if problem is None and self.whole_numbers and _int(expected) and not _int(got) \
                    and not_whole is None:      # said only if every value is right
                value = repr(float(got)) if isinstance(got, (float, np.floating)) else show(got)
                not_whole = Verdict(False, f"{FAIL} case {number}: for input {shown} expected "
                                    f"the whole number {show(expected)} but got the "
                                    f"{type(got).__name__} {value}. Hint: {WHOLE_NUMBER_HINT}")
            if problem is None and keep and changed is None:
                changed = self._changed_arguments(number, args, call, got)
            if problem is None and self.thorough and wrong_type is None:
                kind = type_problem(expected, got, gradient=bool(self.gradients))
                if kind is not None:
                    wrong_type = Verdict(False, f"{FAIL} case {number}: for input {shown} "
                                         f"{kind[0]}. Hint: {kind[1]}")
            if problem is None:
                continue
            message = (f"{FAIL} case {number}: for input {shown} expected {show(expected)} "
                       f"but got {show(got)}")
            where = first_difference(expected, got, atol=self.atol, rtol=self.rtol)
            if where is None and show(expected) == show(got):      # equal at 4 decimals
                where = largest_difference(expected, got)
            if where is not None:
                message += f": {where}"
            if problem != "values differ":
                message += f" ({problem})"
            return Verdict(False, self._hint_for(function, answers, message, args, got=got))
        if not_whole is not None:
            return not_whole
        if wrong_type is not None:
            return wrong_type
        if changed is not None:
            return changed
        for number, args in enumerate(self.cases if self.gradients else (), start=1):
            problem = self._gradient_problem(function, args)
            if problem is not None:
                return Verdict(False, f"{FAIL} case {number}: for input "
                               f"{show_input(args, self._names())} {problem}")
        return Verdict(True, f"{PASS} all {len(self.cases)} checks passed")

    def _gradient_problem(self, function: Callable[..., Any], args: tuple) -> str | None:
        """What is wrong with the gradient of ``function`` on one case, with its hint, or
        ``None`` (see ``gradients``)."""
        import torch

        names = self._names() or []
        where = [names.index(name) for name in self.gradients]
        listed = " and ".join(self.gradients)

        def prepared() -> tuple[list, list]:
            call, leaves = list(copy.deepcopy(args)), []
            for i in where:
                leaves.append(call[i].detach().clone().requires_grad_(True))
                call[i] = leaves[-1].clone()    # not a leaf: the function may change it
            return call, leaves

        call, leaves = prepared()
        expected = _tensors(self.reference(*call))
        carried = [out.requires_grad for out in expected]
        outputs = [out for out in expected if out.requires_grad]
        weights = _output_weights(outputs)
        wanted = torch.autograd.grad(_weighted_sum(outputs, weights), leaves)
        call, leaves = prepared()
        verb = "requires" if len(where) == 1 else "require"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _tensors(function(*call))
        except Exception as exc:
            text = " ".join(str(exc).splitlines())
            return (f"the values are right, but when {listed} {verb} a gradient, as in "
                    f"training, your function raised {type(exc).__name__}: {text}. "
                    f"Hint: {NO_GRADIENT_HINT}")
        got = [out for out, needed in zip(got, carried) if needed]
        if len(got) != len(outputs) or not all(out.requires_grad for out in got):
            return (f"the values are right, but the result does not carry a gradient (its "
                    f"requires_grad is False when {listed} {verb} one). Hint: "
                    f"{NO_GRADIENT_HINT}")
        cut = CUT_GRADIENT_HINT.format(names=listed)
        try:
            found = torch.autograd.grad(_weighted_sum(got, weights), leaves, allow_unused=True)
        except RuntimeError as exc:
            text = " ".join(str(exc).splitlines())
            return f"the values are right, but backward() through them fails: {text}. Hint: {cut}"
        for name, want, have in zip(self.gradients, wanted, found):
            if have is None:
                return (f"the values are right, but the gradient does not reach {name}: "
                        f"the result does not depend on it as far as autograd can see. "
                        f"Hint: {cut}")
            if not torch.allclose(have, want, atol=max(self.atol, 1e-5),
                                  rtol=max(self.rtol, 1e-4)):
                gap = largest_difference(want, have)
                return (f"the values are right, but the gradient with respect to {name} is "
                        f"not the reference's ({gap}). Hint: {cut}")
        return None

    def _names(self) -> list[str] | None:
        """The reference's parameter names, used to label the arguments of a large case."""
        try:
            return list(inspect.signature(self.reference).parameters)
        except (TypeError, ValueError):
            return None

    def _changed_arguments(self, number: int, args: tuple, call: tuple, got: Any
                           ) -> Verdict | None:
        """The verdict on an answer that changed its arguments (``call``, the copies it was
        given, against ``args``) or returned one of its list or dict arguments; else None."""
        parts = got if isinstance(got, tuple) else (got,)
        aliased = any(part is arg for part in parts for arg in call
                      if isinstance(arg, (list, dict)))
        mutated = [name for name, before, after in zip(self._names() or [""] * len(args),
                                                       args, call)
                   if not _same_value(before, after)]
        if not mutated and not aliased:
            return None
        hint = self.keep_arguments if isinstance(self.keep_arguments, str) \
            else KEEP_ARGUMENTS_HINT
        what = (f"changed its argument{'s' if len(mutated) > 1 else ''} "
                f"{' and '.join(mutated)} to {show_input(call, self._names())}" if mutated
                else "returned one of its arguments itself, not a new list")
        return Verdict(False, f"{FAIL} case {number}: for input "
                       f"{show_input(args, self._names())} your function returned the right "
                       f"values but {what}. Hint: {hint}")

    def _hint_for(self, function: Callable[..., Any], answers: list, message: str,
                  args: tuple, *, got: Any = None, error: Exception | None = None) -> str:
        """:meth:`_with_hint`, or with ``match_every_case`` :meth:`_with_hint_on_every_case`
        (``answers``: the learner's outcomes of the cases run so far); failing those, a
        ``shapes`` predicate's hint, then with ``thorough`` :meth:`_general_hint`."""
        if self.match_every_case:
            text = self._with_hint_on_every_case(function, answers, message, error=error)
        else:
            text = self._with_hint(message, args, got=got, error=error)
        if text != message or not (self.shapes or self.thorough):
            return text
        if self.thorough:       # a wrong answer that changed its arguments: the likely cause
            call = copy.deepcopy(args)
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    function(*call)
            except Exception:
                pass
            changed = [name for name, before, after in zip(self._names() or [], args, call)
                       if not _same_value(before, after)]
            if changed:
                return (f"{message}. Hint: your function changed its argument "
                        f"{' and '.join(changed)}: {KEEP_ARGUMENTS_HINT}")
        outcomes = [self._outcome(function, case) for case in self.cases]
        if self.thorough and all(kind == "value" for kind, _ in outcomes):
            try:
                written_in = self._written_in([
                    (case, self.reference(*copy.deepcopy(case)), answer)
                    for case, (_, answer) in zip(self.cases, outcomes)])
            except Exception:
                written_in = None
            if written_in is not None:
                return f"{message}. Hint: {written_in}"
        if self.shapes and all(kind == "value" for kind, _ in outcomes):
            values = [value for _, value in outcomes]
            for hint, shape in self.shapes.items():
                try:
                    matches = bool(shape(copy.deepcopy(self.cases), values))
                except Exception:       # an answer of another shape altogether
                    matches = False
                if matches:
                    return f"{message}. Hint: {hint}"
        if self.thorough:
            try:
                hint = self._general_hint(function, outcomes, args, got=got, error=error)
            except Exception:       # a hint is a help: never a crash of the checker
                hint = None
            if hint is not None:
                return f"{message}. Hint: {hint}"
        return text

    def _general_hint(self, function: Callable[..., Any], outcomes: list, args: tuple, *,
                      got: Any = None, error: Exception | None = None) -> str | None:
        """A hint from what the failing answer is, for a mistake no listed one explains
        (``outcomes``: the learner's on every case; ``args``: the failing case's)."""
        if error is not None:
            return error_hint(error)
        expected = self.reference(*copy.deepcopy(args))
        found = type_problem(expected, got, gradient=bool(self.gradients))
        if found is not None:
            return found[1]
        if isinstance(got, tuple) and not isinstance(expected, tuple):
            return SEVERAL_HINT
        container = _container_hint(expected, got)
        if container is not None:
            return container
        for _ in range(4):     # a dropout of 0.1 on a few numbers may drop none, twice
            again = self._outcome(function, args)
            if again[0] != "value" or not _same_value(got, again[1]):
                return RANDOM_HINT
        pairs = []          # (case, expected, answer) where every case gave a value
        if all(kind == "value" for kind, _ in outcomes):
            pairs = [(case, self.reference(*copy.deepcopy(case)), answer)
                     for case, (_, answer) in zip(self.cases, outcomes)]
        written_in = self._written_in(pairs)
        if written_in is not None:
            return written_in
        if isinstance(expected, tuple) and isinstance(got, (tuple, list)) \
                and len(got) == len(expected):
            wrong = [i for i, (want, have) in enumerate(zip(expected, got))
                     if difference(want, have, atol=self.atol, rtol=self.rtol) is not None]
            if not wrong:
                return None
            if sorted(wrong) == wrong and len(wrong) >= 2 and all(
                    difference(expected[i], got[j], atol=self.atol, rtol=self.rtol) is None
                    for i, j in zip(wrong, wrong[::-1])):
                return ("the right values in another order: return them in the order the "
                        "exercise gives")
            hints = set()       # several parts wrong: a hint only if each gets the same one
            for i in wrong:
                hints.add(self._part_hint(expected[i], got[i], [
                    (case, want[i], have[i]) for case, want, have in pairs
                    if isinstance(have, (tuple, list)) and len(have) == len(want)]))
            if len(hints) != 1 or None in hints:
                return None
            values = " and ".join(map(str, wrong))
            return f"value{'s' if len(wrong) > 1 else ''} {values} of the tuple: {hints.pop()}"
        return self._part_hint(expected, got, pairs)

    def _part_hint(self, expected: Any, got: Any, pairs: list) -> str | None:
        """The general hint for one answer (or one part of a tuple of them)."""
        return (_integer_hint(expected, got) or
                (NON_FINITE_HINT if _non_finite(expected, got) else None)
                or shape_hint(expected, got) or relation_hint(pairs, self._names()))

    def _written_in(self, pairs: list) -> str | None:
        """The hint for answers that are the reference's with one number argument fixed at a
        value it takes in some case (a value written in), when every case agrees."""
        if not pairs:
            return None
        names = self._names() or [f"argument {i + 1}" for i in range(len(pairs[0][0]))]
        for i, name in enumerate(names):
            values = [case[i] for case, _, _ in pairs]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                continue
            for value in dict.fromkeys(values):
                if all(v == value for v in values):
                    continue

                try:
                    same = all(difference(self.reference(*copy.deepcopy(
                        case[:i] + (value,) + case[i + 1:])), answer, atol=self.atol,
                        rtol=self.rtol) is None for case, _, answer in pairs)
                except Exception:
                    same = False
                if same:
                    other = next(n for n, v in enumerate(values, start=1) if v != value)
                    return (f"your function answers as if {name} were always {value!r}, the "
                            f"value some cases give it: use the argument {name}, not a number "
                            f"written in (case {other} has {name} = {values[other - 1]!r})")
        return None

    @staticmethod
    def _outcome(function: Callable[..., Any], args: tuple) -> tuple[str, Any]:
        """``("value", answer)`` or ``("error", exception)`` of one call, warnings silenced."""
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")  # a known mistake may divide 0 by 0
                return "value", function(*copy.deepcopy(args))
        except Exception as error:
            return "error", error

    def _same_outcome(self, one: tuple[str, Any], other: tuple[str, Any], *,
                      loose: bool = False) -> bool:
        """Equal answers, or the same error (``loose``: of the same type, whatever its text)."""
        if one[0] != other[0]:
            return False
        if one[0] == "error":
            return type(one[1]) is type(other[1]) and (loose or str(one[1]) == str(other[1]))
        return difference(one[1], other[1], atol=self.atol, rtol=self.rtol,
                          equal_nan=True) is None

    def _with_hint_on_every_case(self, function: Callable[..., Any], answers: list,
                                 message: str, *, error: Exception | None = None) -> str:
        """Add the hint of the first known mistake that answers every case as the learner's
        function does (the cases after the failing one are run now). An error matches the
        same error; failing that, where the learner's function answered some case, an error of
        the same type (the same mistake written another way raises it from other code)."""
        answers = list(answers)
        for args in self.cases[len(answers):]:
            answers.append(self._outcome(function, args))
        outcomes = {hint: [self._outcome(wrong, args) for args in self.cases]
                    for hint, wrong in self.mistakes.items()}
        looser = [False] + ([True] if any(kind == "value" for kind, _ in answers) else [])
        for loose in looser:
            for hint, theirs in outcomes.items():
                if all(self._same_outcome(mine, their, loose=loose)
                       for mine, their in zip(answers, theirs)):
                    return f"{message}. Hint: {hint}"
        general = dtype_hint(error) if error is not None else None
        if general is not None:
            return f"{message}. Hint: {general}"
        return message

    def _with_hint(self, message: str, args: tuple, *, got: Any = None,
                   error: Exception | None = None) -> str:
        """Add the hint of the first known mistake that behaves like the learner's function.

        A mistake matches when it returns the same answer, or, for a learner's function that
        raised, when it raises the same kind of error with the same message. An error from mixing
        numpy with torch or float64 with float32 that no listed mistake explains gets
        :data:`DTYPE_HINT`.
        """
        for hint, wrong in self.mistakes.items():
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")  # a known mistake may divide 0 by 0
                    answer = wrong(*copy.deepcopy(args))
            except Exception as wrong_error:
                matches = error is not None and type(wrong_error) is type(error) \
                    and str(wrong_error) == str(error)
            else:
                matches = error is None and difference(answer, got, atol=self.atol,
                                                       rtol=self.rtol, equal_nan=True) is None
            if matches:
                return f"{message}. Hint: {hint}"
        general = dtype_hint(error) if error is not None else None
        if general is not None:
            return f"{message}. Hint: {general}"
        return message

    def __call__(self, function: Callable[..., Any]) -> Verdict:
        verdict = self.run(function)
        print(verdict.message)
        return verdict
