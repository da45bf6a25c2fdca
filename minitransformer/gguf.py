"""GGUF, the one-file model format of llama.cpp, read and written from its specification
(chapter 19: a real model, SmolLM2-135M-Instruct, in our own code).

A GGUF file is, in order (all numbers little-endian):

* a header: the magic ``b"GGUF"``, a ``uint32`` version (3; 2 has the same layout), the
  ``uint64`` number of tensors and the ``uint64`` number of metadata entries;
* the metadata: for each entry a string key, a ``uint32`` value type and the value. A string
  is a ``uint64`` byte length and that many bytes of UTF-8; an array is a ``uint32`` element
  type, a ``uint64`` length and the elements;
* one record per tensor: its name, a ``uint32`` number of dimensions, the dimensions as
  ``uint64`` (the fastest-varying first: the reverse of PyTorch's order), a ``uint32`` GGML
  type and a ``uint64`` offset into the data section;
* zero bytes up to a multiple of ``general.alignment`` (32 when the key is absent), then the
  data section, where every tensor starts at a multiple of the alignment.

A tensor is stored in blocks: each GGML type packs ``block_size`` numbers into ``type_size``
bytes. :class:`GGUFFile` reads the header and maps the data, so a tensor's bytes are read
only when :meth:`GGUFFile.tensor` dequantises it; :func:`write_gguf` writes a file.
:func:`load_llama` (``Llama.from_gguf``) builds a :class:`~minitransformer.llama.Llama` from
one, through the name table :data:`LLAMA_GGUF_NAMES`.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types: id -> (name, struct format of a scalar; None for string and array).
VALUE_TYPES = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"),
    8: ("string", None), 9: ("array", None), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
    12: ("float64", "<d"),
}
_VALUE_TYPE_IDS = {name: i for i, (name, _) in VALUE_TYPES.items()}
_NUMPY_OF = {"uint8": "<u1", "int8": "<i1", "uint16": "<u2", "int16": "<i2", "uint32": "<u4",
             "int32": "<i4", "float32": "<f4", "uint64": "<u8", "int64": "<i8",
             "float64": "<f8"}


class GGMLType(NamedTuple):
    """A tensor type of GGML: ``block_size`` numbers stored in ``type_size`` bytes."""

    name: str
    block_size: int
    type_size: int


# Every GGML type by its id, with its block layout (ids 4, 5 and 31-33, 36-38 are retired).
GGML_TYPES = {i: GGMLType(name, block, size) for i, (name, block, size) in {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}.items()}
_GGML_TYPE_IDS = {t.name: i for i, t in GGML_TYPES.items()}
DEQUANTIZED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")   # what dequantize() reads
WRITTEN = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")        # what write_gguf() stores
_MAX_DIMS = 4                                                   # GGML's tensors have 1 to 4
_MAX_NESTING = 16                                               # arrays of arrays of ...


class GGUFTensor(NamedTuple):
    """Where a tensor lies in a GGUF file: ``shape`` in PyTorch's order, ``type`` the GGML
    type's name (``"Q4_1"``), ``offset`` its first byte counted from the start of the file,
    ``nbytes`` its size in the file."""

    name: str
    shape: tuple[int, ...]
    type: str
    offset: int
    nbytes: int


class _Cursor:
    """Reads the header's numbers and strings one after another, refusing to run past the end."""

    def __init__(self, data: np.ndarray, source: str):
        self.buffer, self.position, self.source = memoryview(data), 0, source

    def take(self, size: int, what: str) -> int:
        start = self.position
        if size < 0 or start + size > len(self.buffer):
            raise ValueError(f"{self.source} ends inside {what} (at byte {start}, "
                             f"{size} bytes needed, {len(self.buffer) - start} left): "
                             f"truncated or not a GGUF file")
        self.position += size
        return start

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buffer, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        size = self.scalar("<Q", what)
        start = self.take(size, what)
        try:
            return str(self.buffer[start:start + size], "utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.source}: {what} is not UTF-8 text") from None

    def value(self, type_id: int, what: str, depth: int = 0):
        """A metadata value of type ``type_id``; returns ``(value, type name)``."""
        if depth > _MAX_NESTING:
            raise ValueError(f"{self.source}: {what} nests arrays more than {_MAX_NESTING} deep")
        if type_id not in VALUE_TYPES:
            raise ValueError(f"{self.source}: {what} has the unknown value type {type_id}")
        name, fmt = VALUE_TYPES[type_id]
        if fmt is not None:
            value = self.scalar(fmt, what)
            if name == "bool" and self.buffer[self.position - 1] > 1:
                raise ValueError(f"{self.source}: {what} is a bool stored as "
                                 f"{self.buffer[self.position - 1]}, not 0 or 1")
            return value, name
        if name == "string":
            return self.string(what), name
        item_type, count = self.scalar("<I", what), self.scalar("<Q", what)
        if item_type not in VALUE_TYPES:
            raise ValueError(f"{self.source}: {what} is an array of the unknown value type "
                             f"{item_type}")
        item_name, item_fmt = VALUE_TYPES[item_type]
        if item_fmt is not None and item_name != "bool":    # numbers: one read for them all
            size = struct.calcsize(item_fmt)
            start = self.take(count * size, what)
            items = np.frombuffer(self.buffer, _NUMPY_OF[item_name], count, start)
            return items.tolist(), f"array[{item_name}]"
        if count > len(self.buffer) - self.position:        # each element is at least a byte
            raise ValueError(f"{self.source}: {what} claims {count} elements, more than the "
                             f"file's bytes: truncated or not a GGUF file")
        items, kind = [], f"array[{item_name}]"
        for _ in range(count):
            item, kind_of_item = self.value(item_type, what, depth + 1)
            items.append(item)
            kind = f"array[{kind_of_item}]"
        return items, kind


class GGUFFile:
    """A GGUF file, its header read and its data memory-mapped.

    Attributes:
        path: the file.
        version: the format version (2 or 3).
        alignment: the data section's alignment in bytes (``general.alignment``, else 32).
        metadata: each key's value as Python's ``str``, ``int``, ``float``, ``bool`` or
            ``list`` (of those, or of lists), in the file's order.
        metadata_types: each key's value type as the specification names it: ``"uint32"``,
            ``"string"``, ``"array[string]"``, ``"array[array[int32]]"``.
        tensors: each tensor's ``GGUFTensor``, in the file's order.

    Raises:
        TypeError: ``path`` is not a str or path.
        FileNotFoundError: no such file.
        ValueError: not a GGUF file (the first bytes say what it is not), a version other
            than 2 or 3, a truncated header, a key or tensor stored twice, an unknown value or
            tensor type, an alignment that is not a power of two, or a tensor whose data
            lies outside the file or off the alignment; the message names the file and the
            key or tensor.
    """

    def __init__(self, path: str | os.PathLike):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} does not exist" if not self.path.exists()
                                    else f"{self.path} is not a file")
        source = str(self.path)
        size = self.path.stat().st_size
        if size < 24:                               # magic, version and the two counts
            raise ValueError(f"{source} is not a GGUF file: {size} bytes, fewer than a "
                             f"header's 24")
        self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        cursor = _Cursor(self._data, source)
        magic = bytes(self._data[:4])
        if magic != MAGIC:
            raise ValueError(f"{source} is not a GGUF file: it starts with {magic!r}, not "
                             f"{MAGIC!r}")
        cursor.take(4, "the magic")
        self.version = cursor.scalar("<I", "the version")
        if self.version not in (2, 3):
            big_endian = self.version & 0xFFFF == 0 and (self.version >> 24) in (2, 3)
            raise ValueError(f"{source} is GGUF version {self.version}" + (
                " read little-endian: a big-endian file, which this reader does not read"
                if big_endian else ", not 2 or 3 (the versions this reader reads)"))
        tensor_count = cursor.scalar("<Q", "the tensor count")
        key_count = cursor.scalar("<Q", "the metadata count")
        for count, what in ((tensor_count, "tensors"), (key_count, "metadata entries")):
            if count > size:                        # each takes more than a byte
                raise ValueError(f"{source} claims {count} {what} in {size} bytes: "
                                 f"not a GGUF file")
        self.metadata: dict[str, object] = {}
        self.metadata_types: dict[str, str] = {}
        for _ in range(key_count):
            key = cursor.string("a metadata key")
            if key in self.metadata:
                raise ValueError(f"{source} holds the metadata key {key!r} twice")
            value, kind = cursor.value(cursor.scalar("<I", f"the type of {key}"), key)
            self.metadata[key], self.metadata_types[key] = value, kind
        self.alignment = self._alignment(source)
        records = [self._tensor_record(cursor, source) for _ in range(tensor_count)]
        start = -(-cursor.position // self.alignment) * self.alignment
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, type_id, offset in records:
            self.tensors[name] = self._locate(name, shape, type_id, start + offset, start,
                                              size, source)

    def _alignment(self, source: str) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        value, kind = self.metadata["general.alignment"], self.metadata_types["general.alignment"]
        if kind != "uint32" or value < 1 or value & (value - 1):
            raise ValueError(f"{source}: general.alignment must be a uint32 power of two, got "
                             f"{kind} {value!r}")
        return value

    def _tensor_record(self, cursor: _Cursor, source: str) -> tuple:
        name = cursor.string("a tensor name")
        ndim = cursor.scalar("<I", f"the dimensions of {name}")
        if not 1 <= ndim <= _MAX_DIMS:
            raise ValueError(f"{source}: tensor {name!r} has {ndim} dimensions, not 1 to "
                             f"{_MAX_DIMS}")
        dims = [cursor.scalar("<Q", f"the shape of {name}") for _ in range(ndim)]
        type_id = cursor.scalar("<I", f"the type of {name}")
        return name, tuple(reversed(dims)), type_id, cursor.scalar("<Q", f"the offset of {name}")

    def _locate(self, name: str, shape: tuple[int, ...], type_id: int, offset: int,
                start: int, size: int, source: str) -> GGUFTensor:
        if name in self.tensors:
            raise ValueError(f"{source} holds the tensor {name!r} twice")
        if type_id not in GGML_TYPES:
            raise ValueError(f"{source}: tensor {name!r} has the unknown GGML type {type_id}")
        kind = GGML_TYPES[type_id]
        if shape[-1] % kind.block_size:
            raise ValueError(f"{source}: tensor {name!r} of shape {shape} is {kind.name}, whose "
                             f"rows come in blocks of {kind.block_size} values")
        nbytes = math.prod(shape) // kind.block_size * kind.type_size
        if (offset - start) % self.alignment or offset + nbytes > size:
            raise ValueError(f"{source}: tensor {name!r} ({nbytes} bytes at data offset "
                             f"{offset - start}) is not aligned to {self.alignment} or runs "
                             f"past the end of the file ({size} bytes)")
        return GGUFTensor(name, shape, kind.name, offset, nbytes)

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}: version {self.version}, "
                f"{len(self.metadata)} metadata keys, {len(self.tensors)} tensors)")

    def _info(self, name: object) -> GGUFTensor:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if name not in self.tensors:
            raise ValueError(f"{self.path} has no tensor {name!r}")
        return self.tensors[name]

    def raw(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name`` as stored (a read-only ``uint8`` view of the file)."""
        info = self._info(name)
        return self._data[info.offset:info.offset + info.nbytes]

    def tensor(self, name: str) -> Tensor:
        """Tensor ``name`` dequantised to a new float32 tensor of its PyTorch shape.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: no such tensor, or one of a type :func:`dequantize` does not read
                (naming the type).
        """
        info = self._info(name)
        if info.type not in DEQUANTIZED:
            raise ValueError(f"{self.path}: tensor {name!r} is stored as {info.type}, which "
                             f"this reader does not dequantise ({', '.join(DEQUANTIZED)} only)")
        return torch.from_numpy(dequantize(self.raw(name), info.type).reshape(info.shape))


# --- dequantisation: each type's block layout -------------------------------------------------

_CHUNK = 1 << 14    # blocks per step: the temporaries stay in the CPU's cache


def _blocks(raw: np.ndarray, kind: GGMLType) -> np.ndarray:
    """``raw`` as ``(n_blocks, type_size)`` bytes."""
    return raw.reshape(-1, kind.type_size)


def _f16(column: np.ndarray) -> np.ndarray:
    """Two bytes per row as a float16 scale, widened to a ``(n, 1)`` float32 column."""
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """16 bytes per row as 32 numbers 0-15: the low nibbles are values 0-15, the high 16-31."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _dequantize_blocks(blocks: np.ndarray, kind: str, out: np.ndarray) -> None:
    """One chunk of blocks into ``out`` ``(n, 32)`` float32."""
    if kind == "Q8_0":              # float16 d, 32 int8 q: d q
        np.multiply(blocks[:, 2:].view(np.int8), _f16(blocks[:, :2]), out=out)
    elif kind == "Q4_0":            # float16 d, 16 bytes of 4-bit q: d (q - 8)
        q = _nibbles(blocks[:, 2:]).view(np.int8) - np.int8(8)
        np.multiply(_f16(blocks[:, :2]), q, out=out)
    else:                           # Q4_1: float16 d, float16 m, 16 bytes of 4-bit q: d q + m
        np.multiply(_f16(blocks[:, :2]), _nibbles(blocks[:, 4:]), out=out)
        np.add(out, _f16(blocks[:, 2:4]), out=out)


def dequantize(raw: np.ndarray, ggml_type: str) -> np.ndarray:
    """The float32 numbers that ``raw``, a tensor's bytes in GGML type ``ggml_type``, stores,
    flat, in the file's order (equal bit for bit to what llama.cpp's ``gguf`` package reads).

    Raises:
        TypeError: ``raw`` is not a ``uint8`` array.
        ValueError: a type other than F32, F16, BF16, Q8_0, Q4_0 or Q4_1 (naming it), or a
            byte count that is not a whole number of blocks.
    """
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8:
        raise TypeError(f"raw must be a numpy array of uint8, got "
                        f"{getattr(raw, 'dtype', type(raw).__name__)}")
    if ggml_type not in DEQUANTIZED:
        raise ValueError(f"cannot dequantise GGML type {ggml_type!r} "
                         f"({', '.join(DEQUANTIZED)} only)")
    kind = GGML_TYPES[_GGML_TYPE_IDS[ggml_type]]
    raw = raw.reshape(-1)
    if raw.size % kind.type_size:
        raise ValueError(f"{raw.size} bytes are not a whole number of {ggml_type} blocks of "
                         f"{kind.type_size} bytes")
    if ggml_type == "F32":
        return raw.view("<f4").astype(np.float32)
    if ggml_type == "F16":
        return raw.view("<f2").astype(np.float32)
    if ggml_type == "BF16":         # the high half of a float32
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    blocks = _blocks(raw, kind)
    out = np.empty((len(blocks), kind.block_size), np.float32)
    with np.errstate(invalid="ignore"):         # an inf scale times 0 is nan, as in llama.cpp
        for i in range(0, len(blocks), _CHUNK):
            _dequantize_blocks(blocks[i:i + _CHUNK], ggml_type, out[i:i + _CHUNK])
    return out.reshape(-1)


# --- writing ---------------------------------------------------------------------------------

def _tensor_bytes(name: str, tensor: Tensor, ggml_type: str) -> np.ndarray:
    """A tensor's bytes in ``ggml_type``, flat, in the file's order: :func:`~minitransformer.
    quantize.quantize_gguf`, the one quantiser of the package."""
    from minitransformer.quantize import quantize_gguf

    try:
        data = quantize_gguf(tensor.detach().to("cpu"), ggml_type)
    except ValueError as error:
        raise ValueError(f"tensor {name!r}: {error}") from None
    return data.numpy().reshape(-1)


def _infer_type(value: object, key: str) -> str:
    """The value type :func:`write_gguf` gives a value when ``types`` names none."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int32" if -2**31 <= value < 2**31 else "int64" if -2**63 <= value < 2**63 \
            else "uint64"
    if isinstance(value, float):
        return "float32"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        kinds = {_infer_type(item, key) for item in value}
        if kinds <= {"int32", "int64", "uint64", "float32"} and "float32" in kinds:
            kinds = {"float32"}
        for wide in ("uint64", "int64"):
            if wide in kinds and kinds <= {"int32", "int64", "uint64"}:
                kinds = {wide}
        if len(kinds) > 1:
            raise ValueError(f"metadata {key!r} mixes {sorted(kinds)} in one array: pass its "
                             f"type in types=")
        return f"array[{kinds.pop() if kinds else 'int32'}]"
    raise TypeError(f"metadata {key!r} must be a bool, int, float, str or list, got "
                    f"{type(value).__name__}")


def _encode_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _encode(value: object, kind: str, key: str) -> bytes:
    """A metadata value of type ``kind`` as the file stores it (without the type id)."""
    if kind.startswith("array[") and kind.endswith("]"):
        item = kind[6:-1]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"metadata {key!r} is an {kind}, but its value is a "
                            f"{type(value).__name__}")
        head = struct.pack("<IQ", _type_id(item.split("[")[0], key), len(value))
        return head + b"".join(_encode(v, item, key) for v in value)
    _type_id(kind, key)
    if kind == "string":
        if not isinstance(value, str):
            raise TypeError(f"metadata {key!r} is a string, got {type(value).__name__}")
        return _encode_string(value)
    if kind == "bool" and not isinstance(value, bool):
        raise TypeError(f"metadata {key!r} is a bool, got {type(value).__name__}")
    if kind.startswith(("int", "uint")) and (isinstance(value, bool)
                                             or not isinstance(value, int)):
        raise TypeError(f"metadata {key!r} is a {kind}, got {type(value).__name__}")
    if kind.startswith("float") and (isinstance(value, bool)
                                     or not isinstance(value, (int, float))):
        raise TypeError(f"metadata {key!r} is a {kind}, got {type(value).__name__}")
    try:
        return struct.pack(VALUE_TYPES[_VALUE_TYPE_IDS[kind]][1], value)
    except (struct.error, OverflowError):
        raise ValueError(f"metadata {key!r}: {value!r} does not fit a {kind}") from None


def _type_id(kind: str, key: str) -> int:
    if kind not in _VALUE_TYPE_IDS:
        raise ValueError(f"metadata {key!r}: unknown value type {kind!r} (one of "
                         f"{', '.join(_VALUE_TYPE_IDS)}, or array[...] of one)")
    return _VALUE_TYPE_IDS[kind]


def _tensor_entry(name: object, entry: object) -> tuple[str, Tensor, str]:
    """``(name, tensor, GGML type)`` of one of :func:`write_gguf`'s tensors."""
    if not isinstance(name, str):
        raise TypeError(f"tensor names must be str, got {type(name).__name__}")
    tensor, kind = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
    if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
        raise TypeError(f"tensor {name!r} must be a floating torch tensor or a pair (tensor, "
                        f"GGML type), got {type(tensor).__name__}")
    if kind is None:
        kind = {torch.float32: "F32", torch.float16: "F16",
                torch.bfloat16: "BF16"}.get(tensor.dtype)
        if kind is None:
            raise ValueError(f"tensor {name!r} is {tensor.dtype}: pass (tensor, type) with a "
                             f"type of {', '.join(WRITTEN)}")
    if kind not in WRITTEN:
        raise ValueError(f"tensor {name!r}: cannot write GGML type {kind!r} "
                         f"({', '.join(WRITTEN)} only)")
    if not 1 <= tensor.dim() <= _MAX_DIMS:
        raise ValueError(f"tensor {name!r} has {tensor.dim()} dimensions, not 1 to {_MAX_DIMS}")
    block = GGML_TYPES[_GGML_TYPE_IDS[kind]].block_size
    if tensor.shape[-1] % block:
        raise ValueError(f"tensor {name!r} of shape {tuple(tensor.shape)}: {kind} needs a last "
                         f"dimension that is a multiple of {block}")
    return name, tensor, kind


def write_gguf(path: str | os.PathLike, metadata: Mapping[str, object],
               tensors: Mapping[str, Tensor | tuple[Tensor, str]], *,
               types: Mapping[str, str] | None = None, alignment: int | None = None) -> None:
    """Write a GGUF version 3 file that :class:`GGUFFile` (and llama.cpp) reads.

    Args:
        path: the file; written under ``path + ".partial"`` and then renamed, so a reader
            never meets half a file.
        metadata: key -> value (``bool``, ``int``, ``float``, ``str`` or a list of them).
        tensors: name -> tensor, stored in its dtype (F32, F16 or BF16), or name ->
            ``(tensor, type)`` with a type of ``WRITTEN`` (``"Q8_0"``, ``"Q4_0"`` and
            ``"Q4_1"`` quantise, with :func:`~minitransformer.quantize.quantize_gguf`).
        types: a key's value type as :attr:`GGUFFile.metadata_types` names it; a key left out
            gets ``bool``, ``int32`` (``int64`` when it does not fit), ``float32``, ``string``
            or ``array[...]`` of one of those.
        alignment: the data's alignment in bytes; ``None`` takes ``general.alignment`` from
            ``metadata``, else 32. Another value than 32 is written as ``general.alignment``.

    Raises:
        TypeError, ValueError: a value that is not of its type or does not fit it, an unknown
            type, a tensor that is not floating or not of 1 to 4 dimensions, a quantised
            tensor whose rows are not whole blocks, an alignment that is not a power of two.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    types = dict(types or {})
    metadata = dict(metadata)
    if alignment is None:
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    elif metadata.get("general.alignment", alignment) != alignment:
        raise ValueError(f"alignment={alignment} but metadata's general.alignment is "
                         f"{metadata['general.alignment']}")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 \
            or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment!r}")
    if alignment != DEFAULT_ALIGNMENT or "general.alignment" in metadata:
        metadata["general.alignment"], types["general.alignment"] = alignment, "uint32"
    entries = [_tensor_entry(name, entry) for name, entry in tensors.items()]

    header = bytearray(MAGIC + struct.pack("<IQQ", 3, len(entries), len(metadata)))
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, got {type(key).__name__}")
        kind = types.get(key) or _infer_type(value, key)
        header += _encode_string(key) + struct.pack("<I", _type_id(kind.split("[")[0], key))
        header += _encode(value, kind, key)
    datas, offset = [], 0
    for name, tensor, kind in entries:
        data = _tensor_bytes(name, tensor, kind)
        header += _encode_string(name) + struct.pack("<I", tensor.dim())
        header += struct.pack(f"<{tensor.dim()}Q", *reversed(tensor.shape))
        header += struct.pack("<IQ", _GGML_TYPE_IDS[kind], offset)
        datas.append(data)
        offset += -(-data.size // alignment) * alignment
    partial = Path(f"{os.fspath(path)}.partial")
    with open(partial, "wb") as file:
        file.write(header + bytes(-len(header) % alignment))
        for data in datas:
            file.write(data.tobytes() + bytes(-data.size % alignment))
    os.replace(partial, path)


# --- a Llama from a GGUF file ----------------------------------------------------------------

class GGUFName(NamedTuple):
    """One row of a GGUF name table: our tensor, llama.cpp's, and the sizes its dimensions
    are (as the short names of the ``llama.*`` metadata keys, for the messages). ``unpermute``
    names the head count whose rows llama.cpp's converter interleaved (queries and keys)."""

    ours: str
    theirs: str
    sizes: tuple[str, ...]
    unpermute: str | None = None


# llama.cpp's name for each of our Llama tensors; "{i}" is a layer. The head's row is used only
# when the file has an ``output.weight`` (else the head is tied to the embedding).
LLAMA_GGUF_NAMES = (
    GGUFName("token_embedding.weight", "token_embd.weight", ("vocab_size", "embedding_length")),
    GGUFName("layers.{i}.norm1.weight", "blk.{i}.attn_norm.weight", ("embedding_length",)),
    GGUFName("layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight",
             ("embedding_length", "embedding_length"), "num_heads"),
    GGUFName("layers.{i}.self_attn.k_proj.weight", "blk.{i}.attn_k.weight",
             ("attention.head_count_kv", "embedding_length"), "num_kv_heads"),
    GGUFName("layers.{i}.self_attn.v_proj.weight", "blk.{i}.attn_v.weight",
             ("attention.head_count_kv", "embedding_length")),
    GGUFName("layers.{i}.self_attn.out_proj.weight", "blk.{i}.attn_output.weight",
             ("embedding_length", "embedding_length")),
    GGUFName("layers.{i}.norm2.weight", "blk.{i}.ffn_norm.weight", ("embedding_length",)),
    GGUFName("layers.{i}.feed_forward.gate_proj.weight", "blk.{i}.ffn_gate.weight",
             ("feed_forward_length", "embedding_length")),
    GGUFName("layers.{i}.feed_forward.up_proj.weight", "blk.{i}.ffn_up.weight",
             ("feed_forward_length", "embedding_length")),
    GGUFName("layers.{i}.feed_forward.down_proj.weight", "blk.{i}.ffn_down.weight",
             ("embedding_length", "feed_forward_length")),
    GGUFName("norm.weight", "output_norm.weight", ("embedding_length",)),
    GGUFName("head.weight", "output.weight", ("vocab_size", "embedding_length")),
)


def unpermute_rows(weight: Tensor, num_heads: int) -> Tensor:
    """Undo llama.cpp's converter on a query or key weight ``(num_heads * d_head, d_model)``:
    within each head it stored the rows of the two rotate-half halves interleaved (row ``j``
    of the first half, row ``j`` of the second, ...), Meta's order; this puts each head's halves
    back one after the other, the order :func:`~minitransformer.rotary.apply_rotary` turns.
    Chapter 14's permutation for Meta's checkpoints."""
    rows, d_model = weight.shape
    d_head = rows // num_heads
    return (weight.view(num_heads, d_head // 2, 2, d_model).transpose(1, 2)
            .reshape(rows, d_model))


def permute_rows(weight: Tensor, num_heads: int) -> Tensor:
    """What llama.cpp's converter does to a query or key weight ``(num_heads * d_head,
    d_model)``, the inverse of :func:`unpermute_rows`: within each head, the rows of the two
    rotate-half halves interleaved (row ``j`` of the first half, row ``j`` of the second, ...)."""
    rows, d_model = weight.shape
    d_head = rows // num_heads
    return (weight.reshape(num_heads, 2, d_head // 2, d_model).transpose(1, 2)
            .reshape(rows, d_model))


#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of a file whose matrices are of a type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32}


def save_llama(model, path: str | os.PathLike, *, type: str = "Q8_0", tokenizer=None,
               metadata: Mapping[str, object] | None = None) -> None:
    """Write a :class:`~minitransformer.llama.Llama` as llama.cpp's converter does: a GGUF file
    that llama.cpp, ``transformers`` (``from_pretrained(dir, gguf_file=...)``) and
    :meth:`Llama.from_gguf <minitransformer.llama.Llama.from_gguf>` read.

    The ``llama.*`` metadata of the model's config; its tensors under llama.cpp's names
    (``LLAMA_GGUF_NAMES``), the query and key rows permuted (``permute_rows``), every
    matrix in ``type`` and the norms (1-D) in F32, as llama.cpp stores them; no
    ``output.weight`` when the head is tied to the embedding. A ``tokenizer``
    (:class:`~minitransformer.bpe.BPETokenizer`) adds its ``tokenizer.*`` keys
    (:meth:`~minitransformer.bpe.BPETokenizer.gguf_metadata`); ``metadata`` adds or replaces
    keys (``general.name``, ...).

    Args:
        type: ``"F32"``, ``"F16"``, ``"BF16"``, ``"Q8_0"``, ``"Q4_0"`` or ``"Q4_1"``.

    Raises:
        TypeError: ``model`` is not a Llama, ``tokenizer`` not a BPETokenizer.
        ValueError: an unknown type, a quantised type for a matrix whose rows are not whole
            blocks of 32 (naming the tensor), a tokenizer larger than the model's vocabulary.
    """
    from minitransformer import _checks
    from minitransformer.bpe import BPETokenizer
    from minitransformer.llama import Llama

    _checks.check_type("model", model, Llama, "a minitransformer.llama.Llama")
    _checks.check_choice("type", type, tuple(FILE_TYPES))
    c = model.config
    meta: dict[str, object] = {"general.architecture": "llama", "general.name": "minitransformer",
                               "general.file_type": FILE_TYPES[type]}
    types = {"general.file_type": "uint32"}
    for key, value in (("context_length", c.context_length),
                       ("embedding_length", c.d_model), ("block_count", c.num_layers),
                       ("feed_forward_length", c.d_ff), ("attention.head_count", c.num_heads),
                       ("attention.head_count_kv", c.num_kv_heads),
                       ("rope.dimension_count", c.head_dim), ("vocab_size", c.vocab_size)):
        meta[f"llama.{key}"], types[f"llama.{key}"] = value, "uint32"
    for key, value in (("rope.freq_base", c.rope_theta),
                       ("attention.layer_norm_rms_epsilon", c.norm_eps)):
        meta[f"llama.{key}"], types[f"llama.{key}"] = float(value), "float32"
    if type in ("Q8_0", "Q4_0", "Q4_1"):
        meta["general.quantization_version"], types["general.quantization_version"] = 2, "uint32"
    if tokenizer is not None:
        _checks.check_type("tokenizer", tokenizer, BPETokenizer, "a BPETokenizer or None")
        if len(tokenizer) > c.vocab_size:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's "
                             f"vocabulary of {c.vocab_size}")
        tokens = tokenizer.gguf_metadata()
        meta.update(tokens)
        types.update({k: "uint32" for k in tokens if k.endswith("_token_id")})
    if metadata is not None:
        _checks.check_type("metadata", metadata, Mapping, "a dict or None")
        meta.update(metadata)
    rows = [row for row in LLAMA_GGUF_NAMES
            if not (row.ours == "head.weight" and c.tie_embeddings)]
    layer = [row for row in rows if "{i}" in row.ours]
    order = ([(rows[0], 0)] + [(row, i) for i in range(c.num_layers) for row in layer]
             + [(row, 0) for row in rows[1:] if row not in layer])     # converter's order
    state = model.state_dict()
    tensors: dict[str, tuple[Tensor, str]] = {}
    for row, i in order:
        tensor = state[row.ours.format(i=i)].detach().to("cpu", torch.float32)
        if row.unpermute is not None:
            tensor = permute_rows(tensor, getattr(c, row.unpermute))
        tensors[row.theirs.format(i=i)] = (tensor, "F32" if tensor.dim() == 1 else type)
    write_gguf(path, meta, tensors, types=types)


def llama_config(file: GGUFFile):
    """The :class:`~minitransformer.llama.LlamaConfig` that a GGUF file's ``llama.*`` metadata
    describes (``llama.vocab_size`` absent: the tokenizer's or the embedding's size; no
    ``output.weight``: the head is tied to the embedding).

    Raises:
        ValueError: another ``general.architecture``, a size missing or not a positive int, or
            a feature :class:`~minitransformer.llama.Llama` does not have (RoPE scaling,
            experts, per-layer head counts, a key or value width other than ``d_model /
            head_count``), naming the key.
    """
    from minitransformer.llama import LlamaConfig

    meta, source = file.metadata, str(file.path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{source}: general.architecture is {arch!r}, not 'llama', the one "
                         f"architecture Llama.from_gguf reads")

    def size(key: str, default: int | None = None) -> int:
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"{source} has no metadata llama.{key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{source}: llama.{key} must be a positive int, got {value!r}")
        return value

    heads, d_model = size("attention.head_count"), size("embedding_length")
    kv_heads = size("attention.head_count_kv", heads)
    if d_model % heads or heads % kv_heads:
        raise ValueError(f"{source}: llama.attention.head_count={heads} must divide "
                         f"llama.embedding_length={d_model}, and "
                         f"llama.attention.head_count_kv={kv_heads} must divide it")
    head_dim = d_model // heads
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if meta.get(f"llama.{key}", head_dim) != head_dim:
            raise ValueError(f"{source}: llama.{key} is {meta[f'llama.{key}']}, not "
                             f"embedding_length / head_count = {head_dim}, which Llama "
                             f"cannot express")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none" or meta.get("llama.expert_count", 0):
        key = "rope.scaling.type" if scaling != "none" else "expert_count"
        raise ValueError(f"{source}: llama.{key} is {meta[f'llama.{key}']!r}, which Llama "
                         f"cannot express")
    vocab = meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ())) or (
        file.tensors["token_embd.weight"].shape[0] if "token_embd.weight" in file.tensors
        else None)
    eps = meta.get("llama.attention.layer_norm_rms_epsilon")
    theta = meta.get("llama.rope.freq_base", 10000.0)
    for key, value in (("attention.layer_norm_rms_epsilon", eps), ("rope.freq_base", theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{source}: llama.{key} must be a positive number, got {value!r}")
    return LlamaConfig(vocab_size=size("vocab_size", vocab),
                       context_length=size("context_length"), num_layers=size("block_count"),
                       num_heads=heads, d_model=d_model, d_ff=size("feed_forward_length"),
                       num_kv_heads=kv_heads, rope_theta=float(theta), norm_eps=float(eps),
                       tie_embeddings="output.weight" not in file.tensors)


def _expected_shape(row: GGUFName, config) -> tuple[int, ...]:
    sizes = {"vocab_size": config.vocab_size, "embedding_length": config.d_model,
             "feed_forward_length": config.d_ff,
             "attention.head_count_kv": config.num_kv_heads * config.head_dim}
    return tuple(sizes[name] for name in row.sizes)


def llama_state(file: GGUFFile, config) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Our state dict of a Llama from ``file`` (float32, query and key rows unpermuted), and
    each of our names' tensor in the file, through :data:`LLAMA_GGUF_NAMES`.

    Raises:
        ValueError: a tensor missing, one of another shape than the metadata says (naming
            the key), or one the model does not have (naming it).
    """
    from minitransformer import pretrained

    source = str(file.path)
    rows = [GGUFName(row.ours.format(i=i), row.theirs.format(i=i), row.sizes, row.unpermute)
            for row in LLAMA_GGUF_NAMES
            if not (row.ours == "head.weight" and config.tie_embeddings)
            for i in (range(config.num_layers) if "{i}" in row.theirs else (0,))]
    pretrained.check_names(file.tensors, {row.theirs for row in rows}, source=source,
                           model=f"a Llama with llama.block_count={config.num_layers}")
    state = {}
    for row in rows:
        if row.theirs not in file.tensors:
            raise ValueError(f"{source} has no tensor {row.theirs!r}, which a Llama with "
                             f"llama.block_count={config.num_layers} has")
        expected, stored = _expected_shape(row, config), file.tensors[row.theirs].shape
        if len(stored) != len(expected):
            raise ValueError(f"{source}: {row.theirs} has shape {stored}, not "
                             f"{len(expected)} dimensions")
        for key, want, got in zip(row.sizes, expected, stored):
            if want != got:
                raise ValueError(f"{source}: {row.theirs} has shape {stored}, but the metadata "
                                 f"says {expected} (llama.{key} = "
                                 f"{file.metadata.get(f'llama.{key}', want)})")
        tensor = file.tensor(row.theirs)
        if row.unpermute is not None:
            tensor = unpermute_rows(tensor, getattr(config, row.unpermute))
        state[row.ours] = tensor
    return state, {row.ours: row.theirs for row in rows}


def load_llama(cls, path: str | os.PathLike, *, device=None, dtype=None):
    """``cls`` (:class:`~minitransformer.llama.Llama`) built from a GGUF file, in eval mode:
    what :meth:`Llama.from_gguf <minitransformer.llama.Llama.from_gguf>` does."""
    from minitransformer import pretrained

    file = GGUFFile(path)
    config = llama_config(file)
    state, theirs = llama_state(file, config)
    with _SkipInit():       # every parameter is overwritten by the file's, checked by build
        return pretrained.build(cls, config, state, source=str(file.path), device=device,
                                dtype=dtype, theirs=theirs)


class _SkipInit(TorchFunctionMode):
    """Skip ``nn.init``'s random draws (seconds for 135M numbers) while a model is built only
    to receive a whole state dict."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, Tensor):
                return tensor
        return func(*args, **kwargs)
