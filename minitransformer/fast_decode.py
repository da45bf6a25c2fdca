"""The CPU kernels of the fast decode steps (:meth:`GPT.make_fast_decode_step
<minitransformer.gpt.GPT.make_fast_decode_step>`, :meth:`Llama.make_fast_decode_step
<minitransformer.llama.Llama.make_fast_decode_step>`; chapters 11 and 18).

At one token per row, each linear layer of a decode step is a matrix-vector product: it reads
every weight once for one multiply-add, so its speed is the memory's. On the CPU, ``F.linear``
of one row (a BLAS ``gemv``) read the weights at well under the memory's bandwidth.
:func:`row_product` cuts each large weight matrix into ``FAST_PIECES`` blocks of rows, views
of the weight itself (no copy), and multiplies the rows by all of them in one batched call
(``torch.baddbmm``), which the threads share; for one or two rows the blocks stand on the left
of the product (``blocks @ x^T``), and a matrix as large as GPT-2's head is cut into more
blocks when it multiplies more rows, as a serving engine's batch does. The blocks change the
order of the additions, hence the rounding: the logits equal ``F.linear``'s up to float
rounding, not bit for bit.

A model whose linear layers are int8 (:func:`~minitransformer.quantize.quantize_linears`,
chapter 19) hands the step the layers themselves (:func:`step_weight`), and
:class:`RowProducts` calls each, which multiplies its int8 matrix.

:class:`PackedWeight` keeps a copy of a weight in the layout oneDNN, PyTorch's CPU kernel
library, packs a matrix into for its products (a serving engine's choice, ``pack_weights``):
products of ``PACKED_MIN_ROWS`` rows or more read it. :class:`RowProducts` picks the way for
each product of a step.

Whether the blocks pay depends on the CPU and its BLAS: on one of the course's machines a
one-row ``gemv`` ran on one thread and the blocks doubled GPT-2 small's decoding speed; on
another, ``gemv`` itself read SmolLM2's matrices at 50-70 GB/s and the blocks were 2-4x
slower. So the first product of each shape times both ways, a few calls each, and keeps the
faster (:func:`blocks_pay`, ``FAST_CHOICE``); the choice is remembered for the process.

The thresholds were measured on the course's CPU (2 threads); the figures are in the
docstrings of ``benchmarks/decode_vs_transformers.py`` and ``benchmarks/packed_weights.py``,
which time each way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer.quantize import Int8Linear

FAST_PIECES = 8  # the blocks of rows a fast step's products cut a matrix into
# below this many numbers (1 MiB of float32) a matrix is read in less time than the blocks'
# few extra calls take: F.linear is faster (the book's model, chapter 11)
FAST_MIN_NUMEL = 2 ** 18
# up to this many rows, the blocks multiply the rows from the left (blocks @ x^T); from more
# rows on, x @ blocks^T
FAST_FEW_ROWS = 2
# a matrix of at least this many numbers (GPT-2's head: 38.6 million) is cut into
# FAST_LARGE_PIECES blocks for more than FAST_LARGE_FEW_ROWS rows, and up to that many rows
# takes the blocks on the left
FAST_LARGE_NUMEL = 2 ** 24
FAST_LARGE_PIECES = 32
FAST_LARGE_FEW_ROWS = 4
# with pack_weights, products of at least this many rows read the packed copy
PACKED_MIN_ROWS = 3
# the batch size oneDNN is told when it packs (its layout's hint)
PACKED_ROWS_HINT = 16
# "measure": each shape's first product times row_product against F.linear and keeps the
# faster (blocks_pay); "blocks" or "linear" always takes that way (tests, benchmarks)
FAST_CHOICE = "measure"
# the blocks must take at most this fraction of F.linear's time to be chosen
FAST_MARGIN = 0.8
# (the measurements behind each number: benchmarks/decode_vs_transformers.py and
# benchmarks/packed_weights.py, in their docstrings)


class PackedWeight:
    """A weight matrix ``(out, in)`` and its copy packed by oneDNN for
    a fast decode step (``pack_weights=True``), packed again when the weight is
    changed in place (its ``_version``) or moved. Called with rows ``x`` ``(N, in)`` and a bias, it
    returns ``F.linear(x, weight, bias)`` up to rounding, or ``None`` where it cannot pack (not
    float32 on the CPU, no oneDNN, an inference-mode tensor, whose changes it cannot see)."""

    __slots__ = ("weight", "_packed", "_key")

    def __init__(self, weight: Tensor):
        self.weight, self._packed, self._key = weight, None, None

    def __call__(self, x: Tensor, bias: Tensor | None) -> Tensor | None:
        packed = self.current()
        if packed is None or x.dtype != torch.float32:
            return None
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def can_pack(self) -> bool:
        """Whether the weight is float32 on the CPU, not an inference-mode tensor, and PyTorch
        has oneDNN, enabled."""
        w = self.weight
        return (w.device.type == "cpu" and w.dtype == torch.float32 and not w.is_inference()
                and torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))

    def current(self) -> Tensor | None:
        """The packed copy of the weight as it is now (packed again if it changed), or
        ``None`` where it cannot pack."""
        if not self.can_pack():
            return None
        w = self.weight
        key = (w.data_ptr(), w._version, tuple(w.shape), w.stride())
        if key != self._key:
            self._packed = None                  # the old copy goes before the new one comes
            with torch.inference_mode(False), torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(),
                                                                       PACKED_ROWS_HINT)
            self._key = key
        return self._packed


def pieces_pay(x: Tensor) -> bool:
    """Whether :func:`row_product` beats ``F.linear`` for rows like ``x``: float32 and float64
    on the CPU, where ``F.linear`` of one row is a BLAS ``gemv`` far from the memory's speed."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def row_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a few rows ``x`` ``(B, in)``, as ``FAST_PIECES``
    products of blocks of ``weight``'s rows (views, no copy), batched in one call (with the
    blocks on the left for up to :data:`FAST_FEW_ROWS` rows, on the right for more; a weight
    of :data:`FAST_LARGE_NUMEL` numbers or more takes the left up to
    :data:`FAST_LARGE_FEW_ROWS` rows and :data:`FAST_LARGE_PIECES` blocks past that); the rows
    beyond a whole number of blocks go through ``F.linear``, and so does a weight of fewer
    than :data:`FAST_MIN_NUMEL` numbers. ``(B, out)``, the same numbers up to the order of
    the additions."""
    out, width = weight.shape
    rows, large = x.shape[0], out * width >= FAST_LARGE_NUMEL
    pieces = FAST_LARGE_PIECES if large and rows > FAST_LARGE_FEW_ROWS else FAST_PIECES
    size = out // pieces                                 # rows of weight per block
    if size == 0 or out * width < FAST_MIN_NUMEL:
        return F.linear(x, weight, bias)
    whole = size * pieces
    if rows <= (FAST_LARGE_FEW_ROWS if large else FAST_FEW_ROWS):
        blocks = weight[:whole].view(pieces, size, width)          # blocks @ x^T
        xs = x.t().expand(pieces, width, rows)                      # (P, in, B)
        y = (torch.bmm(blocks, xs) if bias is None
             else torch.baddbmm(bias[:whole].view(pieces, size, 1), blocks, xs))
        y = y.view(1, whole) if rows == 1 else y.permute(2, 0, 1).reshape(rows, whole)
    else:                                                           # x @ blocks^T
        blocks = weight[:whole].view(pieces, size, width).transpose(1, 2)  # (P, in, size)
        xs = x.expand(pieces, rows, width)                                  # (P, B, in)
        y = (torch.bmm(xs, blocks) if bias is None
             else torch.baddbmm(bias[:whole].view(pieces, 1, size), xs, blocks))
        y = y.transpose(0, 1).reshape(rows, whole)                         # (B, whole)
    if whole == out:
        return y
    rest = F.linear(x, weight[whole:], None if bias is None else bias[whole:])
    return torch.cat([y, rest], dim=1)                                     # (B, out)


_CHOSEN: dict[tuple, bool] = {}


def blocks_pay(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`row_product` is faster than ``F.linear`` for rows like ``x`` and this
    weight's shape, on this machine at this number of threads: ``FAST_CHOICE`` ``"blocks"``
    or ``"linear"`` decides; ``"measure"`` (the default) times both ways the first time a
    shape is met (two warm-up calls and five alternating timed calls each, the medians
    compared; the blocks must take at most ``FAST_MARGIN`` of ``F.linear``'s time) and
    remembers the answer. Either way the product is the same up to float rounding."""
    if FAST_CHOICE != "measure":
        return FAST_CHOICE == "blocks"
    out, width = weight.shape
    if out * width < FAST_MIN_NUMEL or out // FAST_PIECES == 0:
        return False                                     # row_product is F.linear there
    rows = x.shape[0]
    key = (out, width, weight.dtype, weight.device.type, min(rows, 2 * FAST_LARGE_FEW_ROWS),
           torch.get_num_threads())
    if key not in _CHOSEN:
        with torch.no_grad():
            probe = torch.zeros_like(x)
            ways = {"blocks": lambda: row_product(probe, weight),
                    "linear": lambda: F.linear(probe, weight)}
            times: dict[str, list[float]] = {"blocks": [], "linear": []}
            for way in ways.values():
                way(), way()                             # warm-up
            for _ in range(5):
                for name, way in ways.items():
                    start = time.perf_counter()
                    way()
                    times[name].append(time.perf_counter() - start)
        _CHOSEN[key] = (statistics.median(times["blocks"])
                        <= FAST_MARGIN * statistics.median(times["linear"]))
    return _CHOSEN[key]


class RowProducts:
    """The linear products of one fast decode step: ``F.linear(x, weight, bias)`` for rows
    ``x`` ``(N, in)``, each the fastest way :func:`row_product`, a :class:`PackedWeight` or
    ``F.linear`` itself can give, up to float rounding.

    Args:
        weights: the step's weight matrices; with ``pack_weights``, each is packed here, once.
        pack_weights: keep a packed copy of every weight (see :class:`PackedWeight`).
    """

    def __init__(self, weights: Iterable[Tensor | Int8Linear], *, pack_weights: bool = False):
        self.packs: dict[int, PackedWeight] = {}
        if pack_weights:
            for weight in weights:
                if isinstance(weight, Tensor):           # an int8 layer multiplies its own
                    self.packs[id(weight)] = PackedWeight(weight)
            for pack in self.packs.values():
                pack.current()                           # packed now, not at the first call

    def packed_now(self) -> bool:
        """Whether this call may read the packed copies: packing asked for, no autograd, and
        weights that can be packed (one dtype and device: the first stands for all)."""
        return (bool(self.packs) and not torch.is_grad_enabled()
                and next(iter(self.packs.values())).can_pack())

    def __call__(self, x: Tensor, weight: Tensor | Int8Linear, bias: Tensor | None = None, *,
                 packed: bool, blockwise: bool) -> Tensor:
        """``F.linear(x, weight, bias)`` up to rounding: through the packed copy for
        ``PACKED_MIN_ROWS`` rows or more when ``packed``, else through :func:`row_product` when
        ``blockwise`` (:func:`pieces_pay`) and :func:`blocks_pay` finds it faster, else
        ``F.linear``. A ``weight`` that is an :class:`~minitransformer.quantize.Int8Linear`
        (:func:`step_weight`) is that layer's own product, its bias included."""
        if not isinstance(weight, Tensor):
            return weight.forward(x)                     # no hooks: the step checked
        if packed and x.shape[0] >= PACKED_MIN_ROWS:
            out = self.packs[id(weight)](x, bias)
            if out is not None:
                return out
        if blockwise and blocks_pay(x, weight):
            return row_product(x, weight, bias)
        return F.linear(x, weight, bias)


def step_weight(linear: nn.Linear | Int8Linear) -> Tensor | Int8Linear:
    """What a fast decode step multiplies by for a linear layer: an ``nn.Linear``'s weight
    tensor, or an :class:`~minitransformer.quantize.Int8Linear` itself (weight-only int8,
    chapter 19), which :class:`RowProducts` calls."""
    return linear.weight if isinstance(linear, nn.Linear) else linear
