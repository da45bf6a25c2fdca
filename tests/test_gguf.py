"""minitransformer.gguf against llama.cpp's own Python package, gguf (the reference, never a
dependency of the package): files written by each are read by the other, and dequantisation is
compared bit for bit. The real model's file is tested in test_smollm2.py."""

import struct
import warnings

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from minitransformer.gguf import (DEQUANTIZED, GGML_TYPES, GGUFFile, dequantize,
                                  write_gguf)

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
    with pytest.raises(ValueError, match="inf or nan"):
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
