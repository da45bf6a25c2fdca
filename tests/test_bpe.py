"""Byte-pair encoding (minitransformer.bpe, chapter 12)."""

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
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
    assert len(BPETokenizer.train("abab", 300)) == 257  # then (256, 256) occurs only once


@pytest.mark.parametrize("text, pattern, why", [
    ("hello world", r"x*", "the pattern split the text into pieces of one byte each"),
    ("ab ab", r".", "the pattern split the text into pieces of one byte each"),
    ("", None, "the text is empty"),
    ("", GPT2_PATTERN, "the text is empty"),
    ("a", None, "the text is a single byte"),
])
def test_training_with_no_pair_to_merge_is_a_value_error(text, pattern, why):
    with pytest.raises(ValueError, match=f"no pair to merge: {why}, so none of the 4 merges"):
        BPETokenizer.train(text, 260, pattern=pattern)
    assert BPETokenizer.train(text, 256, pattern=pattern).merges == ()  # none asked for


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


def has_a_pair(text, pattern):
    import regex
    pieces = regex.findall(pattern, text) if pattern else [text]
    return any(len(piece.encode("utf-8")) > 1 for piece in pieces)


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
    assume(has_a_pair(text, pattern))
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
    assume(has_a_pair(text, None))
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
    ('{"format": "minitransformer.bpe", "version": true, "merges": []}', "version True"),
    ('{"format": "minitransformer.bpe", "version": 1.0, "merges": []}', "version 1.0"),
    ('{"format": "minitransformer.bpe", "version": 1, "merges": [], "file_ids": null}',
     "version 1 has no special tokens"),
    ('{"format": "minitransformer.bpe", "version": 2, "merges": [], "special_tokens": "<s>"}',
     "special_tokens must be a list"),
    ('{"format": "minitransformer.bpe", "version": 2, "merges": [], "file_ids": [0, 1]}',
     "one id per token, 256, got 2"),
    ("[" * 100_000, "not JSON"),
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
    (lambda: BPETokenizer([({97, 98}, 256)]), r"merges\[0\] must be \(\(first, second\)"),
    (lambda: BPETokenizer(special_tokens="<s>"), "special_tokens must be a list of str"),
    (lambda: BPETokenizer(special_tokens=[b"<s>"]), r"special_tokens\[0\] must be a str"),
    (lambda: BPETokenizer(file_ids=range(256)), "file_ids must be a list of ints"),
    (lambda: BPETokenizer(file_ids=[0.0] * 256), r"file_ids\[0\] must be an int"),
    (lambda: BPETokenizer().encode("a", split_special_tokens=1), "must be a bool"),
    (lambda: BPETokenizer().save_pretrained(None), "path must be a str or path"),
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
    (lambda: BPETokenizer(special_tokens=[""]), r"special_tokens\[0\] is empty"),
    (lambda: BPETokenizer(special_tokens=["<s>", "<s>"]), "must not repeat a token"),
    (lambda: BPETokenizer.train("abab", 257, special_tokens=["<s>", "</s>"]),
     "vocab_size must be at least 258, got 257"),
    (lambda: BPETokenizer(file_ids=[0] * 256), r"each id of \[0, 256\) once"),
    (lambda: BPETokenizer(file_ids=[*range(1, 256), 256]), r"each id of \[0, 256\) once"),
])
def test_wrong_values_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


@settings(max_examples=40, deadline=None)
@given(value=JSON | st.binary(max_size=4) | st.tuples(JSON, JSON))
def test_any_wrong_input_is_a_type_or_value_error(tmp_path_factory, value):
    """No public method fails with an IndexError, KeyError, AttributeError, StopIteration, ...:
    a wrong argument is a TypeError or a ValueError (or a missing file's FileNotFoundError)."""
    tokenizer = BPETokenizer.train("aaabdaaabac", 300, pattern=GPT2_PATTERN,
                                   special_tokens=["<s>"])
    directory = tmp_path_factory.mktemp("junk")

    def load(data):
        path = directory / "t.json"
        path.write_text(json.dumps(data))
        return BPETokenizer.load(path)

    def as_json(x):
        return x if not isinstance(x, (bytes, tuple)) else repr(x)

    file = {"format": "minitransformer.bpe", "version": 2, "merges": []}
    calls = [
        lambda x: BPETokenizer(x), lambda x: BPETokenizer(pattern=x),
        lambda x: BPETokenizer(special_tokens=x), lambda x: BPETokenizer(file_ids=x),
        lambda x: BPETokenizer.train(x, 300), lambda x: BPETokenizer.train("ab ab", x),
        lambda x: BPETokenizer.train("ab ab", 300, pattern=x),
        lambda x: BPETokenizer.train("ab ab", 300, special_tokens=x),
        tokenizer.encode, tokenizer.decode, tokenizer.decode_bytes, tokenizer.token_bytes,
        lambda x: tokenizer.encode("a <s>", split_special_tokens=x),
        lambda x: BPETokenizer.from_pretrained(directory / "none" if isinstance(x, str) else x),
        lambda x: tokenizer.save_pretrained(directory / "out" if isinstance(x, str) else x),
        lambda x: load({**file, "merges": as_json(x)}),
        lambda x: load({**file, "version": as_json(x)}),
        lambda x: load({**file, "special_tokens": as_json(x), "file_ids": as_json(x)}),
        lambda x: load(as_json(x)),
    ]
    for call in calls:
        try:
            call(value)
        except (TypeError, ValueError, FileNotFoundError):
            pass


# ----- special tokens ---------------------------------------------------------------------------

def test_special_tokens_come_after_the_merges():
    tokenizer = BPETokenizer.train("aaabdaaabac", 300, special_tokens=["<|endoftext|>", "<s>"])
    assert len(tokenizer.merges) == 3 and len(tokenizer) == 261  # training stopped early
    assert tokenizer.special_tokens == {"<|endoftext|>": 259, "<s>": 260}
    assert BPETokenizer.train("ab" * 50, 260, special_tokens=["<s>"]).special_tokens \
        == {"<s>": 259}  # vocab_size counts the special tokens
    assert tokenizer.token_bytes(259) == b"<|endoftext|>" and tokenizer.decode([260]) == "<s>"
    assert repr(tokenizer) == ("BPETokenizer(vocab_size=261, pattern=None, "
                               "special_tokens=['<|endoftext|>', '<s>'])")


@BOTH_PATTERNS
def test_special_tokens_text_is_their_id_unless_split(pattern):
    tokenizer = BPETokenizer.train("aaab<s>aaab<s>aaab", 300, pattern=pattern,
                                   special_tokens=["<s>", "<s><s>"])
    assert all(b"<" not in tokenizer.token_bytes(i) for i in range(256, 256 + 3))  # not learned
    s, ss = tokenizer.special_tokens["<s>"], tokenizer.special_tokens["<s><s>"]
    assert tokenizer.encode("<s><s><s>") == [ss, s]  # the longest first, left to right
    assert tokenizer.encode("aaab<s>") == tokenizer.encode("aaab") + [s]
    plain = tokenizer.encode("aaab<s>", split_special_tokens=True)
    assert s not in plain and tokenizer.decode(plain) == "aaab<s>"


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.sampled_from(["<s>", "<", "s>", "a", " ", "é", "<s><s>"])).map("".join))
def test_round_trip_with_special_tokens(trained, text):
    tokenizer = BPETokenizer(trained[GPT2_PATTERN].merges, pattern=GPT2_PATTERN,
                             special_tokens=["<s>", "<s><s>"])
    for split in (False, True):
        assert tokenizer.decode(tokenizer.encode(text, split_special_tokens=split)) == text


def test_save_and_load_with_special_tokens_and_file_ids(tmp_path, trained):
    plain = trained[GPT2_PATTERN]
    ids = [*range(len(plain) + 1)]
    ids[0], ids[-1] = ids[-1], ids[0]  # the special token takes id 0
    tokenizer = BPETokenizer(plain.merges, pattern=GPT2_PATTERN, special_tokens=["<s>"],
                             file_ids=ids)
    assert tokenizer.special_tokens == {"<s>": 0} and tokenizer.encode("\x00") == [400]
    assert tokenizer.token_bytes(0) == b"<s>" and tokenizer.decode([400, 0]) == "\x00<s>"
    tokenizer.save(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["version"] == 2
    assert BPETokenizer.load(tmp_path / "t.json") == tokenizer
    plain.save(tmp_path / "plain.json")  # without either, the file stays version 1
    assert json.loads((tmp_path / "plain.json").read_text())["version"] == 1
    identity = BPETokenizer(plain.merges, pattern=GPT2_PATTERN, file_ids=list(range(400)))
    assert identity.file_ids is None and identity == plain  # the identity is no table
    assert tokenizer != BPETokenizer(plain.merges, pattern=GPT2_PATTERN, special_tokens=["<s>"])


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
