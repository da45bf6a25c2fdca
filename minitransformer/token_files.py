"""Token files: your own text, tokenized once into flat files of ids, read as memory maps
(chapter 15, "Your own data").

Reading a whole text file and holding every token id as a Python object costs about 25 bytes of
memory per byte of text. nanoGPT's answer is the standard one: tokenize once, write the ids as
a flat binary file, and let training read random windows of it through a memory map, so the
operating system pages in only what a batch touches.

* :func:`prepare` -- files or directories of UTF-8 text -> a *prepared directory*:
  ``train.bin`` and ``val.bin`` (the ids, ``uint16`` when the vocabulary fits, else
  ``uint32``), the tokenizer's files, and ``index.json`` (written last) that describes them;
* :class:`TokenFiles` -- a prepared directory opened again: ``numpy.memmap`` views of both files
  and the tokenizer;
* :func:`random_windows` -- endless ``(inputs, targets)`` batches of random windows, the same
  batches as :func:`~minitransformer.data.random_batches` on the whole stream, so a seeded
  ``torch.Generator`` is the data position (resume) and every process of a ``torchrun`` run
  draws the same global batch and keeps its own rows;
* :func:`val_windows` -- consecutive windows for the validation loss, as
  :func:`~minitransformer.data.window_batches`.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import shutil
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from minitransformer._checks import check_choice, check_int, check_number, check_type
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer, stream_cut
from minitransformer.chat import CHAT_TOKENS

FORMAT, VERSION = "minitransformer.token_files", 1
INDEX_FILE, TRAIN_FILE, VAL_FILE = "index.json", "train.bin", "val.bin"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
MARKER = "prepare.partial"     # present from the first byte written until index.json is in place
PARTIAL = ".partial"           # what every file is called until it is complete
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SAMPLE_BYTES = 8 << 20         # the tokenizer learns its merges from this much of the text
LEAST_VOCAB_SIZE = 256 + len(CHAT_TOKENS)   # the bytes and the chat format's tokens
_BLOCK = 1 << 20               # bytes read at a time, and about the text sent to a worker
_SAMPLE_BLOCK = 1 << 16        # the sample is made of blocks this long, from seeded places


# ----- prepare ----------------------------------------------------------------------------------

def prepare(paths: str | os.PathLike | Sequence[str | os.PathLike], out_dir: str | os.PathLike,
            *, vocab_size: int | None = None,
            tokenizer: str | os.PathLike | BPETokenizer | None = None,
            val_fraction: float = 0.1, workers: int | None = None, seed: int = 0,
            sample_bytes: int = SAMPLE_BYTES, dtype: str | None = None,
            progress: bool = True) -> dict:
    """Tokenize the UTF-8 text of ``paths`` (files, or directories read recursively in name
    order) into the prepared directory ``out_dir``; return its index.

    The text is read as a stream, a block at a time: memory does not grow with the input.

    The tokenizer is either given (``tokenizer``: a directory of ``vocab.json`` and
    ``merges.txt``, ours or GPT-2's own, or a :class:`~minitransformer.bpe.BPETokenizer`), or
    learned with ``vocab_size`` tokens (``GPT2_PATTERN``, the chat format's special tokens
    reserved and counted, as ``train`` does) from a *sample*: blocks of whole lines
    from ``seed``-drawn places, ``sample_bytes`` in all (the whole text when it is smaller). A
    sample rather than the counts of every pre-token of the whole input: the distinct pieces
    keep growing with the text (new words, names, numbers), so their counts are not bounded in
    memory, and counting them in Python would take as long as encoding; the merges of a
    vocabulary of a few thousand tokens are decided by frequent pairs, which a few megabytes
    estimate well.

    Each file is encoded on its own, cut at places where the ids cannot change
    (:meth:`~minitransformer.bpe.BPETokenizer.encode_iterable`'s rule), in ``workers``
    processes (default, and at most: the cores), by the tokenizer itself: Hugging Face
    ``tokenizers``, read from the same files, gives the same ids (tested) but was no faster per core
    (``benchmarks/prepare.py``), so the package does not use it.

    The last ``val_fraction`` of the bytes (from the last safe cut before that point) is
    ``val.bin``, the rest ``train.bin``. Files are written under temporary names and renamed;
    ``index.json`` comes last and ``prepare.partial`` marks the directory until then, so a run
    killed at any moment leaves a directory that :class:`TokenFiles` refuses and that
    ``prepare`` may overwrite.

    A learned tokenizer can have fewer tokens than ``vocab_size``: when no pair of the sample
    is left to merge. ``prepare`` then warns (``UserWarning``) and the index records the real
    count. ``index.json`` records the tokenizer files' SHA-256 (``tokenizer_sha256``),
    which :class:`TokenFiles` checks: files swapped for another tokenizer's are refused.

    Raises ``ValueError`` naming the file and byte offset for text that is not UTF-8, and for
    an empty input, an ``out_dir`` that holds anything else, a vocabulary that does not fit
    ``dtype``; ``FileNotFoundError`` for a missing path.
    """
    sources = _sources(paths, out_dir)
    out = _out_dir(out_dir)
    if (vocab_size is None) == (tokenizer is None):
        raise ValueError("prepare needs either vocab_size (to learn a tokenizer) or tokenizer "
                         "(a directory of vocab.json and merges.txt), not both or neither")
    if vocab_size is not None:
        check_int("vocab_size", vocab_size)
        if vocab_size < LEAST_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {LEAST_VOCAB_SIZE} (the 256 byte "
                             f"tokens and the {len(CHAT_TOKENS)} chat tokens), got {vocab_size}")
    check_number("val_fraction", val_fraction, low=0.0)
    if val_fraction >= 1:
        raise ValueError(f"val_fraction must be below 1, got {val_fraction}")
    workers = min(_default_workers(), _default_workers() if workers is None
                  else check_int("workers", workers))
    check_int("seed", seed, low=0)
    check_int("sample_bytes", sample_bytes)
    if dtype is not None:
        check_choice("dtype", dtype, DTYPES)
    total = sum(size for _, size in sources)
    if total == 0:
        raise ValueError(f"the input is empty: {', '.join(str(p) for p, _ in sources)} "
                         f"hold{'s' * (len(sources) == 1)} no text")

    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    _clear(out)
    (out / MARKER).write_text("prepare did not finish: run it again\n", encoding="utf-8")
    try:
        index = _prepare(sources, out, total, vocab_size=vocab_size, tokenizer=tokenizer,
                         val_fraction=val_fraction, workers=workers, seed=seed,
                         sample_bytes=sample_bytes, dtype=dtype, progress=progress)
    except BaseException:
        _clear(out)
        if made and not any(out.iterdir()):
            out.rmdir()
        raise
    (out / MARKER).unlink()
    return index


def _prepare(sources, out, total, *, vocab_size, tokenizer, val_fraction, workers, seed,
             sample_bytes, dtype, progress) -> dict:
    if vocab_size is not None:
        with _context().Pool(1) as pool:      # its memory is given back when it ends
            merges = pool.apply(_learn, (sources, sample_bytes, seed, vocab_size))
        tokenizer = BPETokenizer(merges, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS)
        origin = {"trained": True, "sample_bytes": min(sample_bytes, total), "seed": seed}
        if len(tokenizer) < vocab_size:
            warnings.warn(f"vocab_size={vocab_size:,} asked, but the tokenizer learned only "
                          f"{len(tokenizer):,} tokens: no pair of the "
                          f"{min(sample_bytes, total):,}-byte sample is left to merge",
                          stacklevel=3)
    elif isinstance(tokenizer, BPETokenizer):
        origin = {"trained": False, "from": repr(tokenizer)}
    else:
        check_type("tokenizer", tokenizer, (str, os.PathLike),
                   "a directory of vocab.json and merges.txt, or a BPETokenizer")
        origin = {"trained": False, "from": os.path.abspath(tokenizer)}
        tokenizer = BPETokenizer.from_pretrained(tokenizer)
    name = _dtype_for(len(tokenizer), dtype)
    staged = out / ("tokenizer" + PARTIAL)
    tokenizer.save_pretrained(staged)

    split_at = total - round(val_fraction * total)
    counts, hashes = {"train": 0, "val": 0}, []
    bar = _bar(total, progress)
    with open(out / (TRAIN_FILE + PARTIAL), "wb") as train_f, \
            open(out / (VAL_FILE + PARTIAL), "wb") as val_f:
        files = {"train": train_f, "val": val_f}
        chunks = _text_chunks(sources, tokenizer, split_at, hashes)
        for part, ids, size in _encode_all(chunks, tokenizer, name, workers):
            files[part].write(ids)
            counts[part] += len(ids) // np.dtype(name).itemsize
            bar.update(size)
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    bar.close()
    if counts["train"] == 0:
        raise ValueError(f"the input is too small to split: no token is left for training "
                         f"after the last {val_fraction} held out for validation")
    index = {
        "format": FORMAT, "version": VERSION, "dtype": name, "vocab_size": len(tokenizer),
        "tokens": counts, "files": {"train": TRAIN_FILE, "val": VAL_FILE},
        "tokenizer": {"files": list(TOKENIZER_FILES), **origin,
                      "sha256": tokenizer_sha256(staged)},
        "val_fraction": val_fraction, "bytes": total,
        "sources": [{"path": os.path.abspath(path), "bytes": size, "sha256": digest}
                    for (path, size), digest in zip(sources, hashes)],
    }
    for part in ("train", "val"):
        os.replace(out / (index["files"][part] + PARTIAL), out / index["files"][part])
    for file in TOKENIZER_FILES:
        os.replace(staged / file, out / file)
    staged.rmdir()
    _write_atomically(out / INDEX_FILE, json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    return index


def tokenizer_sha256(folder: str | os.PathLike) -> str:
    """The SHA-256 of a tokenizer directory's ``vocab.json`` and ``merges.txt`` (each file's
    name, length and bytes, in that order): what ``index.json`` records and
    :class:`TokenFiles` checks."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES[:2]:
        data = (Path(folder) / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _learn(sources, sample_bytes: int, seed: int, vocab_size: int) -> list:
    """The merges of a tokenizer learned from the sample (run in a process of its own). The
    chat format's special tokens are reserved, as ``train`` reserves them (chapter 16), and
    count in ``vocab_size``."""
    return list(BPETokenizer.train(_sample(sources, sample_bytes, seed),
                                   vocab_size,
                                   pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS).merges)


def _context():
    """Worker processes are forked where the system can (they start at once, sharing the
    parent's memory), else spawned."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _sources(paths, out_dir) -> list[tuple[Path, int]]:
    """The input files, in order, with their sizes: a directory gives its files, recursively in
    name order, leaving out hidden names and ``out_dir``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    check_type("paths", paths, (list, tuple), "a path or a list of paths")
    if not paths:
        raise ValueError("paths is empty: give at least one file or directory of text")
    check_type("out_dir", out_dir, (str, os.PathLike), "a str or path")
    skip = Path(out_dir).resolve()
    files = []
    for k, path in enumerate(paths):
        check_type(f"paths[{k}]", path, (str, os.PathLike), "a str or path")
        path = Path(path)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(path).parts)
                           and skip not in p.resolve().parents)
            if not found:
                raise ValueError(f"the input is empty: the directory {path} holds no file")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(2, "no such file or directory", str(path))
    return [(p, p.stat().st_size) for p in files]


def _out_dir(out_dir) -> Path:
    """``out_dir``, checked: new, empty, or left half-written by an earlier ``prepare``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {out} is a file, not a directory")
    if not out.is_dir() or (out / MARKER).exists():
        return out
    names = sorted(p.name for p in out.iterdir())
    if INDEX_FILE in names:
        raise ValueError(f"out_dir {out} already holds a prepared directory: choose another "
                         f"directory (prepare never overwrites a complete one)")
    if names:
        raise ValueError(f"out_dir {out} holds files prepare did not write ({names[0]}, ...): "
                         f"choose an empty or new directory")
    return out


def _clear(out: Path) -> None:
    """Remove what a ``prepare`` into ``out`` writes (only ever called with its marker there)."""
    for name in (TRAIN_FILE, VAL_FILE, INDEX_FILE, *TOKENIZER_FILES):
        for file in (out / name, out / (name + PARTIAL)):
            file.unlink(missing_ok=True)
    shutil.rmtree(out / ("tokenizer" + PARTIAL), ignore_errors=True)
    (out / MARKER).unlink(missing_ok=True)


def discard(path: str | os.PathLike) -> bool:
    """Remove the prepared directory ``path`` (complete or half-written) if ``prepare`` made it:
    only the files that ``prepare`` writes, and the directory when that leaves it empty. Return
    whether it was one (a directory without ``prepare``'s marker or index is left alone)."""
    out = Path(path)
    if not out.is_dir():
        return False
    if not (out / MARKER).exists():
        try:
            _read_index(out / INDEX_FILE)
        except (OSError, ValueError):
            return False
    _clear(out)
    if not any(out.iterdir()):
        out.rmdir()
    return True


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + PARTIAL)
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _dtype_for(vocab_size: int, dtype: str | None) -> str:
    """The smallest dtype that holds every id, or ``dtype`` when given and large enough."""
    name = dtype or ("uint16" if vocab_size <= 1 << 16 else "uint32")
    top = int(np.iinfo(DTYPES[name]).max)
    if vocab_size - 1 > top:
        raise ValueError(f"a vocabulary of {vocab_size:,} tokens does not fit dtype {name} "
                         f"(ids up to {top:,}): use uint32 or a smaller vocabulary")
    return name


def _bar(total: int, progress: bool):
    import tqdm
    return tqdm.tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                     desc="encoding", disable=not progress, mininterval=0.5)


# ----- reading the text -------------------------------------------------------------------------

def _decode(path: Path, data: bytes, offset: int, final: bool) -> tuple[str, bytes]:
    """``data`` (from byte ``offset`` of ``path``) as text, and the bytes of a character that
    the next block completes."""
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as error:
        if not final and error.reason == "unexpected end of data":
            return data[:error.start].decode("utf-8"), data[error.start:]
        raise ValueError(f"{path} is not UTF-8 text: {error.reason} at byte "
                         f"{offset + error.start} (0x{data[error.start]:02x})") from None


def _sample(sources: list[tuple[Path, int]], sample_bytes: int, seed: int) -> str:
    """About ``sample_bytes`` of whole lines, from blocks at ``seed``-drawn places; the whole
    text when it is no larger."""
    total = sum(size for _, size in sources)
    if total <= sample_bytes:
        blocks = [(path, 0, size) for path, size in sources]
    else:
        starts = sorted(random.Random(seed).sample(range(total // _SAMPLE_BLOCK),
                                                   sample_bytes // _SAMPLE_BLOCK))
        blocks, first = [], 0
        it = iter(starts)
        start = next(it, None)
        for path, size in sources:
            while start is not None and start * _SAMPLE_BLOCK < first + size:
                blocks.append((path, start * _SAMPLE_BLOCK - first, _SAMPLE_BLOCK))
                start = next(it, None)
            first += size
    texts = []
    for path, offset, length in blocks:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        at_end = offset + len(data) >= path.stat().st_size
        start = data.find(b"\n") + 1 if offset else 0     # a newline is never inside a character
        if start == 0:
            while start < len(data) and 0x80 <= data[start] < 0xC0:
                start += 1                                  # skip a cut character's tail
        end = len(data) if at_end else data.rfind(b"\n") + 1
        if end <= start:                                    # a block inside one long line
            end = len(data)
        text, _ = _decode(path, data[start:end], offset + start, final=at_end)
        texts.append(text)
    return "".join(texts)


def _text_chunks(sources: list[tuple[Path, int]], tokenizer: BPETokenizer, split_at: int,
                 hashes: list[str]) -> Iterator[tuple[str, str]]:
    """``(part, text)``: every file cut into pieces of about ``_BLOCK`` characters, at places
    where the ids cannot change; ``part`` is ``"val"`` from the last such place before byte
    ``split_at`` of the input. Appends each file's SHA-256 to ``hashes`` as it is read."""
    first = 0
    for path, size in sources:
        digest = hashlib.sha256()
        part = "train" if first < split_at else "val"
        pending, carry, pos, next_try = "", b"", 0, _BLOCK
        with open(path, "rb") as f:
            while True:
                want = _BLOCK
                if part == "train" and first + pos < split_at:
                    want = min(want, split_at - first - pos)
                block = f.read(want)
                digest.update(block)
                text, carry = _decode(path, carry + block, pos - len(carry), final=not block)
                pos += len(block)
                pending += text
                if not block:
                    break
                if part == "train" and first + pos >= split_at and pos < size:
                    cut = stream_cut(pending, tokenizer)
                    if cut:
                        yield part, pending[:cut]
                    pending, part, next_try = pending[cut:], "val", len(pending) - cut + _BLOCK
                elif len(pending) >= next_try:
                    cut = stream_cut(pending, tokenizer)
                    if cut:
                        yield part, pending[:cut]
                    pending = pending[cut:]
                    next_try = len(pending) + max(_BLOCK, len(pending) if not cut else 0)
        if pos != size:
            raise ValueError(f"{path} changed while it was read ({size} bytes, then {pos})")
        if pending:
            yield part, pending
        hashes.append(digest.hexdigest())
        first += size


# ----- encoding in worker processes -------------------------------------------------------------

_WORKER: dict = {}


def _start_worker(tokenizer: BPETokenizer, dtype: str) -> None:
    _WORKER.update(tokenizer=tokenizer, dtype=dtype)


def _encode_chunk(text: str) -> tuple[bytes, int]:
    """The ids of ``text`` as bytes of the dtype, and the text's size in bytes."""
    ids = _WORKER["tokenizer"].encode(text)
    return np.asarray(ids, dtype=_WORKER["dtype"]).tobytes(), len(text.encode("utf-8"))


def _encode_all(chunks: Iterator[tuple[str, str]], tokenizer: BPETokenizer, dtype: str,
                workers: int) -> Iterator[tuple[str, bytes, int]]:
    """``(part, ids as bytes, text bytes)`` for each chunk, in order. With several workers at
    most two chunks per worker are in flight, so memory stays bounded."""
    if workers == 1:
        _start_worker(tokenizer, dtype)
        for part, text in chunks:
            yield part, *_encode_chunk(text)
        return
    with _context().Pool(workers, initializer=_start_worker,
                         initargs=(tokenizer, dtype)) as pool:
        pending: deque = deque()
        for part, text in chunks:
            pending.append((part, pool.apply_async(_encode_chunk, (text,))))
            if len(pending) >= 2 * workers:
                part, result = pending.popleft()
                yield part, *result.get()
        while pending:
            part, result = pending.popleft()
            yield part, *result.get()


# ----- reading a prepared directory -------------------------------------------------------------

class TokenFiles:
    """A prepared directory, opened: ``train`` and ``val`` are read-only ``numpy.memmap`` views
    of the ids (nothing is read until a window is), ``tokenizer`` the tokenizer that made them,
    ``index`` the contents of ``index.json``.

    Raises ``ValueError`` for a directory that is not a prepared one, one that a ``prepare``
    left half-written, or files that do not match the index (sizes, dtype, vocabulary).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        check_type("path", path, (str, os.PathLike), "a str or path")
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"{self.path} is not a prepared directory: no such directory")
        if (self.path / MARKER).exists() or (
                not (self.path / INDEX_FILE).exists()
                and any(p.name.endswith(PARTIAL) for p in self.path.iterdir())):
            raise ValueError(f"{self.path} is half-written: a prepare into it did not finish "
                             f"(killed or failed); run prepare again")
        if not (self.path / INDEX_FILE).exists():
            raise ValueError(f"{self.path} is not a prepared directory: no {INDEX_FILE} (make "
                             f"one with prepare)")
        self.index = _read_index(self.path / INDEX_FILE)
        self.dtype = np.dtype(DTYPES[self.index["dtype"]])
        self.tokenizer = BPETokenizer.from_pretrained(self.path)
        where = f"{self.path / INDEX_FILE}"
        if len(self.tokenizer) != self.index["vocab_size"]:
            raise ValueError(f"{where} says vocab_size {self.index['vocab_size']}, the "
                             f"tokenizer files hold {len(self.tokenizer)} tokens")
        _dtype_for(len(self.tokenizer), self.index["dtype"])
        origin = self.index.get("tokenizer")
        recorded = origin.get("sha256") if isinstance(origin, dict) else None
        if recorded is not None and recorded != tokenizer_sha256(self.path):
            raise ValueError(f"{self.path}'s vocab.json and merges.txt are not the tokenizer "
                             f"that made its ids (their SHA-256 differs from the one {where} "
                             f"records): put the right ones back, or run prepare again")
        self.train = self._map("train")
        self.val = self._map("val")

    def _map(self, part: str) -> np.ndarray:
        file = self.path / self.index["files"][part]
        count = self.index["tokens"][part]
        if not file.is_file():
            raise ValueError(f"{self.path} is not a complete prepared directory: {file.name} "
                             f"is missing")
        size = file.stat().st_size
        if size != count * self.dtype.itemsize:
            raise ValueError(f"{file} holds {size} bytes, but {INDEX_FILE} says {count} tokens "
                             f"of {self.dtype.name} ({count * self.dtype.itemsize} bytes)")
        if count == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(file, dtype=self.dtype, mode="r", shape=(count,))

    def __repr__(self) -> str:
        return (f"TokenFiles({str(self.path)!r}, train={len(self.train):,} tokens, "
                f"val={len(self.val):,} tokens, dtype={self.dtype.name}, "
                f"vocab_size={len(self.tokenizer)})")


def _read_index(path: Path) -> dict:
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a prepared directory's index: {error}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ValueError(f"{path} is not a prepared directory's index: no \"format\": "
                         f"\"{FORMAT}\"")
    if index.get("version") != VERSION:
        raise ValueError(f"{path} has version {index.get('version')!r}; this code reads "
                         f"version {VERSION}")
    ok = (index.get("dtype") in DTYPES and isinstance(index.get("vocab_size"), int)
          and isinstance(index.get("tokens"), dict) and isinstance(index.get("files"), dict)
          and all(isinstance(index["tokens"].get(p), int) and index["tokens"][p] >= 0
                  and isinstance(index["files"].get(p), str)
                  and Path(index["files"][p]).name == index["files"][p]
                  for p in ("train", "val")))
    if not ok:
        raise ValueError(f"{path} is corrupt: dtype, vocab_size, tokens and files must be "
                         f"uint16/uint32, an int, and train/val counts and file names")
    return index


# ----- windows for training ----------------------------------------------------------------------

def _check_tokens(name: str, tokens: object, context_length: int) -> np.ndarray:
    check_type(name, tokens, np.ndarray, "a numpy array of ids (TokenFiles(...).train)")
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D array of integer ids, got shape "
                         f"{tokens.shape} and dtype {tokens.dtype}")
    if len(tokens) < context_length + 1:
        raise ValueError(f"{name} holds {len(tokens)} tokens, too few for one window of "
                         f"context_length + 1 = {context_length + 1}")
    return tokens


def random_windows(tokens: np.ndarray, *, batch_size: int, context_length: int,
                   generator: torch.Generator | None = None, rank: int = 0,
                   world_size: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless ``(inputs, targets)`` int64 batches, each ``(batch_size // world_size,
    context_length)``, of windows that start at random places in ``tokens``.

    Every call draws the starts of the whole global batch, ``torch.randint(len(tokens) -
    context_length, (batch_size,), generator=generator)`` exactly as
    :func:`~minitransformer.data.random_batches` does, and reads the rows ``rank * share`` to
    ``(rank + 1) * share`` of it. So the batches equal ``random_batches`` on the whole stream,
    ``world_size`` processes with the same seed together see one process's batch, and the
    generator's state is the position in the data (save it to resume).
    """
    check_int("batch_size", batch_size)
    check_int("context_length", context_length)
    check_int("world_size", world_size)
    check_int("rank", rank, low=0)
    if rank >= world_size:
        raise ValueError(f"rank must be below world_size {world_size}, got {rank}")
    if batch_size % world_size:
        raise ValueError(f"batch_size {batch_size} is not divisible by world_size {world_size}")
    tokens = _check_tokens("tokens", tokens, context_length)
    return _windows(tokens, batch_size, context_length, generator, rank, world_size)


def _windows(tokens, batch_size, context_length, generator, rank, world_size):
    share = batch_size // world_size
    offsets = np.arange(context_length + 1)
    while True:
        starts = torch.randint(len(tokens) - context_length, (batch_size,),
                               generator=generator)
        mine = starts[rank * share:(rank + 1) * share].numpy()
        windows = torch.from_numpy(tokens[mine[:, None] + offsets].astype(np.int64))
        yield windows[:, :-1], windows[:, 1:]           # (B / world, T + 1) -> 2 x (B / world, T)


def val_windows(tokens: np.ndarray, *, batch_size: int, context_length: int,
                max_batches: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """The first consecutive windows of ``tokens`` as ``(inputs, targets)`` int64 batches, as
    :func:`~minitransformer.data.window_batches` cuts them, at most ``max_batches`` of them
    (only those are read)."""
    check_int("batch_size", batch_size)
    check_int("context_length", context_length)
    tokens = _check_tokens("tokens", tokens, context_length)
    count = (len(tokens) - 1) // context_length
    if max_batches is not None:
        count = min(count, check_int("max_batches", max_batches) * batch_size)
    stream = torch.from_numpy(np.asarray(tokens[:count * context_length + 1], dtype=np.int64))
    inputs = stream[:count * context_length].reshape(count, context_length)
    targets = stream[1:count * context_length + 1].reshape(count, context_length)
    return [(inputs[i:i + batch_size], targets[i:i + batch_size])
            for i in range(0, count, batch_size)]
