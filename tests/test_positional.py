"""sinusoidal_positional_encoding (minitransformer.positional), chapter 5."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer import sinusoidal_positional_encoding


def test_golden_row_for_d_model_16():
    pe = sinusoidal_positional_encoding(4, 16)
    assert pe.shape == (4, 16) and pe.dtype == torch.float32
    assert [round(v, 4) for v in pe[1, :4].tolist()] == [0.8415, 0.5403, 0.3110, 0.9504]


def test_position_zero_is_sin0_cos0():
    pe = sinusoidal_positional_encoding(1, 8)
    assert pe[0].tolist() == [0.0, 1.0] * 4


@settings(max_examples=60, deadline=None)
@given(num_positions=st.integers(1, 40), half=st.integers(1, 32), offset=st.integers(0, 5000),
       base=st.sampled_from([10000.0, 100.0, 2.0]), data=st.data())
def test_matches_the_formula_at_random_positions_and_sizes(num_positions, half, offset, base, data):
    d_model = 2 * half
    pe = sinusoidal_positional_encoding(num_positions, d_model, base=base, offset=offset)
    assert pe.shape == (num_positions, d_model)
    row = data.draw(st.integers(0, num_positions - 1))
    i = data.draw(st.integers(0, half - 1))
    angle = (offset + row) / base ** (2 * i / d_model)
    assert pe[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert pe[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 100), count=st.integers(1, 20), half=st.integers(1, 16))
def test_offset_continues_the_same_table(start, count, half):
    full = sinusoidal_positional_encoding(start + count, 2 * half)
    part = sinusoidal_positional_encoding(count, 2 * half, offset=start)
    torch.testing.assert_close(part, full[start:])


def test_every_sin_cos_pair_lies_on_the_unit_circle():
    pe = sinusoidal_positional_encoding(50, 12)
    radius = pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2
    torch.testing.assert_close(radius, torch.ones_like(radius))


def test_dot_product_depends_only_on_the_distance():
    pe = sinusoidal_positional_encoding(120, 64).double()
    for distance in (1, 5, 17):
        dots = (pe[:-distance] * pe[distance:]).sum(dim=1)
        torch.testing.assert_close(dots, dots[:1].expand_as(dots), atol=1e-5, rtol=0)
    # and it shrinks, at first, as positions move apart
    near, far = (pe[10] @ pe[11]).item(), (pe[10] @ pe[30]).item()
    assert near > far


def test_positions_are_all_different():
    pe = sinusoidal_positional_encoding(200, 16)
    distances = torch.cdist(pe, pe) + torch.eye(200) * 10
    assert distances.min().item() > 0.01


def test_zero_positions_is_an_empty_table():
    assert sinusoidal_positional_encoding(0, 6).shape == (0, 6)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((5, 7), {}, ValueError, "d_model must be even .* got 7"),
    ((-1, 8), {}, ValueError, "num_positions must be at least 0, got -1"),
    ((5, 0), {}, ValueError, "d_model must be at least 1, got 0"),
    ((5, 8), {"offset": -3}, ValueError, "offset must be at least 0, got -3"),
    ((5.0, 8), {}, TypeError, r"num_positions must be an int, got float \(5.0\)"),
    ((5, 8), {"base": 0.0}, ValueError, "base must be positive, got 0.0"),
    ((5, 8), {"base": float("inf")}, ValueError, "base must be finite, got inf"),
    ((5, 8), {"base": "big"}, TypeError, "base must be a number, got str"),
])
def test_bad_arguments(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        sinusoidal_positional_encoding(*args, **kwargs)


def test_device_and_dtype_keywords_place_the_table_like_its_input():
    x = torch.zeros(3, 8, dtype=torch.float64)
    pe = sinusoidal_positional_encoding(3, 8, device=x.device, dtype=x.dtype)
    assert pe.dtype == torch.float64 and pe.device == x.device
    # the float64 table carries the digits float32 rounds away
    assert pe[1, 0].item() == math.sin(1.0)
    half = sinusoidal_positional_encoding(3, 8, dtype=torch.float16, device="cpu")
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), sinusoidal_positional_encoding(3, 8), atol=1e-3,
                               rtol=0)
    assert sinusoidal_positional_encoding(3, 8).dtype == torch.get_default_dtype()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float32"])
def test_a_non_float_dtype_is_a_type_error(dtype):
    with pytest.raises(TypeError,
                       match=f"dtype must be a floating-point torch.dtype, got {dtype!r}"):
        sinusoidal_positional_encoding(3, 8, dtype=dtype)
