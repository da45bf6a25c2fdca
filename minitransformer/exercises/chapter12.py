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
        "keeping it":
            _keeps_both_tokens,
        "a final token that is not part of a pair was lost: keep it (loop while "
        "i < len(ids), and check i + 1 < len(ids) before looking at the pair)":
            _drops_the_last_token,
        "replace every occurrence of the pair, not only the first":
            _first_only,
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
        "the bytes are only the start: then apply every merge of the table in turn, "
        "for pair, new_id in merges (your answer is the text's bytes with no merge applied)":
            lambda text, merges: list(text.encode("utf-8")),
        "a merged pair becomes the new_id stored in its table entry (256, 257, ...), not "
        "the entry's position in the list":
            _position_as_id,
    },
)


# --- my_train_merges(text, num_merges) -> [((first, second), new_id), ...] ----------------------

def _train_merges(text: str, num_merges: int) -> list:
    return train_merges([list(text.encode("utf-8"))], num_merges)


def _training(text, num_merges, *, choose, stop=True, first_id=256):
    """Train with a different way to choose the pair (``choose(counts)``) or to stop."""
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(first_id, first_id + num_merges):
        counts = count_pairs(ids)
        if not counts:
            break
        pair = choose(counts)
        if stop and counts[pair] < 2:
            break
        ids = merge_pair(ids, pair, new_id)
        merges.append((pair, new_id))
    return merges


def _smallest(counts):
    return min(counts, key=lambda pair: (-counts[pair], pair))


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
# makes one merge too few is still right, so only a real recounting mistake fails it.
check_train_merges = Checker(
    reference=_train_merges,
    cases=[("aaabdaaabac", 10),
           ("aaabdaaabac", 3),
           ("the cat and the hat and the bat", 6),
           ("abcd", 2),
           ("", 2)],
    mistakes={
        # before the recount hint: on case 2 one merge short looks like counting once
        "make num_merges merges (for new_id in range(256, 256 + num_merges)) unless no pair "
        "occurs twice: one is missing":
            lambda text, n: _train_merges(text, n - 1) if n > 0 else [],
        "recount the pairs after every merge: a merge removes pairs and creates new ones "
        "(Z with its neighbours), so the second merge cannot be read off the first counts":
            _counted_once,
        "count the pairs inside the loop, after each merge: with the counts of the original "
        "text the same best pair comes back every time, although it no longer occurs":
            _counts_never_updated,
        "ties go to the smallest pair (first id, then second id), whereas "
        "Counter.most_common and max(counts, key=counts.get) keep the pair seen first. "
        "After Z = aa, (a, b) = (97, 98) beats (Z, a) = (256, 97): use "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda text, n: _training(text, n, choose=lambda c: c.most_common(1)[0][0]),
        "stop when the most frequent pair occurs only once: merging it shortens nothing":
            lambda text, n: _training(text, n, choose=_smallest, stop=False),
        "new ids continue after the 256 byte values: the first merge creates 256, the next "
        "257, whatever bytes the text uses":
            lambda text, n: _training(text, n, choose=_smallest,
                                      first_id=max(text.encode("utf-8"), default=-1) + 1),
    },
)
