"""The checkers of chapter 8: they accept correct answers and explain plausible wrong ones."""

import pytest
import torch

from minitransformer import EncoderLayer
from minitransformer.exercises import chapter08
from minitransformer.exercises.chapter08 import (
    check_count_block_parameters,
    check_layer_norm,
    check_residual_sublayer,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_layer_norm(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias


def torch_layer_norm(x, weight, bias, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def residual_sublayer(x, sublayer, norm, norm_first):
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def count_block_parameters(d_model, num_heads, d_ff):
    attention = 4 * d_model * d_model + 4 * d_model
    feed_forward = d_model * d_ff + d_ff + d_ff * d_model + d_model
    return attention + feed_forward + 2 * (2 * d_model)


def count_by_building(d_model, num_heads, d_ff):
    block = EncoderLayer(d_model, num_heads, d_ff)
    return sum(p.numel() for p in block.parameters())


CHECKERS = {
    "layer_norm": (check_layer_norm, my_layer_norm),
    "layer_norm_by_pytorch": (check_layer_norm, torch_layer_norm),
    "residual_sublayer": (check_residual_sublayer, residual_sublayer),
    "count_block_parameters": (check_count_block_parameters, count_block_parameters),
    "count_by_building_the_block": (check_count_block_parameters, count_by_building),
}


def test_module_exports_every_checker():
    assert sorted(chapter08.__all__) == ["check_count_block_parameters", "check_layer_norm",
                                         "check_residual_sublayer"]


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


# --- specific wrong answers a learner writes, with the exact line they see -----------------

def test_layer_norm_with_unbiased_variance(capsys):
    def unbiased(x, weight, bias, eps):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) \
            * weight + bias

    assert not check_layer_norm(unbiased)
    assert capsys.readouterr().out == (
        "✗ case 1: for input ([[1.0, 2.0, 3.0, 6.0], [-2.0, 0.0, 0.0, 2.0]], "
        "[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], 1e-05) expected "
        "[[-1.069, -0.5345, 0.0, 1.6036], [-1.4142, 0.0, 0.0, 1.4142]] but got "
        "[[-0.9258, -0.4629, 0.0, 1.3887], [-1.2247, 0.0, 0.0, 1.2247]]. Hint: use the "
        "variance that divides by d_model (x.var(..., correction=0)), as layer norm does; "
        "x.var() divides by d_model - 1\n")


def test_layer_norm_with_eps_outside_the_root(capsys):
    def eps_outside(x, weight, bias, eps):
        std = x.var(-1, keepdim=True, correction=0).sqrt()
        return (x - x.mean(-1, keepdim=True)) / (std + eps) * weight + bias

    assert not check_layer_norm(eps_outside)
    # the deciding case has a large eps, so the printed numbers differ visibly (with eps=1e-5
    # the two answers agree to 4 decimals and the message showed the same numbers twice)
    assert capsys.readouterr().out == (
        "✗ case 2: for input ([[1.0, 2.0], [3.0, 5.0]], [1.0, 1.0], [0.0, 0.0], 0.5) expected "
        "[[-0.5774, 0.5774], [-0.8165, 0.8165]] but got [[-0.5, 0.5], [-0.6667, 0.6667]]. "
        "Hint: eps goes inside the square root: divide by sqrt(variance + eps)\n")


def test_layer_norm_without_weight_and_bias(capsys):
    def plain(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps)

    assert not check_layer_norm(plain)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3:")
    assert out.endswith("Hint: after normalizing, multiply by weight and add bias\n")


def test_layer_norm_that_ignores_eps(capsys):
    def no_eps(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / x.var(-1, keepdim=True, correction=0).sqrt() * weight + bias

    assert not check_layer_norm(no_eps)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert out.endswith("Hint: eps is missing: divide by sqrt(variance + eps), which also keeps "
                        "a constant vector from dividing by zero\n")


def test_layer_norm_dividing_by_the_variance(capsys):
    def no_root(x, weight, bias, eps):
        centred = x - x.mean(-1, keepdim=True)
        return centred / ((centred ** 2).mean(-1, keepdim=True) + eps) * weight + bias

    assert not check_layer_norm(no_root)
    assert capsys.readouterr().out.endswith(
        "Hint: divide by the standard deviation, the square root: "
        "(x - mean) / sqrt(variance + eps)\n")


def test_layer_norm_with_a_mean_that_drops_its_dimension(capsys):
    def no_keepdim(x, weight, bias, eps):
        mean = x.mean(dim=-1)
        variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(variance + eps) * weight + bias

    assert not check_layer_norm(no_keepdim)
    out = capsys.readouterr().out
    assert "your function raised RuntimeError: The size of tensor a (4) must match" in out
    assert out.endswith(KEEPDIM_HINT)


KEEPDIM_HINT = ("Hint: keep the averaged dimension in the mean and in the variance: "
                "x.mean(dim=-1, keepdim=True) has shape (..., 1), which lines up with x; "
                "without keepdim it has shape (...) and does not\n")


def test_layer_norm_with_a_variance_that_drops_its_dimension(capsys):
    # the same broadcasting error as the mean's: the hint must not say only "the mean"
    def no_keepdim(x, weight, bias, eps):
        mean = x.mean(dim=-1, keepdim=True)
        variance = ((x - mean) ** 2).mean(dim=-1)
        return (x - mean) / torch.sqrt(variance + eps) * weight + bias

    assert not check_layer_norm(no_keepdim)
    assert capsys.readouterr().out.endswith(KEEPDIM_HINT)


def test_layer_norm_over_dim_1(capsys):
    # right on the 2-D cases, wrong on (B, T, d_model), whose message shows only summaries
    def over_dim_1(x, weight, bias, eps):
        mean = x.mean(dim=1, keepdim=True)
        variance = ((x - mean) ** 2).mean(dim=1, keepdim=True)
        return (x - mean) / torch.sqrt(variance + eps) * weight + bias

    assert not check_layer_norm(over_dim_1)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 4:")
    assert out.endswith("Hint: normalize over the last dimension, dim=-1: dim=1 is the last "
                        "one only for 2-D input; in this (2, 3, 5) input it is the 3 "
                        "positions, not the 5 features\n")


@pytest.mark.parametrize("answer, hint", [
    (lambda n, w, b: n * w, "after multiplying by weight, add bias"),
    (lambda n, w, b: n + b, "multiply the normalized vector by weight, then add bias"),
    (lambda n, w, b: (n + b) * w, ("scale first, then shift: normalized * weight + bias, not "
                                   "(normalized + bias) * weight")),
], ids=["no bias", "no weight", "shift then scale"])
def test_layer_norm_scale_and_shift_mistakes(answer, hint, capsys):
    def wrong(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        normalized = (x - mean) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps)
        return answer(normalized, weight, bias)

    assert not check_layer_norm(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3:")
    assert out.endswith(f"Hint: {hint}\n")


WHOLE_TENSOR_HINT = ("Hint: one mean and one variance for the whole tensor (x.mean() and "
                     "x.var() without dim) mix the numbers of every vector: each vector gets "
                     "its own, over its d_model features, x.mean(dim=-1, keepdim=True)")


def test_layer_norm_over_the_whole_tensor(capsys):
    # learner review (issue 25): this got no hint
    def whole(x, weight, bias, eps):
        mean = x.mean()
        variance = ((x - mean) ** 2).mean()
        return (x - mean) / torch.sqrt(variance + eps) * weight + bias

    assert not check_layer_norm(whole)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith(WHOLE_TENSOR_HINT + "\n")


def test_layer_norm_over_the_whole_tensor_with_x_var(capsys):
    # x.var() without dim also divides by n - 1: the hint names both fixes
    def whole(x, weight, bias, eps):
        return (x - x.mean()) / torch.sqrt(x.var() + eps) * weight + bias

    assert not check_layer_norm(whole)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith(WHOLE_TENSOR_HINT + ", and a variance that divides by d_model, "
                        "x.var(dim=-1, keepdim=True, correction=0)\n")


def test_layer_norm_with_weight_and_bias_swapped(capsys):
    # learner review (issue 25): this got no hint
    def swapped(x, weight, bias, eps):
        mean = x.mean(dim=-1, keepdim=True)
        variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / torch.sqrt(variance + eps) * bias + weight

    assert not check_layer_norm(swapped)
    assert capsys.readouterr().out == (
        "✗ case 1: for input ([[1.0, 2.0, 3.0, 6.0], [-2.0, 0.0, 0.0, 2.0]], "
        "[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], 1e-05) expected "
        "[[-1.069, -0.5345, 0.0, 1.6036], [-1.4142, 0.0, 0.0, 1.4142]] but got "
        "[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]. Hint: weight and bias are swapped: "
        "multiply by weight, the scale, and add bias, the shift: normalized * weight + bias\n")


def test_residual_without_the_skip(capsys):
    assert not check_residual_sublayer(lambda x, sublayer, norm, first: norm(sublayer(x)))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[0.8639, 3.0566, 1.0199, -0.4787], "
                          "[0.8761, 1.0456, -0.3372, 0.1371]], Linear(in_features=4, "
                          "out_features=4, bias=True), LayerNorm((4,), eps=1e-05, ")
    assert out.endswith("Hint: the residual connection is missing: add the input x to the "
                        "sub-layer's output\n")


def test_residual_orders_swapped(capsys):
    assert not check_residual_sublayer(
        lambda x, sublayer, norm, first: residual_sublayer(x, sublayer, norm, not first))
    assert "Hint: the two orders are swapped" in capsys.readouterr().out


def test_pre_norm_that_normalizes_the_sum_as_well(capsys):
    def wrong(x, sublayer, norm, first):
        return norm(x + sublayer(norm(x))) if first else norm(x + sublayer(x))

    assert not check_residual_sublayer(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert out.endswith("Hint: pre-norm normalizes only the sub-layer's input; the sum "
                        "x + sublayer(norm(x)) is not normalized again\n")


def test_post_norm_that_normalizes_only_the_output(capsys):
    def wrong(x, sublayer, norm, first):
        return x + sublayer(norm(x)) if first else x + norm(sublayer(x))

    assert not check_residual_sublayer(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith("Hint: post-norm normalizes the whole sum, norm(x + sublayer(x)), not "
                        "only the sub-layer's output\n")


def test_pre_norm_that_adds_the_normalized_input(capsys):
    def wrong(x, sublayer, norm, first):
        if first:
            x = norm(x)
            return x + sublayer(x)
        return norm(x + sublayer(x))

    assert not check_residual_sublayer(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert out.endswith("the residual adds the original x, not norm(x)\n")


FOUR_D_MODEL_HINT = ("Hint: 4 * d_model numbers are missing: count the two layer norms (a "
                     "weight and a bias of d_model numbers each) and the biases of the "
                     "attention's four projections (d_model each)\n")


def test_count_without_the_norms(capsys):
    assert not check_count_block_parameters(lambda d, h, f: 4 * d * d + 4 * d + 2 * d * f + f + d)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (512, 8, 2048) expected 3152384 but got 3150336. "
        + FOUR_D_MODEL_HINT)


def test_count_without_the_attention_biases_is_not_told_it_forgot_the_norms(capsys):
    # the same total as forgetting the norms: the hint must name both, not only the norms
    assert not check_count_block_parameters(
        lambda d, h, f: 4 * d * d + 2 * d * f + f + d + 2 * 2 * d)
    assert capsys.readouterr().out.endswith(FOUR_D_MODEL_HINT)


def test_count_with_half_the_norm_parameters(capsys):
    # one norm, or two norms without their bias: 2 d_model either way
    assert not check_count_block_parameters(
        lambda d, h, f: 4 * d * d + 4 * d + 2 * d * f + f + d + 2 * d)
    assert capsys.readouterr().out.endswith(
        "Hint: 2 * d_model numbers are missing: the block has two layer norms, each with a "
        "weight and a bias of d_model numbers\n")


def test_count_of_attention_per_head(capsys):
    assert not check_count_block_parameters(
        lambda d, h, f: h * (4 * d * d + 4 * d) + 2 * d * f + f + d + 4 * d)
    assert capsys.readouterr().out.endswith(
        "Hint: the heads split d_model between them (d_k = d_model / num_heads): the attention "
        "has 4 d_model x d_model weights and 4 d_model biases whatever num_heads is\n")


@pytest.mark.parametrize("wrong, hint", [
    (lambda d, h, f: 4 * d * d // h + 4 * d + 2 * d * f + f + d + 4 * d,
     ("Hint: each head has its own d_model x d_k projections, d_k = d_model / num_heads; "
     "num_heads of them make 4 d_model x d_model weights in all, whatever num_heads is\n")),
    (lambda d, h, f: 4 * (d * d + d) // h + 2 * d * f + f + d + 4 * d,
     ("Hint: each head has its own d_model x d_k projections and d_k biases, d_k = d_model / "
     "num_heads; num_heads of them make 4 d_model x d_model weights and 4 d_model biases in "
     "all, whatever num_heads is\n")),
], ids=["weights", "weights and biases"])
def test_count_of_one_head_only(wrong, hint, capsys):
    assert not check_count_block_parameters(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (512, 8, 2048)")
    assert out.endswith(hint)


def test_count_of_the_leading_terms_only(capsys):
    assert not check_count_block_parameters(lambda d, h, f: 4 * d * d + 2 * d * f)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (512, 8, 2048) expected 3152384 but got 3145728. Hint: that "
        "counts the weight matrices only (the chapter's leading terms): add the biases, "
        "4 d_model in the attention and d_ff + d_model in the feed-forward block, and the two "
        "layer norms, 2 d_model each\n")


def test_count_that_assumes_d_ff_is_4_d_model(capsys):
    assert not check_count_block_parameters(
        lambda d, h, f: 4 * d * d + 4 * d + 8 * d * d + 4 * d + d + 4 * d)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3: for input (12, 3, 20)")
    assert out.endswith("Hint: use the d_ff you are given; it need not be 4 * d_model\n")


LINEAR_BIASES_HINT = ("every linear layer of the block has a bias: d_model for each of the "
                      "four attention projections, d_ff for linear1 and d_model for linear2")


def test_count_without_the_biases_of_the_linear_layers(capsys):
    # learner review (issue 25): 3,147,776 got no hint; chapter 9's words for the same slip
    def no_biases(d_model, num_heads, d_ff):
        attention = 4 * d_model * d_model
        feed_forward = 2 * d_model * d_ff
        norms = 2 * 2 * d_model
        return attention + feed_forward + norms

    assert not check_count_block_parameters(no_biases)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (512, 8, 2048) expected 3152384 but got 3147776. Hint: "
        + LINEAR_BIASES_HINT + "\n")


def test_count_without_any_bias_at_all(capsys):
    # the norms counted with their weight only, as "no biases anywhere"
    assert not check_count_block_parameters(lambda d, h, f: 4 * d * d + 2 * d * f + 2 * d)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (512, 8, 2048) expected 3152384 but got 3146752. Hint: every "
        "linear layer of the block has a bias (d_model for each of the four attention "
        "projections, d_ff for linear1 and d_model for linear2), and each layer norm has a bias "
        "of d_model numbers as well as its weight\n")


@pytest.mark.parametrize("feed_forward_biases, hint", [
    (lambda d, f: 2 * d,
     "Hint: linear1 maps d_model to d_ff numbers, so its bias has d_ff of them (one per "
     "output); linear2's has d_model: the feed-forward biases are d_ff + d_model, not "
     "2 * d_model\n"),
    (lambda d, f: 2 * f,
     "Hint: linear2 maps d_ff back to d_model numbers, so its bias has d_model of them (one "
     "per output); linear1's has d_ff: the feed-forward biases are d_ff + d_model, not "
     "2 * d_ff\n"),
], ids=["2 d_model", "2 d_ff"])
def test_count_with_the_feed_forward_biases_of_one_width(feed_forward_biases, hint, capsys):
    # learner review (issue 25): 2 * d_model got no hint
    def wrong(d_model, num_heads, d_ff):
        attention = 4 * d_model * d_model + 4 * d_model
        feed_forward = 2 * d_model * d_ff + feed_forward_biases(d_model, d_ff)
        return attention + feed_forward + 2 * 2 * d_model

    assert not check_count_block_parameters(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (512, 8, 2048)")
    assert out.endswith(hint)


def test_the_formula_matches_the_package_block_for_every_case():
    for d_model, num_heads, d_ff in check_count_block_parameters.cases:
        assert count_by_building(d_model, num_heads, d_ff) == \
            check_count_block_parameters.reference(d_model, num_heads, d_ff)


@pytest.mark.parametrize("wrong, hint", [
    (lambda d, h, f: 3 * d * (d // h) + 3 * d + d * d + d + 2 * d * f + f + d + 4 * d,
     ("Hint: each head has its own d_model x d_k projections for Q, K and V, d_k = d_model / "
      "num_heads; num_heads of them make 3 d_model x d_model weights in all, whatever "
      "num_heads is, and W_O adds one more d_model x d_model\n")),
    (lambda d, h, f: 3 * (d * (d // h) + d // h) + d * d + d + 2 * d * f + f + d + 4 * d,
     ("Hint: each head has its own d_model x d_k projections and d_k biases for Q, K and V, "
      "d_k = d_model / num_heads; num_heads of them make 3 d_model x d_model weights and "
      "3 d_model biases in all, whatever num_heads is, and W_O adds one more d_model x "
      "d_model and d_model biases\n")),
], ids=["weights", "weights and biases"])
def test_count_of_one_head_q_k_v_with_a_full_output_projection(wrong, hint, capsys):
    # W_O acts on the concatenation, so a learner counts it d_model x d_model, but counts one
    # head's Q, K and V (d_model x d_k each) instead of num_heads of them
    assert not check_count_block_parameters(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (512, 8, 2048)")
    assert out.endswith(hint)
