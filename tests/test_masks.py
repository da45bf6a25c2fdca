"""causal_mask and padding_mask (chapter 6): True = may attend, lower-right aligned."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from minitransformer import causal_mask, padding_mask


def test_causal_mask_square_is_the_lower_triangle():
    expected = torch.tensor([[True, False, False],
                             [True, True, False],
                             [True, True, True]])
    assert torch.equal(causal_mask(3), expected)
    assert causal_mask(3).dtype == torch.bool


def test_causal_mask_with_more_keys_aligns_the_queries_to_the_end():
    # Two new queries after two cached keys: they are positions 2 and 3 of 4.
    expected = torch.tensor([[True, True, True, False],
                             [True, True, True, True]])
    assert torch.equal(causal_mask(2, 4), expected)
    assert torch.equal(causal_mask(1, 5), torch.ones(1, 5, dtype=torch.bool))


@settings(deadline=None)  # a shared 2-core machine can take 0.5 s for one example
@given(q_len=st.integers(1, 20), extra=st.integers(0, 20))
def test_causal_mask_equals_pytorch_causal_lower_right(q_len, extra):
    k_len = q_len + extra
    assert torch.equal(causal_mask(q_len, k_len), causal_lower_right(q_len, k_len)._materialize())


def test_causal_mask_is_created_on_the_requested_device():
    assert causal_mask(3, device="meta").device.type == "meta"
    assert causal_mask(3, 5, device=torch.device("cpu")).device.type == "cpu"


def test_masks_never_land_on_the_default_device():
    torch.set_default_device("meta")
    try:
        assert causal_mask(3).device.type == "cpu"               # no device given: the CPU
        assert causal_mask(2, 4, device="cpu").device.type == "cpu"
        tokens = torch.tensor([[1, 0]], device="cpu")
        assert padding_mask(tokens, 0).device.type == "cpu"      # the device of the tokens
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("args, error, match", [
    ((0,), ValueError, r"q_len must be at least 1, got 0"),
    ((-2,), ValueError, r"q_len must be at least 1, got -2"),
    ((3, 0), ValueError, r"k_len must be at least 1, got 0"),
    ((4, 2), ValueError, r"k_len >= q_len, got q_len=4 and k_len=2"),
    ((2.0,), TypeError, r"q_len must be an int, got float"),
    ((True,), TypeError, r"q_len must be an int, got bool"),
    ((2, "3"), TypeError, r"k_len must be an int, got str"),
])
def test_causal_mask_rejects_bad_lengths(args, error, match):
    with pytest.raises(error, match=match):
        causal_mask(*args)


def test_padding_mask_marks_real_tokens():
    tokens = torch.tensor([[5, 3, 0, 0],
                           [7, 2, 9, 1]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 4)
    assert mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, True]]


def test_padding_mask_uses_the_given_pad_id():
    tokens = torch.tensor([[0, 1, 1]])
    assert padding_mask(tokens, pad_id=1)[0, 0, 0].tolist() == [True, False, False]


def test_padding_mask_broadcasts_over_heads_and_queries():
    mask = padding_mask(torch.tensor([[1, 2, 0], [3, 0, 0]]), pad_id=0)
    full = mask.expand(2, 4, 5, 3)   # (B, h, L, S)
    assert full[1, 3, 4].tolist() == [True, False, False]


@pytest.mark.parametrize("tokens, pad_id, error, match", [
    (torch.tensor([[1.0, 0.0]]), 0, TypeError,
     r"tokens must be an integer tensor of token ids, got a tensor of dtype torch.float32"),
    (torch.tensor([[True, False]]), 0, TypeError, r"got a tensor of dtype torch.bool"),
    ([[1, 0]], 0, TypeError, r"got list"),
    (torch.tensor([1, 0]), 0, ValueError, r"tokens must have 2 dimensions, got shape \(2,\)"),
    (torch.zeros(2, 3, 4, dtype=torch.long), 0, ValueError, r"got shape \(2, 3, 4\)"),
    (torch.tensor([[1, 0]]), 0.0, TypeError, r"pad_id must be an int, got float"),
    (torch.tensor([[1, 0]]), -1, ValueError, r"pad_id must be at least 0, got -1"),
])
def test_padding_mask_rejects_bad_input(tokens, pad_id, error, match):
    with pytest.raises(error, match=match):
        padding_mask(tokens, pad_id)


def test_causal_mask_refuses_a_device_that_is_not_here_by_name():
    with pytest.raises(ValueError, match="'mps'"):
        causal_mask(3, device="mps")
