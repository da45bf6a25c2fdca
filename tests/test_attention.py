"""scaled_dot_product_attention and MultiHeadAttention (chapters 6 and 7) equal PyTorch's own."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from minitransformer import (
    MultiHeadAttention,
    blocked_attention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from minitransformer.attention import QUERY_BLOCK

# float32 at assert_close's defaults, float64 at 1e-12.
TOLERANCES = {torch.float32: {}, torch.float64: {"atol": 1e-12, "rtol": 1e-12}}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64])


def close(actual, expected, dtype):
    torch.testing.assert_close(actual, expected, **TOLERANCES[dtype])


def random_qkv(batch, L, S, E, Ev, dtype, seed=0, device="cpu"):
    """Drawn on the CPU, then moved: the same numbers on every device."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, e, generator=generator, dtype=dtype).to(device)
                 for n, e in ((L, E), (S, E), (S, Ev)))


def random_bool_mask(shape, seed=0, device="cpu"):
    """A random boolean mask in which every query row keeps at least one key."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(*shape, generator=generator) < 0.6
    mask[..., 0] = True
    return mask.to(device)


# --- scaled_dot_product_attention against F.scaled_dot_product_attention --------------------

SHAPES = [  # (batch dims, L, S, E, Ev)
    ((), 5, 5, 8, 8),
    ((3,), 4, 7, 16, 5),
    ((2, 3), 6, 9, 8, 12),
    ((2, 4), 1, 3, 4, 4),
    ((1, 2, 2), 3, 5, 6, 2),
    ((2, 2), QUERY_BLOCK + 45, 70, 8, 8),            # several query blocks, the last one short
    ((2,), 2 * QUERY_BLOCK, 2 * QUERY_BLOCK + 3, 4, 4),
]


@DTYPES
@pytest.mark.parametrize("batch, L, S, E, Ev", SHAPES)
def test_sdpa_equals_pytorch_without_mask(batch, L, S, E, Ev, dtype, device):
    q, k, v = random_qkv(batch, L, S, E, Ev, dtype, device=device)
    close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), dtype)


@DTYPES
@pytest.mark.parametrize("batch, L, S, E, Ev", SHAPES)
def test_sdpa_equals_pytorch_with_boolean_mask(batch, L, S, E, Ev, dtype, device):
    q, k, v = random_qkv(batch, L, S, E, Ev, dtype, seed=1, device=device)
    mask = random_bool_mask((*batch, L, S), seed=2, device=device)
    close(scaled_dot_product_attention(q, k, v, mask),
          F.scaled_dot_product_attention(q, k, v, mask), dtype)


@DTYPES
@pytest.mark.parametrize("batch, L, S, E, Ev", SHAPES)
def test_sdpa_equals_pytorch_with_float_mask_and_scale(batch, L, S, E, Ev, dtype):
    q, k, v = random_qkv(batch, L, S, E, Ev, dtype, seed=3)
    generator = torch.Generator().manual_seed(4)
    bias = torch.randn(L, S, generator=generator, dtype=dtype)
    bias[:, 1:] = bias[:, 1:].masked_fill(torch.rand(L, S - 1, generator=generator) < 0.3,
                                          float("-inf")) if S > 1 else bias[:, 1:]
    close(scaled_dot_product_attention(q, k, v, bias, scale=0.37),
          F.scaled_dot_product_attention(q, k, v, bias, scale=0.37), dtype)


@DTYPES
@pytest.mark.parametrize("mask_shape", [(9,), (1, 9), (6, 9), (2, 1, 1, 9), (1, 3, 6, 9), (2, 3, 1, 9)])
def test_sdpa_masks_broadcast_like_pytorch(mask_shape, dtype):
    q, k, v = random_qkv((2, 3), 6, 9, 8, 4, dtype, seed=5)
    mask = random_bool_mask(mask_shape, seed=6)
    theirs = mask if mask.ndim >= 2 else mask[None]   # PyTorch wants at least (1, S)
    close(scaled_dot_product_attention(q, k, v, mask),
          F.scaled_dot_product_attention(q, k, v, theirs), dtype)


@pytest.mark.parametrize("L", [5, QUERY_BLOCK + 7])
def test_sdpa_values_with_more_batch_dimensions_than_the_scores(L, recwarn):
    # query and key share one batch entry, value has three: the scores are (1, L, S).
    q, k, _ = random_qkv((1,), L, 6, 4, 2, torch.float64, seed=12)
    v = torch.randn(3, 6, 2, dtype=torch.float64)
    mask = random_bool_mask((L, 6), seed=13)
    close(scaled_dot_product_attention(q, k, v, mask),
          F.scaled_dot_product_attention(q, k, v, mask), torch.float64)
    assert not [w for w in recwarn if "resized" in str(w.message)]


@DTYPES
@pytest.mark.parametrize("L, S", [(5, 5), (3, 8), (QUERY_BLOCK + 10, QUERY_BLOCK + 30)])
def test_sdpa_with_lower_right_causal_mask_equals_pytorch(L, S, dtype, device):
    q, k, v = random_qkv((2, 2), L, S, 8, 8, dtype, seed=7, device=device)
    mask = causal_mask(L, S, device=device)
    close(scaled_dot_product_attention(q, k, v, mask),
          F.scaled_dot_product_attention(q, k, v, mask), dtype)
    if L == S:  # PyTorch's is_causal is the same mask when the lengths agree
        close(scaled_dot_product_attention(q, k, v, causal_mask(L, device=device)),
              F.scaled_dot_product_attention(q, k, v, is_causal=True), dtype)


def test_sdpa_gradients_equal_pytorch(device):
    q, k, v = random_qkv((2, 2), QUERY_BLOCK + 5, 11, 8, 4, torch.float64, seed=8, device=device)
    mask = random_bool_mask((QUERY_BLOCK + 5, 11), seed=9, device=device)
    grads = []
    for attend in (scaled_dot_product_attention, F.scaled_dot_product_attention):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        (attend(*inputs, mask) ** 2).sum().backward()
        grads.append([t.grad for t in inputs])
    for ours, theirs in zip(*grads):
        close(ours, theirs, torch.float64)


def test_sdpa_returns_the_weights_it_used():
    q, k, v = random_qkv((2,), 4, 6, 8, 3, torch.float64, seed=10)
    output, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert weights.shape == (2, 4, 6)
    close(weights, torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1), torch.float64)
    close(output, weights @ v, torch.float64)


def test_sdpa_on_a_hand_computed_example():
    # Scores q.k / sqrt(2) = [2, 0] / sqrt(2); softmax of two scores is a logistic of their gap.
    q = torch.tensor([[1.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    v = torch.tensor([[10.0], [20.0]])
    output, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    first = 1 / (1 + math.exp(-2 / math.sqrt(2)))
    assert weights[0].tolist() == pytest.approx([first, 1 - first])
    assert output.item() == pytest.approx(10 * first + 20 * (1 - first))


def test_sdpa_uniform_scores_average_the_values():
    q = torch.zeros(3, 4)
    k, v = torch.randn(5, 4), torch.randn(5, 2)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), v.mean(0).expand(3, 2))


def test_sdpa_dropout_zeroes_and_rescales_weights():
    q, k, v = random_qkv((2, 2), 16, 16, 8, 8, torch.float64, seed=11)
    _, clean = scaled_dot_product_attention(q, k, v, return_weights=True)
    _ = torch.manual_seed(0)
    output, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.5, return_weights=True)
    dropped = weights == 0
    assert 0.3 < dropped.float().mean().item() < 0.7
    close(weights[~dropped], clean[~dropped] * 2, torch.float64)
    close(output, weights @ v, torch.float64)


def test_sdpa_without_queries_returns_empty_tensors():
    q, k, v = random_qkv((2,), 0, 5, 4, 3, torch.float32)
    output, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert output.shape == (2, 0, 3) and weights.shape == (2, 0, 5)


# --- properties --------------------------------------------------------------------------

sizes = st.integers(1, 6)


@settings(max_examples=40, deadline=None)
@given(L=sizes, S=sizes, E=sizes, heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_weights_are_probabilities_and_masked_keys_get_exactly_zero(L, S, E, heads, seed):
    q, k, v = random_qkv((heads,), L, S, E, 2, torch.float64, seed=seed)
    mask = random_bool_mask((heads, L, S), seed=seed)
    _, weights = scaled_dot_product_attention(q * 10, k, v, mask, return_weights=True)
    assert (weights >= 0).all()
    close(weights.sum(-1), torch.ones(heads, L, dtype=torch.float64), torch.float64)
    assert (weights[~mask] == 0).all()


@settings(max_examples=40, deadline=None)
@given(L=sizes, S=st.integers(2, 8), E=sizes, seed=st.integers(0, 2**16))
def test_permuting_keys_and_values_together_changes_nothing(L, S, E, seed):
    q, k, v = random_qkv((2,), L, S, E, 3, torch.float64, seed=seed)
    order = torch.randperm(S, generator=torch.Generator().manual_seed(seed))
    close(scaled_dot_product_attention(q, k[:, order], v[:, order]),
          scaled_dot_product_attention(q, k, v), torch.float64)


# --- errors ------------------------------------------------------------------------------

def test_sdpa_all_masked_row_is_a_clear_error_not_nan():
    q, k, v = random_qkv((2,), 3, 4, 8, 8, torch.float32)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(ValueError, match=r"^query 1 has every key masked"):
        scaled_dot_product_attention(q, k, v, mask)
    bias = torch.zeros(3, 4)
    bias[2] = float("-inf")
    with pytest.raises(ValueError, match=r"^query 2 has every key masked"):
        scaled_dot_product_attention(q, k, v, bias)


@pytest.mark.parametrize("attend", [scaled_dot_product_attention, blocked_attention])
def test_all_masked_row_in_a_later_block_names_its_position(attend):
    L = QUERY_BLOCK + 10
    q, k, v = random_qkv((), L, 4, 8, 8, torch.float32)
    mask = torch.ones(L, 4, dtype=torch.bool)
    mask[QUERY_BLOCK + 3] = False
    with pytest.raises(ValueError, match=rf"query {QUERY_BLOCK + 3} has every key masked"):
        attend(q, k, v, mask)
    batched = torch.ones(2, 3, L, 4, dtype=torch.bool)
    batched[1, 2, 5] = False
    with pytest.raises(ValueError, match=r"query 5 of attn_mask batch/head index \(1, 2\) has every"):
        attend(q.expand(2, 3, L, 8), k, v, batched)


def test_sdpa_rejects_bad_inputs():
    q, k, v = random_qkv((2,), 3, 4, 8, 5, torch.float32)
    cases = [
        ((q, k[..., :6], v), {}, ValueError,
         r"query and key must have the same last dimension, got query \(2, 3, 8\) and key \(2, 4, 6\)"),
        ((q, k, v[:, :3]), {}, ValueError,
         r"key and value must have the same number of positions \(dim -2\), got key \(2, 4, 8\) "
         r"and value \(2, 3, 5\)"),
        ((q, k[:, :0], v[:, :0]), {}, ValueError, r"key has no positions"),
        ((q.expand(3, 2, 3, 8), k.expand(4, 2, 4, 8), v), {}, ValueError,
         r"leading \(batch, head\) dimensions of query \(3, 2, 3, 8\), key \(4, 2, 4, 8\) and value "
         r"\(2, 4, 5\) do not broadcast"),
        ((q[0, 0], k, v), {}, ValueError, r"query must have at least 2 dimensions, got shape \(8,\)"),
        ((q, k, v, torch.ones(3, 5, dtype=torch.bool)), {}, ValueError,
         r"attn_mask of shape \(3, 5\) does not broadcast to the scores \(\.\.\., T_q, T_k\) = \(2, 3, 4\)"),
        ((q, k, v, torch.ones(7, 2, 3, 4, dtype=torch.bool)), {}, ValueError,
         r"attn_mask of shape \(7, 2, 3, 4\) does not broadcast"),
        ((q, k, v, torch.ones(3, 4, dtype=torch.long)), {}, TypeError,
         r"attn_mask must be boolean .* got dtype torch.int64"),
        ((q, k, v, [[True] * 4] * 3), {}, TypeError, r"attn_mask must be a tensor, got list"),
        ((q.long(), k, v), {}, TypeError, r"query must be a floating-point tensor, got a tensor of dtype torch.int64"),
        ((q, k.tolist(), v), {}, TypeError, r"key must be a floating-point tensor, got list"),
        ((q, k.double(), v), {}, TypeError, r"query, key, value must have the same dtype, got query torch.float32, key torch.float64"),
        ((q, k, v), {"dropout_p": 1.0}, ValueError, r"dropout_p must be a number in \[0, 1\), got 1.0"),
        ((q, k, v), {"dropout_p": -0.1}, ValueError, r"dropout_p must be a number in \[0, 1\)"),
        ((q, k, v), {"scale": "big"}, TypeError, r"scale must be a number, got str"),
        ((q, k, v, torch.zeros(3, 4, dtype=torch.float64)), {}, TypeError,
         r"query, attn_mask must have the same dtype, got query torch.float32, attn_mask torch.float64"),
        ((q, k, v), {"dropout_p": "0.1"}, TypeError, r"dropout_p must be a number in \[0, 1\), got str"),
    ]
    for args, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            scaled_dot_product_attention(*args, **kwargs)


# --- MultiHeadAttention against nn.MultiheadAttention ---------------------------------------

D_MODEL, HEADS = 16, 4


def torch_and_ours(dtype, bias=True, seed=0, device="cpu"):
    """Both modules made on the CPU, then moved: the same weights on every device."""
    _ = torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(D_MODEL, HEADS, bias=bias, batch_first=True, dtype=dtype).eval()
    if bias:  # PyTorch starts its biases at zero; random ones test that they are copied
        with torch.no_grad():
            theirs.in_proj_bias.normal_()
            theirs.out_proj.bias.normal_()
    return theirs.to(device), MultiHeadAttention.from_torch(theirs).to(device)


def check_both_paths(ours, theirs, dtype, ours_args, ours_kwargs, theirs_args, theirs_kwargs):
    expected, expected_weights = theirs(*theirs_args, need_weights=True,
                                        average_attn_weights=False, **theirs_kwargs)
    close(ours(*ours_args, **ours_kwargs), expected, dtype)                     # fused path
    output, weights = ours(*ours_args, return_weights=True, **ours_kwargs)     # written-out path
    close(output, expected, dtype)
    close(weights, expected_weights, dtype)


@DTYPES
@pytest.mark.parametrize("bias", [True, False])
def test_mha_self_attention_equals_pytorch(dtype, bias, device):
    theirs, ours = torch_and_ours(dtype, bias, device=device)
    x = torch.randn(3, 7, D_MODEL, dtype=dtype).to(device)
    check_both_paths(ours, theirs, dtype, (x,), {}, (x, x, x), {})


@DTYPES
def test_mha_causal_self_attention_equals_pytorch(dtype, device):
    theirs, ours = torch_and_ours(dtype, seed=1, device=device)
    x = torch.randn(2, 6, D_MODEL, dtype=dtype).to(device)
    mask = causal_mask(6, device=device)
    # nn.MultiheadAttention's masks mean the opposite: True = masked.
    check_both_paths(ours, theirs, dtype, (x,), {"attn_mask": mask}, (x, x, x), {"attn_mask": ~mask})


@DTYPES
def test_mha_cross_attention_with_padding_equals_pytorch(dtype, device):
    theirs, ours = torch_and_ours(dtype, seed=2, device=device)
    query = torch.randn(2, 3, D_MODEL, dtype=dtype).to(device)
    memory = torch.randn(2, 5, D_MODEL, dtype=dtype).to(device)
    tokens = torch.tensor([[4, 8, 15, 0, 0], [16, 23, 42, 7, 0]], device=device)
    check_both_paths(ours, theirs, dtype, (query, memory, memory), {"attn_mask": padding_mask(tokens, 0)},
                     (query, memory, memory), {"key_padding_mask": tokens == 0})


@DTYPES
def test_mha_cross_attention_with_distinct_values_and_float_mask_equals_pytorch(dtype):
    theirs, ours = torch_and_ours(dtype, seed=3)
    query = torch.randn(2, 4, D_MODEL, dtype=dtype)
    key, value = torch.randn(2, 6, D_MODEL, dtype=dtype), torch.randn(2, 6, D_MODEL, dtype=dtype)
    bias = torch.randn(4, 6, dtype=dtype)
    check_both_paths(ours, theirs, dtype, (query, key, value), {"attn_mask": bias},
                     (query, key, value), {"attn_mask": bias})


@DTYPES
def test_mha_per_batch_and_head_mask_equals_pytorch(dtype):
    theirs, ours = torch_and_ours(dtype, seed=4)
    x = torch.randn(2, 5, D_MODEL, dtype=dtype)
    mask = random_bool_mask((2, HEADS, 5, 5), seed=5)
    check_both_paths(ours, theirs, dtype, (x,), {"attn_mask": mask},
                     (x, x, x), {"attn_mask": ~mask.reshape(2 * HEADS, 5, 5)})


def test_mha_from_torch_of_a_sequence_first_module():
    _ = torch.manual_seed(5)
    theirs = nn.MultiheadAttention(D_MODEL, HEADS).eval()          # batch_first=False
    ours = MultiHeadAttention.from_torch(theirs)
    x = torch.randn(2, 5, D_MODEL)
    expected = theirs(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))[0].transpose(0, 1)
    torch.testing.assert_close(ours(x), expected)


@DTYPES
def test_mha_round_trip_through_torch(dtype):
    ours = MultiHeadAttention(D_MODEL, HEADS, dropout=0.25, dtype=dtype)
    theirs = ours.to_torch()
    assert isinstance(theirs, nn.MultiheadAttention) and theirs.batch_first
    assert theirs.dropout == 0.25 and theirs.in_proj_weight.dtype == dtype
    back = MultiHeadAttention.from_torch(theirs)
    assert back.dropout == 0.25 and back.training
    for name, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    ours.eval(), theirs.eval()
    x = torch.randn(2, 5, D_MODEL, dtype=dtype)
    close(ours(x), theirs(x, x, x, need_weights=False)[0], dtype)


def test_mha_round_trip_without_bias():
    ours = MultiHeadAttention(D_MODEL, HEADS, bias=False)
    theirs = ours.to_torch()
    assert theirs.in_proj_bias is None and theirs.out_proj.bias is None
    back = MultiHeadAttention.from_torch(theirs)
    assert back.q_proj.bias is None and back.out_proj.bias is None


def test_mha_has_the_documented_sub_modules_and_parameter_count():
    mha = MultiHeadAttention(512, 8)
    assert [name for name, _ in mha.named_children()] == ["q_proj", "k_proj", "v_proj", "out_proj"]
    assert all(isinstance(m, nn.Linear) and m.weight.shape == (512, 512) for m in mha.children())
    assert mha.d_k == 64
    assert sum(p.numel() for p in mha.parameters()) == 4 * 512 * 512 + 4 * 512
    assert sum(p.numel() for p in mha.parameters()) == sum(
        p.numel() for p in nn.MultiheadAttention(512, 8).parameters())


def test_mha_split_and_merge_heads_are_inverse():
    mha = MultiHeadAttention(12, 3)
    x = torch.arange(2 * 4 * 12.0).reshape(2, 4, 12)
    heads = mha.split_heads(x)
    assert heads.shape == (2, 3, 4, 4)
    assert heads[0, 1, 0].tolist() == [4.0, 5.0, 6.0, 7.0]   # head 1 holds features 4..7
    assert torch.equal(mha.merge_heads(heads), x)


def test_mha_dropout_acts_only_in_training():
    _ = torch.manual_seed(6)
    mha = MultiHeadAttention(D_MODEL, HEADS, dropout=0.5)
    x = torch.randn(2, 8, D_MODEL)
    _, weights = mha(x, return_weights=True)
    assert (weights == 0).any()
    assert not torch.allclose(mha(x), mha(x))
    mha.eval()
    torch.testing.assert_close(mha(x), mha(x))
    _, weights = mha(x, return_weights=True)
    assert (weights > 0).all()


def test_mha_gradients_flow_through_both_paths():
    mha = MultiHeadAttention(D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL)
    for return_weights in (False, True):
        mha.zero_grad()
        result = mha(x, attn_mask=causal_mask(5), return_weights=return_weights)
        output = result[0] if return_weights else result
        output.square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.parameters())


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((10, 3), {}, ValueError, r"d_model must be divisible by num_heads, got d_model=10 and num_heads=3"),
    ((0, 1), {}, ValueError, r"d_model must be at least 1, got 0"),
    ((8, 0), {}, ValueError, r"num_heads must be at least 1, got 0"),
    ((8.0, 2), {}, TypeError, r"d_model must be an int, got float \(8.0\)"),
    ((8, 2), {"dropout": "0.1"}, TypeError, r"dropout must be a number in \[0, 1\), got str"),
    ((8, 2), {"dtype": torch.int64}, TypeError, r"dtype must be a floating-point torch.dtype"),
    ((8, 2), {"dropout": 1.0}, ValueError, r"dropout must be a number in \[0, 1\), got 1.0"),
])
def test_mha_rejects_bad_construction(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(*args, **kwargs)


def test_mha_forward_rejects_bad_inputs():
    mha = MultiHeadAttention(D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL)
    memory = torch.randn(2, 7, D_MODEL)
    cases = [
        ((torch.randn(2, 5, 8),), {}, ValueError, r"query must have shape \(B, T, d_model=16\), got \(2, 5, 8\)"),
        ((torch.randn(5, D_MODEL),), {}, ValueError, r"query must have shape .* got \(5, 16\)"),
        ((x, torch.randn(3, 7, D_MODEL)), {}, ValueError,
         r"same batch size, got query \(2, 5, 16\), key \(3, 7, 16\) and value \(3, 7, 16\)"),
        ((x, memory, memory[:, :6]), {}, ValueError,
         r"key and value must have the same length, got key \(2, 7, 16\) and value \(2, 6, 16\)"),
        ((x, memory[:, :0]), {}, ValueError, r"key has no positions"),
        ((x.long(),), {}, TypeError, r"query must be a floating-point tensor, got a tensor of dtype torch.int64"),
        ((x, memory.double()), {}, TypeError, r"query, key, value must have the same dtype"),
        ((x,), {"attn_mask": causal_mask(5).float()}, ValueError, r"only 0s and 1s.*attn_mask.bool\(\)"),
        ((x, memory), {"attn_mask": causal_mask(5)}, ValueError,
         r"attn_mask of shape \(5, 5\) does not broadcast to the scores \(B, num_heads, T_q, T_k\) = \(2, 4, 5, 7\)"),
        ((x,), {"attn_mask": torch.ones(2, 5, 5, 5, dtype=torch.bool)}, ValueError,
         r"attn_mask of shape \(2, 5, 5, 5\) does not broadcast"),
    ]
    for args, kwargs, error, match in cases:
        for return_weights in (False, True):
            with pytest.raises(error, match=match):
                mha(*args, return_weights=return_weights, **kwargs)


@pytest.mark.parametrize("return_weights", [False, True])
def test_mha_all_masked_row_is_a_clear_error_on_both_paths(return_weights):
    mha = MultiHeadAttention(D_MODEL, HEADS)
    memory = torch.randn(2, 3, D_MODEL)
    tokens = torch.tensor([[1, 2, 0], [0, 0, 0]])            # the second sentence is all padding
    with pytest.raises(ValueError, match=r"every key"):
        mha(torch.randn(2, 4, D_MODEL), memory, attn_mask=padding_mask(tokens, 0),
            return_weights=return_weights)
    bias = torch.zeros(4, 3)
    bias[3] = float("-inf")
    with pytest.raises(ValueError, match=r"every key"):
        mha(torch.randn(2, 4, D_MODEL), memory, attn_mask=bias, return_weights=return_weights)


def test_from_torch_rejects_what_it_cannot_copy():
    with pytest.raises(TypeError, match=r"expects an nn.MultiheadAttention, got Linear"):
        MultiHeadAttention.from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"kdim == vdim == embed_dim, got kdim=8, vdim=16"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(D_MODEL, HEADS, kdim=8))
    with pytest.raises(ValueError, match=r"add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(D_MODEL, HEADS, add_bias_kv=True))
    with pytest.raises(ValueError, match=r"add_bias_kv or add_zero_attn"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(D_MODEL, HEADS, add_zero_attn=True))


# --- blocked_attention (chapter 7): the same numbers, a slice of the scores at a time ---------

@pytest.mark.parametrize("batch, L, S, E, Ev", SHAPES)
@pytest.mark.parametrize("query_block", [1, 7, QUERY_BLOCK])
def test_blocked_attention_equals_pytorch_in_float64(batch, L, S, E, Ev, query_block, device):
    q, k, v = random_qkv(batch, L, S, E, Ev, torch.float64, seed=20, device=device)
    mask = random_bool_mask((*batch, L, S), seed=21, device=device)
    bias = torch.zeros(L, S, dtype=torch.float64, device=device).masked_fill(
        ~random_bool_mask((L, S), 22, device=device), float("-inf"))
    last_row = causal_mask(min(L, S), S, device=device)[-1:].expand(L, S)
    for attn_mask in (None, mask, bias, last_row):
        for scale in (None, 0.3):
            close(blocked_attention(q, k, v, attn_mask, scale=scale, query_block=query_block),
                  F.scaled_dot_product_attention(q, k, v, attn_mask, scale=scale), torch.float64)


@DTYPES
@pytest.mark.parametrize("L, S", [(5, 5), (3, 8), (QUERY_BLOCK + 10, QUERY_BLOCK + 30)])
def test_blocked_attention_with_causal_mask_equals_the_reference(L, S, dtype):
    q, k, v = random_qkv((2, 2), L, S, 8, 8, dtype, seed=23)
    close(blocked_attention(q, k, v, causal_mask(L, S)),
          scaled_dot_product_attention(q, k, v, causal_mask(L, S)), dtype)


def test_blocked_attention_gradients_equal_pytorch():
    q, k, v = random_qkv((2, 2), QUERY_BLOCK + 5, 11, 8, 4, torch.float64, seed=24)
    mask = random_bool_mask((QUERY_BLOCK + 5, 11), seed=25)
    grads = []
    for attend in (blocked_attention, F.scaled_dot_product_attention):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        (attend(*inputs, mask) ** 2).sum().backward()
        grads.append([t.grad for t in inputs])
    for ours, theirs in zip(*grads):
        close(ours, theirs, torch.float64)


def test_blocked_attention_values_broadcast_and_empty_queries(recwarn):
    q, k, _ = random_qkv((1,), QUERY_BLOCK + 7, 6, 4, 2, torch.float64, seed=26)
    v = torch.randn(3, 6, 2, dtype=torch.float64)
    close(blocked_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), torch.float64)
    assert not [w for w in recwarn if "resized" in str(w.message)]
    assert blocked_attention(q[:, :0], k, v).shape == (3, 0, 2)


def test_blocked_attention_rejects_what_the_reference_rejects():
    q, k, v = random_qkv((2,), 3, 4, 8, 5, torch.float32)
    with pytest.raises(ValueError, match=r"query and key must have the same last dimension"):
        blocked_attention(q, k[..., :6], v)
    with pytest.raises(ValueError, match=r"query_block must be at least 1, got 0"):
        blocked_attention(q, k, v, query_block=0)
    with pytest.raises(TypeError, match=r"query_block must be an int, got float"):
        blocked_attention(q, k, v, query_block=2.0)
    with pytest.raises(TypeError, match=r"takes from 3 to 4 positional arguments"):
        blocked_attention(q, k, v, None, 0.5)          # scale is keyword-only


def test_the_reference_has_no_blocks_and_is_short():
    import inspect
    source = inspect.getsource(scaled_dot_product_attention)
    body = source.split('"""')[2]                     # after the docstring
    code = [line for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 16, code
    assert "_check_attention(" in code[0]
    for trick in ("QUERY_BLOCK", "out=", "_(", "for "):
        assert trick not in body, trick


# --- floating masks of 0s and 1s are boolean masks in the wrong dtype -------------------------

def test_float_zero_one_mask_is_an_error_that_suggests_bool_everywhere():
    q, k, v = random_qkv((2,), 4, 4, 8, 8, torch.float32)
    zero_one = causal_mask(4).float()
    message = r"floating mask of only 0s and 1s.*pass attn_mask\.bool\(\)"
    for attend in (scaled_dot_product_attention, blocked_attention):
        with pytest.raises(ValueError, match=message):
            attend(q, k, v, zero_one)
        # what the message suggests works, and so does an additive 0/-inf mask
        additive = torch.zeros(4, 4).masked_fill(~causal_mask(4), float("-inf"))
        close(attend(q, k, v, zero_one.bool()), attend(q, k, v, additive), torch.float32)
    mha = MultiHeadAttention(8, 2)
    for return_weights in (False, True):
        with pytest.raises(ValueError, match=message):
            mha(q, attn_mask=zero_one, return_weights=return_weights)
    # all zeros is a valid additive mask (it hides nothing)
    close(scaled_dot_product_attention(q, k, v, torch.zeros(4, 4)),
          scaled_dot_product_attention(q, k, v), torch.float32)


# --- MultiHeadAttention: keyword-only mask, validation once, unchecked attend -----------------

def test_mha_attn_mask_is_keyword_only():
    mha = MultiHeadAttention(D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(TypeError, match=r"positional argument"):
        mha(x, x, x, causal_mask(5))       # nn.MultiheadAttention's 4th is key_padding_mask


@pytest.mark.parametrize("return_weights", [False, True])
def test_mha_validates_once_per_forward(monkeypatch, return_weights):
    from minitransformer import _checks
    import minitransformer.attention as attention
    calls = {"check_mask": 0, "check_float_tensor": 0, "_check_attention": 0}
    for name in calls:
        module = attention
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    mha = MultiHeadAttention(D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL)
    mha(x, attn_mask=causal_mask(5), return_weights=return_weights)
    assert calls == {"check_mask": 1, "check_float_tensor": 3, "_check_attention": 0}
    assert _checks.check_mask is not attention.check_mask      # the counter was in place


def test_mha_attend_does_not_validate_and_equals_forward(monkeypatch):
    import minitransformer.attention as attention

    def fail(*args, **kwargs):
        raise AssertionError("attend must not validate")
    mha = MultiHeadAttention(D_MODEL, HEADS).eval()
    x, memory = torch.randn(2, 5, D_MODEL), torch.randn(2, 7, D_MODEL)
    mask = padding_mask(torch.tensor([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), 0)
    expected = mha(x, memory, attn_mask=mask)
    expected_weights = mha(x, memory, attn_mask=mask, return_weights=True)[1]
    for name in ("check_mask", "check_float_tensor", "check_same_dtype", "_check_attention"):
        monkeypatch.setattr(attention, name, fail)
    monkeypatch.setattr(MultiHeadAttention, "_check_inputs", fail)
    torch.testing.assert_close(mha.attend(x, memory, memory, attn_mask=mask), expected)
    output, weights = mha.attend(x, memory, memory, attn_mask=mask, return_weights=True)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(weights, expected_weights)


def test_mha_attend_takes_the_mask_by_keyword_only():
    mha = MultiHeadAttention(D_MODEL, HEADS)
    x = torch.randn(2, 5, D_MODEL)
    with pytest.raises(TypeError, match=r"positional argument"):
        mha.attend(x, x, x, causal_mask(5))


def test_mha_dropout_paths_both_drop_in_training():
    # The fused path (no weights) and the written-out one draw different dropout masks, but both
    # drop and both rescale: averaged over many draws they agree with the eval output.
    _ = torch.manual_seed(7)
    mha = MultiHeadAttention(D_MODEL, HEADS, dropout=0.3, dtype=torch.float64)
    x = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    fused = torch.stack([mha(x) for _ in range(400)]).mean(0)
    written = torch.stack([mha(x, return_weights=True)[0] for _ in range(400)]).mean(0)
    expected = mha.eval()(x)
    torch.testing.assert_close(fused, expected, atol=0.05, rtol=0)
    torch.testing.assert_close(written, expected, atol=0.05, rtol=0)


# --- attend with keys and values already projected (a decoder's cross-attention, chapter 10) --

def test_mha_project_kv_is_the_projection_attend_makes():
    mha = MultiHeadAttention(D_MODEL, HEADS)
    key, value = torch.randn(2, 7, D_MODEL), torch.randn(2, 7, D_MODEL)
    keys, values = mha.project_kv(key, value)
    assert keys.shape == values.shape == (2, HEADS, 7, D_MODEL // HEADS)   # (B, h, T_k, d_k)
    torch.testing.assert_close(keys, mha.split_heads(mha.k_proj(key)), rtol=0, atol=0)
    torch.testing.assert_close(values, mha.split_heads(mha.v_proj(value)), rtol=0, atol=0)


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "written-out"])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_mha_attend_with_projected_kv_equals_attend_with_key_and_value(mode, return_weights):
    """The projected keys and values are read instead of key and value (passed as None here),
    and nothing else changes: in training the dropout draws line up under the same seed."""
    _ = torch.manual_seed(0)
    mha = MultiHeadAttention(D_MODEL, HEADS, dropout=0.3).train(mode == "train")
    x, memory = torch.randn(2, 5, D_MODEL), torch.randn(2, 7, D_MODEL)
    mask = padding_mask(torch.tensor([[1, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), 0)
    projected = mha.project_kv(memory, memory)

    def run(seed, key, value, **kwargs):
        _ = torch.manual_seed(seed)
        result = mha.attend(x, key, value, attn_mask=mask, return_weights=return_weights,
                            **kwargs)
        return result if return_weights else (result,)

    expected = run(1, memory, memory)
    got = run(1, None, None, projected_kv=projected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if mode == "train":                       # the draws matter: another seed, another output
        assert not torch.equal(run(2, None, None, projected_kv=projected)[0], expected[0])
    else:
        other = mha.project_kv(torch.randn(2, 7, D_MODEL), memory)
        assert not torch.allclose(run(1, memory, memory, projected_kv=other)[0], expected[0])
