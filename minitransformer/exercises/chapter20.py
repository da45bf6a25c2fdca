"""Checkers for the exercises of chapter 20, *Evaluation*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_norm_choice` -- ``my_norm_choice(log_likelihoods, choices)``: the index of the
  answer that ``acc_norm`` picks, the largest log-likelihood per character of the choice (the
  choice's own characters, without the space before it); on a tie the first such index.
* :data:`check_stderr` -- ``my_stderr(values)``: the standard error of the mean of per-item
  scores, the sample standard deviation (dividing by ``n - 1``) over ``sqrt(n)``, a float.
* :data:`check_bits_per_byte` -- ``my_bits_per_byte(token_log_probs, text)``: the bits per
  UTF-8 byte of ``text`` from the natural-log probabilities of its tokens, a float.
"""

from __future__ import annotations

import math

from minitransformer.exercises import Checker

__all__ = ["check_bits_per_byte", "check_norm_choice", "check_stderr"]


# --- my_norm_choice(log_likelihoods, choices) ---------------------------------------------------

def _first_best(values: list[float], *, last: bool = False) -> int:
    best = max(values)
    indices = [i for i, v in enumerate(values) if v == best]
    return indices[-1] if last else indices[0]


def _norm_choice(log_likelihoods: list[float], choices: list[str], *, extra: int = 0,
                 length=len, last: bool = False) -> int:
    return _first_best([ll / (length(c) + extra) for ll, c in zip(log_likelihoods, choices)],
                       last=last)


check_norm_choice = Checker(
    reference=_norm_choice,
    cases=[([-1.9, -3.3, -10.5], ["x", "abc", "ab cd ef g"]),
           ([-10.0, -12.0, -20.0], ["a cat", "a big dog", "a very long answer here"]),
           ([-6.0, -8.5], ["ab", "abc"]),
           ([-9.0, -10.0], ["a b c", "abcdefgh"]),
           ([-4.0, -4.0, -9.0], ["ab", "cd", "efgh"]),
           ([-3.0, -2.0, -5.0, -7.0], ["café", "ok", "tea", "water"]),
           ([-5.0, -4.5], ["déjà vu", "a dream"]),
           ([-3.0, -1.9], [" yes", "no"])],
    thorough=True,
    match_every_case=True,
    mistakes={
        "acc_norm divides each log-likelihood by its choice's length before comparing; the "
        "largest raw log-likelihood is plain acc": lambda lls, cs: _first_best(lls),
        "the length is the choice's own characters, len(choice), without the space that joins "
        "it to the question": lambda lls, cs: _norm_choice(lls, cs, extra=1),
        "the length is in characters, len(choice), not in words":
            lambda lls, cs: _norm_choice(lls, cs, length=lambda c: len(c.split())),
        "log-likelihoods are negative: the best choice has the largest value per character "
        "(closest to 0), not the smallest": lambda lls, cs: min(
            range(len(cs)), key=lambda i: lls[i] / len(cs[i])),
        "on a tie the first index wins (numpy's argmax, which lm-eval uses)":
            lambda lls, cs: _norm_choice(lls, cs, last=True),
        "the length is in characters, len(choice), not UTF-8 bytes (lm-eval 0.4.13 counts "
        "characters; 'é' is one character and two bytes)":
            lambda lls, cs: _norm_choice(lls, cs, length=lambda c: len(c.encode("utf-8"))),
        "len(choice) counts every character of the choice as given, spaces included: do not "
        "strip it": lambda lls, cs: _norm_choice(lls, cs, length=lambda c: len(c.strip())),
        "return the index of the chosen answer (0, 1, ...), not its score":
            lambda lls, cs: max(ll / len(c) for ll, c in zip(lls, cs)),
    },
)


# --- my_stderr(values) --------------------------------------------------------------------------

def _stderr(values: list[float], *, ddof: int = 1, root: bool = True) -> float:
    n = len(values)
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - ddof)
    return math.sqrt(variance / n) if root else variance / n


check_stderr = Checker(
    reference=_stderr,
    cases=[([1.0, 0.0, 1.0, 1.0, 0.0],), ([0.0, 1.0],),
           ([float(i % 3 == 0) for i in range(200)],), ([0.25, 0.5, 1.0, 0.0],)],
    thorough=True,
    mistakes={
        "the sample standard deviation divides the squared deviations by n - 1, not n "
        "(statistics.stdev, not pstdev; lm-eval does the same)": lambda v: _stderr(v, ddof=0),
        "the standard error is the standard deviation over sqrt(n), not over n":
            lambda v: _stderr(v) * math.sqrt(len(v)) / len(v),
        "the standard error is the standard deviation divided by sqrt(n); the standard "
        "deviation alone does not shrink with more items": lambda v: _stderr(v) * math.sqrt(
            len(v)),
        "take the square root: variance / n is the squared standard error":
            lambda v: _stderr(v, root=False),
        "sqrt(p(1 - p) / (n - 1)) holds only for scores of 0 and 1; the values may be any "
        "floats: sum the squared deviations from the mean": lambda v: math.sqrt(
            sum(v) / len(v) * (1 - sum(v) / len(v)) / (len(v) - 1)),
    },
)


# --- my_bits_per_byte(token_log_probs, text) ----------------------------------------------------

def _bits_per_byte(token_log_probs: list[float], text: str, *, size=None,
                   base: float = math.log(2), sign: float = -1.0) -> float:
    size = len(text.encode("utf-8")) if size is None else size(text)
    return sign * sum(token_log_probs) / (base * size)


check_bits_per_byte = Checker(
    reference=_bits_per_byte,
    cases=[([-2.0, -1.5, -3.25], "Hello, world"),
           ([-4.0, -0.5], "café au lait"),
           ([-1.0, -2.0, -0.25, -6.0], "naïve señor 日本")],
    thorough=True,
    mistakes={
        "bytes, not characters: len(text.encode('utf-8')); an accented letter takes 2 bytes":
            lambda lp, t: _bits_per_byte(lp, t, size=len),
        "per byte, not per token: divide by the text's UTF-8 bytes, not len(token_log_probs)":
            lambda lp, t: _bits_per_byte(lp, t, size=lambda _: len(lp)),
        "the log-probabilities are in nats (natural log): divide by ln 2 to get bits":
            lambda lp, t: _bits_per_byte(lp, t, base=1.0),
        "ln 2 converts nats to bits: divide by math.log(2), not multiply":
            lambda lp, t: _bits_per_byte(lp, t, base=1 / math.log(2)),
        "the log-probabilities are negative: bits per byte is minus their sum over "
        "(ln 2 * bytes), a positive number": lambda lp, t: _bits_per_byte(lp, t, sign=1.0),
        "bits are base-2 logarithms: divide by math.log(2), not math.log(10)":
            lambda lp, t: _bits_per_byte(lp, t, base=math.log(10)),
        "that is a perplexity per byte, exp(loss per byte); bits per byte stays in the log "
        "domain: minus the sum over (ln 2 * bytes)":
            lambda lp, t: math.exp(-sum(lp) / len(t.encode("utf-8"))),
    },
)
