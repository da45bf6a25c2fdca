"""Llama (minitransformer.llama, chapter 14): RMSNorm, SwiGLU, grouped-query attention, the
config, the model, its KV cache and generation, and transformers' LlamaForCausalLM read and
written with equal logits and tokens."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.llama import (LLAMA_NAMES, GroupedQueryAttention, Llama,  # noqa: E402
                                   LlamaBlock, LlamaConfig, expand_kv_heads)
from helpers import perturbed


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


SIZES = dict(vocab_size=61, context_length=24, num_layers=2, num_heads=4, d_model=32)


def small_llama(dtype=torch.float32, **changes) -> Llama:
    torch.manual_seed(0)
    return perturbed(Llama(LlamaConfig(**{**SIZES, "rope_theta": 500.0, **changes}),
                           dtype=dtype))


IDX = torch.randint(61, (2, 12), generator=torch.Generator().manual_seed(1))


# --- RMSNorm and SwiGLU -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_equals_torch_rms_norm(dtype):
    ours, theirs = mt.RMSNorm(16, eps=1e-5, dtype=dtype), torch.nn.RMSNorm(16, eps=1e-5,
                                                                            dtype=dtype)
    with torch.no_grad():
        ours.weight.copy_(randn(16, dtype=dtype, seed=1))
        theirs.weight.copy_(ours.weight)
    x = 3 * randn(2, 5, 16, dtype=dtype) + 1
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(mt.rms_norm(x, ours.weight, 1e-5), theirs(x))


def test_rms_norm_divides_by_the_root_mean_square_and_keeps_the_mean():
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    y = mt.rms_norm(x, torch.ones(4), eps=1e-12)
    torch.testing.assert_close(y, x / (50 / 4) ** 0.5)
    assert y.mean() > 0.5                      # not centred, unlike layer norm
    assert mt.RMSNorm(4).eps == 1e-6 and not hasattr(mt.RMSNorm(4), "bias")


def test_rms_norm_errors():
    with pytest.raises(ValueError, match="last dimension 8"):
        mt.RMSNorm(8)(torch.zeros(2, 7))
    with pytest.raises(TypeError, match="same dtype"):
        mt.RMSNorm(8)(torch.zeros(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="eps must be positive"):
        mt.RMSNorm(8, eps=0.0)
    with pytest.raises(ValueError, match="weight must have last dimension 4"):
        mt.rms_norm(torch.zeros(2, 4), torch.ones(3))


def test_swiglu_is_down_of_silu_gate_times_up_without_biases():
    block = mt.SwiGLU(8, 12)
    assert [name for name, _ in block.named_parameters()] == [
        "gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    x = randn(3, 8)
    gate, up, down = block.gate_proj.weight, block.up_proj.weight, block.down_proj.weight
    expected = (F.silu(x @ gate.T) * (x @ up.T)) @ down.T
    torch.testing.assert_close(block(x), expected)
    with pytest.raises(ValueError, match="last dimension 8"):
        block(torch.zeros(3, 7))


# --- the config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("d_model, d_ff", [(64, 176), (48, 128), (32, 88), (4096, 10928)])
def test_d_ff_defaults_to_8_thirds_of_d_model_rounded_up_to_a_multiple_of_8(d_model, d_ff):
    config = LlamaConfig(10, 8, 1, 4, d_model)
    assert config.d_ff == d_ff and d_ff % 8 == 0 and 0 <= d_ff - 8 * d_model / 3 < 8


def test_multiple_of_256_gives_llama_7b_s_11008_and_changes_nothing_else():
    llama_7b = LlamaConfig(vocab_size=32000, context_length=4096, num_layers=32, num_heads=32,
                           d_model=4096, multiple_of=256)
    assert llama_7b.d_ff == 11008 == 256 * -(-int(2 * 4 * 4096 / 3) // 256)
    default = LlamaConfig(vocab_size=32000, context_length=4096, num_layers=32, num_heads=32,
                          d_model=4096)
    assert default.d_ff == 10928 and default.multiple_of == 8
    assert dataclasses.replace(default, d_ff=11008) == llama_7b   # multiple_of not compared
    assert LlamaConfig(10, 8, 1, 4, 32, d_ff=100, multiple_of=256).d_ff == 100
    for d_model in range(2, 400, 2):                # 8 is today's rule, 8 * ceil(d_model / 3)
        assert LlamaConfig(10, 8, 1, 1, d_model).d_ff == 8 * -(-d_model // 3)
    model = Llama(LlamaConfig(10, 8, 1, 2, 16, multiple_of=32))
    assert model.config.d_ff == 64 and model.layers[0].feed_forward.up_proj.out_features == 64


def test_config_defaults_and_frozen():
    config = LlamaConfig(10, 8, 1, 4, 32)
    assert config.num_kv_heads == 4 and config.head_dim == 8
    assert (config.rope_theta, config.norm_eps, config.tie_embeddings) == (10000.0, 1e-6, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_kv_heads = 2
    assert dataclasses.replace(config, num_kv_heads=2).num_kv_heads == 2


@pytest.mark.parametrize("changes, error, message", [
    (dict(num_heads=3), ValueError, "divisible by num_heads"),
    (dict(d_model=36, num_heads=4), ValueError, "head_dim must be even.*head_dim=9"),
    (dict(num_kv_heads=3), ValueError, "num_kv_heads must divide num_heads"),
    (dict(num_kv_heads=0), ValueError, "num_kv_heads must be at least 1"),
    (dict(d_ff=2.5), TypeError, "d_ff must be an int"),
    (dict(rope_theta=-1.0), ValueError, "rope_theta must be positive"),
    (dict(tie_embeddings=1), TypeError, "tie_embeddings must be True or False"),
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(multiple_of=0), ValueError, "multiple_of must be at least 1"),
    (dict(multiple_of=2.0), TypeError, "multiple_of must be an int"),
])
def test_config_errors(changes, error, message):
    with pytest.raises(error, match=message):
        LlamaConfig(**{**SIZES, **changes})


# --- grouped-query attention --------------------------------------------------------------------

def test_expand_kv_heads_repeats_each_head_for_its_group():
    kv = torch.arange(2.0).view(1, 2, 1, 1)                       # kv heads 0 and 1
    assert expand_kv_heads(kv, 6).flatten().tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads"):
        expand_kv_heads(kv, 5)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_each_query_head_reads_the_kv_head_of_its_group(num_kv_heads):
    attn = perturbed(GroupedQueryAttention(32, 4, num_kv_heads=num_kv_heads))
    x = randn(2, 5, 32)
    cos, sin = mt.rotary_angles(5, 8)
    mask = mt.causal_mask(5)
    q = attn.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, num_kv_heads, 8).transpose(1, 2)
    v = attn.v_proj(x).view(2, 5, num_kv_heads, 8).transpose(1, 2)
    q, k = mt.apply_rotary(q, cos, sin), mt.apply_rotary(k, cos, sin)
    group = 4 // num_kv_heads
    heads = [mt.scaled_dot_product_attention(q[:, j], k[:, j // group], v[:, j // group], mask)
             for j in range(4)]
    expected = attn.out_proj(torch.cat(heads, dim=-1))
    torch.testing.assert_close(attn(x, rotary=(cos, sin), attn_mask=mask), expected)
    assert attn.k_proj.weight.shape == (num_kv_heads * 8, 32)


def test_with_as_many_kv_heads_as_heads_it_is_multi_head_attention():
    ours = perturbed(GroupedQueryAttention(32, 4))
    mha = mt.MultiHeadAttention(32, 4, bias=False)
    mha.load_state_dict(ours.state_dict())
    x, mask = randn(2, 6, 32), mt.causal_mask(6)
    torch.testing.assert_close(ours(x, attn_mask=mask), mha(x, attn_mask=mask))


def test_attention_errors():
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads"):
        GroupedQueryAttention(32, 4, num_kv_heads=3)
    attn = GroupedQueryAttention(32, 4, num_kv_heads=2)
    x = torch.zeros(1, 3, 32)
    with pytest.raises(ValueError, match=r"rotary's cos must have shape \(T, head_dim\)"):
        attn(x, rotary=mt.rotary_angles(4, 8))
    with pytest.raises(TypeError, match="rotary must be the pair"):
        attn(x, rotary=torch.zeros(3, 8))
    with pytest.raises(ValueError, match="does not broadcast"):
        attn(x, attn_mask=mt.causal_mask(4))


# --- the model ----------------------------------------------------------------------------------

def test_the_model_has_no_position_table_no_biases_and_an_untied_head():
    model = Llama(LlamaConfig(**SIZES, num_kv_heads=2))
    names = [name for name, _ in model.named_parameters()]
    assert not any("bias" in name or "position" in name for name in names)
    assert model.head.weight is not model.token_embedding.weight
    assert isinstance(model.layers[0], LlamaBlock)
    tied = Llama(LlamaConfig(**SIZES, tie_embeddings=True))
    assert tied.head.weight is tied.token_embedding.weight
    assert mt.gpt.count_parameters(tied) == mt.gpt.count_parameters(model) - 61 * 32 + 2 * (
        2 * 32 * 16)  # the kv projections of 2 layers are twice as wide with 4 kv heads


def test_forward_checks_and_loss_as_gpt():
    model = small_llama()
    logits, loss = model(IDX, IDX)
    assert logits.shape == (2, 12, 61)
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), IDX.flatten()))
    targets = IDX.clone()
    targets[:, :6] = -100
    _, part = model(IDX, targets)
    torch.testing.assert_close(part, F.cross_entropy(logits[:, 6:].flatten(0, 1),
                                                     IDX[:, 6:].flatten()))
    with pytest.raises(ValueError, match="more than context_length=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 3), 61))
    with pytest.raises(TypeError, match="int64 or int32"):
        model(IDX.to(torch.int16))
    with pytest.raises(ValueError, match="targets must have the shape of idx"):
        model(IDX, IDX[:, :5])
    with pytest.raises(ValueError, match="kv_cache has 1 layers"):
        model(IDX, kv_cache=mt.KVCache(1))
    with pytest.raises(TypeError, match="config must be a LlamaConfig"):
        Llama(mt.GPTConfig(**SIZES))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("chunk", [1, 5])
def test_cached_chunks_equal_the_full_pass(num_kv_heads, chunk):
    model = small_llama(num_kv_heads=num_kv_heads)
    with torch.no_grad():
        full, _ = model(IDX)
        cache = mt.KVCache(2)
        parts = [model(IDX[:, i:i + chunk], kv_cache=cache)[0]
                 for i in range(0, IDX.shape[1], chunk)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)


def test_the_cached_path_rotates_at_the_cached_positions():
    """Negative control: a model that forgets the offset (every chunk at position 0) differs."""
    model = small_llama()

    class NoOffset(Llama):
        def _rotary(self, past, length, x):
            return super()._rotary(0, length, x)

    wrong = NoOffset(model.config)
    wrong.load_state_dict(model.state_dict())
    with torch.no_grad():
        full = model(IDX)[0]
        cache = mt.KVCache(2)
        wrong(IDX[:, :6], kv_cache=cache)
        late = wrong(IDX[:, 6:], kv_cache=cache)[0]
    assert (late - full[:, 6:]).abs().max() > 1e-2


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("max_len", [None, 20])
def test_the_cache_holds_only_the_kv_heads(num_kv_heads, max_len):
    model = small_llama(num_kv_heads=num_kv_heads)
    cache = mt.KVCache(2, max_len=max_len)
    with torch.no_grad():
        model(IDX, kv_cache=cache)
    head_dim, positions = 8, max_len or IDX.shape[1]
    assert cache.keys[0].shape == (2, num_kv_heads, positions, head_dim)
    assert cache.nbytes == 2 * 2 * 2 * positions * num_kv_heads * head_dim * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("chunk", [1, 3])
def test_the_decode_step_is_forward_bit_for_bit(dtype, num_kv_heads, chunk):
    model = small_llama(dtype=dtype, num_kv_heads=num_kv_heads)
    ours, step = mt.KVCache(2), model.make_decode_step()
    theirs = mt.KVCache(2, max_len=24)
    with torch.no_grad():
        for i in range(0, IDX.shape[1], chunk):
            expected = model(IDX[:, i:i + chunk], kv_cache=ours)[0]
            assert torch.equal(step(IDX[:, i:i + chunk], theirs), expected)
    assert torch.equal(model.decode_step(IDX[:, :1], mt.KVCache(2)), model(IDX[:, :1])[0])


def test_a_changed_model_takes_forward_and_the_step_refuses_the_context():
    model = small_llama()
    model.layers[0].norm1.register_forward_hook(lambda module, args, out: out * 2)
    cache = mt.KVCache(2)
    with torch.no_grad():
        expected = model(IDX[:, :3])[0]
        assert torch.equal(model.make_decode_step()(IDX[:, :3], cache), expected)
    full = mt.KVCache(2)
    with torch.no_grad():
        small_llama()(IDX, kv_cache=full)
        small_llama()(IDX, kv_cache=full)
        with pytest.raises(ValueError, match="context_length=24"):
            small_llama().make_decode_step()(IDX[:, :1], full)


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_generate_cached_equals_uncached(num_kv_heads):
    model = small_llama(num_kv_heads=num_kv_heads)
    cached = mt.generate(model, IDX[:, :4], 16, temperature=0)
    uncached = mt.generate(model, IDX[:, :4], 16, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)
    sampled = [mt.generate(model, IDX[:, :4], 10, use_cache=use_cache,
                           generator=torch.Generator().manual_seed(3))
               for use_cache in (True, False)]
    assert torch.equal(*sampled)


def test_train_runs_on_a_llama():
    model = Llama(LlamaConfig(**SIZES))
    data = torch.randint(61, (4, 13), generator=torch.Generator().manual_seed(0))
    batches = iter([(data[:, :-1], data[:, 1:])] * 30)
    before = model(data[:, :-1], data[:, 1:])[1].item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches:
        optimizer.zero_grad()
        model.train()(x, y)[1].backward()
        optimizer.step()
    assert model.eval()(data[:, :-1], data[:, 1:])[1].item() < before / 2


# --- checkpoints: transformers' LlamaForCausalLM ------------------------------------------------

transformers_required = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None,
    reason="transformers is not installed")


def test_the_name_table_covers_every_tensor_once(tmp_path):
    for tie in (False, True):
        model = small_llama(tie_embeddings=tie)
        model.save_pretrained(tmp_path / str(tie))
        from safetensors.torch import load_file
        names = set(load_file(tmp_path / str(tie) / "model.safetensors"))
        expected = {row.theirs.format(i=i) for row in LLAMA_NAMES for i in range(2)}
        if tie:
            expected.discard("lm_head.weight")
        assert names == expected


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_round_trip_every_tensor(tmp_path, tie, num_kv_heads):
    model = small_llama(tie_embeddings=tie, num_kv_heads=num_kv_heads)
    model.save_pretrained(tmp_path)
    copy = Llama.from_pretrained(tmp_path)
    assert copy.config == model.config and not copy.training
    assert (copy.head.weight is copy.token_embedding.weight) == tie
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name


@transformers_required
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-5)])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_transformers_loads_what_we_save_with_equal_logits(tmp_path, dtype, tolerance, tie,
                                                          num_kv_heads):
    import transformers

    model = small_llama(dtype=dtype, tie_embeddings=tie, num_kv_heads=num_kv_heads)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["bos_token_id"] is None and config["eos_token_id"] is None
    for auto in (transformers.LlamaForCausalLM, transformers.AutoModelForCausalLM):
        theirs, info = auto.from_pretrained(tmp_path, output_loading_info=True)
        assert not (info["missing_keys"] or info["unexpected_keys"]
                    or info["mismatched_keys"]), info
    assert theirs.dtype == dtype and theirs.config.num_key_value_heads == num_kv_heads
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(IDX).logits, model(IDX)[0], rtol=0,
                                   atol=tolerance)


def _their_model(tmp_path, dtype=torch.float32, **changes):
    """transformers' LlamaForCausalLM, perturbed, saved by transformers into tmp_path."""
    import transformers

    fields = dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=24,
                  rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                      "rope_theta": 300.0})
    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**fields, **changes}))
    theirs = perturbed(theirs.to(dtype))
    theirs.save_pretrained(tmp_path)
    return theirs


@transformers_required
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-5)])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("layout", ["rope_parameters", "top-level rope_theta"])
def test_we_load_what_transformers_saves_with_equal_logits(tmp_path, dtype, tolerance, tie,
                                                           num_kv_heads, layout):
    import transformers

    theirs = _their_model(tmp_path, dtype, tie_word_embeddings=tie,
                          num_key_value_heads=num_kv_heads)
    if layout != "rope_parameters":     # the layout of most published checkpoints
        config = json.loads((tmp_path / "config.json").read_text())
        assert config.pop("rope_parameters")["rope_theta"] == 300.0
        config["rope_theta"] = 300.0
        (tmp_path / "config.json").write_text(json.dumps(config))
        theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=dtype)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.rope_theta == 300.0 and ours.config.tie_embeddings == tie
    assert ours.config.num_kv_heads == num_kv_heads and ours.config.norm_eps == 1e-5
    assert ours.token_embedding.weight.dtype == dtype
    with torch.no_grad():
        torch.testing.assert_close(ours(IDX)[0], theirs.eval()(IDX).logits, rtol=0,
                                   atol=tolerance)


@transformers_required
@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_greedy_tokens_equal_transformers_generate(tmp_path, num_kv_heads):
    import transformers

    model = small_llama(num_kv_heads=num_kv_heads)
    model.save_pretrained(tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        their_tokens = theirs.generate(IDX[:, :4], max_new_tokens=16, do_sample=False,
                                       min_new_tokens=16, pad_token_id=0)
    for use_cache in (True, False):
        ours = mt.generate(model, IDX[:, :4], 16, temperature=0, use_cache=use_cache)
        assert torch.equal(ours, their_tokens)


@transformers_required
@pytest.mark.parametrize("field, value, named", [
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "'llama3'"),
    ("rope_scaling", {"type": "linear", "factor": 2.0}, "'linear'"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "'dynamic'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, "'yarn'"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5}, "'llama3'"),
    ("model_type", "mistral", "model_type is 'mistral'"),
    ("hidden_act", "gelu", "hidden_act is 'gelu'"),
    ("attention_bias", True, "attention_bias is True"),
    ("mlp_bias", True, "mlp_bias is True"),
    ("head_dim", 16, "head_dim is 16"),
])
def test_a_config_llama_cannot_express_is_refused_by_name(tmp_path, field, value, named):
    small_llama().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named) as error:
        Llama.from_pretrained(tmp_path)
    assert "config.json" in str(error.value)


def test_a_default_rope_scaling_entry_is_accepted(tmp_path):
    small_llama().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert Llama.from_pretrained(tmp_path).config.rope_theta == 500.0


def test_unknown_or_missing_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    small_llama().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    save_file({**tensors, "model.layers.5.mlp.up_proj.weight": torch.zeros(1)}, weights)
    with pytest.raises(ValueError, match="model.layers.5.mlp.up_proj.weight"):
        Llama.from_pretrained(tmp_path)
    del tensors["model.norm.weight"]
    save_file(tensors, weights)
    with pytest.raises(ValueError, match="no tensor 'model.norm.weight'"):
        Llama.from_pretrained(tmp_path)


@transformers_required
def test_the_tokenizer_s_eos_makes_transformers_stop_where_we_stop(tmp_path):
    import transformers

    model = small_llama(num_kv_heads=2)
    free = mt.generate(model, IDX[:1, :4], 12, temperature=0)
    eos = int(free[0, 8])                                           # the 5th new token
    model.save_pretrained(tmp_path, eos_token_id=eos)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eos_token_id"] == eos and config["bos_token_id"] is None
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        their_tokens = theirs.generate(IDX[:1, :4], max_new_tokens=12, do_sample=False,
                                       pad_token_id=eos)
    ours = mt.generate(model, IDX[:1, :4], 12, temperature=0, eos_id=eos)
    assert torch.equal(ours, their_tokens)
    assert ours.shape[1] < 4 + 12 and ours[0, -1] == eos
    with pytest.raises(ValueError, match="eos_token_id=61 is not a token of the vocabulary"):
        model.save_pretrained(tmp_path, eos_token_id=61)
