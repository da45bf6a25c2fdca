"""gguf.save_llama (chapter 19): a Llama of the package written as llama.cpp's converter writes
it, at F32, F16, Q8_0, Q4_0 and Q4_1, read back by llama.cpp's own gguf package (equal metadata,
equal bytes), by Llama.from_gguf (the logits of the dequantised weights) and by transformers'
GGUF loader (logits equal to ours); and SmolLM2 (its first two layers) requantised, with its
tokenizer."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minitransformer import pretrained  # noqa: E402
from minitransformer.bpe import SMOLLM_PATTERN, BPETokenizer  # noqa: E402
from minitransformer.gguf import (FILE_TYPES, GGUFFile, permute_rows, save_llama,  # noqa: E402
                                  unpermute_rows)
from minitransformer.llama import Llama, LlamaConfig  # noqa: E402

TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
TEXT = ("The quick brown fox jumps over the lazy dog. 1234 numbers and words, words, "
        "words: a small text for a small tokenizer. ") * 20


def _reference_bytes(tensor: torch.Tensor, kind: str) -> np.ndarray:
    """The bytes llama.cpp's gguf package stores for ``tensor`` in ``kind``."""
    raw = gguf.quants.quantize(tensor.numpy(), gguf.GGMLQuantizationType[kind])
    return np.ascontiguousarray(raw).view(np.uint8).reshape(-1)    # F32, F16: not bytes yet


def _dequantised(model: Llama, kind: str) -> Llama:
    """``model`` with every matrix rounded through ``kind`` by the reference (norms kept)."""
    copy = Llama(model.config).eval()
    state = {}
    for name, value in model.state_dict().items():
        if value.dim() == 2:
            raw = gguf.quants.quantize(value.numpy(), gguf.GGMLQuantizationType[kind])
            value = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
                                     .reshape(value.shape).astype(np.float32))
        state[name] = value
    copy.load_state_dict(state)
    return copy


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(TEXT, 300, pattern=SMOLLM_PATTERN)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model(request):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, context_length=32, num_layers=2, num_heads=4,
                         d_model=64, d_ff=96, num_kv_heads=2, rope_theta=500.0,
                         norm_eps=2.0**-17, tie_embeddings=request.param)
    model = Llama(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    return model


def test_permute_rows_is_the_inverse_of_unpermute_rows():
    w = torch.randn(4 * 8, 5)
    assert torch.equal(unpermute_rows(permute_rows(w, 4), 4), w)
    assert torch.equal(permute_rows(unpermute_rows(w, 4), 4), w)
    assert not torch.equal(permute_rows(w, 4), w)
    # llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute), written out
    ref = w.reshape(4, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    assert torch.equal(permute_rows(w, 4), ref)


@pytest.mark.parametrize("kind", TYPES)
def test_the_reference_reads_our_metadata_and_bytes(tmp_path, model, tokenizer, kind):
    path = tmp_path / "m.gguf"
    save_llama(model, path, type=kind, tokenizer=tokenizer, metadata={"general.name": "tiny"})
    ours = GGUFFile(path)
    reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(ours.metadata)
    for key, value in ours.metadata.items():
        assert fields[key].contents() == value, key
    meta = ours.metadata
    assert meta["general.architecture"] == "llama" and meta["general.name"] == "tiny"
    assert meta["general.file_type"] == FILE_TYPES[kind]
    assert ours.metadata_types["llama.block_count"] == "uint32"
    assert ours.metadata_types["llama.rope.freq_base"] == "float32"
    assert BPETokenizer.from_gguf(path) == tokenizer
    state = model.state_dict()
    c = model.config
    expected_names = ["token_embd.weight"]
    for i in range(c.num_layers):
        expected_names += [f"blk.{i}.{n}.weight" for n in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
            "ffn_up", "ffn_down")]
    expected_names += ["output_norm.weight"] + ([] if c.tie_embeddings else ["output.weight"])
    assert [t.name for t in reader.tensors] == expected_names
    for t in reader.tensors:
        if t.name.endswith("norm.weight"):
            assert t.tensor_type.name == "F32"
            continue
        assert t.tensor_type.name == kind
        ours_name = {"token_embd.weight": "token_embedding.weight", "output.weight": "head.weight"}
        if t.name.startswith("blk."):
            i, part = int(t.name.split(".")[1]), t.name.split(".")[2]
            ours_name[t.name] = f"layers.{i}." + {
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.out_proj",
                "ffn_gate": "feed_forward.gate_proj", "ffn_up": "feed_forward.up_proj",
                "ffn_down": "feed_forward.down_proj"}[part] + ".weight"
        weight = state[ours_name[t.name]]
        if t.name.endswith("attn_q.weight"):
            weight = permute_rows(weight, c.num_heads)
        elif t.name.endswith("attn_k.weight"):
            weight = permute_rows(weight, c.num_kv_heads)
        assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                              _reference_bytes(weight, kind)), t.name


@pytest.mark.parametrize("kind", TYPES)
def test_from_gguf_and_transformers_give_the_dequantised_logits(tmp_path, model, tokenizer,
                                                                kind):
    from transformers import AutoModelForCausalLM

    save_llama(model, tmp_path / "m.gguf", type=kind, tokenizer=tokenizer)
    loaded = Llama.from_gguf(tmp_path / "m.gguf")
    assert loaded.config == model.config
    expected = model if kind == "F32" else _dequantised(model, kind)
    idx = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = loaded(idx)[0]
        assert torch.equal(ours, expected(idx)[0])
        if kind != "F32":
            assert not torch.equal(ours, model(idx)[0])      # it did round
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf").eval()
        torch.testing.assert_close(theirs(idx).logits, ours, atol=1e-4, rtol=1e-4)


def test_refusals(tmp_path, model, tokenizer):
    with pytest.raises(ValueError, match="type"):
        save_llama(model, tmp_path / "x.gguf", type="Q4_K")
    with pytest.raises(TypeError, match="model must be"):
        save_llama(torch.nn.Linear(2, 2), tmp_path / "x.gguf")
    odd = Llama(LlamaConfig(vocab_size=300, context_length=8, num_layers=1, num_heads=2,
                            d_model=16, d_ff=48))
    with pytest.raises(ValueError, match="token_embd.weight.*multiple of 32"):
        save_llama(odd, tmp_path / "x.gguf", type="Q8_0")
    save_llama(odd, tmp_path / "odd.gguf", type="F16")      # no blocks: any width
    small = Llama(LlamaConfig(vocab_size=100, context_length=8, num_layers=1, num_heads=2,
                              d_model=32, d_ff=32))
    with pytest.raises(ValueError, match="300 tokens, more than the model's vocabulary of 100"):
        save_llama(small, tmp_path / "x.gguf", tokenizer=tokenizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


SMOLLM2_LAYERS = 2


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2's first ``SMOLLM2_LAYERS`` layers (its real weights, widths, heads and
    vocabulary), its tokenizer, and the original file. Every layer is written and read alike,
    so two stand for thirty: transformers reads the file in a third of the time."""
    path = pretrained.smollm2_path()
    full = Llama.from_gguf(path)
    model = Llama(dataclasses.replace(full.config, num_layers=SMOLLM2_LAYERS)).eval()
    model.load_state_dict({name: value for name, value in full.state_dict().items()
                           if not name.startswith("layers.")
                           or int(name.split(".")[1]) < SMOLLM2_LAYERS})
    return model, BPETokenizer.from_gguf(path), GGUFFile(path)


def test_smollm2_requantised_to_q8_0_is_read_by_transformers(tmp_path, smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok, original = smollm2
    save_llama(model, tmp_path / "q8.gguf", type="Q8_0", tokenizer=tok,
               metadata={"general.name": "SmolLM2 135M Instruct"})
    ours = GGUFFile(tmp_path / "q8.gguf")
    assert ours.metadata["llama.block_count"] == SMOLLM2_LAYERS
    for key, value in original.metadata.items():
        if key.startswith(("tokenizer.", "llama.")) and key != "llama.block_count":
            assert ours.metadata[key] == value, key
    assert {t.type for t in ours.tensors.values()} == {"Q8_0", "F32"}
    assert "output.weight" not in ours.tensors
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}],
                                  add_generation_prompt=True)
    theirs_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="q8.gguf")
    assert theirs_tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}],
                                          add_generation_prompt=True, tokenize=True,
                                          return_dict=False) == ids
    loaded = Llama.from_gguf(tmp_path / "q8.gguf")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="q8.gguf").eval()
    idx = torch.tensor([ids])
    with torch.no_grad():
        logits = loaded(idx)[0]
        torch.testing.assert_close(theirs(idx).logits, logits, atol=2e-3, rtol=1e-3)
        # 8 bits of a 4-bit model: the same next token; the logits move by 0.22 at most
        before = model(idx)[0]
    assert int(logits[0, -1].argmax()) == int(before[0, -1].argmax())
    assert float((logits - before).abs().max()) < 0.5
