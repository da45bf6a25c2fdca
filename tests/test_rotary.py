"""Rotary positions (minitransformer.rotary, chapter 14): the tables, the rotation, the property
that makes them positions (q_m . k_n depends only on m - n), and transformers' layout."""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.rotary import apply_rotary, rotary_angles, rotate_half  # noqa: E402


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def test_the_tables_hold_the_angles_of_the_equation():
    cos, sin = rotary_angles(5, 8, offset=3, theta=100.0, dtype=torch.float64)
    assert cos.shape == sin.shape == (5, 8)
    for m in range(5):
        for i in range(8):
            angle = (3 + m) * 100.0 ** (-2 * (i % 4) / 8)      # i and i + d/2 share an angle
            assert cos[m, i].item() == pytest.approx(math.cos(angle), abs=1e-12)
            assert sin[m, i].item() == pytest.approx(math.sin(angle), abs=1e-12)


def test_an_offset_gives_the_rows_of_the_longer_table():
    cos, sin = rotary_angles(4, 6, offset=7)
    full_cos, full_sin = rotary_angles(11, 6)
    torch.testing.assert_close(cos, full_cos[7:], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, full_sin[7:], rtol=0, atol=1e-6)


def test_defaults_dtype_device_and_empty_tables():
    cos, sin = rotary_angles(3, 4)
    assert cos.dtype == torch.get_default_dtype() and cos.device.type == "cpu"
    assert rotary_angles(0, 4)[0].shape == (0, 4)
    half, _ = rotary_angles(3, 4, dtype=torch.float16)
    assert half.dtype == torch.float16


def test_low_precision_tables_are_computed_in_float32_first():
    # position 1000 in bfloat16 is already off by 4: the angles must be formed in float32
    cos, _ = rotary_angles(1, 8, offset=1000, dtype=torch.bfloat16)
    exact, _ = rotary_angles(1, 8, offset=1000, dtype=torch.float64)
    assert (cos.double() - exact).abs().max() < 1e-2


def test_rotate_half_turns_each_pair_by_90_degrees():
    x = torch.arange(1.0, 7.0)                                   # pairs (1, 4), (2, 5), (3, 6)
    assert rotate_half(x).tolist() == [-4.0, -5.0, -6.0, 1.0, 2.0, 3.0]


def test_a_rotation_keeps_lengths_and_position_zero_changes_nothing():
    x = randn(2, 3, 5, 8)
    cos, sin = rotary_angles(5, 8, dtype=torch.float64)
    turned = apply_rotary(x, cos, sin)
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(turned[:, :, 0], x[:, :, 0])
    assert not torch.allclose(turned[:, :, 1:], x[:, :, 1:])


def test_each_pair_turns_as_a_2d_rotation_of_dimensions_i_and_i_plus_half():
    d, m = 8, 3
    x = randn(1, 1, 1, d)
    cos, sin = rotary_angles(1, d, offset=m, dtype=torch.float64)
    turned = apply_rotary(x, cos, sin)[0, 0, 0]
    for i in range(d // 2):
        angle = m * 10000.0 ** (-2 * i / d)
        rotation = torch.tensor([[math.cos(angle), -math.sin(angle)],
                                 [math.sin(angle), math.cos(angle)]], dtype=torch.float64)
        pair = x[0, 0, 0, [i, i + d // 2]]
        torch.testing.assert_close(turned[[i, i + d // 2]], rotation @ pair)


def test_query_key_products_depend_only_on_the_distance():
    d = 16
    q, k = randn(d, seed=1), randn(d, seed=2)

    def product(m: int, n: int) -> float:
        cos_m, sin_m = rotary_angles(1, d, offset=m, dtype=torch.float64)
        cos_n, sin_n = rotary_angles(1, d, offset=n, dtype=torch.float64)
        q_m = apply_rotary(q.view(1, 1, 1, d), cos_m, sin_m)
        k_n = apply_rotary(k.view(1, 1, 1, d), cos_n, sin_n)
        return float((q_m * k_n).sum())

    for distance in (0, 1, 5, 17):
        values = [product(n + distance, n) for n in (0, 3, 40, 1000)]
        assert max(values) - min(values) < 1e-9, (distance, values)
    assert abs(product(5, 0) - product(6, 0)) > 1e-3            # and the distance matters


@pytest.mark.parametrize("call", [lambda: rotary_angles(4, 7),
                                  lambda: apply_rotary(torch.zeros(1, 1, 4, 7),
                                                       torch.zeros(4, 7), torch.zeros(4, 7))])
def test_an_odd_head_dim_is_refused_by_name(call):
    with pytest.raises(ValueError, match="head_dim must be even.*head_dim=7"):
        call()


def test_bad_arguments():
    with pytest.raises(ValueError, match="offset"):
        rotary_angles(3, 4, offset=-1)
    with pytest.raises(ValueError, match="theta"):
        rotary_angles(3, 4, theta=0.0)
    with pytest.raises(TypeError, match="dtype"):
        rotary_angles(3, 4, dtype=torch.int64)
    x = torch.zeros(1, 2, 3, 4)
    cos, sin = rotary_angles(5, 4)
    with pytest.raises(ValueError, match=r"cos must have shape \(T, head_dim\)"):
        apply_rotary(x, cos, sin)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        apply_rotary(torch.zeros(1, 2, 3, 4, dtype=torch.long), *rotary_angles(3, 4))


def test_equal_to_transformers_rotary_embedding_and_rotation():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=2,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 500.0})
    x = torch.randn(2, 2, 9, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(4, 13)[None]                          # offset 4
    their_cos, their_sin = modeling_llama.LlamaRotaryEmbedding(config)(x, positions)
    cos, sin = rotary_angles(9, 16, offset=4, theta=500.0)
    assert torch.equal(cos, their_cos[0]) and torch.equal(sin, their_sin[0])
    theirs, _ = modeling_llama.apply_rotary_pos_emb(x, x, their_cos, their_sin)
    assert torch.equal(apply_rotary(x, cos, sin), theirs)
    assert torch.equal(rotate_half(x), modeling_llama.rotate_half(x))


def test_exported_at_the_top():
    assert mt.rotary_angles is rotary_angles and mt.apply_rotary is apply_rotary
    assert mt.rotate_half is rotate_half
