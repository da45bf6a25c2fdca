"""Sequence models as lookup tables: first and second order Markov models (chapter 2) and the
second-order-with-skips model whose features can be masked (chapter 3).

Everything here is numpy: the tables are small enough to read cell by cell. Rows are looked up
by the index scheme of :class:`~minitransformer.vocab.Vocabulary`: the word with index ``i`` owns
row ``i`` of a first-order table, and the pair (earlier word ``a``, most recent word ``b``) owns
row ``a * N + b`` of a second-order table.

All three tables are estimated the same way (``_estimate``): walk every sentence, and at each
step add the sentence's share of the traffic to the cell (context row, next word); then divide each
row by its total. The models differ only in what the context row of a step is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from minitransformer._checks import check_int
from minitransformer.vocab import Vocabulary, tokenize


def _check_vocab(vocab: object) -> Vocabulary:
    if not isinstance(vocab, Vocabulary):
        raise TypeError(f"vocab must be a Vocabulary, got {type(vocab).__name__}")
    return vocab


def _word_ids(words: str | Sequence[str], vocab: Vocabulary, what: str) -> list[int]:
    """The ids of a sentence given as text or as a list of words; ``KeyError`` names a stranger."""
    tokens = tokenize(words) if isinstance(words, str) else list(words)
    ids = []
    for word in tokens:
        if word not in vocab:
            raise KeyError(f"{word!r} in {what} is not in the vocabulary {vocab.words}")
        ids.append(vocab.index(word))
    return ids


def _corpus(sentences, vocab, weights) -> tuple[list[list[int]], np.ndarray]:
    """Token ids of every sentence and each sentence's share of the traffic."""
    _check_vocab(vocab)
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of sentences, not a single string")
    sentences = list(sentences)
    if not sentences:
        raise ValueError("sentences is empty: a model needs at least one sentence")
    ids = [_word_ids(s, vocab, f"sentence {i} ({s!r})") for i, s in enumerate(sentences)]
    if weights is None:
        return ids, np.full(len(sentences), 1.0 / len(sentences))
    shares = np.asarray(weights, dtype=float)
    if shares.shape != (len(sentences),):
        raise ValueError(f"weights must give one number per sentence: got shape {shares.shape} "
                         f"for {len(sentences)} sentences")
    if not np.all(np.isfinite(shares)) or np.any(shares < 0):
        raise ValueError(f"weights must be finite and non-negative, got {shares.tolist()}")
    if shares.sum() <= 0:
        raise ValueError(f"weights must sum to a positive number, got {shares.tolist()}")
    return ids, shares / shares.sum()


def _pair_row(earlier: int, recent: int, n: int) -> int:
    """The row of the word pair (``earlier``, ``recent``) in a table with N * N rows."""
    return earlier * n + recent


# A model's steps: for one sentence (token ids) and the vocabulary size N, yield
# (context row, id of the next word) for every place where the model makes a prediction.
_Steps = Callable[[list[int], int], Iterator[tuple[int, int]]]


def _first_order_steps(ids: list[int], n: int) -> Iterator[tuple[int, int]]:
    for current, following in zip(ids, ids[1:]):
        yield current, following


def _second_order_steps(ids: list[int], n: int) -> Iterator[tuple[int, int]]:
    for earlier, recent, following in zip(ids, ids[1:], ids[2:]):
        yield _pair_row(earlier, recent, n), following


def _skip_steps(ids: list[int], n: int) -> Iterator[tuple[int, int]]:
    for t in range(1, len(ids) - 1):
        for earlier in set(ids[:t]):  # each distinct earlier word once
            yield _pair_row(earlier, ids[t], n), ids[t + 1]


def _estimate(sentences, vocab, weights, steps: _Steps, context_words: int) -> np.ndarray:
    """Count each (context row, next word) step weighted by its sentence's share, then make each
    row a distribution. Returns shape ``(N ** context_words, N)``; a row never seen stays zeros."""
    ids, shares = _corpus(sentences, vocab, weights)
    n = len(vocab)
    counts = np.zeros((n ** context_words, n))
    for sentence, share in zip(ids, shares):
        for row, following in steps(sentence, n):
            counts[row, following] += share
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def transition_matrix(sentences: Sequence[str | Sequence[str]], vocab: Vocabulary,
                      weights: Sequence[float] | None = None) -> np.ndarray:
    """The first-order Markov model: how likely each word is to follow each word.

    Args:
        sentences: the corpus, each sentence a string (tokenized) or a list of words.
        vocab: the N words; every word of every sentence must be in it.
        weights: each sentence's share of the traffic, one non-negative number per sentence
            (normalized, so ``[2, 3, 5]`` and ``[0.2, 0.3, 0.5]`` agree). Default: equal shares.

    Returns:
        float array of shape ``(N, N)``: row = current word, column = next word. The row of a
        word that is followed by something sums to 1; the row of a word never followed by
        anything (here: the last word of every sentence) is all zeros.
    """
    return _estimate(sentences, vocab, weights, _first_order_steps, context_words=1)


def second_order_matrix(sentences: Sequence[str | Sequence[str]], vocab: Vocabulary,
                        weights: Sequence[float] | None = None) -> np.ndarray:
    """The second-order Markov model: the next word given the two most recent words.

    Args: as for :func:`transition_matrix`.

    Returns:
        float array of shape ``(N * N, N)``. The row of the pair (earlier word ``a``, most recent
        word ``b``) is ``a * N + b``; it sums to 1 when the pair is followed by something in the
        corpus and is all zeros otherwise.
    """
    return _estimate(sentences, vocab, weights, _second_order_steps, context_words=2)


class SkipModel:
    """The second-order-with-skips model: pairs of (any earlier word, most recent word) vote.

    Args: ``sentences``, ``vocab`` and ``weights`` as for :func:`transition_matrix`.

    Attributes:
        vocab: the vocabulary, N words.
        table: float array of shape ``(N * N, N)``. Row ``w * N + r`` is the feature "the most
            recent word is r and w appeared somewhere earlier". Among the occurrences of r
            (weighted by their sentence's share) that have w somewhere before them, column ``c``
            holds the fraction followed by word c. A feature that never occurs is a row of zeros.

    The rows are votes, not probabilities: to predict what follows a prefix, every active feature
    adds its row (see :meth:`votes`).
    """

    def __init__(self, sentences: Sequence[str | Sequence[str]], vocab: Vocabulary,
                 weights: Sequence[float] | None = None):
        self.table = _estimate(sentences, vocab, weights, _skip_steps, context_words=2)
        self.vocab = vocab

    def __repr__(self) -> str:
        n = len(self.vocab)
        return f"SkipModel({n} words, table of shape ({n * n}, {n}))"

    def feature_index(self, earlier: str, recent: str) -> int:
        """The row of the feature (``earlier`` seen before, ``recent`` most recent):
        ``w * N + r``."""
        w, r = _word_ids([earlier, recent], self.vocab, "the feature")
        return _pair_row(w, r, len(self.vocab))

    def features(self, prefix: str | Sequence[str]) -> np.ndarray:
        """The active features of a prefix: each distinct earlier word paired with the last word.

        Args:
            prefix: the words so far (a string or a list of words), at least two of them.

        Returns:
            float array of shape ``(N * N,)``: 1 at row ``w * N + r`` for every distinct word w
            before the most recent word r, 0 elsewhere. A word seen twice still counts once.
        """
        ids = _word_ids(prefix, self.vocab, "the prefix")
        if len(ids) < 2:
            raise ValueError(f"a prefix needs at least two words (an earlier one and the most "
                             f"recent one), got {len(ids)}: {prefix!r}")
        n = len(self.vocab)
        active = np.zeros(n * n)
        recent = ids[-1]
        for earlier in set(ids[:-1]):
            active[_pair_row(earlier, recent, n)] = 1.0
        return active

    def votes(self, prefix: str | Sequence[str], mask: np.ndarray | None = None) -> np.ndarray:
        """The vote total for each next word: the sum of the table rows of the active features.

        Args:
            prefix: the words so far, at least two.
            mask: optional array of shape ``(N * N,)`` (boolean, or numbers such as 0 and 1)
                multiplied element-wise into the feature vector first; 0/False hides a feature.

        Returns:
            float array of shape ``(N,)``: ``(features(prefix) * mask) @ table``.
        """
        active = self.features(prefix)
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != active.shape:
                raise ValueError(f"mask must have shape {active.shape} (one entry per feature), "
                                 f"got {mask.shape}")
            if mask.dtype.kind not in "biuf":
                raise TypeError(f"mask must hold booleans or numbers, got dtype {mask.dtype}")
            active = active * mask
        return active @ self.table


def walk_chain(matrix: np.ndarray, vocab: Vocabulary, start: str, *,
               rng: np.random.Generator, max_len: int = 20) -> list[str]:
    """Generate a sentence by walking a first-order Markov model.

    Args:
        matrix: a transition matrix of shape ``(N, N)`` with non-negative rows (as made by
            :func:`transition_matrix`).
        vocab: its N words.
        start: the first word.
        rng: a numpy ``Generator``, e.g. ``np.random.default_rng(0)``, so the walk is repeatable.
        max_len: stop after this many words.

    Returns:
        The words, starting with ``start``. The walk stops early at a word whose row is all
        zeros (a word never followed by anything).

    Raises:
        TypeError: ``vocab`` is not a Vocabulary, ``rng`` not a numpy Generator, ``max_len`` not
            an int.
        ValueError: a matrix of the wrong shape or with negative or non-finite entries, or
            ``max_len`` below 1.
        KeyError: ``start`` is not in the vocabulary.
    """
    _check_vocab(vocab)
    matrix = np.asarray(matrix, dtype=float)
    n = len(vocab)
    if matrix.shape != (n, n):
        raise ValueError(f"matrix must have shape ({n}, {n}) for a vocabulary of {n} words, "
                         f"got {matrix.shape}")
    if not np.all(np.isfinite(matrix)) or np.any(matrix < 0):
        raise ValueError("matrix must hold finite, non-negative numbers")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    max_len = check_int("max_len", max_len)
    current = _word_ids([start], vocab, "start")[0]
    words = [vocab[current]]
    while len(words) < max_len:
        row = matrix[current]
        total = row.sum()
        if total == 0:
            break
        current = int(rng.choice(n, p=row / total))
        words.append(vocab[current])
    return words
