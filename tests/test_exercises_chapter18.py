"""The checkers of chapter 18: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it (not copied from the
checker's own list of mistakes). The four mistakes the chapter names are each asserted to fail
with their hint: right padding, positions counted from the pad, forgetting to rescale the older
partial sum, and freeing a block that another request still uses. A catalogue of typical wrong
answers checks that none passes and that at least 90% of them get a hint of their own.
"""

import math

import pytest
import torch

from minitransformer.batching import left_pad
from minitransformer.exercises import chapter18
from minitransformer.exercises.chapter18 import (
    check_blocks_to_free,
    check_grow_block_table,
    check_left_pad,
    check_merge_partials,
    partial_softmax,
)
from minitransformer.paged_cache import BlockPool, merge_partials

# --- correct answers ----------------------------------------------------------------------------


def my_left_pad(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return idx, mask, positions


def my_left_pad_with_lists(prompts, pad_id):
    width = max(map(len, prompts))
    idx = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[False] * (width - len(p)) + [True] * len(p) for p in prompts]
    positions = [[0] * (width - len(p)) + list(range(len(p))) for p in prompts]
    return torch.tensor(idx), torch.tensor(mask), torch.tensor(positions)


def my_left_pad_masked_fill(prompts, pad_id):
    width = max(len(p) for p in prompts)
    rows = [torch.cat([torch.full((width - len(p),), pad_id), torch.tensor(p)])
            for p in prompts]
    lengths = torch.tensor([len(p) for p in prompts])
    mask = torch.arange(width) >= (width - lengths)[:, None]
    positions = (mask.cumsum(-1) - 1).masked_fill(~mask, 0)
    return torch.stack(rows), mask, positions


def my_grow_block_table(block_table, num_tokens, free_blocks, block_size):
    needed = math.ceil(num_tokens / block_size)
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def my_grow_block_table_one_by_one(block_table, num_tokens, free_blocks, block_size):
    table, free = list(block_table), list(free_blocks)
    while len(table) * block_size < num_tokens:
        table.append(free.pop(0))
    return table, free


def my_blocks_to_free(block_tables, finished):
    others = set()
    for request, table in block_tables.items():
        if request != finished:
            others.update(table)
    return sorted(b for b in set(block_tables[finished]) if b not in others)


def my_blocks_to_free_by_counting(block_tables, finished):
    count = {}
    for table in block_tables.values():
        for block in table:
            count[block] = count.get(block, 0) + 1
    return sorted(b for b in block_tables[finished] if count[b] == 1)


def my_merge_partials(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def my_merge_partials_with_logsumexp(m1, l1, o1, m2, l2, o2):
    m = torch.stack([m1, m2]).max(0).values
    lse = torch.logaddexp(m1 + l1.log(), m2 + l2.log())
    l = torch.exp(lse - m)
    o = (o1 * torch.exp(m1 - m).unsqueeze(-1) + o2 * torch.exp(m2 - m).unsqueeze(-1))
    return m, l, o


CORRECT = {
    "left_pad": (check_left_pad, my_left_pad),
    "left_pad_lists": (check_left_pad, my_left_pad_with_lists),
    "left_pad_masked_fill": (check_left_pad, my_left_pad_masked_fill),
    "grow": (check_grow_block_table, my_grow_block_table),
    "grow_one_by_one": (check_grow_block_table, my_grow_block_table_one_by_one),
    "free": (check_blocks_to_free, my_blocks_to_free),
    "free_counting": (check_blocks_to_free, my_blocks_to_free_by_counting),
    "merge": (check_merge_partials, my_merge_partials),
    "merge_logsumexp": (check_merge_partials, my_merge_partials_with_logsumexp),
}


def test_module_exports_every_checker():
    assert sorted(chapter18.__all__) == [
        "check_blocks_to_free", "check_grow_block_table", "check_left_pad",
        "check_merge_partials"]


@pytest.mark.parametrize("name", CORRECT)
def test_accepts_correct_answers(name, capsys):
    checker, solution = CORRECT[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_merged_partials_give_softmax_attention():
    """The reference's merge, divided by l at the end, is softmax attention over both blocks."""
    for queries, keys1, keys2 in ((1, 3, 2), (3, 4, 6)):
        scores = torch.randn(queries, keys1 + keys2) * 3
        values = torch.randn(keys1 + keys2, 5)
        first = partial_softmax(scores[:, :keys1], values[:keys1])
        second = partial_softmax(scores[:, keys1:], values[keys1:])
        m, l, o = check_merge_partials.reference(*first, *second)
        torch.testing.assert_close(o / l[:, None], scores.softmax(-1) @ values)
        torch.testing.assert_close(m, scores.max(-1).values)


def test_the_references_are_the_packages():
    """The checkers' references agree with batching.left_pad, paged_cache.merge_partials and
    BlockPool.blocks_for, so that the exercises teach what the package does."""
    for prompts, pad in check_left_pad.cases:
        for mine, theirs in zip(check_left_pad.reference(prompts, pad),
                                left_pad(prompts, pad_id=pad)):
            assert mine.dtype == theirs.dtype
            assert torch.equal(mine, theirs)
    for case in check_merge_partials.cases:
        for mine, theirs in zip(check_merge_partials.reference(*case), merge_partials(*case)):
            torch.testing.assert_close(mine, theirs)
    for table, num_tokens, free, block_size in check_grow_block_table.cases:
        pool = BlockPool(16, block_size, num_layers=1, num_kv_heads=1, head_dim=1)
        grown, _ = check_grow_block_table.reference(table, num_tokens, free, block_size)
        assert len(grown) == max(len(table), pool.blocks_for(num_tokens))


def test_the_cases_tell_the_older_and_newer_maxima_apart():
    """In some case the older block's maximum is the larger, in another the newer one's, for
    some query row: otherwise forgetting to rescale one of them could pass."""
    older = newer = False
    for m1, _, _, m2, _, _ in check_merge_partials.cases:
        older |= bool((m1 > m2).any())
        newer |= bool((m2 > m1).any())
    assert older and newer


def test_the_cases_share_blocks_and_hold_the_pad_id():
    assert any(len(set(tables[done]) & {b for r, t in tables.items() if r != done for b in t})
               for tables, done in check_blocks_to_free.cases)
    assert any(pad in token_ids for prompts, pad in check_left_pad.cases for token_ids in prompts)


def _hint(checker, function, capsys):
    assert not checker(function)
    out = capsys.readouterr().out
    assert out.startswith("✗"), out
    assert "Hint: " in out, out
    return out.rstrip("\n").split("Hint: ", 1)[1]


# --- the four mistakes the chapter names ---------------------------------------------------------

def test_right_padding(capsys):
    def pad(prompts, pad_id):
        width = max(len(p) for p in prompts)
        idx = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts])
        mask = torch.tensor([[True] * len(p) + [False] * (width - len(p)) for p in prompts])
        positions = torch.tensor([list(range(len(p))) + [0] * (width - len(p))
                                  for p in prompts])
        return idx, mask, positions
    assert "pad on the left" in _hint(check_left_pad, pad, capsys)


@pytest.mark.parametrize("pads_at", ["last position", "-1", "1", "column"])
def test_right_padding_whatever_the_pads_positions(pads_at, capsys):
    """Right padding is one mistake, whatever positions the pads get: the hint does not depend
    on them (cumsum(-1) - 1 clamped at 0 gives a pad its prompt's last position)."""
    def pad(prompts, pad_id):
        width = max(len(p) for p in prompts)
        idx = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts])
        mask = torch.tensor([[True] * len(p) + [False] * (width - len(p)) for p in prompts])
        positions = {"last position": (mask.cumsum(-1) - 1).clamp(min=0),
                     "-1": (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1),
                     "1": (mask.long().cumsum(-1) - 1).masked_fill(~mask, 1),
                     "column": torch.arange(width).repeat(len(prompts), 1)}[pads_at]
        return idx, mask, positions
    assert "pad on the left" in _hint(check_left_pad, pad, capsys)


def test_a_table_grown_in_place_fails(capsys):
    """The exercise asks for two new lists: a function that appends to the caller's table and
    pops the caller's free list returns the right values, and fails with its hint."""
    def grow(block_table, num_tokens, free_blocks, block_size):
        while len(block_table) * block_size < num_tokens:
            block_table.append(free_blocks.pop(0))
        return block_table, free_blocks
    hint = _hint(check_grow_block_table, grow, capsys)
    assert "return two new lists" in hint


def test_positions_counted_from_the_pad(capsys):
    def pad(prompts, pad_id):
        width = max(len(p) for p in prompts)
        idx = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
        positions = torch.arange(width).repeat(len(prompts), 1)
        return idx, mask, positions
    assert "from each prompt's first real token" in _hint(check_left_pad, pad, capsys)


def test_older_partial_sum_not_rescaled(capsys):
    def merge(m1, l1, o1, m2, l2, o2):
        m = torch.max(m1, m2)
        scale = torch.exp(m2 - m)
        return m, l1 + scale * l2, o1 + scale[:, None] * o2
    assert "rescale the older partial too" in _hint(check_merge_partials, merge, capsys)


def test_freeing_a_block_still_in_use(capsys):
    def free(block_tables, finished):
        return sorted(block_tables[finished])
    assert "still in use" in _hint(check_blocks_to_free, free, capsys)


# --- a catalogue of wrong answers, written as a learner would ------------------------------------

def _right_pad_cumsum(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[i < len(p) for i in range(width)] for p in prompts])
    return idx, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _right_pad_arange(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.tensor([p + [pad_id] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[i < len(p) for i in range(width)] for p in prompts])
    return idx, mask, torch.arange(width).expand(len(prompts), -1)


def _positions_from_one(prompts, pad_id):
    idx, mask, _ = my_left_pad(prompts, pad_id)
    return idx, mask, mask.long().cumsum(-1)


def _positions_minus_one(prompts, pad_id):
    idx, mask, _ = my_left_pad(prompts, pad_id)
    return idx, mask, mask.long().cumsum(-1) - 1


def _positions_as_transformers(prompts, pad_id):
    idx, mask, _ = my_left_pad(prompts, pad_id)
    positions = mask.long().cumsum(-1) - 1
    positions.masked_fill_(mask == 0, 1)
    return idx, mask, positions


def _positions_of_columns_on_real(prompts, pad_id):
    idx, mask, _ = my_left_pad(prompts, pad_id)
    return idx, mask, torch.arange(idx.shape[1]) * mask


def _mask_as_ints(prompts, pad_id):
    idx, mask, positions = my_left_pad(prompts, pad_id)
    return idx, mask.int().long(), positions


def _mask_as_floats(prompts, pad_id):
    idx, mask, positions = my_left_pad(prompts, pad_id)
    return idx, mask.float(), positions


def _mask_inverted(prompts, pad_id):
    idx, mask, positions = my_left_pad(prompts, pad_id)
    return idx, ~mask, positions


def _pads_of_zero(prompts, pad_id):
    idx, mask, positions = my_left_pad(prompts, 0)
    return idx, mask, positions


def _mask_from_the_ids(prompts, pad_id):
    idx, _, _ = my_left_pad(prompts, pad_id)
    mask = idx != pad_id
    return idx, mask, (mask.long().cumsum(-1) - 1).clamp_min(0)


def _grow_floor(table, num_tokens, free, block_size):
    missing = max(0, num_tokens // block_size - len(table))
    return table + free[:missing], free[missing:]


def _grow_plus_one(table, num_tokens, free, block_size):
    missing = max(0, num_tokens // block_size + 1 - len(table))
    return table + free[:missing], free[missing:]


def _grow_whole_request(table, num_tokens, free, block_size):
    k = math.ceil(num_tokens / block_size)
    return table + free[:k], free[k:]


def _grow_always_one(table, num_tokens, free, block_size):
    return table + [free[0]], free[1:]


def _grow_pop(table, num_tokens, free, block_size):
    table, free = list(table), list(free)
    while len(table) * block_size < num_tokens:
        table.append(free.pop())
    return table, free


def _grow_keeps_free(table, num_tokens, free, block_size):
    missing = max(0, math.ceil(num_tokens / block_size) - len(table))
    return table + free[:missing], free


def _grow_in_place(table, num_tokens, free, block_size):
    while len(table) * block_size < num_tokens:
        table.append(free.pop(0))
    return table, free


def _grow_same_lists_when_none_needed(table, num_tokens, free, block_size):
    missing = math.ceil(num_tokens / block_size) - len(table)
    if missing <= 0:
        return table, free
    return table + free[:missing], free[missing:]


def _grow_from_the_end(table, num_tokens, free, block_size):
    missing = max(0, math.ceil(num_tokens / block_size) - len(table))
    return table + free[len(free) - missing:], free[:len(free) - missing]


def _grow_from_the_end_slice(table, num_tokens, free, block_size):
    missing = max(0, math.ceil(num_tokens / block_size) - len(table))
    return table + free[-missing:], free[:-missing]


def _free_others(tables, finished):
    mine = set(tables[finished])
    return sorted({b for r, t in tables.items() if r != finished for b in t} - mine)


def _free_shared_only(tables, finished):
    others = {b for r, t in tables.items() if r != finished for b in t}
    return sorted(b for b in tables[finished] if b in others)


def _free_positions(tables, finished):
    others = {b for r, t in tables.items() if r != finished for b in t}
    return [i for i in range(len(tables[finished])) if i not in others]


def _free_unsorted(tables, finished):
    others = {b for r, t in tables.items() if r != finished for b in t}
    return [b for b in tables[finished] if b not in others]


def _free_as_set(tables, finished):
    others = {b for r, t in tables.items() if r != finished for b in t}
    return set(tables[finished]) - others


def _free_last_block(tables, finished):
    last = tables[finished][-1]
    others = {b for r, t in tables.items() if r != finished for b in t}
    return [] if last in others else [last]


def _grow_while_at_most(table, num_tokens, free, block_size):
    table, free = list(table), list(free)
    while len(table) * block_size <= num_tokens:
        table.append(free.pop(0))
    return table, free


def _merge_with_max(m1, l1, o1, m2, l2, o2):
    m = max(m1, m2)
    return (m, torch.exp(m1 - m) * l1 + torch.exp(m2 - m) * l2,
            torch.exp(m1 - m)[:, None] * o1 + torch.exp(m2 - m)[:, None] * o2)


def _merge_with_math_exp(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    old, new = math.exp(m1 - m), math.exp(m2 - m)
    return m, old * l1 + new * l2, old * o1 + new * o2


def _merge_newer_maximum(m1, l1, o1, m2, l2, o2):
    a = torch.exp(m1 - m2)
    return m2, a * l1 + l2, a[:, None] * o1 + o2


def _merge_older_maximum(m1, l1, o1, m2, l2, o2):
    b = torch.exp(m2 - m1)
    return m1, l1 + b * l2, o1 + b[:, None] * o2


def _merge_no_rescale(m1, l1, o1, m2, l2, o2):
    return torch.maximum(m1, m2), l1 + l2, o1 + o2


def _merge_old_output_only(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, o1 + b[:, None] * o2


def _merge_old_sum_only(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def _merge_new_not_rescaled(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a = torch.exp(m1 - m)
    return m, a * l1 + l2, a[:, None] * o1 + o2


def _merge_flipped(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m - m1), torch.exp(m - m2)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def _merge_min(m1, l1, o1, m2, l2, o2):
    m = torch.minimum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def _merge_weighted_by_l(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = l1 * torch.exp(m1 - m), l2 * torch.exp(m2 - m)
    l = a + b
    return m, l, (a[:, None] * o1 + b[:, None] * o2) / l[:, None]


def _merge_normalised(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    l = a * l1 + b * l2
    return m, l, (a[:, None] * o1 + b[:, None] * o2) / l[:, None]


def _merge_mean(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    l = torch.exp(m1 - m) * l1 + torch.exp(m2 - m) * l2
    return m, l, (o1 + o2) / 2


def _merge_output_only(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    return torch.exp(m1 - m)[:, None] * o1 + torch.exp(m2 - m)[:, None] * o2


def _merge_softmax_of_maxima(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    w = torch.softmax(torch.stack([m1, m2]), 0)
    return m, l1 + l2, w[0][:, None] * o1 + w[1][:, None] * o2


# (checker, wrong answer, a phrase of the hint it should get; None where no hint is expected)
CATALOGUE = [
    (check_left_pad, _right_pad_arange, "pad on the left"),
    (check_left_pad, _right_pad_cumsum, "pad on the left"),
    (check_left_pad, _positions_from_one, "positions start at 0"),
    (check_left_pad, _positions_minus_one, "give the pads position 0"),
    (check_left_pad, _positions_as_transformers, "as transformers gives them"),
    (check_left_pad, _positions_of_columns_on_real, "first real token"),
    (check_left_pad, _mask_as_ints, "not 1 and 0"),
    (check_left_pad, _mask_as_floats, "not 1.0 and 0.0"),
    (check_left_pad, _mask_inverted, "wrong way round"),
    (check_left_pad, _pads_of_zero, "fill with pad_id"),
    (check_left_pad, _mask_from_the_ids, "not from idx != pad_id"),
    (check_grow_block_table, _grow_floor, "round the number of blocks up"),
    (check_grow_block_table, _grow_plus_one, "a full block needs no new one"),
    (check_grow_block_table, _grow_whole_request, "take only the ones it lacks"),
    (check_grow_block_table, _grow_always_one, "a step inside a block takes none"),
    (check_grow_block_table, _grow_pop, "from the front of the free list"),
    (check_grow_block_table, _grow_keeps_free, "must leave the free list"),
    (check_grow_block_table, _grow_while_at_most, "a full block needs no new one"),
    (check_grow_block_table, _grow_in_place, "return two new lists"),
    (check_grow_block_table, _grow_same_lists_when_none_needed, "return two new lists"),
    (check_grow_block_table, _grow_from_the_end, "from the front of the free list"),
    (check_grow_block_table, _grow_from_the_end_slice, "from the front of the free list"),
    (check_blocks_to_free, _free_others, "not the others'"),
    (check_blocks_to_free, _free_shared_only, "the other way round"),
    (check_blocks_to_free, _free_positions, "not their places in it"),
    (check_blocks_to_free, _free_unsorted, "sorted"),
    (check_blocks_to_free, _free_as_set, "not a set"),
    (check_blocks_to_free, _free_last_block, "not only the last"),
    (check_merge_partials, _merge_no_rescale, "rescale both partials"),
    (check_merge_partials, _merge_old_output_only, "rescale the older output o1"),
    (check_merge_partials, _merge_old_sum_only, "rescale the older sum l1"),
    (check_merge_partials, _merge_new_not_rescaled, "rescale the newer partial too"),
    (check_merge_partials, _merge_flipped, "at most 1"),
    (check_merge_partials, _merge_min, "the larger of the two"),
    (check_merge_partials, _merge_newer_maximum, "the newer block's m2"),
    (check_merge_partials, _merge_older_maximum, "the older partial's m1"),
    (check_merge_partials, _merge_weighted_by_l, "without weighting them by l1 and l2"),
    (check_merge_partials, _merge_normalised, "divide by l only once"),
    (check_merge_partials, _merge_mean, "rather than take their mean"),
    (check_merge_partials, _merge_with_max, "Python's max"),
    (check_merge_partials, _merge_with_math_exp, "use torch.exp"),
    (check_merge_partials, _merge_output_only, None),       # the tuple's length is said
    (check_merge_partials, _merge_softmax_of_maxima, None),
]


@pytest.mark.parametrize("checker, wrong, phrase", CATALOGUE,
                         ids=[wrong.__name__ for _, wrong, _ in CATALOGUE])
def test_the_catalogue_never_passes_and_gets_its_hint(checker, wrong, phrase, capsys):
    assert not checker(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗"), out
    assert "\n" not in out.rstrip("\n")
    if phrase is not None:
        assert "Hint: " in out, out
        assert phrase in out.split("Hint: ", 1)[1], out


def test_at_least_nine_in_ten_wrong_answers_get_a_hint():
    hinted = sum("Hint: " in checker.run(wrong).message for checker, wrong, _ in CATALOGUE)
    assert hinted >= 0.9 * len(CATALOGUE), f"{hinted} of {len(CATALOGUE)}"


def test_the_catalogue_hints_are_each_different():
    """A hint is the mistake's own: two of the catalogue's answers to one checker get the same
    hint only when they are the same mistake written two ways (the same expected phrase)."""
    seen = {}
    for checker, wrong, phrase in CATALOGUE:
        if phrase is None:
            continue
        hint = checker.run(wrong).message.split("Hint: ", 1)[1]
        earlier = seen.setdefault((id(checker), hint), (phrase, wrong.__name__))
        assert earlier[0] == phrase, (wrong.__name__, earlier[1])


# --- issue 40: the wrong container, negative pad positions, types named ------------------------

def test_a_left_pad_of_nested_lists_fails_with_the_tensor_hint(capsys):
    def my_left_pad(prompts, pad_id):
        return tuple(part.tolist() for part in check_left_pad.reference(prompts, pad_id))
    assert "return a tensor, not Python lists" in _hint(check_left_pad, my_left_pad, capsys)


def test_pad_positions_counted_negative_are_hinted(capsys):
    """arange minus each prompt's start: the real tokens' positions are right, the pads'
    negative."""
    def my_left_pad(prompts, pad_id):
        idx, mask, _ = check_left_pad.reference(prompts, pad_id)
        starts = (~mask).sum(-1, keepdim=True)
        return idx, mask, torch.arange(idx.shape[1]) - starts
    assert "give the pads position 0" in _hint(check_left_pad, my_left_pad, capsys)


def test_blocks_to_free_as_a_tuple_names_the_types(capsys):
    def my_blocks_to_free(block_tables, finished):
        return tuple(check_blocks_to_free.reference(block_tables, finished))
    assert not check_blocks_to_free(my_blocks_to_free)
    out = capsys.readouterr().out
    assert "expected [1, 9] but got (1, 9)" in out or "but got (" in out
    assert "Hint: return a list, not a tuple" in out


def test_a_merge_with_the_maximum_detached_fails_with_the_gradient_hint(capsys):
    def my_merge_partials(m1, l1, o1, m2, l2, o2):
        m = torch.maximum(m1, m2).detach()
        a, b = torch.exp(m1 - m), torch.exp(m2 - m)
        return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2
    assert "does not carry a gradient" in _hint(check_merge_partials, my_merge_partials, capsys)
