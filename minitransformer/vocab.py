"""Words to numbers and back: tokens, the vocabulary and one-hot vectors (chapter 1)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from minitransformer import _checks

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-case words, dropping punctuation.

    >>> tokenize("Show me my files please.")
    ['show', 'me', 'my', 'files', 'please']
    """
    if not isinstance(text, str):
        raise TypeError(f"tokenize expects a string, got {type(text).__name__}")
    return _WORD.findall(text.lower())


class Vocabulary:
    """A fixed list of words, each with an index: the word's position in sorted order.

    Args:
        words: the words; duplicates are dropped and the rest sorted, so the same words always
            get the same indices.
        specials: reserved tokens such as ``("<pad>", "<bos>", "<eos>")`` that take the first ids
            (0, 1, 2, ...) in the order given; the sorted words follow them. Default: none.

    ``len(vocab)`` is the number of words N (specials included), ``word in vocab`` tests
    membership, ``vocab[i]`` is the i-th word and ``vocab.words`` the full list.
    """

    def __init__(self, words: Iterable[str], *, specials: Sequence[str] = ()):
        words = list(words)
        if isinstance(specials, str):
            raise TypeError(f"specials must be a sequence of tokens, not the single string "
                            f"{specials!r}")
        specials = tuple(specials)
        for word in [*specials, *words]:
            if not isinstance(word, str) or not word:
                raise TypeError(f"vocabulary words must be non-empty strings, got {word!r}")
        if len(set(specials)) != len(specials):
            raise ValueError(f"specials must be distinct, got {specials}")
        self.specials: tuple[str, ...] = specials
        self.words: list[str] = [*specials, *sorted(set(words) - set(specials))]
        self._index = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def from_sentences(cls, sentences: Iterable[str], *,
                       specials: Sequence[str] = ()) -> "Vocabulary":
        """Build the vocabulary of every word that appears in ``sentences``, after ``specials``.

        >>> Vocabulary.from_sentences(["my files"], specials=("<eos>",)).words
        ['<eos>', 'files', 'my']
        """
        if isinstance(sentences, str):
            raise TypeError("from_sentences expects a list of sentences, not a single string")
        return cls((word for sentence in sentences for word in tokenize(sentence)),
                   specials=specials)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __getitem__(self, index: int) -> str:
        return self.words[index]

    def __iter__(self):
        return iter(self.words)

    def __repr__(self) -> str:
        return f"Vocabulary({self.words})"

    def index(self, word: str) -> int:
        """The index of ``word``; ``KeyError`` naming the word when it is not in the vocabulary."""
        try:
            return self._index[word]
        except KeyError:
            raise KeyError(f"{word!r} is not in the vocabulary {self.words}") from None

    def encode(self, text_or_tokens: str | Sequence[str]) -> list[int]:
        """Token ids of a sentence (a string, tokenized first) or of a list of words."""
        tokens = tokenize(text_or_tokens) if isinstance(text_or_tokens, str) else text_or_tokens
        return [self.index(word) for word in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The words of a list of token ids; ``KeyError`` naming an id outside ``[0, N)``."""
        words = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.words):
                raise KeyError(f"token id {i} is outside the vocabulary of {len(self.words)} words")
            words.append(self.words[i])
        return words


def one_hot(indices: Sequence[int], size: int) -> np.ndarray:
    """Stack the one-hot vectors of ``indices`` into a matrix.

    Args:
        indices: n token ids, each in ``[0, size)``.
        size: the vocabulary size N.

    Returns:
        float array of shape ``(n, N)`` with a single 1 in each row, at column ``indices[row]``.
    """
    size = _checks.check_int("size", size)
    ids = np.asarray(indices)
    if ids.ndim != 1:
        raise ValueError(f"indices must be a flat list of ids, got shape {ids.shape}")
    if ids.size == 0:
        return np.zeros((0, size))
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"indices must be integers, got {ids.tolist()}")
    bad = [int(i) for i in ids if not 0 <= i < size]
    if bad:
        raise ValueError(f"index {bad[0]} is outside [0, {size})")
    matrix = np.zeros((len(ids), size))
    matrix[np.arange(len(ids)), ids] = 1.0
    return matrix
