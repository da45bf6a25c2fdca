"""Token files (issue 31): prepare, TokenFiles, random_windows, val_windows.

The streamed ids must equal ``encode`` of each whole file; the dtype is the smallest that holds
the vocabulary; a killed prepare leaves a directory that is refused and can be prepared again;
the windows equal ``random_batches``/``window_batches`` on the whole stream, rank by rank; every
bad input is a ValueError/TypeError that names it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from minitransformer import bpe, token_files
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.data import random_batches, window_batches
from minitransformer.token_files import TokenFiles, prepare, random_windows, val_windows

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
GPT2_TINY = DATA / "gpt2_tiny"
SAMPLES = [DATA / name for name in ("german.txt", "chinese.txt", "arabic.txt", "emoji.txt",
                                    "multilingual.txt")]
CORPUS = ROOT / "book" / "data" / "corpus.txt"


def all_ids(files: TokenFiles) -> list[int]:
    return np.concatenate([files.train, files.val]).tolist()


def whole_file_ids(tokenizer: BPETokenizer, paths) -> list[int]:
    return [i for p in paths for i in tokenizer.encode(Path(p).read_bytes().decode("utf-8"))]


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of a few bytes, so every file is read, cut and encoded in many pieces."""
    monkeypatch.setattr(token_files, "_BLOCK", 97)
    monkeypatch.setattr(bpe, "_STREAM_CHUNK", 5)


# ----- prepare: the ids ------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_streamed_ids_equal_whole_file_ids_and_round_trip(tmp_path, tiny_blocks, workers):
    index = prepare(SAMPLES, tmp_path / "out", vocab_size=400, workers=workers,
                    progress=False)
    files = TokenFiles(tmp_path / "out")
    assert files.index == index
    ids = all_ids(files)
    assert ids == whole_file_ids(files.tokenizer, SAMPLES)
    assert files.tokenizer.decode_bytes(ids) == b"".join(p.read_bytes() for p in SAMPLES)
    for path in SAMPLES:     # each language on its own: exact bytes back
        one = files.tokenizer.encode(path.read_bytes().decode("utf-8"))
        assert files.tokenizer.decode_bytes(one) == path.read_bytes()
    assert [s["sha256"] for s in index["sources"]] == [
        __import__("hashlib").sha256(p.read_bytes()).hexdigest() for p in SAMPLES]
    assert [s["bytes"] for s in index["sources"]] == [p.stat().st_size for p in SAMPLES]
    assert index["tokens"]["val"] > 0 and index["tokens"]["train"] > 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["index.json", "train.bin", "val.bin", "vocab.json", "merges.txt",
         "tokenizer.json", "tokenizer_config.json"])


def test_a_directory_and_a_gpt2_tokenizer(tmp_path, tiny_blocks):
    """A directory is read recursively in name order (hidden files left out); GPT-2's own files
    are reused as they are, ids in GPT-2's numbering, <|endoftext|> a special token."""
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "b" / "z.txt").write_bytes(SAMPLES[4].read_bytes())
    (src / "a.txt").write_bytes(SAMPLES[0].read_bytes())
    (src / ".hidden").write_bytes(b"\xff not read")
    index = prepare(src, tmp_path / "out", tokenizer=GPT2_TINY, workers=2,
                    progress=False)
    files = TokenFiles(tmp_path / "out")
    reference = BPETokenizer.from_pretrained(GPT2_TINY)
    assert files.tokenizer == reference and index["tokenizer"]["trained"] is False
    assert [Path(s["path"]).name for s in index["sources"]] == ["a.txt", "z.txt"]
    ids = all_ids(files)
    assert ids == whole_file_ids(reference, [SAMPLES[0], SAMPLES[4]])
    assert reference.special_tokens["<|endoftext|>"] in ids


def test_hugging_face_tokenizers_reads_the_same_ids_from_the_written_files(tmp_path):
    """The prepared directory's vocab.json/merges.txt, loaded into tokenizers' byte-level BPE,
    encode every sample to the ids in the token files (what benchmarks/prepare.py compares)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    for name, kwargs in (("own", dict(vocab_size=600)), ("gpt2", dict(tokenizer=GPT2_TINY))):
        out = tmp_path / name
        prepare(SAMPLES, out, workers=1, val_fraction=0.0, progress=False, **kwargs)
        files = TokenFiles(out)
        fast = Tokenizer(models.BPE.from_file(str(out / "vocab.json"),
                                              str(out / "merges.txt")))
        fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        fast.add_special_tokens([AddedToken(s, normalized=False, special=True)
                                 for s in files.tokenizer.special_tokens])
        theirs = [i for p in SAMPLES for i in fast.encode(p.read_bytes().decode()).ids]
        assert files.train.tolist() == theirs, name


def test_the_package_does_not_import_tokenizers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)     # import tokenizers -> ImportError
    prepare(SAMPLES[:1], tmp_path / "a", tokenizer=GPT2_TINY, workers=2, progress=False)
    assert len(TokenFiles(tmp_path / "a").train) > 0


def test_same_seed_same_files_and_the_sample_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(token_files, "_SAMPLE_BLOCK", 1024)
    text = CORPUS.read_bytes()
    sources = [(CORPUS, len(text))]
    sample = token_files._sample(sources, 8 * 1024, seed=0)
    assert 0 < len(sample.encode("utf-8")) <= 8 * 1024
    assert sample == token_files._sample(sources, 8 * 1024, seed=0)
    assert sample != token_files._sample(sources, 8 * 1024, seed=1)
    assert sample.encode("utf-8") in text or all(
        line.encode("utf-8") in text for line in sample.splitlines(keepends=True))
    kwargs = dict(vocab_size=300, sample_bytes=16 * 1024, workers=1, progress=False)
    a = prepare(CORPUS, tmp_path / "a", seed=3, **kwargs)
    prepare(CORPUS, tmp_path / "b", seed=3, **kwargs)
    assert a["tokenizer"]["sample_bytes"] == 16 * 1024
    for name in ("train.bin", "val.bin", "merges.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_val_fraction(tmp_path):
    none = prepare(SAMPLES[0], tmp_path / "none", tokenizer=GPT2_TINY, val_fraction=0.0,
                   workers=1, progress=False)
    half = prepare(SAMPLES[0], tmp_path / "half", tokenizer=GPT2_TINY, val_fraction=0.5,
                   workers=1, progress=False)
    assert none["tokens"]["val"] == 0 and len(TokenFiles(tmp_path / "none").val) == 0
    assert 0.3 < half["tokens"]["val"] / sum(half["tokens"].values()) < 0.7
    assert all_ids(TokenFiles(tmp_path / "none")) == all_ids(TokenFiles(tmp_path / "half"))


# ----- the dtype -------------------------------------------------------------------------------

ZZ = (ord("z"), ord("z"))


def pair_tokenizer(num_merges: int) -> BPETokenizer:
    """A tokenizer whose merges make two-byte tokens, ``256 + num_merges`` tokens."""
    others = [(a, b) for a in range(256) for b in range(256) if (a, b) != ZZ]
    pairs = [*others[:65280], ZZ, *others[65280:]][:num_merges]     # "zz" is id 65536
    return BPETokenizer([(pair, 256 + k) for k, pair in enumerate(pairs)],
                        pattern=GPT2_PATTERN)


def test_uint16_when_the_vocabulary_fits_else_uint32(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes("zz ÿÿ hello\n".encode() * 50)
    fits = pair_tokenizer(65536 - 256)            # ids 0..65535: the largest uint16 vocabulary
    over = pair_tokenizer(65536 - 256 + 1)
    assert len(fits) == 65536 and len(over) == 65537
    a = prepare(text, tmp_path / "a", tokenizer=fits, workers=1, progress=False)
    b = prepare(text, tmp_path / "b", tokenizer=over, workers=1, progress=False)
    assert (a["dtype"], b["dtype"]) == ("uint16", "uint32")
    fa, fb = TokenFiles(tmp_path / "a"), TokenFiles(tmp_path / "b")
    assert fa.train.dtype == np.uint16 and fb.train.dtype == np.uint32
    assert (tmp_path / "a" / "train.bin").stat().st_size == 2 * a["tokens"]["train"]
    assert (tmp_path / "b" / "train.bin").stat().st_size == 4 * b["tokens"]["train"]
    assert max(all_ids(fb)) > 65535            # "zz" is a pair past 65535: it did need uint32
    assert all_ids(fb) == over.encode(text.read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="65,537 tokens does not fit dtype uint16"):
        prepare(text, tmp_path / "c", tokenizer=over, dtype="uint16", progress=False)
    assert not (tmp_path / "c").exists()
    c = prepare(text, tmp_path / "c", tokenizer=fits, dtype="uint32", progress=False)
    assert c["dtype"] == "uint32" and all_ids(TokenFiles(tmp_path / "c")) == all_ids(fa)


# ----- a killed prepare --------------------------------------------------------------------------

KILLED = """
import sys
from minitransformer.token_files import prepare
prepare(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], workers=1, progress=False)
"""


def test_a_killed_prepare_is_refused_then_prepared_again(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "w", encoding="utf-8") as f:  # about 5 MB: several 1 MB blocks to kill between
        for k in range(28):
            f.write(CORPUS.read_text(encoding="utf-8").replace("the", f"the{k}"))
            f.write(SAMPLES[4].read_bytes().decode("utf-8"))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(big), str(out), str(GPT2_TINY)],
                            env=env)
    partial = out / "train.bin.partial"
    deadline = time.monotonic() + 120
    while not (partial.exists() and partial.stat().st_size > 0):
        assert proc.poll() is None, "prepare ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "prepare.partial").exists() and not (out / "index.json").exists()
    with pytest.raises(ValueError, match="is half-written: a prepare into it did not finish"):
        TokenFiles(out)
    prepare(big, out, tokenizer=GPT2_TINY, workers=1, progress=False)
    prepare(big, tmp_path / "clean", tokenizer=GPT2_TINY, workers=1, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (tmp_path / "clean").iterdir())
    for name in ("train.bin", "val.bin", "vocab.json", "merges.txt"):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()
    assert len(TokenFiles(out).train) > 0


def test_every_stage_of_a_kill_is_refused(tmp_path):
    out = tmp_path / "out"
    prepare(SAMPLES[0], out, tokenizer=GPT2_TINY, workers=1, progress=False)
    (out / "prepare.partial").write_text("")      # killed after index.json, before the marker went
    with pytest.raises(ValueError, match="half-written"):
        TokenFiles(out)
    (out / "prepare.partial").unlink()
    (out / "index.json").rename(out / "index.json.partial")   # killed before index.json's rename
    with pytest.raises(ValueError, match="half-written"):
        TokenFiles(out)
    (out / "index.json.partial").unlink()
    with pytest.raises(ValueError, match=r"not a prepared directory: no index\.json"):
        TokenFiles(out)


def test_a_failed_prepare_leaves_nothing(tmp_path, tiny_blocks):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(SAMPLES[1].read_bytes() + b"\xc3(")
    with pytest.raises(ValueError):
        prepare([SAMPLES[0], bad], tmp_path / "out", tokenizer=GPT2_TINY, workers=2,
                progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError):
        prepare(bad, tmp_path / "mine", tokenizer=GPT2_TINY, workers=1, progress=False)
    assert list((tmp_path / "mine").iterdir()) == []


# ----- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("content, where", [
    (b"abc\xffdef", "invalid start byte at byte 3 (0xff)"),
    (b"caf\xc3", "unexpected end of data at byte 3 (0xc3)"),
    ("ü".encode() * 300 + b"\xe2\x82(" + b"x" * 300, "invalid continuation byte at byte 600"),
    (b"\xef\xbb\xbfok\n" * 100 + b"\xc0\xaf", "invalid start byte at byte 600 (0xc0)"),
])
def test_not_utf8_names_the_file_and_the_byte(tmp_path, tiny_blocks, content, where):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(f"{bad} is not UTF-8 text: {where}")):
        prepare(bad, tmp_path / "out", tokenizer=GPT2_TINY, workers=1, progress=False)
    # the same from the tokenizer's sample
    with pytest.raises(ValueError, match=re.escape(f"{bad} is not UTF-8 text: {where}")):
        prepare(bad, tmp_path / "out2", vocab_size=300, workers=1, progress=False)


def test_refusals_of_prepare(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    (tmp_path / "nothing").mkdir()
    ok = dict(tokenizer=GPT2_TINY, progress=False)
    with pytest.raises(ValueError, match="the input is empty: .*empty.txt holds no text"):
        prepare(empty, tmp_path / "o", **ok)
    with pytest.raises(ValueError, match="the directory .*nothing holds no file"):
        prepare(tmp_path / "nothing", tmp_path / "o", **ok)
    with pytest.raises(ValueError, match="paths is empty"):
        prepare([], tmp_path / "o", **ok)
    with pytest.raises(FileNotFoundError, match="no such file or directory: .*missing"):
        prepare(tmp_path / "missing", tmp_path / "o", **ok)
    with pytest.raises(TypeError, match=r"paths\[1\] must be a str or path, got int"):
        prepare([SAMPLES[0], 3], tmp_path / "o", **ok)
    with pytest.raises(ValueError, match="either vocab_size .* or tokenizer"):
        prepare(SAMPLES[0], tmp_path / "o", progress=False)
    with pytest.raises(ValueError, match="either vocab_size .* or tokenizer"):
        prepare(SAMPLES[0], tmp_path / "o", vocab_size=300, **ok)
    with pytest.raises(ValueError, match=r"vocab_size must be at least 261 \(the 256 byte "
                       r"tokens and the 5 chat tokens\), got 260"):
        prepare(SAMPLES[0], tmp_path / "o", vocab_size=260, progress=False)
    with pytest.raises(ValueError, match="vocab_size must be at least 261 .*, got 100"):
        prepare(SAMPLES[0], tmp_path / "o", vocab_size=100, progress=False)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="val_fraction must be"):
            prepare(SAMPLES[0], tmp_path / "o", val_fraction=bad, **ok)
    with pytest.raises(ValueError, match="workers must be at least 1"):
        prepare(SAMPLES[0], tmp_path / "o", workers=0, **ok)
    with pytest.raises(ValueError, match="dtype must be one of"):
        prepare(SAMPLES[0], tmp_path / "o", dtype="int8", **ok)
    with pytest.raises(FileNotFoundError, match="no vocab.json"):
        prepare(SAMPLES[0], tmp_path / "o", tokenizer=tmp_path / "nothing", progress=False)
    with pytest.raises(ValueError, match="no token is left for training"):
        prepare(SAMPLES[0], tmp_path / "o", val_fraction=0.999, **ok)
    assert not (tmp_path / "o").exists()
    # the output directory: never overwrite what prepare did not write, nor a complete one
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files prepare did not write"):
        prepare(SAMPLES[0], tmp_path / "theirs", **ok)
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="is a file, not a directory"):
        prepare(SAMPLES[0], empty, **ok)
    prepare(SAMPLES[0], tmp_path / "done", **ok)
    with pytest.raises(ValueError, match="already holds a prepared directory"):
        prepare(SAMPLES[0], tmp_path / "done", **ok)


def test_refusals_of_token_files(tmp_path):
    with pytest.raises(ValueError, match="not a prepared directory: no such directory"):
        TokenFiles(tmp_path / "missing")
    with pytest.raises(TypeError, match="path must be a str or path"):
        TokenFiles(3)
    out = tmp_path / "out"
    prepare(SAMPLES[0], out, tokenizer=GPT2_TINY, workers=1, progress=False)
    index = json.loads((out / "index.json").read_text())

    def broken(change, match):
        (out / "index.json").write_text(json.dumps(change(dict(index))))
        with pytest.raises(ValueError, match=match):
            TokenFiles(out)
        (out / "index.json").write_text(json.dumps(index))

    broken(lambda i: {**i, "format": "other"}, "not a prepared directory's index")
    broken(lambda i: {**i, "version": 9}, "has version 9")
    broken(lambda i: {**i, "dtype": "int8"}, "is corrupt")
    broken(lambda i: {**i, "files": {"train": "../x", "val": "val.bin"}}, "is corrupt")
    broken(lambda i: {**i, "vocab_size": 9}, "says vocab_size 9, the tokenizer files hold 757")
    broken(lambda i: {**i, "tokens": {**i["tokens"], "train": 5}}, r"train.bin holds \d+ bytes")
    (out / "index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a prepared directory's index"):
        TokenFiles(out)
    (out / "index.json").write_text(json.dumps(index))
    with open(out / "val.bin", "ab") as f:
        f.write(b"\0")                                       # a file that does not match
    with pytest.raises(ValueError, match="val.bin holds .* bytes, but index.json says"):
        TokenFiles(out)
    (out / "val.bin").unlink()
    with pytest.raises(ValueError, match="val.bin is missing"):
        TokenFiles(out)


# ----- windows -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "corpus"
    prepare(CORPUS, out, tokenizer=GPT2_TINY, workers=1, progress=False)
    return TokenFiles(out)


def test_random_windows_equal_random_batches(corpus_files):
    train = corpus_files.train
    assert isinstance(train, np.memmap)
    stream = torch.from_numpy(np.asarray(train, dtype=np.int64))
    ours = random_windows(train, batch_size=8, context_length=32,
                          generator=torch.Generator().manual_seed(5))
    theirs = random_batches(stream, batch_size=8, context_length=32,
                            generator=torch.Generator().manual_seed(5))
    for _ in range(5):
        (x, y), (a, b) = next(ours), next(theirs)
        assert x.dtype == torch.int64 and x.shape == (8, 32)
        assert torch.equal(x, a) and torch.equal(y, b)


def test_ranks_together_equal_one_process_and_resume(corpus_files):
    train = corpus_files.train
    one = random_windows(train, batch_size=8, context_length=16,
                         generator=torch.Generator().manual_seed(1))
    ranks = [random_windows(train, batch_size=8, context_length=16, rank=r, world_size=4,
                            generator=torch.Generator().manual_seed(1)) for r in range(4)]
    for _ in range(3):
        x, y = next(one)
        parts = [next(r) for r in ranks]
        assert all(p[0].shape == (2, 16) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
    generator = torch.Generator().manual_seed(2)
    run = random_windows(train, batch_size=4, context_length=16, generator=generator)
    for _ in range(3):
        next(run)
    state = generator.get_state()                          # what a checkpoint saves
    expected = [next(run) for _ in range(2)]
    resumed = torch.Generator()
    resumed.set_state(state)
    again = random_windows(train, batch_size=4, context_length=16, generator=resumed)
    for x, y in expected:
        a, b = next(again)
        assert torch.equal(a, x) and torch.equal(b, y)


def test_val_windows_equal_window_batches(corpus_files):
    val = corpus_files.val
    stream = torch.from_numpy(np.asarray(val, dtype=np.int64))
    theirs = window_batches(stream, batch_size=4, context_length=16)
    ours = val_windows(val, batch_size=4, context_length=16)
    assert len(ours) == len(theirs) > 3
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(ours, theirs))
    first = val_windows(val, batch_size=4, context_length=16, max_batches=3)
    assert len(first) == 3
    assert all(torch.equal(a, c) for (a, _), (c, _) in zip(first, theirs))


def test_refusals_of_windows(corpus_files):
    train = corpus_files.train
    with pytest.raises(ValueError, match="batch_size 6 is not divisible by world_size 4"):
        next(random_windows(train, batch_size=6, context_length=8, world_size=4))
    with pytest.raises(ValueError, match="rank must be below world_size 2, got 2"):
        next(random_windows(train, batch_size=4, context_length=8, rank=2, world_size=2))
    with pytest.raises(ValueError, match="holds 3 tokens, too few for one window"):
        next(random_windows(train[:3], batch_size=4, context_length=8))
    with pytest.raises(ValueError, match="holds 0 tokens"):
        val_windows(np.zeros(0, np.uint16), batch_size=4, context_length=8)
    with pytest.raises(TypeError, match="tokens must be a numpy array"):
        next(random_windows([1, 2, 3], batch_size=4, context_length=1))
    with pytest.raises(ValueError, match="1-D array of integer ids"):
        val_windows(np.zeros((4, 4)), batch_size=4, context_length=1)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        val_windows(train, batch_size=2.0, context_length=8)
