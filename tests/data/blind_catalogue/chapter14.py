"""Wrong answers to the exercises of chapter 14 (from GPT-2 to Llama), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
"""

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# 14.1  my_rms_norm(x, weight, eps)
# ---------------------------------------------------------------------------


def rms_subtracts_mean(x, weight, eps):
    centred = x - x.mean(dim=-1, keepdim=True)   # layer norm's habit
    return centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rms_eps_outside(x, weight, eps):
    return x / (torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + eps) * weight


def rms_wrong_dim(x, weight, eps):
    mean_square = x.pow(2).mean(dim=-2, keepdim=True)   # over the positions
    return x / torch.sqrt(mean_square + eps) * weight


def rms_sum_not_mean(x, weight, eps):
    return x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + eps) * weight


def rms_no_sqrt(x, weight, eps):
    return x / (x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def rms_variance(x, weight, eps):
    return x / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * weight


def rms_norm_not_rms(x, weight, eps):
    return x / (x.norm(dim=-1, keepdim=True) + eps) * weight   # no 1/sqrt(d)


def rms_no_weight(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rms_no_keepdim(x, weight, eps):
    mean_square = x.pow(2).mean(dim=-1)          # broadcast against the wrong axis
    return x / torch.sqrt(mean_square + eps) * weight


def rms_in_place(x, weight, eps):
    x.div_(torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))   # the caller's x
    return x.mul_(weight)


def rms_weight_added(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) + weight


def rms_eps_ignored(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True)) * weight


# ---------------------------------------------------------------------------
# 14.2  my_apply_rope(x, offset, theta)
# ---------------------------------------------------------------------------


def _angles(length, d, offset, theta):
    frequencies = theta ** (-torch.arange(0, d, 2) / d)
    positions = torch.arange(offset, offset + length)
    angles = torch.outer(positions, frequencies)
    return torch.cat([angles, angles], dim=-1)


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rope_interleaved_pairs(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]     # the paper's neighbouring pairs
    frequencies = theta ** (-torch.arange(0, d, 2) / d)
    angles = torch.outer(torch.arange(offset, offset + length), frequencies)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def rope_offset_ignored(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], 0, theta)   # always from 0
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_offset_plus_one(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], offset + 1, theta)   # 1-based
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_missing_two(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    frequencies = theta ** (-torch.arange(d // 2) / d)   # i / d, not 2i / d
    angles = torch.outer(torch.arange(offset, offset + length), frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_positive_exponent(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    frequencies = theta ** (torch.arange(0, d, 2) / d)
    angles = torch.outer(torch.arange(offset, offset + length), frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_sign_flipped(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], offset, theta)
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([second, -first], dim=-1)   # turns the other way
    return x * angles.cos() + rotated * angles.sin()


def rope_angles_interleaved(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    frequencies = theta ** (-torch.arange(0, d, 2) / d)
    angles = torch.outer(torch.arange(offset, offset + length), frequencies)
    angles = angles.repeat_interleave(2, dim=-1)   # a0 a0 a1 a1 with rotate-half
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_cos_sin_swapped(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], offset, theta)
    return x * angles.sin() + _rotate_half(x) * angles.cos()


def rope_integer_exponent(x, offset, theta):
    length, d = x.shape[-2], x.shape[-1]
    frequencies = theta ** ((-torch.arange(0, d, 2)) // d).float()   # floor division
    angles = torch.outer(torch.arange(offset, offset + length), frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_length_from_heads(x, offset, theta):
    length, d = x.shape[1], x.shape[-1]      # x.shape[1] is h, not T
    angles = _angles(length, d, offset, theta)
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_hard_coded_theta(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], offset, 10000.0)   # Llama's base
    return x * angles.cos() + _rotate_half(x) * angles.sin()


def rope_in_place(x, offset, theta):
    angles = _angles(x.shape[-2], x.shape[-1], offset, theta)
    rotated = _rotate_half(x)
    x.mul_(angles.cos()).add_(rotated * angles.sin())   # the caller's x changes
    return x


# ---------------------------------------------------------------------------
# 14.3  my_expand_kv_heads(kv, num_heads)
# ---------------------------------------------------------------------------


def expand_repeat(kv, num_heads):
    group = num_heads // kv.shape[1]
    return kv.repeat(1, group, 1, 1)         # 0, 1, 0, 1: tiled


def expand_wrong_dim(kv, num_heads):
    group = num_heads // kv.shape[1]
    return kv.repeat_interleave(group, dim=2)   # along the positions


def expand_group_is_num_heads(kv, num_heads):
    return kv.repeat_interleave(num_heads, dim=1)   # g * num_heads heads


def expand_unsqueeze_wrong_place(kv, num_heads):
    B, g, T, d = kv.shape
    group = num_heads // g
    return kv[:, None].expand(B, group, g, T, d).reshape(B, num_heads, T, d)


def expand_inverted_ratio(kv, num_heads):
    group = max(1, kv.shape[1] // num_heads)   # g // h: 1 when g < h
    return kv.repeat_interleave(group, dim=1)


def expand_batch_axis(kv, num_heads):
    group = num_heads // kv.shape[0]         # B read as g
    return kv.repeat_interleave(group, dim=1)


def expand_cat(kv, num_heads):
    group = num_heads // kv.shape[1]
    return torch.cat([kv] * group, dim=1)    # tiled


def expand_hard_coded_two(kv, num_heads):
    return kv.repeat_interleave(2, dim=1)    # the chapter's two groups of two


def expand_index_by_g(kv, num_heads):
    g = kv.shape[1]
    return kv[:, torch.arange(num_heads) // g]   # j // g, not j // (h // g)


def expand_list_of_heads(kv, num_heads):
    group = num_heads // kv.shape[1]
    return [kv[:, j // group] for j in range(num_heads)]   # a list of (B, T, d)


# ---------------------------------------------------------------------------
# 14.4  my_swiglu(x, gate_weight, up_weight, down_weight)
# ---------------------------------------------------------------------------


def swiglu_silu_on_up(x, gate_weight, up_weight, down_weight):
    return (x @ gate_weight.T * F.silu(x @ up_weight.T)) @ down_weight.T


def swiglu_gelu(x, gate_weight, up_weight, down_weight):
    return (F.gelu(x @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


def swiglu_sigmoid(x, gate_weight, up_weight, down_weight):
    return (torch.sigmoid(x @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


def swiglu_untransposed(x, gate_weight, up_weight, down_weight):
    # x @ W without .T: right shapes only when d_ff == d
    return (F.silu(x @ gate_weight) * (x @ up_weight)) @ down_weight


def swiglu_silu_after_product(x, gate_weight, up_weight, down_weight):
    return F.silu((x @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


def swiglu_relu(x, gate_weight, up_weight, down_weight):
    return (F.relu(x @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


def swiglu_sum(x, gate_weight, up_weight, down_weight):
    return (F.silu(x @ gate_weight.T) + (x @ up_weight.T)) @ down_weight.T


def swiglu_no_down(x, gate_weight, up_weight, down_weight):
    return F.silu(x @ gate_weight.T) * (x @ up_weight.T)   # (..., d_ff)


def swiglu_silu_sign(x, gate_weight, up_weight, down_weight):
    h = x @ gate_weight.T
    silu = h / (1 + torch.exp(h))            # sigmoid(-h) by mistake
    return (silu * (x @ up_weight.T)) @ down_weight.T


def swiglu_gate_is_silu_of_x(x, gate_weight, up_weight, down_weight):
    # silu applied to x, then the gate projection
    return ((F.silu(x) @ gate_weight.T) * (x @ up_weight.T)) @ down_weight.T


WRONG_ANSWERS = [
    ("14.1", "check_rms_norm", "mean subtracted (layer norm)", rms_subtracts_mean),
    ("14.1", "check_rms_norm", "eps added after the square root", rms_eps_outside),
    ("14.1", "check_rms_norm", "mean square over dim -2", rms_wrong_dim),
    ("14.1", "check_rms_norm", "sum of squares, not their mean", rms_sum_not_mean),
    ("14.1", "check_rms_norm", "divided by the mean square, no square root", rms_no_sqrt),
    ("14.1", "check_rms_norm", "variance (mean subtracted, unbiased)", rms_variance),
    ("14.1", "check_rms_norm", "divided by the norm, not the root mean square",
     rms_norm_not_rms),
    ("14.1", "check_rms_norm", "weight not applied", rms_no_weight),
    ("14.1", "check_rms_norm", "no keepdim: broadcast along the wrong axis", rms_no_keepdim),
    ("14.1", "check_rms_norm", "div_/mul_ on the caller's x", rms_in_place),
    ("14.1", "check_rms_norm", "weight added, not multiplied", rms_weight_added),
    ("14.1", "check_rms_norm", "eps ignored (rsqrt of the mean square)", rms_eps_ignored),

    ("14.2", "check_apply_rope", "the paper's neighbouring pairs, not rotate-half",
     rope_interleaved_pairs),
    ("14.2", "check_apply_rope", "offset ignored: positions from 0", rope_offset_ignored),
    ("14.2", "check_apply_rope", "positions from offset + 1", rope_offset_plus_one),
    ("14.2", "check_apply_rope", "frequencies theta^(-i/d): the 2 missing", rope_missing_two),
    ("14.2", "check_apply_rope", "frequencies theta^(+2i/d)", rope_positive_exponent),
    ("14.2", "check_apply_rope", "rotate_half with the sign on the wrong half",
     rope_sign_flipped),
    ("14.2", "check_apply_rope", "angles repeat_interleave'd with rotate-half",
     rope_angles_interleaved),
    ("14.2", "check_apply_rope", "cos and sin swapped", rope_cos_sin_swapped),
    ("14.2", "check_apply_rope", "floor division in the exponent", rope_integer_exponent),
    ("14.2", "check_apply_rope", "length read from x.shape[1] (the heads)",
     rope_length_from_heads),
    ("14.2", "check_apply_rope", "theta hard-coded as 10,000", rope_hard_coded_theta),
    ("14.2", "check_apply_rope", "rotates the caller's x in place", rope_in_place),

    ("14.3", "check_expand_kv_heads", "repeat: heads tiled 0, 1, 0, 1", expand_repeat),
    ("14.3", "check_expand_kv_heads", "repeat_interleave along dim 2 (positions)",
     expand_wrong_dim),
    ("14.3", "check_expand_kv_heads", "each head repeated num_heads times",
     expand_group_is_num_heads),
    ("14.3", "check_expand_kv_heads", "new axis before g: expand+reshape tiles",
     expand_unsqueeze_wrong_place),
    ("14.3", "check_expand_kv_heads", "group as g // num_heads", expand_inverted_ratio),
    ("14.3", "check_expand_kv_heads", "g read from the batch axis", expand_batch_axis),
    ("14.3", "check_expand_kv_heads", "torch.cat of copies: tiled", expand_cat),
    ("14.3", "check_expand_kv_heads", "group size hard-coded as 2", expand_hard_coded_two),
    ("14.3", "check_expand_kv_heads", "index j // g instead of j // (h // g)",
     expand_index_by_g),
    ("14.3", "check_expand_kv_heads", "returns a list of heads", expand_list_of_heads),

    ("14.4", "check_swiglu", "silu on the up projection, not the gate", swiglu_silu_on_up),
    ("14.4", "check_swiglu", "GELU instead of SiLU", swiglu_gelu),
    ("14.4", "check_swiglu", "sigmoid instead of SiLU (GLU)", swiglu_sigmoid),
    ("14.4", "check_swiglu", "weights not transposed (right shapes only if d_ff == d)",
     swiglu_untransposed),
    ("14.4", "check_swiglu", "silu of the product", swiglu_silu_after_product),
    ("14.4", "check_swiglu", "ReLU instead of SiLU", swiglu_relu),
    ("14.4", "check_swiglu", "gate and up added, not multiplied", swiglu_sum),
    ("14.4", "check_swiglu", "down projection forgotten", swiglu_no_down),
    ("14.4", "check_swiglu", "silu written as h / (1 + exp(h))", swiglu_silu_sign),
    ("14.4", "check_swiglu", "silu applied to x before the gate projection",
     swiglu_gate_is_silu_of_x),
]
