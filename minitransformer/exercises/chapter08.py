"""Checkers for the exercises of chapter 8, *Transformer blocks*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_layer_norm` -- ``my_layer_norm(x, weight, bias, eps)``: normalize each row of
  ``x`` over its last dimension, then scale and shift.
* :data:`check_residual_sublayer` -- ``residual_sublayer(x, sublayer, norm, norm_first)``: one
  sub-layer inside its residual connection, post-norm or pre-norm.
* :data:`check_count_block_parameters` -- ``count_block_parameters(d_model, num_heads, d_ff)``:
  the number of learned numbers in one :class:`~minitransformer.EncoderLayer`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minitransformer.exercises import Checker

__all__ = ["check_count_block_parameters", "check_layer_norm", "check_residual_sublayer"]


# --- my_layer_norm(x, weight, bias, eps) -----------------------------------------------------

def _layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    variance = x.var(dim=-1, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def _layer_norm_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(8)
    rows = torch.tensor([[1.0, 2.0, 3.0, 6.0], [-2.0, 0.0, 0.0, 2.0]])
    ones, zeros = torch.ones(4), torch.zeros(4)
    x = 3 * torch.randn(2, 3, 5, generator=generator, dtype=torch.float64) + 1
    weight = torch.randn(5, generator=generator, dtype=torch.float64)
    bias = torch.randn(5, generator=generator, dtype=torch.float64)
    # a large eps second, so that where eps goes shows in the printed numbers
    return [(rows, ones, zeros, 1e-5),
            (torch.tensor([[1.0, 2.0], [3.0, 5.0]]), torch.ones(2), torch.zeros(2), 0.5),
            (rows, torch.tensor([1.0, 2.0, 0.5, -1.0]), torch.tensor([0.0, 1.0, 0.0, -1.0]),
             1e-5),
            (x, weight, bias, 1e-5)]


def _with_unbiased_variance(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(dim=-1, keepdim=True) + eps) * weight + bias


def _eps_outside_the_root(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    std = x.var(dim=-1, keepdim=True, correction=0).sqrt()
    return (x - mean) / (std + eps) * weight + bias


def _without_eps(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / x.var(dim=-1, keepdim=True, correction=0).sqrt() * weight + bias


def _without_square_root(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    return (x - mean) / (x.var(dim=-1, keepdim=True, correction=0) + eps) * weight + bias


def _mean_without_keepdim(x, weight, bias, eps):
    # a variance without keepdim raises the same error on case 1, so the hint names both
    centred = x - x.mean(dim=-1)        # (..., d_model) - (...,): raises, or pairs wrongly
    variance = (centred ** 2).mean(dim=-1, keepdim=True)
    return centred / torch.sqrt(variance + eps) * weight + bias


def _over_dimension_1(x, weight, bias, eps):
    mean = x.mean(dim=1, keepdim=True)      # the last dimension only when x is 2-D
    variance = x.var(dim=1, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def _over_the_first_dimension(x, weight, bias, eps):
    mean = x.mean(dim=0, keepdim=True)
    variance = x.var(dim=0, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def _without_scale_and_shift(x, weight, bias, eps):
    return _layer_norm(x, torch.ones_like(weight), torch.zeros_like(bias), eps)


def _without_shift(x, weight, bias, eps):
    return _layer_norm(x, weight, torch.zeros_like(bias), eps)


def _without_scale(x, weight, bias, eps):
    return _layer_norm(x, torch.ones_like(weight), bias, eps)


def _shift_then_scale(x, weight, bias, eps):
    return (_layer_norm(x, torch.ones_like(weight), torch.zeros_like(bias), eps) + bias) * weight


def _weight_and_bias_swapped(x, weight, bias, eps):
    return _layer_norm(x, bias, weight, eps)


def _over_the_whole_tensor(x, weight, bias, eps):
    mean = x.mean()                         # one number for the whole tensor
    variance = x.var(correction=0)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def _over_the_whole_tensor_unbiased(x, weight, bias, eps):
    return (x - x.mean()) / torch.sqrt(x.var() + eps) * weight + bias


check_layer_norm = Checker(
    reference=_layer_norm,
    cases=_layer_norm_cases(),
    mistakes={
        "use the variance that divides by d_model (x.var(..., correction=0)), as layer norm "
        "does; x.var() divides by d_model - 1": _with_unbiased_variance,
        "eps goes inside the square root: divide by sqrt(variance + eps)": _eps_outside_the_root,
        "eps is missing: divide by sqrt(variance + eps), which also keeps a constant vector "
        "from dividing by zero": _without_eps,
        "divide by the standard deviation, the square root: (x - mean) / sqrt(variance + eps)":
            _without_square_root,
        "keep the averaged dimension in the mean and in the variance: x.mean(dim=-1, "
        "keepdim=True) has shape (..., 1), which lines up with x; without keepdim it has shape "
        "(...) and does not": _mean_without_keepdim,
        "normalize over the last dimension, dim=-1: dim=1 is the last one only for 2-D input; "
        "in this (2, 3, 5) input it is the 3 positions, not the 5 features": _over_dimension_1,
        "layer norm averages over each vector's own features, the last dimension (dim=-1), "
        "not over the rows": _over_the_first_dimension,
        "one mean and one variance for the whole tensor (x.mean() and x.var() without dim) "
        "mix the numbers of every vector: each vector gets its own, over its d_model "
        "features, x.mean(dim=-1, keepdim=True)": _over_the_whole_tensor,
        "one mean and one variance for the whole tensor (x.mean() and x.var() without dim) "
        "mix the numbers of every vector: each vector gets its own, over its d_model "
        "features, x.mean(dim=-1, keepdim=True), and a variance that divides by d_model, "
        "x.var(dim=-1, keepdim=True, correction=0)": _over_the_whole_tensor_unbiased,
        "after normalizing, multiply by weight and add bias": _without_scale_and_shift,
        "after multiplying by weight, add bias": _without_shift,
        "multiply the normalized vector by weight, then add bias": _without_scale,
        "scale first, then shift: normalized * weight + bias, not (normalized + bias) * weight":
            _shift_then_scale,
        "weight and bias are swapped: multiply by weight, the scale, and add bias, the "
        "shift: normalized * weight + bias": _weight_and_bias_swapped,
    },
)


# --- residual_sublayer(x, sublayer, norm, norm_first) ----------------------------------------

def _residual_sublayer(x: Tensor, sublayer: nn.Module, norm: nn.Module,
                       norm_first: bool) -> Tensor:
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def _residual_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(80)
    cases = []
    for norm_first in (False, True, False, True):
        with torch.random.fork_rng():       # leave the learner's random numbers alone
            sublayer = nn.Linear(4, 4)
        norm = nn.LayerNorm(4)
        with torch.no_grad():
            for p in (*sublayer.parameters(), *norm.parameters()):
                p.copy_(torch.randn(p.shape, generator=generator) + (p is norm.weight))
        x = torch.randn(2, 4, generator=generator)
        cases.append((x, sublayer.requires_grad_(False), norm.requires_grad_(False),
                      norm_first))
    return cases


def _without_residual(x, sublayer, norm, norm_first):
    return sublayer(norm(x)) if norm_first else norm(sublayer(x))


def _orders_swapped(x, sublayer, norm, norm_first):
    return _residual_sublayer(x, sublayer, norm, not norm_first)


def _pre_norm_adding_the_normalized_input(x, sublayer, norm, norm_first):
    if norm_first:
        h = norm(x)
        return h + sublayer(h)
    return norm(x + sublayer(x))


def _post_norm_without_norm(x, sublayer, norm, norm_first):
    return x + sublayer(norm(x)) if norm_first else x + sublayer(x)


def _pre_norm_normalizing_the_sum_too(x, sublayer, norm, norm_first):
    return norm(x + sublayer(norm(x))) if norm_first else norm(x + sublayer(x))


def _post_norm_of_the_output_only(x, sublayer, norm, norm_first):
    return x + sublayer(norm(x)) if norm_first else x + norm(sublayer(x))


check_residual_sublayer = Checker(
    reference=_residual_sublayer,
    cases=_residual_cases(),
    mistakes={
        "the residual connection is missing: add the input x to the sub-layer's output":
            _without_residual,
        "the two orders are swapped: norm_first=True means x + sublayer(norm(x)) (pre-norm), "
        "norm_first=False means norm(x + sublayer(x)) (post-norm)": _orders_swapped,
        "in pre-norm only the sub-layer's input is normalized; the residual adds the original "
        "x, not norm(x)": _pre_norm_adding_the_normalized_input,
        "post-norm normalizes the sum: norm(x + sublayer(x))": _post_norm_without_norm,
        "pre-norm normalizes only the sub-layer's input; the sum x + sublayer(norm(x)) is not "
        "normalized again": _pre_norm_normalizing_the_sum_too,
        "post-norm normalizes the whole sum, norm(x + sublayer(x)), not only the sub-layer's "
        "output": _post_norm_of_the_output_only,
    },
)


# --- count_block_parameters(d_model, num_heads, d_ff) ----------------------------------------

def _count_block_parameters(d_model: int, num_heads: int, d_ff: int) -> int:
    attention = 4 * d_model * d_model + 4 * d_model
    feed_forward = 2 * d_model * d_ff + d_ff + d_model
    norms = 2 * 2 * d_model
    return attention + feed_forward + norms


check_count_block_parameters = Checker(
    reference=_count_block_parameters,
    cases=[(512, 8, 2048), (64, 4, 256), (12, 3, 20), (6, 1, 1)],
    mistakes={
        # forgetting the two norms and forgetting the attention's biases both lose 4 d_model
        "4 * d_model numbers are missing: count the two layer norms (a weight and a bias of "
        "d_model numbers each) and the biases of the attention's four projections (d_model "
        "each)": lambda d, h, f: _count_block_parameters(d, h, f) - 4 * d,
        "2 * d_model numbers are missing: the block has two layer norms, each with a weight and "
        "a bias of d_model numbers": lambda d, h, f: _count_block_parameters(d, h, f) - 2 * d,
        "the heads share the width: the attention has 4 d_model x d_model weights whatever "
        "num_heads is": lambda d, h, f: _count_block_parameters(d, h, f) + (h - 1) * 4 * d * d,
        "the heads split d_model between them (d_k = d_model / num_heads): the attention has "
        "4 d_model x d_model weights and 4 d_model biases whatever num_heads is":
            lambda d, h, f: _count_block_parameters(d, h, f) + (h - 1) * (4 * d * d + 4 * d),
        "each head has its own d_model x d_k projections, d_k = d_model / num_heads; "
        "num_heads of them make 4 d_model x d_model weights in all, whatever num_heads is":
            lambda d, h, f: _count_block_parameters(d, h, f) - 4 * d * d + 4 * d * d // h,
        "each head has its own d_model x d_k projections and d_k biases, d_k = d_model / "
        "num_heads; num_heads of them make 4 d_model x d_model weights and 4 d_model biases in "
        "all, whatever num_heads is":
            lambda d, h, f: _count_block_parameters(d, h, f) - 4 * (d * d + d)
            + 4 * (d * d + d) // h,
        # W_O acts on the concatenation of the heads, so it is d_model x d_model; the per-head
        # Q, K and V counted once give the same kind of undercount as the four above
        "each head has its own d_model x d_k projections for Q, K and V, d_k = d_model / "
        "num_heads; num_heads of them make 3 d_model x d_model weights in all, whatever "
        "num_heads is, and W_O adds one more d_model x d_model":
            lambda d, h, f: _count_block_parameters(d, h, f) - 3 * d * d + 3 * d * d // h,
        "each head has its own d_model x d_k projections and d_k biases for Q, K and V, d_k = "
        "d_model / num_heads; num_heads of them make 3 d_model x d_model weights and 3 d_model "
        "biases in all, whatever num_heads is, and W_O adds one more d_model x d_model and "
        "d_model biases":
            lambda d, h, f: _count_block_parameters(d, h, f) - 3 * (d * d + d)
            + 3 * (d * d + d) // h,
        "do not forget the output projection W_O: four d_model x d_model matrices in the "
        "attention": lambda d, h, f: _count_block_parameters(d, h, f) - d * d - d,
        "the feed-forward block has biases too: d_ff in linear1 and d_model in linear2":
            lambda d, h, f: _count_block_parameters(d, h, f) - f - d,
        "the feed-forward block has two matrices, d_model x d_ff and d_ff x d_model":
            lambda d, h, f: _count_block_parameters(d, h, f) - d * f,
        "every linear layer of the block has a bias: d_model for each of the four attention "
        "projections, d_ff for linear1 and d_model for linear2":
            lambda d, h, f: _count_block_parameters(d, h, f) - 4 * d - f - d,
        "every linear layer of the block has a bias (d_model for each of the four attention "
        "projections, d_ff for linear1 and d_model for linear2), and each layer norm has a "
        "bias of d_model numbers as well as its weight":
            lambda d, h, f: _count_block_parameters(d, h, f) - 4 * d - f - d - 2 * d,
        "linear1 maps d_model to d_ff numbers, so its bias has d_ff of them (one per output); "
        "linear2's has d_model: the feed-forward biases are d_ff + d_model, not 2 * d_model":
            lambda d, h, f: _count_block_parameters(d, h, f) - f + d,
        "linear2 maps d_ff back to d_model numbers, so its bias has d_model of them (one per "
        "output); linear1's has d_ff: the feed-forward biases are d_ff + d_model, not "
        "2 * d_ff": lambda d, h, f: _count_block_parameters(d, h, f) + f - d,
        "that counts the weight matrices only (the chapter's leading terms): add the biases, "
        "4 d_model in the attention and d_ff + d_model in the feed-forward block, and the two "
        "layer norms, 2 d_model each": lambda d, h, f: 4 * d * d + 2 * d * f,
        "use the d_ff you are given; it need not be 4 * d_model":
            lambda d, h, f: _count_block_parameters(d, h, 4 * d),
    },
)
