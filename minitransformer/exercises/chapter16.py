"""Checkers for the exercises of chapter 16, *Instruction tuning*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_sft_labels` -- ``my_sft_labels(turns, role_ids, end_id)``: the labels of a
  conversation whose tokens are each turn's role marker, its content and the end-of-turn token:
  the token itself on the assistant's content and end-of-turn token, ``-100`` elsewhere.
* :data:`check_sft_loss` -- ``my_sft_loss(logits, labels)``: the mean cross-entropy over the
  labelled positions, each position's logits scored on the *next* position's label.
* :data:`check_lora_forward` -- ``my_lora_forward(x, weight, A, B, alpha)``:
  ``x W^T + (alpha / r) x A^T B^T`` with ``r = A.shape[0]``.
* :data:`check_lora_merge` -- ``my_lora_merge(weight, A, B, alpha)``:
  ``W + (alpha / r) B A``.
* :data:`check_lora_init` -- ``my_lora_init(in_features, out_features, r, generator)``:
  ``(A, B)`` at the start, ``A`` random (``torch.randn`` divided by ``sqrt(in_features)``, as the
  LoRA paper draws it; PEFT and the package use Kaiming-uniform, which is hinted) and ``B`` zero.
* :data:`check_lora_parameter_count` -- ``my_lora_parameter_count(shapes, r)``: the numbers
  LoRA trains for linear layers of the given ``(out_features, in_features)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_lora_forward", "check_lora_init", "check_lora_merge",
           "check_lora_parameter_count", "check_sft_labels", "check_sft_loss"]

IGNORE = -100


def _numbers(generator: torch.Generator, *shape: int) -> Tensor:
    """Small integers as floats, so that no two mistakes agree by chance."""
    return torch.randint(-4, 5, shape, generator=generator).float()


# --- my_sft_labels(turns, role_ids, end_id) ---------------------------------------------------

ROLE_IDS = {"system": 1, "user": 2, "assistant": 3}
END_ID = 4


def _labels(turns, role_ids, end_id, *, keep=lambda role: role == "assistant", marker=False,
            end=True, other_end=False, fill=IGNORE, marker_slot=True):
    labels = []
    for role, content in turns:
        kept = keep(role)
        if marker_slot is True or (marker_slot == "assistant's" and kept):
            labels.append(role_ids[role] if kept and marker else fill)
        labels += list(content) if kept else [fill] * len(content)
        labels.append(end_id if (kept and end) or other_end else fill)
    return labels


def _sft_labels(turns, role_ids, end_id):
    return _labels(turns, role_ids, end_id)


def _labels_cases() -> list[tuple]:
    # case 1 is one exchange; case 2 has a system message and two assistant turns; case 3 an
    # assistant turn with empty content (only its end-of-turn token is learned), and role ids
    # in which the assistant's is the smallest
    return [([("user", [10, 11, 12]), ("assistant", [20, 21])], ROLE_IDS, END_ID),
            ([("system", [30]), ("user", [10, 11]), ("assistant", [20, 21, 22]),
              ("user", [12]), ("assistant", [23])], ROLE_IDS, END_ID),
            ([("user", [13, 14]), ("assistant", []), ("user", [15]), ("assistant", [24, 25])],
             {"system": 7, "user": 6, "assistant": 5}, 9)]


def _shifted(turns, role_ids, end_id):
    labels = _sft_labels(turns, role_ids, end_id)
    return labels[1:] + [IGNORE]


def _first_content_masked(turns, role_ids, end_id):
    labels = []
    for role, content in turns:
        if role == "assistant":
            labels += [IGNORE, IGNORE, *content[1:], end_id]
        else:
            labels += [IGNORE] * (len(content) + 2)
    return labels


def _nothing_labelled(cases, answers) -> bool:
    """Some case's labels are all -100 where the assistant has tokens to learn."""
    return any(len(answer) == len(_sft_labels(*case)) and all(a == IGNORE for a in answer)
               for case, answer in zip(cases, answers))


def _end_written_in(cases, answers) -> bool:
    """The labels are right except where the end-of-turn token's id belongs, which holds the
    same other number in every case (an id copied from a printed example)."""
    found = set()
    for (turns, role_ids, end_id), answer in zip(cases, answers):
        expected = _sft_labels(turns, role_ids, end_id)
        if len(answer) != len(expected):
            return False
        for want, have in zip(expected, answer):
            if want == end_id and have != end_id:
                found.add(int(have))
            elif have != want:
                return False
    return len(found) == 1


def _last_assistant_only(turns, role_ids, end_id):
    last = max(k for k, (role, _) in enumerate(turns) if role == "assistant")
    labels = []
    for k, (role, content) in enumerate(turns):
        part = _labels([(role, content)], role_ids, end_id)
        labels += part if k == last else [IGNORE] * len(part)
    return labels


check_sft_labels = Checker(
    reference=_sft_labels,
    cases=_labels_cases(),
    mistakes={
        "keep the assistant's end-of-turn token in the labels: it is how the model learns to "
        "stop, and a model that never learned it writes on past its answer":
            lambda t, r, e: _labels(t, r, e, end=False),
        "leave the assistant's role marker out (-100): the prompt always supplies it, so the "
        "model never has to write it":
            lambda t, r, e: _labels(t, r, e, marker=True),
        "leave the assistant's role marker out (-100), and keep its end-of-turn token: the "
        "model learns to write the content and to stop, never the marker the prompt supplies":
            lambda t, r, e: _labels(t, r, e, marker=True, end=False),
        "only the assistant's tokens are labels: the system and user turns get -100, or the "
        "model learns to write its users' turns":
            lambda t, r, e: _labels(t, r, e, keep=lambda role: True, marker=True),
        "only the assistant's tokens are labels (and the user's turns, markers included, get "
        "-100)": lambda t, r, e: _labels(t, r, e, keep=lambda role: True),
        "the mask is the wrong way round: label the assistant's tokens and give -100 to "
        "everything else": lambda t, r, e: _labels(t, r, e, keep=lambda role: role != "assistant",
                                                   marker=True),
        "the end-of-turn tokens of the other turns belong to those turns: -100":
            lambda t, r, e: _labels(t, r, e, other_end=True),
        "label every assistant turn, not only the last one: each is a reply the model should "
        "learn": _last_assistant_only,
        "do not shift here: label t is token t, as in transformers; the loss pairs the logits "
        "of position t with label t + 1": _shifted,
        "the label that the loss leaves out is -100 (cross_entropy's ignore_index), not 0":
            lambda t, r, e: _labels(t, r, e, fill=0),
        "the label that the loss leaves out is -100 (cross_entropy's ignore_index), not -1":
            lambda t, r, e: _labels(t, r, e, fill=-1),
        "one label per token, the role markers included: each turn starts with its marker, "
        "which gets -100, so the labels are as long as the conversation":
            lambda t, r, e: _labels(t, r, e, marker_slot=False),
        "one label per token: each turn's role marker gets -100 and the assistant's "
        "end-of-turn token its id, so the labels are as long as the conversation":
            lambda t, r, e: _labels(t, r, e, marker_slot=False, end=False),
        "one label per token: every turn starts with its role marker, the user's and the "
        "system's too, and each marker gets a label (-100)":
            lambda t, r, e: _labels(t, r, e, marker_slot="assistant's"),
        "the system prompt is given, like the user's turns: only the assistant's turns are "
        "labels (role == 'assistant'), the system's get -100":
            lambda t, r, e: _labels(t, r, e, keep=lambda role: role != "user"),
        "the assistant's first content token is a label too: only its role marker, before the "
        "content, gets -100": _first_content_masked,
        "one label per token: each turn is its role marker, its content and the end-of-turn "
        "token, so the labels are as long as the conversation (the marker gets -100, the "
        "assistant's end-of-turn token its id)": lambda t, r, e: [
            i if role == "assistant" else IGNORE for role, content in t for i in content],
    },
    match_every_case=True,
    thorough=True,
    shapes={"the end-of-turn token's label is end_id, the argument, not an id written in (the "
            "chapter's tokenizer's is one of many)": _end_written_in,
            "nothing is labelled in a conversation that has assistant turns: find them by "
            "their role, role == 'assistant' (the role ids are not ordered: case 3's assistant "
            "has the smallest)": _nothing_labelled},
)


# --- my_sft_loss(logits, labels) --------------------------------------------------------------

def _sft_loss(logits: Tensor, labels: Tensor) -> Tensor:
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE)


def _loss_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(16)
    cases = []
    # case 2's second row is labelled from position 0 (a conversation cut at the front), so
    # that rows run into each other when flattened before the shift; case 3 has a label 0 (a
    # real token) and logits large enough that exp() overflows float32
    for batch, length, vocab, counted, scale in (
            (1, 5, 7, [[2, 3, 4]], 1.0),
            (2, 6, 9, [[4, 5], [0, 1, 2, 3, 4, 5]], 1.0),
            (3, 7, 11, [[5, 6], [2, 3, 4, 5], [1, 2, 3, 4, 5, 6]], 40.0)):
        logits = scale * torch.randn(batch, length, vocab, generator=generator)
        labels = torch.full((batch, length), IGNORE)
        for row, positions in enumerate(counted):
            for t in positions:
                labels[row, t] = int(torch.randint(vocab, (1,), generator=generator))
        if scale > 1:
            labels[0, 5] = 0
        cases.append((logits, labels))
    return cases


def _per_position(logits: Tensor, labels: Tensor) -> Tensor:
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1),
                           ignore_index=IGNORE, reduction="none").view(labels.shape[0], -1)


check_sft_loss = Checker(
    reference=_sft_loss,
    cases=_loss_cases(),
    mistakes={
        "shift: the logits at position t predict token t + 1, so score logits[:, :-1] on "
        "labels[:, 1:]; without the shift the model is asked to copy the token it already "
        "sees": lambda logits, labels: F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE),
        "the shift goes the other way: logits[:, :-1] (every position but the last) against "
        "labels[:, 1:] (every label but the first)": lambda logits, labels: F.cross_entropy(
            logits[:, 1:].reshape(-1, logits.shape[-1]), labels[:, :-1].reshape(-1),
            ignore_index=IGNORE),
        "take the mean over all the labelled tokens of the batch at once, not the mean of each "
        "sequence's mean (sequences with longer answers count more)":
            lambda logits, labels: torch.stack([
                row[lab[1:] != IGNORE].mean()
                for row, lab in zip(_per_position(logits, labels), labels)]).mean(),
        "the mean, not the sum: divide by the number of labelled tokens":
            lambda logits, labels: _per_position(logits, labels).sum(),
        "divide by the number of labelled tokens only; the positions with -100 are not part of "
        "the mean": lambda logits, labels: _per_position(logits, labels).mean(),
        "nll_loss expects log-probabilities, not logits: take log_softmax first, or use "
        "cross_entropy, which does both": lambda logits, labels: F.nll_loss(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
            ignore_index=IGNORE),
        "shift the labels against the logits: logits[:, :-1] scores labels[:, 1:]; cut both "
        "at the end and each position is scored on its own token, not the next":
            lambda logits, labels: F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, :-1].reshape(-1),
                ignore_index=IGNORE),
        "shift within each sequence, then flatten: flattened first, the last position of one "
        "row is scored on the first label of the next": lambda logits, labels: F.cross_entropy(
            logits.reshape(-1, logits.shape[-1])[:-1], labels.reshape(-1)[1:],
            ignore_index=IGNORE),
        "-100 marks the positions left out, and token 0 is a real token: select labels != "
        "-100, not labels > 0": lambda logits, labels: _sft_loss(
            logits, labels.masked_fill(labels == 0, IGNORE)),
        "keep -100 in the labels: cross_entropy leaves out the positions labelled -100 (its "
        "ignore_index); replaced by 0, every position counts, as if its next token were token "
        "0": lambda logits, labels: _sft_loss(logits, labels.clamp_min(0)),
    },
    match_every_case=True,
    thorough=True,
    gradients=('logits',),
)


# --- my_lora_forward(x, weight, A, B, alpha) and my_lora_merge(weight, A, B, alpha) -----------

def _lora_forward(x: Tensor, weight: Tensor, A: Tensor, B: Tensor, alpha: float) -> Tensor:
    return x @ weight.T + (alpha / A.shape[0]) * (x @ A.T @ B.T)


def _lora_merge(weight: Tensor, A: Tensor, B: Tensor, alpha: float) -> Tensor:
    return weight + (alpha / A.shape[0]) * (B @ A)


def _lora_cases(with_x: bool) -> list[tuple]:
    generator = torch.Generator().manual_seed(160)
    cases = []
    # r is never 1 (where alpha and alpha / r agree), and alpha never equals r
    for batch, d_in, d_out, r, alpha in ((2, 4, 3, 2, 8.0), (3, 5, 6, 4, 2.0),
                                         (4, 6, 5, 3, 12.0)):
        x = _numbers(generator, batch, d_in)
        weight, A, B = (_numbers(generator, d_out, d_in), _numbers(generator, r, d_in),
                        _numbers(generator, d_out, r))
        cases.append((x, weight, A, B, alpha) if with_x else (weight, A, B, alpha))
    return cases


def _scaled(scale):
    def forward(x, weight, A, B, alpha):
        return x @ weight.T + scale(alpha, A.shape[0]) * (x @ A.T @ B.T)

    def merge(weight, A, B, alpha):
        return weight + scale(alpha, A.shape[0]) * (B @ A)
    return forward, merge


_SCALES = {
    "scale the change by alpha / r, not alpha: r = A.shape[0]; dividing by r keeps the change "
    "the same size when you change the rank": lambda alpha, r: alpha,
    "scale the change by alpha / r, not r / alpha": lambda alpha, r: r / alpha,
    "scale the change by alpha / r: without it the change is as large as B A itself":
        lambda alpha, r: 1.0,
    "alpha / r, not alpha / sqrt(r): dividing by the root is rsLoRA, a variant (PEFT's "
    "use_rslora)": lambda alpha, r: alpha / math.sqrt(r),
    "alpha / r, not alpha // r: floor division rounds the scale down (2 // 4 is 0)":
        lambda alpha, r: alpha // r,
    "compute the scale from the arguments, alpha / r: a scale written in (2, the example's "
    "4 / 2) is right for one layer only": lambda alpha, r: 2.0,
}

check_lora_forward = Checker(
    reference=_lora_forward,
    cases=_lora_cases(with_x=True),
    mistakes={
        **{hint: _scaled(scale)[0] for hint, scale in _SCALES.items() },
        "r is A.shape[0], the rank (A is (r, in_features)), not A.shape[1]":
            lambda x, weight, A, B, alpha: x @ weight.T + alpha / A.shape[1] * (x @ A.T @ B.T),
        "r is A.shape[0] (or B.shape[1]), the rank; B.shape[0] is out_features":
            lambda x, weight, A, B, alpha: x @ weight.T + alpha / B.shape[0] * (x @ A.T @ B.T),
        "add the frozen layer's output, x @ weight.T: LoRA learns a change beside the weight, "
        "not a replacement": lambda x, weight, A, B, alpha: alpha / A.shape[0] * (x @ A.T @ B.T),
        "scale only the change by alpha / r, not the frozen layer's output too":
            lambda x, weight, A, B, alpha: alpha / A.shape[0] * _lora_forward(x, weight, A, B,
                                                                              A.shape[0]),
    },
    match_every_case=True,
    thorough=True,
    gradients=('x', 'A', 'B'),
)

check_lora_merge = Checker(
    reference=_lora_merge,
    cases=_lora_cases(with_x=False),
    mistakes={
        **{hint: _scaled(scale)[1] for hint, scale in _SCALES.items() },
        "r is A.shape[0], the rank (A is (r, in_features)), not A.shape[1]":
            lambda weight, A, B, alpha: weight + alpha / A.shape[1] * (B @ A),
        "add the change to the frozen weight: the merged weight is W + (alpha / r) B A, not "
        "the change alone": lambda weight, A, B, alpha: alpha / A.shape[0] * (B @ A),
        "B @ A is a matrix product, the sum of the r outer products of B's columns with A's "
        "rows, all of them, not only the first": lambda weight, A, B, alpha: weight + alpha / (
            A.shape[0]) * torch.outer(B[:, 0], A[0]),
        "merging adds the change, W + (alpha / r) B A; subtracting it is unmerge":
            lambda weight, A, B, alpha: weight - alpha / A.shape[0] * (B @ A),
        "scale only the change by alpha / r, not the frozen weight too":
            lambda weight, A, B, alpha: alpha / A.shape[0] * (weight + B @ A),
    },
    match_every_case=True,
    thorough=True,
)


# --- my_lora_init(in_features, out_features, r, generator) ------------------------------------

def _lora_init(in_features: int, out_features: int, r: int,
               generator: torch.Generator) -> tuple[Tensor, Tensor]:
    A = torch.randn(r, in_features, generator=generator) / math.sqrt(in_features)
    return A, torch.zeros(out_features, r)


def _init_cases() -> list[tuple]:
    return [(4, 3, 2, torch.Generator().manual_seed(1)),
            (6, 5, 3, torch.Generator().manual_seed(2)),
            (8, 8, 4, torch.Generator().manual_seed(3))]


_A_ZERO = ("B starts at zero, not A, as in the LoRA paper and PEFT: either way B A = 0 and the "
           "model starts as its base, but with A = 0 the gradient of B (the output's gradient "
           "times A x) is zero at first; with B = 0, A x is a fixed random projection from the "
           "first step and B learns how much of it to use")


def _a_zero(scale):
    def init(in_features, out_features, r, generator):
        B = torch.randn(out_features, r, generator=generator) * scale(in_features, r)
        return torch.zeros(r, in_features), B
    return init


def _kaiming_uniform(in_features, out_features, r, generator):
    A = torch.nn.init.kaiming_uniform_(torch.empty(r, in_features), a=math.sqrt(5),
                                       generator=generator)
    return A, torch.zeros(out_features, r)


def _A_right_B_not_zero(cases, answers) -> bool:
    return all(torch.allclose(A, _lora_init(*case)[0]) and B.shape == (case[1], case[2])
               and bool(B.abs().sum() > 0) for case, (A, B) in zip(cases, answers))


def _A_not_drawn(cases, answers) -> bool:
    """B zero and A of the right shape, but its numbers neither the generator's first draws
    nor a multiple of them, nor the same numbers in another order."""
    for case, (A, B) in zip(cases, answers):
        want = _lora_init(*case)[0]
        if A.shape != want.shape or B.shape != (case[1], case[2]) or bool(B.abs().sum() > 0):
            return False
        ratio = A.flatten()[0] / want.flatten()[0]
        if torch.allclose(A, ratio * want) or torch.allclose(A.flatten().sort().values,
                                                           want.flatten().sort().values):
            return False
    return True


check_lora_init = Checker(
    reference=_lora_init,
    cases=_init_cases(),
    mistakes={
        "your A is Kaiming-uniform, as PEFT and the package draw it: a valid start too (B = 0 "
        "is what matters), but this exercise asks for torch.randn(r, in_features, "
        "generator=generator) / sqrt(in_features), so that the checker can compare the draws":
            _kaiming_uniform,
        _A_ZERO + " (your B is drawn as A should be)": _a_zero(lambda n, r: 1 / math.sqrt(n)),
        _A_ZERO + " (and your B is drawn with scale 1/sqrt(r))": _a_zero(lambda n, r: 1 / r**.5),
        _A_ZERO + " (and your B is drawn without a scale)": _a_zero(lambda n, r: 1.0),
        "start A random: with A = 0 and B = 0 every gradient of A and B is zero, and LoRA "
        "never learns anything": lambda n, m, r, g: (torch.zeros(r, n), torch.zeros(m, r)),
        "B starts at zero, so that the model starts exactly equal to its base (B A = 0)":
            lambda n, m, r, g: (_lora_init(n, m, r, g)[0],
                                torch.randn(m, r, generator=g) / math.sqrt(n)),
        "divide A's draws by sqrt(in_features), the scale at which x's features add up":
            lambda n, m, r, g: (torch.randn(r, n, generator=g), torch.zeros(m, r)),
        "A is (r, in_features) and B is (out_features, r), the layout of nn.Linear's weights "
        "(lora_A maps in_features to r)": lambda n, m, r, g: (
            torch.randn(n, r, generator=g) / math.sqrt(n), torch.zeros(r, m)),
    },
    match_every_case=True,
    thorough=True,
    shapes={
        "B starts at zero, torch.zeros(out_features, r), so that the model starts exactly "
        "equal to its base (B A = 0); only A is random": _A_right_B_not_zero,
        "A's numbers are not the generator's first r * in_features normal draws: draw A "
        "first, as one torch.randn(r, in_features, generator=generator) (torch.rand is "
        "uniform; without generator= the global generator draws; reseeding it, or drawing B "
        "before A, starts elsewhere)": _A_not_drawn,
    },
)


# --- my_lora_parameter_count(shapes, r) -------------------------------------------------------

def _parameter_count(shapes, r):
    return sum(r * (d_in + d_out) for d_out, d_in in shapes)


check_lora_parameter_count = Checker(
    reference=_parameter_count,
    # case 4's layers all differ, so that a count from the first layer's shape alone shows
    cases=[([(8, 8)], 2), ([(6, 4), (4, 6)], 3), ([(64, 64), (16, 64), (16, 64), (64, 64)], 4),
           ([(172, 64), (64, 172), (48, 64)], 8)],
    mistakes={
        "A is (r, in_features) and B is (out_features, r): r * (in + out) numbers, not "
        "r * in * out": lambda shapes, r: sum(r * i * o for o, i in shapes),
        "that is the frozen weight's size, in * out; LoRA trains r * (in + out)":
            lambda shapes, r: sum(i * o for o, i in shapes),
        "count both A (r * in_features) and B (out_features * r)":
            lambda shapes, r: sum(r * i for o, i in shapes),
        "count both B (out_features * r) and A (r * in_features)":
            lambda shapes, r: sum(r * o for o, i in shapes),
        "the counts of all the layers add up: sum over shapes":
            lambda shapes, r: r * (shapes[0][0] + shapes[0][1]),
        "the counts of all the layers add up: sum over shapes (yours counts the last layer "
        "only: total += ..., not total = ...)":
            lambda shapes, r: r * (shapes[-1][0] + shapes[-1][1]),
        "each layer's in_features and out_features may differ: r * (in + out), not 2 * r * in":
            lambda shapes, r: sum(2 * r * i for o, i in shapes),
        "every layer is counted with its own shape: the layers differ, so sum r * (in + out) "
        "over them, not len(shapes) times the first layer's":
            lambda shapes, r: len(shapes) * r * (shapes[0][0] + shapes[0][1]),
        "mind the brackets: r * (in + out), not r * in + out":
            lambda shapes, r: sum(r * i + o for o, i in shapes),
        "count every layer, those of the same shape too: sum over the list, not over a set of "
        "its shapes": lambda shapes, r: sum(r * (i + o) for o, i in set(map(tuple, shapes))),
        "the sum over the layers, not their mean": lambda shapes, r: sum(
            r * (i + o) for o, i in shapes) // len(shapes),
        "A has r rows and B r columns: r * (in + out), not (r + 1) * (in + out)":
            lambda shapes, r: sum((r + 1) * (i + o) for o, i in shapes),
        "r * (in + out): in_features for A and out_features for B, not twice the larger":
            lambda shapes, r: sum(2 * r * max(i, o) for o, i in shapes),
        "count only what LoRA trains, r * (in + out) per layer: the frozen weight's in * out "
        "numbers are not trained": lambda shapes, r: sum(r * (i + o) + i * o for o, i in shapes),
        "count only A and B: the layer's bias is frozen with its weight (out_features numbers "
        "that are not trained)": lambda shapes, r: sum(r * (i + o) + o for o, i in shapes),
    },
    whole_numbers=True,
    match_every_case=True,
    thorough=True,
)
