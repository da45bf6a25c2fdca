"""Checkers for the exercises of chapter 14, *From GPT-2 to Llama*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_rms_norm` -- ``my_rms_norm(x, weight, eps)``: ``x`` divided by the root of the
  mean of its squares over the last dimension (``eps`` added inside the root), times ``weight``.
* :data:`check_apply_rope` -- ``my_apply_rope(x, offset, theta)``: queries or keys
  ``(B, h, T, d)`` at positions ``offset`` to ``offset + T - 1``, each pair of dimensions
  ``(i, i + d/2)`` turned by the angle ``position * theta ** (-2i / d)``.
* :data:`check_expand_kv_heads` -- ``my_expand_kv_heads(kv, num_heads)``: the keys (or values)
  of ``g`` KV heads ``(B, g, T, d)`` repeated so that each of the ``num_heads`` query heads has
  its group's: ``(B, num_heads, T, d)``, neighbouring query heads sharing one KV head.
* :data:`check_swiglu` -- ``my_swiglu(x, gate_weight, up_weight, down_weight)``: the SwiGLU
  feed-forward ``down(silu(gate(x)) * up(x))`` with weights in ``nn.Linear``'s layout
  ``(out_features, in_features)`` and no biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_apply_rope", "check_expand_kv_heads", "check_rms_norm", "check_swiglu"]


def _numbers(generator: torch.Generator, *shape: int) -> Tensor:
    """Small integers as floats: readable in a message, and no two entries alike by chance."""
    return torch.randint(-9, 10, shape, generator=generator).float()


# --- my_rms_norm(x, weight, eps) ---------------------------------------------------------------

def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _rms_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(14)
    # eps = 0.5 in case 2 makes where eps goes visible; every row has a mean far from zero, so
    # subtracting it changes the answer; the last case has a batch of sequences
    return [(torch.tensor([[1.0, 2.0, 3.0, 6.0]]), torch.ones(4), 1e-6),
            (torch.tensor([[2.0, -1.0, 4.0], [0.5, 3.0, 1.0]]), torch.tensor([1.0, 2.0, 0.5]),
             0.5),
            (_numbers(generator, 3, 5) + 2, _numbers(generator, 5), 1e-6),
            (_numbers(generator, 2, 3, 4) - 1, _numbers(generator, 4), 1e-5)]


def _rms_wrong(statistic):
    def wrong(x, weight, eps):
        return statistic(x, eps) * weight
    return wrong


check_rms_norm = Checker(
    reference=_rms_norm,
    cases=_rms_cases(),
    mistakes={
        "RMSNorm does not subtract the mean: divide x itself by the root of the mean of x**2 "
        "(centring is the step of layer norm that it drops)": _rms_wrong(
            lambda x, eps: (x - x.mean(-1, keepdim=True))
            / torch.sqrt((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + eps)),
        "RMSNorm does not subtract the mean, not even inside the statistic: x.var() and "
        "x.std() measure the spread around the mean, RMSNorm the mean of x**2 itself": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)),
        "x.var() and x.std() measure the spread around the mean (and divide by d - 1); RMSNorm "
        "uses the mean of x**2 itself": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.var(-1, keepdim=True) + eps)),
        "x.std() measures the spread around the mean (and divides by d - 1), and eps goes "
        "inside the root: RMSNorm divides by torch.sqrt(mean of x**2 + eps)": _rms_wrong(
            lambda x, eps: x / (x.std(-1, keepdim=True) + eps)),
        "take the mean over the last dimension, the features of each vector: "
        "x.pow(2).mean(dim=-1, keepdim=True)": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.pow(2).mean() + eps)),
        "the mean runs over the last dimension (dim=-1), the features of one vector; dim=0 runs "
        "down the rows, across different vectors": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.pow(2).mean(dim=0, keepdim=True) + eps)),
        "keepdim=True keeps the mean's last dimension (of size 1), so that it divides each row "
        "by its own root mean square": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.pow(2).mean(dim=-1) + eps)),
        "the mean of the squares, not their sum: dividing by the root of the sum makes vectors "
        "of length 1, whose entries shrink as d_model grows": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)),
        "take the square root of the mean square: the root mean square has the units of x":
            _rms_wrong(lambda x, eps: x / (x.pow(2).mean(-1, keepdim=True) + eps)),
        "eps goes inside the square root, added to the mean of the squares: "
        "torch.sqrt(mean + eps)": _rms_wrong(
            lambda x, eps: x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + eps)),
        "add eps to the mean of the squares, inside the square root: torch.sqrt(mean + eps) "
        "(case 2 uses eps = 0.5, so leaving it out, or using it only as a floor, shows)":
            _rms_wrong(lambda x, eps: x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))),
        "square the entries before the mean: the mean of x**2, not the square of the mean":
            _rms_wrong(lambda x, eps: x / torch.sqrt(x.mean(-1, keepdim=True).pow(2) + eps)),
        "multiply by weight, the learned gain of each feature, at the end":
            lambda x, weight, eps: _rms_norm(x, torch.ones_like(weight), eps),
        "RMSNorm has a gain and no bias: multiply by weight, do not add it":
            lambda x, weight, eps: _rms_norm(x, torch.ones_like(weight), eps) + weight,
        "multiply by weight; dividing by it undoes the learned gain":
            lambda x, weight, eps: _rms_norm(x, torch.ones_like(weight), eps) / weight,
        "normalise x itself, then multiply by weight: the mean of the squares is taken of x, "
        "not of x * weight":
            lambda x, weight, eps: _rms_norm(x * weight, torch.ones_like(weight), eps),
        "x.norm() (and F.normalize) divide by the root of the sum of the squares, sqrt(d) "
        "times the root mean square: use the mean of x**2, with eps inside the root":
            lambda x, weight, eps: x / x.norm(dim=-1, keepdim=True) * weight,
        "x.norm() is the root of the sum of the squares, sqrt(d) times the root mean square "
        "(and eps goes inside the root): torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)":
            lambda x, weight, eps: x / (x.norm(dim=-1, keepdim=True) + eps) * weight,
        "the mean runs over the last dimension (dim=-1), the features of one vector; dim=-2 "
        "runs over the positions": _rms_wrong(
            lambda x, eps: x / torch.sqrt(x.pow(2).mean(dim=-2, keepdim=True) + eps)),
    },
    match_every_case=True,
    thorough=True,
    gradients=('x', 'weight'),
)


# --- my_apply_rope(x, offset, theta) -----------------------------------------------------------

def _angles(length: int, d: int, offset: int, theta: float, *, exponent=None) -> Tensor:
    """(T, d/2): the angle of pair i at each position."""
    two_i = torch.arange(0, d, 2, dtype=torch.float64)
    frequencies = theta ** (-(two_i if exponent is None else exponent(d)) / d)
    positions = torch.arange(offset, offset + length, dtype=torch.float64)
    return torch.outer(positions, frequencies)


def _rotate_halves(x: Tensor, angles: Tensor) -> Tensor:
    """Turn (x_i, x_{i+d/2}) by angles[:, i]."""
    first, second = x.double().chunk(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    turned = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return turned.to(x.dtype)


def _apply_rope(x: Tensor, offset: int, theta: float) -> Tensor:
    return _rotate_halves(x, _angles(x.shape[-2], x.shape[-1], offset, theta))


def _interleaved(x, offset, theta):
    """The paper's pairs, neighbours (2i, 2i + 1)."""
    angles = _angles(x.shape[-2], x.shape[-1], offset, theta)
    even, odd = x.double()[..., 0::2], x.double()[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return turned.flatten(-2).to(x.dtype)


def _repeat_interleaved_angles(x, offset, theta):
    """Rotate-half code with the angles laid out 0, 0, 1, 1, ... instead of 0, 1, ..., 0, 1."""
    angles = _angles(x.shape[-2], x.shape[-1], offset, theta).repeat_interleave(2, dim=-1)
    first, second = x.double().chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.double() * angles.cos() + rotated * angles.sin()).to(x.dtype)


def _rotate_each_dimension(x, offset, theta):
    """Rotate-half code with one frequency per dimension, theta ** (-2j / d) for j < d."""
    length, d = x.shape[-2], x.shape[-1]
    positions = torch.arange(offset, offset + length, dtype=torch.float64)
    angles = torch.outer(positions, theta ** (-2 * torch.arange(d, dtype=torch.float64) / d))
    first, second = x.double().chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.double() * angles.cos() + rotated * angles.sin()).to(x.dtype)


def _positive_exponent(x, offset, theta):
    """theta ** (+2i / d), computed in float32 as a learner does: the angles reach thousands of
    radians, where float64 and float32 turn differently."""
    length, d = x.shape[-2], x.shape[-1]
    angles = torch.outer(torch.arange(offset, offset + length),
                         theta ** (torch.arange(0, d, 2) / d))
    angles = torch.cat([angles, angles], dim=-1)
    first, second = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()


def _cos_sin_swapped(x, offset, theta):
    angles = torch.cat([_angles(x.shape[-2], x.shape[-1], offset, theta)] * 2, dim=-1)
    first, second = x.double().chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.double() * angles.sin() + rotated * angles.cos()).to(x.dtype)


def _floor_exponent(d):
    """-torch.arange(0, d, 2) // d: 0 for the first pair, -1 for every other."""
    return torch.tensor([0.0] + [float(d)] * (d // 2 - 1), dtype=torch.float64)


def _rope_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(140)
    # d = 4 or 8, never 2 (where both pairings are one pair); theta = 100 in case 3 so that
    # every pair turns by a visible angle; case 1 starts at position 0, the others later
    return [(_numbers(generator, 1, 1, 3, 4), 0, 10000.0),
            (_numbers(generator, 1, 1, 2, 4), 5, 10000.0),
            (_numbers(generator, 1, 2, 3, 8), 3, 100.0),
            (_numbers(generator, 2, 2, 4, 8), 10, 10000.0)]


check_apply_rope = Checker(
    reference=_apply_rope,
    cases=_rope_cases(),
    mistakes={
        "pair dimension i with i + d/2 (the two halves), as transformers and this chapter do; "
        "the paper's neighbours 2i and 2i + 1 are the same rotation in other coordinates, "
        "which weights trained in the rotate-half layout do not use": _interleaved,
        "the angles of the first half repeat for the second half, torch.cat([angles, angles], "
        "dim=-1): dimensions i and i + d/2 turn together; repeat_interleave lays them out "
        "0, 0, 1, 1, ..., the layout of the interleaved pairs": _repeat_interleaved_angles,
        "the rows of x sit at positions offset, offset + 1, ...: torch.arange(offset, "
        "offset + T), not torch.arange(T)":
            lambda x, offset, theta: _apply_rope(x, 0, theta),
        "off by one: the first row of x sits at position offset, not offset + 1":
            lambda x, offset, theta: _apply_rope(x, offset + 1, theta),
        "off by one: the first row of x sits at position offset, not offset - 1":
            lambda x, offset, theta: _apply_rope(x, offset - 1, theta),
        "use the theta argument for the base, not the paper's 10000 written in (case 3 turns "
        "with theta = 100)": lambda x, offset, theta: _apply_rope(x, offset, 10000.0),
        "turn the other way: rotate_half(x) is (-x2, x1), so x * cos + rotate_half(x) * sin "
        "turns each pair by +angle (yours turns by -angle)":
            lambda x, offset, theta: _rotate_halves(
                x, -_angles(x.shape[-2], x.shape[-1], offset, theta)),
        "the frequencies are theta ** (-2i / d) for i = 0, 1, ..., d/2 - 1: use "
        "torch.arange(0, d, 2) / d, which runs from 0 to almost 1, not torch.arange(d // 2) / d":
            lambda x, offset, theta: _rotate_halves(x, _angles(
                x.shape[-2], x.shape[-1], offset, theta,
                exponent=lambda d: torch.arange(d // 2, dtype=torch.float64))),
        "the exponent is negative, theta ** (-2i / d): the first pair turns fastest (1 radian "
        "per position) and the later ones ever slower": _positive_exponent,
        "each pair turns by an angle, and a rotation mixes the two dimensions: "
        "x * cos + rotate_half(x) * sin, not x * cos + x * sin":
            lambda x, offset, theta: (
                x.double() * torch.cat([_angles(x.shape[-2], x.shape[-1], offset, theta)] * 2,
                                       dim=-1).cos()
                + x.double() * torch.cat([_angles(x.shape[-2], x.shape[-1], offset, theta)] * 2,
                                         dim=-1).sin()).to(x.dtype),
        "cos goes with x and sin with rotate_half(x): x * cos + rotate_half(x) * sin (at "
        "angle 0 the vector must stay as it is)": _cos_sin_swapped,
        "// is floor division: -torch.arange(0, d, 2) // d is -1 for every pair but the first "
        "(it rounds down), so they all turn at the same slow rate; divide with /":
            lambda x, offset, theta: _rotate_halves(x, _angles(
                x.shape[-2], x.shape[-1], offset, theta, exponent=_floor_exponent)),
        "the positions are along dim -2 of (B, h, T, d): T is x.shape[-2]; x.shape[1] is the "
        "number of heads": lambda x, offset, theta: _rotate_halves(
            x, _angles(x.shape[1], x.shape[-1], offset, theta)),
        "// is integer division: torch.arange(0, d, 2) // d is 0 for every pair, so all of "
        "them turn at 1 radian per position; divide with /":
            lambda x, offset, theta: _rotate_halves(x, _angles(
                x.shape[-2], x.shape[-1], offset, theta,
                exponent=lambda d: torch.zeros(d // 2, dtype=torch.float64))),
        "dimensions i and i + d/2 form a pair and turn by the same angle: build d/2 "
        "frequencies, theta ** (-torch.arange(0, d, 2) / d), and repeat them for the second "
        "half, not d frequencies theta ** (-2j / d) for every dimension j":
            lambda x, offset, theta: _rotate_each_dimension(x, offset, theta),
    },
    atol=1e-5,
    match_every_case=True,
    thorough=True,
    gradients=('x',),
)


# --- my_expand_kv_heads(kv, num_heads) ---------------------------------------------------------

def _expand_kv_heads(kv: Tensor, num_heads: int) -> Tensor:
    return kv.repeat_interleave(num_heads // kv.shape[1], dim=1)


def _expand_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(1400)
    return [(_numbers(generator, 1, 2, 3, 2), 4),
            (_numbers(generator, 2, 3, 2, 2), 6),
            (_numbers(generator, 1, 1, 2, 3), 3),       # multi-query: one KV head for all
            (_numbers(generator, 1, 4, 2, 2), 4)]       # multi-head: nothing to repeat


check_expand_kv_heads = Checker(
    reference=_expand_kv_heads,
    cases=_expand_cases(),
    mistakes={
        "neighbouring query heads share a KV head (heads 0 and 1 use KV head 0 when groups are "
        "2 wide): repeat_interleave(group, dim=1) gives 0, 0, 1, 1; repeat tiles 0, 1, 0, 1":
            lambda kv, h: kv.repeat(1, h // kv.shape[1], 1, 1),
        "repeat the heads, dim 1 of (B, g, T, d), not the positions (dim 2)":
            lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=2),
        "repeat the heads, dim 1 of (B, g, T, d), not the features (dim 3, or -1)":
            lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=-1),
        "repeat the heads, dim 1 of (B, g, T, d); dim 0 is the batch":
            lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=0),
        "each KV head serves a group of num_heads // g query heads: repeat it that many times, "
        "not num_heads times": lambda kv, h: kv.repeat_interleave(h, dim=1),
        "expand to num_heads heads: each of the g KV heads is repeated for the "
        "num_heads // g query heads of its group": lambda kv, h: kv,
        "g, the number of KV heads, is kv.shape[1]; kv.shape[0] is the batch: each KV head "
        "is repeated num_heads // kv.shape[1] times":
            lambda kv, h: kv.repeat_interleave(h // kv.shape[0], dim=1),
        "the group's size comes from the arguments, num_heads // kv.shape[1]: a group of 2 "
        "written in fits one model only": lambda kv, h: kv.repeat_interleave(2, dim=1),
        "query head j uses KV head j // (num_heads // g), its group's, not j // g":
            lambda kv, h: kv[:, torch.arange(h) // kv.shape[1]],
        "repeat each KV head num_heads // g times, the size of its group, not g times":
            lambda kv, h: kv.repeat_interleave(kv.shape[1], dim=1),
        "num_heads / g is a float, and repeats must be whole: divide with //":
            lambda kv, h: kv.repeat_interleave(h / kv.shape[1], dim=1),
        "expand only stretches a dimension of size 1, so it works for one KV head but not "
        "for g: repeat_interleave(num_heads // g, dim=1), or add a dimension of size 1 "
        "after the heads, expand it, and reshape":
            lambda kv, h: kv.expand(kv.shape[0], h, *kv.shape[2:]),
    },
    match_every_case=True,
    thorough=True,
    gradients=('kv',),
)


# --- my_swiglu(x, gate_weight, up_weight, down_weight) -----------------------------------------

def _swiglu(x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor) -> Tensor:
    return (F.silu(x @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


def _swiglu_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(14000)

    def weight(*shape):
        return _numbers(generator, *shape) / 8

    # d = 3, d_ff = 5: a weight used the wrong way round is a shape error
    return [(_numbers(generator, 1, 3) / 4, weight(5, 3), weight(5, 3), weight(3, 5)),
            (_numbers(generator, 2, 4, 3) / 4, weight(5, 3), weight(5, 3), weight(3, 5)),
            (_numbers(generator, 3, 4) / 4, weight(6, 4), weight(6, 4), weight(4, 6))]


check_swiglu = Checker(
    reference=_swiglu,
    cases=_swiglu_cases(),
    mistakes={
        "the gate goes through silu, the up projection does not: "
        "silu(x @ gate_weight.T) * (x @ up_weight.T)":
            lambda x, g, u, d: _swiglu(x, u, g, d),
        "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu), not the sigmoid alone (that is "
        "the original GLU)": lambda x, g, u, d: (torch.sigmoid(x @ g.T) * (x @ u.T)) @ d.T,
        "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu); GELU makes GEGLU, another "
        "variant of the same paper": lambda x, g, u, d: (F.gelu(x @ g.T) * (x @ u.T)) @ d.T,
        "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu); ReLU makes ReGLU":
            lambda x, g, u, d: (F.relu(x @ g.T) * (x @ u.T)) @ d.T,
        "multiply the gate by the up projection, element by element: silu(gate) * up, "
        "not silu(gate) + up": lambda x, g, u, d: (F.silu(x @ g.T) + (x @ u.T)) @ d.T,
        "keep the up projection: the gate multiplies x @ up_weight.T, it does not replace it":
            lambda x, g, u, d: F.silu(x @ g.T) @ d.T,
        "keep the gate: silu(x @ gate_weight.T) multiplies the up projection":
            lambda x, g, u, d: (x @ u.T) @ d.T,
        "end with the down projection, back to d_model: (...) @ down_weight.T":
            lambda x, g, u, d: F.silu(x @ g.T) * (x @ u.T),
        "the weights are in nn.Linear's layout, (out_features, in_features): multiply by "
        "their transpose, x @ gate_weight.T":
            lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d,
        "the silu goes on the gate alone, before the product, not on the product":
            lambda x, g, u, d: F.silu((x @ g.T) * (x @ u.T)) @ d.T,
        "* and @ have the same precedence and go from left to right: silu(...) * x @ "
        "up_weight.T multiplies by x first; put brackets around (x @ up_weight.T)":
            lambda x, g, u, d: (F.silu(x @ g.T) * x @ u.T) @ d.T,
        "silu(z) = z * sigmoid(z) = z / (1 + exp(-z)): the exponent is -z":
            lambda x, g, u, d: ((x @ g.T) / (1 + torch.exp(x @ g.T)) * (x @ u.T)) @ d.T,
        "silu goes on the gate projection's output, silu(x @ gate_weight.T), not on x before "
        "it": lambda x, g, u, d: ((F.silu(x) @ g.T) * (x @ u.T)) @ d.T,
        "down_weight is in nn.Linear's layout too, (d, d_ff): end with @ down_weight.T":
            lambda x, g, u, d: (F.silu(x @ g.T) * (x @ u.T)) @ d,
    },
    match_every_case=True,
    thorough=True,
    gradients=('x', 'gate_weight', 'up_weight', 'down_weight'),
)
