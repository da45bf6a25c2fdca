"""Byte-pair encoding (minitransformer.bpe, chapter 12)."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.bpe import (
    GPT2_PATTERN,
    BPETokenizer,
    apply_merges,
    count_pairs,
    merge_pair,
    train_merges,
    train_merges_incremental,
)

CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"
A, B, C, D = b"abcd"
Z, Y, X = 256, 257, 258

# Any Unicode: emoji, combining marks, control characters, surrogate-free code points.
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=60)
# Few distinct characters, so pairs repeat and merges happen.
REPETITIVE = st.text(st.sampled_from("ab c\u00e9\u0301\U0001F600\n\x00"), max_size=80)
BOTH_PATTERNS = pytest.mark.parametrize("pattern", [None, GPT2_PATTERN], ids=["whole", "gpt2"])


@pytest.fixture(scope="module")
def corpus_start():
    return CORPUS.read_text(encoding="utf-8")[:6000]


# ----- the seed example: aaabdaaabac -> ZabdZabac -> ZYdZYac -> XdXac --------------------------

def test_seed_example_step_by_step():
    ids = list(b"aaabdaaabac")
    assert count_pairs(ids)[(A, A)] == 4  # overlaps count: "aaa" holds "aa" twice
    ids = merge_pair(ids, (A, A), Z)
    assert ids == [Z, A, B, D, Z, A, B, A, C]  # left to right: aaa -> Za
    counts = count_pairs(ids)
    assert counts[(Z, A)] == counts[(A, B)] == 2  # a tie ...
    ids = merge_pair(ids, (A, B), Y)  # ... that the smaller pair (97, 98) wins
    assert ids == [Z, Y, D, Z, Y, A, C]
    ids = merge_pair(ids, (Z, Y), X)
    assert ids == [X, D, X, A, C]


@pytest.mark.parametrize("train", [train_merges, train_merges_incremental])
def test_seed_example_merges(train):
    merges = train([list(b"aaabdaaabac")], 100)
    assert merges == [((A, A), Z), ((A, B), Y), ((Z, Y), X)]  # then no pair repeats: stop


def test_seed_example_tokenizer():
    tokenizer = BPETokenizer.train("aaabdaaabac", 1000)
    assert tokenizer.merges == (((A, A), Z), ((A, B), Y), ((Z, Y), X))
    assert len(tokenizer) == 259
    assert tokenizer.encode("aaabdaaabac") == [X, D, X, A, C]
    assert tokenizer.token_bytes(X) == b"aaab"
    assert tokenizer.decode([X, D]) == "aaabd"


def test_training_stops_when_no_pair_repeats():
    assert BPETokenizer.train("abcdef", 300).merges == ()
    assert BPETokenizer.train("", 300).merges == ()
    assert len(BPETokenizer.train("abab", 300)) == 257  # then (256, 256) occurs only once


def test_vocab_size_256_learns_nothing():
    tokenizer = BPETokenizer.train("aaaa", 256)
    assert tokenizer.merges == () and tokenizer.encode("aaaa") == list(b"aaaa")


def test_overlapping_runs():
    assert train_merges_incremental([list(b"aaaa")], 5) == [((A, A), Z)]  # then ZZ: once
    assert BPETokenizer.train("aaaaa", 300).encode("aaaaa") == [Z, Z, A]
    assert train_merges_incremental([list(b"aaaaaaaa")], 5) == [((A, A), Z), ((Z, Z), Y)]


# ----- the pattern ------------------------------------------------------------------------------

def test_pattern_keeps_merges_inside_pieces():
    text = "the cat the hat the"
    plain = BPETokenizer.train(text, 300)
    split = BPETokenizer.train(text, 300, pattern=GPT2_PATTERN)
    assert any(b" " in plain.token_bytes(i)[1:-1] for i in range(256, len(plain)))
    for i in range(256, len(split)):
        assert b" " not in split.token_bytes(i)[1:]  # a space only ever starts a piece
    assert split.decode(split.encode(text)) == text


def test_gpt2_pattern_splits_like_gpt2():
    import regex
    pieces = regex.findall(GPT2_PATTERN, "Hello world's 123 dots...  end")
    assert pieces == ["Hello", " world", "'s", " 123", " dots", "...", " ", " end"]


def test_text_the_pattern_does_not_match_is_kept():
    tokenizer = BPETokenizer.train("ab, ab; ab ab", 300, pattern=r"[a-z]+")
    text = "ab ... ab!"
    assert tokenizer.decode(tokenizer.encode(text)) == text


# ----- round trips, determinism, the two trainers agree -----------------------------------------

@pytest.fixture(scope="module")
def trained(corpus_start):
    return {None: BPETokenizer.train(corpus_start, 400),
            GPT2_PATTERN: BPETokenizer.train(corpus_start, 400, pattern=GPT2_PATTERN)}


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
@BOTH_PATTERNS
def test_round_trip_any_text(trained, pattern, text):
    tokenizer = trained[pattern]
    ids = tokenizer.encode(text)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


@settings(max_examples=60, deadline=None)
@given(text=REPETITIVE)
@BOTH_PATTERNS
def test_round_trip_after_training_on_the_text(pattern, text):
    tokenizer = BPETokenizer.train(text, 300, pattern=pattern)
    assert tokenizer.decode(tokenizer.encode(text)) == text


@settings(max_examples=80, deadline=None)
@given(pieces=st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=6),
       num_merges=st.integers(0, 12))
def test_incremental_equals_recount(pieces, num_merges):
    assert train_merges_incremental(pieces, num_merges) == train_merges(pieces, num_merges)


@BOTH_PATTERNS
def test_incremental_equals_recount_on_prose(corpus_start, pattern):
    import regex
    text = corpus_start[:1500]
    texts = regex.findall(pattern, text) if pattern else [text]
    pieces = [list(t.encode("utf-8")) for t in texts]
    assert train_merges_incremental(pieces, 60) == train_merges(pieces, 60)


@settings(max_examples=60, deadline=None)
@given(text=REPETITIVE)
def test_encoding_equals_applying_merges_in_order(text):
    tokenizer = BPETokenizer.train(text, 290)
    assert tokenizer.encode(text) == apply_merges(list(text.encode("utf-8")), tokenizer.merges)


@BOTH_PATTERNS
def test_encoding_the_training_text_equals_applying_merges(trained, corpus_start, pattern):
    import regex
    tokenizer = trained[pattern]
    texts = regex.findall(pattern, corpus_start) if pattern else [corpus_start]
    expected = [i for t in texts for i in apply_merges(list(t.encode("utf-8")), tokenizer.merges)]
    assert tokenizer.encode(corpus_start) == expected
    assert len(expected) < 0.6 * len(corpus_start.encode("utf-8"))  # it compresses


def test_training_is_deterministic(corpus_start, trained):
    again = BPETokenizer.train(corpus_start, 400)
    assert again.merges == trained[None].merges and again == trained[None]
    assert len(again) == 400
    assert [merge[1] for merge in again.merges] == list(range(256, 400))


def test_encoding_uses_the_cache_consistently(trained):
    tokenizer = trained[GPT2_PATTERN]
    text = "the tokenizer and the tokenizer"
    assert tokenizer.encode(text) == tokenizer.encode(text)
    first = tokenizer.encode(" the")
    assert tokenizer.encode(text)[-len(first):] != [] and " the" in tokenizer.decode(first)


# ----- save and load ----------------------------------------------------------------------------

@BOTH_PATTERNS
def test_save_and_load(tmp_path, trained, pattern):
    tokenizer = trained[pattern]
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    loaded = BPETokenizer.load(path)
    assert loaded == tokenizer
    assert loaded.merges == tokenizer.merges and loaded.pattern == tokenizer.pattern
    text = "Attention, with ünïcödé and 🙂."
    assert loaded.encode(text) == tokenizer.encode(text)
    assert BPETokenizer.load(str(path)) == tokenizer


def test_constructor_from_merge_table():
    tokenizer = BPETokenizer([((A, A), Z), ((A, B), Y), ((Z, Y), X)])
    assert tokenizer.encode("aaabdaaabac") == [X, D, X, A, C]
    assert repr(tokenizer) == "BPETokenizer(vocab_size=259, pattern=None)"


@pytest.mark.parametrize("content, message", [
    ("not json {", "not JSON"),
    ("[1, 2]", "not a BPE tokenizer file"),
    ('{"name": "gpt2"}', "not a BPE tokenizer file"),
    ('{"format": "minitransformer.bpe", "version": 99, "merges": []}', "version 99"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": {}}', "corrupt"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [[97, 97, 300]]}',
     "must create id 256"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [[97, 999, 256]]}',
     "not an earlier token"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [[97, "a", 256]]}', "corrupt"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [], "pattern": 3}', "pattern"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [], "pattern": "("}',
     "regular expression"),
])
def test_load_rejects_corrupt_or_foreign_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        BPETokenizer.load(path)


def test_load_rejects_binary_file(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="not JSON"):
        BPETokenizer.load(path)


def test_saved_file_is_readable_json(tmp_path):
    path = tmp_path / "t.json"
    BPETokenizer.train("aaabdaaabac", 300).save(path)
    data = json.loads(path.read_text())
    assert data["merges"] == [[97, 97, 256], [97, 98, 257], [256, 257, 258]]
    assert data["pattern"] is None


# ----- errors -----------------------------------------------------------------------------------

def test_vocab_size_below_256_is_a_value_error():
    with pytest.raises(ValueError, match="vocab_size must be at least 256, got 100"):
        BPETokenizer.train("hello", 100)


@pytest.mark.parametrize("call, message", [
    (lambda: BPETokenizer.train(b"bytes", 300), "text must be a str, got bytes"),
    (lambda: BPETokenizer.train("text", 300.0), "vocab_size must be an int"),
    (lambda: BPETokenizer.train("text", True), "vocab_size must be an int"),
    (lambda: BPETokenizer.train("text", 300, pattern=3), "pattern must be a str"),
    (lambda: BPETokenizer().encode(None), "text must be a str, got NoneType"),
    (lambda: BPETokenizer().decode("abc"), "ids must be a list of ints"),
    (lambda: BPETokenizer().decode([1, 2.0]), r"ids\[1\] must be an int"),
    (lambda: BPETokenizer().token_bytes("a"), "token_id must be an int"),
    (lambda: BPETokenizer().save(3), "path must be a str or path"),
    (lambda: BPETokenizer([(97, 97, 256)]), r"merges\[0\] must be \(\(first, second\), new_id\)"),
])
def test_wrong_types_are_type_errors(call, message):
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: BPETokenizer.train("text", 300, pattern="("), "not a valid regular expression"),
    (lambda: BPETokenizer().decode([65, 256]), r"ids\[1\] is 256, outside the vocabulary"),
    (lambda: BPETokenizer().decode([-1]), r"ids\[0\] must be at least 0"),
    (lambda: BPETokenizer().token_bytes(300), "outside the vocabulary"),
    (lambda: BPETokenizer([((97, 97), 256), ((97, 97), 257)]), "must not repeat a pair"),
])
def test_wrong_values_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_decoding_half_a_character_replaces_it():
    tokenizer = BPETokenizer()
    ids = tokenizer.encode("é")  # two bytes
    assert len(ids) == 2
    assert tokenizer.decode(ids[:1]) == "\ufffd"
    assert tokenizer.decode_bytes(ids[:1]) == "é".encode("utf-8")[:1]


# ----- the chapter's place in the book (issue 13) ------------------------------------------------

def test_chapter_12_is_listed_and_its_sources_are_in_the_bibliography():
    import re

    root = CORPUS.parent.parent.parent
    assert "book/12_tokenization_bpe" in (root / "_toc.yml").read_text(encoding="utf-8")
    intro = (root / "book" / "intro.md").read_text(encoding="utf-8")
    assert re.search(r"^12\. .*12_tokenization_bpe", intro, re.M)  # the map of chapters
    assert re.search(r"^\| 12 \| Tokenization with byte-pair encoding \|.*`bpe`",
                     (root / "README.md").read_text(encoding="utf-8"), re.M)
    bib = (root / "references.bib").read_text(encoding="utf-8")
    for key in ("gage1994new", "sennrich2016neural", "radford2019language"):
        assert re.search(r"@\w+\{" + key + ",", bib), key
    chapter = (root / "book" / "12_tokenization_bpe.ipynb").read_text(encoding="utf-8")
    cited = set(re.findall(r"\{cite\}`([^`]+)`", chapter))
    assert {"gage1994new", "sennrich2016neural", "radford2019language"} <= cited
    assert all(re.search(r"@\w+\{" + key + ",", bib) for key in cited), cited
