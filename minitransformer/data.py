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
* :func:`is_command` -- whether a sentence (say, one a model wrote) belongs to the language;
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


def count_commands(max_distance: int = 12) -> int:
    """How many distinct sentences the command language has with the far word at most
    ``max_distance`` words before *ran*: an opener, a far word, and what stands between."""
    max_distance = _check_distance(max_distance)
    middles = sum(len(_MIDDLES.get(d, ())) for d in range(MIN_DISTANCE, max_distance + 1))
    return len(_OPENERS) * len(CUES) * middles


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
    wanted, exist = num_train + num_val, count_commands(max_distance)
    if wanted > exist:
        raise ValueError(f"the command language has {exist} distinct sentences with "
                         f"max_distance={max_distance}, fewer than the {wanted} asked for "
                         f"(num_train={num_train} + num_val={num_val})")
    rng = random.Random(seed)
    seen, tries = {}, 0
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


def is_command(sentence: str | Sequence[str]) -> bool:
    """Whether the command language can say ``sentence``: an opener, "the", a far word, what may
    stand between (at most :data:`MAX_DISTANCE` words before *ran*), "ran", and the far word's
    cue (then "please", unless the cue is "please").

    >>> is_command("check the server if it ran hot please"), is_command("check the server ran")
    (True, False)
    """
    words = tuple(tokenize(sentence) if isinstance(sentence, str) else sentence)
    for opener in _OPENERS:
        if words[: len(opener) + 1] == (*opener, "the") and len(words) > len(opener) + 1:
            far_word, rest = words[len(opener) + 1], words[len(opener) + 2:]
            cue = CUES.get(far_word)
            tail = ("ran", cue) if cue == "please" else ("ran", cue, "please")
            middle = rest[: len(rest) - len(tail)]
            return (cue is not None and rest[len(middle):] == tail
                    and middle in _MIDDLES.get(len(middle) + 1, ()))
    return False


def _check_sentences(name: str, sentences: object) -> None:
    """A list (or other sequence) of sentences, each a string."""
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise TypeError(f"{name} must be a list of sentences (strings), got "
                        f"{type(sentences).__name__}")
    for i, sentence in enumerate(sentences):
        _checks.check_type(f"{name}[{i}]", sentence, str, "a str")


def _check_vocab(name: str, vocab: object) -> None:
    _checks.check_type(name, vocab, Vocabulary, "a Vocabulary")


def token_stream(sentences: Sequence[str], vocab: Vocabulary, *, eos: str = EOS,
                 device: torch.device | str | None = None) -> Tensor:
    """All sentences as one long tensor of token ids, each followed by ``eos``.

    Returns:
        long tensor of shape ``(total tokens,)`` on ``device`` (default: the CPU):
        ``s1 <eos> s2 <eos> ...``.
    """
    _check_sentences("sentences", sentences)
    _check_vocab("vocab", vocab)
    device = _checks.check_device(device)
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
    _check_sentences("sentences", sentences)
    _check_vocab("vocab", vocab)
    if not sentences:
        raise ValueError("cue_batch needs at least one sentence")
    device = _checks.check_device(device)
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


# --- Chapter 10: a parallel corpus, commands and their translations ------------------------------
#
# The source side is the command language grown into a small grammar ("show me my old files in
# the shared folder please"); the target side is a made-up language with words of its own and
# another word order. Source, then target:
#
#     VERB [me] OBJECT [PLACE] [please]          OBJECT = [det] [adj] [adj] noun
#     [please] OBJECT' [PLACE'] [me] VERB        PLACE  = prep [det] [adj] [adj] place
#
# where each phrase X' is X read backwards: the noun first and its modifiers after it, a
# postposition instead of a preposition; the verb comes last. The alignment of a sentence and its
# translation is a permutation far from the diagonal, and lengths run from 2 to 12 words.

#: The special tokens of both vocabularies, at ids 0, 1 and 2.
TRANSLATION_SPECIALS = ("<pad>", "<bos>", "<eos>")

_VERBS = {"show": "miro", "open": "abra", "copy": "kopa", "delete": "tilo", "send": "sendu",
          "find": "trova", "check": "kontro", "sort": "ordo", "hide": "kasu", "print": "printa"}
_VERBS_WITH_ME = ("find", "print", "send", "show")
_DETERMINERS = {"the": "la", "my": "mia", "all": "tuta", "these": "esti"}
# At most one adjective of each group, in this order: "large old hidden files".
_ADJECTIVE_GROUPS = ({"large": "granda", "small": "eta"},
                     {"old": "vela", "new": "nova", "recent": "fresa"},
                     {"hidden": "sekra", "shared": "komuna", "broken": "rompa", "empty": "vaka",
                      "locked": "fermita"})
_NOUNS = {"files": "dosi", "photos": "foti", "directories": "dira", "notes": "noti",
          "messages": "mesa", "songs": "kanti", "logs": "logi", "videos": "vidi",
          "reports": "raporti", "backups": "sekuri"}
_PLACES = {"folder": "dosujo", "laptop": "portilo", "phone": "telfo", "server": "servo",
           "desktop": "tablo", "drive": "disko", "cloud": "nubo"}
_PREPOSITIONS = {"in": "en", "on": "sur", "from": "de"}

#: Every source word and its target word.
TRANSLATION_LEXICON: dict[str, str] = {
    **_VERBS, "me": "mi", **_DETERMINERS, **{k: v for g in _ADJECTIVE_GROUPS for k, v in g.items()},
    **_NOUNS, **_PREPOSITIONS, **_PLACES, "please": "bo"}


def _noun_phrase(rng: random.Random, nouns: dict[str, str], determiners: Sequence[str], *,
                 always_det: bool = False) -> list[str]:
    words = [rng.choice(determiners)] if always_det or rng.random() < 0.7 else []
    groups = sorted(rng.sample(range(len(_ADJECTIVE_GROUPS)), rng.choice((0, 0, 1, 1, 2))))
    words += [rng.choice(sorted(_ADJECTIVE_GROUPS[g])) for g in groups]
    return [*words, rng.choice(sorted(nouns))]


def _command(rng: random.Random) -> str:
    verb = rng.choice(sorted(_VERBS))
    words = [verb, *(["me"] if verb in _VERBS_WITH_ME and rng.random() < 0.5 else [])]
    words += _noun_phrase(rng, _NOUNS, sorted(_DETERMINERS))
    if rng.random() < 0.5:                          # one place: "in the cloud", "on my phone"
        place = _noun_phrase(rng, _PLACES, ("my", "the"), always_det=True)
        words += [rng.choice(sorted(_PREPOSITIONS)), *place]
    if rng.random() < 0.5:
        words.append("please")
    return " ".join(words)


def count_translation_commands() -> int:
    """How many distinct commands the translation grammar makes (what :func:`_command` can
    draw): verb [me] OBJECT [PLACE] [please]."""
    groups = [len(g) for g in _ADJECTIVE_GROUPS]
    adjectives = 1 + sum(groups) + sum(a * b for a, b in itertools.combinations(groups, 2))
    obj = (1 + len(_DETERMINERS)) * adjectives * len(_NOUNS)
    place = len(_PREPOSITIONS) * 2 * adjectives * len(_PLACES)           # "my" or "the"
    verbs = len(_VERBS) + len(_VERBS_WITH_ME)                             # with and without me
    return verbs * obj * (1 + place) * 2                                  # [please]


def translate_command(sentence: str) -> str:
    """The reference translation of a command: the rule a translation model has to find.

    >>> translate_command("show me my old files in the shared folder please")
    'bo dosi vela mia dosujo komuna la en mi miro'

    Raises:
        ValueError: ``sentence`` is not a command of the grammar's words, starting with a verb.
    """
    words = tokenize(sentence)
    unknown = [word for word in words if word not in TRANSLATION_LEXICON]
    if unknown or not words or words[0] not in _VERBS:
        raise ValueError(f"not a command of the translation corpus: {sentence!r}"
                         + (f" (unknown words {unknown})" if unknown else ""))
    verb, rest = words[0], words[1:]
    me = rest[:1] == ["me"]
    rest = rest[1:] if me else rest
    please = rest[-1:] == ["please"]
    rest = rest[:-1] if please else rest
    split = next((i for i, word in enumerate(rest) if word in _PREPOSITIONS), len(rest))
    obj, place = rest[:split], rest[split:]
    order = ["please"] * please + obj[::-1] + place[::-1] + ["me"] * me + [verb]
    return " ".join(TRANSLATION_LEXICON[word] for word in order)


def translation_pairs(num_pairs: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """``num_pairs`` distinct ``(source, target)`` sentence pairs, the same for the same seed.

    >>> translation_pairs(1, seed=7)
    [('open broken directories please', 'bo dira rompa abra')]
    """
    _checks.check_int("num_pairs", num_pairs)
    if num_pairs > count_translation_commands():
        raise ValueError(f"the translation corpus has {count_translation_commands()} distinct "
                         f"commands, fewer than the {num_pairs} pairs asked for")
    rng = random.Random(seed)
    sources: dict[str, None] = {}
    while len(sources) < num_pairs:
        sources.setdefault(_command(rng), None)
    return [(source, translate_command(source)) for source in sources]


def translation_splits(num_train: int, num_val: int, *, seed: int = 0
                       ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Training and validation pairs; no source sentence is in both."""
    _checks.check_int("num_train", num_train)
    _checks.check_int("num_val", num_val)
    pairs = translation_pairs(num_train + num_val, seed=seed)
    return pairs[:num_train], pairs[num_train:]


def translation_vocabularies() -> tuple[Vocabulary, Vocabulary]:
    """The source and the target vocabulary, each with ``<pad>``, ``<bos>`` and ``<eos>`` at
    ids 0, 1 and 2, then every word of its language, sorted."""
    return (Vocabulary(TRANSLATION_LEXICON, specials=TRANSLATION_SPECIALS),
            Vocabulary(TRANSLATION_LEXICON.values(), specials=TRANSLATION_SPECIALS))


def pad_sequences(sequences: Sequence[Sequence[int]], *, pad_id: int = 0,
                  device: torch.device | str | None = None) -> Tensor:
    """Rows of different lengths as one ``(B, T_max)`` long tensor, padded on the right with
    ``pad_id``, on ``device`` (default: the CPU).

    >>> pad_sequences([[5, 6, 7], [8]])
    tensor([[5, 6, 7],
            [8, 0, 0]])
    """
    if isinstance(sequences, (str, Tensor)) or not sequences:
        raise ValueError("sequences must be a non-empty list of lists of token ids")
    _checks.check_int("pad_id", pad_id, low=0)
    device = _checks.check_device(device)
    for i, row in enumerate(sequences):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise TypeError(f"sequences[{i}] must be a list of token ids, got "
                            f"{type(row).__name__}")
        for token in row:
            _checks.check_int(f"token ids (sequences[{i}])", token, low=0)
    longest = max(len(row) for row in sequences)
    return torch.tensor([[*row, *[pad_id] * (longest - len(row))] for row in sequences],
                        dtype=torch.long, device=device or "cpu")


def translation_batch(pairs: Sequence[tuple[str, str]], src_vocab: Vocabulary,
                      tgt_vocab: Vocabulary, *, device: torch.device | str | None = None
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, tgt_in, targets)`` for a list of pairs, padded with ``<pad>``.

    ``tgt_in`` is ``<bos>`` and the target words, ``targets`` the target words and ``<eos>``:
    the same sentence shifted by one, for teacher forcing. All three are long tensors on
    ``device`` (default: the CPU); ``tgt_in`` and ``targets`` have the same shape.
    """
    if isinstance(pairs, str) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a list of (source, target) sentences, got "
                        f"{type(pairs).__name__}")
    if not pairs:
        raise ValueError("pairs must be a non-empty list of (source, target) sentences")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(side, str) for side in pair)):
            raise TypeError(f"pairs[{i}] must be a (source, target) pair of strings, got "
                            f"{pair!r:.60}")
    _check_vocab("src_vocab", src_vocab)
    _check_vocab("tgt_vocab", tgt_vocab)
    device = _checks.check_device(device)
    pad, bos, eos = (tgt_vocab.index(token) for token in TRANSLATION_SPECIALS)
    sources = [src_vocab.encode(source) for source, _ in pairs]
    targets = [tgt_vocab.encode(target) for _, target in pairs]
    return (pad_sequences(sources, pad_id=src_vocab.index("<pad>"), device=device),
            pad_sequences([[bos, *t] for t in targets], pad_id=pad, device=device),
            pad_sequences([[*t, eos] for t in targets], pad_id=pad, device=device))


def translation_batches(pairs: Sequence[tuple[str, str]], src_vocab: Vocabulary,
                        tgt_vocab: Vocabulary, *, batch_size: int, seed: int = 0,
                        device: torch.device | str | None = None
                        ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Endless :func:`translation_batch` batches of ``batch_size`` pairs: the pairs shuffled
    (repeatably, by ``seed``), cut into batches, shuffled again; each batch padded to its own
    longest sentence. A remainder smaller than a batch is left for the next round."""
    _checks.check_int("batch_size", batch_size)
    _checks.check_device(device)
    if batch_size > len(pairs):
        raise ValueError(f"batch_size={batch_size} is more than the {len(pairs)} pairs")
    rng = random.Random(seed)
    order = list(range(len(pairs)))
    while True:
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield translation_batch([pairs[i] for i in order[start: start + batch_size]],
                                    src_vocab, tgt_vocab, device=device)


# --- Chapter 16: instructions about the course's sentences, as conversations ---------------------
#
# Each instruction asks something about one sentence of the course's languages: translate a
# command of chapter 10's grammar, say whether a sentence belongs to chapter 9's command language,
# repeat a command, or say its words in reverse order. A training conversation holds one or two
# exchanges (a user's instruction, the assistant's answer), sometimes after a system message; a
# validation conversation holds one, about a sentence that no training conversation mentions.

#: Each task and the wordings of its instruction; ``{}`` is where the sentence goes.
INSTRUCTION_TASKS: dict[str, tuple[str, ...]] = {
    "translate": ("translate: {}", "translate this command: {}", "what is {} in the other "
                                                                 "language?"),
    "is_command": ("is this a command? {}", "answer yes or no: is {} a command?"),
    "repeat": ("repeat: {}", "say this again: {}"),
    "reverse": ("reverse the words: {}", "say {} backwards"),
}
#: The system message of the conversations that have one.
INSTRUCTION_SYSTEM = "answer in as few words as you can."


def instruction_answer(task: str, sentence: str) -> str:
    """The answer to ``task`` about ``sentence``: the translation (``translate_command``),
    ``"yes"`` or ``"no"`` (:func:`is_command`), the sentence, or its words reversed.

    >>> instruction_answer("reverse", "open my photos")
    'photos my open'

    Raises:
        ValueError: an unknown task, or a sentence ``translate_command`` cannot translate.
    """
    _checks.check_type("task", task, str, "a str")
    _checks.check_type("sentence", sentence, str, "a str")
    if task not in INSTRUCTION_TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {list(INSTRUCTION_TASKS)}")
    if task == "translate":
        return translate_command(sentence)
    if task == "is_command":
        return "yes" if is_command(sentence) else "no"
    words = tokenize(sentence)
    return " ".join(words[::-1] if task == "reverse" else words)


def _not_a_command(rng: random.Random, sentence: str) -> str:
    """A near miss of chapter 9's language: the cue of another far word after *ran*."""
    words = sentence.split()
    far = next(w for w in words if w in CUES)
    cue = rng.choice([c for f, c in sorted(CUES.items()) if f != far and c != "please"])
    at = words.index("ran") + 1
    words[at:] = [cue, "please"]
    return " ".join(words)


def _instruction_pools(seed: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Distinct sentences for training and for validation, per source, none in both."""
    rng = random.Random(seed)
    commands: dict[str, None] = {}
    while len(commands) < 1200:
        sentence = _command(rng)
        if len(sentence.split()) <= 8:
            commands.setdefault(sentence, None)
    ninth_train, ninth_val = command_splits(400, 200, seed=seed, max_distance=6)
    pool = list(commands)
    rng.shuffle(pool)
    return ({"commands": pool[300:], "ninth": ninth_train},
            {"commands": pool[:300], "ninth": ninth_val})


def _exchange(rng: random.Random, pool: dict[str, list[str]], task: str,
              wordings: Sequence[str]) -> list[dict[str, str]]:
    if task == "is_command":
        kind = rng.randrange(3)      # a command of chapter 9, a near miss, a chapter 10 command
        sentence = rng.choice(pool["ninth"] if kind < 2 else pool["commands"])
        sentence = _not_a_command(rng, sentence) if kind == 1 else sentence
    else:
        sentence = rng.choice(pool["commands"])
    return [{"role": "user", "content": rng.choice(wordings).format(sentence)},
            {"role": "assistant", "content": instruction_answer(task, sentence)}]


def _check_tasks(tasks: object) -> list[str]:
    """``tasks`` as a list of :data:`INSTRUCTION_TASKS` names (all of them for ``None``)."""
    tasks = list(INSTRUCTION_TASKS) if tasks is None else tasks
    if isinstance(tasks, str) or not isinstance(tasks, Sequence):
        raise TypeError(f"tasks must be a list of task names, got {type(tasks).__name__}")
    if not tasks:
        raise ValueError(f"tasks is empty; the tasks are {list(INSTRUCTION_TASKS)}")
    for task in tasks:
        if task not in INSTRUCTION_TASKS:
            raise ValueError(f"unknown task {task!r}; the tasks are {list(INSTRUCTION_TASKS)}")
    return list(tasks)


def instruction_splits(num_train: int, num_val: int, *, seed: int = 0,
                       tasks: Sequence[str] | None = None, max_exchanges: int = 2,
                       system_rate: float = 0.25
                       ) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
    """Conversations for instruction tuning: ``num_train`` to train on and ``num_val`` held
    out, the same for the same seed.

    A training conversation has 1 to ``max_exchanges`` exchanges (the user's instruction and
    the assistant's :func:`instruction_answer`), after ``INSTRUCTION_SYSTEM`` in a
    ``system_rate`` share of them. A validation conversation has one exchange and no system
    message, so that its last message is the answer to score; the tasks take turns. No
    sentence of a validation conversation appears in any training conversation.

    >>> instruction_splits(0, 1, seed=3)[1]  # doctest: +NORMALIZE_WHITESPACE
    [[{'role': 'user', 'content': 'translate this command: hide all reports please'},
      {'role': 'assistant', 'content': 'bo raporti tuta kasu'}]]

    Raises:
        TypeError, ValueError: a count that is not a non-negative int, an unknown task, a
            ``max_exchanges`` below 1, a ``system_rate`` outside ``[0, 1]``.
    """
    _checks.check_int("num_train", num_train, low=0)
    _checks.check_int("num_val", num_val, low=0)
    _checks.check_int("seed", seed, low=0)
    _checks.check_int("max_exchanges", max_exchanges)
    _checks.check_number("system_rate", system_rate, low=0.0)
    if system_rate > 1:
        raise ValueError(f"system_rate must be at most 1, got {system_rate}")
    tasks = _check_tasks(tasks)
    train_pool, val_pool = _instruction_pools(seed)
    rng = random.Random(seed + 1)
    train = []
    for _ in range(num_train):
        messages = ([{"role": "system", "content": INSTRUCTION_SYSTEM}]
                    if rng.random() < system_rate else [])
        for _ in range(rng.randint(1, max_exchanges)):
            task = rng.choice(tasks)
            messages += _exchange(rng, train_pool, task, INSTRUCTION_TASKS[task])
        train.append(messages)
    val = [_exchange(rng, val_pool, task, INSTRUCTION_TASKS[task])
           for task in (tasks[n % len(tasks)] for n in range(num_val))]
    return train, val


# --- Chapter 17: preference pairs, a right answer against a near miss ----------------------------
#
# Each pair is one of chapter 16's instructions with its right answer (chosen) and a near miss
# (rejected) that a model half-way there would write: a translation with the verb first, where the
# source has it; the other answer to "is this a command?"; a repeat with a word left out; a
# reversal that reverses nothing. The pairs are TRL's conversational preference format.

def _near_miss(rng: random.Random, task: str, answer: str) -> str:
    words = answer.split()
    if task == "translate":                     # the verb first, in the source's order
        return " ".join([words[-1], *words[:-1]])
    if task == "is_command":
        return "no" if answer == "yes" else "yes"
    if task == "reverse" and words[::-1] != words:
        return " ".join(words[::-1])           # the sentence as it was, not reversed
    del words[rng.randrange(len(words))]        # a word left out
    return " ".join(words)


def _preference_pair(rng: random.Random, pool: dict[str, list[str]],
                     task: str) -> dict[str, list[dict[str, str]]]:
    user, assistant = _exchange(rng, pool, task, INSTRUCTION_TASKS[task])
    rejected = _near_miss(rng, task, assistant["content"])
    return {"prompt": [user], "chosen": [assistant],
            "rejected": [{"role": "assistant", "content": rejected}]}


def preference_splits(num_train: int, num_val: int, *, seed: int = 0,
                      tasks: Sequence[str] | None = None
                      ) -> tuple[list[dict[str, list]], list[dict[str, list]]]:
    """Preference pairs for DPO, ``num_train`` to train on and ``num_val`` held out, the same
    for the same seed: ``{"prompt": [user], "chosen": [assistant], "rejected": [assistant]}``
    (TRL's conversational format), the chosen answer :func:`instruction_answer`'s, the
    rejected one a near miss of it (never equal). Training pairs draw their task at random,
    held-out pairs take the tasks in turn; no sentence of a held-out pair is in a training
    pair, nor in :func:`instruction_splits`' training conversations of the same seed.

    Raises:
        TypeError, ValueError: a count or seed that is not a non-negative int, an unknown
            task.
    """
    _checks.check_int("num_train", num_train, low=0)
    _checks.check_int("num_val", num_val, low=0)
    _checks.check_int("seed", seed, low=0)
    tasks = _check_tasks(tasks)
    train_pool, val_pool = _instruction_pools(seed)
    rng = random.Random(seed + 2)
    train = [_preference_pair(rng, train_pool, rng.choice(tasks)) for _ in range(num_train)]
    val = [_preference_pair(rng, val_pool, tasks[n % len(tasks)]) for n in range(num_val)]
    return train, val


def preference_pairs(num_pairs: int, *, seed: int = 0,
                     tasks: Sequence[str] | None = None) -> list[dict[str, list]]:
    """``num_pairs`` training pairs of :func:`preference_splits`."""
    return preference_splits(num_pairs, 0, seed=seed, tasks=tasks)[0]


# --- Chapter 17: a task whose answer a program checks, and rewards ------------------------------
#
# GRPO learns from rewards that a Python function computes. The rows follow TRL's format for
# GRPOTrainer: a "prompt" (the user's message, conversational) and extra columns ("answer",
# "task") that the trainer passes on to every reward function as keyword arguments, repeated for
# each of a prompt's completions. A reward function takes ``completions`` (the replies, strings
# or TRL's one-message lists) and returns one float per completion.

def verifiable_splits(num_train: int, num_val: int, *, seed: int = 0,
                      tasks: Sequence[str] | None = None
                      ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Prompts of chapter 16's tasks with the answer a program checks, ``num_train`` to learn
    from and ``num_val`` held out, the same for the same seed.

    Each row is ``{"prompt": [{"role": "user", "content": ...}], "answer": str, "task": str}``
    (:func:`instruction_answer` gives the answer); the tasks take turns. The sentences come from
    the pools of :func:`instruction_splits` with the same seed: the training prompts from its
    training pool, the held-out ones from its validation pool, so a model fine-tuned on
    ``instruction_splits(..., seed=seed)`` has never seen a held-out sentence.

    >>> verifiable_splits(1, 0, tasks=["reverse"])[0]  # doctest: +NORMALIZE_WHITESPACE
    [{'prompt': [{'role': 'user', 'content': 'reverse the words: copy my new logs please'}],
      'answer': 'please logs new my copy', 'task': 'reverse'}]

    Raises:
        TypeError, ValueError: a count that is not a non-negative int, an unknown task.
    """
    _checks.check_int("num_train", num_train, low=0)
    _checks.check_int("num_val", num_val, low=0)
    _checks.check_int("seed", seed, low=0)
    tasks = _check_tasks(tasks)
    train_pool, val_pool = _instruction_pools(seed)
    rng = random.Random(seed + 2)

    def rows(count: int, pool: dict[str, list[str]]) -> list[dict[str, object]]:
        out = []
        for n in range(count):
            task = tasks[n % len(tasks)]
            user, reply = _exchange(rng, pool, task, INSTRUCTION_TASKS[task])
            out.append({"prompt": [user], "answer": reply["content"], "task": task})
        return out

    return rows(num_train, train_pool), rows(num_val, val_pool)


def _replies(completions: object) -> list[str]:
    """The reply texts of ``completions``: strings, or TRL's conversational completions (each a
    list holding one ``{"role": "assistant", "content": str}``)."""
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a list of replies (strings), got "
                        f"{type(completions).__name__}")
    replies = []
    for i, completion in enumerate(completions):
        if (isinstance(completion, Sequence) and not isinstance(completion, str)
                and len(completion) == 1 and isinstance(completion[0], dict)):
            completion = completion[0].get("content")    # TRL's conversational form
        _checks.check_type(f"completions[{i}]", completion, str, "a str")
        replies.append(completion)
    return replies


def _answers(answer: object, count: int) -> list[str]:
    if isinstance(answer, str) or not isinstance(answer, Sequence):
        raise TypeError(f"answer must be a list of strings, one per completion, got "
                        f"{type(answer).__name__}")
    if len(answer) != count:
        raise ValueError(f"answer has {len(answer)} entries and completions {count}: give one "
                         f"answer per completion")
    for i, text in enumerate(answer):
        _checks.check_type(f"answer[{i}]", text, str, "a str")
    return list(answer)


def reward_exact(completions: Sequence[str], answer: Sequence[str],
                 **kwargs: object) -> list[float]:
    """The verifiable reward: 1.0 where the reply's words are the answer's, else 0.0.

    A reward function as TRL's ``GRPOTrainer`` calls it (other columns arrive in ``kwargs``).

    >>> reward_exact(["photos my open", " photos  my open ", "photos"], ["photos my open"] * 3)
    [1.0, 1.0, 0.0]
    """
    replies = _replies(completions)
    answers = _answers(answer, len(replies))
    return [float(reply.split() == right.split()) for reply, right in zip(replies, answers)]


def reward_overlap(completions: Sequence[str], answer: Sequence[str],
                   **kwargs: object) -> list[float]:
    """A reward that can be gamed: the share of the answer's distinct words that the reply
    contains somewhere. Meant as partial credit, it costs nothing to write more words, so a
    reply that lists many words scores as well as the right one.

    >>> reward_overlap(["photos my open", "open", "my photos open open my photos"],
    ...                ["photos my open"] * 3)
    [1.0, 0.3333333333333333, 1.0]
    """
    replies = _replies(completions)
    answers = _answers(answer, len(replies))
    rewards = []
    for reply, right in zip(replies, answers):
        wanted = set(right.split())
        rewards.append(len(wanted & set(reply.split())) / len(wanted) if wanted else 0.0)
    return rewards


def reward_length(completions: Sequence[str], **kwargs: object) -> list[float]:
    """A reward that pays for length: the number of words in the reply, whatever they say.

    >>> reward_length(["a b c", "", "one"])
    [3.0, 0.0, 1.0]
    """
    return [float(len(reply.split())) for reply in _replies(completions)]
