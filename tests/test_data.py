"""The command language and its batches (minitransformer.data, chapter 9)."""

import pytest
import torch

from minitransformer import Vocabulary, tokenize
from minitransformer.data import (
    CUES,
    EOS,
    MAX_DISTANCE,
    command_sentences,
    command_splits,
    cue_batch,
    far_word_distance,
    is_command,
    random_batches,
    shift_pairs,
    token_stream,
    window_batches,
)


@pytest.fixture(scope="module")
def splits():
    return command_splits(2000, 300, seed=0)


@pytest.fixture(scope="module")
def vocab(splits):
    train, val = splits
    return Vocabulary.from_sentences(train + val, specials=(EOS,))


def test_generator_is_deterministic_given_a_seed():
    assert command_sentences(50, seed=3) == command_sentences(50, seed=3)
    assert command_sentences(50, seed=3) != command_sentences(50, seed=4)
    assert command_splits(100, 20, seed=1) == command_splits(100, 20, seed=1)


def test_splits_are_distinct_and_do_not_overlap(splits):
    train, val = splits
    assert len(train) == 2000 and len(val) == 300
    assert len(set(train)) == len(train) and len(set(val)) == len(val)
    assert not set(train) & set(val)


def test_every_cue_is_decided_by_its_far_word_at_distance_3_or_more():
    distances = set()
    for sentence in command_sentences(3000, seed=0):
        words = tokenize(sentence)
        far_word, distance = far_word_distance(words)
        ran = words.index("ran")
        assert words[ran + 1] == CUES[far_word]
        assert words[ran - distance] == far_word
        assert distance >= 3
        assert not set(words[ran - 2: ran]) & set(CUES)
        distances.add(distance)
    assert distances == set(range(3, 13))


def test_the_two_words_before_ran_say_nothing_about_the_cue():
    contexts = {}
    for sentence in command_sentences(2000, seed=0):
        words = tokenize(sentence)
        ran = words.index("ran")
        contexts.setdefault(tuple(words[ran - 2: ran]), set()).add(words[ran + 1])
    assert all(cues == set(CUES.values()) for cues in contexts.values())


def test_validation_distances_are_seen_in_training(splits):
    train, val = splits
    seen = {far_word_distance(s)[1] for s in train}
    assert {far_word_distance(s)[1] for s in val} <= seen


def test_max_distance_is_checked():
    assert max(far_word_distance(s)[1] for s in command_sentences(500, max_distance=5)) == 5
    with pytest.raises(ValueError, match="at least 3"):
        command_sentences(5, max_distance=2)
    with pytest.raises(ValueError, match=f"at most {MAX_DISTANCE}"):
        command_sentences(5, max_distance=MAX_DISTANCE + 1)


def test_too_many_distinct_sentences_asked_for():
    with pytest.raises(ValueError, match="distinct sentences"):
        command_splits(5000, 10, max_distance=3)


def test_token_stream_joins_sentences_with_eos(vocab):
    stream = token_stream(["check the server if it ran hot please", "look at the program"],
                          vocab)
    eos = vocab.index(EOS)
    assert stream.dtype == torch.long and stream.ndim == 1
    assert (stream == eos).nonzero().flatten().tolist() == [8, 13]
    assert vocab.decode(stream[9:13].tolist()) == ["look", "at", "the", "program"]


def test_shift_pairs_moves_targets_one_to_the_left():
    windows = torch.arange(12).reshape(2, 6)
    inputs, targets = shift_pairs(windows)
    assert inputs.tolist() == [[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]]
    assert targets.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]]
    with pytest.raises(ValueError, match=r"\(B, T \+ 1\)"):
        shift_pairs(torch.arange(5))


def test_random_batches_are_shifted_windows_of_the_stream_and_repeatable():
    stream = torch.arange(100)
    make = lambda: random_batches(stream, batch_size=4, context_length=8,  # noqa: E731
                                  generator=torch.Generator().manual_seed(0))
    inputs, targets = next(make())
    assert inputs.shape == targets.shape == (4, 8)
    assert torch.equal(targets, inputs + 1)                   # consecutive ids: the next one
    assert torch.equal(inputs[:, 1:] - inputs[:, :-1], torch.ones(4, 7, dtype=torch.long))
    first, again = make(), make()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(next(first), next(again)))


def test_window_batches_predict_every_token_once():
    stream = torch.arange(50)
    batches = window_batches(stream, batch_size=2, context_length=8)
    inputs = torch.cat([b[0] for b in batches])
    targets = torch.cat([b[1] for b in batches])
    assert inputs.shape == (6, 8)
    assert targets.flatten().tolist() == list(range(1, 49))
    with pytest.raises(ValueError, match="too few"):
        window_batches(torch.arange(5), batch_size=2, context_length=8)
    with pytest.raises(TypeError, match="1-D long tensor"):
        window_batches(torch.zeros(50), batch_size=2, context_length=8)


def test_cue_batch_ends_each_row_at_ran(vocab):
    sentences = ["check the battery whether it ran down please",
                 "look at the program log and see if it ran please"]
    idx, position, cue, distance = cue_batch(sentences, vocab)
    assert idx.shape == (2, 11)
    assert idx[:, 0].tolist() == [vocab.index(EOS)] * 2
    assert [vocab[int(idx[row, position[row]])] for row in range(2)] == ["ran", "ran"]
    assert vocab.decode(cue.tolist()) == ["down", "please"]
    assert distance.tolist() == [3, 6]


def test_far_word_distance_rejects_other_sentences():
    with pytest.raises(ValueError, match="not a command"):
        far_word_distance("show me my files please")


def test_is_command_accepts_every_generated_sentence_and_nothing_else():
    assert all(is_command(s) for s in command_sentences(500, seed=2, max_distance=MAX_DISTANCE))
    for wrong in ["check the server if it ran down please",       # the battery's cue
                  "check the server if it ran hot",               # no please
                  "check the program if it ran please please",
                  "check server if it ran hot please",            # no "the"
                  "check the server ran hot please",              # far word next to ran
                  "check the server today log if it ran hot please",   # slots out of order
                  "look the server if it ran hot please",
                  "check the", ""]:
        assert not is_command(wrong), wrong
    assert is_command(tokenize("can you check the program if it ran please"))
