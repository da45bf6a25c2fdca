"""The checkers of chapter 14: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it (not copied from the
checker's own list of mistakes), and each hint of the four checkers is asserted at least once.
"""

import pytest
import torch
import torch.nn.functional as F

import minitransformer as mt
from minitransformer.exercises import chapter14
from minitransformer.exercises.chapter14 import (
    check_apply_rope,
    check_expand_kv_heads,
    check_rms_norm,
    check_swiglu,
)

# --- correct solutions, written the way the book's solutions are, and other correct forms -----


def my_rms_norm(x, weight, eps):
    mean_square = x.pow(2).mean(dim=-1, keepdim=True)
    return x / torch.sqrt(mean_square + eps) * weight


def my_rms_norm_with_rsqrt(x, weight, eps):
    return weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def my_rms_norm_from_torch(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def my_apply_rope(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    frequencies = theta ** (-torch.arange(0, d, 2) / d)
    positions = torch.arange(offset, offset + length)
    angles = torch.outer(positions, frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * angles.cos() + rotated_half * angles.sin()


def my_apply_rope_pair_by_pair(x, offset, theta):
    d = x.shape[-1]
    half = d // 2
    out = x.clone()
    for t in range(x.shape[-2]):
        for i in range(half):
            angle = torch.tensor((offset + t) * theta ** (-2 * i / d))
            a, b = x[..., t, i], x[..., t, i + half]
            out[..., t, i] = a * angle.cos() - b * angle.sin()
            out[..., t, i + half] = a * angle.sin() + b * angle.cos()
    return out


def my_apply_rope_from_the_package(x, offset, theta):
    cos, sin = mt.rotary_angles(x.shape[-2], x.shape[-1], offset=offset, theta=theta)
    return mt.apply_rotary(x, cos, sin)


def my_expand_kv_heads(kv, num_heads):
    group = num_heads // kv.shape[1]
    return kv.repeat_interleave(group, dim=1)


def my_expand_kv_heads_as_transformers(kv, num_heads):
    batch, groups, length, d = kv.shape
    n_rep = num_heads // groups
    return kv[:, :, None].expand(batch, groups, n_rep, length, d).reshape(
        batch, num_heads, length, d)


def my_swiglu(x, gate_weight, up_weight, down_weight):
    gate = F.silu(x @ gate_weight.T)
    up = x @ up_weight.T
    return (gate * up) @ down_weight.T


def my_swiglu_with_linear(x, gate_weight, up_weight, down_weight):
    gate = F.linear(x, gate_weight)
    return F.linear(gate * torch.sigmoid(gate) * F.linear(x, up_weight), down_weight)


def my_swiglu_from_the_package(x, gate_weight, up_weight, down_weight):
    block = mt.SwiGLU(gate_weight.shape[1], gate_weight.shape[0])
    weights = {"gate_proj.weight": gate_weight, "up_proj.weight": up_weight,
               "down_proj.weight": down_weight}       # the arguments, in the graph
    return torch.func.functional_call(block, weights, (x,))


def my_swiglu_from_copied_weights(x, gate_weight, up_weight, down_weight):
    """Right values, but the weights copied into the block under no_grad: nothing reaches
    the arguments' gradients (the checker refuses it, see the test below)."""
    block = mt.SwiGLU(gate_weight.shape[1], gate_weight.shape[0])
    with torch.no_grad():
        block.gate_proj.weight.copy_(gate_weight)
        block.up_proj.weight.copy_(up_weight)
        block.down_proj.weight.copy_(down_weight)
        return block(x)


CORRECT = {
    "rms_norm": (check_rms_norm, my_rms_norm),
    "rms_norm_rsqrt": (check_rms_norm, my_rms_norm_with_rsqrt),
    "rms_norm_torch": (check_rms_norm, my_rms_norm_from_torch),
    "rope": (check_apply_rope, my_apply_rope),
    "rope_pair_by_pair": (check_apply_rope, my_apply_rope_pair_by_pair),
    "rope_package": (check_apply_rope, my_apply_rope_from_the_package),
    "expand": (check_expand_kv_heads, my_expand_kv_heads),
    "expand_transformers": (check_expand_kv_heads, my_expand_kv_heads_as_transformers),
    "expand_package": (check_expand_kv_heads, mt.expand_kv_heads),
    "swiglu": (check_swiglu, my_swiglu),
    "swiglu_linear": (check_swiglu, my_swiglu_with_linear),
    "swiglu_package": (check_swiglu, my_swiglu_from_the_package),
}


def test_module_exports_every_checker():
    assert sorted(chapter14.__all__) == ["check_apply_rope", "check_expand_kv_heads",
                                         "check_rms_norm", "check_swiglu"]


@pytest.mark.parametrize("name", CORRECT)
def test_accepts_correct_answers(name, capsys):
    checker, solution = CORRECT[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_the_rms_reference_is_torchs_rms_norm():
    for x, weight, eps in check_rms_norm.cases:
        norm = torch.nn.RMSNorm(x.shape[-1], eps=eps)
        with torch.no_grad():
            norm.weight.copy_(weight)
            torch.testing.assert_close(check_rms_norm.reference(x, weight, eps), norm(x))


def test_the_rope_reference_turns_as_transformers_rotate_half():
    for x, offset, theta in check_apply_rope.cases:
        cos, sin = mt.rotary_angles(x.shape[-2], x.shape[-1], offset=offset, theta=theta,
                                    dtype=torch.float64)
        expected = x.double() * cos + mt.rotate_half(x.double()) * sin
        torch.testing.assert_close(check_apply_rope.reference(x, offset, theta).double(),
                                   expected, atol=1e-5, rtol=1e-5)


def test_rope_cases_tell_the_pairings_and_the_offsets_apart():
    """No case has d = 2 (one pair, where both layouts agree), and all but the first start
    after position 0, so an offset mistake shows."""
    assert all(x.shape[-1] >= 4 for x, _, _ in check_apply_rope.cases)
    assert [offset for _, offset, _ in check_apply_rope.cases][1:] == [5, 3, 10]


def _out(capsys):
    return capsys.readouterr().out


def _hint(out):
    assert "Hint: " in out, out
    return out.rstrip("\n").split("Hint: ", 1)[1]


# --- RMSNorm: learner-style wrong answers ------------------------------------------------------

def test_rms_norm_that_subtracts_the_mean(capsys):
    def my_rms_norm(x, weight, eps):
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    assert not check_rms_norm(my_rms_norm)
    out = _out(capsys)
    assert out.startswith("✗ case 1: for input ([[1.0, 2.0, 3.0, 6.0]]")
    assert _hint(out).startswith("RMSNorm does not subtract the mean: divide x itself")


def test_rms_norm_written_as_layer_norm(capsys):
    assert not check_rms_norm(lambda x, weight, eps: F.layer_norm(x, (x.shape[-1],),
                                                                  eps=eps) * weight)
    assert _hint(_out(capsys)).startswith("RMSNorm does not subtract the mean: divide x itself")


def test_rms_norm_with_the_population_variance(capsys):
    def my_rms_norm(x, weight, eps):
        return weight * x / torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + eps)

    assert not check_rms_norm(my_rms_norm)
    assert "not even inside the statistic" in _hint(_out(capsys))


def test_rms_norm_with_the_standard_deviation(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / (x.std(-1, keepdim=True) + eps) * weight)
    assert _hint(_out(capsys)).startswith("x.std() measures the spread around the mean "
                                          "(and divides by d - 1)")


def test_rms_norm_over_the_whole_tensor(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / torch.sqrt(torch.mean(x ** 2) + eps) * weight)
    assert _hint(_out(capsys)).startswith("take the mean over the last dimension")


def test_rms_norm_over_the_rows(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps) * weight)
    assert _hint(_out(capsys)).startswith("the mean runs over the last dimension (dim=-1)")


def test_rms_norm_without_keepdim(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              weight * x / torch.sqrt((x ** 2).mean(dim=-1) + eps))
    out = _out(capsys)
    assert out.startswith("✗ case 2:") and "your function raised RuntimeError" in out
    assert _hint(out).startswith("keepdim=True keeps the mean's last dimension")


def test_rms_norm_that_normalizes_to_unit_length(capsys):
    assert not check_rms_norm(lambda x, weight, eps: F.normalize(x, dim=-1, eps=eps) * weight)
    assert _hint(_out(capsys)).startswith("x.norm() (and F.normalize) divide by the root")


def test_rms_norm_without_the_square_root(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / ((x * x).mean(-1, keepdim=True) + eps) * weight)
    assert _hint(_out(capsys)).startswith("take the square root of the mean square")


def test_rms_norm_with_eps_outside_the_root(capsys):
    def my_rms_norm(x, weight, eps):
        rms = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True))
        return weight * x / (rms + eps)

    assert not check_rms_norm(my_rms_norm)
    out = _out(capsys)
    assert out.startswith("✗ case 2:")            # eps = 0.5 shows where it goes
    assert _hint(out).startswith("eps goes inside the square root")


@pytest.mark.parametrize("norm", ["no eps", "eps as a floor"])
def test_rms_norm_without_eps_in_the_mean_square(norm, capsys):
    def my_rms_norm(x, weight, eps):
        rms = x.pow(2).mean(-1, keepdim=True).sqrt()
        return x / (rms if norm == "no eps" else rms.clamp(min=eps)) * weight

    assert not check_rms_norm(my_rms_norm)
    out = _out(capsys)
    assert out.startswith("✗ case 2:")
    assert _hint(out).startswith("add eps to the mean of the squares, inside the square root")


def test_rms_norm_with_the_square_of_the_mean(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / torch.sqrt(x.mean(-1, keepdim=True) ** 2 + eps) * weight)
    assert _hint(_out(capsys)).startswith("square the entries before the mean")


def test_rms_norm_that_forgets_the_weight(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    out = _out(capsys)
    assert out.startswith("✗ case 2:")            # case 1's weight is all ones
    assert _hint(out).startswith("multiply by weight, the learned gain")


def test_rms_norm_that_adds_the_weight_as_a_bias(capsys):
    assert not check_rms_norm(lambda x, weight, eps:
                              x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) + weight)
    assert _hint(_out(capsys)).startswith("RMSNorm has a gain and no bias")


# --- RoPE: learner-style wrong answers ---------------------------------------------------------

def test_rope_with_the_papers_pairs_as_complex_numbers(capsys):
    def my_apply_rope(x, offset, theta):      # Meta's code: neighbours as complex numbers
        length, d = x.shape[-2:]
        frequencies = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
        angles = torch.outer(torch.arange(offset, offset + length).float(), frequencies)
        turns = torch.polar(torch.ones_like(angles), angles)
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * turns).flatten(-2)

    assert not check_apply_rope(my_apply_rope)
    out = _out(capsys)
    assert out.startswith("✗ case 1:")
    assert _hint(out).startswith("pair dimension i with i + d/2 (the two halves)")


def test_rope_with_angles_repeated_in_place(capsys):
    def my_apply_rope(x, offset, theta):
        length, d = x.shape[-2:]
        frequencies = theta ** (-torch.arange(0, d, 2) / d)
        angles = torch.outer(torch.arange(offset, offset + length), frequencies)
        angles = angles.repeat_interleave(2, dim=-1)
        first, second = x.chunk(2, dim=-1)
        return x * angles.cos() + torch.cat([-second, first], -1) * angles.sin()

    assert not check_apply_rope(my_apply_rope)
    assert _hint(_out(capsys)).startswith("the angles of the first half repeat for the second")


def _rope_at(positions_of, *, sign=1.0, exponent=None, mix=True):
    """A learner's rotate-half RoPE with one thing changed."""
    def my_apply_rope(x, offset, theta):
        length, d = x.shape[-2:]
        power = torch.arange(0, d, 2) / d if exponent is None else exponent(d)
        angles = torch.outer(positions_of(offset, length), theta ** (-power))
        angles = torch.cat([angles, angles], dim=-1)
        first, second = x.chunk(2, dim=-1)
        other = torch.cat([-second, first], dim=-1) if mix else x
        return x * angles.cos() + other * angles.sin() * sign
    return my_apply_rope


def test_rope_that_forgets_the_offset(capsys):
    assert not check_apply_rope(_rope_at(lambda offset, length: torch.arange(length)))
    out = _out(capsys)
    assert out.startswith("✗ case 2:")
    assert _hint(out).startswith("the rows of x sit at positions offset, offset + 1")


def test_rope_one_position_late(capsys):
    assert not check_apply_rope(_rope_at(
        lambda offset, length: torch.arange(offset + 1, offset + length + 1)))
    assert _hint(_out(capsys)).startswith("off by one: the first row of x sits at position "
                                          "offset, not offset + 1")


def test_rope_one_position_early(capsys):
    assert not check_apply_rope(_rope_at(
        lambda offset, length: torch.arange(offset - 1, offset + length - 1)))
    assert _hint(_out(capsys)).startswith("off by one: the first row of x sits at position "
                                          "offset, not offset - 1")


def test_rope_with_the_papers_base_written_in(capsys):
    def my_apply_rope(x, offset, theta):
        cos, sin = mt.rotary_angles(x.shape[-2], x.shape[-1], offset=offset)
        return mt.apply_rotary(x, cos, sin)

    assert not check_apply_rope(my_apply_rope)
    out = _out(capsys)
    assert out.startswith("✗ case 3:")
    assert _hint(out).startswith("use the theta argument for the base")


def test_rope_that_turns_the_wrong_way(capsys):
    def my_apply_rope(x, offset, theta):
        length, d = x.shape[-2:]
        angles = torch.outer(torch.arange(offset, offset + length),
                             theta ** (-torch.arange(0, d, 2) / d))
        angles = torch.cat([angles, angles], dim=-1)
        first, second = x.chunk(2, dim=-1)
        return x * angles.cos() + torch.cat([second, -first], dim=-1) * angles.sin()

    assert not check_apply_rope(my_apply_rope)
    assert _hint(_out(capsys)).startswith("turn the other way")


def test_rope_with_the_exponent_i_over_d(capsys):
    assert not check_apply_rope(_rope_at(lambda offset, length: torch.arange(offset, offset
                                                                             + length),
                                         exponent=lambda d: torch.arange(d // 2) / d))
    assert _hint(_out(capsys)).startswith("the frequencies are theta ** (-2i / d)")


def test_rope_with_a_positive_exponent(capsys):
    assert not check_apply_rope(_rope_at(lambda offset, length: torch.arange(offset, offset
                                                                             + length),
                                         exponent=lambda d: -torch.arange(0, d, 2) / d))
    assert _hint(_out(capsys)).startswith("the exponent is negative")


def test_rope_that_scales_instead_of_turning(capsys):
    assert not check_apply_rope(_rope_at(lambda offset, length: torch.arange(offset, offset
                                                                             + length),
                                         mix=False))
    assert _hint(_out(capsys)).startswith("each pair turns by an angle, and a rotation mixes")


# --- expanding KV heads: learner-style wrong answers -------------------------------------------

def test_expand_with_repeat(capsys):
    assert not check_expand_kv_heads(lambda kv, num_heads:
                                     kv.repeat(1, num_heads // kv.shape[1], 1, 1))
    out = _out(capsys)
    assert out.startswith("✗ case 1:")
    assert _hint(out).startswith("neighbouring query heads share a KV head")


def test_expand_by_stacking_copies_in_front(capsys):
    def my_expand_kv_heads(kv, num_heads):
        batch, groups, length, d = kv.shape
        n = num_heads // groups
        return kv[:, None].expand(batch, n, groups, length, d).reshape(batch, num_heads,
                                                                       length, d)

    assert not check_expand_kv_heads(my_expand_kv_heads)
    assert "repeat tiles 0, 1, 0, 1" in _hint(_out(capsys))


def test_expand_along_the_positions(capsys):
    assert not check_expand_kv_heads(lambda kv, h: torch.repeat_interleave(
        kv, h // kv.size(1), dim=-2))
    assert _hint(_out(capsys)).startswith("repeat the heads, dim 1 of (B, g, T, d), not the "
                                          "positions")


def test_expand_along_the_features(capsys):
    assert not check_expand_kv_heads(lambda kv, h: kv.repeat_interleave(h // kv.shape[1],
                                                                        dim=3))
    assert _hint(_out(capsys)).startswith("repeat the heads, dim 1 of (B, g, T, d), not the "
                                          "features")


def test_expand_without_a_dim(capsys):
    assert not check_expand_kv_heads(lambda kv, h: kv.repeat_interleave(h // kv.shape[1]))
    out = _out(capsys)
    # without dim, repeat_interleave flattens: a shape no hint but this one explains
    assert out.startswith("✗ case 1:")
    assert "expected shape (1, 4, 3, 2)" in out


def test_expand_along_dim_zero(capsys):
    assert not check_expand_kv_heads(lambda kv, h: kv.repeat_interleave(h // kv.shape[1], 0))
    assert _hint(_out(capsys)).startswith("repeat the heads, dim 1 of (B, g, T, d); dim 0 is "
                                          "the batch")


def test_expand_by_num_heads(capsys):
    assert not check_expand_kv_heads(lambda kv, num_heads:
                                     kv.repeat_interleave(num_heads, dim=1))
    assert _hint(_out(capsys)).startswith("each KV head serves a group of num_heads // g")


def test_expand_that_returns_the_kv_heads(capsys):
    def my_expand_kv_heads(kv, num_heads):
        return kv.clone()

    assert not check_expand_kv_heads(my_expand_kv_heads)
    assert _hint(_out(capsys)).startswith("expand to num_heads heads")


# --- SwiGLU: learner-style wrong answers -------------------------------------------------------

def _swiglu_with(gate_activation, combine=lambda a, b: a * b):
    def my_swiglu(x, gate_weight, up_weight, down_weight):
        hidden = combine(gate_activation(x @ gate_weight.T), x @ up_weight.T)
        return hidden @ down_weight.T
    return my_swiglu


def test_swiglu_with_silu_on_the_up_projection(capsys):
    def my_swiglu(x, gate_weight, up_weight, down_weight):
        return (F.silu(x @ up_weight.T) * (x @ gate_weight.T)) @ down_weight.T

    assert not check_swiglu(my_swiglu)
    assert _hint(_out(capsys)).startswith("the gate goes through silu, the up projection does "
                                          "not")


@pytest.mark.parametrize("activation, start", [
    (torch.sigmoid, "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu), not the sigmoid"),
    (F.gelu, "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu); GELU makes GEGLU"),
    (torch.relu, "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu); ReLU makes ReGLU"),
])
def test_swiglu_with_another_gate(activation, start, capsys):
    assert not check_swiglu(_swiglu_with(activation))
    assert _hint(_out(capsys)).startswith(start)


def test_swiglu_that_adds_the_gate(capsys):
    assert not check_swiglu(_swiglu_with(F.silu, combine=torch.add))
    assert _hint(_out(capsys)).startswith("multiply the gate by the up projection")


def test_swiglu_without_the_up_projection(capsys):
    assert not check_swiglu(lambda x, g, u, d: F.linear(F.silu(F.linear(x, g)), d))
    assert _hint(_out(capsys)).startswith("keep the up projection")


def test_swiglu_without_the_gate(capsys):
    assert not check_swiglu(lambda x, g, u, d: F.linear(F.linear(x, u), d))
    assert _hint(_out(capsys)).startswith("keep the gate")


def test_swiglu_without_the_down_projection(capsys):
    assert not check_swiglu(lambda x, g, u, d: F.silu(F.linear(x, g)) * F.linear(x, u))
    out = _out(capsys)
    assert "expected shape (1, 3) but got shape (1, 5)" in out
    assert _hint(out).startswith("end with the down projection")


def test_swiglu_with_untransposed_weights(capsys):
    def my_swiglu(x, gate_weight, up_weight, down_weight):
        return (F.silu(x @ gate_weight) * (x @ up_weight)) @ down_weight

    assert not check_swiglu(my_swiglu)
    out = _out(capsys)
    assert "your function raised RuntimeError" in out
    assert _hint(out).startswith("the weights are in nn.Linear's layout")


def test_swiglu_with_silu_on_the_product(capsys):
    assert not check_swiglu(lambda x, g, u, d: F.silu((x @ g.T) * (x @ u.T)) @ d.T)
    assert _hint(_out(capsys)).startswith("the silu goes on the gate alone")


# --- a catalogue of typical wrong answers, each with the hint it must get --------------------
# Written as a learner writes them. ``None``: a mistake no hint names; it must still fail, and
# get no hint at all rather than another mistake's. The share named is measured below.

def _rms(statistic, *, eps_inside=True, weight_at_end=True):
    def my_rms_norm(x, weight, eps):
        if not weight_at_end:
            x = x * weight
        s = statistic(x)
        y = x / torch.sqrt(s + eps) if eps_inside else x / (torch.sqrt(s) + eps)
        return y * weight if weight_at_end else y
    return my_rms_norm


def _rope(*, positions=lambda o, t: torch.arange(o, o + t), power=None, pairs="halves",
          frequencies_for=None):
    def my_apply_rope(x, offset, theta):
        length, d = x.shape[-2:]
        p = torch.arange(0, d, 2) / d if power is None else power(d)
        angles = torch.outer(positions(offset, length), theta ** (-p))
        if frequencies_for == "every dimension":
            angles = torch.outer(positions(offset, length),
                                 theta ** (-2 * torch.arange(d) / d))
        elif pairs == "repeat_interleave":
            angles = angles.repeat_interleave(2, dim=-1)
        else:
            angles = torch.cat([angles, angles], dim=-1)
        first, second = x.chunk(2, dim=-1)
        return x * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()
    return my_apply_rope


def _rope_by_neighbours(x, offset, theta):
    length, d = x.shape[-2:]
    angles = torch.outer(torch.arange(offset, offset + length),
                         theta ** (-torch.arange(0, d, 2) / d))
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angles.cos() - odd * angles.sin()
    out[..., 1::2] = even * angles.sin() + odd * angles.cos()
    return out


def _expand_by_hand(kv, num_heads):
    b, g, t, d = kv.shape
    group = num_heads // g
    return kv[:, None].expand(b, group, g, t, d).reshape(b, num_heads, t, d)


def _swiglu(gate=F.silu, *, transpose=True, combine=lambda a, b: a * b, down=True):
    def my_swiglu(x, gate_weight, up_weight, down_weight):
        g, u, dw = (gate_weight.T, up_weight.T, down_weight.T) if transpose else (
            gate_weight, up_weight, down_weight)
        hidden = combine(gate(x @ g), x @ u)
        return hidden @ dw if down else hidden
    return my_swiglu


R, P, E, S = check_rms_norm, check_apply_rope, check_expand_kv_heads, check_swiglu
ms = "x.pow(2).mean(-1, keepdim=True)"
CATALOGUE = [
    # my_rms_norm
    ("rms centred", R, lambda x, w, eps: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + eps) * w,
     "RMSNorm does not subtract the mean: divide"),
    ("rms layer_norm", R, lambda x, w, eps: F.layer_norm(x, x.shape[-1:], w, eps=eps),
     "RMSNorm does not subtract the mean: divide"),
    ("rms var", R, _rms(lambda x: x.var(-1, unbiased=False, keepdim=True)),
     "not even inside the statistic"),
    ("rms unbiased var", R, _rms(lambda x: x.var(-1, keepdim=True)),
     "(and divide by d - 1); RMSNorm uses the mean of x**2 itself"),
    ("rms std + eps", R, lambda x, w, eps: x / (x.std(-1, keepdim=True) + eps) * w,
     "x.std() measures"),
    ("rms mean of all", R, _rms(lambda x: (x ** 2).mean()), "take the mean over the last"),
    ("rms dim 0", R, _rms(lambda x: (x ** 2).mean(0, keepdim=True)), "dim=0 runs down"),
    ("rms no keepdim", R, _rms(lambda x: (x ** 2).mean(-1)), "keepdim=True keeps"),
    ("rms sum", R, _rms(lambda x: (x ** 2).sum(-1, keepdim=True)), "not their sum"),
    ("rms norm", R, lambda x, w, eps: x / torch.linalg.norm(x, dim=-1, keepdim=True) * w,
     "x.norm() (and F.normalize)"),
    ("rms no sqrt", R, lambda x, w, eps: x / ((x ** 2).mean(-1, keepdim=True) + eps) * w,
     "take the square root"),
    ("rms eps outside", R, _rms(lambda x: (x ** 2).mean(-1, keepdim=True), eps_inside=False),
     "eps goes inside the square root, added"),
    ("rms no eps", R, lambda x, w, eps: x / (x ** 2).mean(-1, keepdim=True).sqrt() * w,
     "case 2 uses eps = 0.5"),
    ("rms eps written in", R, lambda x, w, eps: x * torch.rsqrt(
        (x ** 2).mean(-1, keepdim=True) + 1e-6) * w, "case 2 uses eps = 0.5"),
    ("rms square of mean", R, _rms(lambda x: x.mean(-1, keepdim=True) ** 2),
     "the mean of x**2, not the square"),
    ("rms no weight", R, lambda x, w, eps: x / torch.sqrt((x ** 2).mean(-1, keepdim=True)
                                                         + eps), "multiply by weight, the"),
    ("rms + weight", R, lambda x, w, eps: x / torch.sqrt((x ** 2).mean(-1, keepdim=True)
                                                        + eps) + w, "do not add it"),
    ("rms / weight", R, lambda x, w, eps: x / torch.sqrt((x ** 2).mean(-1, keepdim=True)
                                                        + eps) / w, "dividing by it undoes"),
    ("rms weight first", R, _rms(lambda x: (x ** 2).mean(-1, keepdim=True),
                                 weight_at_end=False), "not of x * weight"),
    ("rms var, no weight", R, lambda x, w, eps: x / torch.sqrt(
        x.var(-1, keepdim=True) + eps), None),
    # my_apply_rope
    ("rope neighbours", P, _rope_by_neighbours, "pair dimension i with i + d/2"),
    ("rope repeat_interleave", P, _rope(pairs="repeat_interleave"),
     "the angles of the first half repeat"),
    ("rope no offset", P, _rope(positions=lambda o, t: torch.arange(t)),
     "torch.arange(offset, offset + T), not"),
    ("rope offset + 1", P, _rope(positions=lambda o, t: torch.arange(o + 1, o + t + 1)),
     "not offset + 1"),
    ("rope offset - 1", P, _rope(positions=lambda o, t: torch.arange(o - 1, o + t - 1)),
     "not offset - 1"),
    ("rope 10000", P, lambda x, o, theta: _rope()(x, o, 10000.0), "not the paper's 10000"),
    ("rope arange(d // 2)", P, _rope(power=lambda d: torch.arange(d // 2) / d),
     "not torch.arange(d // 2) / d"),
    ("rope positive exponent", P, _rope(power=lambda d: -torch.arange(0, d, 2) / d),
     "the exponent is negative"),
    ("rope //", P, _rope(power=lambda d: torch.arange(0, d, 2) // d), "// is integer"),
    ("rope every dimension", P, _rope(frequencies_for="every dimension"),
     "not d frequencies"),
    ("rope wrong way", P, lambda x, o, theta: 2 * x * torch.cat(
        [torch.outer(torch.arange(o, o + x.shape[-2]),
                     theta ** (-torch.arange(0, x.shape[-1], 2) / x.shape[-1]))] * 2,
        dim=-1).cos() - _rope()(x, o, theta), "yours turns by -angle"),
    ("rope no rotation", P, lambda x, o, theta: x * torch.cat(
        [torch.outer(torch.arange(o, o + x.shape[-2]),
                     theta ** (-torch.arange(0, x.shape[-1], 2) / x.shape[-1]))] * 2,
        dim=-1).cos() + x * torch.cat(
        [torch.outer(torch.arange(o, o + x.shape[-2]),
                     theta ** (-torch.arange(0, x.shape[-1], 2) / x.shape[-1]))] * 2,
        dim=-1).sin(), "not x * cos + x * sin"),
    # my_expand_kv_heads
    ("expand repeat", E, lambda kv, h: kv.repeat(1, h // kv.shape[1], 1, 1), "repeat tiles"),
    ("expand cat copies", E, lambda kv, h: torch.cat([kv] * (h // kv.shape[1]), dim=1),
     "repeat tiles"),
    ("expand by hand, tiled", E, _expand_by_hand, "repeat tiles"),
    ("expand positions", E, lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=2),
     "not the positions (dim 2)"),
    ("expand features", E, lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=-1),
     "not the features"),
    ("expand batch", E, lambda kv, h: kv.repeat_interleave(h // kv.shape[1], dim=0),
     "dim 0 is the batch"),
    ("expand num_heads times", E, lambda kv, h: kv.repeat_interleave(h, 1), "not num_heads"),
    ("expand nothing", E, lambda kv, h: kv, "expand to num_heads heads"),
    ("expand shape[0]", E, lambda kv, h: torch.repeat_interleave(kv, h // kv.shape[0], 1),
     "kv.shape[0] is the batch"),
    ("expand g times", E, lambda kv, h: kv.repeat_interleave(kv.size(1), dim=1),
     "not g times"),
    ("expand /", E, lambda kv, h: kv.repeat_interleave(h / kv.shape[1], dim=1),
     "divide with //"),
    ("expand expand", E, lambda kv, h: kv.expand(-1, h, -1, -1), "expand only stretches"),
    # my_swiglu
    ("swiglu swapped", S, lambda x, g, u, d: (F.silu(x @ u.T) * (x @ g.T)) @ d.T,
     "the up projection does not"),
    ("swiglu sigmoid", S, _swiglu(torch.sigmoid), "not the sigmoid alone"),
    ("swiglu gelu", S, _swiglu(F.gelu), "GEGLU"),
    ("swiglu relu", S, _swiglu(torch.relu), "ReGLU"),
    ("swiglu +", S, _swiglu(combine=lambda a, b: a + b), "not silu(gate) + up"),
    ("swiglu no up", S, _swiglu(combine=lambda a, b: a), "keep the up projection"),
    ("swiglu no gate", S, lambda x, g, u, d: (x @ u.T) @ d.T, "keep the gate"),
    ("swiglu no down", S, _swiglu(down=False), "end with the down projection"),
    ("swiglu no .T", S, _swiglu(transpose=False), "multiply by their transpose"),
    ("swiglu silu on product", S, lambda x, g, u, d: F.silu((x @ g.T) * (x @ u.T)) @ d.T,
     "not on the product"),
    ("swiglu precedence", S, lambda x, g, u, d: (F.silu(x @ g.T) * x @ u.T) @ d.T,
     "same precedence"),
    ("swiglu silu by hand", S, _swiglu(lambda z: z / (1 + torch.exp(z))),
     "the exponent is -z"),
    ("swiglu down not .T", S, lambda x, g, u, d: (F.silu(x @ g.T) * (x @ u.T)) @ d,
     "end with @ down_weight.T"),
]


@pytest.mark.parametrize("name, checker, wrong, fragment", CATALOGUE,
                         ids=[entry[0] for entry in CATALOGUE])
def test_catalogue(name, checker, wrong, fragment):
    verdict = checker.run(wrong)
    assert not verdict, "a wrong answer passed"
    message = verdict.message
    assert "\n" not in message
    if fragment is None:
        assert "Hint: " not in message, message
        return
    assert "Hint: " in message, message
    hint = message.split("Hint: ", 1)[1]
    listed = [h for h in checker.mistakes if fragment in h]
    assert len(listed) == 1, (fragment, listed)
    assert hint == listed[0], (fragment, message)


def test_catalogue_coverage():
    """At least 90% of the catalogue's wrong answers get a hint that names them; every
    exercise has at least eight."""
    named = sum(fragment is not None for *_, fragment in CATALOGUE)
    share = named / len(CATALOGUE)
    print(f"chapter 14: {named} of {len(CATALOGUE)} typical mistakes named ({share:.0%})")
    assert share >= 0.9
    for checker in (R, P, E, S):
        assert sum(entry[1] is checker for entry in CATALOGUE) >= 8


# --- issue 40: answers that cannot be trained through, or that change their arguments ---------

def test_an_rms_norm_with_a_detached_root_fails_with_the_cut_hint(capsys):
    def my_rms_norm(x, weight, eps):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps).detach() * weight
    assert not check_rms_norm(my_rms_norm)
    assert "part of the computation is cut" in _hint(capsys.readouterr().out)


def test_a_rope_that_turns_the_callers_x_in_place_fails(capsys):
    def my_apply_rope(x, offset, theta):
        x.copy_(check_apply_rope.reference(x, offset, theta))
        return x
    assert not check_apply_rope(my_apply_rope)
    assert "leave the arguments as they were" in _hint(capsys.readouterr().out)
