"""The checkers of chapter 10: they accept correct answers and explain plausible wrong ones."""

import math
import warnings

import pytest
import torch

from minitransformer import padding_mask
from minitransformer.exercises import chapter10
from minitransformer.exercises.chapter10 import (
    check_cross_attention,
    check_decoder_input_and_targets,
    check_source_padding_mask,
)

# --- correct solutions, written the way the book's solutions are ----------------------------


def my_cross_attention(target, memory, w_q, w_k, w_v):
    q = target @ w_q                                   # (T_tgt, d_k): from the target
    k, v = memory @ w_k, memory @ w_v                  # (T_src, d_k), (T_src, d_v)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)
    return weights @ v                                 # (T_tgt, d_v)


def sdpa_cross_attention(target, memory, w_q, w_k, w_v):
    return torch.nn.functional.scaled_dot_product_attention(target @ w_q, memory @ w_k,
                                                            memory @ w_v)


def source_padding_mask(src, pad_id):
    return (src != pad_id).unsqueeze(1).unsqueeze(2)


def package_padding_mask(src, pad_id):
    return padding_mask(src, pad_id)


def decoder_input_and_targets(sentences, bos_id, eos_id, pad_id):
    width = max(len(s) for s in sentences) + 1
    tgt_in = torch.full((len(sentences), width), pad_id)
    targets = torch.full((len(sentences), width), pad_id)
    for row, words in enumerate(sentences):
        tgt_in[row, : len(words) + 1] = torch.tensor([bos_id, *words])
        targets[row, : len(words) + 1] = torch.tensor([*words, eos_id])
    return tgt_in, targets


CHECKERS = {
    "cross_attention": (check_cross_attention, my_cross_attention),
    "cross_attention_by_pytorch": (check_cross_attention, sdpa_cross_attention),
    "source_padding_mask": (check_source_padding_mask, source_padding_mask),
    "source_padding_mask_by_the_package": (check_source_padding_mask, package_padding_mask),
    "decoder_input_and_targets": (check_decoder_input_and_targets, decoder_input_and_targets),
}


def test_module_exports_every_checker():
    assert sorted(chapter10.__all__) == ["check_cross_attention",
                                         "check_decoder_input_and_targets",
                                         "check_source_padding_mask"]


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


# --- specific wrong answers a learner writes, with the hint they see ------------------------

def test_queries_from_the_memory(capsys):
    def swapped(target, memory, w_q, w_k, w_v):
        return my_cross_attention(memory, target, w_q, w_k, w_v)

    assert not check_cross_attention(swapped)
    out = capsys.readouterr().out
    assert "(expected shape (2, 3) but got shape (3, 3))" in out
    assert out.endswith("Hint: the queries come from the target (the sentence being written) and "
                        "the keys and values from the memory (the sentence being read): the "
                        "output has one row per target token\n")


@pytest.mark.parametrize("wrong, hint", [
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).T, -1) @ (m @ wv),
     "divide the scores by sqrt(d_k)"),
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).transpose(-2, -1)
                                            / math.sqrt(wk.shape[1]), -2) @ (m @ wv),
     "softmax over the keys, the last dimension"),
    (lambda t, m, wq, wk, wv: my_cross_attention(t, t, wq, wk, wv),
     "that is self-attention on the target"),
], ids=["no scaling", "softmax over queries", "self-attention"])
def test_cross_attention_mistakes(wrong, hint, capsys):
    assert not check_cross_attention(wrong)
    assert f"Hint: {hint}" in capsys.readouterr().out


def test_values_from_the_target_raise_and_get_a_hint(capsys):
    def values_from_target(target, memory, w_q, w_k, w_v):
        q, k, v = target @ w_q, memory @ w_k, target @ w_v
        return torch.softmax(q @ k.T / math.sqrt(k.shape[-1]), dim=-1) @ v

    assert not check_cross_attention(values_from_target)
    out = capsys.readouterr().out
    assert "your function raised RuntimeError" in out
    assert "Hint: the values come from the memory too" in out


@pytest.mark.parametrize("wrong, hint", [
    (lambda src, pad: (src == pad)[:, None, None, :], "the mask says where a query may attend"),
    (lambda src, pad: src != pad, "give the mask two more dimensions"),
    (lambda src, pad: (src != pad)[:, None, :, None], "the source positions are the keys"),
    (lambda src, pad: (src != pad)[:, None, None, :].float(), "keep the mask boolean"),
], ids=["inverted", "(B, T)", "query dimension", "float"])
def test_padding_mask_mistakes(wrong, hint, capsys):
    assert not check_source_padding_mask(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[5, 6, 7], [8, 0, 0]], 0) expected ")
    assert f"Hint: {hint}" in out


def test_a_mask_built_with_the_pad_id_zero_hard_coded_fails_case_three(capsys):
    assert not check_source_padding_mask(lambda src, pad: (src != 0)[:, None, None, :])
    assert capsys.readouterr().out.startswith("✗ case 3: for input ([[3, 1, 1], [2, 2, 3]], 1)")


@pytest.mark.parametrize("which, hint", [
    ("no shift", "the decoder input starts with bos_id and the targets are the same words"),
    ("swapped", "the two are swapped"),
    ("eos padding", "fill the shorter rows with pad_id"),
    ("no eos", "end every target row with eos_id"),
    ("no bos", "start every decoder input with bos_id"),
])
def test_decoder_pair_mistakes(which, hint, capsys):
    def wrong(sentences, bos_id, eos_id, pad_id):
        tgt_in, targets = decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
        if which == "no shift":
            return targets, targets
        if which == "swapped":
            return targets, tgt_in
        if which == "eos padding":
            return tgt_in.masked_fill(tgt_in == pad_id, eos_id), \
                targets.masked_fill(targets == pad_id, eos_id)
        if which == "no eos":
            return tgt_in, targets.masked_fill(targets == eos_id, pad_id)
        return torch.cat([tgt_in[:, 1:], torch.full_like(tgt_in[:, :1], pad_id)], 1), targets

    assert not check_decoder_input_and_targets(wrong)
    assert f"Hint: {hint}" in capsys.readouterr().out


def test_hard_coded_special_ids_fail_the_last_case(capsys):
    assert not check_decoder_input_and_targets(
        lambda sentences, bos, eos, pad: decoder_input_and_targets(sentences, 1, 2, 0))
    assert capsys.readouterr().out.startswith("✗ case 4: for input ([[7, 8], [9]], 4, 5, 3)")


# --- mistakes found by solving the exercises wrongly on purpose (review of chapter 10) ------

@pytest.mark.filterwarnings("ignore::UserWarning")  # k.T on a 3-D tensor is deprecated
@pytest.mark.parametrize("wrong, case, hint", [
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).transpose(-2, -1)
                                            / math.sqrt(t.shape[-1]), -1) @ (m @ wv),
     2, "divide by sqrt(d_k), the width of the queries and keys"),
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).transpose(-2, -1)
                                            / math.sqrt(wk.shape[1]), -1),
     1, "those are the weights (T_tgt, T_src)"),
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).T
                                            / math.sqrt(wk.shape[1]), -1) @ (m @ wv),
     3, "k.T reverses every dimension of a batched"),
    (lambda t, m, wq, wk, wv: torch.softmax((t @ wq) @ (m @ wk).transpose(0, 1)
                                            / math.sqrt(wk.shape[1]), -1) @ (m @ wv),
     3, "k.transpose(0, 1) swaps the first two dimensions"),
], ids=["sqrt(d_model)", "returns the weights", "k.T on a batch", "transpose(0, 1) on a batch"])
def test_more_cross_attention_mistakes(wrong, case, hint, capsys):
    assert not check_cross_attention(wrong)
    out = capsys.readouterr().out
    assert out.startswith(f"✗ case {case}:") and f"Hint: {hint}" in out


def test_the_checkers_own_mistakes_warn_about_nothing(capsys):
    """The known mistakes run on every failing answer; the k.T one is written without k.T on a
    3-D tensor, which PyTorch deprecates with a UserWarning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hint, wrong in check_cross_attention.mistakes.items():
            assert not check_cross_attention(wrong)
            assert capsys.readouterr().out.rstrip("\n").endswith(f"Hint: {hint}")
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("wrong, case, hint", [
    (lambda src, pad: (src != 0)[:, None, None, :], 3, "compare with the argument pad_id"),
    (lambda src, pad: (src != pad)[:, None, :], 1, "(B, 1, T_src) is one dimension short"),
    (lambda src, pad: (src != pad)[:, None, None, :].expand(-1, 1, src.shape[1], -1), 1,
     "leave the query dimension at size 1"),
    (lambda src, pad: torch.zeros(src.shape).masked_fill(src == pad, -math.inf)[:, None, None],
     1, "that is the additive form"),
], ids=["pad 0 hard-coded", "(B, 1, T)", "(B, 1, T, T)", "additive"])
def test_more_padding_mask_mistakes(wrong, case, hint, capsys):
    assert not check_source_padding_mask(wrong)
    out = capsys.readouterr().out
    assert out.startswith(f"✗ case {case}:") and f"Hint: {hint}" in out


def _left_padded(sentences, bos_id, eos_id, pad_id):
    width = max(len(s) for s in sentences) + 1
    return (torch.tensor([[pad_id] * (width - 1 - len(s)) + [bos_id, *s] for s in sentences]),
            torch.tensor([[pad_id] * (width - 1 - len(s)) + [*s, eos_id] for s in sentences]))


def _eos_last(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    targets = targets.masked_fill(targets == eos_id, pad_id)
    targets[:, -1] = eos_id
    return tgt_in, targets


def _sliced(sentences, bos_id, eos_id, pad_id):
    width = max(len(s) for s in sentences) + 2
    rows = torch.full((len(sentences), width), pad_id)
    for row, words in enumerate(sentences):
        rows[row, : len(words) + 2] = torch.tensor([bos_id, *words, eos_id])
    return rows[:, :-1], rows[:, 1:]


@pytest.mark.parametrize("wrong, hint", [
    (_left_padded, "pad on the right"),
    (_eos_last, "eos_id goes right after the last word"),
    (_sliced, "the decoder input is bos_id and the words, then pad_id, with no eos_id"),
    (lambda sentences, b, e, p: decoder_input_and_targets(sentences, 1, 2, 0),
     "use the arguments bos_id, eos_id and pad_id"),
], ids=["left padding", "eos after the padding", "sliced from one row", "hard-coded ids"])
def test_more_decoder_pair_mistakes(wrong, hint, capsys):
    assert not check_decoder_input_and_targets(wrong)
    assert f"Hint: {hint}" in capsys.readouterr().out


# --- mistakes found by a learner's review of chapters 8-10 -----------------------------------

def test_scaled_by_the_width_of_the_values(capsys):
    def by_d_v(target, memory, w_q, w_k, w_v):
        q, k, v = target @ w_q, memory @ w_k, memory @ w_v
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), -1) @ v

    assert not check_cross_attention(by_d_v)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith("Hint: divide by sqrt(d_k), the width of the queries and keys "
                        "(k.shape[-1]), not by the width of the values (v.shape[-1], d_v): "
                        "here they differ\n")


def test_the_first_case_fails_in_a_readable_line(capsys):
    # case 1 is printed in full; it must be small enough to read at a glance
    assert not check_cross_attention(lambda t, m, wq, wk, wv: t @ wq)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert len(out) < 400


def test_a_width_one_short_is_explained(capsys):
    # width = the longest sentence, forgetting the <bos>/<eos> place: the longest row comes out
    # one longer than the others, and torch.tensor refuses the ragged list
    def one_short(sentences, bos_id, eos_id, pad_id):
        width = max(len(words) for words in sentences)
        tgt_in = [[bos_id, *w] + [pad_id] * (width - 1 - len(w)) for w in sentences]
        targets = [[*w, eos_id] + [pad_id] * (width - 1 - len(w)) for w in sentences]
        return torch.tensor(tgt_in), torch.tensor(targets)

    assert not check_decoder_input_and_targets(one_short)
    out = capsys.readouterr().out
    assert "raised ValueError: expected sequence of length 4 at dim 1 (got 3)" in out
    assert out.endswith("Hint: both tensors are (B, T_max + 1): the longest sentence needs "
                        "T_max + 1 places, with <bos> in front or <eos> behind, so width = "
                        "max(len(words) for words in sentences) + 1\n")


def test_a_width_one_short_filled_into_padding_is_explained(capsys):
    # the same mistake written with torch.full and slice assignment: the longest sentence's
    # <bos> + words does not fit its row, and torch names only the sizes
    def one_short(sentences, bos_id, eos_id, pad_id):
        width = max(len(words) for words in sentences)
        tgt_in = torch.full((len(sentences), width), pad_id, dtype=torch.long)
        targets = torch.full((len(sentences), width), pad_id, dtype=torch.long)
        for i, words in enumerate(sentences):
            targets[i, :len(words) + 1] = torch.tensor(words + [eos_id])
            tgt_in[i, :len(words) + 1] = torch.tensor([bos_id] + words)
        return tgt_in, targets

    assert not check_decoder_input_and_targets(one_short)
    out = capsys.readouterr().out
    assert "raised RuntimeError: The expanded size of the tensor (3) must match" in out
    assert out.endswith("Hint: both tensors are (B, T_max + 1): the longest sentence needs "
                        "T_max + 1 places, with <bos> in front or <eos> behind, so make the "
                        "torch.full tensors max(len(words) for words in sentences) + 1 wide\n")


# --- mistakes found by a learner's review of chapters 8-12 (issue 25) ------------------------

def _padded_one_too_many(sentences, bos_id, eos_id, pad_id):
    # width = T_max + 1, but each row padded with width - len(words): one pad_id too many
    width = max(len(words) for words in sentences) + 1
    tgt_in = [[bos_id, *w] + [pad_id] * (width - len(w)) for w in sentences]
    targets = [[*w, eos_id] + [pad_id] * (width - len(w)) for w in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


def _filled_one_too_wide(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences) + 2
    tgt_in = torch.full((len(sentences), width), pad_id)
    targets = torch.full((len(sentences), width), pad_id)
    for row, words in enumerate(sentences):
        tgt_in[row, :len(words) + 1] = torch.tensor([bos_id, *words])
        targets[row, :len(words) + 1] = torch.tensor([*words, eos_id])
    return tgt_in, targets


def _eos_read_as_input(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences) + 2
    tgt_in = [[bos_id, *w, eos_id] + [pad_id] * (width - 2 - len(w)) for w in sentences]
    targets = [[*w, eos_id] + [pad_id] * (width - 1 - len(w)) for w in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


def _padded_then_cut(sentences, bos_id, eos_id, pad_id):
    # width = T_max, each row padded generously and cut to width: the longest row loses one
    width = max(len(words) for words in sentences)
    tgt_in = [([bos_id, *w] + [pad_id] * width)[:width] for w in sentences]
    targets = [([*w, eos_id] + [pad_id] * width)[:width] for w in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


EXTRA_COLUMN_HINT = (
    "Hint: both tensors are (B, T_max + 1), and yours have one more column, all pad_id: <bos> "
    "and the longest sentence fill T_max + 1 places exactly, so that row needs no padding (a "
    "row gets width - 1 - len(words) pad_id, with width = T_max + 1)\n")


@pytest.mark.parametrize("wrong, hint", [
    (_padded_one_too_many, EXTRA_COLUMN_HINT),
    (_filled_one_too_wide, EXTRA_COLUMN_HINT),
    (_eos_read_as_input,
     "Hint: the decoder input is bos_id and the words, with no eos_id: the last word's "
     "position is the one trained to predict eos_id, and an <eos> read as input would have "
     "nothing after it to predict. Both tensors are (B, T_max + 1)\n"),
    (_padded_then_cut,
     "Hint: both tensors are (B, T_max + 1): the longest sentence needs T_max + 1 places, "
     "with <bos> in front or <eos> behind; cut to T_max, its last word falls off tgt_in and "
     "its eos_id off targets\n"),
], ids=["padded one too many", "torch.full one too wide", "eos in the input",
        "cut to T_max"])
def test_decoder_pairs_of_the_wrong_width_are_named(wrong, hint, capsys):
    # learner review (issue 25): an extra position, and a width too short that raises nothing,
    # got no hint
    assert not check_decoder_input_and_targets(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[5, 6, 7]], 1, 2, 0) expected "
                          "([[1, 5, 6, 7]], [[5, 6, 7, 2]])")
    assert out.endswith(hint)
