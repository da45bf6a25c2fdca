"""Weight-only int8 (issue 44, chapter 19): ``Int8Linear`` and its two products,
``int8_linear`` (the equation: dequantise, then ``F.linear``) and ``int8_linear_fast`` (no float
copy of the whole matrix), and the fast decode steps of a GPT and a Llama over int8 layers.

The tolerance of the fast product with one scale per row: it multiplies bfloat16 rows (8
significant bits) and returns bfloat16 sums, which the float32 scales then multiply. So each
output equals the equation's on the rounded rows ``bf16(x)`` within ``2^-8`` of its size, and
the equation's on ``x`` within ``2^-9 |x| |s q|^T + 2^-8 |y|``, plus float32's own rounding
(``1e-5`` here). The other products equal the equation's up to float32 rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import minitransformer.quantize as quantize
from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, generate
from minitransformer.quantize import (
    Int4Linear,
    Int8Linear,
    absmax_dequantize,
    absmax_quantize,
    int4_dequantize,
    int4_linear,
    int4_quantize,
    int8_linear,
    int8_linear_fast,
    quantize_linears,
)


def bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """How far the bfloat16 product of rows ``x`` may be from ``F.linear(x, weight)``."""
    return 2 ** -9 * (x.abs() @ weight.abs().t()) + 2 ** -8 * F.linear(x, weight).abs() + 1e-5


def random_int8(out: int, width: int, group: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, width, generator=g)
    w[:, 3] *= 20                                      # an outlier column, as real weights have
    return absmax_quantize(w, bits=8, group=group)


def test_the_equation_is_the_rows_times_the_scaled_integers():
    q, scale = random_int8(48, 64, "row")
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    by_hand = torch.stack([torch.stack([scale[j, 0] * (q[j].float() * x[i]).sum()
                                        for j in range(48)]) for i in range(5)])
    torch.testing.assert_close(int8_linear(x, q, scale), by_hand, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 7, 33])
def test_the_fast_product_per_row_is_the_equation_within_bfloat16_rounding(rows):
    q, scale = random_int8(200, 96, "row")
    bias = torch.randn(200)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    exact = int8_linear(x, q, scale, bias)
    fast = int8_linear_fast(x, q, scale, bias)
    assert fast.dtype == torch.float32 and fast.shape == exact.shape
    assert bool(((fast - exact).abs() <= bound(x, absmax_dequantize(q, scale))).all())
    # on the rounded rows, within the sum's rounding: a scale 1% off fails this everywhere
    rounded = int8_linear(x.bfloat16().float(), q, scale, bias)
    assert bool(((fast - rounded).abs() <= 2 ** -8 * (rounded - bias).abs() + 1e-5).all())
    wrong = (fast - bias) * 1.01 + bias
    assert not bool(((wrong - rounded).abs() <= 2 ** -8 * (rounded - bias).abs()
                     + 1e-5).any())


def test_the_fast_product_per_row_multiplies_the_int8_matrix_itself(monkeypatch):
    """Through ``_weight_int8pack_mm`` on the int8 tensor, never dequantising the matrix."""
    assert quantize._int8pack_mm is not None               # torch 2.13 on the CPU has it
    calls = []

    def kernel(rows, q, scales):
        calls.append((rows.dtype, q.dtype, q.data_ptr()))
        return torch.ops.aten._weight_int8pack_mm(rows, q, scales)

    def no_copy(*args):
        raise AssertionError("the whole matrix was dequantised")

    q, scale = random_int8(64, 32, "row")
    monkeypatch.setattr(quantize, "_int8pack_mm", kernel)
    monkeypatch.setattr(quantize, "absmax_dequantize", no_copy)
    int8_linear_fast(torch.randn(3, 32), q, scale)
    assert calls == [(torch.bfloat16, torch.int8, q.data_ptr())]


@pytest.mark.parametrize("chunk", [quantize.INT8_CHUNK_VALUES, 5 * 64])
def test_per_block_scales_go_through_a_small_buffer_equal_to_the_equation(monkeypatch, chunk):
    """Blocks of rows dequantised into one small buffer (here 5 rows of 64: 13 = 2 x 5 + 3)."""
    monkeypatch.setattr(quantize, "INT8_CHUNK_VALUES", chunk)
    q, scale = random_int8(13, 64, "block")
    x = torch.randn(2, 4, 64)
    bias = torch.randn(13)
    torch.testing.assert_close(int8_linear_fast(x, q, scale, bias),
                               int8_linear(x, q, scale, bias), rtol=1e-5, atol=1e-5)


def test_int8_linear_is_the_quantized_linear_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 40)
    for group in ("row", "block"):
        layer = Int8Linear.from_linear(linear, group=group)
        q, scale = absmax_quantize(linear.weight.detach(), bits=8, group=group)
        assert torch.equal(layer.weight_int8, q) and torch.equal(layer.scale, scale)
        assert torch.equal(layer.bias, linear.bias.detach())
        assert torch.equal(layer.dequantized(), absmax_dequantize(q, scale))
        x = torch.randn(3, 64)
        exact = F.linear(x, layer.dequantized(), linear.bias)
        assert bool(((layer(x) - exact).abs() <= bound(x, layer.dequantized())).all())
        # and the int8 weights are close to the float ones: half a step of each row's scale
        step = scale if group == "row" else scale.expand(40, 2, 32).reshape(40, 64)
        assert bool(((layer.dequantized() - linear.weight).abs() <= step / 2 + 1e-7).all())
    assert "group='block', block_size=32" in repr(Int8Linear.from_linear(linear, group="block"))
    assert not list(layer.parameters())                     # nothing in it learns


def test_bad_input_is_refused_by_name():
    with pytest.raises(TypeError, match="linear"):
        Int8Linear.from_linear(nn.Conv1d(4, 4, 1))
    with pytest.raises(ValueError, match="group"):
        Int8Linear(64, 8, group="tensor")
    with pytest.raises(ValueError, match="in_features=40"):
        Int8Linear.from_linear(nn.Linear(40, 8), group="block")
    model = Llama(LlamaConfig(vocab_size=32, context_length=8, d_model=48, num_heads=2,
                              num_layers=1, d_ff=64))
    with pytest.raises(ValueError, match="head: in_features=48 do not split into blocks"):
        quantize_linears(model, group="block")
    assert not any(isinstance(m, Int8Linear) for m in model.modules())    # left as it was
    with pytest.raises(TypeError, match="model"):
        quantize_linears("a model")
    from minitransformer.lora import add_lora
    adapted = add_lora(tiny_models()[0], r=2, alpha=4.0)
    with pytest.raises(ValueError, match="LoRA layer: merge the adapters first"):
        quantize_linears(adapted)


def tiny_models():
    torch.manual_seed(0)
    return [GPT(GPTConfig(vocab_size=96, context_length=64, num_layers=2, num_heads=4,
                          d_model=64)),
            Llama(LlamaConfig(vocab_size=96, context_length=64, d_model=64, num_heads=4,
                              num_kv_heads=2, num_layers=2, d_ff=128))]


@pytest.mark.parametrize("index", [0, 1], ids=["gpt", "llama"])
def test_a_quantized_model_decodes_through_its_int8_layers(index):
    model = tiny_models()[index].eval()
    reference = {name: m.weight.detach().clone() for name, m in model.named_modules()
                 if isinstance(m, nn.Linear)}
    idx = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(idx)[0]
        quantize_linears(model)
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
        assert all(torch.equal(dict(model.named_modules())[name].dequantized(),
                               absmax_dequantize(*absmax_quantize(w, bits=8, group="row")))
                   for name, w in reference.items())
        assert isinstance(model.token_embedding, nn.Embedding)    # embeddings stay float
        after = model(idx)[0]
        # 8 bits a weight move a small random model's logits by under 2% of the largest
        assert 0 < float((after - before).abs().max() / before.abs().max()) < 0.02
        # the fast step follows the int8 layers (not forward); same logits up to rounding
        assert model._is_as_built(int8=True) and not model._is_as_built()
        fast = generate(model, idx, 12, temperature=0, fast=True)
        plain = generate(model, idx, 12, temperature=0, fast=False)
    assert torch.equal(fast, plain)


def test_the_fast_step_calls_the_int8_layers_and_sees_a_hook():
    model = quantize_linears(tiny_models()[1].eval())
    seen = []
    original = quantize.int8_linear_fast

    def counted(*args):
        seen.append(1)
        return original(*args)

    idx = torch.randint(0, 96, (1, 4))
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "int8_linear_fast", counted)
        generate(model, idx, 3, temperature=0)
    assert len(seen) == 3 * (2 * 7 + 1)          # prefill and 2 steps: 7 per layer, the head
    calls = []
    model.head.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        generate(model, idx, 3, temperature=0)
    assert len(calls) == 3                       # a hook takes forward, which runs it


# ----- int4 (Q4_1's form, float32 scale and offset per block of 32) -----------------------------

def int4_bound(x, layer):
    """How far the bfloat16 kernel may be from the equation: rows, ``d`` and ``m + 8 d`` each
    rounded to bfloat16 (``2^-9`` relative), and the sums (``2^-9`` of ``|y|``), doubled."""
    out, width = layer.weight_int4.shape
    spread = lambda t: t.expand(out, width // 32, 32).reshape(out, width)      # noqa: E731
    size = layer.dequantized().abs() + 16 * spread(layer.scale) + spread(layer.offset).abs()
    exact = int4_linear(x, layer.weight_int4, layer.scale, layer.offset, layer.bias)
    return 2 ** -8 * (x.abs() @ size.t()) + 2 ** -8 * exact.abs() + 1e-5


@pytest.mark.parametrize("out", [48, 40, 1])                 # 40 and 1: rows padded to 16
def test_the_int4_kernel_is_the_equation_within_bfloat16_rounding(out):
    torch.manual_seed(0)
    linear = nn.Linear(96, out)
    layer = Int4Linear.from_linear(linear)
    x = torch.randn(2, 5, 96) * 3
    with torch.no_grad():
        exact = int4_linear(x, layer.weight_int4, layer.scale, layer.offset, layer.bias)
        fast = layer(x)
    assert fast.shape == exact.shape == (2, 5, out)
    assert bool(((fast - exact).abs() <= int4_bound(x, layer)).all())
    # the kernel computes the product: the bfloat16 rounding shows, no float copy is made
    assert not torch.equal(fast, exact)
    # a code changed after the first call is packed again
    layer.weight_int4[0, 0] = 15 - layer.weight_int4[0, 0]
    with torch.no_grad():
        again = int4_linear(x, layer.weight_int4, layer.scale, layer.offset, layer.bias)
        assert bool(((layer(x) - again).abs() <= int4_bound(x, layer)).all())


def test_int4_quantize_is_q4_1_with_float32_numbers_and_gives_a_q4_1_weight_back_exactly():
    from minitransformer.gguf import dequantize
    from minitransformer.quantize import quantize_q4_1
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    w[:, 5] *= 20                                              # an outlier in some blocks
    q, scale, offset = int4_quantize(w)
    assert q.dtype == torch.uint8 and int(q.max()) == 15 and int(q.min()) == 0
    # within half a step of each block
    step = scale.expand(64, 4, 32).reshape(64, 128)
    assert bool(((int4_dequantize(q, scale, offset) - w).abs() <= step / 2 + 1e-6).all())
    # a weight as a Q4_1 file stores it (SmolLM2's layers) comes back bit for bit
    stored = torch.from_numpy(dequantize(quantize_q4_1(w).numpy(), "Q4_1").reshape(64, 128))
    assert torch.equal(int4_dequantize(*int4_quantize(stored)), stored)


def q4_1_exact(model):
    """``model`` with every linear weight as a Q4_1 file stores it (float16 ``d`` and ``m``):
    a float32 model whose int4 twin has the same weights, as SmolLM2 is."""
    from minitransformer.gguf import dequantize
    from minitransformer.quantize import quantize_q4_1
    with torch.no_grad():
        for m in model.modules():
            if type(m) is nn.Linear:
                stored = dequantize(quantize_q4_1(m.weight).numpy(), "Q4_1")
                m.weight.copy_(torch.from_numpy(stored).view(m.weight.shape))
    return model


@pytest.mark.parametrize("index", [0, 1], ids=["gpt", "llama"])
def test_an_int4_model_has_float32s_weights_and_parts_from_its_greedy_tokens_at_near_ties_only(
        index):
    """The float32 model (weights made int4-exact) and its int4 twin: the same weights bit for
    bit, so where greedy tokens differ it is the kernel's bfloat16 rounding, and only where
    float32's two best logits were within 2% of the largest logit (measured: 5 of 6 prompts
    equal over 16 tokens for the GPT, 4 of 6 for the Llama, parted where float32's margin was
    0.003 and under, on logits near 0.5)."""
    f32 = q4_1_exact(tiny_models()[index].eval())
    int4 = quantize_linears(q4_1_exact(tiny_models()[index].eval()), bits=4)
    assert all(torch.equal(a.weight, b.dequantized()) for a, b in
               zip((m for m in f32.modules() if type(m) is nn.Linear),
                   (m for m in int4.modules() if isinstance(m, Int4Linear))))
    assert int4._is_as_built(int8=True)
    equal = 0
    with torch.no_grad():
        for seed in range(6):
            idx = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(seed))
            a = generate(f32, idx, 16, temperature=0)[0, 6:]
            b = generate(int4, idx, 16, temperature=0, fast=True)[0, 6:]
            assert torch.equal(b, generate(int4, idx, 16, temperature=0, fast=False)[0, 6:])
            same = int((a == b).int().cumprod(0).sum())
            if same == 16:
                equal += 1
                continue
            logits = f32(torch.cat([idx[0], a[:same]]).unsqueeze(0))[0][0, -1]
            top = logits.topk(2).values
            assert float(top[0] - top[1]) < 0.02 * float(logits.abs().max())
    assert equal >= 3


def test_int4_refusals_name_the_value():
    with pytest.raises(ValueError, match="in_features=40"):
        Int4Linear(40, 16)
    with pytest.raises(TypeError, match="linear"):
        Int4Linear.from_linear(nn.Conv1d(4, 4, 1))
    with pytest.raises(ValueError, match="bits must be 8 or 4, got 2"):
        quantize_linears(tiny_models()[1], bits=2)
    with pytest.raises(ValueError, match="bits=4 quantizes per block of 32"):
        quantize_linears(tiny_models()[1], bits=4, group="row")
    with pytest.raises(ValueError, match="NaN or inf"):
        int4_quantize(torch.tensor([[float("nan")] * 32]))
    model = Llama(LlamaConfig(vocab_size=32, context_length=8, d_model=48, num_heads=2,
                              num_layers=1, d_ff=64))
    with pytest.raises(ValueError, match="in_features=48 do not split into blocks"):
        quantize_linears(model, bits=4)
    assert not any(isinstance(m, Int4Linear) for m in model.modules())    # left as it was
