"""LoRA (minitransformer.lora, chapter 16): the layer's equation, its start, merge and unmerge,
wrapping a model by name, and adapters read and written in PEFT's layout with logits equal to
PEFT's on transformers' LlamaForCausalLM and GPT2LMHeadModel."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.gpt import GPT, GPTConfig  # noqa: E402
from minitransformer.llama import Llama, LlamaConfig  # noqa: E402
from minitransformer.lora import (LoRALinear, add_lora, load_adapter, merge_lora,  # noqa: E402
                                  peft_module_names, save_adapter, trainable_parameters)
from helpers import perturbed

# PEFT asks transformers a question it has deprecated; not ours to answer
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
peft_required = pytest.mark.skipif(
    __import__("importlib").util.find_spec("peft") is None, reason="peft is not installed")
transformers_required = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None,
    reason="transformers is not installed")


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_B(model: nn.Module, seed: int = 1) -> nn.Module:
    """Nonzero B in every LoRA layer (PEFT's or ours), so that an adapter changes the logits
    and no comparison can pass with the adapter left out."""
    g = generator(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


LLAMA = dict(vocab_size=61, context_length=24, num_layers=2, num_heads=4, d_model=32,
             num_kv_heads=2, rope_theta=500.0)
IDX = torch.randint(61, (2, 12), generator=generator(1))


def small_llama(**changes) -> Llama:
    torch.manual_seed(0)
    return perturbed(Llama(LlamaConfig(**{**LLAMA, **changes})))


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return perturbed(GPT(GPTConfig(vocab_size=61, context_length=24, num_layers=2,
                                   num_heads=4, d_model=32)))


def logits(model: nn.Module, idx: torch.Tensor = IDX) -> torch.Tensor:
    with torch.no_grad():
        out = model(idx)
    return out[0] if isinstance(out, tuple) else out.logits


# --- the layer --------------------------------------------------------------------------------

def test_a_wrapped_layer_starts_equal_to_its_base_with_A_random_and_B_zero():
    torch.manual_seed(0)
    base = nn.Linear(64, 48)
    layer = LoRALinear(base, 8, alpha=16)
    x = torch.randn(5, 64)
    assert torch.equal(layer(x), base(x))
    assert torch.count_nonzero(layer.lora_B.weight) == 0          # B = 0, not A = 0
    assert torch.count_nonzero(layer.lora_A.weight) == layer.lora_A.weight.numel()
    # PEFT's start: Kaiming-uniform with a = sqrt(5), i.e. uniform in +-1/sqrt(in_features)
    bound = 1 / math.sqrt(64)
    assert layer.lora_A.weight.abs().max() <= bound
    assert abs(layer.lora_A.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound
    assert layer.lora_A.weight.shape == (8, 64) and layer.lora_B.weight.shape == (48, 8)
    assert layer.weight is base.weight and layer.bias is base.bias


@pytest.mark.parametrize("r, alpha", [(4, 8.0), (8, 2.0), (1, 1.0)])
def test_the_output_is_W_x_plus_b_plus_alpha_over_r_B_A_x(r, alpha):
    torch.manual_seed(0)
    base = nn.Linear(16, 12, dtype=torch.float64)
    layer = random_B(LoRALinear(base, r, alpha=alpha))
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    A, B = layer.lora_A.weight, layer.lora_B.weight
    expected = x @ base.weight.T + base.bias + (alpha / r) * (x @ A.T @ B.T)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(layer.delta_weight(), (alpha / r) * B @ A, rtol=0, atol=1e-12)


def test_only_A_and_B_train_and_at_the_start_only_B_gets_a_gradient():
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(16, 12), 4, alpha=4)
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == [
        "lora_A.weight", "lora_B.weight"]
    layer(torch.randn(5, 16)).square().sum().backward()
    assert layer.weight.grad is None and layer.bias.grad is None
    assert torch.count_nonzero(layer.lora_A.weight.grad) == 0     # B = 0 blocks A's gradient
    assert torch.count_nonzero(layer.lora_B.weight.grad) > 0


def test_merge_keeps_the_output_and_unmerge_gives_the_weight_back():
    torch.manual_seed(0)
    base = nn.Linear(32, 24)
    before = base.weight.detach().clone()
    layer = random_B(LoRALinear(base, 4, alpha=8))
    x = torch.randn(6, 32)
    unmerged = layer(x)
    layer.merge()
    assert layer.merged
    torch.testing.assert_close(base.weight, before + 2.0 * layer.lora_B.weight @
                               layer.lora_A.weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(layer(x), unmerged, rtol=0, atol=1e-5)
    assert torch.equal(layer(x), base(x))                         # merged: the base alone
    layer.unmerge()
    assert not layer.merged
    torch.testing.assert_close(base.weight, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(layer(x), unmerged, rtol=0, atol=1e-5)


def test_dropout_acts_on_the_lora_branch_in_training_only():
    torch.manual_seed(0)
    base = nn.Linear(16, 12)
    layer = random_B(LoRALinear(base, 4, alpha=8, dropout=0.5))
    x = torch.randn(64, 16)
    without = random_B(LoRALinear(base, 4, alpha=8))
    without.lora_A.weight.data.copy_(layer.lora_A.weight)
    assert torch.equal(layer.eval()(x), without(x))
    trained = layer.train()(x)
    assert not torch.allclose(trained, without(x))
    torch.manual_seed(3)
    kept = nn.functional.dropout(x, 0.5)
    torch.manual_seed(3)
    torch.testing.assert_close(layer(x), base(x) + 2.0 * layer.lora_B(layer.lora_A(kept)))


def test_a_float64_adapter_on_a_float32_layer_returns_float32():
    torch.manual_seed(0)
    base = nn.Linear(16, 12)
    layer = random_B(LoRALinear(base, 4, alpha=8, dtype=torch.float64))
    assert layer.lora_A.weight.dtype == torch.float64
    x = torch.randn(3, 16)
    out = layer(x)
    assert out.dtype == torch.float32
    expected = base(x).double() + x.double() @ layer.delta_weight().T
    torch.testing.assert_close(out, expected.float())


# --- a model ----------------------------------------------------------------------------------

def test_add_lora_wraps_the_named_layers_and_the_model_starts_equal():
    model = small_llama()
    before = logits(model)
    total = sum(p.numel() for p in model.parameters())
    assert add_lora(model, r=4, alpha=8) is model
    for layer in model.layers:
        assert isinstance(layer.self_attn.q_proj, LoRALinear)
        assert isinstance(layer.self_attn.v_proj, LoRALinear)
        assert type(layer.self_attn.k_proj) is nn.Linear
    assert torch.equal(logits(model), before)
    # per layer: q (32 -> 32) and v (32 -> 2 kv heads * 8 = 16), each r * (in + out)
    lora = 2 * (4 * (32 + 32) + 4 * (32 + 16))
    assert trainable_parameters(model) == (lora, total + lora)
    assert {n.split(".")[-2] for n, p in model.named_parameters() if p.requires_grad} == {
        "lora_A", "lora_B"}


def test_a_training_step_changes_B_only_and_leaves_the_base_as_it_was():
    model = small_llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    add_lora(model, r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"))
    layer = model.layers[0].self_attn.q_proj
    A = layer.lora_A.weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    _, loss = model.train()(IDX, IDX)
    loss.backward()
    optimizer.step()
    for name, value in model.state_dict().items():
        if "lora_" not in name:
            assert torch.equal(value, state[name.replace(".base_layer", "")]), name
    assert torch.equal(layer.lora_A.weight, A)                     # no gradient reached A yet
    assert torch.count_nonzero(layer.lora_B.weight) > 0


def test_the_cached_decode_step_uses_the_adapter():
    model = random_B(add_lora(small_llama(), r=4, alpha=8))
    full = logits(model)
    torch.testing.assert_close(model.decode_step(IDX, mt.KVCache(2)), full, rtol=0, atol=1e-5)
    cache = mt.KVCache(2)
    model.decode_step(IDX[:, :-1], cache)
    torch.testing.assert_close(model.decode_step(IDX[:, -1:], cache)[:, 0], full[:, -1],
                               rtol=0, atol=1e-5)


def test_merge_lora_gives_a_plain_model_with_the_same_logits():
    model = random_B(add_lora(small_llama(), r=4, alpha=8,
                              targets=("q_proj", "k_proj", "out_proj", "up_proj")))
    model.layers[1].self_attn.k_proj.merge()                      # one merged already: kept
    unmerged = logits(model)
    assert merge_lora(model) is model
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert type(model.layers[0].self_attn.q_proj) is nn.Linear
    assert all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(logits(model), unmerged, rtol=0, atol=1e-5)
    assert not torch.allclose(logits(model), logits(small_llama()), atol=1e-3)


# --- against PEFT and transformers: Llama -----------------------------------------------------

@pytest.fixture(scope="module")
def llama_base(tmp_path_factory):
    """Our small Llama saved with save_pretrained: the base both sides start from."""
    path = tmp_path_factory.mktemp("llama_base")
    small_llama().save_pretrained(path)
    return path


def their_model(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


@transformers_required
def test_a_merged_model_saved_with_save_pretrained_loads_in_transformers(llama_base, tmp_path):
    model = random_B(add_lora(Llama.from_pretrained(llama_base), r=4, alpha=8))
    unmerged = logits(model)
    merge_lora(model).save_pretrained(tmp_path)
    plain = their_model(tmp_path)
    assert type(plain).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(logits(plain), unmerged, rtol=0, atol=1e-5)


ALL_LLAMA = ("q_proj", "k_proj", "v_proj", "out_proj", "gate_proj", "up_proj", "down_proj")


@peft_required
@pytest.mark.parametrize("targets, theirs", [
    (("q_proj", "v_proj"), ["q_proj", "v_proj"]),
    (ALL_LLAMA, ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]),
    (("layers.1.self_attn.out_proj",), ["layers.1.self_attn.o_proj"]),
])
def test_peft_reads_our_adapter_with_our_logits(llama_base, tmp_path, targets, theirs):
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    model = random_B(add_lora(Llama.from_pretrained(llama_base), r=4, alpha=8, targets=targets,
                              dropout=0.1))
    save_adapter(model, tmp_path, base_model_name_or_path=str(llama_base))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert {k: config[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout",
                                   "bias", "target_modules", "base_model_name_or_path")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
        "lora_dropout": 0.1, "bias": "none", "target_modules": theirs,
        "base_model_name_or_path": str(llama_base)}
    adapted = PeftModel.from_pretrained(their_model(llama_base), tmp_path).eval()
    # PEFT put LoRA on exactly our layers, no more
    assert sum(isinstance(m, LoraLayer) for m in adapted.modules()) == len(
        peft_module_names(model))
    ours = logits(model.eval())
    assert not torch.allclose(ours, logits(their_model(llama_base)), atol=1e-3)
    torch.testing.assert_close(logits(adapted), ours, rtol=0, atol=1e-5)


def test_the_tensor_names_are_peft_s(tmp_path):
    from safetensors.torch import load_file

    model = add_lora(small_llama(), r=2, alpha=4, targets=("out_proj",))
    save_adapter(model, tmp_path, base_model_name_or_path="base")
    assert sorted(load_file(tmp_path / "adapter_model.safetensors")) == [
        f"base_model.model.model.layers.{i}.self_attn.o_proj.lora_{p}.weight"
        for i in (0, 1) for p in "AB"]


@peft_required
def test_we_read_an_adapter_peft_wrote_with_its_logits(llama_base, tmp_path):
    from peft import LoraConfig, get_peft_model

    theirs = get_peft_model(their_model(llama_base), LoraConfig(
        r=4, lora_alpha=6, lora_dropout=0.2, task_type="CAUSAL_LM",
        target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))
    random_B(theirs).save_pretrained(tmp_path)
    expected = logits(theirs.eval())
    model = load_adapter(Llama.from_pretrained(llama_base), tmp_path)
    layer = model.layers[0].self_attn.out_proj
    assert isinstance(layer, LoRALinear)
    assert (layer.r, layer.alpha, layer.lora_dropout.p) == (4, 6.0, 0.2)
    assert type(model.layers[0].self_attn.k_proj) is nn.Linear
    assert not torch.allclose(expected, logits(Llama.from_pretrained(llama_base)), atol=1e-3)
    torch.testing.assert_close(logits(model.eval()), expected, rtol=0, atol=1e-5)
    assert trainable_parameters(model)[0] == sum(
        p.numel() for p in theirs.parameters() if p.requires_grad)


def test_our_adapter_reads_back_into_ours(tmp_path):
    model = random_B(add_lora(small_llama(), r=3, alpha=5, targets=ALL_LLAMA))
    save_adapter(model, tmp_path, base_model_name_or_path="base")
    again = load_adapter(small_llama(), tmp_path)
    assert torch.equal(logits(again), logits(model))


# --- GPT: GPT-2's fused c_attn ----------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt_base(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt_base")
    small_gpt().save_pretrained(path)
    return path


@peft_required
@pytest.mark.parametrize("targets, theirs", [
    (("out_proj", "linear1", "linear2"), ["c_fc", "c_proj"]),
    (("out_proj",), ["attn.c_proj"]),
])
def test_gpt_adapters_outside_c_attn_go_to_peft_exactly(gpt_base, tmp_path, targets, theirs):
    from peft import PeftModel

    model = random_B(add_lora(GPT.from_pretrained(gpt_base), r=4, alpha=8, targets=targets))
    save_adapter(model, tmp_path, base_model_name_or_path=str(gpt_base))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["target_modules"] == theirs and config["fan_in_fan_out"] is True
    adapted = PeftModel.from_pretrained(their_model(gpt_base), tmp_path).eval()
    ours = logits(model.eval())
    assert not torch.allclose(ours, logits(GPT.from_pretrained(gpt_base)), atol=1e-3)
    torch.testing.assert_close(logits(adapted), ours, rtol=0, atol=1e-5)


@peft_required
def test_we_read_peft_s_gpt2_adapter_outside_c_attn(gpt_base, tmp_path):
    from peft import LoraConfig, get_peft_model

    theirs = get_peft_model(their_model(gpt_base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_proj", "c_fc"], fan_in_fan_out=True))
    random_B(theirs).save_pretrained(tmp_path)
    model = load_adapter(GPT.from_pretrained(gpt_base), tmp_path)
    assert isinstance(model.layers[1].feed_forward.linear2, LoRALinear)
    torch.testing.assert_close(logits(model.eval()), logits(theirs.eval()), rtol=0, atol=1e-5)


def test_our_gpt_q_k_v_adapter_is_refused_by_name(tmp_path):
    model = add_lora(small_gpt(), r=4, alpha=8, targets=("q_proj", "v_proj"))
    logits(model)                                                 # it trains and runs here
    with pytest.raises(ValueError, match=r"q_proj, k_proj, v_proj as one layer, "
                                         r"transformer\.h\.0\.attn\.c_attn.*single A"):
        save_adapter(model, tmp_path / "adapter", base_model_name_or_path="base")
    assert not (tmp_path / "adapter").exists()


@peft_required
def test_peft_s_c_attn_adapter_is_refused_by_name(gpt_base, tmp_path):
    from peft import LoraConfig, get_peft_model

    theirs = get_peft_model(their_model(gpt_base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True))
    theirs.save_pretrained(tmp_path)
    model = GPT.from_pretrained(gpt_base)
    with pytest.raises(ValueError, match=r"c_attn.*single A shared by all 3"):
        load_adapter(model, tmp_path)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())   # left as it was


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(r=0, alpha=8), ValueError, r"r must be at least 1, got 0"),
    (dict(r=-2, alpha=8), ValueError, r"r must be at least 1, got -2"),
    (dict(r=2.0, alpha=8), TypeError, r"r must be an int"),
    (dict(r=4, alpha=0), ValueError, r"alpha must be positive, got 0"),
    (dict(r=4, alpha=-1.5), ValueError, r"alpha must be positive, got -1.5"),
    (dict(r=4, alpha=float("nan")), ValueError, r"alpha must be finite"),
    (dict(r=4, alpha="8"), TypeError, r"alpha must be a number"),
    (dict(r=4, alpha=8, dropout=1.0), ValueError, r"dropout must be a number in \[0, 1\)"),
    (dict(r=4, alpha=8, targets=()), ValueError, r"targets is empty"),
    (dict(r=4, alpha=8, targets=["q_proj", 3]), TypeError, r"each target must be a layer"),
    (dict(r=4, alpha=8, targets=("q_proj", "qproj")), ValueError,
     r"no layer of this Llama is called 'qproj'; its linear layers are down_proj, gate_proj, "
     r"head, k_proj, out_proj, q_proj, up_proj, v_proj"),
    (dict(r=4, alpha=8, targets=("o_proj",)), ValueError,
     r"'o_proj' \(transformers' o_proj is our out_proj\)"),
    (dict(r=4, alpha=8, targets=("norm1",)), ValueError,
     r"target 'norm1' names layers.0.norm1, a RMSNorm, not a linear layer"),
])
def test_add_lora_refuses_bad_input_and_leaves_the_model_alone(kwargs, error, message):
    model = small_llama()
    with pytest.raises(error, match=message):
        add_lora(model, **kwargs)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())


def test_a_tied_head_is_refused():
    for model in (small_llama(tie_embeddings=True), small_gpt()):
        with pytest.raises(ValueError, match=r"head.weight is tied to token_embedding.weight"):
            add_lora(model, r=4, alpha=8, targets=("head",))
    add_lora(small_llama(), r=4, alpha=8, targets=("head",))     # untied: allowed


def test_wrapping_twice_is_refused():
    model = add_lora(small_llama(), r=4, alpha=8)
    with pytest.raises(ValueError, match=r"already has LoRA layers \(layers.0.self_attn.q_proj, "
                                         r".*merge_lora"):
        add_lora(model, r=4, alpha=8, targets=("k_proj",))
    with pytest.raises(TypeError, match=r"already a LoRALinear"):
        LoRALinear(model.layers[0].self_attn.q_proj, 4, alpha=8)


def test_merge_twice_and_unmerge_unmerged_are_refused():
    layer = LoRALinear(nn.Linear(8, 8), 2, alpha=2)
    with pytest.raises(ValueError, match=r"not merged"):
        layer.unmerge()
    layer.merge()
    with pytest.raises(ValueError, match=r"already merged.*twice"):
        layer.merge()
    with pytest.raises(ValueError, match=r"no LoRA layers to merge"):
        merge_lora(small_llama())


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((nn.Embedding(4, 4), 2), dict(alpha=2), TypeError, r"base must be an nn.Linear"),
    ((nn.Linear(4, 4), 0), dict(alpha=2), ValueError, r"r must be at least 1"),
    ((nn.Linear(4, 4), 2), dict(alpha=0.0), ValueError, r"alpha must be positive"),
    ((nn.Linear(4, 4), 2), dict(alpha=2, device="meta"), ValueError,
     r"device='meta', but the base layer's weight is on cpu"),
    ((nn.Linear(4, 4), 2), dict(alpha=2, dtype=torch.int64), TypeError, r"dtype must be"),
])
def test_the_layer_refuses_bad_input(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        LoRALinear(*args, **kwargs)


def test_save_adapter_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match=r"no LoRA layers"):
        save_adapter(small_llama(), tmp_path, base_model_name_or_path="base")
    plain = add_lora(nn.Sequential(nn.Linear(4, 4)), r=2, alpha=2, targets=("0",))
    with pytest.raises(TypeError, match=r"must be a GPT or a Llama, got Sequential"):
        save_adapter(plain, tmp_path, base_model_name_or_path="base")
    model = add_lora(small_llama(), r=4, alpha=8)
    with pytest.raises(TypeError, match=r"base_model_name_or_path must be a str"):
        save_adapter(model, tmp_path, base_model_name_or_path=None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"is a file"):
        save_adapter(model, tmp_path / "file", base_model_name_or_path="base")
    model.layers[1].self_attn.v_proj = LoRALinear(model.layers[1].self_attn.v_proj.base_layer,
                                                  2, alpha=8)
    with pytest.raises(ValueError, match=r"differ in \(r, alpha, dropout\)"):
        save_adapter(model, tmp_path / "a", base_model_name_or_path="base")


@pytest.fixture
def adapter(tmp_path):
    """A saved adapter of the small Llama, and a function that edits its config."""
    save_adapter(add_lora(small_llama(), r=4, alpha=8), tmp_path, base_model_name_or_path="b")

    def edit(**changes):
        path = tmp_path / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return tmp_path, edit


@pytest.mark.parametrize("changes, message", [
    (dict(peft_type="IA3"), r"peft_type is 'IA3', not 'LORA'"),
    (dict(task_type="SEQ_CLS"), r"task_type is 'SEQ_CLS'"),
    (dict(use_rslora=True), r"use_rslora is True \(alpha / sqrt\(r\) scaling\)"),
    (dict(use_dora=True), r"use_dora is True"),
    (dict(bias="all"), r"bias is 'all'"),
    (dict(modules_to_save=["lm_head"]), r"modules_to_save is \['lm_head'\]"),
    (dict(rank_pattern={"q_proj": 8}), r"rank_pattern"),
    (dict(r=0), r"r must be at least 1, got 0"),
    (dict(r=8), r"lora_A of model.layers.0.self_attn.q_proj has shape \(4, 32\); r=8"),
    (dict(lora_alpha=None), r"lora_alpha must be a number"),
])
def test_load_adapter_refuses_what_it_cannot_express(adapter, changes, message):
    path, edit = adapter
    edit(**changes)
    model = small_llama()
    with pytest.raises(ValueError, match=message):
        load_adapter(model, path)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())


def test_load_adapter_refuses_bad_files(adapter, tmp_path_factory):
    from safetensors.torch import load_file, save_file

    path, _ = adapter
    weights = path / "adapter_model.safetensors"
    tensors = load_file(weights)
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    for changed, message in [
        ({**tensors, "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight":
          tensors[name.replace("lora_B", "lora_A")].clone()},
         r"no layer 'model.layers.5.self_attn"),
        ({**tensors, "base_model.model.lm_head.weight": tensors[name].clone()},
         r"'base_model.model.lm_head.weight', which is not a LoRA A or B weight"),
        ({k: v for k, v in tensors.items() if k != name},
         r"no lora_B for model.layers.0.self_attn.q_proj"),
        ({}, r"holds no LoRA weights"),
    ]:
        save_file(changed, weights)
        with pytest.raises(ValueError, match=message):
            load_adapter(small_llama(), path)
    weights.write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=r"not a readable safetensors file"):
        load_adapter(small_llama(), path)
    (path / "adapter_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"adapter_config.json is not a JSON file"):
        load_adapter(small_llama(), path)
    empty = tmp_path_factory.mktemp("empty")
    (empty / "adapter_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"adapter_config.json does not exist "
                                                r"\(adapter_model.bin .* pickle"):
        load_adapter(small_llama(), empty)
    with pytest.raises(FileNotFoundError, match=r"no such directory"):
        load_adapter(small_llama(), empty / "missing")
    with pytest.raises(TypeError, match=r"path must be a str or os.PathLike"):
        load_adapter(small_llama(), 3)


def test_load_adapter_into_a_model_that_has_lora_is_refused(adapter):
    path, _ = adapter
    with pytest.raises(ValueError, match=r"already has LoRA layers"):
        load_adapter(add_lora(small_llama(), r=4, alpha=8), path)
