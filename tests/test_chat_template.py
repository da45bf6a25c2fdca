"""A model's own chat template (SmolLM2's ChatML, read from its GGUF file): our ids and assistant
masks against transformers' ``apply_chat_template``.

transformers' GGUF loader splits numbers as GPT-2 does, not as SmolLM2 was trained
(tests/test_bpe_gguf.py), so the reference for every conversation is transformers with the
model's own split (``Digits`` then ``ByteLevel``); the unchanged loader agrees on every
conversation whose text has no number after a space or next to another number.
"""

import copy
import os
import random
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import regex
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import (
    CHAT_TOKENS,
    END_OF_TURN,
    apply_chat_template,
    encode_chat,
    end_of_turn_id,
    jinja_chat_template,
    render_chat_template,
    stop_token_ids,
)
from helpers import smollm2_transformers_tokenizer

GGUF_PATH = Path("~/.cache/minitransformer/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()
CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"
NUMBER_SPLIT = regex.compile(r"\s\p{N}|\p{N}\p{N}")
ENGLISH = CORPUS.read_text(encoding="utf-8")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
            "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
            "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
            "<jupyter_output>", "<jupyter_script>", "<empty_output>", *CHAT_TOKENS]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# SmolLM2's template with the assistant's content and <|im_end|> marked for the mask.
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

PIECES = ["", " ", "  ", "\n", "\n\n", "\t", "Hello", " world", "the cat", "I'm", "we'll",
          "12.5", " 42", "2026", "é", "e\u0301", "😀", "👨‍👩‍👧", "日本語", "مرحبا", "Привет",
          "\u00a0", ".", "?", "<|", "|>", "<|im_", "im_end|>", "<|IM_END|>", "system", "user",
          "assistant", "{{ x }}", "{% if %}", "'", '"', "\\", "def f(x):\n    return x"]


def random_text(rng):
    """Pieces and a slice of English, drawn again while they spell a special token."""
    while True:
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 6)))
        if rng.random() < 0.3:
            start = rng.randrange(len(ENGLISH) - 300)
            text += ENGLISH[start:start + rng.randint(1, 300)]
        if not any(token in text for token in SPECIALS):
            return text


def random_conversations(count, seed=16):
    """Half with a system message; 1-4 user turns, most answered."""
    rng = random.Random(seed)
    conversations = []
    for _ in range(count):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": random_text(rng)})
        for turn in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": random_text(rng)})
            if turn or rng.random() < 0.7:
                messages.append({"role": "assistant", "content": random_text(rng)})
        conversations.append(messages)
    return conversations


CONVERSATIONS = random_conversations(300)


@pytest.fixture(scope="module")
def ours():
    return BPETokenizer.from_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def theirs():
    return smollm2_transformers_tokenizer()


@pytest.fixture(scope="module")
def reference(theirs):
    """transformers, with the split SmolLM2 was trained with."""
    tokenizer = copy.deepcopy(theirs)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tokenizer


def their_ids(tokenizer, messages, add_generation_prompt, **kwargs):
    return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                         add_generation_prompt=add_generation_prompt,
                                         **kwargs)


def test_the_conversations_have_and_lack_a_system_message():
    with_system = sum(m[0]["role"] == "system" for m in CONVERSATIONS)
    assert 100 < with_system < 200 and len(CONVERSATIONS) == 300


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_ids_equal_transformers_apply_chat_template(ours, reference, theirs,
                                                    add_generation_prompt):
    agree = 0
    for messages in CONVERSATIONS:
        ids = apply_chat_template(ours, messages, add_generation_prompt=add_generation_prompt)
        assert ids == their_ids(reference, messages, add_generation_prompt)["input_ids"]
        text = render_chat_template(ours.chat_template, messages,
                                    add_generation_prompt=add_generation_prompt)[0]
        assert text == theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        if not NUMBER_SPLIT.search(text):
            agree += 1
            assert ids == their_ids(theirs, messages, add_generation_prompt)["input_ids"]
    assert agree >= 50   # 61 of the 300


def test_the_default_system_prompt_and_the_generation_prompt(ours):
    ids = apply_chat_template(ours, [{"role": "user", "content": "Hi"}],
                              add_generation_prompt=True)
    text = ours.decode(ids)
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
                    f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = apply_chat_template(ours, [{"role": "system", "content": "Be terse."},
                                     {"role": "user", "content": "Hi"}])
    assert ours.decode(ids) == ("<|im_start|>system\nBe terse.<|im_end|>\n"
                                "<|im_start|>user\nHi<|im_end|>\n")


def test_the_assistant_mask_of_a_generation_tag_equals_transformers(ours, reference):
    tokenizer = BPETokenizer.from_gguf_metadata(
        {**gguf_metadata_of(ours), "tokenizer.chat_template": GENERATION_TEMPLATE})
    for messages in CONVERSATIONS:
        ids, mask = encode_chat(tokenizer, messages)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = their_ids(reference, messages, False, chat_template=GENERATION_TEMPLATE,
                            return_assistant_tokens_mask=True)
        assert ids == out["input_ids"]
        assert [int(m) for m in mask] == out["assistant_masks"]
    ids, mask = encode_chat(tokenizer, [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello."}])
    assert tokenizer.decode([i for i, m in zip(ids, mask) if m]) == "Hello.<|im_end|>"


def gguf_metadata_of(tokenizer):
    """SmolLM2's GGUF tokenizer metadata, read once (through the package's reader)."""
    from minitransformer.gguf import GGUFFile
    return {k: v for k, v in GGUFFile(GGUF_PATH).metadata.items() if k.startswith("tokenizer.")}


def test_a_template_without_generation_gives_ids_but_no_mask(ours):
    messages = [{"role": "user", "content": "Hi"}]
    other = copy.copy(ours)     # a template this package has no marked twin for
    other._chat_template = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"
    with pytest.raises(ValueError, match=r"no \{% generation %\} block.*apply_chat_template"):
        encode_chat(other, messages)
    assert apply_chat_template(other, messages)
    # SmolLM2's own gets its marked twin (tests/test_sft_smollm2_trl.py): the same ids
    assert encode_chat(ours, messages)[0] == apply_chat_template(ours, messages)


def test_stop_tokens(ours):
    assert end_of_turn_id(ours) == 2 == ours.special_tokens["<|im_end|>"]
    assert stop_token_ids(ours) == [2, 0, 1, *range(3, 17)]


def test_content_holding_a_special_token_is_refused(ours):
    for content in ["<|im_end|>", "a<|im_start|>system", "<file_sep>"]:
        with pytest.raises(ValueError, match="contains the special token"):
            apply_chat_template(ours, [{"role": "user", "content": content}])


def test_bad_messages_are_refused_as_in_the_course_format(ours):
    with pytest.raises(ValueError, match="messages is empty"):
        apply_chat_template(ours, [])
    with pytest.raises(ValueError, match="role 'tool'"):
        apply_chat_template(ours, [{"role": "tool", "content": "x"}])
    with pytest.raises(TypeError, match="content'\\] must be a str"):
        apply_chat_template(ours, [{"role": "user", "content": 5}])
    with pytest.raises(TypeError, match="add_generation_prompt must be a bool"):
        apply_chat_template(ours, [{"role": "user", "content": "x"}], add_generation_prompt=1)


def with_template(tokenizer, template):
    return BPETokenizer(tokenizer.merges, pattern=tokenizer.pattern,
                        special_tokens=list(tokenizer.special_tokens),
                        file_ids=tokenizer.file_ids, eos_token=tokenizer.eos_token,
                        chat_template=template)


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('no tools here') }}", "refused the conversation: no tools here"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused the conversation"),
    ("{% for m in messages %}{{ m.content.upper() }}{% endfor %}{{ messages.append(1) }}",
     "refused the conversation"),
    ("{{ undefined_function() }}", "refused the conversation"),
    ("{% if %}", "not valid Jinja"),
])
def test_a_failing_or_unsafe_template_is_a_value_error(ours, template, message):
    tokenizer = with_template(ours, template)
    with pytest.raises(ValueError, match=message):
        apply_chat_template(tokenizer, [{"role": "user", "content": "x"}])


def test_the_environment_has_transformers_helpers(ours):
    template = ("{{ messages | tojson }}|{{ strftime_now('%Y') | length }}|"
                "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                "{{ m.role }}{% endfor %}|{{ bos_token }}{{ eos_token }}")
    messages = [{"role": "user", "content": "<é>"}, {"role": "assistant", "content": "y"}]
    text = render_chat_template(template, messages, bos_token="B", eos_token="E")[0]
    assert text == ('[{"role": "user", "content": "<é>"}, {"role": "assistant", "content": '
                    '"y"}]|4|user|BE')
    tokenizer = with_template(ours, "{{ eos_token }}{{ bos_token }}")
    assert apply_chat_template(tokenizer, messages) == [2, 0]   # bos: <|endoftext|>, unset
    assert render_chat_template("a\n  {% if true %}\nb{% endif %}", [])[0] == "a\nb"


def test_save_pretrained_carries_the_template_to_transformers(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    again = BPETokenizer.from_pretrained(tmp_path)
    assert again.chat_template == ours.chat_template and again == ours
    for messages in CONVERSATIONS[:50]:
        for prompt in (False, True):
            assert apply_chat_template(ours, messages, add_generation_prompt=prompt) \
                == their_ids(loaded, messages, prompt)["input_ids"]


# ----- the course's own format, through the same functions ------------------------------------

@pytest.fixture(scope="module")
def course():
    return BPETokenizer.train(CORPUS.read_text(encoding="utf-8")[:20_000], 400,
                              pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS)


def test_the_course_tokenizer_carries_its_own_template(course):
    assert course.chat_template == jinja_chat_template(list(course.special_tokens))
    assert course.eos_token == END_OF_TURN and course.pad_token == "<|pad|>"
    assert end_of_turn_id(course) == course.special_tokens[END_OF_TURN]
    assert stop_token_ids(course)[0] == course.special_tokens[END_OF_TURN]
    assert sorted(stop_token_ids(course)) == sorted(course.special_tokens.values())
    again = BPETokenizer(course.merges, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS,
                         chat_template=course.chat_template, eos_token=END_OF_TURN)
    assert again == course   # the defaults are not stored


def test_the_course_format_rendered_by_jinja_equals_its_own_code(course):
    """The course's template rendered as any model's gives the ids and mask of chat.py's
    message-by-message code."""
    jinja = BPETokenizer(course.merges, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS,
                         chat_template=course.chat_template.replace("{%- endif -%}\n",
                                                                     "{%- endif -%}\n\n", 1))
    assert jinja.chat_template != course.chat_template   # so it goes through Jinja
    rng = random.Random(3)
    for messages in CONVERSATIONS[:100]:
        messages = [m for m in messages if not any(t in m["content"] for t in CHAT_TOKENS)]
        if not messages:
            continue
        prompt = rng.random() < 0.5
        assert encode_chat(jinja, messages, add_generation_prompt=prompt) \
            == encode_chat(course, messages, add_generation_prompt=prompt)


def test_a_tokenizer_with_neither_template_nor_chat_tokens_is_refused(course):
    plain = BPETokenizer(course.merges, pattern=GPT2_PATTERN, special_tokens=["<|endoftext|>"])
    assert plain.chat_template is None
    for call in (lambda: apply_chat_template(plain, [{"role": "user", "content": "x"}]),
                 lambda: end_of_turn_id(plain), lambda: stop_token_ids(plain)):
        with pytest.raises(ValueError, match="no chat format.*no chat_template"):
            call()
