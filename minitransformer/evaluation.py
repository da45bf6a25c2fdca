"""Evaluation: how well a language model predicts text and answers benchmarks, with error
bars (chapter 20).

Three kinds of number, scored as the LM Evaluation Harness (lm-eval) scores them:

* **text**: the total negative log-likelihood of a text, as perplexity per token and as bits
  per UTF-8 byte (which does not depend on the tokenizer), through windows of the context
  length for texts longer than it (:func:`score_text`);
* **multiple choice**: the log-likelihood of each answer after the question; ``acc`` picks
  the largest sum, ``acc_norm`` the largest sum per character of the answer
  (:func:`score_choices`);
* **generation**: a greedy answer, the number or letter pulled out of it, exact match
  (:func:`generate_answers`, :func:`extract_last_number`, :func:`extract_choice_letter`).

A mean accuracy on ``n`` items is a measurement with an error: :func:`mean_stderr` (lm-eval's
``sample std / sqrt(n)``), :func:`bootstrap_interval`, for two models on the same items
:func:`paired_stderr`, :func:`mcnemar` and :func:`paired_bootstrap`, and
:func:`minimum_detectable_difference` for what ``n`` items can tell apart. A perplexity over
several texts has one too (:func:`perplexity_stderr`, :func:`bits_per_byte_stderr`).

Contamination, test items that were in the training text, is found as the GPT-3 paper did, by
shared word n-grams (:func:`word_ngrams`, :func:`contaminated`).

A ``tokenizer`` here is anything with ``encode(text) -> list[int]`` that adds no special
tokens (:class:`~minitransformer.bpe.BPETokenizer`, or transformers' with
``add_special_tokens=False``).

A ``model`` is a :class:`~minitransformer.gpt.GPT` or :class:`~minitransformer.llama.Llama` in
this process, or a :class:`~minitransformer.served.ServedModel`, a model behind a running
server, scored through its completions endpoint (``echo`` and ``logprobs``); it is its own
tokenizer. A served model reads two tokens fewer at a time (its
:attr:`~minitransformer.served.ServedModel.window`), so items and windows longer than that are
cut where they would not be in this process.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

import torch
from torch import nn

from minitransformer import _checks
from minitransformer._modes import eval_mode
from minitransformer.batching import generate_batch, left_pad
from minitransformer.served import ServedModel

# --------------------------------------------------------------------------- checks

def _check_model(model: object) -> nn.Module | ServedModel:
    from minitransformer.gpt import GPT
    from minitransformer.llama import Llama

    if not isinstance(model, (GPT, Llama, ServedModel)):
        raise TypeError(f"model must be a GPT, a Llama or a ServedModel, got "
                        f"{type(model).__name__}")
    return model


def _window(model: nn.Module | ServedModel) -> int:
    """The most tokens a scored token can be read after: the context length in this process,
    two fewer on a server."""
    return model.window if isinstance(model, ServedModel) else model.config.context_length


def _encode(tokenizer: object, text: str) -> list[int]:
    if not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must have an encode(text) method, got "
                        f"{type(tokenizer).__name__}")
    return list(tokenizer.encode(text))


def _check_text(name: str, text: object, *, empty: bool = False) -> str:
    _checks.check_type(name, text, str, "a str")
    if not empty and not text:
        raise ValueError(f"{name} is empty")
    return text


def _check_outcomes(name: str, values: object) -> list[float]:
    """A non-empty list of finite numbers (per-item scores such as 0/1 accuracies)."""
    _checks.check_type(name, values, (list, tuple), "a list of numbers")
    if not values:
        raise ValueError(f"{name} is empty: no items to average")
    return [_checks.check_number(f"{name}[{i}]", v) for i, v in enumerate(values)]


# --------------------------------------------------------------------------- log-likelihoods

def _sequence_log_likelihoods(model: nn.Module, requests: list[tuple[list[int], int]], *,
                              batch_size: int) -> list[tuple[float, bool]]:
    """For each ``(tokens, n)``: the sum of the log-probabilities of the last ``n`` tokens
    given those before them, and whether each is the model's greedy choice. Requests that
    read the same ``tokens[:-1]`` (one question's answers A-D) share one row; the rows go
    through the model in left-padded batches, longest first. A served model scores them
    itself."""
    if isinstance(model, ServedModel):
        return model.log_likelihoods(requests, batch_size=batch_size)
    vocab = model.config.vocab_size
    device = model.token_embedding.weight.device
    for tokens, _ in requests:
        if max(tokens) >= vocab:
            raise ValueError(f"token id {max(tokens)} is outside the vocabulary [0, {vocab})")
    rows: dict[tuple[int, ...], list[int]] = {}
    for i, (tokens, _) in enumerate(requests):
        rows.setdefault(tuple(tokens[:-1]), []).append(i)
    inputs = sorted(rows, key=len, reverse=True)
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    with eval_mode(model), torch.inference_mode():
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start:start + batch_size]
            idx, mask, positions = left_pad(batch, pad_id=0, device=device)
            logits = model(idx, attention_mask=mask, position_ids=positions)[0]  # (B, T, V)
            for row, key in enumerate(batch):
                for i in rows[key]:
                    tokens, n = requests[i]
                    scored = torch.log_softmax(logits[row, -n:].float(), dim=-1)  # (n, V)
                    target = torch.tensor(tokens[-n:], device=device)
                    total = scored.gather(-1, target[:, None]).sum().item()
                    results[i] = (total, bool((scored.argmax(-1) == target).all()))
    return results


def continuation_tokens(tokenizer: object, context: str, continuation: str
                        ) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` as lm-eval splits them: spaces at the end of the
    context move to the continuation; the whole text is encoded at once and the
    continuation's tokens are those past the context's own encoding (so a token that spans
    the boundary counts as the continuation's).

    Raises:
        TypeError: texts that are not str, a tokenizer without ``encode``.
        ValueError: an empty context or continuation.
    """
    _check_text("context", context)
    _check_text("continuation", continuation)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = _encode(tokenizer, context + continuation)
    context_ids = _encode(tokenizer, context)
    return context_ids, whole[len(context_ids):]


def log_likelihoods(model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                    batch_size: int = 8) -> list[tuple[float, bool]]:
    """The log-likelihood (natural log) of each continuation after its context, and whether
    greedy decoding would produce it: lm-eval's ``loglikelihood`` on token ids.

    Each pair is read as ``(context + continuation)`` cut to its last ``context_length + 1``
    tokens; the score is the sum of ``log p(token | tokens before it)`` over the
    continuation's tokens.

    Args:
        model: a :class:`~minitransformer.gpt.GPT`, :class:`~minitransformer.llama.Llama` or
            :class:`~minitransformer.served.ServedModel`.
        pairs: ``(context_ids, continuation_ids)``, each with at least one id.
        batch_size: how many pairs go through the model at once (left-padded).

    Returns:
        ``(log_likelihood, is_greedy)`` per pair, in order.

    Raises:
        TypeError, ValueError: a bad model, an empty context or continuation, ids outside
            the vocabulary, a continuation longer than the context length.
    """
    _check_model(model)
    _checks.check_int("batch_size", batch_size)
    _checks.check_type("pairs", pairs, (list, tuple), "a list of (context, continuation) ids")
    width = _window(model)
    requests = []
    for i, pair in enumerate(pairs):
        _checks.check_type(f"pairs[{i}]", pair, (list, tuple), "a (context, continuation) pair")
        if len(pair) != 2:
            raise ValueError(f"pairs[{i}] must be a (context, continuation) pair, got "
                             f"{len(pair)} items")
        context, continuation = (
            [_checks.check_int(f"pairs[{i}][{k}][{j}]", t, low=0) for j, t in enumerate(part)]
            for k, part in enumerate(pair))
        if not context or not continuation:
            empty = "context" if not context else "continuation"
            raise ValueError(f"pairs[{i}] has an empty {empty}: each needs at least one token")
        if len(continuation) > width:
            raise ValueError(f"pairs[{i}]'s continuation has {len(continuation)} tokens, more "
                             f"than the model reads at once ({width})")
        requests.append(((context + continuation)[-(width + 1):], len(continuation)))
    return _sequence_log_likelihoods(model, requests, batch_size=batch_size)


# --------------------------------------------------------------------------- multiple choice

class ChoiceScore(NamedTuple):
    """One multiple-choice item, scored: each choice's log-likelihood, the right index, and
    lm-eval's two accuracies (1.0 or 0.0)."""
    log_likelihoods: list[float]
    label: int
    acc: float
    acc_norm: float


def score_choices(model: nn.Module, tokenizer: object, context: str, choices: Sequence[str],
                  label: int, *, delimiter: str = " ", batch_size: int = 8) -> ChoiceScore:
    """Score a multiple-choice item as lm-eval does: choice ``i`` is the continuation
    ``delimiter + choices[i]`` after ``context``; ``acc`` is 1 when the largest
    log-likelihood is the label's, ``acc_norm`` when the largest log-likelihood divided by
    ``len(choices[i])`` (characters, without the delimiter) is.

    Raises:
        TypeError, ValueError: non-str texts, fewer than two choices, an empty choice, a
            label outside the choices.
    """
    return score_multiple_choice(model, tokenizer, [(context, choices, label)],
                                 delimiter=delimiter, batch_size=batch_size)[0]


def score_multiple_choice(model: nn.Module, tokenizer: object,
                          items: Sequence[tuple[str, Sequence[str], int]], *,
                          delimiter: str = " ", batch_size: int = 8) -> list[ChoiceScore]:
    """:func:`score_choices` for many ``(context, choices, label)`` items, all their choices
    batched together."""
    _check_model(model)
    _checks.check_type("items", items, (list, tuple), "a list of (context, choices, label)")
    _check_text("delimiter", delimiter, empty=True)
    pairs, spans = [], []
    for i, item in enumerate(items):
        _checks.check_type(f"items[{i}]", item, (list, tuple), "a (context, choices, label)")
        if len(item) != 3:
            raise ValueError(f"items[{i}] must be (context, choices, label), got {len(item)} "
                             f"values")
        context, choices, label = item
        _checks.check_type(f"items[{i}] choices", choices, (list, tuple), "a list of str")
        if len(choices) < 2:
            raise ValueError(f"items[{i}] has {len(choices)} choice(s): at least 2 needed")
        if _checks.check_int(f"items[{i}] label", label, low=0) >= len(choices):
            raise ValueError(f"items[{i}] label {label} is not one of its {len(choices)} "
                             f"choices")
        for j, choice in enumerate(choices):
            _check_text(f"items[{i}] choices[{j}]", choice)
            pairs.append(continuation_tokens(tokenizer, context, delimiter + choice))
        spans.append((len(pairs) - len(choices), len(pairs)))
    scores = [ll for ll, _ in log_likelihoods(model, pairs, batch_size=batch_size)]
    results = []
    for (start, end), (_, choices, label) in zip(spans, items):
        lls = scores[start:end]
        per_char = [ll / len(c) for ll, c in zip(lls, choices)]
        results.append(ChoiceScore(lls, label, float(_argmax(lls) == label),
                                   float(_argmax(per_char) == label)))
    return results


def _argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (numpy's ``argmax``, which lm-eval uses)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def hellaswag_item(doc: dict) -> tuple[str, list[str], int]:
    """A HellaSwag line of ``tests/data/eval/hellaswag.jsonl`` as ``(context, choices,
    label)``: the query, the four endings."""
    return doc["query"], list(doc["choices"]), int(doc["label"])


def mmlu_prompt(doc: dict) -> str:
    """lm-eval's zero-shot MMLU prompt: the subject's description line, the question, the
    four choices lettered A-D, ``Answer:``."""
    subject = doc["subject"].replace("_", " ")
    lines = [doc["question"].strip(), *(f"{letter}. {choice}" for letter, choice
                                        in zip("ABCD", doc["choices"])), "Answer:"]
    return (f"The following are multiple choice questions (with answers) about {subject}."
            f"\n\n" + "\n".join(lines))


def mmlu_item(doc: dict) -> tuple[str, list[str], int]:
    """An MMLU line as ``(context, choices, label)``: the prompt, the letters A-D."""
    return mmlu_prompt(doc), ["A", "B", "C", "D"], int(doc["answer"])


# --------------------------------------------------------------------------- text

class TextScore(NamedTuple):
    """The negative log-likelihood (nats) of a text, with its size in tokens and in UTF-8
    bytes. Add scores of several texts with :meth:`combine`."""
    nll: float
    num_tokens: int
    num_bytes: int

    @property
    def perplexity(self) -> float:
        """``exp(nll / num_tokens)``: depends on the tokenizer."""
        return math.exp(self.nll / self.num_tokens)

    @property
    def bits_per_byte(self) -> float:
        """``nll / (ln 2 * num_bytes)``: the same unit for every tokenizer."""
        return self.nll / (math.log(2) * self.num_bytes)

    @staticmethod
    def combine(scores: Sequence[TextScore]) -> TextScore:
        """The scores of several texts as one (sums, as lm-eval aggregates them)."""
        if not scores:
            raise ValueError("scores is empty: nothing to combine")
        return TextScore(*(sum(column) for column in zip(*scores)))


def rolling_windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """The windows that score ``num_tokens`` tokens with a model that reads ``window`` at
    a time, as ``(end, scored)``: the window reads ids ``end - window .. end - 1`` of
    ``[prefix] + tokens`` (from 0 while ``end < window``) and scores its last ``scored``
    predictions. The first window scores up to ``window`` tokens; each next one moves on by
    ``stride`` (fewer at the end) and keeps a full window of context.

    ``stride = window`` is lm-eval's ``loglikelihood_rolling``: windows that score disjoint
    runs of tokens, the first token of each seeing a single token of context (the last window
    excepted, which keeps a full window).
    A smaller stride gives every scored token at least ``window - stride`` tokens of context
    (a lower, fairer perplexity) for ``window / stride`` times the forward passes.
    """
    _checks.check_int("num_tokens", num_tokens, low=0)
    _checks.check_int("window", window)
    if _checks.check_int("stride", stride) > window:
        raise ValueError(f"stride must be at most window={window}, got {stride}")
    if num_tokens == 0:
        return []
    end = min(window, num_tokens)
    windows = [(end, end)]
    while end < num_tokens:
        scored = min(stride, num_tokens - end)
        end += scored
        windows.append((end, scored))
    return windows


def score_text(model: nn.Module, tokenizer: object, text: str, *, prefix_id: int,
               window: int | None = None, stride: int | None = None,
               batch_size: int = 8) -> TextScore:
    """The negative log-likelihood of every token of ``text``, the first one predicted
    after ``prefix_id`` (lm-eval uses the tokenizer's BOS, else its EOS), through the
    windows of :func:`rolling_windows`.

    Args:
        window: the most tokens the model reads at once (default: its context length;
            lm-eval's ``max_length``).
        stride: how far each window moves on (default: ``window``, lm-eval's).

    Raises:
        TypeError, ValueError: a bad model or tokenizer, an empty text, a ``prefix_id``,
            ``window`` or ``stride`` out of range.
    """
    _check_model(model)
    _check_text("text", text)
    _checks.check_int("prefix_id", prefix_id, low=0)
    if not isinstance(model, ServedModel) and prefix_id >= model.config.vocab_size:
        raise ValueError(f"prefix_id={prefix_id} is outside the vocabulary "
                         f"[0, {model.config.vocab_size})")
    context = _window(model)
    window = context if window is None else _checks.check_int("window", window)
    if window > context:
        raise ValueError(f"window must be at most {context} (what the model reads at once), "
                         f"got {window}")
    stride = window if stride is None else stride
    tokens = _encode(tokenizer, text)
    ids = [prefix_id] + tokens
    requests = [(ids[max(0, end - window):end + 1], scored)
                for end, scored in rolling_windows(len(tokens), window, stride)]
    results = _sequence_log_likelihoods(model, requests, batch_size=batch_size)
    return TextScore(-sum(ll for ll, _ in results), len(tokens), len(text.encode("utf-8")))


# --------------------------------------------------------------------------- generation

def generate_answers(model: nn.Module, tokenizer: object, prompts: Sequence[str], *,
                     max_new_tokens: int, eos_id: int | None = None,
                     stop: Sequence[str] = (), batch_size: int = 8) -> list[str]:
    """Greedy answers to ``prompts``, each ended by ``eos_id`` and cut before the first string
    of ``stop`` (lm-eval's ``until``). ``tokenizer`` must also have ``decode(ids) -> str``.
    A served model writes them itself, ``batch_size`` prompts a request."""
    _check_model(model)
    _checks.check_type("prompts", prompts, (list, tuple), "a list of str")
    _checks.check_type("stop", stop, (list, tuple), "a list of str")
    for i, s in enumerate(stop):
        _check_text(f"stop[{i}]", s)
    _checks.check_int("batch_size", batch_size)
    prompts = [_check_text(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
    if isinstance(model, ServedModel):
        # a special token writes no text on a server: a stop string that is one token (such
        # as "<|im_end|>") stops as that token, which cuts the answer where the string would
        ends = {model.token_id(s) for s in stop} | {eos_id}
        answers = model.complete(prompts, max_tokens=max_new_tokens, stop=stop[:4],
                                 stop_token_ids=sorted(ends - {None}), batch_size=batch_size)
    else:
        ids = [_encode(tokenizer, p) for p in prompts]
        answers = []
        for start in range(0, len(ids), batch_size):
            new = generate_batch(model, ids[start:start + batch_size], max_new_tokens,
                                 eos_id=eos_id, temperature=0.0)
            answers += [tokenizer.decode([t for t in row if t != eos_id]) for row in new]
    for s in stop:
        answers = [a.split(s)[0] for a in answers]
    return answers


_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (GSM8K's answer), without thousands commas and a
    trailing ``.0``: ``"so 1,200.0 eggs."`` -> ``"1200"``; ``None`` when there is none."""
    _check_text("text", text, empty=True)
    found = _NUMBER.findall(text)
    if not found:
        return None
    number = found[-1].replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return number


GSM8K_STOP = ["Question:", "</s>", "<|im_end|>", "\n\n"]
"""Where a GSM8K answer ends: lm-eval's ``until`` (``"Question:"``, ``"</s>"``,
``"<|im_end|>"``) and an empty line."""


def gsm8k_target(doc: dict) -> str:
    """The reference answer of a GSM8K line: the number after ``####``."""
    return extract_last_number(doc["answer"].split("####")[-1])


def extract_choice_letter(text: str, letters: str = "ABCD") -> str | None:
    """The first of ``letters`` that stands alone in ``text`` (``"B"``, ``"(B)"``, ``"B."``,
    ``"The answer is B"``), or ``None``."""
    _check_text("text", text, empty=True)
    found = re.search(rf"\b([{re.escape(letters)}])\b", text)
    return found.group(1) if found else None


def exact_match(predictions: Sequence[str | None], references: Sequence[str]) -> list[float]:
    """1.0 where a prediction equals its reference (after stripping spaces), else 0.0."""
    _checks.check_type("predictions", predictions, (list, tuple), "a list of str or None")
    _checks.check_type("references", references, (list, tuple), "a list of str")
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    return [float(p is not None and p.strip() == r.strip())
            for p, r in zip(predictions, references)]


# --------------------------------------------------------------------------- error bars

def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean of per-item scores and its standard error, lm-eval's
    ``sample_stddev / sqrt(n)`` (the sample standard deviation divides by ``n - 1``).

    Raises:
        TypeError, ValueError: not a list of finite numbers, or fewer than 2 of them.
    """
    values = _check_outcomes("values", values)
    n = len(values)
    if n < 2:
        raise ValueError("values has 1 item: a standard error needs at least 2")
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


def _check_resampling(confidence: object, num_samples: object, seed: object) -> float:
    _checks.check_number("confidence", confidence)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    _checks.check_int("num_samples", num_samples)
    _checks.check_int("seed", seed, low=0)
    return confidence


def _percentiles(samples: list[float], confidence: float) -> tuple[float, float]:
    samples = sorted(samples)
    tail = (1 - confidence) / 2
    last = len(samples) - 1
    return samples[round(tail * last)], samples[round((1 - tail) * last)]


def bootstrap_interval(values: Sequence[float], *, confidence: float = 0.95,
                       num_samples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean: ``num_samples`` resamples of the items
    with replacement (``random.Random(seed)``), the middle ``confidence`` of their means."""
    values = _check_outcomes("values", values)
    confidence = _check_resampling(confidence, num_samples, seed)
    rng, n = random.Random(seed), len(values)
    means = [sum(rng.choices(values, k=n)) / n for _ in range(num_samples)]
    return _percentiles(means, confidence)


def _check_paired(a: object, b: object) -> tuple[list[float], list[float]]:
    a, b = _check_outcomes("a", a), _check_outcomes("b", b)
    if len(a) != len(b):
        raise ValueError(f"a and b must score the same items, got {len(a)} and {len(b)}")
    return a, b


class McNemarResult(NamedTuple):
    """McNemar's exact test: items only ``a`` got right, items only ``b`` got right, and the
    two-sided p-value of "a and b are equally good" given those discordant items."""
    only_a: int
    only_b: int
    p_value: float


def mcnemar(a: Sequence[float], b: Sequence[float]) -> McNemarResult:
    """McNemar's exact test on two models' 0/1 outcomes on the same items: under the null
    each discordant item is a fair coin, so ``min(only_a, only_b)`` is binomial(n, 1/2)
    with ``n = only_a + only_b``; the p-value doubles its tail (at most 1).

    Raises:
        TypeError, ValueError: lists of other lengths, values other than 0 and 1.
    """
    a, b = _check_paired(a, b)
    for name, values in (("a", a), ("b", b)):
        for i, v in enumerate(values):
            if v not in (0.0, 1.0):
                raise ValueError(f"{name}[{i}] must be 0 or 1, got {v!r}")
    only_a = sum(1 for x, y in zip(a, b) if x > y)
    only_b = sum(1 for x, y in zip(a, b) if y > x)
    n = only_a + only_b
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return McNemarResult(only_a, only_b, min(1.0, 2 * tail))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                     num_samples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """The difference of means ``mean(a) - mean(b)`` on the same items and a percentile
    bootstrap interval of it, resampling items (both models' scores of an item together).
    An interval that excludes 0 says the models differ at that confidence."""
    a, b = _check_paired(a, b)
    confidence = _check_resampling(confidence, num_samples, seed)
    diffs = [x - y for x, y in zip(a, b)]
    rng, n = random.Random(seed), len(diffs)
    means = [sum(rng.choices(diffs, k=n)) / n for _ in range(num_samples)]
    return (sum(diffs) / n, *_percentiles(means, confidence))


def paired_stderr(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The difference of means ``mean(a) - mean(b)`` of two models' scores on the same items,
    and its standard error: :func:`mean_stderr` of the per-item differences. It equals
    ``sqrt(se_a**2 + se_b**2 - 2 cov(a, b) / n)``: items both models find easy or hard
    (a positive covariance) make it smaller than the unpaired ``sqrt(se_a**2 + se_b**2)``.

    Raises:
        TypeError, ValueError: lists of other lengths, fewer than 2 items, non-finite values.
    """
    a, b = _check_paired(a, b)
    return mean_stderr([x - y for x, y in zip(a, b)])


def minimum_detectable_difference(stderr: float, *, confidence: float = 0.95,
                                  power: float = 0.8) -> float:
    """The smallest true difference that a two-sided test at ``confidence`` finds with
    probability ``power``, when the measured difference has standard error ``stderr``:
    ``(z_(1 - alpha/2) + z_power) * stderr``, 2.80 standard errors at the defaults.

    For two independent accuracies near ``p`` on ``n`` items each,
    ``stderr = sqrt(2 p (1 - p) / n)``; for a paired comparison, :func:`paired_stderr`'s.

    Raises:
        ValueError: a negative ``stderr``, ``confidence`` or ``power`` outside (0, 1).
    """
    _checks.check_number("stderr", stderr, low=0)
    for name, value in (("confidence", confidence), ("power", power)):
        if not 0 < _checks.check_number(name, value) < 1:
            raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    normal = NormalDist()
    return (normal.inv_cdf(1 - (1 - confidence) / 2) + normal.inv_cdf(power)) * stderr


def _ratio_stderr(numerators: list[float], denominators: list[float]) -> tuple[float, float]:
    """``r = sum(x) / sum(y)`` over texts and its standard error by the delta method,
    ``sqrt(sum((x_i - r y_i)**2) / (n (n - 1))) / mean(y)``: the texts are the independent
    units, not the tokens, which depend on their neighbours."""
    n = len(numerators)
    r = sum(numerators) / sum(denominators)
    spread = sum((x - r * y) ** 2 for x, y in zip(numerators, denominators))
    return r, math.sqrt(spread / (n * (n - 1))) / (sum(denominators) / n)


def _check_scores(scores: object) -> list[TextScore]:
    _checks.check_type("scores", scores, (list, tuple), "a list of TextScore")
    if len(scores) < 2:
        raise ValueError(f"scores has {len(scores)} text(s): a standard error needs at least 2")
    for i, score in enumerate(scores):
        _checks.check_type(f"scores[{i}]", score, TextScore, "a TextScore")
    return list(scores)


def perplexity_stderr(scores: Sequence[TextScore]) -> tuple[float, float]:
    """The perplexity of several texts scored one by one (``TextScore.combine(scores)``'s)
    and its standard error: the mean negative log-likelihood per token is a ratio of sums
    over the texts (``_ratio_stderr``), and ``exp`` carries its error ``s`` over as
    ``perplexity * s``.

    Raises:
        TypeError, ValueError: not a list of at least two TextScore.
    """
    scores = _check_scores(scores)
    nll, stderr = _ratio_stderr([s.nll for s in scores], [s.num_tokens for s in scores])
    return math.exp(nll), math.exp(nll) * stderr


def bits_per_byte_stderr(scores: Sequence[TextScore]) -> tuple[float, float]:
    """The bits per byte of several texts scored one by one and its standard error, as
    :func:`perplexity_stderr` with bytes for tokens (and bits for nats)."""
    scores = _check_scores(scores)
    nll, stderr = _ratio_stderr([s.nll for s in scores], [s.num_bytes for s in scores])
    return nll / math.log(2), stderr / math.log(2)


# --------------------------------------------------------------------------- contamination

def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The runs of ``n`` consecutive words of ``text``, lower-cased, punctuation dropped
    (words are runs of letters and digits), as the GPT-3 paper's overlap check reads text."""
    _check_text("text", text, empty=True)
    _checks.check_int("n", n)
    words = re.findall(r"[^\W_]+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def contaminated(items: Sequence[str], corpus: str, *, n: int = 13) -> list[bool]:
    """Which test ``items`` share at least one word ``n``-gram with ``corpus`` (the
    training text): the GPT-3 paper's "dirty" items, with its largest ``n``, 13. An item
    shorter than ``n`` words can never be found.

    Raises:
        TypeError, ValueError: items that are not a list of str, a corpus not a str, ``n < 1``.
    """
    _checks.check_type("items", items, (list, tuple), "a list of str")
    seen = word_ngrams(_check_text("corpus", corpus, empty=True), n)
    return [not seen.isdisjoint(word_ngrams(_check_text(f"items[{i}]", item, empty=True), n))
            for i, item in enumerate(items)]
