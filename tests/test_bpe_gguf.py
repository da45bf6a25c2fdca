"""SmolLM2-135M-Instruct's tokenizer read from its GGUF file (BPETokenizer.from_gguf), against
transformers and the tokenizers library.

References:

- ``theirs``: transformers' ``AutoTokenizer.from_pretrained(dir, gguf_file=name)``. Its GGUF
  loader does not know the pre-tokenizer name ``smollm`` and splits text as GPT-2 does.
- ``reference``: the same vocabulary and merges in the tokenizers library with the split that
  the model was trained with and llama.cpp applies for ``smollm``: ``Digits`` (each number
  character a piece) then GPT-2's ``ByteLevel``. Ours equals this one on every string; it
  equals ``theirs`` on every string but those where the two splits differ (whitespace before
  a number character, two number characters in a row), checked below.
"""

import os
import random
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import gguf
import pytest
import regex
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoTokenizer

from minitransformer.bpe import (
    GPT2_PATTERN,
    PRE_TOKENIZERS,
    SMOLLM_PATTERN,
    BPETokenizer,
    bytes_to_unicode,
)
from helpers import smollm2_transformers_tokenizer

GGUF_PATH = Path("~/.cache/minitransformer/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()
DATA = Path(__file__).resolve().parent / "data"
CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"
SOURCE = Path(__file__).resolve().parent.parent / "minitransformer"
MISSING = bytes([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)])
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
           "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
           "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
           "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
# Where GPT-2's split (transformers' GGUF loader) and SmolLM's differ.
NUMBER_SPLIT = regex.compile(r"\s\p{N}|\p{N}\p{N}")


def gguf_metadata(path: Path) -> dict:
    """The tokenizer's metadata as the gguf package reads it."""
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items()
            if key.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def metadata():
    return gguf_metadata(GGUF_PATH)


@pytest.fixture(scope="module")
def ours():
    return BPETokenizer.from_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def theirs():
    return smollm2_transformers_tokenizer()


@pytest.fixture(scope="module")
def reference(theirs):
    tokenizer = Tokenizer.from_str(theirs.backend_tokenizer.to_str())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tokenizer


def quiet_encode(tokenizer, text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tokenizer.encode(text)


# ----- 2,600 strings, seeded -------------------------------------------------------------------

SCRIPTS = ["Привет, как дела? Всё хорошо.", "Γειά σου κόσμε", "שלום עולם", "नमस्ते दुनिया",
           "สวัสดีชาวโลก", "안녕하세요 세계", "こんにちは、世界！カタカナ", "你好，世界。", "مرحبا بالعالم",
           "Ça va très bien, merci — à bientôt", "Größe, Übung, Straße", "ñandú, año", "Ελληνικά ΑΒΓ",
           "ქართული", "Հայերեն", "አማርኛ", "தமிழ்", "ខ្មែរ", "e\u0301\u0302", "Z\u0335\u0321a\u0336"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🏳️‍🌈", "❤️", "🤖", "🧑🏿‍💻", "✨", "🫠", "#️⃣", "©", "™"]
NUMBERS = ["0", "7", "12", "2024", "3.14159", "1,000,000", "-42", "1e-5", "0x1F", "٣٤٥", "१२३",
           "²", "½", "Ⅻ", "①", "１２３", "10:30", "v1.2.3", "50%", "$9.99", "#1"]
SPACES = [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000",
          "\u2009", "\t\t", "        ", "\n    ", "\v", "\f"]
WORDS = ["the", "The", "cat", "I'm", "don't", "we'll", "they've", "it's", "x", "def", "return",
         "self", "tokenizer", "Hello", "WORLD", "a", "_private", "CamelCase", "snake_case"]
PUNCT = [".", ",", "!", "?", "...", "()", "[]", "{}", "->", "=>", "==", "!=", "<=", "#", "//",
         "/*", "*/", "\"", "'", "`", "```", "\\", "@", "&&", "||", "<", ">", "<|", "|>", "<|im_",
         "im_end|>", "<|im_start", "<file", "sep>"]


def corpus_slices(rng, text, count, longest=200):
    return [text[i:i + rng.randint(1, longest)]
            for i in (rng.randrange(len(text)) for _ in range(count))]


def mixed(rng, count, parts, longest=12):
    return ["".join(rng.choice(rng.choice(parts)) for _ in range(rng.randint(1, longest)))
            for _ in range(count)]


def random_chars(rng, count):
    """Characters from assigned blocks: Latin, Greek, Cyrillic, CJK, Hangul, symbols, emoji."""
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0x2000, 0x206F), (0x2190, 0x22FF), (0x1F300, 0x1F64F)]
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 20)):
            low, high = rng.choice(blocks)
            chars.append(chr(rng.randint(low, high)))
        out.append("".join(chars))
    return out


def make_strings() -> dict[str, list[str]]:
    rng = random.Random(2026)
    english = CORPUS.read_text(encoding="utf-8")
    code = "\n".join(p.read_text(encoding="utf-8") for p in sorted(SOURCE.glob("*.py"))[:12])
    files = {p.stem: p.read_text(encoding="utf-8") for p in sorted(DATA.glob("*.txt"))}
    lines = [line for text in files.values() for line in text.splitlines()]
    specials = CONTROL + PUNCT
    return {
        "english": corpus_slices(rng, english, 400),
        "code": corpus_slices(rng, code, 400, longest=400),
        "data files": lines + [t for text in files.values() for t in corpus_slices(rng, text, 40)],
        "whitespace runs": mixed(rng, 300, [SPACES, SPACES, WORDS, NUMBERS, PUNCT]),
        "numbers": mixed(rng, 300, [NUMBERS, NUMBERS, SPACES, WORDS, PUNCT], longest=6),
        "other scripts": mixed(rng, 200, [SCRIPTS, SPACES, NUMBERS], longest=5),
        "emoji": mixed(rng, 200, [EMOJI, EMOJI, SPACES, WORDS], longest=8),
        "special tokens in text": mixed(rng, 300, [CONTROL, specials, WORDS, SPACES, NUMBERS]),
        "random characters": random_chars(rng, 300),
        "edge cases": ["", " ", "\n", "<|im_end|>", "<|im_end|><|im_end|>", "<|im_start|>user\n",
                       "a\x04b", "!\x04!", "\x13\x14", "\U00040000x", "\U000bffff", "\x00\x7f"],
    }


@pytest.fixture(scope="module")
def strings():
    return [s for group in make_strings().values() for s in group]


def test_the_strings_are_many_and_of_every_kind(strings):
    groups = make_strings()
    assert len(strings) >= 2600 and all(len(group) >= 10 for group in groups.values())
    assert sum(bool(NUMBER_SPLIT.search(s)) for s in strings) > 300


# ----- what the file holds ----------------------------------------------------------------------

def test_the_tokenizer_read_from_the_gguf_file(ours, metadata):
    assert len(ours) == 49152 == len(metadata["tokenizer.ggml.tokens"])
    assert ours.pattern == SMOLLM_PATTERN == PRE_TOKENIZERS["smollm"]
    assert ours.special_tokens == {name: i for i, name in enumerate(CONTROL)}
    assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token) \
        == ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert ours.missing_bytes == MISSING and len(MISSING) == 21
    assert ours.chat_template == metadata["tokenizer.chat_template"]
    assert len(ours.merges) == len(metadata["tokenizer.ggml.merges"]) == 48900
    tokens = metadata["tokenizer.ggml.tokens"]
    char = bytes_to_unicode()
    assert all("".join(char[b] for b in ours.token_bytes(i)) == tokens[i]
               for i in range(17, len(tokens)))


def test_from_gguf_is_from_gguf_metadata_of_the_gguf_packages_reading(ours, metadata):
    assert BPETokenizer.from_gguf_metadata(metadata) == ours


# ----- ids --------------------------------------------------------------------------------------

def test_ids_equal_smollm2s_own_split_on_every_string(ours, reference, strings):
    """The split the model was trained with: ids equal on all 2,600 strings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        differ = [s for s in strings if ours.encode(s) != reference.encode(s).ids]
    assert differ == []


def test_ids_equal_transformers_gguf_loader_but_where_it_splits_numbers_as_gpt2(
        ours, theirs, strings):
    """transformers ignores ``tokenizer.ggml.pre``; it agrees wherever the splits agree."""
    equal, differ = 0, []
    for s in strings:
        if quiet_encode(ours, s) == theirs(s)["input_ids"]:
            equal += 1
        else:
            differ.append(s)
    assert equal >= 2000
    assert all(NUMBER_SPLIT.search(s) for s in differ), [s for s in differ
                                                         if not NUMBER_SPLIT.search(s)][:5]
    # the difference, shown: two spaces then a digit
    assert ours.encode("x  1") == [104, 256, 33]   # x, "  ", 1 (llama.cpp and the model's)
    assert theirs("x  1")["input_ids"] == [104, 216, 216, 33]


def llama_cpp_split(text: str) -> list[str]:
    """llama.cpp's "smollm" split, its two expressions applied one after the other; text that
    an expression does not match stays a piece of its own."""
    def split(pieces, expression):
        out = []
        for piece in pieces:
            end = 0
            for match in regex.finditer(expression, piece):
                if match.start() > end:
                    out.append(piece[end:match.start()])
                out.append(match.group())
                end = match.end()
            if end < len(piece):
                out.append(piece[end:])
        return out
    return split(split([text], r"\p{N}"),
                 r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")


def test_smollm_pattern_is_llama_cpps_two_step_split(strings):
    """One expression for llama.cpp's two: the same pieces on every string."""
    one = regex.compile(SMOLLM_PATTERN)
    for s in strings:
        assert one.findall(s) == llama_cpp_split(s), s


def test_decode_of_encode_gives_the_text_back_less_the_missing_bytes(ours, theirs, strings):
    """The bytes dropped are gone: a control character disappears; a character whose first
    byte is dropped (U+40000 to U+BFFFF start with 0xf1 or 0xf2) leaves three bytes that
    decode to U+FFFD each."""
    lost = regex.compile("[\x04\x06\x13\x14\x16\x1d]")
    cut = regex.compile("[\U00040000-\U000bffff]")
    for s in strings:
        ids = quiet_encode(ours, s)
        assert ours.decode(ids) == cut.sub("\ufffd" * 3, lost.sub("", s)) == theirs.decode(ids)


def test_a_missing_byte_is_dropped_with_a_warning_naming_it(ours, theirs):
    with pytest.warns(UserWarning, match="no token for the byte.* 0x04.*drops them"):
        ids = ours.encode("a\x04b")
    assert ids == theirs("a\x04b")["input_ids"] == ours.encode("a") + ours.encode("b")
    with pytest.warns(UserWarning, match="0xf1"):   # U+40000 is f1 80 80 80 in UTF-8
        assert ours.encode("\U00040000") == theirs("\U00040000")["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.encode("plain text, nothing missing")


def test_special_tokens_in_text_and_split_special_tokens(ours, theirs):
    text = "<|im_start|>user\nhi<|im_end|><file_sep><|im_end"
    assert ours.encode(text) == theirs(text)["input_ids"]
    assert ours.encode(text)[:1] == [1]
    assert not set(ours.encode(text, split_special_tokens=True)) & set(range(17))


def test_encode_iterable_equals_encode(ours):
    text = "".join(make_strings()["code"]) * 3
    lines = text.splitlines(keepends=True)
    assert list(ours.encode_iterable(lines)) == ours.encode(text)


def test_encode_with_offsets(ours, strings):
    for s in strings[::7]:
        ids, offsets = quiet_encode_offsets(ours, s)
        assert ids == quiet_encode(ours, s) and len(offsets) == len(ids)
        for i, (start, end) in zip(ids, offsets):
            assert 0 <= start < end <= len(s)
            assert ours.token_bytes(i) in s[start:end].encode("utf-8")


def quiet_encode_offsets(tokenizer, text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tokenizer.encode_with_offsets(text)


# ----- files ------------------------------------------------------------------------------------

def test_save_pretrained_loads_in_autotokenizer_with_equal_ids(ours, strings, tmp_path):
    ours.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(ours)
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) \
        == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert loaded.chat_template == ours.chat_template
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        differ = [s for s in strings if ours.encode(s) != loaded(s)["input_ids"]]
    assert differ == []
    again = BPETokenizer.from_pretrained(tmp_path)
    assert again == ours and again.missing_bytes == MISSING


def test_save_and_load_keep_roles_template_and_missing_bytes(ours, tmp_path):
    ours.save(tmp_path / "smollm2.json")
    loaded = BPETokenizer.load(tmp_path / "smollm2.json")
    assert loaded == ours
    assert (loaded.eos_token, loaded.chat_template, loaded.missing_bytes) \
        == (ours.eos_token, ours.chat_template, MISSING)
    assert loaded.encode("x  1 <|im_end|>") == ours.encode("x  1 <|im_end|>")


# ----- refusals ---------------------------------------------------------------------------------

def small_metadata(**changes):
    tokens = ["<|endoftext|>", *"".join(map(chr, range(33, 127)))]   # ! .. ~ (no space byte)
    data = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
            "tokenizer.ggml.tokens": [*tokens, "ab"],
            "tokenizer.ggml.token_type": [3] + [1] * len(tokens),
            "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 0}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_a_small_vocabulary_without_most_bytes_loads():
    tokenizer = BPETokenizer.from_gguf_metadata(small_metadata())
    assert len(tokenizer) == 96 and len(tokenizer.missing_bytes) == 256 - 94
    assert tokenizer.eos_token == "<|endoftext|>"
    with pytest.warns(UserWarning, match="0x20"):
        assert tokenizer.decode(tokenizer.encode("ab ab<|endoftext|>")) == "abab<|endoftext|>"


@pytest.mark.parametrize("changes, message", [
    ({"tokenizer.ggml.pre": "qwen2"},
     r"tokenizer.ggml.pre is 'qwen2', a pre-tokenizer this code does not know .*'smollm'"),
    ({"tokenizer.ggml.pre": None}, "has no tokenizer.ggml.pre"),
    ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model is 'llama'.*'gpt2'"),
    ({"tokenizer.ggml.tokens": None}, "has no tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.token_type": [3]}, "token_type has 1 entries for 96 tokens"),
    ({"tokenizer.ggml.merges": ["a  b"]}, r"merges\[0\] is not two tokens"),
    ({"tokenizer.ggml.merges": ["a c"]}, "'ac' is not in"),
    ({"tokenizer.ggml.eos_token_id": 96}, "eos_token_id is 96, outside the 96 tokens"),
    ({"tokenizer.ggml.eos_token_id": "0"}, "eos_token_id must be a token id"),
    ({"tokenizer.ggml.token_type": [1] * 96}, "'<|endoftext|>' .*neither control"),
    ({"tokenizer.chat_template": 5}, "chat_template must be a Jinja template"),
])
def test_bad_metadata_is_a_value_error_naming_the_key(changes, message):
    with pytest.raises(ValueError, match=message):
        BPETokenizer.from_gguf_metadata(small_metadata(**changes), source="x.gguf")


def test_not_a_dict_and_not_a_file():
    with pytest.raises(TypeError, match="metadata must be a dict"):
        BPETokenizer.from_gguf_metadata([("tokenizer.ggml.model", "gpt2")])
    with pytest.raises(FileNotFoundError):
        BPETokenizer.from_gguf(GGUF_PATH.parent / "no-such-file.gguf")


def test_known_patterns():
    assert PRE_TOKENIZERS["gpt2"] == GPT2_PATTERN
    assert regex.findall(SMOLLM_PATTERN, "ab  12 x³") == ["ab", "  ", "1", "2", " x", "³"]


def test_transformers_own_save_of_the_gguf_tokenizer_reads_back(ours, theirs, strings,
                                                                tmp_path):
    """transformers 5 writes tokenizer.json (GPT-2's split, as its GGUF loader splits) and the
    template as chat_template.jinja: from_pretrained reads both, and equals it everywhere."""
    theirs.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file()
    loaded = BPETokenizer.from_pretrained(tmp_path)
    assert loaded.pattern == GPT2_PATTERN and loaded.chat_template == ours.chat_template
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token, loaded.missing_bytes) \
        == (ours.bos_token, ours.eos_token, ours.pad_token, MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        differ = [s for s in strings if loaded.encode(s) != theirs(s)["input_ids"]]
    assert differ == []
