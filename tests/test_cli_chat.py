"""``minitransformer chat`` (chapter 16): a conversation kept over turns, through the chat
template with the generation prompt, streamed token by token (whole characters only), stopped
at ``<|end|>``; one-line refusals."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

from minitransformer import GPT, BPETokenizer, GPTConfig  # noqa: E402
from minitransformer.bpe import GPT2_PATTERN  # noqa: E402
from minitransformer.chat import CHAT_TOKENS  # noqa: E402
from minitransformer.cli import chat as chat_command  # noqa: E402
from minitransformer.generation import generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
def chat(model: Path, text: str, *flags) -> subprocess.CompletedProcess:
    """The program with ``text`` on its standard input."""
    return subprocess.run([PYTHON, "-m", "minitransformer", "chat", "--model", str(model),
                           "--device", "cpu", *map(str, flags)], input=text,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model with the chat tokens, untrained: its greedy replies vary with the context."""
    folder = tmp_path_factory.mktemp("chat")
    text = (ROOT / "book" / "data" / "corpus.txt").read_text("utf-8")[:6000]
    BPETokenizer.train(text, 300, pattern=GPT2_PATTERN,
                       special_tokens=CHAT_TOKENS).save_pretrained(folder)
    torch.manual_seed(1)    # replies of 12 tokens, with bytes that are not whole characters
    GPT(GPTConfig(vocab_size=300, context_length=64, num_layers=1, num_heads=2,
                  d_model=16)).save_pretrained(folder)
    return folder


def greedy_replies(folder: Path, turns: list[str], *, system: str | None,
                   max_new_tokens: int) -> list[str]:
    """What the chat must print, built from the package's pieces: the template's ids with the
    generation prompt, generate's greedy continuation, cut at the first chat token."""
    tokenizer = BPETokenizer.from_pretrained(folder)
    model = GPT.from_pretrained(folder)
    stops = {tokenizer.special_tokens[t] for t in CHAT_TOKENS}
    messages = [{"role": "system", "content": system}] if system else []
    replies = []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        new = generate(model, torch.tensor([ids]), max_new_tokens, temperature=0.0)
        reply = []
        for token in new[0, len(ids):].tolist():
            if token in stops:
                break
            reply.append(token)
        replies.append(tokenizer.decode(reply))
        messages.append({"role": "assistant", "content": replies[-1]})
    return replies


def test_two_turns_print_generate_s_greedy_replies_to_the_whole_conversation(model_dir):
    turns = ["The cat sat", "and then?"]
    result = chat(model_dir, "\n".join(turns) + "\n", "--max-new-tokens", "12",
                  "--temperature", "0", "--system", "Be brief.")
    assert result.returncode == 0, result.stderr
    expected = greedy_replies(model_dir, turns, system="Be brief.", max_new_tokens=12)
    assert result.stdout == "".join(reply + "\n" for reply in expected)
    # the second reply depends on the first turn: a chat that forgot it would differ
    alone = greedy_replies(model_dir, turns[1:], system="Be brief.", max_new_tokens=12)
    assert alone[0] != expected[1], (alone, expected)
    assert all(reply.strip() for reply in expected), expected


def test_exit_ends_the_chat_and_the_rest_is_not_read(model_dir):
    result = chat(model_dir, "hello\n/exit\nmore\n", "--max-new-tokens", "3",
                  "--temperature", "0")
    assert result.returncode == 0, result.stderr
    reply = greedy_replies(model_dir, ["hello"], system=None, max_new_tokens=3)[0]
    assert result.stdout == reply + "\n"


class Recorder(io.StringIO):
    """Standard output that records what was written before each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_a_reply_is_printed_as_it_comes_in_whole_characters(monkeypatch):
    """Greedy tokens scripted as the bytes of "é" (0xC3 0xA9), "!", then <|end|>: nothing is
    printed for half a character, "é" once both bytes are there, and each piece is flushed
    before the next token is generated."""
    tokenizer = BPETokenizer.train("ab", 256 + len(CHAT_TOKENS), pattern=GPT2_PATTERN,
                                   special_tokens=CHAT_TOKENS)
    end = tokenizer.special_tokens["<|end|>"]
    script = iter([0xC3, 0xA9, ord("!"), end, ord("x")])
    out = Recorder()
    seen = []

    def scripted(model, ids, n, **options):
        for token in script:
            seen.append(out.getvalue())        # what was printed before this token
            yield token

    monkeypatch.setattr(chat_command, "stream_tokens", scripted)
    monkeypatch.setattr(sys, "stdout", out)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), context_length=16, num_layers=1,
                          num_heads=1, d_model=4))
    reply = chat_command._stream(model, tokenizer, [1], 10, 0.0, torch.Generator(),
                                 {tokenizer.special_tokens[t] for t in CHAT_TOKENS})
    assert reply == "é!"
    assert seen == ["", "", "é", "é!"]         # streamed; stopped at <|end|>
    assert out.getvalue() == "é!\n" and "\ufffd" not in out.getvalue()


def test_a_model_without_the_chat_tokens_is_refused_by_name(tmp_path):
    tokenizer = BPETokenizer.train("the cat sat on the mat " * 20, 262, pattern=GPT2_PATTERN)
    tokenizer.save_pretrained(tmp_path)
    GPT(GPTConfig(vocab_size=len(tokenizer), context_length=16, num_layers=1, num_heads=2,
                  d_model=8)).save_pretrained(tmp_path)
    result = chat(tmp_path, "hello\n")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert f"--model {tmp_path} has no chat format" in result.stderr
    assert "<|user|>" in result.stderr
