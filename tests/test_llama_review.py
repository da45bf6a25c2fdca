"""Llama (chapter 14, issue 23): cases the review of the package found untested.

bfloat16 checkpoints kept as bfloat16, generation that ends exactly at ``context_length``, and
the fast decode step against ``forward`` when a linear layer was given a bias.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.llama import Llama, LlamaConfig  # noqa: E402

SIZES = dict(vocab_size=61, context_length=24, num_layers=2, num_heads=4, d_model=32)
IDX = torch.randint(61, (2, 24), generator=torch.Generator().manual_seed(1))


def small_llama(dtype=torch.float32, device="cpu", **changes) -> Llama:
    """Initialised on the CPU, then moved: the same weights on every device."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**SIZES, "rope_theta": 500.0, **changes}), dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():           # off the initial values: norms start at 1
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator).to(dtype))
    return model.eval().to(device)


def test_a_bfloat16_checkpoint_stays_bfloat16_and_generates_the_same_both_ways(tmp_path, device):
    model = small_llama(torch.bfloat16, num_kv_heads=2)
    model.save_pretrained(tmp_path)
    copy = Llama.from_pretrained(tmp_path)
    assert copy.token_embedding.weight.dtype == torch.bfloat16
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name
    copy, prompt = copy.to(device), IDX[:, :4].to(device)
    cached = mt.generate(copy, prompt, 12, temperature=0)
    assert cached.device.type == device.type
    assert torch.equal(cached, mt.generate(copy, prompt, 12, temperature=0, use_cache=False))
    assert Llama.from_pretrained(tmp_path, dtype=torch.float32).head.weight.dtype == torch.float32


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_generation_up_to_the_last_position_is_the_same_cached_and_uncached(num_kv_heads,
                                                                            device):
    model, idx = small_llama(num_kv_heads=num_kv_heads, device=device), IDX.to(device)
    prompt = idx[:, :4]
    new = SIZES["context_length"] - prompt.shape[1]         # ends at position 23 exactly
    cached = mt.generate(model, prompt, new, temperature=0)
    assert cached.shape == (2, SIZES["context_length"])
    assert torch.equal(cached, mt.generate(model, prompt, new, temperature=0, use_cache=False))
    step, cache = model.make_decode_step(), mt.KVCache(2)
    with torch.no_grad():
        full = model(idx)[0]
        parts = [step(idx[:, :20], cache)] + [step(idx[:, i:i + 1], cache)
                                              for i in range(20, 24)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("where", ["self_attn.v_proj", "self_attn.out_proj",
                                   "feed_forward.gate_proj", "feed_forward.down_proj"])
def test_the_decode_step_is_forward_when_a_linear_layer_has_a_bias(where, device):
    """A learner trying one of the variants the chapter mentions (Qwen-style attention biases,
    say) swaps in a biased nn.Linear: generate must not change with use_cache."""
    model = small_llama()
    owner, name = where.split(".")
    parent = getattr(model.layers[0], owner)
    old = getattr(parent, name)
    biased = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(old.weight)
        biased.bias.copy_(torch.randn(old.out_features,
                                      generator=torch.Generator().manual_seed(2)))
    setattr(parent, name, biased)
    model, idx = model.to(device), IDX[:, :6].to(device)
    with torch.no_grad():
        assert torch.equal(model.decode_step(idx, mt.KVCache(2)), model(idx)[0])


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"factor": 2.0}}, "rope_scaling holds factor for default rotary"),
    ({"head_dim": "8"}, "head_dim must be an int, got '8'"),
    ({"attention_bias": "false"}, "attention_bias is 'false'"),
])
def test_config_values_that_would_be_misread_are_refused_by_name(tmp_path, change, message):
    """Found in the issue-23 review: a scaling factor without a type was ignored, and strings
    got messages about other values."""
    import json

    small_llama().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        mt.Llama.from_pretrained(tmp_path)
