"""Training data for the small GPT: the course's command language, grown (chapter 9).

Chapters 2 and 3 asked a computer to "check whether the battery ran down please" and to "check
the program log and find out whether it ran please": the word after *ran* is decided by a word
far back. Here the language has five such *far words*, each with its own *cue*, the word that
follows *ran* (:data:`CUES`), and distractor words between them, so that the far word sits 3 to
``max_distance`` words before *ran*, never among the two words just before it. The two words
before *ran* are always "whether it" or "if it", whatever the far word: a first- or second-order
Markov model cannot tell the cue, a model that looks back can.

* :func:`command_sentences` -- sentences, deterministic given a seed;
* :func:`command_splits` -- train and validation sets of distinct sentences;
* :func:`far_word_distance` -- which far word a sentence has, and how far before *ran*;
* :func:`token_stream` -- sentences joined by an end-of-sentence token, as one long id tensor;
* :func:`shift_pairs`, :func:`random_batches`, :func:`window_batches` -- windows of the stream
  as ``(input, target)`` pairs, the target shifted one token to the left;
* :func:`cue_batch` -- every sentence cut just after *ran*, to measure the next-word accuracy.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from minitransformer import _checks
from minitransformer.vocab import Vocabulary, tokenize

#: far word -> the word that follows *ran* in its sentences (the cue).
CUES: dict[str, str] = {
    "battery": "down",
    "program": "please",
    "printer": "dry",
    "server": "hot",
    "backup": "late",
}

EOS = "<eos>"

_OPENERS = (("check",), ("look", "at"), ("can", "you", "check"), ("go", "and", "check"))
# What may stand between the far word and *ran*: one choice from each slot, in this order, then
# a bridge. Every bridge ends in "it", so the two words before *ran* are "whether it" or "if it"
# in every sentence, whatever the far word.
_SLOTS = (
    ((), ("log",), ("status",)),
    ((), ("in", "the", "lab"), ("on", "my", "desk"), ("at", "work"), ("upstairs",)),
    ((), ("today",), ("again",), ("from", "last", "night"), ("this", "morning")),
    ((), ("for", "me"), ("first",), ("quickly",)),
)
_BRIDGES = (("whether", "it"), ("if", "it"), ("and", "see", "if", "it"),
            ("and", "find", "out", "whether", "it"), ("and", "tell", "me", "whether", "it"))
MIN_DISTANCE = 3


def _middles() -> dict[int, list[tuple[str, ...]]]:
    """Every word sequence that can follow the far word up to *ran*, by the far word's distance
    from *ran*."""
    by_distance: dict[int, list[tuple[str, ...]]] = {}
    for middle in itertools.product(*_SLOTS, _BRIDGES):
        words = tuple(word for part in middle for word in part)
        by_distance.setdefault(len(words) + 1, []).append(words)
    return by_distance


_MIDDLES = _middles()
MAX_DISTANCE = max(_MIDDLES)


def _sentence(rng: random.Random, max_distance: int) -> list[str]:
    """One sentence whose far word sits a uniformly drawn 3..max_distance words before *ran*."""
    far_word = rng.choice(sorted(CUES))
    middle = rng.choice(_MIDDLES[rng.randint(MIN_DISTANCE, max_distance)])
    cue = CUES[far_word]
    tail = [cue] if cue == "please" else [cue, "please"]
    return [*rng.choice(_OPENERS), "the", far_word, *middle, "ran", *tail]


def _check_distance(max_distance: object) -> int:
    max_distance = _checks.check_int("max_distance", max_distance, low=MIN_DISTANCE)
    if max_distance > MAX_DISTANCE:
        raise ValueError(f"max_distance must be at most {MAX_DISTANCE}, got {max_distance}")
    return max_distance


def command_sentences(num_sentences: int, *, seed: int = 0, max_distance: int = 12) -> list[str]:
    """``num_sentences`` sentences of the command language (repeats possible), the same for the
    same seed.

    >>> command_sentences(1, seed=7)
    ['check the printer log quickly whether it ran dry please']
    """
    _checks.check_int("num_sentences", num_sentences, low=0)
    max_distance = _check_distance(max_distance)
    rng = random.Random(seed)
    return [" ".join(_sentence(rng, max_distance)) for _ in range(num_sentences)]


def command_splits(num_train: int, num_val: int, *, seed: int = 0,
                   max_distance: int = 12) -> tuple[list[str], list[str]]:
    """Train and validation sentences, all distinct: no validation sentence is in training.

    Sentences are drawn until ``num_train + num_val`` distinct ones exist, then shuffled and
    split, so both sets see every distance (each distance is equally likely when drawing, but
    short ones have fewer distinct sentences).

    Raises:
        ValueError: the language has fewer distinct sentences than asked for.
    """
    _checks.check_int("num_train", num_train)
    _checks.check_int("num_val", num_val)
    max_distance = _check_distance(max_distance)
    rng = random.Random(seed)
    wanted, seen, tries = num_train + num_val, {}, 0
    while len(seen) < wanted:
        seen.setdefault(" ".join(_sentence(rng, max_distance)), None)
        tries += 1
        if tries > 50 * wanted:
            raise ValueError(f"found only {len(seen)} distinct sentences with max_distance="
                             f"{max_distance}, fewer than the {wanted} asked for")
    distinct = list(seen)
    rng.shuffle(distinct)
    return distinct[num_val:], distinct[:num_val]


def far_word_distance(sentence: str | Sequence[str]) -> tuple[str, int]:
    """The far word of a command and how many words before *ran* it sits.

    >>> far_word_distance("check the program log and see if it ran please")
    ('program', 6)
    """
    words = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
    far = [i for i, w in enumerate(words) if w in CUES]
    if len(far) != 1 or "ran" not in words:
        raise ValueError(f"not a command with one far word and 'ran': {sentence!r}")
    return words[far[0]], words.index("ran") - far[0]


def token_stream(sentences: Sequence[str], vocab: Vocabulary, *, eos: str = EOS,
                 device: torch.device | str | None = None) -> Tensor:
    """All sentences as one long tensor of token ids, each followed by ``eos``.

    Returns:
        long tensor of shape ``(total tokens,)`` on ``device`` (default: the CPU):
        ``s1 <eos> s2 <eos> ...``.
    """
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of sentences, not a single string")
    end = vocab.index(eos)
    ids = [i for sentence in sentences for i in [*vocab.encode(sentence), end]]
    return torch.tensor(ids, dtype=torch.long, device=device or "cpu")


def shift_pairs(windows: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs and targets of next-token prediction: targets are the inputs moved one to the left.

    Args:
        windows: ``(B, T + 1)`` token ids.

    Returns:
        ``(inputs, targets)``, each ``(B, T)``: ``inputs = windows[:, :-1]``,
        ``targets = windows[:, 1:]``, so ``targets[b, t]`` is the token after ``inputs[b, t]``.
    """
    if not isinstance(windows, Tensor) or windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows must be a (B, T + 1) tensor with T >= 1, got "
                         f"{_checks.shape(windows) if isinstance(windows, Tensor) else windows!r}")
    return windows[:, :-1], windows[:, 1:]


def _check_stream(stream: object, context_length: int) -> Tensor:
    if not isinstance(stream, Tensor) or stream.ndim != 1 or stream.dtype != torch.long:
        raise TypeError("stream must be a 1-D long tensor of token ids (see token_stream)")
    if stream.numel() < context_length + 1:
        raise ValueError(f"stream has {stream.numel()} tokens, too few for one window of "
                         f"context_length + 1 = {context_length + 1}")
    return stream


def random_batches(stream: Tensor, *, batch_size: int, context_length: int,
                   generator: torch.Generator | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless ``(inputs, targets)`` batches of windows that start at random places in
    ``stream``; each ``(batch_size, context_length)``. Repeatable with a seeded ``generator``.
    """
    _checks.check_int("batch_size", batch_size)
    _checks.check_int("context_length", context_length)
    stream = _check_stream(stream, context_length)
    offsets = torch.arange(context_length + 1, device=stream.device)
    while True:
        starts = torch.randint(stream.numel() - context_length, (batch_size,),
                               generator=generator, device=stream.device)
        yield shift_pairs(stream[starts[:, None] + offsets])  # (B, T + 1) -> 2 x (B, T)


def window_batches(stream: Tensor, *, batch_size: int,
                   context_length: int) -> list[tuple[Tensor, Tensor]]:
    """The stream cut into consecutive windows, as a fixed list of ``(inputs, targets)``
    batches: every token is predicted once (for evaluation). A short remainder is dropped.
    """
    _checks.check_int("batch_size", batch_size)
    _checks.check_int("context_length", context_length)
    stream = _check_stream(stream, context_length)
    count = (stream.numel() - 1) // context_length
    inputs = stream[: count * context_length].reshape(count, context_length)
    targets = stream[1: count * context_length + 1].reshape(count, context_length)
    return [(inputs[i: i + batch_size], targets[i: i + batch_size])
            for i in range(0, count, batch_size)]


def cue_batch(sentences: Sequence[str], vocab: Vocabulary, *, eos: str = EOS,
              device: torch.device | str | None = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every sentence as a prompt that ends at *ran*, for the next-word accuracy on the cue.

    Each row is ``<eos>`` followed by the sentence's words up to *ran*, padded on the right with
    ``eos`` to the longest row (a causal model never sees the padding from *ran*'s position).

    Returns:
        ``(idx, position, cue, distance)``, long tensors on ``device`` (default: the CPU):
        ``idx`` ``(B, T)`` token ids; ``position`` ``(B,)``
        the column of *ran*; ``cue`` ``(B,)`` the id of the right next word; ``distance``
        ``(B,)`` how many words before *ran* the far word sits.
    """
    end = vocab.index(eos)
    rows, positions, cues, distances = [], [], [], []
    for sentence in sentences:
        words = tokenize(sentence)
        far_word, distance = far_word_distance(words)
        ran = words.index("ran")
        rows.append([end, *vocab.encode(words[: ran + 1])])
        positions.append(ran + 1)
        cues.append(vocab.index(words[ran + 1]))
        distances.append(distance)
    width = max(len(row) for row in rows)
    padded = [row + [end] * (width - len(row)) for row in rows]
    return tuple(torch.tensor(values, dtype=torch.long, device=device or "cpu")
                 for values in (padded, positions, cues, distances))
