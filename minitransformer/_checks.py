"""The package's argument checks, in one place (used by every module).

Each mistake gets one message and one exception type wherever it is made: ``TypeError`` for a
value of the wrong type, ``ValueError`` for a value of the right type that cannot be right. A
public entry point checks its inputs once; the layers a model calls from its own ``forward`` do
not check again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor


def shape(t: Tensor) -> tuple[int, ...]:
    """A tensor's shape as a plain tuple, for messages: ``(2, 5, 16)``."""
    return tuple(t.shape)


def _type_name(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of dtype {value.dtype}"
    return type(value).__name__


def check_int(name: str, value: object, *, low: int = 1) -> int:
    """An ``int`` (not a ``bool``; numpy integers count) of at least ``low``: sizes, counts,
    lengths, ids. Returns it as a plain ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_type_name(value)} ({value!r})")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return int(value)


def check_type(name: str, value: object, types: type | tuple[type, ...], expected: str) -> object:
    """A value of one of ``types``; ``expected`` says it in words (``"a str"``). The message
    names the type it got, not the value, which may be a whole book's text."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}, got {_type_name(value)}")
    return value


def check_number(name: str, value: object, *, low: float | None = None,
                 positive: bool = False) -> float:
    """A finite real number; ``positive`` asks for > 0, ``low`` for >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {_type_name(value)} ({value!r})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value!r}")
    return float(value)


def check_probability(name: str, value: object) -> float:
    """A dropout-style probability in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1), got {_type_name(value)} ({value!r})")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """One of a few named options, e.g. ``activation="relu"``."""
    choices = sorted(choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {_type_name(value)} ({value!r})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_model_sizes(config: object, names: Iterable[str],
                      default_d_ff: Callable[[int], int]) -> None:
    """The sizes every model config checks, in one place: ``names`` positive ints, ``d_model``
    divisible by ``num_heads``, and ``d_ff`` a positive int, ``default_d_ff(d_model)`` when it
    is ``None`` (set once, here: the configs are frozen dataclasses)."""
    for name in names:
        check_int(name, getattr(config, name))
    check_divisible(config.d_model, config.num_heads)
    if config.d_ff is None:
        object.__setattr__(config, "d_ff", default_d_ff(config.d_model))
    check_int("d_ff", config.d_ff)


def check_divisible(d_model: int, num_heads: int) -> None:
    """Heads split ``d_model`` evenly."""
    if d_model % num_heads:
        raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model} and "
                         f"num_heads={num_heads}")


def check_float_tensor(name: str, value: object, *, ndim: int | None = None,
                       min_ndim: int | None = None, last_dim: int | None = None) -> Tensor:
    """A floating-point tensor, optionally with a given number of dimensions or last size."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {_type_name(value)}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {shape(value)}")
    if min_ndim is not None and value.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape "
                         f"{shape(value)}")
    if last_dim is not None and (value.ndim == 0 or value.shape[-1] != last_dim):
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {shape(value)}")
    return value


def check_same_dtype(**tensors: Tensor) -> None:
    """Tensors that are combined must share a dtype (no silent float32/float64 mix)."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"{', '.join(dtypes)} must have the same dtype, got {listed}")


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_int_tensor(name: str, value: object, *, ndim: int | None = None) -> Tensor:
    """An integer tensor (token ids), optionally with a given number of dimensions."""
    if not isinstance(value, Tensor) or value.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor of token ids, got "
                        f"{_type_name(value)}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {shape(value)}")
    return value


# what nn.Embedding takes; uint8, int8 and int16 ids are refused by name rather than failing in it
ID_DTYPES = (torch.int64, torch.int32)


def check_token_ids(name: str, value: object, vocab_size: int, *,
                    max_len: int | None = None, device: torch.device | None = None,
                    ignore_index: int | None = None) -> Tensor:
    """A ``(B, T)`` int64 or int32 tensor of token ids in ``[0, vocab_size)``, ``T <= max_len``,
    on ``device`` (the model's) when given. ``ignore_index`` (a loss's "no target here", -100)
    is allowed as well, but not everywhere."""
    check_int_tensor(name, value)
    if value.dtype not in ID_DTYPES:
        raise TypeError(f"{name} must hold int64 or int32 token ids, got dtype {value.dtype}: "
                        f"convert it with {name}.long()")
    if value.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T), got {shape(value)}")
    if value.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token per row, got shape "
                         f"{shape(value)}")
    if max_len is not None and value.shape[1] > max_len:
        raise ValueError(f"{name} has {value.shape[1]} positions, more than context_length="
                         f"{max_len}")
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device} and the model on {device}: move it with "
                         f"{name}.to({str(device)!r})")
    if value.numel() and value.device.type != "meta":
        ids = value if ignore_index is None else value[value != ignore_index]
        if ignore_index is not None and ids.numel() == 0:
            raise ValueError(f"every position of {name} is {ignore_index} (ignored): there is "
                             f"nothing to compute a loss on")
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            allowed = "" if ignore_index is None else f" (or {ignore_index}: ignored)"
            raise ValueError(f"{name} holds token id {bad}, outside the vocabulary "
                             f"[0, {vocab_size}){allowed}")
    return value


def check_mask(attn_mask: object, scores_shape: Sequence[int], described: str,
               name: str = "attn_mask") -> Tensor:
    """A mask that is boolean (True = may attend) or additive floating (0 and -inf), and that
    broadcasts to the scores ``scores_shape`` without enlarging them.

    A floating mask holding only 0s and 1s is a boolean mask in the wrong dtype (adding 1 to a
    score hides nothing): that is an error that suggests ``.bool()``.
    """
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"{name} must be a tensor, got {_type_name(attn_mask)}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(f"{name} must be boolean (True = may attend) or floating (added to the "
                        f"scores), got dtype {attn_mask.dtype}")
    try:
        broadcast = torch.broadcast_shapes(attn_mask.shape, tuple(scores_shape))
    except RuntimeError:
        broadcast = None
    if broadcast != torch.Size(scores_shape):
        raise ValueError(f"{name} of shape {shape(attn_mask)} does not broadcast to the scores "
                         f"{described} = {tuple(scores_shape)}")
    if attn_mask.is_floating_point() and attn_mask.numel() and attn_mask.device.type != "meta":
        zeros_and_ones = ((attn_mask == 0) | (attn_mask == 1)).all()
        if zeros_and_ones and (attn_mask == 1).any():
            raise ValueError(f"{name} is a floating mask of only 0s and 1s, which would be added "
                             f"to the scores and hide nothing; it looks like a boolean mask "
                             f"(True = may attend) in the wrong dtype: pass {name}.bool(), or an "
                             f"additive mask of 0 and -inf")
    if attn_mask.numel() and attn_mask.device.type != "meta" and scores_shape[-1] > 0:
        _check_no_empty_rows(attn_mask, name)
    return attn_mask


def _check_no_empty_rows(attn_mask: Tensor, name: str) -> None:
    """No query may have every key masked: a softmax over only -inf scores is 0/0 (NaN), and
    PyTorch's fused kernel quietly returns zeros."""
    if attn_mask.dtype == torch.bool:
        empty = ~attn_mask.any(dim=-1)
    else:
        empty = torch.isneginf(attn_mask).all(dim=-1)
    if not empty.any():
        return
    where = tuple(torch.nonzero(empty.reshape(empty.shape or (1,)))[0].tolist())
    if attn_mask.ndim >= 2 and attn_mask.shape[-2] > 1:
        batch, who = where[:-1], f"query {where[-1]}"
    else:  # the mask's query dimension is 1 (or absent): it masks every query alike
        batch, who = where[:-1] if attn_mask.ndim >= 2 else (), "every query"
    at = f" of {name} batch/head index {batch}" if batch else ""
    raise ValueError(f"{who}{at} has every key masked, so there is nothing to "
                     f"attend to (a softmax over only -inf scores); let each query see at least "
                     f"one key (True = may attend)")


def factory_kwargs(device: torch.device | str | None,
                   dtype: torch.dtype | None) -> dict[str, object]:
    """The ``device=``/``dtype=`` pair every module passes on to the layers it creates, after
    checking both: a device that exists here (:func:`check_device`), a dtype a model can compute
    in (:func:`check_compute_dtype`)."""
    if dtype is not None:
        check_compute_dtype(dtype)
    return {"device": check_device(device), "dtype": dtype}


# the floating dtypes a model computes in; float8 and the like only store numbers
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_compute_dtype(dtype: object, *, name: str = "dtype", source: str = "") -> torch.dtype:
    """A floating dtype that matrix products and layer norms run in (float16, bfloat16,
    float32, float64); float8 formats are refused by name. ``source`` prefixes the message."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{source}{name} must be a floating-point torch.dtype, got {dtype!r}")
    if dtype not in COMPUTE_DTYPES:
        shown = str(dtype).removeprefix("torch.")
        raise ValueError(f"{source}{name} is {shown}, a storage format a model cannot compute "
                         f"in: use one of float16, bfloat16, float32, float64")
    return dtype


_AVAILABLE: set[torch.device] = set()  # devices a tensor was once created on, in this process


def check_device(device: object, *, name: str = "device") -> torch.device | None:
    """``device`` as a :class:`torch.device` that exists in this process, or ``None``.

    A name PyTorch does not know (``"toaster"``) and a device it knows but cannot reach here
    (``"mps"`` off a Mac, ``"cuda"`` without a GPU, ``"cuda:3"`` with one GPU) are a
    ``ValueError`` naming it, found by creating an empty tensor there once.
    """
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"{name} must be a str or torch.device such as 'cpu' or 'cuda', got "
                        f"{_type_name(device)}")
    try:
        device = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{name} {device!r} is not a device PyTorch knows ({reason})") \
            from None
    if device not in _AVAILABLE:
        try:
            torch.empty(0, device=device)
        except Exception as exc:  # noqa: BLE001 - NotImplementedError, AssertionError, ...
            reason = (str(exc).splitlines() or [type(exc).__name__])[0].split(". ")[0]
            raise ValueError(f"{name} {str(device)!r} is not available here ({reason}); "
                             f"use 'cpu'{_cuda_hint()}") from None
        _AVAILABLE.add(device)
    return device


def _cuda_hint() -> str:
    if not torch.cuda.is_available():
        return ""
    return f" or 'cuda' ({torch.cuda.device_count()} GPU(s) here)"


def check_scores(x: Tensor, dim: int = -1) -> Tensor:
    """The checks of :func:`~minitransformer.functional.softmax`, which
    :func:`~minitransformer.generation.sample_next` runs too; returns the largest score of each
    slice along ``dim`` (``keepdim=True``).

    NaN and ``+inf`` make the largest score NaN or ``+inf``, and a slice of only ``-inf`` makes
    it ``-inf``: one look at the largest scores finds all three. The scores themselves are
    searched only to say which it was.
    """
    check_float_tensor("x", x)
    if x.dim() and not -x.dim() <= dim < x.dim():
        raise ValueError(f"softmax dim {dim} is out of range for a tensor of shape {shape(x)}")
    if x.dim() and x.shape[dim] == 0:
        raise ValueError(f"softmax got an empty dimension {dim} in a tensor of shape {shape(x)}")
    largest = x.amax(dim=dim, keepdim=True)
    # |largest| is finite in every slice when its maximum is (NaN propagates through both)
    if largest.numel() and not math.isfinite(float(largest.detach().abs().amax())):
        if torch.isnan(x).any() or torch.isposinf(x).any():
            raise ValueError("softmax scores must not contain NaN or +inf")
        raise ValueError(f"softmax got a slice along dim {dim} whose scores are all -inf "
                         f"(every position masked), in a tensor of shape {shape(x)}")
    return largest


def check_id_list(name: str, ids: object, *, allow_empty: bool = True) -> list[int]:
    """Token ids given as a list or tuple of ints >= 0 or a 1-D integer tensor, as a list of
    ``int`` (a prompt, stop tokens); ``allow_empty=False`` asks for at least one."""
    if isinstance(ids, Tensor):
        if ids.ndim != 1:
            raise ValueError(f"{name} must be one row of token ids, got shape {shape(ids)}")
        check_int_tensor(name, ids)
        ids = ids.tolist()
    check_type(name, ids, (list, tuple), "a list of token ids")
    if not ids and not allow_empty:
        raise ValueError(f"{name} is empty: it needs at least one token")
    return [check_int(f"{name}[{i}]", t, low=0) for i, t in enumerate(ids)]
