"""The chat format (chapter 16): our ids and assistant masks against transformers'
``apply_chat_template`` reading the Jinja template that ``write_chat_template`` saves."""

import json
import os
import random
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
from jinja2 import TemplateError
from transformers import AutoTokenizer

from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import (
    CHAT_TOKENS,
    END_OF_TURN,
    PAD,
    ROLE_TOKENS,
    apply_chat_template,
    chat_tokenizer_config,
    encode_chat,
    jinja_chat_template,
    write_chat_template,
)

CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"
SPECIALS = ["<|endoftext|>", *CHAT_TOKENS]

# Content pieces: Unicode, whitespace, and text that looks like a marker but is not one.
PIECES = ["", " ", "  ", "\n", "\r\n", "\t", "Hello", " world", "the cat", "I'm", "we'll",
          "12.5", "é", "e\u0301", "😀", "👨‍👩‍👧", "日本語", "مرحبا", "\u00a0", "\u200b", ".", "?",
          "<|", "|>", "<|user", "user|>", "<|USER|>", "< |end| >", "<|end |>", "<|assistant",
          "<|endoftext", "|end|", "<s>", "[INST]", "{{ x }}", "{% if %}", "'", '"', "\\"]


def random_conversations(count, seed=0):
    rng = random.Random(seed)
    conversations = []
    for _ in range(count):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": random_text(rng)})
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": random_text(rng)})
            if turn or rng.random() < 0.8:
                messages.append({"role": "assistant", "content": random_text(rng)})
        if rng.random() < 0.2:
            messages.append({"role": "system", "content": random_text(rng)})
        conversations.append(messages)
    return conversations


def random_text(rng):
    """Pieces joined, drawn again while they happen to spell a special token ("<|" "end|>")."""
    while True:
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 6)))
        if not any(token in text for token in SPECIALS):
            return text


@pytest.fixture(scope="module")
def tok():
    text = CORPUS.read_text(encoding="utf-8")[:20_000]
    return BPETokenizer.train(text, 400, pattern=GPT2_PATTERN, special_tokens=SPECIALS)


@pytest.fixture(scope="module")
def saved(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("chat_tokenizer")
    tok.save_pretrained(path)
    write_chat_template(path, tok)
    return path


@pytest.fixture(scope="module")
def hf(saved):
    return AutoTokenizer.from_pretrained(saved)


def transformers_ids_and_mask(hf, messages, add_generation_prompt=False):
    out = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True,
                                 add_generation_prompt=add_generation_prompt)
    return out["input_ids"], out["assistant_masks"]


def test_layout_of_a_conversation(tok):
    s = tok.special_tokens
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}]
    ids, mask = encode_chat(tok, messages)
    system, user, hello = (tok.encode(m["content"]) for m in messages)
    assert ids == ([s["<|system|>"], *system, s[END_OF_TURN], s["<|user|>"], *user,
                    s[END_OF_TURN], s["<|assistant|>"], *hello, s[END_OF_TURN]])
    # the assistant's content and its end-of-turn token, not its marker
    assert mask == [False] * (len(system) + len(user) + 5) + [True] * (len(hello) + 1)
    assert mask[-1] is True and ids[-1] == s[END_OF_TURN]
    assert apply_chat_template(tok, messages) == ids
    prompt = apply_chat_template(tok, messages[:2], add_generation_prompt=True)
    assert prompt == ids[:len(prompt)] and prompt[-1] == s["<|assistant|>"]
    assert tok.decode(ids) == ("<|system|>Be brief.<|end|><|user|>Hi<|end|>"
                               "<|assistant|>Hello.<|end|>")


def test_empty_content_is_the_marker_and_the_end(tok):
    s = tok.special_tokens
    ids, mask = encode_chat(tok, [{"role": "user", "content": ""},
                                  {"role": "assistant", "content": ""}])
    assert ids == [s["<|user|>"], s[END_OF_TURN], s["<|assistant|>"], s[END_OF_TURN]]
    assert mask == [False, False, False, True]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_ids_and_masks_equal_transformers(tok, hf, add_generation_prompt):
    conversations = random_conversations(150, seed=int(add_generation_prompt))
    assert any(m["content"] == "" for c in conversations for m in c)
    assert any(c[0]["role"] == "system" for c in conversations)
    assert any(c[0]["role"] != "system" for c in conversations)
    for messages in conversations:
        ids, mask = encode_chat(tok, messages, add_generation_prompt=add_generation_prompt)
        their_ids, their_mask = transformers_ids_and_mask(hf, messages, add_generation_prompt)
        assert ids == their_ids, messages
        assert [int(bit) for bit in mask] == their_mask, messages
        text = hf.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=add_generation_prompt)
        assert tok.decode(ids) == text


def test_marker_lookalikes_are_ordinary_text(tok, hf):
    for content in ["<|USER|>", "< |end| >", "<|end", "|>", "<|assistant", "<|endoftext"]:
        messages = [{"role": "user", "content": content},
                    {"role": "assistant", "content": content}]
        ids, mask = encode_chat(tok, messages)
        assert not set(ids[1:-1]) - set(tok.encode(content)) - set(tok.special_tokens.values())
        assert ids.count(tok.special_tokens[END_OF_TURN]) == 2
        assert (ids, [int(b) for b in mask]) == transformers_ids_and_mask(hf, messages)


@pytest.mark.parametrize("token", SPECIALS)
@pytest.mark.parametrize("role", list(ROLE_TOKENS))
def test_content_with_a_special_token_is_refused_by_both(tok, hf, token, role):
    """Encoded as the token, a user could write the assistant's turn; we and the Jinja
    template refuse it, naming the message."""
    messages = [{"role": "user", "content": "hi"},
                {"role": role, "content": f"a {token} b"}]
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\] contains the special "
                                         r"token '" + token.replace("|", r"\|") + "'"):
        encode_chat(tok, messages)
    with pytest.raises(TemplateError, match="message 1 contains the special token "
                                            + token.replace("|", r"\|")):
        transformers_ids_and_mask(hf, messages)


@pytest.mark.parametrize("messages, error, match", [
    ([], ValueError, "messages is empty"),
    ((), ValueError, "messages is empty"),
    ("hello", TypeError, "messages must be a list"),
    ({"role": "user", "content": "hi"}, TypeError, "messages must be a list"),
    (None, TypeError, "messages must be a list"),
    (["hi"], TypeError, r"messages\[0\] must be a dict"),
    ([{"content": "hi"}], ValueError, r"messages\[0\] has no 'role'"),
    ([{"role": "user"}], ValueError, r"messages\[0\] has no 'content'"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], ValueError,
     r"messages\[1\] has role 'tool'; the roles are \['system', 'user', 'assistant'\]"),
    ([{"role": "User", "content": "a"}], ValueError, r"messages\[0\] has role 'User'"),
    ([{"role": None, "content": "a"}], ValueError, r"messages\[0\] has role None"),
    ([{"role": "user", "content": 3}], TypeError, r"messages\[0\]\['content'\] must be a str"),
    ([{"role": "user", "content": None}], TypeError, r"messages\[0\]\['content'\] must be"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}]}], TypeError,
     r"messages\[0\]\['content'\] must be a str, got list"),
    ([{"role": "user", "content": "a", "name": "x"}], ValueError,
     r"messages\[0\] has keys \['name'\]"),
])
def test_bad_messages_are_refused_by_name(tok, messages, error, match):
    with pytest.raises(error, match=match):
        encode_chat(tok, messages)
    with pytest.raises(error, match=match):
        apply_chat_template(tok, messages, add_generation_prompt=True)


@pytest.mark.parametrize("messages, match", [
    ([{"role": "tool", "content": "b"}], "unknown role: tool"),
    ([{"role": "user", "content": 3}], "the content of message 0 is not a string"),
    ([], "empty"),  # transformers' own ValueError comes before the template's
])
def test_the_jinja_template_refuses_too(hf, messages, match):
    with pytest.raises((TemplateError, ValueError), match=match):
        hf.apply_chat_template(messages, tokenize=False)


def test_a_tokenizer_without_the_chat_tokens_is_refused(tok):
    messages = [{"role": "user", "content": "hi"}]
    plain = BPETokenizer(tok.merges, pattern=GPT2_PATTERN, special_tokens=["<|endoftext|>"])
    with pytest.raises(ValueError, match=r"no chat format: it lacks the special tokens "
                                         r"\['<\|system\|>'.*'<\|pad\|>'\]"):
        encode_chat(plain, messages)
    partial = BPETokenizer(tok.merges, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS[:-1])
    with pytest.raises(ValueError, match=r"lacks the special tokens \['<\|pad\|>'\]"):
        apply_chat_template(partial, messages)
    with pytest.raises(TypeError, match="tokenizer must be a BPETokenizer, got str"):
        encode_chat("gpt2", messages)
    with pytest.raises(TypeError, match="add_generation_prompt must be a bool"):
        encode_chat(tok, messages, add_generation_prompt=1)


def test_the_ids_are_the_models_ids_after_from_pretrained(tok, saved):
    """A tokenizer read back from the saved files (file ids) gives the same ids."""
    again = BPETokenizer.from_pretrained(saved)
    for messages in random_conversations(20, seed=5):
        assert encode_chat(again, messages) == encode_chat(tok, messages)


def test_saved_config_declares_the_chat_format(tok, saved, hf):
    config = json.loads((saved / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == jinja_chat_template(SPECIALS)
    assert "{% generation %}" in config["chat_template"]
    assert hf.eos_token == END_OF_TURN and hf.eos_token_id == tok.special_tokens[END_OF_TURN]
    assert hf.pad_token == PAD and hf.pad_token_id == tok.special_tokens[PAD]
    assert hf.pad_token_id != hf.eos_token_id
    assert {t: hf.convert_tokens_to_ids(t) for t in SPECIALS} == tok.special_tokens
    assert len(hf) == len(tok)


def test_trl_sees_the_end_of_turn_in_the_mask(hf):
    from trl.chat_template_utils import (has_generation_markers,
                                         is_chat_template_stop_token_trained)

    assert has_generation_markers(hf.chat_template)
    assert is_chat_template_stop_token_trained(hf)


def test_write_chat_template_refusals(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer_config.json"):
        write_chat_template(tmp_path, tok)
    plain = BPETokenizer(tok.merges, pattern=GPT2_PATTERN)
    plain.save_pretrained(tmp_path)
    before = (tmp_path / "tokenizer_config.json").read_bytes()
    with pytest.raises(ValueError, match="no chat format"):
        write_chat_template(tmp_path, plain)
    assert (tmp_path / "tokenizer_config.json").read_bytes() == before
    with pytest.raises(TypeError, match="path must be a str or path"):
        write_chat_template(3, tok)


def test_write_chat_template_is_save_pretrained_plus_the_chat_entries(tok, saved, tmp_path):
    """save_pretrained writes chat_tokenizer_config's entries, as write_chat_template does."""
    tok.save_pretrained(tmp_path)
    plain = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    written = json.loads((saved / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert written == {**plain, **chat_tokenizer_config(tok.special_tokens)}
    write_chat_template(saved, tok)  # a second time changes nothing
    assert json.loads((saved / "tokenizer_config.json").read_text(encoding="utf-8")) == written
    assert sorted(p.name for p in saved.iterdir()) == [
        "merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]


def test_write_chat_template_refuses_another_tokenizers_directory(tok, tmp_path):
    other = BPETokenizer(tok.merges[:-3], pattern=GPT2_PATTERN, special_tokens=SPECIALS)
    other.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gives id 394 to '<\\|assistant\\|>', this tokenizer "
                                         "to '<\\|endoftext\\|>': the directory holds another"):
        write_chat_template(tmp_path, tok)
    for text, match in [("[1, 2]", "is not a JSON object"), ("{", "is not JSON"),
                        ('{"added_tokens_decoder": 3}', "added_tokens_decoder is not")]:
        (tmp_path / "tokenizer_config.json").write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=match):
            write_chat_template(tmp_path, tok)
        assert (tmp_path / "tokenizer_config.json").read_text(encoding="utf-8") == text
