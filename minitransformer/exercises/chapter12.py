"""Checkers for the exercises of chapter 12, *Tokenization with byte-pair encoding*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_encode` -- ``my_encode(text, merges)``: the UTF-8 bytes of ``text`` with the
  merges applied one after the other, in the order they were learned, as a list.
* :data:`check_decode` -- ``my_decode(ids, merges)``: the text that token ids stand for, each
  merged token expanded into its bytes, the bytes of all tokens decoded together as UTF-8.
* :data:`check_count_piece_pairs` -- ``my_count_piece_pairs(pieces)``: the pairs of
  neighbours inside each piece of ``{piece: count}``, each counted ``count`` times, never
  across two pieces.
* :data:`check_merge_pieces` -- ``my_merge_pieces(pieces, pair, new_id)``: a new
  ``{piece: count}`` with every occurrence of ``pair``, scanned left to right, replaced by
  ``new_id`` inside each piece, each piece keeping its count; ``pieces`` must be left as it was.
* :data:`check_train_piece_merges` -- ``my_train_piece_merges(pieces, num_merges)``: the merge
  table learned from ``{piece: count}``, as a list, ties going to the smallest pair, stopping
  when no pair occurs twice; what ``BPETokenizer.train`` does with a split pattern. A wrong
  table is reported with the first merge where it differs.
"""

from __future__ import annotations

import copy
from collections import Counter

from minitransformer.bpe import apply_merges, count_pairs, merge_pair
from minitransformer.exercises import FAIL, Checker, Verdict, show, show_input

__all__ = ["check_count_piece_pairs", "check_decode", "check_encode", "check_merge_pieces",
           "check_train_piece_merges"]

# The classic example: a a a b d a a a b a c as bytes (a = 97, b = 98, c = 99, d = 100).
_SEED = list(b"aaabdaaabac")
# Its merge table: Z = aa, Y = ab, X = ZY.
_SEED_MERGES = [((97, 97), 256), ((97, 98), 257), ((256, 257), 258)]
# Sennrich et al.'s example of words and how often they occur, with GPT-2's leading spaces.
_WORDS = {tuple(b" low"): 5, tuple(b" lower"): 2, tuple(b" newest"): 6, tuple(b" widest"): 3}


def _first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return [*ids[:i], new_id, *ids[i + 2:]]
    return list(ids)


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


def _scanned_from_the_right(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = list(_from_the_right(ids, pair, new_id))
    return ids


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
           ("abab ab", (((97, 98), 256), ((256, 256), 257))),  # a tuple, as BPETokenizer.merges
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
        "keep each result, ids = merge_pair(ids, pair, new_id) (your answer is the text's "
        "bytes with no merge applied; merge_pair returns a new list and leaves ids as it "
        "was)":
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
        "return the ids as a list: a tuple () does not compare equal to a list []":
            lambda text, merges: tuple(_encode(text, merges)),
        "scan from left to right, as merge_pair does: in a a a the first two a merge, "
        "giving Z a, not a Z, so that a a a b becomes Z a b and then Z Y":
            _scanned_from_the_right,
        "bytes() holds only the numbers 0 to 255, and merged tokens are 256 and up: leave "
        "the ids in the list that merge_pair returns":
            lambda text, merges: bytes(_encode(text, merges)),
        "text.encode('utf-8') is only the start, and it is a bytes object: make it a list "
        "of ids, list(text.encode('utf-8')), then apply every merge of the table in turn":
            lambda text, merges: text.encode("utf-8"),
    },
)


# --- my_decode(ids, merges) -> str -------------------------------------------------------------

def _token_bytes(merges: list) -> dict[int, bytes]:
    table = {i: bytes([i]) for i in range(256)}
    for (first, second), new_id in merges:
        table[new_id] = table[first] + table[second]
    return table


def _decode(ids: list[int], merges: list) -> str:
    table = _token_bytes(merges)
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def _one_byte_per_character(ids, merges):
    """Each byte read as the character with that number, chr(195) + chr(169) = 'Ã©'."""
    table = _token_bytes(merges)
    return "".join(chr(b) for i in ids for b in table[i])


def _token_by_token(ids, merges):
    table = _token_bytes(merges)
    return "".join(table[i].decode("utf-8") for i in ids)


def _token_by_token_replaced(ids, merges):
    table = _token_bytes(merges)
    return "".join(table[i].decode("utf-8", errors="replace") for i in ids)


def _undone_in_learned_order(ids, merges):
    """Each merged token replaced by its two parts, the first merge first: X = ZY is undone
    after Z and Y, so they stay."""
    ids = list(ids)
    for (first, second), new_id in merges:
        ids = [part for i in ids for part in ((first, second) if i == new_id else (i,))]
    return bytes(ids).decode("utf-8")


def _one_level_as_characters(ids, merges):
    """Each merged token replaced by its two parts once, then every id read as chr(id)."""
    parts = {new_id: pair for pair, new_id in merges}
    return "".join(chr(part) for i in ids for part in parts.get(i, (i,)))


def _without_the_bytes(ids, merges):
    """The table holds only the merged tokens: looking up a byte fails."""
    table = {}
    for (first, second), new_id in merges:
        table[new_id] = table[first] + table[second]
    return b"".join(table[i] for i in ids).decode("utf-8")


check_decode = Checker(
    reference=_decode,
    cases=[([258, 100, 258, 97, 99], _SEED_MERGES),
           ([257, 258, 32, 99, 97, 102, 195, 169], _SEED_MERGES),
           ([256, 169, 32, 257, 169], [((99, 195), 256), ((110, 256), 257)]),
           ([257, 256, 110], (((195, 169), 256), ((110, 256), 257))),  # a tuple
           ([], _SEED_MERGES)],
    mistakes={
        "an id above 255 is a merged token, not a character: chr(258) is 'Ă'. Look up the "
        "bytes each token stands for (a merged token's bytes are its two parts' bytes, "
        "joined), then decode the bytes of all tokens together":
            lambda ids, merges: "".join(chr(i) for i in ids),
        "chr(195) + chr(169) is 'Ã©': one character per byte is right for a, b, c but "
        "not for é, which is two bytes in UTF-8. Join the bytes of all tokens and decode "
        "them together, b''.join(...).decode('utf-8')":
            _one_byte_per_character,
        "a token can hold part of a character: é is the two bytes 195 169, and they may "
        "sit in two tokens. Join the bytes of all tokens first, then decode once, "
        "b''.join(...).decode('utf-8')":
            _token_by_token,
        "each � marks a token decoded on its own: é is the two bytes 195 169, and they may "
        "sit in two tokens. Join the bytes of all tokens first, then decode once":
            _token_by_token_replaced,
        "bytes() takes only 0 to 255, and a merged token's id was left: its parts can be "
        "merged tokens themselves (X = ZY). Undo the merges from the last one learned to "
        "the first, or build each token's bytes from its parts' bytes, earliest merge "
        "first":
            _undone_in_learned_order,
        "tokens 0 to 255 are the bytes themselves: start the table with bytes([i]) for "
        "every i in range(256), then add one entry per merge, "
        "table[new_id] = table[first] + table[second]":
            _without_the_bytes,
        "'Ā' is chr(256): a merged token's parts can be merged tokens themselves (X = ZY, "
        "so 258 is 256 and 257), and those are not characters either. Expand every token "
        "all the way down to its bytes (build each token's bytes from its parts' bytes, "
        "earliest merge first), then decode the bytes of all tokens together":
            _one_level_as_characters,
        "é is missing: its bytes 195 and 169 are two tokens here, neither is text on its "
        "own, and errors='ignore' dropped both. Join the bytes of all tokens first, then "
        "decode once, b''.join(...).decode('utf-8')":
            lambda ids, merges: "".join(_token_bytes(merges)[i].decode("utf-8", errors="ignore")
                                        for i in ids),
        "str() of bytes gives the way they are written, b'...' with the b and the quotes: "
        "turn the joined bytes into text with .decode('utf-8')":
            lambda ids, merges: str(b"".join(_token_bytes(merges)[i] for i in ids)),
        "return the text as a str: .decode('utf-8') turns the joined bytes into one":
            lambda ids, merges: b"".join(_token_bytes(merges)[i] for i in ids),
        "return one string, the bytes of all tokens joined and decoded, not a list with "
        "one entry per token":
            lambda ids, merges: [_decode([i], merges) for i in ids],
    },
)


# --- my_count_piece_pairs(pieces) -> {(first, second): count} ---------------------------------

def _count_piece_pairs(pieces: dict) -> dict[tuple[int, int], int]:
    counts = Counter()
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] += count
    return dict(counts)


def _per_piece(count_one):
    """Pairs counted in each piece by ``count_one(piece)``, weighted by the piece's count."""
    def wrong(pieces):
        counts = {}
        for piece, count in pieces.items():
            for pair, found in count_one(piece).items():
                counts[pair] = counts.get(pair, 0) + found * count
        return counts
    return wrong


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


def _overwritten(pieces):
    """counts[pair] = count: a pair seen again keeps only the last piece's count."""
    counts = {}
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] = count
    return counts


def _joined(pieces):
    """All pieces, once each, joined into one list before counting."""
    ids = [i for piece in pieces for i in piece]
    return dict(Counter(zip(ids, ids[1:])))


def _joined_with_repeats(pieces):
    """Each piece written out count times, all joined into one list before counting."""
    ids = [i for piece, count in pieces.items() for _ in range(count) for i in piece]
    return dict(Counter(zip(ids, ids[1:])))


def _first_sighting_once(pieces):
    """A pair already seen gets count added; a new pair starts at 1, not at count."""
    counts = {}
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] = counts[pair] + count if pair in counts else 1
    return counts


def _ids_not_pairs(pieces):
    counts = {}
    for piece, count in pieces.items():
        for i in piece:
            counts[i] = counts.get(i, 0) + count
    return counts


# The first case tells the piece-level mistakes apart (weights, overwriting, crossing); the
# second and third hold the overlaps and the pairs of both orders.
check_count_piece_pairs = Checker(
    reference=_count_piece_pairs,
    cases=[({tuple(b" low"): 5, tuple(b" lower"): 2},),
           ({(97, 97, 97, 97): 2, (98, 97): 1},),
           ({(3, 1, 3, 1, 3): 1, (1, 3): 2},),
           ({(5,): 4, (): 2, (6, 7): 1},),
           ({},)],
    mistakes={
        "each piece stands for count copies of itself: add count for each of its pairs, "
        "counts[pair] = counts.get(pair, 0) + count, not 1":
            lambda pieces: _count_piece_pairs(dict.fromkeys(pieces, 1)),
        "pairs never cross from one piece into the next: count inside each piece, "
        "zip(piece, piece[1:]), instead of joining the pieces into one list":
            _joined,
        "pairs never cross from one piece into the next, not even into a copy of itself: "
        "count the pairs of each piece once and multiply by its count, instead of "
        "writing the pieces out and joining them":
            _joined_with_repeats,
        "count the pairs of neighbours inside each piece, with keys (first, second), not "
        "whole pieces":
            lambda pieces: dict(pieces),
        "count pairs of neighbours, with keys (piece[i], piece[i + 1]), not single ids":
            _ids_not_pairs,
        "a piece can hold a pair more than once: a a a holds (a, a) at positions 0 and 1. "
        "Count the pair that starts at every position, not each different pair once":
            _per_piece(lambda piece: {pair: 1 for pair in set(zip(piece, piece[1:]))}),
        # after the set of pairs: within one piece, the two give the same counts
        "a pair found again adds to what it has: counts[pair] = counts.get(pair, 0) + "
        "count, not counts[pair] = count, which keeps only the count of its last sighting":
            _overwritten,
        "pairs overlap: a a a holds the pair (a, a) twice, at positions 0 and 1. Count the "
        "pair that starts at every position, without skipping ahead after a match":
            _per_piece(_without_overlaps),
        "a pair starts at every position 0, 1, ..., len(piece) - 2, not only at the even "
        "ones: step one id at a time, zip(piece, piece[1:])":
            _per_piece(lambda piece: dict(Counter(zip(piece[::2], piece[1::2])))),
        "the last pair of each piece is missing: a pair starts at every position 0 to "
        "len(piece) - 2, so let i run over range(len(piece) - 1)":
            _per_piece(lambda piece: dict(Counter(zip(piece[:-1], piece[1:-1])))),
        "the last id of a piece has no neighbour after it: a pair starts at positions 0 to "
        "len(piece) - 2, so stop before piece[i + 1] runs past the end":
            _per_piece(_past_the_end),
        "at i = 0, piece[i - 1] is piece[-1], the last id (Python counts negative indices "
        "from the end), so a pair (last, first) that is not in the piece was counted: "
        "start at i = 1, or use zip(piece, piece[1:])":
            _per_piece(_wraps_around),
        "the order inside a pair matters: (a, b) and (b, a) are different pairs (ab is not "
        "ba), so keep each pair as (piece[i], piece[i + 1]) without sorting it":
            _per_piece(lambda piece: dict(Counter(tuple(sorted(pair))
                                                  for pair in zip(piece, piece[1:])))),
        "a pair seen for the first time occurs count times too, not once: "
        "counts[pair] = counts.get(pair, 0) + count, also for a new pair":
            _first_sighting_once,
        "keys are pairs of ids, tuples (first, second) such as (108, 111), not text such as "
        "'lo': a piece can hold merged tokens (256 and up), which are not characters":
            lambda pieces: {chr(a) + chr(b): c
                            for (a, b), c in _count_piece_pairs(pieces).items()},
        "keys are tuples (first, second) such as (108, 111): bytes([108, 111]) is b'lo', "
        "which does not compare equal to a tuple, and cannot hold a merged token (256 and "
        "up)":
            lambda pieces: {bytes(pair): c for pair, c in _count_piece_pairs(pieces).items()},
        "return the counts as a dict {(first, second): count}, not a list of (pair, count) "
        "such as most_common() or list(counts.items()) gives":
            lambda pieces: Counter(_count_piece_pairs(pieces)).most_common(),
        "return the counts as a dict {(first, second): count}: sorted() always makes a "
        "list, here of (pair, count) sorted by pair":
            lambda pieces: sorted(_count_piece_pairs(pieces).items()),
    },
)


# --- my_merge_pieces(pieces, pair, new_id) -> {piece: count} -----------------------------------

def _merge_pieces(pieces: dict, pair: tuple[int, int], new_id: int) -> dict:
    # new_id is new, so two different pieces never merge into the same one: no counts to add
    return {tuple(merge_pair(piece, pair, new_id)): count for piece, count in pieces.items()}


def _scan(piece, pair, new_id, *, step_after_match=2, keep_last=True, check_end=True,
          either_order=False):
    """One piece merged by a left-to-right scan, with one thing done differently."""
    merged, i = [], 0
    end = len(piece) if keep_last else len(piece) - 1
    while i < end:
        if check_end and i + 1 >= len(piece):
            merged.append(piece[i])
            i += 1
            continue
        here = (piece[i], piece[i + 1])
        if here == pair or (either_order and here == pair[::-1]):
            merged.append(new_id)
            i += step_after_match
        else:
            merged.append(piece[i])
            i += 1
    return tuple(merged)


def _each_piece(merge_one):
    def wrong(pieces, pair, new_id):
        return {merge_one(piece, pair, new_id): count for piece, count in pieces.items()}
    return wrong


def _from_the_right(piece, pair, new_id):
    return tuple(reversed(_scan(piece[::-1], pair[::-1], new_id)))


def _only_pieces_with_the_pair(pieces, pair, new_id):
    return {tuple(merge_pair(piece, pair, new_id)): count for piece, count in pieces.items()
            if pair in zip(piece, piece[1:])}


def _changed_while_looping(pieces, pair, new_id):
    for piece, count in pieces.items():
        pieces[tuple(merge_pair(piece, pair, new_id))] = count
    return pieces


class _ArgumentKeepingChecker(Checker):
    """A :class:`Checker` that also wants the learner's function to leave its first argument
    as it was, as the exercise asks: a function that changes ``pieces`` in place and returns
    it gives the right dict, which the comparison of values alone accepts."""

    def run(self, function):
        changed = []

        def recorded(*args):
            before = copy.deepcopy(args[0])
            result = function(*args)
            try:
                same = bool(args[0] == before)
            except Exception:  # a comparison that itself fails counts as a change
                same = False
            changed.append(None if same else args[0])
            return result

        verdict = super().run(recorded if callable(function) else function)
        if not verdict:
            return verdict
        for number, (args, after) in enumerate(zip(self.cases, changed), start=1):
            if after is not None:
                return Verdict(False, f"{FAIL} case {number}: for input "
                               f"{show_input(args, self._names())} your function returned the "
                               f"right dict but changed pieces to {show(after)}. Hint: "
                               f"{CHANGED_PIECES_HINT}")
        return verdict


CHANGED_PIECES_HINT = (
    "leave pieces as it was: build a new dict, merged = {}, put each merged piece into it "
    "with its count, and return that one; whoever called your function may still need the "
    "pieces as they were before the merge")


# Case 1 has pieces without the pair and a piece whose last id is not merged; case 2 the
# overlaps, a a a and a a a a; case 3 a pair with a merged token, found twice in one piece
# and reversed in another.
check_merge_pieces = _ArgumentKeepingChecker(
    reference=_merge_pieces,
    cases=[({tuple(b" low"): 5, tuple(b" lower"): 2, tuple(b" newest"): 6}, (111, 119), 256),
           ({(97, 97, 97): 3, (98, 97, 97, 97, 97): 1}, (97, 97), 256),
           ({(256, 98, 256, 98, 99): 2, (98, 256): 4, (99,): 1}, (256, 98), 257),
           ({(5, 6): 2, (): 1, (6, 5, 6, 5): 1}, (6, 5), 300),
           ({}, (97, 98), 256)],
    mistakes={
        "a list cannot be a dict key: turn each merged piece into a tuple, tuple(merged), "
        "before you store it":
            _each_piece(merge_pair),
        "keep each piece's count: the merged piece occurs as often as the piece did, "
        "{merged piece: count}, not 1":
            lambda pieces, pair, new_id: dict.fromkeys(_merge_pieces(pieces, pair, new_id), 1),
        "keep every piece, also the ones that do not hold the pair: they stay as they are, "
        "with their counts":
            _only_pieces_with_the_pair,
        "nothing was merged: inside each piece, replace every occurrence of pair (two "
        "neighbours, first then second) by the single id new_id":
            lambda pieces, pair, new_id: dict(pieces),
        "the last id of a piece is lost when no match uses it: after the scan, or while "
        "i < len(piece), keep the id that has no neighbour after it":
            _each_piece(lambda piece, pair, new_id: _scan(piece, pair, new_id, keep_last=False)),
        "after a match, move on by two ids (i += 2): in a a a the pair (a, a) at position 0 "
        "uses up the second a, so the result is Z a, not Z Z a":
            _each_piece(lambda piece, pair, new_id: _scan(piece, pair, new_id,
                                                          step_after_match=1)),
        "scan from left to right, as merge_pair does: in a a a the first two a merge, "
        "giving Z a, not a Z":
            _each_piece(_from_the_right),
        "replace every occurrence of the pair in a piece, not only the first one":
            _each_piece(lambda piece, pair, new_id: tuple(_first_only(piece, pair, new_id))),
        "the order inside a pair matters: (first, second) merges only where first comes "
        "before second, not the reversed pair":
            _each_piece(lambda piece, pair, new_id: _scan(piece, pair, new_id,
                                                          either_order=True)),
        "the last id of a piece has no neighbour: check i + 1 < len(piece) before you "
        "look at piece[i + 1]":
            _each_piece(lambda piece, pair, new_id: _scan(piece, pair, new_id,
                                                          check_end=False)),
        "build a new dict for the merged pieces and return it: adding keys to pieces "
        "while you loop over it raises this RuntimeError":
            _changed_while_looping,
        "return a dict {merged piece: count}, not a list of the merged pieces":
            lambda pieces, pair, new_id: list(_merge_pieces(pieces, pair, new_id)),
    },
)


# --- my_train_piece_merges(pieces, num_merges) -> [((first, second), new_id), ...] -------------

def _train_piece_merges(pieces: dict, num_merges: int) -> list:
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = _count_piece_pairs(pieces)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        pieces = {tuple(merge_pair(piece, pair, new_id)): count
                  for piece, count in pieces.items()}
        merges.append((pair, new_id))
    return merges


def _smallest(counts):
    return min(counts, key=lambda pair: (-counts[pair], pair))


def _largest_by_max(counts):
    """The right pair, found with max: the largest count, then the smallest pair."""
    return max(counts, key=lambda pair: (counts[pair], -pair[0], -pair[1]))


def _training(pieces, num_merges, *, choose=_smallest, stop_below=2, first_id=256,
              extra=0, check_empty=True, count=_count_piece_pairs,
              merge=lambda piece, pair, new_id, c: {tuple(merge_pair(piece, pair, new_id)): c},
              record=lambda pair, new_id: (pair, new_id)):
    """Train with one thing done differently: how the pair is chosen (``choose(counts)``),
    when training stops, the first new id, how many merges, how pairs are counted, how a
    piece is merged, or how a merge is recorded."""
    merges = []
    for new_id in range(first_id, first_id + num_merges + extra):
        counts = count(pieces)
        if check_empty and not counts:
            break
        pair = choose(counts)
        if counts[pair] < stop_below:
            break
        merged = {}
        for piece, c in pieces.items():
            merged.update(merge(piece, pair, new_id, c))
        pieces = merged
        merges.append(record(pair, new_id))
    return merges


def _joined_training(pieces, num_merges):
    """The pieces, each written out count times, joined into one list and trained on like
    one text."""
    ids = [i for piece, count in pieces.items() for _ in range(count) for i in piece]
    return _training({tuple(ids): 1}, num_merges)


def _pieces_as_lists(pieces, num_merges):
    """The merged pieces kept as lists, which cannot be dict keys."""
    return _training(pieces, num_merges,
                     merge=lambda piece, pair, new_id, c: {merge_pair(piece, pair, new_id): c})


def _records_the_last_pair(pieces, num_merges):
    """Records the best pair before checking its count, so one pair seen once is kept."""
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = _count_piece_pairs(pieces)
        if not counts:
            break
        pair = _smallest(counts)
        merges.append((pair, new_id))
        if counts[pair] < 2:
            break
        pieces = {tuple(merge_pair(p, pair, new_id)): c for p, c in pieces.items()}
    return merges


def _counted_once(pieces, num_merges):
    """All merges chosen from the counts of the original pieces, never recounted."""
    counts = _count_piece_pairs(pieces)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = [pair for pair, count in ranked if count >= 2][:num_merges]
    return [(pair, 256 + k) for k, pair in enumerate(chosen)]


def _pieces_never_merged(pieces, num_merges):
    """Counted again every time, but from pieces that were never merged."""
    return _training(pieces, num_merges, merge=lambda piece, pair, new_id, c: {piece: c})


def _first_different_merge(expected, got) -> str | None:
    """Where a merge table first differs from the expected one, in words, or None."""
    if not isinstance(got, (list, tuple)) or not expected or not got:
        return None
    for k, (want, have) in enumerate(zip(expected, got)):
        try:
            same = bool(have == want)
        except Exception:  # e.g. an array, which has no single truth value
            same = False
        if not same:
            return f"merge {k + 1} differs, expected {show(want)} but got {show(have)}"
    k = min(len(expected), len(got))
    if len(got) < len(expected):
        return f"the first {k} merges agree, then {show(expected[k])} is missing"
    if len(got) > len(expected):
        return f"the first {k} merges agree, then yours goes on with {show(got[k])}"
    return None


class _MergeTableChecker(Checker):
    """A :class:`Checker` that names the first merge where a wrong table differs, so that
    the learner need not compare two long lists."""

    def _with_hint(self, message, args, *, got=None, error=None):
        if error is None:
            where = _first_different_merge(self.reference(*copy.deepcopy(args)), got)
            if where is not None:
                message = f"{message}: {where}"
        return super()._with_hint(message, args, got=got, error=error)


# The case with room for more merges than the pieces allow comes first: there an answer that
# makes one merge too few or too many is still right, so only a real mistake of counting or
# choosing fails it. In the first case every pair occurs at least twice, so choosing the least
# frequent pair still merges something.
check_train_piece_merges = _MergeTableChecker(
    reference=_train_piece_merges,
    cases=[(_WORDS, 20),
           (_WORDS, 5),
           ({tuple(b"aaabdaaabac"): 1}, 10),
           ({tuple(b"ab"): 3, tuple(b"cdcd"): 1}, 3),
           ({tuple(b"abc"): 3, tuple(b"bcd"): 1}, 3),
           ({tuple(b"xa"): 2, tuple(b"by"): 2}, 4),
           ({(7,): 5}, 2),
           ({}, 2)],
    mistakes={
        # before the recount hint: on case 2 one merge short looks like counting once
        "make num_merges merges (for new_id in range(256, 256 + num_merges)) unless no pair "
        "occurs twice: one is missing":
            lambda pieces, n: _train_piece_merges(pieces, n - 1) if n > 0 else [],
        "one merge too many: new_id runs over range(256, 256 + num_merges), which makes at "
        "most num_merges merges":
            lambda pieces, n: _training(pieces, n, extra=1),
        # before the least frequent pair: on aaabdaaabac, (a, a) counted once per piece
        # loses its tie with (a, b) and then no pair occurs twice
        "a piece can hold a pair more than once: a a a holds (a, a) twice, at positions 0 "
        "and 1. Count the pair that starts at every position (your my_count_piece_pairs "
        "does), not each different pair once per piece":
            lambda pieces, n: _training(pieces, n, count=_per_piece(
                lambda piece: dict.fromkeys(set(zip(piece, piece[1:])), 1))),
        "a pair seen for the first time occurs count times too, not once: "
        "counts[pair] = counts.get(pair, 0) + count, also for a new pair (your "
        "my_count_piece_pairs does)":
            lambda pieces, n: _training(pieces, n, count=_first_sighting_once),
        "choose the most frequent pair, not the least frequent: min() finds the largest "
        "count when the count is negated, min(counts, key=lambda p: (-counts[p], p))":
            lambda pieces, n: _training(pieces, n, choose=lambda c: min(c, key=c.get)),
        "each piece counts as many times as it occurs: weight its pairs by its count (your "
        "my_count_piece_pairs does), so that ' low', seen 5 times, outweighs ' lower', "
        "seen twice":
            lambda pieces, n: _training(
                pieces, n, count=lambda p: _count_piece_pairs(dict.fromkeys(p, 1))),
        "pairs never cross from one piece into the next: count and merge inside each "
        "piece, each weighted by its count, instead of joining the pieces into one list":
            _joined_training,
        "keep each piece's count when you merge it (your my_merge_pieces does): the "
        "merged piece occurs as often as the piece did, {merged piece: count}":
            lambda pieces, n: _training(
                pieces, n, merge=lambda piece, pair, new_id, c:
                {tuple(merge_pair(piece, pair, new_id)): 1}),
        "a list cannot be a dict key: store each merged piece as a tuple (your "
        "my_merge_pieces does), tuple(merge_pair(piece, pair, new_id))":
            _pieces_as_lists,
        # counting once and choosing the smallest pair whatever its count give the same table
        "after the first merges your table goes wrong: each merge must be the most frequent "
        "pair of the pieces as they are now. Recount the pairs after every merge (a merge "
        "removes pairs and creates new ones, such as the new token with its neighbours), "
        "and choose by count first, the smallest pair only breaking ties: "
        "min(counts, key=lambda p: (-counts[p], p))":
            _counted_once,
        # counts never updated and pieces never merged give the same table
        "the same pair comes back every time although it no longer occurs: merge every "
        "piece and keep the merged pieces, pieces = my_merge_pieces(pieces, pair, new_id), "
        "then count the pairs of those, inside the loop":
            _pieces_never_merged,
        "ties go to the smallest pair (first id, then second id), whereas "
        "Counter.most_common and max(counts, key=counts.get) keep the pair seen first: use "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda pieces, n: _training(pieces, n,
                                        choose=lambda c: Counter(c).most_common(1)[0][0]),
        "ties go to the smallest pair (first id, then second id): a key of "
        "(counts[p], p) for max() sends them to the largest pair. Use "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda pieces, n: _training(pieces, n,
                                        choose=lambda c: max(c, key=lambda p: (c[p], p))),
        "ties go to the smallest pair (first id, then second id), whereas "
        "sorted(counts, key=counts.get)[-1] takes the tied pair seen last: use "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda pieces, n: _training(pieces, n,
                                        choose=lambda c: sorted(c, key=c.get)[-1]),
        "ties go to the smallest pair, compared as tuples are: by the first id, and by the "
        "second id only when the first ids are equal. Use the pair itself in the key, "
        "min(counts, key=lambda p: (-counts[p], p))":
            lambda pieces, n: _training(pieces, n,
                                        choose=lambda c: min(c, key=lambda p: (-c[p], p[1],
                                                                               p[0]))),
        "stop when the most frequent pair occurs only once: a token for it would be used a "
        "single time, saving one token at the cost of a vocabulary entry":
            lambda pieces, n: _training(pieces, n, stop_below=0),
        "a pair that occurs twice is still merged (it saves a token each time): stop only "
        "when the best pair occurs fewer than two times, counts[pair] < 2":
            lambda pieces, n: _training(pieces, n, stop_below=3),
        "check the count before you record the merge: a pair that occurs only once is "
        "neither merged nor recorded":
            _records_the_last_pair,
        "no merge was recorded: make up to num_merges merges, for new_id in "
        "range(256, 256 + num_merges), and stop only when the best pair occurs fewer than "
        "two times":
            lambda pieces, n: [],
        "new ids continue after the 256 byte values: the first merge creates 256, the next "
        "257, whatever bytes the pieces use":
            lambda pieces, n: _training(
                pieces, n, first_id=max((i for p in pieces for i in p), default=-1) + 1),
        "new ids start at 256, not 0: ids 0 to 255 are the bytes themselves, so "
        "new_id runs over range(256, 256 + num_merges)":
            lambda pieces, n: _training(pieces, n, first_id=0),
        "off by one: the bytes are 0 to 255, so the first new id is 256":
            lambda pieces, n: _training(pieces, n, first_id=255),
        "record each merge as a tuple ((first, second), new_id), the format of "
        "BPETokenizer.merges: a list [pair, new_id] does not compare equal to a tuple":
            lambda pieces, n: _training(pieces, n,
                                        record=lambda pair, new_id: [pair, new_id]),
        "record each merge as ((first, second), new_id), the pair in a tuple of its own, "
        "not as three numbers (first, second, new_id)":
            lambda pieces, n: _training(pieces, n,
                                        record=lambda pair, new_id: (*pair, new_id)),
        "record each merge as ((first, second), new_id), the pair first, as in "
        "BPETokenizer.merges, not (new_id, (first, second))":
            lambda pieces, n: _training(pieces, n, record=lambda pair, new_id: (new_id, pair)),
        "record each merge as ((first, second), new_id): the pair alone does not say which "
        "id it became":
            lambda pieces, n: _training(pieces, n, record=lambda pair, new_id: pair),
        "return the merges as a list of ((first, second), new_id) in the order they were "
        "learned, not a dict {pair: new_id}":
            lambda pieces, n: dict(_train_piece_merges(pieces, n)),
        "return the merges as a list: a tuple does not compare equal to a list, even with "
        "the same merges in it":
            lambda pieces, n: tuple(_train_piece_merges(pieces, n)),
        "once every piece is a single id (or empty) no pair is left, and min() of no "
        "pairs fails: stop when there are none (if not counts: break)":
            lambda pieces, n: _training(pieces, n, check_empty=False),
        "once every piece is a single id (or empty) no pair is left, and max() of no "
        "pairs fails: stop when there are none (if not counts: break)":
            lambda pieces, n: _training(pieces, n, choose=_largest_by_max, check_empty=False),
    },
)
