"""The checkers of chapter 12: they accept correct answers and explain plausible wrong ones."""

from collections import Counter

import pytest

from minitransformer import BPETokenizer
from minitransformer.exercises.chapter12 import (
    check_count_pairs,
    check_encode,
    check_merge_pair,
    check_train_merges,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_count_pairs(ids):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def my_merge_pair(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def my_encode(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = my_merge_pair(ids, pair, new_id)
    return ids


def my_train_merges(text, num_merges):
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = my_count_pairs(ids)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        ids = my_merge_pair(ids, pair, new_id)
        merges.append((pair, new_id))
    return merges


CHECKERS = {
    "count_pairs": (check_count_pairs, my_count_pairs),
    "merge_pair": (check_merge_pair, my_merge_pair),
    "encode": (check_encode, my_encode),
    "train_merges": (check_train_merges, my_train_merges),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_a_correct_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_accepts_other_correct_forms(capsys):
    assert check_count_pairs(lambda ids: Counter(zip(ids, ids[1:])))
    assert check_encode(lambda text, merges: BPETokenizer(merges).encode(text))
    assert check_merge_pair(lambda ids, pair, new_id: tuple(my_merge_pair(ids, pair, new_id)))
    assert capsys.readouterr().out.count("✓") == 3


def test_the_seed_example_is_a_case():
    """The chapter's example, aaabdaaabac -> XdXac, is what the checkers test first."""
    assert check_train_merges.cases[0] == ("aaabdaaabac", 10)
    text, merges = check_encode.cases[0]
    assert text == "aaabdaaabac"
    assert my_encode(text, merges) == [258, ord("d"), 258, ord("a"), ord("c")]
    assert check_train_merges.reference("aaabdaaabac", 10) == merges


def _non_overlapping(ids):
    counts = {}
    i = 0
    while i + 1 < len(ids):
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2 if i + 2 < len(ids) and (ids[i + 1], ids[i + 2]) == pair else 1
    return counts


def _count_past_the_end(ids):
    counts = {}
    for i in range(len(ids)):
        counts[(ids[i], ids[i + 1])] = counts.get((ids[i], ids[i + 1]), 0) + 1
    return counts


def _count_wrapping(ids):
    counts = {}
    for i in range(len(ids)):
        pair = (ids[i - 1], ids[i])
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _count_sorted(ids):
    counts = {}
    for a, b in zip(ids, ids[1:]):
        pair = (min(a, b), max(a, b))
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _count_from_zero(ids):
    counts = {}
    for pair in zip(ids, ids[1:]):
        if pair in counts:
            counts[pair] += 1
        else:
            counts[pair] = 0
    return counts


@pytest.mark.parametrize("wrong, hint", [
    (_non_overlapping, "pairs overlap"),
    (lambda ids: Counter(ids), "not single ids"),
    (_count_wrapping, "ids[i - 1] is ids[-1]"),
    (lambda ids: Counter(zip(ids, ids[1:])).most_common(), "return the counts as a dict"),
    (_count_sorted, "the order inside a pair matters"),
    (lambda ids: {pair: 0 for pair in set(zip(ids, ids[1:]))}, "every count is 0"),
    (_count_from_zero, "one too small"),
    (lambda ids: dict(Counter(zip(ids[::2], ids[1::2]))), "not only at the even ones"),
    (lambda ids: {p: 1 for p in zip(ids, ids[1:])}, "not only whether it occurs"),
    (lambda ids: Counter(zip(ids, ids[1:-1])), "the last pair"),
    (_count_past_the_end, "the last id has no neighbour"),
])
def test_count_pairs_hints(wrong, hint, capsys):
    assert not check_count_pairs(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case ") and hint in out.split("Hint: ", 1)[1]


def _merge_right_to_left(ids, pair, new_id):
    merged, i = [], len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == pair:
            merged.insert(0, new_id)
            i -= 2
        else:
            merged.insert(0, ids[i])
            i -= 1
    return merged


def _merge_without_skip(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif i == 0 or (ids[i - 1], ids[i]) != pair:
            out.append(ids[i])
    return out


def _merge_keeps_second(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        else:
            out.append(ids[i])
        i += 1
    return out


def _merge_drop_last(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _merge_first_only(ids, pair, new_id):
    ids = list(ids)
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
            break
    return ids


def _merge_for_loop(ids, pair, new_id):
    merged = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2  # no effect in a for loop
        else:
            merged.append(ids[i])
    return merged


def _merge_slice_compare(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids):
        if ids[i:i + 2] == pair:  # a list never equals a tuple
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _merge_first_id(ids, pair, new_id):
    merged, i = [], 0
    while i < len(ids):
        if ids[i] == pair[0] and i + 1 < len(ids):
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _merge_reversed_pair(ids, pair, new_id):
    first, second = pair
    return my_merge_pair(ids, (second, first), new_id)


@pytest.mark.parametrize("wrong, hint", [
    (_merge_right_to_left, "scan from the left"),
    (_merge_for_loop, "In a for loop, i += 2 changes nothing"),
    (_merge_slice_compare, "a list never equals a tuple"),
    (_merge_first_id, "check both ids of the pair"),
    (_merge_reversed_pair, "the pair is ordered"),
    (_merge_without_skip, "jump past both of its tokens"),
    (_merge_keeps_second, "skip the pair's second token as well"),
    (_merge_drop_last, "a final token that is not part of a pair was lost"),
    (_merge_first_only, "replace every occurrence"),
])
def test_merge_pair_hints(wrong, hint, capsys):
    assert not check_merge_pair(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def _encode_reversed(text, merges):
    return my_encode(text, list(reversed(merges)))


def _encode_ord(text, merges):
    ids = [ord(c) for c in text]
    for pair, new_id in merges:
        ids = my_merge_pair(ids, pair, new_id)
    return ids


def _encode_characters(text, merges):
    ids = list(text)
    for pair, new_id in merges:
        ids = my_merge_pair(ids, pair, new_id)
    return ids


def _encode_first_only(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = _merge_first_only(ids, pair, new_id)
    return ids


def _encode_position(text, merges):
    ids = list(text.encode("utf-8"))
    for k, (pair, _) in enumerate(merges):
        ids = my_merge_pair(ids, pair, k)
    return ids


def _encode_result_dropped(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        my_merge_pair(ids, pair, new_id)  # the merged list is thrown away
    return ids


def _encode_words(text, merges):
    ids = []
    for word in text.split():
        ids += my_encode(word, merges)
    return ids


def _encode_by_counting(text, merges):
    ids = list(text.encode("utf-8"))
    for _, new_id in merges:
        counts = my_count_pairs(ids)
        if counts:
            ids = my_merge_pair(ids, max(counts, key=counts.get), new_id)
    return ids


@pytest.mark.parametrize("wrong, hint", [
    (_encode_reversed, "in the order they were learned"),
    (_encode_result_dropped, "keep each result, ids = my_merge_pair(ids, pair, new_id)"),
    (_encode_words, "text.split() drops them"),
    (_encode_by_counting, "encoding does not count pairs"),
    (_encode_ord, "not from ord(c)"),
    (_encode_characters, "list(text) gives characters"),
    (_encode_first_only, "not only the first one"),
    (_encode_position, "not the entry's position"),
    (lambda text, merges: list(text.encode("utf-8")), "no merge applied"),
])
def test_encode_hints(wrong, hint, capsys):
    assert not check_encode(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def _train(choose=None, stop=True, first_id=256, recount=True):
    def train(text, num_merges):
        ids = list(text.encode("utf-8"))
        counts = my_count_pairs(ids)
        merges = []
        for new_id in range(first_id, first_id + num_merges):
            if recount is True:
                counts = my_count_pairs(ids)
            if not counts:
                break
            pair = choose(counts)
            if stop and counts[pair] < 2:
                break
            ids = my_merge_pair(ids, pair, new_id)
            merges.append((pair, new_id))
            if recount is False:
                del counts[pair]
        return merges
    return train


def _smallest(counts):
    return min(counts, key=lambda p: (-counts[p], p))


def _one_merge_short(text, num_merges):
    return my_train_merges(text, num_merges - 1)


def _train_variant(*, stop_at=2, first_id=256, start=None, record=None, choose=None,
                   record_first=False, keep_merged=True):
    """my_train_merges with one line written differently."""
    def train(text, num_merges):
        ids = start(text) if start else list(text.encode("utf-8"))
        merges = []
        for new_id in range(first_id, first_id + num_merges):
            counts = my_count_pairs(ids)
            pair = (choose or _smallest)(counts)  # no check for an empty text
            if record_first:
                merges.append((pair, new_id))
            if counts[pair] < stop_at:
                break
            if keep_merged:
                ids = my_merge_pair(ids, pair, new_id)
            else:
                my_merge_pair(ids, pair, new_id)
            if not record_first:
                merges.append(record(pair, new_id) if record else (pair, new_id))
        return merges
    return train


def _train_range_mistake(text, num_merges):
    # for new_id in range(256, num_merges): no merge at all while num_merges <= 256
    return my_train_merges(text, num_merges - 256) if num_merges > 256 else []


@pytest.mark.parametrize("wrong, hint", [
    (_train(choose=lambda c: max(c, key=c.get)), "ties go to the smallest pair"),
    (_train(choose=lambda c: max(c, key=lambda p: (c[p], p))), "ties go to the smallest pair"),
    (_train(choose=_smallest, stop=False), "stop when the most frequent pair occurs only once"),
    (_train(choose=_smallest, recount=False), "Recount the pairs after every merge"),
    (_train(choose=_smallest, first_id=101), "new ids continue after the 256 byte values"),
    (_train(choose=_smallest, recount="never"), "count the pairs of the merged list"),
    (_one_merge_short, "one is missing"),
    (_train(choose=min), "choose by count first"),
    (_train_variant(keep_merged=False), "keep the merged list"),
    (_train_variant(stop_at=3), "a pair that occurs twice is still merged"),
    (_train_variant(record_first=True), "check the count before you record the merge"),
    (_train_range_mistake, "no merge was recorded"),
    (_train_variant(first_id=0), "new ids start at 256, not 0"),
    (_train_variant(first_id=255), "off by one"),
    (_train_variant(record=lambda pair, new_id: [pair, new_id]), "a list [pair, new_id]"),
    (_train_variant(record=lambda pair, new_id: (pair[0], pair[1], new_id)),
     "not as three numbers"),
    (_train_variant(start=lambda text: [ord(c) for c in text]), "not from ord(c)"),
    (_train_variant(start=list), "list(text) gives characters"),
    (_train_variant(), "min() of no pairs fails"),
    (_train_variant(choose=lambda c: max(c, key=lambda p: (c[p], -p[0], -p[1]))),
     "max() of no pairs fails"),
])
def test_train_merges_hints(wrong, hint, capsys):
    assert not check_train_merges(wrong)
    assert hint in capsys.readouterr().out.split("Hint: ", 1)[1]


def test_a_stub_is_not_implemented_yet(capsys):
    def my_count_pairs(ids):
        raise NotImplementedError

    assert not check_count_pairs(my_count_pairs)
    assert capsys.readouterr().out == "✗ not implemented yet\n"
