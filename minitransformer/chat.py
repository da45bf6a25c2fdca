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

A real model brings its own format as a Jinja template, the ``chat_template`` of its
tokenizer (from a GGUF file's ``tokenizer.chat_template`` or from ``tokenizer_config.json``);
SmolLM2's is ChatML::

    <|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n

:func:`apply_chat_template` and :func:`encode_chat` work for both. A tokenizer whose
``chat_template`` is the course's own (any tokenizer holding :data:`CHAT_TOKENS` and given no
other) is encoded by the code below, message by message; any other template is rendered as
transformers renders it (:func:`render_chat_template`: a sandboxed Jinja environment with
``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``strftime_now``, ``tojson`` and the
``{% generation %}`` tag that marks the assistant's tokens), and the text is encoded with its
special tokens matched whole. Either way content holding a special token's text is refused.
A template without ``{% generation %}`` gives ids but no mask, unless the package keeps a marked
twin of it (:func:`training_chat_template`; SmolLM2's is :data:`SMOLLM2_TRAINING_TEMPLATE`).
:func:`stop_token_ids` gives the tokens that end a reply.

The tokenizer is a :class:`~minitransformer.bpe.BPETokenizer` (its ``special_tokens``,
``encode``, ``chat_template`` and roles); this module imports nothing else of the package but
the shared checks.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

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
    """The token ids of a conversation in the tokenizer's chat format; see
    :func:`encode_chat`. Unlike it, this works with a template that has no
    ``{% generation %}`` tag (SmolLM2's), as it gives no mask."""
    return _encode(tokenizer, messages, add_generation_prompt, want_mask=False)[0]


def encode_chat(tokenizer: object, messages: Sequence[Mapping[str, str]], *,
                add_generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """The token ids of a conversation and its assistant mask, one bool per id: True on the
    tokens a model should learn to write.

    In the course's format, those are the assistant's content and its end-of-turn token. With
    another template, they are the tokens that overlap the text its ``{% generation %}`` ...
    ``{% endgeneration %}`` blocks write, as transformers'
    ``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives. SmolLM2's template
    has no such block; its marked twin :data:`SMOLLM2_TRAINING_TEMPLATE` (the same text) is
    used instead, as TRL does for ``assistant_only_loss=True``.

    Args:
        tokenizer: a ``BPETokenizer`` with a ``chat_template``: the course's own (it holds
            :data:`CHAT_TOKENS`) or a model's.
        messages: ``{"role": ..., "content": ...}`` dicts, at least one.
        add_generation_prompt: end with the start of the assistant's turn (``<|assistant|>``;
            ``<|im_start|>assistant`` and a line break for SmolLM2), for the model to answer.

    Raises:
        TypeError: a tokenizer that is not one, messages that are not a list of dicts, a
            content that is not a str.
        ValueError: no messages, a missing or unknown role or content, another key, a
            tokenizer without a chat template (and without the chat tokens), content holding a
            special token's text, a template that fails (its ``raise_exception`` message), and
            here, a model's template without ``{% generation %}`` whose marked twin the
            package does not have (:func:`training_chat_template`: no mask can be made).
    """
    return _encode(tokenizer, messages, add_generation_prompt, want_mask=True)


def _encode(tokenizer: object, messages: Sequence[Mapping[str, str]],
            add_generation_prompt: bool, want_mask: bool) -> tuple[list[int], list[bool]]:
    specials, template = _chat_format(tokenizer)
    check_type("add_generation_prompt", add_generation_prompt, bool, "a bool")
    check_messages(messages, specials)
    if template is not None:
        return _encode_by_template(tokenizer, template, messages, add_generation_prompt,
                                   want_mask)
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
    """The tokenizer's special tokens (name -> id), after checking it has the course's chat
    format's (what DPO, GRPO and the course's fine-tuning need)."""
    specials = _special_tokens(tokenizer)
    _check_has_chat_tokens(specials)
    return specials


def _special_tokens(tokenizer: object) -> dict[str, int]:
    specials = getattr(tokenizer, "special_tokens", None)
    if not isinstance(specials, dict) or not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must be a BPETokenizer, got {type(tokenizer).__name__}")
    return specials


def has_chat_tokens(special_tokens: Mapping[str, int]) -> bool:
    """Whether these special tokens include the course's :data:`CHAT_TOKENS`."""
    return all(token in special_tokens for token in CHAT_TOKENS)


def _check_has_chat_tokens(special_tokens: Mapping[str, int]) -> None:
    missing = [token for token in CHAT_TOKENS if token not in special_tokens]
    if missing:
        raise ValueError(f"the tokenizer has no chat format: it lacks the special tokens "
                         f"{missing} (train it with special_tokens=CHAT_TOKENS)")


def _chat_format(tokenizer: object) -> tuple[dict[str, int], str | None]:
    """The special tokens and the template to render, ``None`` for the course's own format
    (encoded message by message, the same ids as rendering its template)."""
    specials = _special_tokens(tokenizer)
    template = getattr(tokenizer, "chat_template", None)
    if template is None or (has_chat_tokens(specials)
                            and template == jinja_chat_template(list(specials))):
        if template is None and not has_chat_tokens(specials):
            missing = [token for token in CHAT_TOKENS if token not in specials]
            raise ValueError(f"the tokenizer has no chat format: it lacks the special tokens "
                             f"{missing} and has no chat_template (train it with "
                             f"special_tokens=CHAT_TOKENS, or load a model's tokenizer with "
                             f"its template)")
        return specials, None
    check_type("tokenizer.chat_template", template, str, "a str (a Jinja template)")
    return specials, template


def end_of_turn_id(tokenizer: object) -> int:
    """The id of the token that ends a turn: ``<|end|>`` in the course's format, else the
    tokenizer's ``eos_token`` (``<|im_end|>``, id 2, for SmolLM2). Raises ``ValueError`` for a
    tokenizer without a chat format or, with a model's template, without an ``eos_token``."""
    specials, template = _chat_format(tokenizer)
    if template is None:
        return specials[END_OF_TURN]
    name = getattr(tokenizer, "eos_token", None)
    if name not in specials:
        raise ValueError(f"the tokenizer has no end-of-turn token: its eos_token is {name!r}, "
                         f"not one of its special tokens")
    return specials[name]


def stop_token_ids(tokenizer: object) -> list[int]:
    """The ids that end a reply: :func:`end_of_turn_id` first, then every other special token
    in id order (a turn's marker, ``<|endoftext|>``: no reply holds one, as contents may not)."""
    end = end_of_turn_id(tokenizer)
    return [end, *sorted(i for i in tokenizer.special_tokens.values() if i != end)]


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


# ----- a model's own template, rendered as transformers renders it ------------------------------

_SPANS: contextvars.ContextVar = contextvars.ContextVar("generation_spans", default=None)
_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}`` ... ``{% endgeneration %}``: writes its body and, while a render
    tracks it, notes where in the output the body went."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_note"), [], [], body).set_lineno(lineno)

    def _note(self, caller) -> str:
        text = caller()
        tracking = _SPANS.get()
        if tracking is not None:   # the blocks written so far end where this one starts
            blocks, spans = tracking
            start = sum(map(len, blocks))
            spans.append((start, start + len(text)))
        return text


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> jinja2.Template:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"the chat template is not valid Jinja: {error} (line "
                         f"{error.lineno})") from None


def render_chat_template(template: str, messages: Sequence[Mapping[str, str]], *,
                         add_generation_prompt: bool = False, **variables: object
                         ) -> tuple[str, list[tuple[int, int]]]:
    """The text a Jinja chat template writes for a conversation, and the ``(start, end)``
    character spans its ``{% generation %}`` blocks wrote (none when it has no such block).

    The environment is transformers': sandboxed and immutable (a template cannot change the
    messages or reach Python's internals), ``trim_blocks`` and ``lstrip_blocks``, the
    ``loopcontrols`` extension, ``raise_exception(message)``, ``strftime_now(format)`` and a
    ``tojson`` that does not escape for HTML. The template sees ``messages``,
    ``add_generation_prompt``, ``tools`` and ``documents`` (``None``) and ``variables``
    (:func:`encode_chat` passes the tokenizer's ``bos_token``, ``eos_token``, ``unk_token``
    and ``pad_token``). The messages are not checked here.

    Raises ``ValueError`` for a template that is not valid Jinja or that fails: its
    ``raise_exception`` message, an undefined name, a forbidden operation.
    """
    check_type("template", template, str, "a str (a Jinja template)")
    check_type("add_generation_prompt", add_generation_prompt, bool, "a bool")
    compiled = _compiled(template)
    blocks: list[str] = []
    spans: list[tuple[int, int]] = []
    token = _SPANS.set((blocks, spans))
    try:
        for block in compiled.generate(
                messages=[dict(message) for message in messages], tools=None, documents=None,
                add_generation_prompt=add_generation_prompt, **variables):
            blocks.append(block)  # noqa: PERF402 (one at a time: _note reads the list)
    except jinja2.TemplateError as error:
        raise ValueError(f"the chat template refused the conversation: {error}") from None
    finally:
        _SPANS.reset(token)
    return "".join(blocks), spans


def _has_generation_tag(template: str) -> bool:
    return re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None


# ----- training templates: a model's own, with the assistant's tokens marked -------------------

_SMOLLM2_SYSTEM = ("{% if loop.first and messages[0]['role'] != 'system' %}"
                   "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                   "trained by Hugging Face<|im_end|>\n' }}{% endif %}")
#: SmolLM2-135M-Instruct's chat template (ChatML with a default system prompt), as its GGUF
#: file's ``tokenizer.chat_template`` holds it. It has no ``{% generation %}`` block.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}" + _SMOLLM2_SYSTEM +
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: The same text as ``SMOLLM2_CHAT_TEMPLATE``, with ``{% generation %}`` ...
#: ``{% endgeneration %}`` around each assistant's content and the ``<|im_end|>`` that ends
#: it: the tokens the model writes after the generation prompt ``<|im_start|>assistant\n``.
#: The line break after ``<|im_end|>`` is left out, as the reply stops at ``<|im_end|>``.
SMOLLM2_TRAINING_TEMPLATE = (
    "{% for message in messages %}" + _SMOLLM2_SYSTEM +
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: A model's chat template -> the same template with the assistant's tokens marked, as TRL's
#: ``get_training_chat_template`` swaps one in for ``assistant_only_loss=True``.
TRAINING_TEMPLATES = {SMOLLM2_CHAT_TEMPLATE: SMOLLM2_TRAINING_TEMPLATE}


def training_chat_template(template: str) -> str:
    """``template`` if it marks the assistant's tokens with ``{% generation %}``, else the
    same template with the marks (``TRAINING_TEMPLATES``: SmolLM2's). It renders the same
    text. Raises ``ValueError`` for a template without marks that is not in the table."""
    check_type("template", template, str, "a str (a Jinja template)")
    if _has_generation_tag(template):
        return template
    if template not in TRAINING_TEMPLATES:
        raise ValueError("the chat template has no {% generation %} block, so it does not say "
                         "which tokens are the assistant's, and it is not one whose marked "
                         "version this package knows (SmolLM2's): no assistant mask (add the "
                         "block around the assistant's content and end-of-turn token, or use "
                         "apply_chat_template for the ids alone)")
    return TRAINING_TEMPLATES[template]


def pad_token_id(tokenizer: object) -> int:
    """The id that pads a batch: ``<|pad|>`` in the course's format, else the tokenizer's
    ``pad_token`` (``<|im_end|>`` for SmolLM2), else its end-of-turn token. Padding sits after
    a conversation and out of the loss, so its id changes nothing but must be in the
    vocabulary."""
    specials, template = _chat_format(tokenizer)
    if template is None:
        return specials[PAD]
    name = getattr(tokenizer, "pad_token", None)
    return specials[name] if name in specials else end_of_turn_id(tokenizer)


def _encode_by_template(tokenizer: object, template: str,
                        messages: Sequence[Mapping[str, str]], add_generation_prompt: bool,
                        want_mask: bool) -> tuple[list[int], list[bool]]:
    if want_mask:   # SmolLM2's gets its marked twin, the same text (TRL does the same)
        template = training_chat_template(template)
    roles = {role: name for role in _ROLES
             if (name := getattr(tokenizer, role, None)) is not None}
    text, spans = render_chat_template(template, messages,
                                       add_generation_prompt=add_generation_prompt, **roles)
    if not want_mask:
        return tokenizer.encode(text), []
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask, k = [], 0
    for start, end in offsets:   # a token is the assistant's if it overlaps a span
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        mask.append(k < len(spans) and end > spans[k][0])
    return ids, mask
