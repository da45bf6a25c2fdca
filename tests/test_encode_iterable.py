"""BPETokenizer.encode_iterable: a stream of text in, the ids of the whole text out (issue 31).

The ids must equal ``encode`` of the joined text however the iterable cuts it, even through a
special token or a pre-token. The stream is cut into chunks of ``_STREAM_CHUNK`` characters;
the tests make that tiny so that every position is a candidate cut.
"""

import io
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minitransformer import bpe
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer

CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"
DATA = Path(__file__).resolve().parent / "data"
EOT = "<|endoftext|>"
# special tokens that share prefixes, so a longer one can start where a shorter one matched
SPECIALS = [EOT, "<|end", "<pad>", "<|", "x y"]

PIECES = st.sampled_from([EOT, "<|end", "<|endof", "<pad>", "<|", "|>", "x y", "x", " y", " ",
                          "  ", "\n", "\r\n", "\t", "'s", "'l", "l", "'ll", "don't", "1", "23",
                          "é", "e\u0301", "😀", "日本", "中文。", "مرحبا", "Hello", " world",
                          "\u00a0", ".", "\u3000", "\x85"])
TEXT = st.lists(PIECES | st.text(max_size=3), max_size=25).map("".join)


@pytest.fixture(scope="module", params=[GPT2_PATTERN, None], ids=["gpt2-pattern", "no-pattern"])
def tokenizer(request):
    text = CORPUS.read_text(encoding="utf-8")[:30_000] + (
        DATA / "multilingual.txt").read_bytes().decode("utf-8")
    return BPETokenizer.train(text, 600, pattern=request.param, special_tokens=SPECIALS)


@pytest.fixture(params=[1, 2, 7, 1 << 16], ids=lambda n: f"chunk{n}")
def chunk(request, monkeypatch):
    monkeypatch.setattr(bpe, "_STREAM_CHUNK", request.param)
    return request.param


def cuts(text: str, points: list[int]) -> list[str]:
    points = sorted({p % (len(text) + 1) for p in points})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, points=st.lists(st.integers(0, 10_000), max_size=8))
def test_stream_equals_whole_text(tokenizer, chunk, text, points):
    lines = cuts(text, points)
    assert "".join(lines) == text
    assert list(tokenizer.encode_iterable(lines)) == tokenizer.encode(text)


@pytest.mark.parametrize("name", ["multilingual.txt", "german.txt", "chinese.txt",
                                  "arabic.txt", "emoji.txt"])
def test_open_file_equals_whole_text(tokenizer, chunk, name):
    path = DATA / name
    text = path.read_bytes().decode("utf-8")
    with open(path, encoding="utf-8", newline="") as f:      # newline="": keep \r\n
        ids = list(tokenizer.encode_iterable(f))
    assert ids == tokenizer.encode(text)
    assert tokenizer.decode_bytes(ids) == path.read_bytes()


def test_every_split_of_a_hard_text(tokenizer, monkeypatch):
    """Every single cut, and every character on its own, of a text full of traps."""
    monkeypatch.setattr(bpe, "_STREAM_CHUNK", 1)
    text = ("a <|endoftext|>b<|end of <|endo<|endoftext|><|<pad>x y  x  y\n\n  it'll 'll"
            " don'\n't 12 345 \r\n\t 日本語。 مرحبا\u00a0 😀👍🏽 <|")
    whole = tokenizer.encode(text)
    for p in range(len(text) + 1):
        assert list(tokenizer.encode_iterable([text[:p], text[p:]])) == whole, p
    assert list(tokenizer.encode_iterable(text)) == whole         # one character at a time
    assert list(tokenizer.encode_iterable(iter(list(text)))) == whole


def test_ids_come_before_the_end_of_the_stream(tokenizer):
    """An endless stream still gives ids: memory is bounded by a stretch, not by the text."""
    if tokenizer.pattern is None:
        lines = itertools.cycle(["plain text with no special token ", f"{EOT}\n"])
    else:
        lines = itertools.repeat("the printer ran dry please\n")
    first = list(itertools.islice(tokenizer.encode_iterable(lines), 50_000))
    assert len(first) == 50_000


def test_held_text_is_bounded_by_a_line(tokenizer, monkeypatch):
    """The text held back never grows past a chunk and a line."""
    if tokenizer.pattern is None:
        pytest.skip("without a pattern only special tokens allow a cut")
    held = []
    original = bpe.stream_cut

    def spy(text, tok):
        held.append(len(text))
        return original(text, tok)

    monkeypatch.setattr(bpe, "stream_cut", spy)
    lines = ["一行中文没有空格" * 50 + "。\n", "a line of text\n"] * 2000
    assert list(tokenizer.encode_iterable(lines)) == tokenizer.encode("".join(lines))
    assert held and max(held) <= bpe._STREAM_CHUNK + 2 * max(map(len, lines))


def test_empty_and_refusals(tokenizer):
    assert list(tokenizer.encode_iterable([])) == []
    assert list(tokenizer.encode_iterable(["", ""])) == []
    with pytest.raises(TypeError, match="lines must be an iterable of str"):
        tokenizer.encode_iterable(b"bytes")
    with pytest.raises(TypeError, match="lines must be an iterable of str"):
        tokenizer.encode_iterable(3)
    with pytest.raises(TypeError, match=r"lines\[1\] must be a str, got bytes"):
        list(tokenizer.encode_iterable(["ok", b"not ok"]))
    with pytest.raises(TypeError, match=r"lines\[0\] must be a str"):
        list(tokenizer.encode_iterable(io.BytesIO(b"binary mode\n")))
