"""GPT-2's tokenizer files: BPETokenizer.from_pretrained and save_pretrained (chapter 13).

transformers is the reference. No GPT-2 vocabulary can be downloaded here, so the files are built
with the tokenizers library:

- trained on the book's corpus at test time, numbered as tokenizers numbers them (the special
  tokens first, then the 256 bytes, then the merges);
- the committed fixture ``tests/data/gpt2_tiny`` (500 merges learned from the corpus, laid out as
  GPT-2's own files are: the bytes at ids 0..255 in GPT-2's order, so ``!`` is 0 and a space
  220, merge k at 256 + k, ``<|endoftext|>`` last, a ``#version`` line, ASCII-escaped JSON).
  ``python tests/test_bpe_pretrained.py`` writes it again.
"""

import json
import os
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, GPT2TokenizerFast

from minitransformer.bpe import GPT2_PATTERN, BPETokenizer, bytes_to_unicode

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "book" / "data" / "corpus.txt"
FIXTURE = Path(__file__).resolve().parent / "data" / "gpt2_tiny"
EOT = "<|endoftext|>"

HARD = [
    "", " ", "  ", "Hello world", "Hello  world ", "   leading and trailing   ",
    "I'm sure they'll say we've done what you'd do, isn't it? 'S 'LL 's",
    "a\r\nb\r\n\r\nc\n\n\n", "\t\tindented\n    code = 1\n", "tabs\tand\u000bvertical\u000cfeed",
    "0123456789 12.5e-3 1,000,000 ½ ¾ ٣٤ Ⅻ ①", "x2 2x 3.14159",
    "😀👍🏽👨‍👩‍👧 🇫🇷🇯🇵 ❤️‍🔥", "日本語のテキスト、中文。한국어", "ẞ ß İstanbul ǅ",
    "e\u0301 a\u0300\u0301 n\u0303o", "\u0301\u0302 leading marks", "क्षत्रिय مرحبا שלום",
    "\u00a0no-break\u3000ideographic\u2028line\u2029para\x85next", "zero\u200bwidth\ufeffbom",
    "\x00\x01\x1f\x7f", "\U0010ffff\U000e0001", "<|endoftext|>",
    "a <|endoftext|>b<|endoftext|><|endoftext|> <|endoftext", "<|endoftext|>\n\n<|endoftext|>",
    "<pad> and <|pad|>",
]
# Characters both regex engines know: tokenizers' Oniguruma tables are older than the regex
# module's, and characters unassigned in this Python's unicodedata may split differently.
ASSIGNED = st.characters(exclude_categories=["Cs", "Cn"])
PIECES = st.sampled_from([EOT, "<pad>", "<|", "|>", " ", "  ", "\n", "\r\n", "\t", "'s", "'S",
                          "don't", "we'll", "1", "23", "456", "é", "e\u0301", "😀", "日本",
                          "a", "Hello", " world", "\u00a0", "."])
TEXT = st.text(ASSIGNED, max_size=40) | st.lists(PIECES | st.text(ASSIGNED, max_size=3),
                                                 max_size=12).map("".join)


def gpt2_layout(vocab: dict[str, int], merge_lines: list[str]) -> dict[str, int]:
    """The same tokens numbered as GPT-2 numbers them: bytes by character, merges, specials."""
    chars = sorted(bytes_to_unicode().values())
    made = ["".join(line.split(" ")) for line in merge_lines]
    specials = sorted((name for name in vocab if name not in {*chars, *made}), key=vocab.get)
    return {name: i for i, name in enumerate(chars + made + specials)}


def train_files(directory: Path, vocab_size: int, special_tokens: list[str],
                text: str | None = None) -> Path:
    """vocab.json and merges.txt of a byte-level BPE that tokenizers learns from ``text``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([CORPUS.read_text(encoding="utf-8") if text is None
                                   else text], trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.model.save(str(directory))
    return directory


def write_fixture(directory: Path = FIXTURE) -> None:
    train_files(directory, 256 + 500 + 1, [EOT])
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
    merge_lines = [line for line in lines[1:] if line]
    (directory / "vocab.json").write_text(json.dumps(gpt2_layout(vocab, merge_lines)) + "\n",
                                          encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merge_lines) + "\n",
                                          encoding="utf-8")


def transformers_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


@pytest.fixture(scope="module")
def fixture_pair():
    """Ours and transformers' GPT-2 tokenizer, both read from the committed fixture."""
    return BPETokenizer.from_pretrained(FIXTURE), GPT2TokenizerFast.from_pretrained(FIXTURE)


@pytest.fixture(scope="module")
def trained_pair(tmp_path_factory):
    """Ours and transformers', read from files tokenizers trained (special tokens first)."""
    directory = train_files(tmp_path_factory.mktemp("theirs"), 1200, [EOT, "<pad>"])
    # <pad> is a special token because the config says so (an undeclared one is refused)
    (directory / "tokenizer_config.json").write_text('{"pad_token": "<pad>"}\n')
    theirs = GPT2TokenizerFast.from_pretrained(directory)
    assert theirs.pad_token == "<pad>"
    return BPETokenizer.from_pretrained(directory), theirs, directory


@pytest.fixture(scope="module", params=[[], [EOT], [EOT, "<pad>"]],
                ids=["no-specials", "endoftext", "two-specials"])
def saved_pair(request, tmp_path_factory):
    """Ours, trained here, and what transformers' AutoTokenizer reads from its saved files."""
    ours = BPETokenizer.train(CORPUS.read_text(encoding="utf-8")[:60_000], 900,
                              pattern=GPT2_PATTERN, special_tokens=request.param)
    directory = tmp_path_factory.mktemp("ours")
    ours.save_pretrained(directory)
    return ours, AutoTokenizer.from_pretrained(directory), directory


# ----- the byte-to-unicode table ----------------------------------------------------------------

def test_bytes_to_unicode_is_gpt2s_table():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("!")] == "!" and table[ord("~")] == "~" and table[0xE9] == "é"
    assert table[0] == "\u0100" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert table[0xAD] == "Ń"  # the soft hyphen, the one byte between ¬ and ®, is moved too
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    # GPT-2's vocab.json numbers the 256 byte tokens in the order of these characters
    fixture = json.loads((FIXTURE / "vocab.json").read_text(encoding="utf-8"))
    assert fixture["!"] == 0 and fixture["Ġ"] == 220 and fixture[EOT] == len(fixture) - 1


# ----- their files -> ours: the same ids as GPT2TokenizerFast -----------------------------------

def test_fixture_reads_as_gpt2_numbers_it(fixture_pair):
    ours, theirs = fixture_pair
    assert len(ours) == len(theirs) == 757
    assert ours.pattern == GPT2_PATTERN and ours.special_tokens == {EOT: 756}
    assert ours.encode("!") == [0] and ours.encode(" ") == [220]
    assert ours.token_bytes(220) == b" " and ours.token_bytes(256) == b"".join(
        ours.token_bytes(i) for i in ours.encode(ours.token_bytes(256).decode()))
    assert ours.file_ids[ord("!")] == 0 and ours.file_ids[256] == 256  # merges keep their ids
    assert ours.merges[0][1] == 256 and all(a < 256 for a in ours.merges[0][0])


@pytest.mark.parametrize("text", HARD)
def test_their_files_give_transformers_ids_on_hard_strings(fixture_pair, trained_pair, text):
    for ours, theirs in (fixture_pair, trained_pair[:2]):
        ids = ours.encode(text)
        assert ids == transformers_ids(theirs, text)
        assert ours.decode(ids) == theirs.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_their_files_give_transformers_ids_on_any_text(fixture_pair, trained_pair, text):
    for ours, theirs in (fixture_pair, trained_pair[:2]):
        assert ours.encode(text) == transformers_ids(theirs, text)


def test_their_files_give_transformers_ids_on_the_corpus(trained_pair):
    ours, theirs, _ = trained_pair
    text = CORPUS.read_text(encoding="utf-8")
    assert ours.encode(text) == transformers_ids(theirs, text)
    assert ours.special_tokens == {EOT: 0, "<pad>": 1}  # tokenizers puts them first
    assert len(ours) == len(theirs) == 1200


def test_special_tokens_text_can_be_encoded_as_text(fixture_pair):
    ours, theirs = fixture_pair
    text = f"one{EOT}two"
    ids = ours.encode(text)
    assert ids == transformers_ids(theirs, text) and ours.special_tokens[EOT] in ids
    plain = ours.encode(text, split_special_tokens=True)
    assert ours.special_tokens[EOT] not in plain and ours.decode(plain) == text
    assert plain == theirs(text, split_special_tokens=True)["input_ids"]


# ----- ours -> transformers' AutoTokenizer ------------------------------------------------------

def test_saved_files_load_in_autotokenizer_with_the_same_vocabulary(saved_pair):
    ours, theirs, directory = saved_pair
    assert len(theirs) == len(ours)
    assert set(theirs.all_special_tokens) == ({EOT} & set(ours.special_tokens))
    assert theirs.eos_token_id == ours.special_tokens.get(EOT)
    assert {name: theirs.convert_tokens_to_ids(name) for name in ours.special_tokens} \
        == ours.special_tokens
    assert sorted(os.listdir(directory)) == ["merges.txt", "tokenizer.json",
                                             "tokenizer_config.json", "vocab.json"]
    assert BPETokenizer.from_pretrained(directory) == ours


@pytest.mark.parametrize("text", HARD)
def test_saved_files_give_our_ids_in_autotokenizer_on_hard_strings(saved_pair, text):
    ours, theirs, _ = saved_pair
    ids = ours.encode(text)
    assert transformers_ids(theirs, text) == ids
    assert theirs.decode(ids) == ours.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_saved_files_give_our_ids_in_autotokenizer_on_any_text(saved_pair, text):
    ours, theirs, _ = saved_pair
    assert transformers_ids(theirs, text) == ours.encode(text)


def test_files_read_and_written_again_keep_their_ids(trained_pair, tmp_path):
    ours, theirs, directory = trained_pair
    ours.save_pretrained(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8") \
        == (directory / "merges.txt").read_text(encoding="utf-8")
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = CORPUS.read_text(encoding="utf-8")[:20_000] + f" {EOT} <pad>"
    assert transformers_ids(again, text) == transformers_ids(theirs, text) == ours.encode(text)
    assert BPETokenizer.from_pretrained(tmp_path) == ours


def test_our_json_keeps_the_file_ids(fixture_pair, tmp_path):
    ours, _ = fixture_pair
    ours.save(tmp_path / "tokenizer.json")
    loaded = BPETokenizer.load(tmp_path / "tokenizer.json")
    assert loaded == ours and loaded.file_ids == ours.file_ids
    assert loaded.encode("Hello <|endoftext|>") == ours.encode("Hello <|endoftext|>")


# ----- what cannot be written as GPT-2's files --------------------------------------------------

@pytest.mark.parametrize("pattern, shown", [(None, "pattern=None"), (r"\w+|\W", r"'\\w+|\\W'")])
def test_only_gpt2s_pattern_can_be_saved(tmp_path, pattern, shown):
    tokenizer = BPETokenizer.train("the cat the hat", 260, pattern=pattern)
    with pytest.raises(ValueError, match=f"pattern=GPT2_PATTERN.*{shown}"):
        tokenizer.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_two_tokens_with_one_name_cannot_be_saved(tmp_path):
    a = ord("a")
    twice = BPETokenizer([((a, a), 256), ((256, a), 257), ((a, 256), 258)], pattern=GPT2_PATTERN)
    with pytest.raises(ValueError, match="tokens 257 and 258 would both be named 'aaa'"):
        twice.save_pretrained(tmp_path)
    clash = BPETokenizer(pattern=GPT2_PATTERN, special_tokens=["Ġ"])
    with pytest.raises(ValueError, match="tokens 32 and 256 would both be named 'Ġ'"):
        clash.save_pretrained(tmp_path)


# ----- files that are not GPT-2's ---------------------------------------------------------------

def fixture_copy(tmp_path: Path) -> Path:
    directory = tmp_path / "tok"
    shutil.copytree(FIXTURE, directory)
    return directory


def edit_vocab(directory: Path, edit) -> None:
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    edit(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")


def edit_merges(directory: Path, edit) -> None:
    lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
    edit(lines)
    (directory / "merges.txt").write_text("\n".join(lines), encoding="utf-8")


def test_missing_files_are_file_not_found_errors_with_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere' names no directory") as error:
        BPETokenizer.from_pretrained(tmp_path / "nowhere")
    assert error.value.filename == str(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no vocab.json in .*empty") as error:
        BPETokenizer.from_pretrained(tmp_path / "empty")
    assert error.value.filename == str(tmp_path / "empty" / "vocab.json")
    directory = fixture_copy(tmp_path)
    (directory / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="no merges.txt") as error:
        BPETokenizer.from_pretrained(directory)
    assert error.value.filename == str(directory / "merges.txt")
    with pytest.raises(TypeError, match="path must be a str or path"):
        BPETokenizer.from_pretrained(3)


@pytest.mark.parametrize("path", ["", " "])
def test_an_empty_path_is_refused_not_read_as_the_current_directory(tmp_path, monkeypatch,
                                                                   fixture_pair, path):
    monkeypatch.chdir(fixture_copy(tmp_path))
    with pytest.raises(ValueError, match="path is empty"):
        BPETokenizer.from_pretrained(path)


@pytest.mark.parametrize("broken, file, message", [
    (lambda d: (d / "vocab.json").write_text("{not json"), "vocab.json", "not JSON"),
    (lambda d: (d / "vocab.json").write_bytes(b"\xff\xfe{}"), "vocab.json", "not JSON"),
    (lambda d: (d / "vocab.json").write_text("[1, 2]"), "vocab.json", "not a JSON object"),
    (lambda d: (d / "vocab.json").write_text('{"a": 0, "a": 1}'), "vocab.json",
     "'a' appears twice"),
    (lambda d: edit_vocab(d, lambda v: v.update({"": v.pop(EOT)})), "vocab.json",
     "a token has an empty name"),
    (lambda d: (d / "vocab.json").write_text('{"a": 1' + "0" * 5000 + "}"), "vocab.json",
     "not JSON"),
    (lambda d: edit_vocab(d, lambda v: v.update({"!": True})), "vocab.json",
     "id of '!' must be an int"),
    (lambda d: edit_vocab(d, lambda v: v.update({"!": 1})), "vocab.json", "each once"),
    (lambda d: edit_vocab(d, lambda v: v.update({EOT: 9999})), "vocab.json", "each once"),
    (lambda d: edit_vocab(d, lambda v: v.update({"<new>": v.pop("\u0100")})), "vocab.json",
     "'<new>' .*neither a byte nor made by the merges"),   # a missing byte alone is fine
    (lambda d: edit_merges(d, lambda m: m.insert(3, "Ġ t h")), "merges.txt",
     "line 4 is not two tokens"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, "Ġt")), "merges.txt",
     "line 4 is not two tokens"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, "")), "merges.txt",
     "line 4 is not two tokens"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, "Ġ  t")), "merges.txt",
     "line 4 is not two tokens"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, "Ġ zzzz")), "merges.txt",
     "line 4 .*'zzzz' is not in .*vocab.json"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, "q z")), "merges.txt",
     "line 4 .*'qz' is not in .*vocab.json"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, m[1])), "merges.txt",
     "line 4 .*already made by an earlier line"),
    (lambda d: edit_merges(d, lambda m: m.insert(1, m.pop(-2))), "merges.txt",
     "line 2 .*made by no earlier line"),
    (lambda d: edit_merges(d, lambda m: m.insert(3, f"{EOT} {EOT}")), "merges.txt",
     "is not in"),
    (lambda d: (d / "merges.txt").write_bytes(b"#version: 0.2\n\xff \xfe\n"), "merges.txt",
     "not UTF-8"),
])
def test_broken_files_are_value_errors_naming_the_file(tmp_path, broken, file, message):
    directory = fixture_copy(tmp_path)
    broken(directory)
    with pytest.raises(ValueError, match=message) as error:
        BPETokenizer.from_pretrained(directory)
    assert str(directory / file) in str(error.value)


def test_merges_file_without_header_or_with_crlf_reads_the_same(tmp_path, fixture_pair):
    ours, _ = fixture_pair
    directory = fixture_copy(tmp_path)
    edit_merges(directory, lambda lines: lines.pop(0))
    assert BPETokenizer.from_pretrained(directory) == ours
    text = (FIXTURE / "merges.txt").read_text(encoding="utf-8")
    (directory / "merges.txt").write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    assert BPETokenizer.from_pretrained(directory) == ours


@settings(max_examples=150, deadline=None)
@given(vocab=st.one_of(st.dictionaries(st.text(max_size=3), st.integers(-2, 760) | st.none()),
                       st.lists(st.integers())),
       merges=st.lists(st.text(st.sampled_from("ab Ġ#\r\n!"), max_size=6), max_size=6))
def test_any_broken_directory_is_a_clear_error(tmp_path_factory, vocab, merges):
    directory = tmp_path_factory.mktemp("fuzz")
    base = json.loads((FIXTURE / "vocab.json").read_text(encoding="utf-8"))
    if isinstance(vocab, dict):
        vocab = {**base, **vocab}
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text("\n".join(merges), encoding="utf-8")
    try:
        BPETokenizer.from_pretrained(directory)
    except ValueError as error:
        assert str(directory) in str(error)


# ----- tokenizer.json: the one file transformers 5 writes ---------------------------------------

def only_tokenizer_json(directory: Path) -> Path:
    """What transformers 5's save_pretrained leaves: tokenizer.json and tokenizer_config.json."""
    for name in ("vocab.json", "merges.txt"):
        (directory / name).unlink(missing_ok=True)
    assert sorted(os.listdir(directory)) == ["tokenizer.json", "tokenizer_config.json"]
    return directory


@pytest.fixture(scope="module")
def resaved_pairs(saved_pair, fixture_pair, tmp_path_factory):
    """Ours read from directories transformers saved (ours' files, and GPT-2's layout): each
    holds tokenizer.json and no vocab.json."""
    pairs = []
    for theirs in (saved_pair[1], fixture_pair[1]):
        directory = tmp_path_factory.mktemp("resaved")
        theirs.save_pretrained(directory)
        only_tokenizer_json(directory)
        pairs.append((BPETokenizer.from_pretrained(directory),
                      AutoTokenizer.from_pretrained(directory)))
    return pairs


@pytest.mark.parametrize("text", HARD)
def test_tokenizer_json_saved_by_transformers_gives_its_ids(resaved_pairs, text):
    for ours, theirs in resaved_pairs:
        assert ours.encode(text) == transformers_ids(theirs, text)
        assert ours.decode(ours.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(text=TEXT)
def test_tokenizer_json_saved_by_transformers_gives_its_ids_on_any_text(resaved_pairs, text):
    for ours, theirs in resaved_pairs:
        assert ours.encode(text) == transformers_ids(theirs, text)


def test_tokenizer_json_reads_as_the_files_it_came_from(saved_pair, fixture_pair, resaved_pairs):
    (from_ours, _), (from_fixture, _) = resaved_pairs
    assert from_ours == saved_pair[0]
    assert from_fixture == fixture_pair[0] and from_fixture.special_tokens == {EOT: 756}
    text = CORPUS.read_text(encoding="utf-8")[:30_000]
    assert from_fixture.encode(text) == transformers_ids(resaved_pairs[1][1], text)


def test_tokenizer_json_written_by_the_tokenizers_library(tmp_path):
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.train_from_iterator([CORPUS.read_text(encoding="utf-8")[:40_000]], trainers.BpeTrainer(
        vocab_size=700, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    trained.save(str(tmp_path / "tokenizer.json"))
    ours = BPETokenizer.from_pretrained(tmp_path)
    for text in HARD[:-4]:            # the library's own encode knows no special tokens
        assert ours.encode(text) == trained.encode(text).ids


def test_our_tokenizer_json_alone_loads_in_autotokenizer(saved_pair, tmp_path):
    ours = saved_pair[0]
    ours.save_pretrained(tmp_path)
    theirs = AutoTokenizer.from_pretrained(only_tokenizer_json(tmp_path))
    assert len(theirs) == len(ours)
    for text in HARD:
        assert transformers_ids(theirs, text) == ours.encode(text)
    assert BPETokenizer.from_pretrained(tmp_path) == ours


def test_tokenizer_json_is_preferred_to_vocab_json(fixture_pair, tmp_path):
    """transformers reads tokenizer.json first; so do we."""
    ours = fixture_pair[0]
    directory = fixture_copy(tmp_path)
    ours.save_pretrained(tmp_path / "saved")
    shutil.copy(tmp_path / "saved" / "tokenizer.json", directory)
    edit_merges(directory, lambda lines: lines.insert(1, "not a merge line at all"))
    assert BPETokenizer.from_pretrained(directory) == ours


def edit_tokenizer_json(directory: Path, edit) -> None:
    data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    edit(data)
    (directory / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")


def _bos_template(data):
    data["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": EOT, "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [], "special_tokens": {}}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(normalizer={"type": "NFC"}), "has a normalizer .'NFC'."),
    (lambda d: d["pre_tokenizer"].update(add_prefix_space=True), "pre_tokenizer is 'ByteLevel'"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer is 'Whitespace'"),
    (_bos_template, "post_processor .'TemplateProcessing'. adds tokens"),
    (lambda d: d["model"].update(type="WordPiece"), "model type is 'WordPiece'"),
    (lambda d: d["model"].update(end_of_word_suffix="</w>"), "end_of_word_suffix is '</w>'"),
    (lambda d: d["model"].update(ignore_merges=True), "ignore_merges is True"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "has lstrip set"),
    (lambda d: d["added_tokens"][0].update(id=3), "has id 3, but 756 in model.vocab"),
    (lambda d: d["model"].update(merges=[["a"]]), r"model.merges\[0\] is not two tokens"),
    (lambda d: d["model"].update(merges=d["model"]["merges"][1:]), "'Ġt' is not in|made by no"),
    (lambda d: d["model"].pop("vocab"), "model.vocab is not an object"),
    (lambda d: d.clear(), "no \"model\" object"),
])
def test_tokenizer_json_our_bpe_cannot_express_is_refused(fixture_pair, tmp_path, edit,
                                                          message):
    fixture_pair[0].save_pretrained(tmp_path)
    edit_tokenizer_json(tmp_path, edit)
    with pytest.raises(ValueError, match=message) as error:
        BPETokenizer.from_pretrained(tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(error.value)
    assert "\n" not in str(error.value)


def test_our_own_json_named_tokenizer_json_is_pointed_to_load(fixture_pair, tmp_path):
    fixture_pair[0].save(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="this package's own tokenizer file.*BPETokenizer.load"):
        BPETokenizer.from_pretrained(tmp_path)


# ----- tokens the merges cannot make ------------------------------------------------------------

def test_a_token_no_merge_makes_and_no_file_declares_is_refused(tmp_path):
    """transformers never produces such a token and encodes its text as ordinary text; reading
    it as a special token would give other ids than transformers' (it did, silently)."""
    directory = fixture_copy(tmp_path)
    edit_vocab(directory, lambda vocab: vocab.update({"<pad>": len(vocab)}))
    theirs = GPT2TokenizerFast.from_pretrained(directory)
    assert theirs.convert_tokens_to_ids("<pad>") not in transformers_ids(theirs, "a <pad>")
    with pytest.raises(ValueError, match="'<pad>' .id 757. is neither a byte nor made by the "
                                         "merges .*declares it a special token") as error:
        BPETokenizer.from_pretrained(directory)
    assert str(directory / "vocab.json") in str(error.value)
    # declared, it is a special token, for both
    (directory / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<pad>"}))
    ours, theirs = (BPETokenizer.from_pretrained(directory),
                    GPT2TokenizerFast.from_pretrained(directory))
    assert ours.special_tokens == {EOT: 756, "<pad>": 757}
    assert ours.encode("a <pad>") == transformers_ids(theirs, "a <pad>")


def test_end_of_text_is_special_only_while_the_config_leaves_it_so(tmp_path):
    directory = fixture_copy(tmp_path)
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": None, "unk_token": None}))
    with pytest.raises(ValueError, match="'<\\|endoftext\\|>' .id 756. is neither"):
        BPETokenizer.from_pretrained(directory)


def test_undeclared_token_in_tokenizer_json_is_refused(fixture_pair, tmp_path):
    fixture_pair[0].save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": None, "unk_token": None}))
    edit_tokenizer_json(tmp_path, lambda d: d.update(added_tokens=[]))
    with pytest.raises(ValueError, match="'<\\|endoftext\\|>' .id 756.") as error:
        BPETokenizer.from_pretrained(only_tokenizer_json_kept(tmp_path))
    assert str(tmp_path / "tokenizer.json") in str(error.value)


def only_tokenizer_json_kept(directory: Path) -> Path:
    for name in ("vocab.json", "merges.txt"):
        (directory / name).unlink()
    return directory


def test_tokenizer_config_nested_too_deep_is_a_value_error(tmp_path):
    directory = fixture_copy(tmp_path)
    (directory / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="tokenizer_config.json is not a tokenizer_config"):
        BPETokenizer.from_pretrained(directory)

if __name__ == "__main__":
    write_fixture()
    print(f"wrote {FIXTURE}")
