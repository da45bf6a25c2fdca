"""The checkers of chapter 20: they accept correct answers, agree with the package's own
functions, and explain plausible wrong ones (each hint asserted at least once)."""

import math
import statistics

import numpy as np
import pytest

from minitransformer import evaluation as ev
from minitransformer.exercises import chapter20
from minitransformer.exercises.chapter20 import (check_bits_per_byte, check_norm_choice,
                                                 check_stderr)


def my_norm_choice(log_likelihoods, choices):
    scores = [ll / len(c) for ll, c in zip(log_likelihoods, choices)]
    return scores.index(max(scores))


def my_stderr(values):
    return statistics.stdev(values) / math.sqrt(len(values))


def my_bits_per_byte(token_log_probs, text):
    return -sum(token_log_probs) / (math.log(2) * len(text.encode("utf-8")))


def test_correct_answers_pass():
    assert check_norm_choice.run(my_norm_choice)
    assert check_norm_choice.run(lambda lls, cs: int(np.argmax(
        np.array(lls) / np.array([len(c) for c in cs]))))
    assert check_stderr.run(my_stderr)
    assert check_stderr.run(lambda v: float(np.std(v, ddof=1) / np.sqrt(len(v))))
    assert check_bits_per_byte.run(my_bits_per_byte)


def test_the_references_are_the_package():
    for lls, choices in check_norm_choice.cases:
        score = [float(i == chapter20._norm_choice(lls, choices)) for i in range(len(lls))]
        per_char = [ll / len(c) for ll, c in zip(lls, choices)]
        assert ev._argmax(per_char) == score.index(1.0)
    for (values,) in check_stderr.cases:
        assert chapter20._stderr(values) == pytest.approx(ev.mean_stderr(values)[1])
    for lps, text in check_bits_per_byte.cases:
        score = ev.TextScore(-sum(lps), len(lps), len(text.encode("utf-8")))
        assert chapter20._bits_per_byte(lps, text) == pytest.approx(score.bits_per_byte)


@pytest.mark.parametrize("checker, answer, hint", [
    (check_norm_choice, lambda lls, cs: lls.index(max(lls)), "plain acc"),
    (check_norm_choice, lambda lls, cs: my_norm_choice(lls, [" " + c for c in cs]),
     "without the space"),
    (check_norm_choice, lambda lls, cs: my_norm_choice(lls, [c.split() for c in cs]),
     "not in words"),
    (check_norm_choice, lambda lls, cs: min(range(len(cs)), key=lambda i: lls[i] / len(cs[i])),
     "not the smallest"),
    (check_norm_choice, lambda lls, cs: max(range(len(cs)),
                                            key=lambda i: (lls[i] / len(cs[i]), i)),
     "the first index wins"),
    (check_norm_choice, lambda lls, cs: my_norm_choice(lls, [c.encode() for c in cs]),
     "not UTF-8 bytes"),
    (check_norm_choice, lambda lls, cs: my_norm_choice(lls, [c.strip() for c in cs]),
     "do not strip"),
    (check_norm_choice, lambda lls, cs: max(ll / len(c) for ll, c in zip(lls, cs)),
     "not its score"),
    (check_stderr, lambda v: statistics.pstdev(v) / math.sqrt(len(v)), "n - 1, not n"),
    (check_stderr, lambda v: statistics.stdev(v) / len(v), "not over n"),
    (check_stderr, lambda v: statistics.stdev(v), "does not shrink"),
    (check_stderr, lambda v: statistics.variance(v) / len(v), "square root"),
    (check_stderr, lambda v: math.sqrt(statistics.mean(v) * (1 - statistics.mean(v))
                                       / (len(v) - 1)), "only for scores of 0 and 1"),
    (check_bits_per_byte, lambda lp, t: -sum(lp) / (math.log(2) * len(t)), "2 bytes"),
    (check_bits_per_byte, lambda lp, t: -sum(lp) / (math.log(2) * len(lp)), "not per token"),
    (check_bits_per_byte, lambda lp, t: -sum(lp) / len(t.encode()), "divide by ln 2"),
    (check_bits_per_byte, lambda lp, t: -sum(lp) * math.log(2) / len(t.encode()),
     "not multiply"),
    (check_bits_per_byte, lambda lp, t: sum(lp) / (math.log(2) * len(t.encode())),
     "a positive number"),
    (check_bits_per_byte, lambda lp, t: -sum(lp) / (math.log(10) * len(t.encode())),
     "not math.log(10)"),
    (check_bits_per_byte, lambda lp, t: math.exp(-sum(lp) / len(t.encode())),
     "perplexity per byte"),
])
def test_wrong_answers_fail_with_their_hint(checker, answer, hint):
    verdict = checker.run(answer)
    assert not verdict
    assert hint in verdict.message, verdict.message


def test_stubs_are_not_implemented_yet():
    def stub(*args):
        raise NotImplementedError

    for checker in (check_norm_choice, check_stderr, check_bits_per_byte):
        assert "not implemented yet" in checker.run(stub).message
