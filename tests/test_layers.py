"""FeedForward (minitransformer.layers): the feature layer of chapter 4."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from minitransformer import FeedForward, SkipModel, Vocabulary

SENTENCES = ["Check the program log and find out whether it ran please.",
             "Check the battery log and find out whether it ran down please."]
VOCAB = Vocabulary.from_sentences(SENTENCES)
N = len(VOCAB)


def multi_hot(words):
    x = torch.zeros(N)
    x[VOCAB.encode(words)] = 1.0
    return x


def chapter_block():
    """Chapter 4's hand-set block: features (battery, ran) and (program, ran), then votes."""
    battery, program, ran = VOCAB.encode(["battery", "program", "ran"])
    w1 = torch.zeros(N, 2)
    w1[[battery, program, ran], 0] = torch.tensor([1.0, -1.0, 1.0])
    w1[[battery, program, ran], 1] = torch.tensor([-1.0, 1.0, 1.0])
    w2 = torch.zeros(2, N)
    w2[0, VOCAB.index("down")] = 1.0
    w2[1, VOCAB.index("please")] = 1.0
    return FeedForward(N, 2).set_weights(w1, torch.tensor([-1.0, -1.0]), w2, torch.zeros(N))


def test_has_pytorchs_submodule_names_and_shapes():
    block = FeedForward(8, 32)
    assert isinstance(block.linear1, nn.Linear) and isinstance(block.linear2, nn.Linear)
    assert block.linear1.weight.shape == (32, 8) and block.linear2.weight.shape == (8, 32)
    assert sum(p.numel() for p in block.parameters()) == 8 * 32 + 32 + 32 * 8 + 8


def test_chapter4_features_before_and_after_relu():
    block = chapter_block()
    x = multi_hot(["battery", "ran"])
    pre = block.linear1(x)
    assert pre.tolist() == [1.0, -1.0]  # (battery, ran) fires, (program, ran) is pushed below 0
    assert block.features(x).tolist() == [1.0, 0.0]
    assert block.features(multi_hot(["program", "ran"])).tolist() == [0.0, 1.0]


def test_chapter4_votes_match_the_masked_skip_model_of_chapter3():
    block = chapter_block()
    model = SkipModel(SENTENCES, VOCAB)
    mask = np.zeros(N * N)
    mask[[model.feature_index("battery", "ran"), model.feature_index("program", "ran")]] = 1.0
    for sentence in SENTENCES:
        prefix = sentence.lower().rstrip(".").split()
        prefix = prefix[: prefix.index("ran") + 1]
        attended = multi_hot([w for w in set(prefix) if w in ("battery", "program", "ran")])
        votes = block(attended)
        torch.testing.assert_close(votes, torch.tensor(model.votes(prefix, mask), dtype=torch.float32))
    assert block(multi_hot(["battery", "ran"]))[VOCAB.index("down")].item() == 1.0
    assert block(multi_hot(["program", "ran"]))[VOCAB.index("please")].item() == 1.0


def test_the_same_as_the_formula_max0_xw1_b1_w2_b2():
    _ = torch.manual_seed(0)
    block = FeedForward(6, 10)
    x = torch.randn(2, 3, 6)
    w1, b1 = block.linear1.weight.T, block.linear1.bias
    w2, b2 = block.linear2.weight.T, block.linear2.bias
    torch.testing.assert_close(block(x), torch.clamp(x @ w1 + b1, min=0) @ w2 + b2)


def test_gelu_activation():
    _ = torch.manual_seed(1)
    block = FeedForward(4, 8, activation="gelu")
    x = torch.randn(5, 4)
    expected = block.linear2(nn.functional.gelu(block.linear1(x)))
    torch.testing.assert_close(block(x), expected)
    assert not torch.allclose(block(x), block.linear2(torch.relu(block.linear1(x))))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_position_wise_each_row_is_transformed_on_its_own(batch, length, d_model, seed):
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    block = FeedForward(d_model, 2 * d_model)
    x = torch.randn(batch, length, d_model, generator=generator)
    out = block(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out[:, -1], block(x[:, -1]))
    # permuting the positions permutes the outputs the same way: no mixing between positions
    order = torch.randperm(length, generator=generator)
    torch.testing.assert_close(block(x[:, order]), out[:, order])


def test_dropout_acts_in_training_only():
    _ = torch.manual_seed(0)
    block = FeedForward(4, 64, dropout=0.5)
    x = torch.randn(3, 4)
    block.eval()
    torch.testing.assert_close(block(x), block.linear2(torch.relu(block.linear1(x))))
    block.train()
    assert not torch.allclose(block(x), block.linear2(torch.relu(block.linear1(x))))


def test_follows_the_inputs_dtype_after_to():
    block = FeedForward(3, 5).to(torch.float64)
    assert block(torch.ones(2, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(d_model=0, d_ff=4), ValueError, "d_model must be at least 1, got 0"),
    (dict(d_model=4, d_ff=2.5), TypeError, r"d_ff must be an int, got float \(2.5\)"),
    (dict(d_model=True, d_ff=4), TypeError, r"d_model must be an int, got bool \(True\)"),
    (dict(d_model=4, d_ff=4, dropout=1.0), ValueError,
     r"dropout must be a number in \[0, 1\), got 1.0"),
    (dict(d_model=4, d_ff=4, dropout=-0.1), ValueError,
     r"dropout must be a number in \[0, 1\), got -0.1"),
    (dict(d_model=4, d_ff=4, activation="tanh"), ValueError,
     r"activation must be one of \['gelu', 'relu'\], got 'tanh'"),
    (dict(d_model=4, d_ff=4, dtype=torch.int64), TypeError,
     "dtype must be a floating-point torch.dtype, got torch.int64"),
])
def test_bad_construction_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        FeedForward(**kwargs)


def test_options_are_keyword_only():
    with pytest.raises(TypeError, match="positional"):
        FeedForward(4, 8, 0.1)


def test_device_and_dtype_create_the_parameters():
    block = FeedForward(4, 8, dtype=torch.float64, device="cpu")
    assert {p.dtype for p in block.parameters()} == {torch.float64}
    assert {p.device.type for p in block.parameters()} == {"cpu"}


def test_wrong_input_width_is_named():
    with pytest.raises(ValueError, match=r"x must have last dimension 4, got shape \(2, 5\)"):
        FeedForward(4, 8)(torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        FeedForward(4, 8)(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"x must have last dimension 4, got shape \(3, 1\)"):
        FeedForward(4, 8).features(torch.zeros(3, 1))     # would broadcast silently


def test_integer_input_is_a_type_error():
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got a tensor of "
                                        "dtype torch.int64"):
        FeedForward(2, 2)(torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="floating-point tensor, got list"):
        FeedForward(2, 2)([1.0, 0.0])


def test_input_in_another_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="x, weights must have the same dtype, got x "
                                        "torch.float64, weights torch.float32"):
        FeedForward(2, 2)(torch.zeros(3, 2, dtype=torch.float64))


def test_transform_is_forward_without_the_check():
    _ = torch.manual_seed(0)
    block = FeedForward(4, 8)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(block.transform(x), block(x))


def test_set_weights_checks_shapes_and_types():
    block = FeedForward(3, 2)
    good = dict(w1=torch.zeros(3, 2), b1=torch.zeros(2), w2=torch.zeros(2, 3), b2=torch.zeros(3))
    with pytest.raises(ValueError, match=r"w1 must have shape \(3, 2\), got \(2, 3\)"):
        block.set_weights(**{**good, "w1": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match=r"b2 must have shape \(3,\), got \(2,\)"):
        block.set_weights(**{**good, "b2": torch.zeros(2)})
    with pytest.raises(TypeError, match="b1 must be a floating-point tensor, got list"):
        block.set_weights(**{**good, "b1": [0.0, 0.0]})
    assert block.set_weights(**good) is block
    assert block(torch.ones(3)).tolist() == [0.0, 0.0, 0.0]
