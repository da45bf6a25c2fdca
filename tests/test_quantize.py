"""minitransformer.quantize: the equations, and GGUF's block formats byte for byte equal to the
reference implementation (the ``gguf`` package, which the package itself never imports)."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from minitransformer.quantize import (
    GGUF_BLOCK_BYTES,
    absmax_dequantize,
    absmax_quantize,
    quantize_gguf,
    zero_point_dequantize,
    zero_point_quantize,
)

SMOLLM2 = Path.home() / ".cache" / "minitransformer" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


@pytest.fixture(scope="module")
def smollm2():
    """The tensors of SmolLM2's GGUF file, through the reference reader."""
    return {t.name: t for t in gguf.GGUFReader(SMOLLM2).tensors}


def reference(x: torch.Tensor, type_name: str) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[type_name]
    return gguf.quants.quantize(x.numpy(), qtype).view(np.uint8).reshape(*x.shape[:-1], -1)


def hard_blocks(seed: int = 0) -> torch.Tensor:
    """Rows that probe the formats' edges: zeros, -0, constants, subnormal and huge values,
    exact halves, one outlier, and plain noise."""
    g = torch.Generator().manual_seed(seed)
    rows = [
        torch.zeros(32),
        -torch.zeros(32),
        torch.full((32,), 3.0),
        torch.full((32,), -1e-6),
        torch.randn(32, generator=g) * 1e-6,
        torch.randn(32, generator=g) * 6e4,                       # past float16 when scaled
        torch.arange(32.0) - 16,                                   # whole numbers, halves/127
        torch.arange(32.0) / 2 - 7.75,
        torch.cat([torch.randn(31, generator=g), torch.tensor([50.0])]),
        torch.cat([torch.tensor([-50.0]), torch.randn(31, generator=g)]),
        torch.linspace(-1, 1, 32),
        torch.randn(32, generator=g),
    ]
    return torch.stack(rows)


@pytest.mark.parametrize("type_name", TYPES)
def test_gguf_formats_equal_the_reference_byte_for_byte(type_name):
    g = torch.Generator().manual_seed(1)
    for x in (hard_blocks(), torch.randn(7, 96, generator=g) * 0.05,
              torch.randn(3, 2, 64, generator=g)):
        ours = quantize_gguf(x, type_name)
        theirs = reference(x, type_name)
        assert ours.dtype == torch.uint8 and tuple(ours.shape) == theirs.shape
        assert np.array_equal(ours.numpy(), theirs), type_name


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_block_sizes_and_round_trip_through_the_reference_dequantizer(type_name):
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(2))
    raw = quantize_gguf(x, type_name)
    assert raw.shape == (4, 128 // 32 * GGUF_BLOCK_BYTES[type_name])
    back = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[type_name])
    error = np.abs(back - x.numpy()).max()
    bound = {"Q8_0": 0.02, "Q4_0": 0.5, "Q4_1": 0.3}[type_name]     # a few units of x's scale
    assert 0 < error < bound


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_real_weights_of_smollm2_equal_the_reference(type_name, smollm2):
    tensor = smollm2["blk.0.attn_q.weight"]
    weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    x = torch.from_numpy(np.ascontiguousarray(weight[:64]))
    assert np.array_equal(quantize_gguf(x, type_name).numpy(), reference(x, type_name))


def test_requantizing_q4_1_values_gives_the_same_bytes(smollm2):
    """Most Q4_1 blocks of the file, dequantised and quantised again, come back as they were
    (where float16's rounding of d and m does not move a value across a level)."""
    tensor = smollm2["blk.0.ffn_down.weight"]
    raw = np.asarray(tensor.data)[:8]
    values = torch.from_numpy(gguf.quants.dequantize(raw, tensor.tensor_type))
    again = quantize_gguf(values, "Q4_1").numpy()
    same = (again == raw).all(axis=-1).mean()
    assert same > 0.5


def test_absmax_by_hand():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0]])
    q, scale = absmax_quantize(x, bits=8)
    assert scale.shape == () and torch.isclose(scale, torch.tensor(1 / 127))
    assert q.tolist() == [[64, -127, 32, 0]]                       # 63.5 -> 64 (half to even)
    torch.testing.assert_close(absmax_dequantize(q, scale), x, atol=0.5 / 127, rtol=0)


def test_zero_point_by_hand():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0]]) + 10.0
    q, scale, zero = zero_point_quantize(x, bits=4)
    assert torch.isclose(scale, torch.tensor(0.2)) and zero.item() == -50.0
    assert q.tolist() == [[0, 5, 10, 15]]
    torch.testing.assert_close(zero_point_dequantize(q, scale, zero), x)


@pytest.mark.parametrize("group", ["tensor", "row", "block"])
@pytest.mark.parametrize("bits", [8, 4])
def test_error_is_at_most_half_a_step_per_group(group, bits):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=g) * torch.rand(5, 1, generator=g) * 4
    q, scale = absmax_quantize(x, bits=bits, group=group)
    assert q.shape == x.shape and q.dtype == torch.int8
    shapes = {"tensor": (), "row": (5, 1), "block": (5, 2, 1)}
    assert tuple(scale.shape) == shapes[group]
    step = scale if group != "block" else scale.expand(5, 2, 32).reshape(5, 64)
    assert bool(((absmax_dequantize(q, scale) - x).abs() <= step / 2 + 1e-6).all())
    q, scale, zero = zero_point_quantize(x, bits=bits, group=group)
    assert q.dtype == torch.uint8 and int(q.max()) <= 2 ** bits - 1
    step = scale if group != "block" else scale.expand(5, 2, 32).reshape(5, 64)
    assert bool(((zero_point_dequantize(q, scale, zero) - x).abs() <= step / 2 + 1e-5).all())


def test_smaller_groups_err_less_around_an_outlier():
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    x[0, 0] = 40.0
    errors = {}
    for group in ("tensor", "row", "block"):
        q, scale = absmax_quantize(x, bits=4, group=group)
        errors[group] = (absmax_dequantize(q, scale) - x).pow(2).mean().item()
    assert errors["block"] < errors["row"] < errors["tensor"]


def test_zeros_and_constants_survive():
    for x in (torch.zeros(2, 32), torch.full((2, 32), 2.5)):
        q, scale = absmax_quantize(x, group="block")
        torch.testing.assert_close(absmax_dequantize(q, scale), x)
        q, scale, zero = zero_point_quantize(x, group="row")
        assert bool(torch.isfinite(zero_point_dequantize(q, scale, zero)).all())


def test_bad_input_is_refused_by_name():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        absmax_quantize(torch.arange(4))
    with pytest.raises(ValueError, match="bits must be between 2 and 8"):
        absmax_quantize(torch.randn(4), bits=16)
    with pytest.raises(ValueError, match="group must be one of"):
        zero_point_quantize(torch.randn(4), group="column")
    with pytest.raises(ValueError, match="blocks of 32"):
        absmax_quantize(torch.randn(2, 40), group="block")
    with pytest.raises(ValueError, match="NaN or inf"):
        absmax_quantize(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="Q4_1 stores rows in blocks of 32"):
        quantize_gguf(torch.randn(2, 40), "Q4_1")
    with pytest.raises(ValueError, match="Q8_0 cannot store"):
        quantize_gguf(torch.full((32,), float("inf")), "Q8_0")
    with pytest.raises(ValueError, match="type_name must be one of"):
        quantize_gguf(torch.randn(32), "Q4_K")
