"""Checkers for the exercises of chapter 13, *Your GPT is GPT-2*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_conv1d` -- ``my_conv1d(x, weight, bias)``: what GPT-2's ``Conv1D`` layer
  computes, ``x @ weight + bias`` with ``weight`` stored ``(in, out)``.
* :data:`check_fuse_qkv` -- ``my_fuse_qkv(q_weight, k_weight, v_weight)``: GPT-2's ``c_attn``
  weight ``(d, 3d)`` from three ``nn.Linear`` weights ``(d, d)``, query first, then key, then
  value.
* :data:`check_parameter_count` -- ``my_gpt2_parameter_count(vocab_size, context_length,
  num_layers, d_model, d_ff)``: the parameters of a GPT-2 with a tied head.
* :data:`check_byte_to_char` -- ``my_byte_to_char(b)``: the character GPT-2's ``vocab.json``
  and ``merges.txt`` write for the byte ``b``; its nine checks run all 256 bytes.

A hint is given only for a listed mistake that gives the learner's answer on every case
(``match_every_case``): the cases are chosen so that the typical mistakes differ somewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from minitransformer.bpe import bytes_to_unicode
from minitransformer.exercises import FAIL, PASS, Checker, Verdict

__all__ = ["check_byte_to_char", "check_conv1d", "check_fuse_qkv", "check_parameter_count"]


def _numbers(generator: torch.Generator, *shape: int) -> Tensor:
    return torch.randint(-4, 5, shape, generator=generator).float()


# --- my_conv1d(x, weight, bias) ------------------------------------------------------------------

def _conv1d(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x @ weight + bias


def _conv1d_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(13)
    return [(_numbers(g, 2, 3), _numbers(g, 3, 3), _numbers(g, 3)),      # (in, out) = (3, 3)
            (_numbers(g, 1, 2, 3), _numbers(g, 3, 2), _numbers(g, 2)),   # batched, (3, 2)
            (_numbers(g, 2, 2, 4), _numbers(g, 4, 2), _numbers(g, 2))]


check_conv1d = Checker(
    reference=_conv1d,
    cases=_conv1d_cases(),
    mistakes={
        "x @ weight.T + bias (F.linear, nn.Linear) is the product for a weight stored "
        "(out, in); Conv1D stores it (in, out), ready for x @ weight + bias, no transpose":
            lambda x, w, b: F.linear(x, w, b),
        "add the bias: y = x @ weight + bias":
            lambda x, w, b: x @ w,
        "the bias is added to the product, not to x: (x @ weight) + bias":
            lambda x, w, b: (x + b) @ w,
        "* multiplies entry by entry; the layer is a matrix product, x @ weight":
            lambda x, w, b: x * w + b,
        "x may have more dimensions than two, (batch, positions, in): torch.mm takes only "
        "matrices, while x @ weight multiplies over the last dimension":
            lambda x, w, b: torch.mm(x, w) + b,
        "the input comes first: x @ weight, each row of x times the weight":
            lambda x, w, b: w @ x + b,
        "x may have more dimensions than two, (batch, positions, in): an einsum over 'ij' "
        "takes only matrices; write '...i,io->...o', or x @ weight":
            lambda x, w, b: torch.einsum("ij,jk->ik", x, w) + b,
        "the product sums over the inputs, dim -2 of x.unsqueeze(-1) * weight (the rows of "
        "the weight), leaving one number per output":
            lambda x, w, b: (x.unsqueeze(-1) * w).sum(-1) + b,
        "add the bias once, to the product: y = x @ weight + bias":
            lambda x, w, b: x @ w + 2 * b,
        "add the bias, do not subtract it: y = x @ weight + bias":
            lambda x, w, b: x @ w - b,
    },
    match_every_case=True,
    thorough=True,
    gradients=('x', 'weight', 'bias'),
)


# --- my_fuse_qkv(q_weight, k_weight, v_weight) ---------------------------------------------------

def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return torch.cat([q, k, v], dim=0).t()


def _fuse_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(31)
    return [tuple(_numbers(g, d, d) for _ in range(3)) for d in (2, 3, 4)]


check_fuse_qkv = Checker(
    reference=_fuse_qkv,
    cases=_fuse_cases(),
    mistakes={
        "Conv1D stores (in, out): the three weights stacked along dim 0 are (3d, d), "
        "(out, in); transpose the result into (d, 3d)":
            lambda q, k, v: torch.cat([q, k, v], dim=0),
        "side by side along dim 1 gives the right shape, but each weight is still in "
        "nn.Linear's (out, in) layout: transpose each one, or stack along dim 0 and "
        "transpose the result":
            lambda q, k, v: torch.cat([q, k, v], dim=1),
        "reshape keeps the numbers in their order and only regroups them; turning (3d, d) "
        "into (d, 3d) needs a transpose, .t()":
            lambda q, k, v: torch.cat([q, k, v], dim=0).reshape(q.shape[0], -1),
        "the outputs sit in three blocks side by side, all of the query's, then the key's, "
        "then the value's: q | k | v, not interleaved one column of each":
            lambda q, k, v: torch.stack([q.t(), k.t(), v.t()], dim=2).reshape(
                q.shape[1], -1),
        "this is (3d, d), c_attn's transpose: once transposed, each weight has its outputs "
        "as columns, so join the transposed weights along dim 1, "
        "torch.cat([q.t(), k.t(), v.t()], dim=1)":
            lambda q, k, v: torch.cat([q.t(), k.t(), v.t()], dim=0),
        "torch.stack adds a new dimension, (3, d, d); torch.cat joins the three along an "
        "existing one":
            lambda q, k, v: torch.stack([q, k, v]),
        "the order is query, key, value: the key's outputs come second":
            lambda q, k, v: torch.cat([k, q, v], dim=0).t(),
        "the order is query, key, value: the value's outputs come last":
            lambda q, k, v: torch.cat([v, k, q], dim=0).t(),
        "the order is query, key, value: the query's outputs come first":
            lambda q, k, v: torch.cat([k, v, q], dim=0).t(),
        "each weight is still in nn.Linear's (out, in) layout: transpose each one before "
        "joining them, or join along dim 0 and transpose the result":
            lambda q, k, v: torch.stack([q, k, v], dim=2).reshape(q.shape[0], -1),
        "torch.stack adds a new dimension: (d, 3, d) is not (d, 3d); join with torch.cat "
        "along dim 0 and transpose":
            lambda q, k, v: torch.stack([q, k, v], dim=1),
        "a sum mixes the three weights into one (d, d) matrix; c_attn holds them side by "
        "side, (d, 3d): torch.cat":
            lambda q, k, v: (q + k + v).t(),
    },
    match_every_case=True,
    thorough=True,
)


# --- my_gpt2_parameter_count(vocab_size, context_length, num_layers, d_model, d_ff) ------------

def _parameter_count(vocab_size: int, context_length: int, num_layers: int, d_model: int,
                     d_ff: int, *, position: bool = True, head: bool = False,
                     head_bias: bool = False, projections: int = 4,
                     attention_biases: int | None = None, feed_forward_biases: str = "fd",
                     matrices: int = 2, block_norms: int = 2, final_norm: bool = True,
                     norm_bias: bool = True, width: int | None = None,
                     layers: int | None = None) -> int:
    """The count, or with a keyword one of the ways to get it wrong (``feed_forward_biases``:
    the widths of the feed-forward's biases, ``"f"`` for d_ff and ``"d"`` for d_model)."""
    d, f = d_model, d_ff if width is None else width
    norm = d * (2 if norm_bias else 1)
    biases = projections if attention_biases is None else attention_biases
    attention = projections * d * d + biases * d
    feed_forward = matrices * d * f + sum({"f": f, "d": d}[w] for w in feed_forward_biases)
    block = block_norms * norm + attention + feed_forward
    return (vocab_size * d + (context_length * d if position else 0)
            + (vocab_size * d if head else 0) + (vocab_size if head_bias else 0)
            + (num_layers if layers is None else layers) * block + (norm if final_norm else 0))


def _count(**mistake):
    return lambda v, t, n, d, f: _parameter_count(v, t, n, d, f, **mistake)


# Four sizes in which each listed mistake gives its own numbers: at d_model 4 and d_ff 16, a
# feed-forward without biases (20 a block) looks like a missing projection (4 * 4 + 4), and a
# missing c_proj bias (4 a block, 2 blocks) like a missing final norm (2 * 4); the other sizes
# tell them apart, and a hint is given only for a mistake that matches all four.
check_parameter_count = Checker(
    reference=lambda vocab_size, context_length, num_layers, d_model, d_ff: _parameter_count(
        vocab_size, context_length, num_layers, d_model, d_ff),
    cases=[(11, 7, 2, 4, 16), (100, 32, 2, 64, 256), (1000, 64, 3, 16, 40),
           (50257, 1024, 12, 768, 3072)],
    mistakes={
        "the position table is a parameter too: context_length rows of d_model numbers":
            _count(position=False),
        "the head is tied to the token table: the same vocab_size x d_model numbers, counted "
        "once":
            _count(head=True),
        "GPT-2's head has no bias: it is the token table, used again":
            _count(head_bias=True),
        "every linear layer has a bias: d_model for each of q, k, v and the output "
        "projection, d_ff and d_model in the feed-forward":
            _count(attention_biases=0, feed_forward_biases=""),
        "4 * d_model numbers per block are missing: the biases of the attention's four "
        "projections (d_model each), or the block's two layer norms (2 * d_model each), "
        "one before the attention and one before the feed-forward":
            _count(attention_biases=0),
        "the output projection (c_proj) has a bias too, d_model numbers: the attention has "
        "four biases, three in c_attn and one in c_proj":
            _count(attention_biases=3),
        "the feed-forward's first layer (c_fc) has a bias too, d_ff numbers, as its second "
        "has d_model": _count(feed_forward_biases="d"),
        "the feed-forward's two linear layers have biases too: d_ff numbers in the first "
        "(c_fc) and d_model in the second (c_proj)":
            _count(feed_forward_biases=""),
        "a bias has one number per output: d_ff for the first feed-forward layer, but d_model "
        "for the second, which maps back to d_model":
            _count(feed_forward_biases="ff"),
        "the feed-forward has two matrices, d_model x d_ff into the hidden layer and "
        "d_ff x d_model back":
            _count(matrices=1),
        "a layer norm has a weight and a bias, d_model numbers each":
            _count(norm_bias=False),
        "each block has two layer norms, one before the attention and one before the "
        "feed-forward, each 2 * d_model":
            _count(block_norms=1),
        "after the last block comes the final layer norm (ln_f): 2 * d_model more":
            _count(final_norm=False),
        "the final layer norm (ln_f) comes once, after the last block; each block has two, "
        "not three":
            _count(block_norms=3, final_norm=False),
        "attention has four projections: query, key, value and the output projection "
        "(c_attn holds three, c_proj the fourth)":
            _count(projections=3),
        "use d_ff, the argument, for the feed-forward's width: it is not always 4 * d_model":
            lambda v, t, n, d, f: _parameter_count(v, t, n, d, f, width=4 * d),
        "there are num_layers blocks: multiply one block's count by num_layers":
            _count(layers=1),
    },
    whole_numbers=True,
    match_every_case=True,
    thorough=True,
)


# --- my_byte_to_char(b) ------------------------------------------------------------------------

_TABLE = bytes_to_unicode()


def _with_printable(printable):
    """The table's rule with another set of printable bytes."""
    printable = set(printable)
    moved = [b for b in range(256) if b not in printable]

    def wrong(b):
        return chr(b) if b in printable else chr(256 + moved.index(b))
    return wrong


_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]
_MOVED = [b for b in range(256) if b not in _PRINTABLE]

#: The bytes, in nine groups that cover all 256: each check runs every byte of its group.
_GROUPS = [tuple(range(33, 127)), tuple(range(0, 10)), tuple(range(10, 32)), (32,), (127,),
           tuple(range(128, 161)), tuple(range(161, 173)), (173,), tuple(range(174, 256))]


def _off_by(table: list) -> str | None:
    """The hint for answers that are right except for a run of moved bytes numbered a fixed
    amount off, e.g. bytes 128 to 160 one too low; else ``None``."""
    wrong = [b for b in range(256) if table[b] != _TABLE[b]]
    if not wrong or not all(isinstance(table[b], str) and len(table[b]) == 1 for b in wrong):
        return None
    shifts = {ord(table[b]) - ord(_TABLE[b]) for b in wrong}
    if len(shifts) != 1 or not set(wrong) <= set(_MOVED):
        return None
    low, high, shift = wrong[0], wrong[-1], shifts.pop()
    which = f"byte {low} is" if low == high else f"bytes {low} to {high} are"
    return (f"{which} numbered {abs(shift)} too {'high' if shift > 0 else 'low'}: the 68 "
            f"moved bytes are numbered in increasing order, 0 to 32, then 127 to 160, then "
            f"173, so byte {low} is number {_MOVED.index(low)}, chr(256 + "
            f"{_MOVED.index(low)})")


def _printable_ends(table: list) -> str | None:
    """The hint for answers whose set of bytes that stand for themselves differs from the
    printable ones by a few bytes: each named, with the ranges, ends included."""
    own = {b for b in range(256) if table[b] == chr(b)}
    wrong = sorted(own ^ set(_PRINTABLE))
    if not wrong or len(wrong) > 8:
        return None
    names = ", ".join(f"{b} ({chr(b)!r})" for b in wrong)
    said = "moved" if wrong[0] in _PRINTABLE else "kept as itself"
    return (f"byte{'s' if len(wrong) > 1 else ''} {names} {'are' if len(wrong) > 1 else 'is'} "
            f"{said}: the printable ranges are '!' to '~', '¡' to '¬' and '®' to 'ÿ', both "
            f"ends included, range(33, 127), range(161, 173) and range(174, 256); every other "
            f"byte is moved")


class _EveryByteChecker(Checker):
    """A :class:`Checker` whose cases are groups of bytes: each check runs the function on
    every byte of its group, so that all 256 bytes are checked, and a hint is given for a
    mistake that answers all 256 as the learner's function does."""

    def run(self, function: Callable) -> Verdict:
        if not callable(function):
            return super().run(function)
        group_of = [number for number, group in enumerate(self.cases, start=1)
                    for _ in group]
        inner = Checker(reference=self.reference,
                        cases=[(b,) for group in self.cases for b in group],
                        mistakes=self.mistakes, match_every_case=True)
        verdict = inner.run(function)
        if verdict:
            return Verdict(True, f"{PASS} all {len(self.cases)} checks passed")
        match = re.match(rf"{FAIL} case (\d+):", verdict.message)
        if match is None:                                   # not implemented yet
            return verdict
        message = (f"{FAIL} case {group_of[int(match.group(1)) - 1]}:"
                   f"{verdict.message[match.end():]}")
        if "Hint: " not in message:
            table = [Checker._outcome(function, (b,)) for b in range(256)]
            if all(kind == "value" for kind, _ in table):
                answers = [answer for _, answer in table]
                hint = _off_by(answers) or _printable_ends(answers)
                if hint is not None:
                    message += f". Hint: {hint}"
        return Verdict(False, message)


check_byte_to_char = _EveryByteChecker(
    reference=lambda b: _TABLE[b],
    cases=_GROUPS,
    mistakes={
        "a space (byte 32) is not printable: it is moved like the control bytes, and GPT-2 "
        "writes it 'Ġ'; the printable bytes start at '!' (33)":
            _with_printable([*range(32, 127), *range(161, 173), *range(174, 256)]),
        "byte 173, the soft hyphen, lies between '¡' and 'ÿ' but is invisible: it is moved "
        "too (the printable ranges are '¡' to '¬' and '®' to 'ÿ')":
            _with_printable([*range(33, 127), *range(161, 256)]),
        "byte 127 (DEL) is a control character, moved like the others: the first range "
        "ends at '~' (126)":
            _with_printable([*range(33, 128), *range(161, 173), *range(174, 256)]),
        "bytes 128 to 160 are control characters and a no-break space, moved too: the "
        "second range starts at '¡' (161)":
            _with_printable([*range(33, 127), *range(128, 173), *range(174, 256)]),
        "only the printable bytes stand for themselves: the other 68 get chr(256), "
        "chr(257), ... so that a space or a line break can be written in a file":
            lambda b: chr(b),
        "the moved bytes are numbered among themselves, in order: the first gets chr(256), "
        "the next chr(257), ... Byte 127 is the 34th, so chr(256 + 33), not chr(256 + 127)":
            lambda b: _TABLE[b] if b in _PRINTABLE else chr(256 + b),
        "the first moved byte, byte 0, gets chr(256): count from 0":
            lambda b: _TABLE[b] if b in _PRINTABLE else chr(ord(_TABLE[b]) + 1),
        "range(a, b) stops before b: '~' (126), '¬' (172) and 'ÿ' (255) are printable too, "
        "range(33, 127), range(161, 173), range(174, 256)":
            _with_printable([*range(33, 126), *range(161, 172), *range(174, 255)]),
        "return the character, a str: chr(256 + n), not the number 256 + n":
            lambda b: ord(_TABLE[b]),
    },
    thorough=True,
)
