"""softmax (minitransformer.attention), the written-out version used from chapter 5 on."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer import softmax


@st.composite
def scores_and_dim(draw):
    """A random float tensor (1 to 4 dims, sizes 1..6), a dim to normalise, and a dtype."""
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    scale = draw(st.sampled_from([1.0, 10.0, 100.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=dtype) * scale, dim


@settings(max_examples=150, deadline=None)
@given(scores_and_dim())
def test_equals_torch_softmax_for_random_shapes_dims_and_dtypes(case):
    x, dim = case
    got = softmax(x, dim=dim)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got, torch.softmax(x, dim=dim))
    torch.testing.assert_close(got.sum(dim=dim), torch.ones_like(x.sum(dim=dim)))


def test_default_dim_is_the_last_one():
    x = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    assert not torch.allclose(softmax(x), torch.softmax(x, dim=0))


def test_the_capital_of_france_scores():
    probs = softmax(torch.tensor([12.3, 4.8, 3.1, -2.0], dtype=torch.float64))
    assert [round(p, 6) for p in probs.tolist()] == [0.999346, 0.000553, 0.000101, 0.000001]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("values", [[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0],
                                    [3.0e38, 3.0e38, 0.0], [88.0, 89.0, 90.0]])
def test_extreme_scores_stay_finite_and_match_torch(dtype, values):
    x = torch.tensor(values, dtype=dtype)
    got = softmax(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.softmax(x, dim=-1))


def test_naive_exp_would_overflow_where_softmax_does_not():
    x = torch.tensor([1000.0, 1001.0])
    naive = torch.exp(x) / torch.exp(x).sum()
    assert torch.isnan(naive).all()  # the reason for subtracting the maximum
    torch.testing.assert_close(softmax(x), torch.tensor([0.2689414, 0.7310586]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_minus_infinity_gets_exactly_zero(dtype):
    x = torch.tensor([[0.5, float("-inf"), 1.5], [float("-inf"), 2.0, float("-inf")]], dtype=dtype)
    got = softmax(x)
    assert got[0, 1].item() == 0.0 and got[1].tolist() == [0.0, 1.0, 0.0]
    torch.testing.assert_close(got, torch.softmax(x, dim=-1))


def test_a_row_of_all_minus_infinity_is_an_error_not_nan():
    x = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]])
    with pytest.raises(ValueError, match=r"all -inf .*shape \(2, 2\)"):
        softmax(x)
    # the same tensor is fine along dim 0, where every column has a finite score
    torch.testing.assert_close(softmax(x, dim=0), torch.softmax(x, dim=0))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_plus_infinity_are_errors(bad):
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        softmax(torch.tensor([0.0, bad, 1.0]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_boolean_tensors_are_type_errors(dtype):
    with pytest.raises(TypeError, match=f"floating-point tensor, got a tensor of dtype {dtype}"):
        softmax(torch.tensor([1, 0, 1]).to(dtype))


def test_a_list_is_a_type_error():
    with pytest.raises(TypeError, match="floating-point tensor, got list"):
        softmax([1.0, 2.0])


def test_gradient_flows_like_torch_softmax():
    x = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    (softmax(x) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    y = x.detach().clone().requires_grad_(True)
    (torch.softmax(y, dim=-1) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_empty_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match=r"empty dimension -1 in a tensor of shape \(2, 0\)"):
        softmax(torch.zeros(2, 0))


def test_dim_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match=r"dim 5 is out of range for a tensor of shape \(2, 3\)"):
        softmax(torch.zeros(2, 3), dim=5)


def test_softmax_lives_in_functional_where_sampling_and_attention_import_it():
    import importlib

    import minitransformer
    attention, functional, generate = (importlib.import_module(f"minitransformer.{name}")
                                       for name in ("attention", "functional", "generation"))
    assert minitransformer.softmax is functional.softmax
    assert generate.softmax is functional.softmax and attention.softmax is functional.softmax
    assert functional.softmax.__module__ == "minitransformer.functional"


def test_the_exp_warm_up_is_in_one_place():
    import ast
    from pathlib import Path
    import minitransformer
    package = Path(minitransformer.__file__).parent
    defined = [path.name for path in package.rglob("*.py")
               if any(isinstance(node, ast.FunctionDef) and "warm_up" in node.name
                      for node in ast.walk(ast.parse(path.read_text())))]
    assert defined == ["functional.py"]
