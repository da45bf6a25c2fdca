"""The instruction data of chapter 16 (minitransformer.data.instruction_splits): conversations
in the chat format, seeded, every answer right, and no held-out sentence among the training
conversations."""

from __future__ import annotations

import re

import pytest

from minitransformer import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import CHAT_TOKENS, encode_chat
from minitransformer.data import (
    INSTRUCTION_SYSTEM,
    INSTRUCTION_TASKS,
    instruction_answer,
    instruction_splits,
    is_command,
    translate_command,
)


@pytest.fixture(scope="module")
def splits():
    return instruction_splits(600, 200, seed=0)


def _task_and_sentence(instruction: str) -> tuple[str, str]:
    """Read an instruction back: which task, about which sentence."""
    for task, wordings in INSTRUCTION_TASKS.items():
        for wording in wordings:
            pattern = re.escape(wording).replace(r"\{\}", "(.+)")
            match = re.fullmatch(pattern, instruction)
            if match:
                return task, match[1]
    raise AssertionError(f"no wording matches {instruction!r}")


def _exchanges(messages):
    body = messages[1:] if messages[0]["role"] == "system" else messages
    return [(body[k]["content"], body[k + 1]["content"]) for k in range(0, len(body), 2)]


def test_the_same_seed_gives_the_same_conversations(splits):
    assert instruction_splits(600, 200, seed=0) == splits
    assert instruction_splits(600, 200, seed=1) != splits


def test_the_shape_of_every_conversation(splits):
    train, val = splits
    assert (len(train), len(val)) == (600, 200)
    systems = 0
    for messages in train:
        systems += messages[0]["role"] == "system"
        if messages[0]["role"] == "system":
            assert messages[0]["content"] == INSTRUCTION_SYSTEM
        body = messages[1:] if messages[0]["role"] == "system" else messages
        assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
        assert 1 <= len(body) // 2 <= 2
    assert 0.15 < systems / len(train) < 0.35
    assert all([m["role"] for m in messages] == ["user", "assistant"] for messages in val)


def test_every_answer_is_right(splits):
    train, val = splits
    for messages in train + val:
        for instruction, answer in _exchanges(messages):
            task, sentence = _task_and_sentence(instruction)
            if task == "translate":
                assert answer == translate_command(sentence)
            elif task == "is_command":
                assert answer == ("yes" if is_command(sentence) else "no")
            elif task == "repeat":
                assert answer == sentence
            else:
                assert answer.split() == sentence.split()[::-1]


def test_no_held_out_sentence_is_trained_on(splits):
    train, val = splits
    seen = {_task_and_sentence(i)[1] for m in train for i, _ in _exchanges(m)}
    held_out = {_task_and_sentence(m[0]["content"])[1] for m in val}
    assert held_out and not held_out & seen


def test_every_task_wording_and_answer_occurs(splits):
    train, val = splits
    tasks = [_task_and_sentence(m[0]["content"])[0] for m in val]
    assert tasks[:8] == list(INSTRUCTION_TASKS) * 2          # the tasks take turns
    instructions = [i for m in train for i, _ in _exchanges(m)]
    for wordings in INSTRUCTION_TASKS.values():
        for wording in wordings:
            head = wording.split("{}")[0]
            assert any(i.startswith(head) for i in instructions), wording
    answers = [a for m in train for i, a in _exchanges(m)
               if _task_and_sentence(i)[0] == "is_command"]
    assert 0.2 < answers.count("yes") / len(answers) < 0.5
    assert set(answers) == {"yes", "no"}


def test_a_subset_of_tasks(splits):
    train, val = instruction_splits(50, 10, seed=0, tasks=["reverse"], max_exchanges=1,
                                    system_rate=0.0)
    assert all(len(m) == 2 for m in train)
    assert all(_task_and_sentence(m[0]["content"])[0] == "reverse" for m in train + val)


def test_instruction_answer():
    assert instruction_answer("reverse", "open my photos") == "photos my open"
    assert instruction_answer("repeat", "open  my photos") == "open my photos"
    assert instruction_answer("translate", "open my photos") == translate_command(
        "open my photos")
    assert instruction_answer("is_command", "check the server if it ran hot please") == "yes"
    assert instruction_answer("is_command", "check the server if it ran dry please") == "no"


def test_conversations_encode_in_the_chat_format(splits):
    train, _ = splits
    text = " ".join(m["content"] for messages in train[:50] for m in messages)
    tok = BPETokenizer.train(text, 300 + len(CHAT_TOKENS), pattern=GPT2_PATTERN,
                             special_tokens=CHAT_TOKENS)
    for messages in train[:50]:
        ids, mask = encode_chat(tok, messages)
        assert any(mask) and len(ids) == len(mask)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(num_train=-1, num_val=1), ValueError, "num_train"),
    (dict(num_train=1.5, num_val=1), TypeError, "num_train"),
    (dict(num_train=1, num_val=1, tasks=["summarise"]), ValueError, "summarise"),
    (dict(num_train=1, num_val=1, tasks=[]), ValueError, "tasks is empty"),
    (dict(num_train=1, num_val=1, tasks="reverse"), TypeError, "tasks"),
    (dict(num_train=1, num_val=1, max_exchanges=0), ValueError, "max_exchanges"),
    (dict(num_train=1, num_val=1, system_rate=1.5), ValueError, "system_rate"),
    (dict(num_train=1, num_val=1, seed=-1), ValueError, "seed"),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, words):
    with pytest.raises(error, match=words):
        instruction_splits(**kwargs)


@pytest.mark.parametrize("task, sentence, error, words", [
    ("summarise", "open my photos", ValueError, "summarise"),
    ("translate", "open the window", ValueError, "not a command"),
    (3, "open my photos", TypeError, "task"),
    ("repeat", None, TypeError, "sentence"),
])
def test_instruction_answer_refuses_by_name(task, sentence, error, words):
    with pytest.raises(error, match=words):
        instruction_answer(task, sentence)
