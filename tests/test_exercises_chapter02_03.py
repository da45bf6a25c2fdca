"""The checkers of chapters 2 and 3 (minitransformer.exercises.chapter02 and chapter03)."""

import numpy as np
import pytest

from minitransformer import Vocabulary, one_hot, tokenize
from minitransformer.exercises import chapter02, chapter03
from minitransformer.exercises.chapter02 import (
    check_build_transition_matrix,
    check_next_word_probabilities,
    check_second_order_row,
)
from minitransformer.exercises.chapter03 import (
    check_active_features,
    check_design_mask,
    check_masked_votes,
)


def _stub(*args):
    raise NotImplementedError


def _crashes(*args):
    raise ZeroDivisionError("oops")


# --- learner-style solutions, right and wrong -------------------------------------------------

def _learner_transition_matrix(sentences, vocab):
    n = len(vocab)
    counts = np.zeros((n, n))
    for sentence in sentences:
        words = tokenize(sentence)
        for a, b in zip(words, words[1:]):
            counts[vocab.index(a), vocab.index(b)] += 1
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def test_build_transition_matrix(capsys):
    assert check_build_transition_matrix(_learner_transition_matrix)
    assert capsys.readouterr().out == "✓ all 4 checks passed\n"
    raw = chapter02._pair_counts
    assert not check_build_transition_matrix(raw)
    assert "Hint: these are the raw counts" in capsys.readouterr().out

    def nan_rows(sentences, vocab):  # divides by zero for a word never followed
        counts = chapter02._pair_counts(sentences, vocab)
        with np.errstate(invalid="ignore"):
            return counts / counts.sum(axis=1, keepdims=True)

    assert not check_build_transition_matrix(nan_rows)
    assert capsys.readouterr().out.startswith("✗ case 1: ")


def test_next_word_probabilities(capsys):
    def by_matmul(matrix, vocab, word):
        return one_hot([vocab.index(word)], len(vocab))[0] @ matrix

    assert check_next_word_probabilities(by_matmul)
    assert capsys.readouterr().out == "✓ all 5 checks passed\n"
    assert not check_next_word_probabilities(lambda m, v, w: m[:, v.index(w)])
    assert "Hint: you pulled out a column" in capsys.readouterr().out
    assert not check_next_word_probabilities(lambda m, v, w: one_hot([v.index(w)], len(v)) @ m)
    assert "(expected shape (7,) but got shape (1, 7))" in capsys.readouterr().out


def test_second_order_row(capsys):
    assert check_second_order_row(lambda m, v, a, b: m[v.index(a) * len(v) + v.index(b)])
    assert capsys.readouterr().out == "✓ all 7 checks passed\n"
    assert not check_second_order_row(lambda m, v, a, b: m[v.index(b) * len(v) + v.index(a)])
    assert "Hint: the pair is in the wrong order" in capsys.readouterr().out
    assert not check_second_order_row(lambda m, v, a, b: m[v.index(b)])
    assert "Hint: that is row `recent` only" in capsys.readouterr().out
    # multiplying the two indices used to land on row `recent` in the first case, and got the
    # first-order hint
    assert not check_second_order_row(lambda m, v, a, b: m[v.index(a) * v.index(b)])
    assert "Hint: the row is a * N + b, not a * b" in capsys.readouterr().out
    assert not check_second_order_row(lambda m, v, a, b: m[v.index(a) + v.index(b)])
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: ") and "Hint" not in out


def test_active_features(capsys):
    def learner(prefix, vocab):
        n = len(vocab)
        features = np.zeros(n * n)
        for word in prefix[:-1]:
            features[vocab.index(word) * n + vocab.index(prefix[-1])] = 1
        return features

    assert check_active_features(learner)
    assert capsys.readouterr().out == "✓ all 5 checks passed\n"
    assert not check_active_features(chapter03._counts_repeats)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3: ") and "a word seen twice earlier still gives a 1" in out
    assert not check_active_features(lambda p, v: learner(p, v).astype(int))
    assert "(expected float values but got integer values (int64))" in capsys.readouterr().out


def test_active_features_leaving_out_a_repeated_recent_word(capsys):
    """set(prefix) - {prefix[-1]} drops (b, b) from [b, d, b]; it used to be told it had built
    the plain second-order feature."""
    def without_recent(prefix, vocab):
        n = len(vocab)
        features = np.zeros(n * n)
        for word in set(prefix) - {prefix[-1]}:
            features[vocab.index(word) * n + vocab.index(prefix[-1])] = 1.0
        return features

    assert not check_active_features(without_recent)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 4: for input (['b', 'd', 'b'], ")
    assert "second-order" not in out
    assert out.rstrip("\n").endswith(
        "Hint: the most recent word pairs with itself too when it also appears earlier: in "
        "[b, d, b] the words before r = b are b and d, so (b, b) is active as well as (d, b)")


def test_masked_votes(capsys):
    assert check_masked_votes(lambda f, m, t: (f * m) @ t)
    assert capsys.readouterr().out == "✓ all 5 checks passed\n"
    assert not check_masked_votes(lambda f, m, t: f @ t)
    assert "Hint: the mask was not applied" in capsys.readouterr().out
    assert not check_masked_votes(lambda f, m, t: (f * ~m) @ t)
    assert "Hint: the mask is the wrong way round" in capsys.readouterr().out


def test_design_mask(capsys):
    def learner(vocab, keep):
        mask = np.full(len(vocab) ** 2, False)
        for earlier, recent in keep:
            mask[vocab.index(earlier) * len(vocab) + vocab.index(recent)] = True
        return mask

    assert check_design_mask(learner)
    assert capsys.readouterr().out == "✓ all 5 checks passed\n"
    assert not check_design_mask(lambda v, k: learner(v, k).astype(float))
    assert "(expected boolean values but got float values (float64))" in capsys.readouterr().out
    assert not check_design_mask(lambda v, k: ~learner(v, k))
    assert "Hint: the mask is the wrong way round" in capsys.readouterr().out


def test_the_book_case_of_masked_votes_is_the_certain_one():
    features, mask, table = chapter03._votes_case(
        "check the battery log and find out whether it ran", chapter03._KEEP)
    votes = chapter03._masked_votes(features, mask, table)
    vocab = Vocabulary.from_sentences(chapter03._LOGS)
    assert {vocab[i]: votes[i] for i in np.flatnonzero(votes)} == {"down": 1.0}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the learner's 0 / 0
def test_rows_of_nan_from_dividing_zero_by_zero_get_their_hint(capsys):
    def divides_every_row(sentences, vocab):
        n = len(vocab)
        counts = np.zeros((n, n))
        for sentence in sentences:
            words = tokenize(sentence)
            for a, b in zip(words, words[1:]):
                counts[vocab.index(a), vocab.index(b)] += 1
        return counts / counts.sum(axis=1, keepdims=True)

    assert not check_build_transition_matrix(divides_every_row)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (['Find my files.', 'Find my photos.', ")
    assert "expected 0 but got nan" in out and "(your answer contains NaN)" in out
    assert out.endswith("where=totals > 0)\n") and "Hint: rows of NaN: " in out
