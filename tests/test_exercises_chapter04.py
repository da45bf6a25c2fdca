"""The checkers of chapter 4: they accept correct answers and explain the plausible wrong ones."""

import numpy as np
import pytest
import torch

from minitransformer import one_hot

from minitransformer.exercises.chapter04 import (check_attend, check_feature_weights,
                                                 check_feed_forward)

# --- correct solutions, written the way the book's solutions are ---------------------------


def attend(masks, seen, recent):
    query = torch.zeros(masks.shape[0])
    query[recent] = 1.0
    return seen * (query @ masks)


def feature_weights(present, absent, vocab_size):
    row = torch.zeros(vocab_size + 1)
    for i in present:
        row[i] = 1.0
    for i in absent:
        row[i] = -1.0
    row[vocab_size] = 1 - len(present)
    return row


def feed_forward(x, w1, b1, w2, b2):
    hidden = torch.relu(x @ w1 + b1)
    return hidden @ w2 + b2


CHECKERS = {
    "attend": (check_attend, attend),
    "feature_weights": (check_feature_weights, feature_weights),
    "feed_forward": (check_feed_forward, feed_forward),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_a_correct_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_crash_message_names_the_exception(capsys):
    check_attend(lambda *args: 1 / 0)
    assert "your function raised ZeroDivisionError: division by zero" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda masks, seen, recent: masks[recent].clone(), "multiply it element by element"),
    (lambda masks, seen, recent: seen * masks[:, recent], "you pulled out a column"),
    (lambda masks, seen, recent: seen + masks[recent], "applied by multiplying, not by adding"),
])
def test_attend_hints(wrong, hint, capsys):
    assert not check_attend(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case ") and hint in out.split("Hint: ", 1)[1]


def test_attend_seen_times_the_mask_matrix_gets_its_own_hint(capsys):
    """seen @ masks used to match the mask of "ran" on a table with one non-zero row, and got
    the hint for returning the whole mask; the chapter's table (every word attends to itself)
    tells the two apart."""
    assert not check_attend(lambda masks, seen, recent: seen @ masks)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: ")
    assert "that is the whole mask" not in out
    assert out.rstrip("\n").endswith(
        "Hint: seen @ masks adds up the masks of every word seen so far; the one-hot vector of "
        "the most recent word picks its mask alone (one_hot @ masks), and that mask then "
        "multiplies seen element by element")


def test_attend_cases_use_the_chapters_mask_matrix():
    from minitransformer.exercises.chapter04 import _VOCAB, _chapter_masks

    masks = _chapter_masks()
    ran = _VOCAB.index("ran")
    expected = torch.eye(len(_VOCAB))
    expected[ran, _VOCAB.encode(["battery", "program"])] = 1.0
    assert torch.equal(masks, expected)


def test_feature_weights_bias_fixed_at_minus_one(capsys):
    # the chapter's two features had two present words each, so a bias of -1
    def bias_minus_one(present, absent, vocab_size):
        row = feature_weights(present, absent, vocab_size)
        row[-1] = -1.0
        return row

    assert not check_feature_weights(bias_minus_one)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3: for input ([0, 2, 3], [], 5) ")
    assert out.rstrip("\n").endswith(
        "Hint: the bias is not always -1: the chapter's features had two present words, so "
        "1 - 2 = -1; in general it is 1 - len(present)")


def test_feature_weights_hints(capsys):
    def bias_minus_count(present, absent, vocab_size):
        row = feature_weights(present, absent, vocab_size)
        row[-1] = -len(present)
        return row

    def absent_ignored(present, absent, vocab_size):
        row = feature_weights(present, absent, vocab_size)
        row[absent] = 0.0
        return row

    assert not check_feature_weights(bias_minus_count)
    assert "Hint: with a bias of minus the number of present words" in capsys.readouterr().out
    assert not check_feature_weights(absent_ignored)
    assert "Hint: a word that must be absent needs weight -1" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, w1, b1, w2, b2: (x @ w1 + b1) @ w2 + b2, "the ReLU is missing"),
    (lambda x, w1, b1, w2, b2: (torch.relu(x @ w1) + b1) @ w2 + b2,
     "the ReLU comes after the bias"),
    (lambda x, w1, b1, w2, b2: torch.relu((x @ w1 + b1) @ w2 + b2),
     "belongs between the two layers"),
    (lambda x, w1, b1, w2, b2: torch.relu(x @ w1) @ w2 + b2, "a bias is missing"),
])
def test_feed_forward_hints(wrong, hint, capsys):
    assert not check_feed_forward(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def test_feed_forward_without_b2_gets_the_missing_bias_hint(capsys):
    # the chapter's b2 is 0: the random weights of case 4 are the first to show it
    assert not check_feed_forward(lambda x, w1, b1, w2, b2: torch.relu(x @ w1 + b1) @ w2)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 4: ")
    assert out.rstrip("\n").endswith(
        "Hint: a bias is missing: the output is relu(x @ w1 + b1) @ w2 + b2, with b2 added at "
        "the end")


def test_feed_forward_transposed_weights_are_reported(capsys):
    assert not check_feed_forward(lambda x, w1, b1, w2, b2: torch.relu(x @ w1.T + b1) @ w2 + b2)
    assert "raised RuntimeError" in capsys.readouterr().out


def test_relu_before_the_bias_is_not_told_that_negative_features_leak(capsys):
    # issue 14: this learner used to get the hint meant for a missing ReLU
    assert not check_feed_forward(lambda x, w1, b1, w2, b2: (torch.relu(x @ w1) + b1) @ w2 + b2)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: ")
    assert "leak" not in out and "missing" not in out
    assert "Hint: the ReLU comes after the bias: relu(x @ w1 + b1)" in out


def _one_hot_from_numpy(masks, seen, recent):
    # the package's one_hot is a float64 numpy array
    return seen * (torch.tensor(one_hot([recent], len(masks))[0]) @ masks)


@pytest.mark.parametrize("wrong, hint", [
    (_one_hot_from_numpy, "your one-hot vector is float64"),
    (lambda masks, seen, recent: seen * (np.eye(len(masks))[recent] @ masks),
     "your one-hot vector is a numpy array and masks a torch tensor"),
    (lambda masks, seen, recent: seen * (masks.T.double() @ torch.eye(len(masks))[recent]),
     "torch will not mix numpy arrays with tensors, or float64"),      # the framework's hint
])
def test_attend_mixing_dtypes_gets_a_dtype_hint_not_just_a_runtime_error(wrong, hint, capsys):
    assert not check_attend(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (recent=10, seen=[")
    assert "masks=float32 tensor of shape (13, 13))" in out
    assert hint in out.split("Hint: ", 1)[1]
