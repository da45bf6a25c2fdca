"""Checkers for the exercises of chapter 12, *Tokenization with byte-pair encoding*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_count_pairs` -- ``my_count_pairs(ids)``: how often each adjacent pair of ids
  occurs, overlaps included, as a dict ``{(first, second): count}``.
* :data:`check_merge_pair` -- ``my_merge_pair(ids, pair, new_id)``: every occurrence of
  ``pair``, scanned left to right, replaced by ``new_id``.
* :data:`check_encode` -- ``my_encode(text, merges)``: the UTF-8 bytes of ``text`` with the
  merges applied one after the other, in the order they were learned.
* :data:`check_train_merges` -- ``my_train_merges(text, num_merges)``: the merge table learned
  from ``text``, ties going to the smallest pair, stopping when no pair occurs twice.
"""

from __future__ import annotations

from collections import Counter

from minitransformer.bpe import apply_merges, count_pairs, merge_pair, train_merges
from minitransformer.exercises import Checker

__all__ = ["check_count_pairs", "check_encode", "check_merge_pair", "check_train_merges"]

# The classic example: a a a b d a a a b a c as bytes (a = 97, b = 98, c = 99, d = 100).
_SEED = list(b"aaabdaaabac")
# Its merge table: Z = aa, Y = ab, X = ZY.
_SEED_MERGES = [((97, 97), 256), ((97, 98), 257), ((256, 257), 258)]


# --- my_count_pairs(ids) -> {(first, second): count} ----------------------------------------

def _count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    return dict(count_pairs(ids))


def _without_overlaps(ids):
    """Each pair counted like str.count: a match skips both of its tokens."""
    counts = {}
    for pair in set(zip(ids, ids[1:])):
        i = found = 0
        while i + 1 < len(ids):
            if (ids[i], ids[i + 1]) == pair:
                found, i = found + 1, i + 2
            else:
                i += 1
        counts[pair] = found
    return counts


def _past_the_end(ids):
    """Looks for a pair at every position, the last one included."""
    counts = {}
    for i in range(len(ids)):
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _wraps_around(ids):
    """Pairs (ids[i - 1], ids[i]) for every i: at i = 0 that is (last, first)."""
    counts = {}
    for i in range(len(ids)):
        pair = (ids[i - 1], ids[i])
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _unordered(ids):
    return dict(Counter(tuple(sorted(pair)) for pair in zip(ids, ids[1:])))


def _first_sighting_is_zero(ids):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts[pair] + 1 if pair in counts else 0
    return counts


check_count_pairs = Checker(
    reference=_count_pairs,
    cases=[(_SEED,), ([1, 1, 1],), ([3, 1, 3, 1, 3],), ([5],), ([],)],
    mistakes={
        "pairs overlap: a a a holds the pair (a, a) twice, at positions 0 and 1. Count the "
        "pair that starts at every position, without skipping ahead after a match":
            _without_overlaps,
        "a pair starts at every position 0, 1, ..., T - 2, not only at the even ones: step "
        "one token at a time (zip(ids, ids[1:]))":
            lambda ids: dict(Counter(zip(ids[::2], ids[1::2]))),
        "the last pair (ids[-2], ids[-1]) is missing: let i run over range(len(ids) - 1)":
            lambda ids: dict(Counter(zip(ids[:-1], ids[1:-1]))),
        "count how often each pair occurs, not only whether it occurs":
            lambda ids: {pair: 1 for pair in zip(ids, ids[1:])},
        "the last id has no neighbour after it: a pair starts at positions 0 to "
        "len(ids) - 2, so stop before ids[i + 1] runs past the end":
            _past_the_end,
        "count pairs of neighbours, with keys (ids[i], ids[i + 1]), not single ids":
            lambda ids: dict(Counter(ids)),
        "at i = 0, ids[i - 1] is ids[-1], the last id (Python counts negative indices from "
        "the end), so a pair (last, first) that is not in the list was counted: start at "
        "i = 1, or use zip(ids, ids[1:])":
            _wraps_around,
        "return the counts as a dict {(first, second): count}; most_common() turns them "
        "into a list of (pair, count)":
            lambda ids: Counter(zip(ids, ids[1:])).most_common(),
        "the order inside a pair matters: (a, b) and (b, a) are different pairs (ab is not "
        "ba), so keep each pair as (ids[i], ids[i + 1]) without sorting it":
            _unordered,
        "every count is 0: add one each time a pair is seen, "
        "counts[pair] = counts.get(pair, 0) + 1":
            lambda ids: {pair: 0 for pair in zip(ids, ids[1:])},
        "every count is one too small: a pair seen for the first time has count 1, not 0 "
        "(counts.get(pair, 0) + 1)":
            _first_sighting_is_zero,
    },
)


# --- my_merge_pair(ids, pair, new_id) -> list --------------------------------------------------

def _merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    return merge_pair(ids, pair, new_id)


def _right_to_left(ids, pair, new_id):
    return merge_pair(ids[::-1], pair[::-1], new_id)[::-1]


def _without_skipping(ids, pair, new_id):
    """Every position that starts the pair becomes new_id; the second token is not skipped."""
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 1
            if i + 1 >= len(ids) or (ids[i], ids[i + 1]) != pair:
                i += 1
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _keeps_both_tokens(ids, pair, new_id):
    """The first token of each pair becomes new_id, the second stays: the list never shrinks."""
    return [new_id if (a, b) == pair else a for a, b in zip(ids, [*ids[1:], None])]


def _drops_the_last_token(ids, pair, new_id):
    merged, i = [], 0
    while i + 1 < len(ids):
        if (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def _first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return [*ids[:i], new_id, *ids[i + 2:]]
    return list(ids)


def _first_id_only(ids, pair, new_id):
    """Merges wherever ids[i] is the pair's first id, whatever follows it."""
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0]:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


check_merge_pair = Checker(
    reference=_merge_pair,
    cases=[(_SEED, (97, 97), 256),
           ([1, 2, 1, 2, 3], (1, 2), 7),
           ([1, 1, 1], (1, 1), 9),
           ([4, 1, 1, 1, 1, 1], (1, 1), 9),
           ([2, 1, 3], (1, 2), 7),
           ([5, 6, 2, 3], (2, 3), 8)],
    mistakes={
        "scan from the left: in a a a the first two a's merge, giving Z a, not a Z":
            _right_to_left,
        "after replacing a pair, jump past both of its tokens (i += 2): a token belongs to "
        "at most one merged pair, so a a a becomes Z a, not Z Z":
            _without_skipping,
        "a merged pair is one id where there were two, so the list gets shorter: after "
        "appending new_id, skip the pair's second token as well (i += 2), instead of "
        "keeping it. In a for loop, i += 2 changes nothing (the next round takes the next "
        "i from range): use a while loop":
            _keeps_both_tokens,
        "a final token that is not part of a pair was lost: keep it (loop while "
        "i < len(ids), and check i + 1 < len(ids) before looking at the pair)":
            _drops_the_last_token,
        "replace every occurrence of the pair, not only the first":
            _first_only,
        "nothing was merged, your answer is ids unchanged. If you compare ids[i:i + 2] == "
        "pair: a slice is a list and pair a tuple, and a list never equals a tuple; "
        "compare (ids[i], ids[i + 1]) == pair":
            lambda ids, pair, new_id: list(ids),
        "check both ids of the pair: it occurs where ids[i] == pair[0] and "
        "ids[i + 1] == pair[1]":
            _first_id_only,
        "the pair is ordered: ids[i] must be its first id and ids[i + 1] its second, so "
        "(1, 2) occurs in 1 2 but not in 2 1":
            lambda ids, pair, new_id: merge_pair(ids, pair[::-1], new_id),
    },
)


# --- my_encode(text, merges) -> list -----------------------------------------------------------

def _encode(text: str, merges: list) -> list[int]:
    return apply_merges(list(text.encode("utf-8")), merges)


def _in_reverse_order(text, merges):
    return apply_merges(list(text.encode("utf-8")), merges[::-1])


def _from_code_points(text, merges):
    return apply_merges([ord(c) for c in text], merges)


def _each_merge_once(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = _first_only(ids, pair, new_id)
    return ids


def _from_characters(text, merges):
    return apply_merges(list(text), merges)


def _position_as_id(text, merges):
    ids = list(text.encode("utf-8"))
    for k, (pair, _) in enumerate(merges):
        ids = merge_pair(ids, pair, k)
    return ids


def _word_by_word(text, merges):
    """Each word of text.split() encoded on its own: the spaces are lost."""
    return [i for word in text.split() for i in _encode(word, merges)]


def _trains_again(text, merges):
    """Chooses the most frequent pair at every step, as training does, and ignores the
    table's pairs."""
    ids = list(text.encode("utf-8"))
    for _, new_id in merges:
        counts = count_pairs(ids)
        if not counts:
            break
        ids = merge_pair(ids, min(counts, key=lambda p: (-counts[p], p)), new_id)
    return ids


check_encode = Checker(
    reference=_encode,
    cases=[("aaabdaaabac", _SEED_MERGES),
           ("abc", [((98, 99), 256), ((97, 98), 257)]),
           ("né", [((195, 169), 256), ((110, 256), 257)]),
           ("abab ab", [((97, 98), 256), ((256, 256), 257)]),
           ("", _SEED_MERGES)],
    mistakes={
        "apply the merges in the order they were learned: a later merge builds on earlier "
        "ones (X = ZY needs Z and Y to exist), and an earlier merge wins where two compete":
            _in_reverse_order,
        "start from the UTF-8 bytes, list(text.encode('utf-8')), not from ord(c): a "
        "character such as é is two bytes, and the merges are pairs of byte ids":
            _from_code_points,
        "start from the UTF-8 bytes, list(text.encode('utf-8')): list(text) gives "
        "characters, and the merges are pairs of byte ids (integers)":
            _from_characters,
        "each merge replaces every occurrence of its pair, not only the first one":
            _each_merge_once,
        "the bytes are only the start: then apply every merge of the table in turn and "
        "keep each result, ids = my_merge_pair(ids, pair, new_id) (your answer is the "
        "text's bytes with no merge applied; if you did that, does my_merge_pair pass its "
        "own checker?)":
            lambda text, merges: list(text.encode("utf-8")),
        "a merged pair becomes the new_id stored in its table entry (256, 257, ...), not "
        "the entry's position in the list":
            _position_as_id,
        "the spaces are part of the text: text.split() drops them, and a space is a byte "
        "(32) to encode like any other. Encode the bytes of the whole text":
            _word_by_word,
        "encoding does not count pairs or choose the most frequent one; training did that. "
        "Apply the table as it is: for each (pair, new_id), in order, replace that pair "
        "by new_id":
            _trains_again,
    },
)


# --- my_train_merges(text, num_merges) -> [((first, second), new_id), ...] ----------------------

def _train_merges(text: str, num_merges: int) -> list:
    return train_merges([list(text.encode("utf-8"))], num_merges)


def _training(text, num_merges, *, choose, stop_below=2, first_id=256, check_empty=True,
              start=lambda text: list(text.encode("utf-8")),
              record=lambda pair, new_id: (pair, new_id)):
    """Train with one thing done differently: how the pair is chosen (``choose(counts)``),
    when training stops, the first new id, the starting ids, or how a merge is recorded."""
    ids = start(text)
    merges = []
    for new_id in range(first_id, first_id + num_merges):
        counts = count_pairs(ids)
        if check_empty and not counts:
            break
        pair = choose(counts)
        if counts[pair] < stop_below:
            break
        ids = merge_pair(ids, pair, new_id)
        merges.append(record(pair, new_id))
    return merges


def _smallest(counts):
    return min(counts, key=lambda pair: (-counts[pair], pair))


def _largest_by_max(counts):
    """The right pair, found with max: the largest count, then the smallest pair."""
    return max(counts, key=lambda pair: (counts[pair], -pair[0], -pair[1]))


def _records_the_last_pair(text, num_merges):
    """Records the best pair before checking its count, so one pair seen once is kept."""
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = count_pairs(ids)
        if not counts:
            break
        pair = _smallest(counts)
        merges.append((pair, new_id))
        if counts[pair] < 2:
            break
        ids = merge_pair(ids, pair, new_id)
    return merges


def _counted_once(text, num_merges):
    """All merges chosen from the counts of the original text, never recounted."""
    ids = list(text.encode("utf-8"))
    ranked = sorted(count_pairs(ids).items(), key=lambda item: (-item[1], item[0]))
    chosen = [pair for pair, count in ranked if count >= 2][:num_merges]
    return [(pair, 256 + k) for k, pair in enumerate(chosen)]


def _counts_never_updated(text, num_merges):
    """The pairs counted once before the loop: the same best pair comes back every time."""
    ids = list(text.encode("utf-8"))
    counts = count_pairs(ids)
    merges = []
    for new_id in range(256, 256 + num_merges):
        if not counts:
            break
        pair = _smallest(counts)
        if counts[pair] < 2:
            break
        ids = merge_pair(ids, pair, new_id)
        merges.append((pair, new_id))
    return merges


# The case with room for more merges than the text allows comes first: there an answer that
# makes one merge too few is still right, so only a real recounting mistake fails it. The
# text with é (two bytes in UTF-8) tells bytes from code points and characters.
check_train_merges = Checker(
    reference=_train_merges,
    cases=[("aaabdaaabac", 10),
           ("aaabdaaabac", 3),
           ("the cat and the hat and the bat", 6),
           ("abcd", 2),
           ("h\u00e9h\u00e9", 5),
           ("", 2)],
    mistakes={
        # before the recount hint: on case 2 one merge short looks like counting once
        "make num_merges merges (for new_id in range(256, 256 + num_merges)) unless no pair "
        "occurs twice: one is missing":
            lambda text, n: _train_merges(text, n - 1) if n > 0 else [],
        # counting once and choosing the smallest pair whatever its count give the same table
        "after aa and ab your table goes wrong: each merge must be the most frequent pair of "
        "the list as it is now. Recount the pairs after every merge (a merge removes pairs and "
        "creates new ones, such as Z with its neighbours), and choose by count first, the "
        "smallest pair only breaking ties: min(counts, key=lambda p: (-counts[p], p))":
            _counted_once,
        # counts never updated and a merged list never kept give the same table
        "the same pair comes back every time although it no longer occurs: count the pairs "
        "of the merged list, inside the loop, and keep the merged list, "
        "ids = my_merge_pair(ids, pair, new_id)":
            _counts_never_updated,
        "ties go to the smallest pair (first id, then second id), whereas "
        "Counter.most_common and max(counts, key=counts.get) keep the pair seen first. "
        "After Z = aa, (a, b) = (97, 98) beats (Z, a) = (256, 97): use "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda text, n: _training(text, n, choose=lambda c: c.most_common(1)[0][0]),
        "stop when the most frequent pair occurs only once: a token for it would be used a "
        "single time, saving one token at the cost of a vocabulary entry":
            lambda text, n: _training(text, n, choose=_smallest, stop_below=0),
        "a pair that occurs twice is still merged (it saves a token each time): stop only "
        "when the best pair occurs fewer than two times, counts[pair] < 2":
            lambda text, n: _training(text, n, choose=_smallest, stop_below=3),
        "check the count before you record the merge: a pair that occurs only once is "
        "neither merged nor recorded":
            _records_the_last_pair,
        "no merge was recorded: make up to num_merges merges, for new_id in "
        "range(256, 256 + num_merges), and stop only when the best pair occurs fewer than "
        "two times":
            lambda text, n: [],
        "new ids continue after the 256 byte values: the first merge creates 256, the next "
        "257, whatever bytes the text uses":
            lambda text, n: _training(text, n, choose=_smallest,
                                      first_id=max(text.encode("utf-8"), default=-1) + 1),
        "new ids start at 256, not 0: ids 0 to 255 are the bytes themselves, so "
        "new_id runs over range(256, 256 + num_merges)":
            lambda text, n: _training(text, n, choose=_smallest, first_id=0),
        "off by one: the bytes are 0 to 255, so the first new id is 256":
            lambda text, n: _training(text, n, choose=_smallest, first_id=255),
        "record each merge as a tuple ((first, second), new_id), the format of "
        "BPETokenizer.merges: a list [pair, new_id] does not compare equal to a tuple":
            lambda text, n: _training(text, n, choose=_smallest,
                                      record=lambda pair, new_id: [pair, new_id]),
        "record each merge as ((first, second), new_id), the pair in a tuple of its own, "
        "not as three numbers (first, second, new_id)":
            lambda text, n: _training(text, n, choose=_smallest,
                                      record=lambda pair, new_id: (*pair, new_id)),
        "start from the UTF-8 bytes, list(text.encode('utf-8')), not from ord(c): é is one "
        "code point but two bytes, and the merges are pairs of byte ids":
            lambda text, n: _training(text, n, choose=_smallest,
                                      start=lambda text: [ord(c) for c in text]),
        "start from the UTF-8 bytes, list(text.encode('utf-8')): list(text) gives "
        "characters (strings), and the merges are pairs of byte ids (integers)":
            lambda text, n: _training(text, n, choose=_smallest, start=list),
        "a text with fewer than two bytes has no pairs, and min() of no pairs fails: stop "
        "when there are none (if not counts: break)":
            lambda text, n: _training(text, n, choose=_smallest, check_empty=False),
        "a text with fewer than two bytes has no pairs, and max() of no pairs fails: stop "
        "when there are none (if not counts: break)":
            lambda text, n: _training(text, n, choose=_largest_by_max, check_empty=False),
    },
)
