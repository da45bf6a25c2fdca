"""minitransformer.gguf against llama.cpp's own Python package, gguf (the reference, never a
dependency of the package): files written by each are read by the other, and dequantisation is
compared bit for bit. The real model's file is tested in test_smollm2.py."""

import dataclasses
import struct
import warnings

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from minitransformer.gguf import (DEQUANTIZED, GGML_TYPES, GGUFFile, dequantize,
                                  write_gguf)
from minitransformer.llama import Llama, LlamaConfig

# every value type, at its extremes
METADATA = {
    "general.architecture": ("llama", "string"),
    "t.uint8": (255, "uint8"), "t.int8": (-128, "int8"), "t.uint16": (65535, "uint16"),
    "t.int16": (-32768, "int16"), "t.uint32": (2**32 - 1, "uint32"),
    "t.int32": (-2**31, "int32"), "t.uint64": (2**64 - 1, "uint64"),
    "t.int64": (-2**63, "int64"), "t.float32": (1.5, "float32"),
    "t.float64": (-1e300, "float64"), "t.true": (True, "bool"), "t.false": (False, "bool"),
    "t.string": ("héllo wörld ✓ \u0000 end", "string"), "t.empty_string": ("", "string"),
    "t.strings": (["a", "", "Ġthe", "日本"], "array[string]"),
    "t.int32s": ([1, -2, 3], "array[int32]"), "t.uint8s": ([0, 255], "array[uint8]"),
    "t.float32s": ([0.5, -0.25], "array[float32]"), "t.float64s": ([1e-300], "array[float64]"),
    "t.bools": ([True, False, True], "array[bool]"), "t.uint64s": ([2**64 - 1], "array[uint64]"),
    "t.nested": ([[1, 2], [3]], "array[array[int32]]"), "t.empty": ([], "array[int32]"),
}
VTYPE = {name.lower(): V[name] for name in V.__members__}


def _reference_types(field) -> str:
    """A GGUFReader field's type in our notation: "array[array[int32]]"."""
    names = [t.name.lower() for t in field.types]
    kind = names[-1]
    for _ in names[:-1]:
        kind = f"array[{kind}]"
    return kind


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(3, 5, generator=gen),
        "f16": torch.randn(2, 7, generator=gen).half(),
        "bf16": torch.randn(4, 2, 3, generator=gen).bfloat16(),
        "one_dim": torch.randn(9, generator=gen),
        "four_dims": torch.randn(2, 1, 3, 2, generator=gen),
        "q8": (torch.randn(3, 64, generator=gen) * 3, "Q8_0"),
        "f16_of_f32": (torch.randn(2, 4, generator=gen), "F16"),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "all.gguf"
    write_gguf(path, {k: v for k, (v, _) in METADATA.items()}, _tensors(),
               types={k: t for k, (_, t) in METADATA.items()}, alignment=64)
    return path


def test_writer_is_read_by_the_reference(written):
    reader = gguf.GGUFReader(written)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == [*METADATA, "general.alignment"]
    for key, (value, kind) in METADATA.items():
        if kind == "array[array[int32]]":        # gguf 0.19's contents() cannot read these
            assert [t.name for t in fields[key].types] == ["ARRAY", "ARRAY", "INT32"]
            continue
        assert fields[key].contents() == value, key
        # gguf 0.19 records no element type for an empty array
        assert _reference_types(fields[key]) == (kind if value != [] else "array"), key
    assert fields["general.alignment"].contents() == 64
    assert reader.alignment == 64
    ours = _tensors()
    assert [t.name for t in reader.tensors] == list(ours)
    for t in reader.tensors:
        tensor, kind = ours[t.name] if isinstance(ours[t.name], tuple) else (ours[t.name], None)
        assert tuple(int(n) for n in reversed(t.shape)) == tuple(tensor.shape)
        assert t.data_offset % 64 == 0
        theirs = torch.from_numpy(
            gguf.quants.dequantize(t.data, t.tensor_type).reshape(tensor.shape).copy())
        if kind == "Q8_0":
            assert t.tensor_type == Q.Q8_0
            raw = gguf.quants.quantize(tensor.numpy(), Q.Q8_0)       # the same bytes
            assert np.array_equal(np.asarray(t.data).reshape(-1), raw.reshape(-1))
            torch.testing.assert_close(theirs, tensor, atol=tensor.abs().max() / 127, rtol=0)
        else:
            assert torch.equal(theirs, tensor.to(torch.float16 if kind else tensor.dtype).float())


def test_reader_reads_back_what_the_writer_wrote(written):
    f = GGUFFile(written)
    assert (f.version, f.alignment) == (3, 64)
    assert f.metadata == {**{k: v for k, (v, _) in METADATA.items()}, "general.alignment": 64}
    assert f.metadata_types == {**{k: t for k, (_, t) in METADATA.items()},
                                "general.alignment": "uint32"}
    reference = {t.name: t for t in gguf.GGUFReader(written).tensors}
    for name, info in f.tensors.items():
        ref = reference[name]
        assert (info.type, info.offset, info.nbytes) == (ref.tensor_type.name, ref.data_offset,
                                                         ref.n_bytes)
        expected = gguf.quants.dequantize(ref.data, ref.tensor_type).reshape(info.shape)
        assert f.tensor(name).dtype == torch.float32
        assert np.array_equal(f.tensor(name).numpy(), expected)


def test_reader_reads_the_reference_writer(tmp_path):
    """Every dequantised type, written by gguf.GGUFWriter, big and odd shapes included."""
    path = tmp_path / "ref.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    for key, (value, kind) in METADATA.items():
        if key == "general.architecture" or kind == "array[array[int32]]" or value == []:
            continue
        if kind.startswith("array"):
            w.add_key_value(key, value, V.ARRAY, sub_type=VTYPE[kind[6:-1]])
        else:
            w.add_key_value(key, value, VTYPE[kind])
    rng = np.random.default_rng(0)
    values = rng.standard_normal((5, 96)).astype(np.float32)
    stored = {"F32": values, "F16": values.astype(np.float16),
              "BF16": gguf.quants.quantize(values, Q.BF16)}
    for name in ("Q8_0", "Q4_0", "Q4_1"):
        stored[name] = gguf.quants.quantize(values, Q[name])
    for name, data in stored.items():
        w.add_tensor(name.lower(), data, raw_dtype=Q[name] if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f, reader = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            assert f.metadata[key] == field.contents(), key
            assert f.metadata_types[key] == _reference_types(field), key
    for t in reader.tensors:
        info = f.tensors[t.name]
        assert info.shape == (5, 96) and info.type == t.tensor_type.name
        expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(5, 96)
        assert f.tensor(t.name).numpy().view(np.uint32).tolist() == \
            expected.view(np.uint32).tolist(), t.name


def _special_halves() -> np.ndarray:
    """float16 bit patterns: +-0, the smallest and largest subnormals, the smallest normal,
    1, the largest finite, +-inf and a nan."""
    return np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF,
                     0x7C00, 0xFC00, 0x7E00], dtype=np.uint16)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_random_blocks_bit_for_bit(kind):
    info = GGML_TYPES[Q[kind].value]
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (4000, info.type_size), dtype=np.uint8)
    halves = _special_halves()
    scales = 2 if kind == "Q4_1" else 1                      # d, and m for Q4_1
    pairs = np.stack(np.meshgrid(halves, halves), axis=-1).reshape(-1, 2)   # every (d, m)
    for j in range(scales):
        blocks[:len(pairs), 2 * j:2 * j + 2] = (pairs[:, j].astype("<u2").view(np.uint8)
                                                .reshape(-1, 2))
    blocks[200:300, 2 * scales:] = rng.choice([0x00, 0xFF, 0x0F, 0xF0, 0x80, 0x7F],
                                              (100, info.type_size - 2 * scales))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # ours warns of nothing
        ours = dequantize(blocks.reshape(-1), kind)
    with np.errstate(invalid="ignore"):
        theirs = gguf.quants.dequantize(blocks, Q[kind]).reshape(-1)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (4000 * 32,)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert np.isnan(ours).any() and (ours.view(np.uint32) == 0x80000000).any()  # -0 kept


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_dequantize_floats_bit_for_bit(kind):
    size = GGML_TYPES[Q[kind].value].type_size
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, 4096 * size, dtype=np.uint8)
    ours = dequantize(raw, kind)
    theirs = gguf.quants.dequantize(raw, Q[kind]).reshape(-1)
    assert ours.dtype == np.float32
    if kind == "F32":
        assert np.array_equal(ours.view(np.uint8), raw)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_dequantize_refuses_other_types_by_name():
    for kind in ("Q4_K", "Q6_K", "IQ2_XS", "Q5_0", "I32"):
        with pytest.raises(ValueError, match=kind):
            dequantize(np.zeros(256 * 4, np.uint8), kind)
    with pytest.raises(TypeError, match="uint8"):
        dequantize(np.zeros(4, np.float32), "F32")
    with pytest.raises(ValueError, match="whole number of Q4_1 blocks"):
        dequantize(np.zeros(21, np.uint8), "Q4_1")


def test_the_type_table_is_ggmls():
    for type_id, info in GGML_TYPES.items():
        assert Q[info.name].value == type_id
        assert gguf.constants.GGML_QUANT_SIZES[Q[info.name]] == (info.block_size, info.type_size)
    assert set(DEQUANTIZED) == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"}


def test_a_k_quant_is_listed_but_refused_by_name(tmp_path):
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((2, 144), np.uint8), raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(path)
    assert f.tensors["blk.0.attn_q.weight"].shape == (2, 256)
    assert f.tensors["blk.0.attn_q.weight"].type == "Q4_K"
    with pytest.raises(ValueError, match=r"'blk.0.attn_q.weight' is stored as Q4_K"):
        f.tensor("blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="no tensor 'nope'"):
        f.tensor("nope")


# --- files that are not GGUF, or broken ones ---------------------------------------------------

def _small(tmp_path) -> bytes:
    path = tmp_path / "small.gguf"
    write_gguf(path, {"general.architecture": "llama", "k": [1, 2], "j": 1},
               {"w": torch.ones(2, 32)})
    return path.read_bytes()


def test_every_truncation_is_refused_in_one_line(tmp_path):
    data = _small(tmp_path)
    path = tmp_path / "cut.gguf"
    for end in range(len(data)):
        path.write_bytes(data[:end])
        with pytest.raises(ValueError) as error:
            GGUFFile(path)
        assert "\n" not in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize("change, message", [
    (lambda d: b"GGML" + d[4:], r"not a GGUF file: it starts with b'GGML'"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "version 1, not 2 or 3"),
    (lambda d: d[:4] + struct.pack(">I", 3) + d[8:], "big-endian"),
    (lambda d: d[:8] + struct.pack("<Q", 2**40) + d[16:], "claims 1099511627776 tensors"),
    (lambda d: d.replace(b"\x08\x00\x00\x00\x05" + bytes(7) + b"llama",
                         b"\x0d\x00\x00\x00\x05" + bytes(7) + b"llama"),
     "general.architecture has the unknown value type 13"),
    (lambda d: d.replace(b"\x01" + bytes(7) + b"j", b"\x01" + bytes(7) + b"k"),
     "metadata key 'k' twice"),
])
def test_broken_headers_are_refused(tmp_path, change, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(change(_small(tmp_path)))
    with pytest.raises(ValueError, match=message):
        GGUFFile(path)


def test_refuses_duplicates_bad_alignment_and_data_past_the_end(tmp_path):
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tensor("w", np.ones((2, 4), np.float32))
    w.add_tensor("v", np.ones((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"\x01\x00\x00\x00\x00\x00\x00\x00v",
                                  b"\x01\x00\x00\x00\x00\x00\x00\x00w"))
    with pytest.raises(ValueError, match="tensor 'w' twice"):
        GGUFFile(path)
    path.write_bytes(data[:-1])
    with pytest.raises(ValueError, match="'v'.*runs past the end"):
        GGUFFile(path)
    write_gguf(path, {}, {"w": torch.ones(2)}, alignment=64)
    path.write_bytes(path.read_bytes().replace(struct.pack("<I", 64), struct.pack("<I", 48)))
    with pytest.raises(ValueError, match="general.alignment must be a uint32 power of two"):
        GGUFFile(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="0 bytes"):
        GGUFFile(path)
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError, match="not a file"):
        GGUFFile(tmp_path)
    with pytest.raises(TypeError):
        GGUFFile(3)


def test_writer_refusals(tmp_path):
    path = tmp_path / "w.gguf"
    with pytest.raises(ValueError, match=r"'t.small': 300 does not fit a uint8"):
        write_gguf(path, {"t.small": 300}, {}, types={"t.small": "uint8"})
    with pytest.raises(TypeError, match="'t.flag' is a bool"):
        write_gguf(path, {"t.flag": 1}, {}, types={"t.flag": "bool"})
    with pytest.raises(ValueError, match="unknown value type 'int128'"):
        write_gguf(path, {"t.x": 1}, {}, types={"t.x": "int128"})
    with pytest.raises(ValueError, match="mixes"):
        write_gguf(path, {"t.x": [1, "a"]}, {})
    with pytest.raises(ValueError, match="cannot write GGML type 'Q4_K'"):
        write_gguf(path, {}, {"w": (torch.ones(32), "Q4_K")})
    with pytest.raises(ValueError, match="multiple of 32"):
        write_gguf(path, {}, {"w": (torch.ones(3, 16), "Q8_0")})
    with pytest.raises(ValueError, match="torch.float64"):
        write_gguf(path, {}, {"w": torch.ones(3, dtype=torch.float64)})
    with pytest.raises(TypeError, match="floating torch tensor"):
        write_gguf(path, {}, {"w": torch.ones(3, dtype=torch.int64)})
    with pytest.raises(ValueError, match="power of two"):
        write_gguf(path, {}, {}, alignment=24)
    with pytest.raises(ValueError, match="NaN or inf"):
        write_gguf(path, {}, {"w": (torch.full((32,), float("inf")), "Q8_0")})
    assert not path.exists() and not list(tmp_path.iterdir())   # nothing half written


def test_writer_infers_types():
    f_types = {}
    from minitransformer.gguf import _infer_type
    for value, kind in ((True, "bool"), (3, "int32"), (2**40, "int64"), (2**63, "uint64"),
                        (0.5, "float32"), ("x", "string"), ([1, 2**40], "array[int64]"),
                        ([1, 0.5], "array[float32]"), ([["a"]], "array[array[string]]")):
        f_types[kind] = _infer_type(value, "k")
        assert f_types[kind] == kind


# --- Llama.from_gguf on small files written here -----------------------------------------------

def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter on a query or key weight: each head's two rotate-half halves
    interleaved row by row."""
    rows, d_model = w.shape
    return w.view(heads, 2, rows // heads // 2, d_model).transpose(1, 2).reshape(rows, d_model)


def _llama_gguf(path, model, **changes):
    """``model`` as llama.cpp's converter writes it (F32), with metadata ``changes``
    (None removes a key) and tensors ``drop``-ped or ``extra``."""
    c = model.config
    metadata = {"general.architecture": "llama", "llama.block_count": c.num_layers,
                "llama.context_length": c.context_length, "llama.embedding_length": c.d_model,
                "llama.feed_forward_length": c.d_ff, "llama.attention.head_count": c.num_heads,
                "llama.attention.head_count_kv": c.num_kv_heads,
                "llama.rope.freq_base": c.rope_theta,
                "llama.attention.layer_norm_rms_epsilon": c.norm_eps,
                "llama.vocab_size": c.vocab_size, "llama.rope.dimension_count": c.head_dim}
    drop, extra = changes.pop("drop", ()), changes.pop("extra", {})
    for key, value in changes.items():
        metadata.pop(key) if value is None else metadata.__setitem__(key, value)
    types = {k: "float32" if isinstance(v, float) else "uint32" for k, v in metadata.items()
             if not isinstance(v, str)}
    s = model.state_dict()
    tensors = {"token_embd.weight": s["token_embedding.weight"]}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        tensors.update({
            f"blk.{i}.attn_norm.weight": s[p + "norm1.weight"],
            f"blk.{i}.attn_q.weight": _permute(s[p + "self_attn.q_proj.weight"], c.num_heads),
            f"blk.{i}.attn_k.weight": _permute(s[p + "self_attn.k_proj.weight"],
                                               c.num_kv_heads),
            f"blk.{i}.attn_v.weight": s[p + "self_attn.v_proj.weight"],
            f"blk.{i}.attn_output.weight": s[p + "self_attn.out_proj.weight"],
            f"blk.{i}.ffn_norm.weight": s[p + "norm2.weight"],
            f"blk.{i}.ffn_gate.weight": s[p + "feed_forward.gate_proj.weight"],
            f"blk.{i}.ffn_up.weight": s[p + "feed_forward.up_proj.weight"],
            f"blk.{i}.ffn_down.weight": s[p + "feed_forward.down_proj.weight"]})
    tensors["output_norm.weight"] = s["norm.weight"]
    if not c.tie_embeddings:
        tensors["output.weight"] = s["head.weight"]
    tensors = {k: v for k, v in {**tensors, **extra}.items() if k not in drop}
    write_gguf(path, metadata, tensors, types=types)
    return path


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, context_length=32, num_layers=2, num_heads=4,
                         d_model=32, d_ff=48, num_kv_heads=2, rope_theta=500.0, norm_eps=2.0**-17)
    return _perturbed(Llama(config))


def _perturbed(model: Llama) -> Llama:
    """Every parameter moved off its initial value: unit norms would let a wrong mapping of
    the norms pass."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    return model.eval()


@pytest.mark.parametrize("tied", [False, True])
def test_from_gguf_undoes_the_converters_permutation(tmp_path, tiny_llama, tied):
    model = tiny_llama
    if tied:
        model = _perturbed(Llama(dataclasses.replace(model.config, tie_embeddings=True)))
    loaded = Llama.from_gguf(_llama_gguf(tmp_path / "tiny.gguf", model))
    assert loaded.config == model.config and not loaded.training
    assert loaded.config.tie_embeddings is tied
    for (name, ours), (_, theirs) in zip(loaded.state_dict().items(),
                                         model.state_dict().items()):
        assert torch.equal(ours, theirs), name
    idx = torch.randint(0, 64, (2, 11))
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    if tied:
        assert loaded.head.weight is loaded.token_embedding.weight


def test_from_gguf_equals_transformers_on_a_small_file(tmp_path, tiny_llama):
    from transformers import AutoModelForCausalLM

    _llama_gguf(tmp_path / "tiny.gguf", tiny_llama)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf").eval()
    ours = Llama.from_gguf(tmp_path / "tiny.gguf")
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        expected = theirs(idx).logits
    torch.testing.assert_close(ours(idx)[0], expected)
    ours.save_pretrained(tmp_path / "saved")          # and back through safetensors
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(idx).logits, expected)


@pytest.mark.parametrize("changes, message", [
    ({"general.architecture": "qwen2"}, r"tiny.gguf: general.architecture is 'qwen2', not "
                                        r"'llama'"),
    ({"llama.embedding_length": 64, "llama.rope.dimension_count": None},
     r"token_embd.weight has shape \(64, 32\), but the "
     r"metadata says \(64, 64\) \(llama.embedding_length = 64\)"),
    ({"llama.feed_forward_length": 40}, r"blk.0.ffn_gate.weight has shape \(48, 32\), but the "
                                        r"metadata says \(40, 32\) "
                                        r"\(llama.feed_forward_length = 40\)"),
    ({"llama.vocab_size": 65}, r"llama.vocab_size = 65"),
    ({"llama.attention.head_count_kv": 4}, r"blk.0.attn_k.weight .*"
                                           r"llama.attention.head_count_kv = 4"),
    ({"llama.block_count": 3}, r"no tensor 'blk.2.attn_norm.weight'.*llama.block_count=3"),
    ({"llama.block_count": 1}, r"holds 'blk.1.attn_norm.weight', which a Llama with "
                               r"llama.block_count=1 does not have"),
    ({"llama.embedding_length": None}, r"has no metadata llama.embedding_length"),
    ({"llama.attention.head_count": 3}, r"head_count=3 must divide"),
    ({"llama.rope.dimension_count": 4}, r"llama.rope.dimension_count is 4, not"),
    ({"llama.rope.scaling.type": "linear"}, r"llama.rope.scaling.type is 'linear'"),
    ({"llama.expert_count": 8}, r"llama.expert_count is 8"),
    ({"llama.context_length": 0}, r"llama.context_length must be a positive int, got 0"),
    ({"llama.attention.layer_norm_rms_epsilon": "x"}, r"layer_norm_rms_epsilon must be a "
                                                      r"positive number"),
    ({"drop": ["blk.1.ffn_up.weight"]}, r"no tensor 'blk.1.ffn_up.weight'"),
    ({"extra": {"rope_freqs.weight": torch.ones(4)}}, r"holds 'rope_freqs.weight'"),
])
def test_from_gguf_refusals_name_the_key(tmp_path, tiny_llama, changes, message):
    path = _llama_gguf(tmp_path / "tiny.gguf", tiny_llama, **changes)
    with pytest.raises(ValueError, match=message) as error:
        Llama.from_gguf(path)
    assert "\n" not in str(error.value)


def test_from_gguf_refuses_k_quants_and_other_files(tmp_path):
    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(path, arch="llama")
    for key, value in (("llama.block_count", 1), ("llama.context_length", 8),
                       ("llama.embedding_length", 256), ("llama.feed_forward_length", 256),
                       ("llama.attention.head_count", 2), ("llama.vocab_size", 4)):
        w.add_uint32(key, value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tensor("token_embd.weight", np.zeros((4, 144), np.uint8), raw_dtype=Q.Q4_K)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
        w.add_tensor(f"blk.0.{name}.weight", np.zeros((256, 256), np.float32))
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((256, 256), np.float32))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'token_embd.weight' is stored as Q4_K"):
        Llama.from_gguf(path)
    (tmp_path / "model.safetensors").write_bytes(b"{}")
    with pytest.raises(ValueError, match="not a GGUF file"):
        Llama.from_gguf(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError):
        Llama.from_gguf(tmp_path / "missing.gguf")


_RANGES = {"uint8": (0, 2**8 - 1), "int8": (-2**7, 2**7 - 1), "uint16": (0, 2**16 - 1),
           "int16": (-2**15, 2**15 - 1), "uint32": (0, 2**32 - 1), "int32": (-2**31, 2**31 - 1),
           "uint64": (0, 2**64 - 1), "int64": (-2**63, 2**63 - 1)}


def _values(kind: str):
    if kind in _RANGES:
        return st.integers(*_RANGES[kind])
    if kind == "float32":
        return st.floats(width=32, allow_nan=False)
    if kind == "float64":
        return st.floats(allow_nan=False)
    if kind == "bool":
        return st.booleans()
    return st.text()


@st.composite
def _metadata(draw):
    kinds = draw(st.lists(st.sampled_from([*_RANGES, "float32", "float64", "bool", "string"]),
                          max_size=6))
    out = {}
    for i, kind in enumerate(kinds):
        if draw(st.booleans()):
            out[f"k{i}"] = (draw(st.lists(_values(kind), max_size=4)), f"array[{kind}]")
        else:
            out[f"k{i}"] = (draw(_values(kind)), kind)
    return out


@settings(max_examples=30, deadline=None)
@given(_metadata(), st.sampled_from([8, 32, 64]))
def test_metadata_round_trip(metadata, alignment):
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/m.gguf"
        write_gguf(path, {k: v for k, (v, _) in metadata.items()}, {"w": torch.ones(3)},
                   types={k: t for k, (_, t) in metadata.items()}, alignment=alignment)
        f = GGUFFile(path)
        expected = {k: v for k, (v, _) in metadata.items()}
        if alignment != 32:
            expected["general.alignment"] = alignment
        assert f.metadata == expected and f.alignment == alignment
        assert all(f.metadata_types[k] == t for k, (_, t) in metadata.items())
        assert torch.equal(f.tensor("w"), torch.ones(3))


def test_arrays_nested_too_deep_are_refused(tmp_path):
    value = 1
    for _ in range(40):
        value = [value]
    path = tmp_path / "deep.gguf"
    write_gguf(path, {"k": value}, {})
    with pytest.raises(ValueError, match="deep.gguf: k nests arrays more than 16 deep"):
        GGUFFile(path)
