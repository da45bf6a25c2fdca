"""The chat format: a conversation as one sequence of tokens (chapter 16).

A conversation is the list of messages that OpenAI's API, transformers and TRL all use,
``[{"role": "system" | "user" | "assistant", "content": str}, ...]``. Each message becomes its
role's marker, its content, and the end-of-turn token::

    <|system|>You are terse.<|end|><|user|>Hi<|end|><|assistant|>Hello.<|end|>

The markers are special tokens, so content is encoded on its own between them. The assistant
mask is True on the tokens a model should learn to write: the assistant's content and its
``<|end|>``, which is how it learns to stop. Its marker is not: the prompt supplies it
(``add_generation_prompt=True`` ends the ids with ``<|assistant|>``).

Content that contains a special token's text (``"<|end|>"``) is refused: encoded as the token,
a user could write a turn of the assistant's; encoded as text, it would differ from what
transformers gives. :func:`jinja_chat_template` is the same format as the Jinja template that
transformers reads from ``tokenizer_config.json`` and refuses the same content.

The tokenizer is a :class:`~minitransformer.bpe.BPETokenizer` (its ``special_tokens`` and
``encode``); this module imports nothing else of the package but the shared checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from minitransformer._checks import check_type

ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
END_OF_TURN = "<|end|>"
PAD = "<|pad|>"
#: The special tokens of the chat format, which ``train`` reserves in every tokenizer. The pad
#: token is not the end-of-turn token: a collator that leaves padding out of the loss by its id
#: would otherwise leave out every ``<|end|>``, and the model would never learn to stop.
CHAT_TOKENS = (*ROLE_TOKENS.values(), END_OF_TURN, PAD)


def apply_chat_template(tokenizer: object, messages: Sequence[Mapping[str, str]], *,
                        add_generation_prompt: bool = False) -> list[int]:
    """The token ids of a conversation; see :func:`encode_chat`."""
    return encode_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt)[0]


def encode_chat(tokenizer: object, messages: Sequence[Mapping[str, str]], *,
                add_generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """The token ids of a conversation and its assistant mask, one bool per id: True on the
    assistant's content and its end-of-turn token.

    Args:
        tokenizer: a ``BPETokenizer`` holding :data:`CHAT_TOKENS` as special tokens.
        messages: ``{"role": ..., "content": ...}`` dicts, at least one.
        add_generation_prompt: end with ``<|assistant|>``, for the model to answer.

    Raises:
        TypeError: a tokenizer that is not one, messages that are not a list of dicts, a
            content that is not a str.
        ValueError: no messages, a missing or unknown role or content, another key, a
            tokenizer without the chat tokens, content holding a special token's text.
    """
    specials = check_chat_tokenizer(tokenizer)
    check_type("add_generation_prompt", add_generation_prompt, bool, "a bool")
    check_messages(messages, specials)
    end = specials[END_OF_TURN]
    ids: list[int] = []
    mask: list[bool] = []
    for message in messages:
        role = message["role"]
        content = tokenizer.encode(message["content"]) + [end]
        ids += [specials[ROLE_TOKENS[role]], *content]
        mask += [False] + [role == "assistant"] * len(content)
    if add_generation_prompt:
        ids.append(specials[ROLE_TOKENS["assistant"]])
        mask.append(False)
    return ids, mask


def check_chat_tokenizer(tokenizer: object) -> dict[str, int]:
    """The tokenizer's special tokens (name -> id), after checking it has the chat format's."""
    specials = getattr(tokenizer, "special_tokens", None)
    if not isinstance(specials, dict) or not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    _check_has_chat_tokens(specials)
    return specials


def _check_has_chat_tokens(special_tokens: Mapping[str, int]) -> None:
    missing = [token for token in CHAT_TOKENS if token not in special_tokens]
    if missing:
        raise ValueError(f"the tokenizer has no chat format: it lacks the special tokens "
                         f"{missing} (train it with special_tokens=CHAT_TOKENS)")


def check_messages(messages: object, special_tokens: Sequence[str] = ()) -> None:
    """A conversation: a non-empty list of ``{"role", "content"}`` dicts with known roles and
    str contents free of ``special_tokens``' text. Errors name the message by its index."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of {{\"role\": ..., \"content\": ...}} dicts, "
                        f"got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one message")
    for k, message in enumerate(messages):
        check_type(f"messages[{k}]", message, Mapping, "a dict with \"role\" and \"content\"")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"messages[{k}] has no {key!r}: {_short(message)}")
        extra = sorted(map(str, set(message) - {"role", "content"}))
        if extra:
            raise ValueError(f"messages[{k}] has keys {extra} that the chat format does not "
                             f"hold (only \"role\" and \"content\")")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or role not in ROLE_TOKENS:
            raise ValueError(f"messages[{k}] has role {role!r}; the roles are "
                             f"{list(ROLE_TOKENS)}")
        check_type(f"messages[{k}]['content']", content, str, "a str")
        for token in special_tokens:
            if token in content:
                raise ValueError(f"messages[{k}]['content'] contains the special token "
                                 f"{token!r}, which only the template may write")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----- the same format as transformers' Jinja template ------------------------------------------

#: The Jinja text of :func:`jinja_chat_template`; ``__SPECIAL_TOKENS__`` stands for the list of
#: special tokens that content may not contain. Every ``{%-``/``-%}`` trims the template's own
#: line breaks and indents, so only the markers and the contents are written.
JINJA_TEMPLATE = """\
{%- if messages | length == 0 -%}
    {{ raise_exception('messages is empty') }}
{%- endif -%}
{%- for message in messages -%}
    {%- set k = loop.index0 -%}
    {%- if message['content'] is not string -%}
        {{ raise_exception('the content of message ' ~ k ~ ' is not a string') }}
    {%- endif -%}
    {%- for token in __SPECIAL_TOKENS__ -%}
        {%- if token in message['content'] -%}
            {{ raise_exception('the content of message ' ~ k
                               ~ ' contains the special token ' ~ token) }}
        {%- endif -%}
    {%- endfor -%}
    {%- if message['role'] == 'system' -%}
        <|system|>{{ message['content'] }}<|end|>
    {%- elif message['role'] == 'user' -%}
        <|user|>{{ message['content'] }}<|end|>
    {%- elif message['role'] == 'assistant' -%}
        <|assistant|>{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}
    {%- else -%}
        {{ raise_exception('unknown role: ' ~ message['role']) }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>
{%- endif -%}
"""


def jinja_chat_template(special_tokens: Sequence[str] = CHAT_TOKENS) -> str:
    """The chat format as a Jinja ``chat_template`` for ``tokenizer_config.json``
    (``JINJA_TEMPLATE``): ``{% generation %}`` ... ``{% endgeneration %}`` around the
    assistant's content and its end-of-turn token, so that transformers'
    ``return_assistant_tokens_mask=True`` gives :func:`encode_chat`'s mask. It refuses, as
    :func:`encode_chat` does, an unknown role, a content that is not a string, and content
    holding one of ``special_tokens``."""
    check_type("special_tokens", special_tokens, (list, tuple), "a list of str")
    for j, token in enumerate(special_tokens):
        check_type(f"special_tokens[{j}]", token, str, "a str")
    # a JSON list of strings is a Jinja list literal
    return JINJA_TEMPLATE.replace("__SPECIAL_TOKENS__", json.dumps(list(special_tokens)))


def chat_tokenizer_config(special_tokens: Mapping[str, int]) -> dict:
    """The entries of ``tokenizer_config.json`` that give transformers the chat format of a
    tokenizer whose special tokens (name -> id) include :data:`CHAT_TOKENS`: the Jinja
    ``chat_template``, ``<|end|>`` as ``eos_token`` (a reply ends at the end of its turn),
    ``<|pad|>`` as ``pad_token``, and every special token in ``added_tokens_decoder``."""
    _check_has_chat_tokens(special_tokens)
    return {
        "chat_template": jinja_chat_template(list(special_tokens)),
        "eos_token": END_OF_TURN,
        "pad_token": PAD,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for s, i in special_tokens.items()},
    }


def write_chat_template(path: str | os.PathLike, tokenizer: object) -> None:
    """Add ``chat_tokenizer_config``'s entries to the ``tokenizer_config.json`` that
    ``tokenizer.save_pretrained`` wrote in the directory ``path``.

    Raises:
        TypeError, ValueError: as ``check_chat_tokenizer``; a file that is not a JSON
            object, or that gives one of the special tokens' ids to another token (the
            directory of another tokenizer).
        FileNotFoundError: no ``tokenizer_config.json`` in ``path``.
    """
    specials = check_chat_tokenizer(tokenizer)
    check_type("path", path, (str, os.PathLike), "a str or path")
    file = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(2, f"no tokenizer_config.json in {os.fspath(path)!r}: write the "
                                   f"tokenizer with save_pretrained first", file)
    with open(file, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except ValueError as error:
            raise ValueError(f"{file} is not JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a JSON object")
    entries = chat_tokenizer_config(specials)
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ValueError(f"{file}: added_tokens_decoder is not a JSON object")
    for i, entry in entries["added_tokens_decoder"].items():
        there = decoder.get(i)
        content = there.get("content") if isinstance(there, dict) else entry["content"]
        if content != entry["content"]:
            raise ValueError(f"{file} gives id {i} to {content!r}, this tokenizer to "
                             f"{entry['content']!r}: the directory holds another tokenizer")
    entries["added_tokens_decoder"] = {**decoder, **entries["added_tokens_decoder"]}
    config.update(entries)
    partial = file + ".partial"  # replaced in one step: a kill leaves the old file or the new
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    os.replace(partial, file)
