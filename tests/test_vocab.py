"""Tokens, the vocabulary and one-hot vectors (minitransformer.vocab, chapter 1)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitransformer import Vocabulary, one_hot, tokenize

COMMANDS = ["Show me my directories please.", "Show me my files please.",
            "Show me my photos please."]


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("Show me my files please.") == ["show", "me", "my", "files", "please"]
    assert tokenize("Check, whether the battery ran down?!") == [
        "check", "whether", "the", "battery", "ran", "down"]
    assert tokenize("don't stop") == ["don't", "stop"]
    assert tokenize("") == []


def test_tokenize_rejects_non_strings():
    with pytest.raises(TypeError, match="list"):
        tokenize(["show", "me"])


def test_vocabulary_from_sentences_is_sorted_and_unique():
    vocab = Vocabulary.from_sentences(COMMANDS)
    assert vocab.words == ["directories", "files", "me", "my", "photos", "please", "show"]
    assert len(vocab) == 7
    assert "files" in vocab and "battery" not in vocab
    assert vocab.index("my") == 3
    assert vocab[3] == "my"
    assert list(vocab) == vocab.words


def test_encode_and_decode_round_trip():
    vocab = Vocabulary.from_sentences(COMMANDS)
    ids = vocab.encode("Show me my files please.")
    assert ids == [6, 2, 3, 1, 5]
    assert vocab.encode(["my", "photos"]) == [3, 4]
    assert vocab.decode(ids) == ["show", "me", "my", "files", "please"]


def test_unknown_word_raises_key_error_naming_it():
    vocab = Vocabulary(["find", "my", "files"])
    with pytest.raises(KeyError, match="'photos'"):
        vocab.index("photos")
    with pytest.raises(KeyError, match="'music'"):
        vocab.encode("find my music")


def test_decode_rejects_ids_outside_the_vocabulary():
    vocab = Vocabulary(["find", "my", "files"])
    with pytest.raises(KeyError, match="token id 3 is outside"):
        vocab.decode([0, 3])
    with pytest.raises(KeyError, match="token id -1"):
        vocab.decode([-1])


def test_vocabulary_rejects_bad_words_and_single_strings():
    with pytest.raises(TypeError, match="non-empty strings"):
        Vocabulary(["ok", ""])
    with pytest.raises(TypeError, match="non-empty strings"):
        Vocabulary(["ok", 3])
    with pytest.raises(TypeError, match="single string"):
        Vocabulary.from_sentences("Show me my files please.")


def test_one_hot_places_a_single_one_per_row():
    matrix = one_hot([0, 3, 2], 4)
    assert matrix.shape == (3, 4)
    assert matrix.dtype == np.float64
    np.testing.assert_array_equal(matrix, [[1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]])
    assert one_hot([], 5).shape == (0, 5)


@given(st.integers(1, 30).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n - 1), max_size=20))))
def test_one_hot_rows_pick_out_rows_of_any_matrix(size_and_ids):
    size, ids = size_and_ids
    matrix = one_hot(ids, size)
    assert (matrix.sum(axis=1) == 1).all()
    assert matrix.argmax(axis=1).tolist() == ids
    table = np.arange(size * 3, dtype=float).reshape(size, 3)
    np.testing.assert_array_equal(matrix @ table, table[ids])


def test_one_hot_rejects_bad_indices_and_sizes():
    with pytest.raises(ValueError, match=r"index 4 is outside \[0, 4\)"):
        one_hot([1, 4], 4)
    with pytest.raises(ValueError, match=r"index -1 is outside"):
        one_hot([-1], 4)
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        one_hot([0], 0)
    with pytest.raises(TypeError, match="size must be an int"):
        one_hot([0], 3.0)
    with pytest.raises(ValueError, match="integers"):
        one_hot([0.5], 3)
    with pytest.raises(ValueError, match="flat list"):
        one_hot([[0, 1]], 3)


def test_specials_take_the_first_ids_and_words_follow_sorted():
    vocab = Vocabulary.from_sentences(COMMANDS, specials=("<pad>", "<bos>", "<eos>"))
    assert vocab.words[:3] == ["<pad>", "<bos>", "<eos>"]
    assert [vocab.index(t) for t in ("<pad>", "<bos>", "<eos>")] == [0, 1, 2]
    assert vocab.words[3:] == Vocabulary.from_sentences(COMMANDS).words
    assert vocab.specials == ("<pad>", "<bos>", "<eos>")
    assert len(vocab) == 3 + 7
    assert vocab.decode([1, vocab.index("files"), 2]) == ["<bos>", "files", "<eos>"]


def test_specials_keep_their_given_order_and_a_repeated_word_counts_once():
    vocab = Vocabulary(["b", "<eos>", "a"], specials=("<eos>", "<bos>"))
    assert vocab.words == ["<eos>", "<bos>", "a", "b"]


def test_without_specials_nothing_changes():
    assert Vocabulary(["b", "a"]).specials == ()
    assert Vocabulary(["b", "a"]).words == ["a", "b"]


def test_bad_specials_are_rejected():
    with pytest.raises(TypeError, match="single string"):
        Vocabulary(["a"], specials="<eos>")
    with pytest.raises(TypeError, match="non-empty strings"):
        Vocabulary(["a"], specials=("",))
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary(["a"], specials=("<eos>", "<eos>"))
