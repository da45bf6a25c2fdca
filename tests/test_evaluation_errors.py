"""Chapter 20's error bars and contamination check against direct computations: the paired
standard error from the two variances and their covariance, the minimum detectable difference
from scipy's normal quantiles, the standard error of a perplexity from per-text means and from
a bootstrap over texts, and the n-gram overlap from a plain scan over the words."""

import math
import random
import re
import statistics

import pytest
from scipy import stats

from minitransformer import evaluation as ev


def test_paired_stderr_is_the_variances_less_the_covariance():
    rng = random.Random(0)
    a = [float(rng.random() < 0.6) for _ in range(150)]
    b = [x if rng.random() < 0.8 else 1 - x for x in a]          # mostly the same answers
    n = len(a)
    diff, stderr = ev.paired_stderr(a, b)
    se_a, se_b = ev.mean_stderr(a)[1], ev.mean_stderr(b)[1]
    direct = math.sqrt(se_a ** 2 + se_b ** 2 - 2 * statistics.covariance(a, b) / n)
    assert diff == pytest.approx(statistics.mean(a) - statistics.mean(b))
    assert stderr == pytest.approx(direct)
    assert stderr < 0.8 * math.sqrt(se_a ** 2 + se_b ** 2)     # pairing helps here


def test_minimum_detectable_difference_is_normal_quantiles_times_stderr():
    for confidence, power in ((0.95, 0.8), (0.99, 0.9), (0.9, 0.5)):
        z = stats.norm.ppf(1 - (1 - confidence) / 2) + stats.norm.ppf(power)
        got = ev.minimum_detectable_difference(0.03, confidence=confidence, power=power)
        assert got == pytest.approx(z * 0.03)
    assert ev.minimum_detectable_difference(1.0) == pytest.approx(2.8016, abs=1e-4)


def test_minimum_detectable_difference_has_the_power_it_promises():
    """Simulated: two accuracies that differ by the detectable difference are told apart
    (|diff| > 1.96 se) in about 80% of 2000 draws of n = 400 items each."""
    rng, n, p = random.Random(1), 400, 0.5
    se = math.sqrt(2 * p * (1 - p) / n)
    delta = ev.minimum_detectable_difference(se)
    found = 0
    for _ in range(2000):
        a = sum(rng.random() < p + delta / 2 for _ in range(n)) / n
        b = sum(rng.random() < p - delta / 2 for _ in range(n)) / n
        found += abs(a - b) > 1.96 * se
    assert found / 2000 == pytest.approx(0.8, abs=0.04)


def scores(lengths, seed=0):
    rng = random.Random(seed)
    return [ev.TextScore(sum(rng.uniform(1, 5) for _ in range(k)), k, 4 * k + rng.randint(0, 9))
            for k in lengths]


def test_perplexity_stderr_of_equal_texts_is_the_stderr_of_their_means():
    texts = scores([50] * 12)
    ppl, stderr = ev.perplexity_stderr(texts)
    mean, se = ev.mean_stderr([s.nll / s.num_tokens for s in texts])
    assert ppl == pytest.approx(ev.TextScore.combine(texts).perplexity)
    assert ppl == pytest.approx(math.exp(mean))
    assert stderr == pytest.approx(ppl * se)


def test_perplexity_and_bits_per_byte_stderr_match_a_bootstrap_over_texts():
    texts = scores([20, 80, 35, 60, 120, 45, 90, 30, 70, 55, 100, 25], seed=2)
    ppl, stderr = ev.perplexity_stderr(texts)
    bpb, bpb_stderr = ev.bits_per_byte_stderr(texts)
    assert bpb == pytest.approx(ev.TextScore.combine(texts).bits_per_byte)
    rng = random.Random(3)
    resampled = [ev.TextScore.combine(rng.choices(texts, k=len(texts))) for _ in range(4000)]
    assert stderr == pytest.approx(statistics.stdev(s.perplexity for s in resampled), rel=0.15)
    assert bpb_stderr == pytest.approx(statistics.stdev(s.bits_per_byte for s in resampled),
                                       rel=0.15)


def direct_contaminated(item, corpus, n):
    words = lambda t: re.sub(r"[^a-z0-9 ]", " ", t.lower()).split()   # noqa: E731
    c, w = words(corpus), words(item)
    return any(w[i:i + n] == c[j:j + n] for i in range(len(w) - n + 1)
               for j in range(len(c) - n + 1))


def test_contaminated_finds_the_shared_ngrams_a_scan_finds():
    corpus = ("The man walks to the barbell. He bends down, grabs the pole and lifts the "
              "weight over his head; the crowd cheers. Then he drops it and walks away.")
    items = ["he bends down grabs the pole and lifts the weight over his HEAD!",  # 13 words
             "He bends down, grabs the pole and lifts the weight over her head.",  # one differs
             "the crowd cheers",                                                 # too short
             "A woman walks to the barbell, and the crowd cheers for a long time now."]
    for n in (3, 8, 13):
        assert ev.contaminated(items, corpus, n=n) == [direct_contaminated(i, corpus, n)
                                                       for i in items]
    assert ev.contaminated(items, corpus) == [True, False, False, False]
    assert ev.word_ngrams("A, b. C", 2) == {("a", "b"), ("b", "c")}


@pytest.mark.parametrize("call, error, message", [
    (lambda: ev.paired_stderr([1, 0, 1], [1, 0]), ValueError, "same items"),
    (lambda: ev.paired_stderr([1], [0]), ValueError, "at least 2"),
    (lambda: ev.minimum_detectable_difference(-0.1), ValueError, "stderr"),
    (lambda: ev.minimum_detectable_difference(0.1, power=1.0), ValueError, "power"),
    (lambda: ev.minimum_detectable_difference(0.1, confidence=0), ValueError, "confidence"),
    (lambda: ev.perplexity_stderr([ev.TextScore(1.0, 1, 1)]), ValueError, "at least 2"),
    (lambda: ev.perplexity_stderr([(1.0, 1, 1), (1.0, 1, 1)]), TypeError, "TextScore"),
    (lambda: ev.bits_per_byte_stderr("texts"), TypeError, "list of TextScore"),
    (lambda: ev.contaminated("an item", "corpus"), TypeError, "list of str"),
    (lambda: ev.contaminated(["an item"], "corpus", n=0), ValueError, "n"),
    (lambda: ev.contaminated([3], "corpus"), TypeError, "items"),
])
def test_bad_input_is_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
