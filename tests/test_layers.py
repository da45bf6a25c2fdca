"""minitransformer.layers: FeedForward (chapter 4), LayerNorm, EncoderLayer and DecoderLayer
(chapter 8), and the written-out minitransformer.functional.layer_norm."""

import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F
from torch import nn

from minitransformer import (DecoderLayer, EncoderLayer, FeedForward, LayerNorm, SkipModel,
                             Vocabulary, causal_mask, layer_norm, padding_mask)
from minitransformer.cache import KVCache
from helpers import one_thread  # noqa: F401 (a fixture)

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
        torch.testing.assert_close(votes, torch.tensor(model.votes(prefix, mask),
                                                       dtype=torch.float32))
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
     r"activation must be one of \['gelu', 'gelu_tanh', 'relu'\], got 'tanh'"),
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


# --- LayerNorm (chapter 8) ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, 1e-2, 0.5])
def test_layer_norm_equals_pytorchs(dtype, eps, device):
    _ = torch.manual_seed(0)
    theirs = nn.LayerNorm(8, eps=eps, dtype=dtype)
    with torch.no_grad():                      # not the trivial ones and zeros
        theirs.weight.normal_()
        theirs.bias.normal_()
    ours = LayerNorm(8, eps=eps, dtype=dtype, device=device)
    ours.load_state_dict(theirs.state_dict())
    theirs.to(device)
    x = (3 * torch.randn(2, 5, 8, dtype=dtype) + 1).to(device)
    torch.testing.assert_close(ours(x), theirs(x))
    assert ours(x).dtype == dtype


def test_layer_norm_gives_mean_0_and_variance_1_before_scale_and_shift():
    _ = torch.manual_seed(0)
    y = LayerNorm(16, dtype=torch.float64)(5 * torch.randn(4, 16, dtype=torch.float64) - 2)
    torch.testing.assert_close(y.mean(dim=-1), torch.zeros(4, dtype=torch.float64))
    # the biased variance (divide by d_model), as nn.LayerNorm uses; eps makes it a bit below 1
    torch.testing.assert_close(y.var(dim=-1, correction=0), torch.ones(4, dtype=torch.float64),
                               atol=1e-5, rtol=0)


def test_layer_norm_of_a_constant_vector_is_the_bias_not_nan():
    norm = LayerNorm(4)
    with torch.no_grad():
        norm.bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert norm(torch.full((2, 4), 7.0)).tolist() == [[1.0, 2.0, 3.0, 4.0]] * 2


def test_layer_norm_gradients_equal_pytorchs():
    _ = torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    theirs = nn.LayerNorm(6, dtype=torch.float64)
    ours = LayerNorm(6, dtype=torch.float64)
    (grad_ours,) = torch.autograd.grad(ours(x).pow(3).sum(), x)
    (grad_theirs,) = torch.autograd.grad(theirs(x).pow(3).sum(), x)
    torch.testing.assert_close(grad_ours, grad_theirs)


def test_layer_norm_checks_its_input_and_arguments():
    with pytest.raises(ValueError, match=r"x must have last dimension 4, got shape \(3, 1\)"):
        LayerNorm(4)(torch.zeros(3, 1))        # would broadcast silently to (3, 4)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        LayerNorm(4)(torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="must have the same dtype"):
        LayerNorm(4)(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="eps must be positive, got 0"):
        LayerNorm(4, eps=0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        LayerNorm(4.0)
    with pytest.raises(TypeError, match="positional"):
        LayerNorm(4, 1e-5)


# --- layer_norm, the equation written out (chapter 8), against the module's fused kernel ----------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-5, 1e-2, 0.5])
def test_written_out_layer_norm_equals_the_modules_fused_kernel(dtype, eps):
    _ = torch.manual_seed(0)
    norm = LayerNorm(8, eps=eps, dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = 3 * torch.randn(2, 5, 8, dtype=dtype) + 1
    written_out = layer_norm(x, norm.weight, norm.bias, eps)
    torch.testing.assert_close(written_out, norm(x))
    torch.testing.assert_close(written_out, F.layer_norm(x, (8,), norm.weight, norm.bias, eps))
    # a constant vector: the variance is 0 and eps keeps the result at the bias, not NaN
    constant = layer_norm(torch.full((2, 8), 7.0, dtype=dtype), norm.weight, norm.bias, eps)
    torch.testing.assert_close(constant, norm.bias.detach().expand(2, 8))


def test_written_out_layer_norm_is_the_equation_not_the_fused_kernel():
    source = inspect.getsource(layer_norm)
    assert "F.layer_norm" not in source.split('"""')[-1]
    assert "correction=0" in source and "torch.sqrt(variance + eps)" in source


def test_written_out_layer_norm_gradients_equal_pytorchs():
    _ = torch.manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    weight, bias = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    (ours,) = torch.autograd.grad(layer_norm(x, weight, bias).pow(3).sum(), x)
    (theirs,) = torch.autograd.grad(F.layer_norm(x, (6,), weight, bias).pow(3).sum(), x)
    torch.testing.assert_close(ours, theirs)


def test_written_out_layer_norm_checks_its_arguments():
    x, w = torch.zeros(3, 4), torch.ones(4)
    with pytest.raises(ValueError, match=r"weight must have last dimension 4, got shape \(3,\)"):
        layer_norm(x, torch.ones(3), w)         # would broadcast wrongly or fail deep in torch
    with pytest.raises(ValueError, match=r"bias must have 1 dimensions, got shape \(1, 4\)"):
        layer_norm(x, w, torch.ones(1, 4))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        layer_norm(x.long(), w, w)
    with pytest.raises(TypeError, match="must have the same dtype"):
        layer_norm(x.double(), w, w)
    with pytest.raises(ValueError, match="eps must be positive, got 0"):
        layer_norm(x, w, w, 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encode_can_return_the_self_attention_weights(norm_first):
    _ = torch.manual_seed(0)
    layer = EncoderLayer(8, 2, 16, norm_first=norm_first).eval()
    torch.nn.init.normal_(layer.norm1.weight)
    x, mask = torch.randn(3, 5, 8), causal_mask(5)
    out, weights = layer.encode(x, attn_mask=mask, return_weights=True)
    torch.testing.assert_close(out, layer.encode(x, attn_mask=mask))
    attention_input = layer.norm1(x) if norm_first else x
    expected = layer.self_attn(attention_input, attn_mask=mask, return_weights=True)[1]
    torch.testing.assert_close(weights, expected)
    assert weights.shape == (3, 2, 5, 5) and (weights.triu(diagonal=1) == 0).all()


# --- EncoderLayer and DecoderLayer equal PyTorch's layers ---------------------------------

D_MODEL, HEADS, D_FF, B, T, T_MEMORY = 16, 4, 32, 3, 6, 5
PAD = 0
# three target sentences and three source sentences, padded at the end
TOKENS = torch.tensor([[5, 6, 7, 8, 9, 4], [5, 6, 7, PAD, PAD, PAD], [3, 4, PAD, PAD, PAD, PAD]])
SOURCE = torch.tensor([[5, 6, 7, 8, 9], [5, 6, PAD, PAD, PAD], [3, 4, 2, 1, PAD]])
NORM_ORDERS = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])


def randomize_norms(module):
    """PyTorch initialises norms to ones and zeros: make them matter in the comparison."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.LayerNorm):
                sub.weight.normal_(1.0, 0.3)
                sub.bias.normal_(0.0, 0.3)
    return module


def torch_encoder(norm_first, dtype, activation="relu"):
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first, dtype=dtype)
    return randomize_norms(layer)


def torch_decoder(norm_first, dtype, activation="relu"):
    layer = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first, dtype=dtype)
    return randomize_norms(layer)


def encoder_masks(device="cpu"):
    """(ours, PyTorch's keyword arguments) for no mask, causal, padding, and both."""
    causal, tokens = causal_mask(T, device=device), TOKENS.to(device)
    keep = padding_mask(tokens, PAD)                                 # (B, 1, 1, T)
    return {
        "none": (None, {}),
        "causal": (causal, dict(src_mask=~causal)),
        "padding": (keep, dict(src_key_padding_mask=tokens == PAD)),
        "causal+padding": (causal & keep, dict(src_mask=~causal,
                                               src_key_padding_mask=tokens == PAD)),
    }


@DTYPES
@NORM_ORDERS
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "causal+padding"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_pytorchs_in_train_mode(dtype, norm_first, mask_name, activation,
                                                     device):
    _ = torch.manual_seed(0)
    theirs = torch_encoder(norm_first, dtype, activation).train().to(device)
    ours = EncoderLayer.from_torch(theirs)
    assert ours.training
    ours_mask, their_kwargs = encoder_masks(device)[mask_name]
    x = torch.randn(B, T, D_MODEL, dtype=dtype).to(device)
    torch.testing.assert_close(ours(x, attn_mask=ours_mask), theirs(x, **their_kwargs))


@DTYPES
@NORM_ORDERS
def test_encoder_layer_equals_pytorchs_fast_path_in_eval_mode(dtype, norm_first, device):
    _ = torch.manual_seed(0)
    theirs = torch_encoder(norm_first, dtype).eval().to(device)
    ours = EncoderLayer.from_torch(theirs)
    assert not ours.training
    x = torch.randn(B, T, D_MODEL, dtype=dtype).to(device)
    causal = causal_mask(T, device=device)
    with torch.inference_mode():        # lets PyTorch take its fused "fast path"
        torch.testing.assert_close(ours(x, attn_mask=causal), theirs(x, src_mask=~causal))


@DTYPES
@NORM_ORDERS
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_equals_pytorchs_with_causal_and_padding_masks(dtype, norm_first,
                                                                     activation, device):
    _ = torch.manual_seed(0)
    theirs = torch_decoder(norm_first, dtype, activation).train().to(device)
    ours = DecoderLayer.from_torch(theirs)
    x = torch.randn(B, T, D_MODEL, dtype=dtype).to(device)
    memory = torch.randn(B, T_MEMORY, D_MODEL, dtype=dtype).to(device)
    causal, tokens, source = causal_mask(T, device=device), TOKENS.to(device), SOURCE.to(device)
    expected = theirs(x, memory, tgt_mask=~causal, tgt_key_padding_mask=tokens == PAD,
                      memory_key_padding_mask=source == PAD)
    got = ours(x, memory, tgt_mask=causal & padding_mask(tokens, PAD),
               memory_mask=padding_mask(source, PAD))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(ours(x, memory), theirs(x, memory))


@NORM_ORDERS
def test_gradients_equal_pytorchs(norm_first, device):
    _ = torch.manual_seed(0)
    theirs = torch_encoder(norm_first, torch.float64).to(device)
    ours = EncoderLayer.from_torch(theirs)
    x = torch.randn(B, T, D_MODEL, dtype=torch.float64).to(device)
    causal = causal_mask(T, device=device)
    ours(x, attn_mask=causal).pow(2).sum().backward()
    theirs(x, src_mask=~causal).pow(2).sum().backward()
    torch.testing.assert_close(ours.feed_forward.linear1.weight.grad, theirs.linear1.weight.grad)
    torch.testing.assert_close(ours.norm1.weight.grad, theirs.norm1.weight.grad)
    torch.testing.assert_close(ours.self_attn.q_proj.weight.grad,
                               theirs.self_attn.in_proj_weight.grad[:D_MODEL])


def test_from_torch_copies_eps_per_norm_and_dropout_and_mode():
    theirs = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, dropout=0.25, batch_first=True,
                                        layer_norm_eps=1e-3).eval()
    theirs.norm2.eps = 0.5
    ours = DecoderLayer.from_torch(theirs)
    assert (ours.norm1.eps, ours.norm2.eps, ours.norm3.eps) == (1e-3, 0.5, 1e-3)
    assert {ours.dropout1.p, ours.dropout2.p, ours.dropout3.p, ours.feed_forward.dropout.p,
            ours.self_attn.dropout, ours.multihead_attn.dropout} == {0.25}
    assert not ours.training and not any(m.training for m in ours.modules())
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    torch.testing.assert_close(ours(x, memory), theirs(x, memory))


@pytest.mark.parametrize("activation", [F.relu, F.gelu, nn.ReLU(), nn.GELU()],
                         ids=["F.relu", "F.gelu", "nn.ReLU", "nn.GELU"])
def test_from_torch_accepts_activation_functions_and_modules(activation):
    _ = torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0,
                                        activation=activation, batch_first=True)
    ours = EncoderLayer.from_torch(theirs)
    x = torch.randn(B, T, D_MODEL)
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("make, message", [
    (lambda: nn.TransformerEncoderLayer(16, 4, 32),
     "batch-first layer .batch_first=True., got batch_first=False"),
    (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation=torch.tanh),
     "supports the activations ReLU and GELU, got <built-in method tanh"),
    (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True,
                                        activation=nn.GELU(approximate="tanh")),
     r"ReLU and GELU, got GELU\(approximate='tanh'\)"),
    (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, bias=False),
     r"with biases \(bias=True\); without a bias: linear1, linear2, norm1, norm2"),
    (lambda: nn.TransformerDecoderLayer(16, 4, 32, batch_first=True, bias=False),
     "without a bias: linear1, linear2, norm1, norm2, norm3"),
])
def test_from_torch_names_what_it_cannot_copy(make, message):
    with pytest.raises(ValueError, match=message):
        (EncoderLayer if isinstance(make(), nn.TransformerEncoderLayer)
         else DecoderLayer).from_torch(make())


def test_from_torch_refuses_linear_layers_without_bias_and_mixed_dropout():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    layer.linear2 = nn.Linear(32, 16, bias=False)
    with pytest.raises(ValueError, match="without a bias: linear2$"):
        EncoderLayer.from_torch(layer)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    layer.norm2 = nn.LayerNorm(16, elementwise_affine=False)
    with pytest.raises(ValueError, match=r"weight and a bias \(elementwise_affine=True\); "
                                         "without them: norm2$"):
        EncoderLayer.from_torch(layer)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.1)
    layer.dropout2.p = 0.3
    with pytest.raises(ValueError, match="one dropout probability .*'dropout2': 0.3"):
        EncoderLayer.from_torch(layer)
    with pytest.raises(TypeError, match="expects an nn.TransformerEncoderLayer, got "
                                        "TransformerDecoderLayer"):
        EncoderLayer.from_torch(nn.TransformerDecoderLayer(16, 4, 32, batch_first=True))
    with pytest.raises(TypeError, match="expects an nn.TransformerDecoderLayer, got Linear"):
        DecoderLayer.from_torch(nn.Linear(2, 2))


# --- what the layers compute ---------------------------------------------------------------

@NORM_ORDERS
def test_encoder_layer_reads_like_its_equations(norm_first):
    _ = torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, norm_first=norm_first)
    randomize_norms(layer)
    x = torch.randn(B, T, D_MODEL)
    mask = causal_mask(T)
    attend, ffn = lambda h: layer.self_attn(h, attn_mask=mask), layer.feed_forward
    if norm_first:
        h = x + attend(layer.norm1(x))
        expected = h + ffn(layer.norm2(h))
    else:
        h = layer.norm1(x + attend(x))
        expected = layer.norm2(h + ffn(h))
    torch.testing.assert_close(layer(x, attn_mask=mask), expected)
    torch.testing.assert_close(layer.encode(x, attn_mask=mask), expected)


def test_causal_layer_does_not_look_ahead():
    _ = torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, norm_first=True)
    x = torch.randn(1, T, D_MODEL)
    changed = x.clone()
    changed[0, -1] += 10.0                              # change only the last position
    mask = causal_mask(T)
    before, after = layer(x, attn_mask=mask), layer(changed, attn_mask=mask)
    torch.testing.assert_close(before[0, :-1], after[0, :-1])
    assert not torch.allclose(before[0, -1], after[0, -1])


def test_dropout_acts_in_training_mode_only():
    _ = torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.5, norm_first=True)
    x = torch.randn(B, T, D_MODEL)
    assert not torch.allclose(layer(x), layer(x))                  # a new mask every call
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    no_dropout = EncoderLayer(D_MODEL, HEADS, D_FF, norm_first=True).eval()
    no_dropout.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x), no_dropout(x))


@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_device_and_dtype_reach_every_parameter(cls):
    layer = cls(8, 2, 16, dtype=torch.float64, device="cpu")
    assert {p.dtype for p in layer.parameters()} == {torch.float64}
    assert {p.device.type for p in layer.parameters()} == {"cpu"}


def test_parameter_names_mirror_pytorchs():
    ours = set(DecoderLayer(8, 2, 16).state_dict())
    theirs = set(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True).state_dict())
    renamed = {name.replace("feed_forward.", "") for name in ours}
    # PyTorch packs q, k and v into in_proj_*; everything else has the same name
    assert {n for n in renamed if "_proj." not in n or "out_proj" in n} == \
        {n for n in theirs if "in_proj" not in n}


# --- bad input, named -----------------------------------------------------------------------

@pytest.mark.parametrize("cls", [EncoderLayer, DecoderLayer])
def test_construction_errors(cls):
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads, got "
                                         "d_model=10 and num_heads=4"):
        cls(10, 4, 32)
    with pytest.raises(TypeError, match="num_heads must be an int, got float"):
        cls(16, 4.0, 32)
    with pytest.raises(ValueError, match="d_ff must be at least 1, got 0"):
        cls(16, 4, 0)
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\), got 1.5"):
        cls(16, 4, 32, dropout=1.5)
    with pytest.raises(ValueError, match="activation must be one of"):
        cls(16, 4, 32, activation="swish")
    with pytest.raises(TypeError, match="positional"):
        cls(16, 4, 32, 0.1)


def test_encoder_input_errors():
    layer = EncoderLayer(D_MODEL, HEADS, D_FF)
    x = torch.randn(B, T, D_MODEL)
    with pytest.raises(ValueError, match=r"x must have last dimension 16, got shape \(3, 6, 8\)"):
        layer(torch.randn(B, T, 8))
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(6, 16\)"):
        layer(torch.randn(T, D_MODEL))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        layer(torch.ones(B, T, D_MODEL, dtype=torch.long))
    with pytest.raises(TypeError, match="same dtype, got x torch.float64"):
        layer(x.double())
    with pytest.raises(ValueError, match=r"attn_mask of shape \(5, 5\) does not broadcast to "
                                         r"the scores \(B, num_heads, T_q, T_k\) = "
                                         r"\(3, 4, 6, 6\)"):
        layer(x, attn_mask=causal_mask(5))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 1, 1, 6\) does not "
                                         r"broadcast"):
        layer(x, attn_mask=torch.ones(2, 1, 1, T, dtype=torch.bool))
    with pytest.raises(ValueError, match="floating mask of only 0s and 1s"):
        layer(x, attn_mask=causal_mask(T).float())
    with pytest.raises(TypeError, match="attn_mask must be boolean"):
        layer(x, attn_mask=causal_mask(T).long())
    with pytest.raises(TypeError, match="positional"):
        layer(x, causal_mask(T))


def test_decoder_input_errors():
    layer = DecoderLayer(D_MODEL, HEADS, D_FF)
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    with pytest.raises(ValueError, match=r"memory must have last dimension 16, got shape "
                                         r"\(3, 5, 12\)"):
        layer(x, torch.randn(B, T_MEMORY, 12))
    with pytest.raises(ValueError, match=r"x and memory must have the same batch size, got x "
                                         r"\(3, 6, 16\) and memory \(2, 5, 16\)"):
        layer(x, memory[:2])
    with pytest.raises(ValueError, match="memory must hold at least one position"):
        layer(x, memory[:, :0])
    with pytest.raises(ValueError, match=r"memory_mask of shape \(3, 1, 1, 6\) does not "
                                         r"broadcast to the scores .* = \(3, 4, 6, 5\)"):
        layer(x, memory, memory_mask=padding_mask(TOKENS, PAD))
    with pytest.raises(ValueError, match=r"tgt_mask of shape \(6, 5\) does not broadcast"):
        layer(x, memory, tgt_mask=torch.ones(T, T_MEMORY, dtype=torch.bool))
    with pytest.raises(TypeError, match="memory must be a floating-point tensor"):
        layer(x, [[0.0]])


def test_inputs_are_checked_once_and_the_unchecked_path_checks_nothing(monkeypatch):
    import minitransformer._checks as checks
    import minitransformer.attention as attention
    calls = []
    for module in (checks, attention):
        for name in ("check_float_tensor", "check_mask", "check_same_dtype"):
            if hasattr(module, name):
                original = getattr(module, name)
                monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k:
                                    calls.append(_n) or _f(*a, **k))
    layer = DecoderLayer(D_MODEL, HEADS, D_FF, norm_first=True)
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    mask = causal_mask(T)
    layer.decode(x, memory, tgt_mask=mask, memory_mask=padding_mask(SOURCE, PAD))
    assert calls == []
    layer(x, memory, tgt_mask=mask, memory_mask=padding_mask(SOURCE, PAD))
    assert sorted(calls) == sorted(["check_float_tensor", "check_same_dtype"] * 2
                                   + ["check_mask"] * 2)
    calls.clear()
    EncoderLayer(D_MODEL, HEADS, D_FF).encode(x, attn_mask=mask)
    assert calls == []


# --- DecoderLayer.decode with the cross-attention keys and values projected once (chapter 10) --

def decoder_with_random_norms(norm_first, dropout=0.0):
    """A decoder layer whose three norms are not ones and zeros, so that where they sit shows."""
    _ = torch.manual_seed(0)
    layer = DecoderLayer(D_MODEL, HEADS, D_FF, dropout=dropout, norm_first=norm_first)
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    return layer


DECODER_MASKS = {"tgt_mask": causal_mask(T), "memory_mask": padding_mask(SOURCE, PAD)}


@NORM_ORDERS
@pytest.mark.parametrize("mode, dropout", [("eval", 0.0), ("eval", 0.3), ("train", 0.0),
                                           ("train", 0.3)])
def test_decode_with_memory_kv_equals_decode_with_memory(norm_first, mode, dropout):
    """memory_kv is read instead of memory (a memory of zeros is passed alongside), through the
    same block: post-norm as well as pre-norm, and in training the dropout draws line up."""
    layer = decoder_with_random_norms(norm_first, dropout).train(mode == "train")
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    memory_kv = layer.multihead_attn.project_kv(memory, memory)

    def run(seed, memory, **kwargs):
        _ = torch.manual_seed(seed)
        return layer.decode(x, memory, **DECODER_MASKS, **kwargs)

    expected = run(1, memory)
    torch.testing.assert_close(run(1, torch.zeros_like(memory), memory_kv=memory_kv), expected,
                               rtol=0, atol=0)
    if mode == "train" and dropout > 0:         # the draws matter: another seed, another output
        assert not torch.allclose(run(2, torch.zeros_like(memory), memory_kv=memory_kv),
                                  expected)


@NORM_ORDERS
def test_decode_with_memory_kv_and_a_cache_equals_the_full_pass(norm_first):
    """One new token at a time, self-attention keys and values cached, the memory's projected
    once: the same output as the whole target at once."""
    layer = decoder_with_random_norms(norm_first).eval()
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    full = layer.decode(x, memory, **DECODER_MASKS)
    memory_kv = layer.multihead_attn.project_kv(memory, memory)
    cache = KVCache(1)
    steps = [layer.decode(x[:, t:t + 1], torch.zeros_like(memory), kv_cache=cache,
                          memory_mask=DECODER_MASKS["memory_mask"], memory_kv=memory_kv)
             for t in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)


def written_out_cross_attention_weights(layer, x, memory):
    """softmax(q k^T / sqrt(d_k)) over the real source positions, q read from the block's state
    after its self-attention (normalized first in pre-norm, after in post-norm)."""
    attn, causal = layer.multihead_attn, DECODER_MASKS["tgt_mask"]
    if layer.norm_first:
        query = layer.norm2(x + layer.self_attn(layer.norm1(x), attn_mask=causal))
    else:
        query = layer.norm1(x + layer.self_attn(x, attn_mask=causal))
    q = attn.split_heads(attn.q_proj(query))                         # (B, h, T, d_k)
    k = attn.split_heads(attn.k_proj(memory))                        # (B, h, T_src, d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_MODEL // HEADS)   # (B, h, T, T_src)
    hidden = ~DECODER_MASKS["memory_mask"]
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)


@NORM_ORDERS
@pytest.mark.parametrize("projected", [False, True], ids=["memory", "memory_kv"])
def test_decode_returns_the_cross_attention_weights_it_used(norm_first, projected):
    layer = decoder_with_random_norms(norm_first).eval()
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, T_MEMORY, D_MODEL)
    kwargs = {"memory_kv": layer.multihead_attn.project_kv(memory, memory)} if projected else {}
    output, weights = layer.decode(x, memory, **DECODER_MASKS, return_cross_weights=True,
                                   **kwargs)
    torch.testing.assert_close(output, layer.decode(x, memory, **DECODER_MASKS))
    torch.testing.assert_close(weights, written_out_cross_attention_weights(layer, x, memory))
    assert weights.shape == (B, HEADS, T, T_MEMORY)
    real = SOURCE != PAD                                             # (B, T_src)
    assert torch.all(weights.permute(0, 3, 1, 2)[~real] == 0)       # padding: exactly 0
    assert torch.all(weights.permute(0, 3, 1, 2)[real] > 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, HEADS, T))


# --- the measurements of chapter 8 (book/08_transformer_blocks.ipynb) -----------------------
# The same code as the chapter, so that a change to the package cannot quietly undo what the
# chapter claims. One thread, as in the chapter. The margins are wide (the chapter's numbers
# are in the comments).

M_D_MODEL, M_HEADS, M_D_FF, M_B, M_T = 64, 4, 256, 4, 16


def make_stack(num_layers, *, norm_first=False, dtype=torch.float32, xavier=False, seed=0):
    _ = torch.manual_seed(seed)
    layers = [EncoderLayer(M_D_MODEL, M_HEADS, M_D_FF, norm_first=norm_first, dtype=dtype)
              for _ in range(num_layers)]
    for p in (p for layer in layers for p in layer.parameters()):
        if xavier and p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return layers


def run_stack(layers, x, how):
    scales = []
    for layer in layers:
        if how == "no skips":
            x = layer.self_attn(x)
            x = layer.feed_forward(x)
        elif how == "skips":
            x = x + layer.self_attn(x)
            x = x + layer.feed_forward(x)
        else:
            x = layer(x)
        scales.append(x.std().item())
    return x, scales


def gradient_norms(layers, how, *, final_norm=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = layers[0].norm1.weight.dtype
    x = torch.randn(M_B, M_T, M_D_MODEL, generator=g, dtype=dtype)
    target = torch.randn(M_B, M_T, M_D_MODEL, generator=g, dtype=dtype)
    out, _ = run_stack(layers, x, how)
    if final_norm:
        out = F.layer_norm(out, (M_D_MODEL,))
    F.mse_loss(out, target).backward()
    return [torch.cat([p.grad.flatten() for p in layer.parameters()
                       if p.grad is not None]).norm().item() for layer in layers]


def test_chapter8_skips_carry_the_gradient_to_the_first_layer():
    no_skips = gradient_norms(make_stack(24, dtype=torch.float64), "no skips")
    skips = gradient_norms(make_stack(24, dtype=torch.float64), "skips")
    assert no_skips[0] < 1e-20 < 1 < skips[0]                  # 2.1e-27 and 87
    assert skips[0] / no_skips[0] > 1e20                        # 4e28
    assert (no_skips[-1] / no_skips[0]) ** (1 / 23) > 5         # 12.8 per layer
    assert skips[0] > skips[-1]                                 # 87 > 39: no vanishing


def test_chapter8_a_skip_keeps_the_token_when_attention_gives_nothing():
    _ = torch.manual_seed(0)
    layer = EncoderLayer(M_D_MODEL, M_HEADS, M_D_FF)
    with torch.no_grad():
        layer.self_attn.out_proj.weight.zero_()
        layer.self_attn.out_proj.bias.zero_()
    x = torch.randn(1, M_T, M_D_MODEL)
    attended = layer.self_attn(x)
    assert torch.equal(x + attended, x)
    assert bool((attended == attended[:, :1]).all())            # every position the same


def test_chapter8_activation_scale_drifts_without_norms():
    x0 = torch.randn(M_B, M_T, M_D_MODEL, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, skips = run_stack(make_stack(24), x0, "skips")
        _, post = run_stack(make_stack(24), x0, "block")
        _, pre = run_stack(make_stack(24, norm_first=True), x0, "block")
    assert skips[-1] > 3                                        # 3.42
    assert (skips[-1] / skips[0]) ** (1 / 23) > 1.03            # 1.053 per layer
    assert all(abs(s - 1) < 0.01 for s in post)                 # 1.00
    assert 1.3 < pre[-1] < 2.2                                  # 1.77
    assert pre[0] < pre[11] < pre[-1]                           # 1.04, 1.42, 1.77


def test_chapter8_post_norm_gives_the_top_layer_larger_gradients_than_pre_norm():
    depths = [6, 12, 24, 48]
    last = {False: [], True: []}
    for num_layers in depths:
        for norm_first in (False, True):
            values = [gradient_norms(make_stack(num_layers, norm_first=norm_first, xavier=True,
                                                seed=seed), "block", final_norm=norm_first,
                                     seed=seed)[-1] for seed in range(2)]
            last[norm_first].append(sum(values) / 2)
    post, pre = last[False], last[True]                         # 0.58..0.61 and 0.20..0.069
    ratios = [a / b for a, b in zip(post, pre)]                 # 2.8, 4.2, 5.9, 8.9
    assert max(post) / min(post) < 1.25                         # post-norm: flat in depth
    assert all(a > b for a, b in zip(pre, pre[1:]))             # pre-norm: shrinks
    assert ratios[2] > 4
    assert ratios[-1] / ratios[0] > 2                           # about sqrt(48 / 6) = 2.8
