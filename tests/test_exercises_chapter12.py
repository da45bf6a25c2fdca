"""The checkers of chapter 12: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it, and each hint of the
checkers is asserted at least once.
"""

from collections import Counter

import pytest

from minitransformer import BPETokenizer
from minitransformer.bpe import merge_pair
from minitransformer.exercises.chapter12 import (
    check_count_piece_pairs,
    check_decode,
    check_encode,
    check_merge_pieces,
    check_train_piece_merges,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_encode(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return ids


def my_decode(ids, merges):
    table = [bytes([i]) for i in range(256)]
    for (first, second), new_id in merges:
        table.append(table[first] + table[second])
    return b"".join(table[i] for i in ids).decode("utf-8")


def my_count_piece_pairs(pieces):
    counts = {}
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] = counts.get(pair, 0) + count
    return counts


def my_merge_pieces(pieces, pair, new_id):
    merged = {}
    for piece, count in pieces.items():
        ids, i = [], 0
        while i < len(piece):
            if i + 1 < len(piece) and (piece[i], piece[i + 1]) == pair:
                ids.append(new_id)
                i += 2
            else:
                ids.append(piece[i])
                i += 1
        merged[tuple(ids)] = count
    return merged


def my_train_piece_merges(pieces, num_merges):
    merges = []
    for new_id in range(256, 256 + num_merges):
        counts = my_count_piece_pairs(pieces)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        pieces = my_merge_pieces(pieces, pair, new_id)
        merges.append((pair, new_id))
    return merges


CHECKERS = {
    "encode": (check_encode, my_encode),
    "decode": (check_decode, my_decode),
    "count_piece_pairs": (check_count_piece_pairs, my_count_piece_pairs),
    "merge_pieces": (check_merge_pieces, my_merge_pieces),
    "train_piece_merges": (check_train_piece_merges, my_train_piece_merges),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_a_correct_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def _undo_last_merge_first(ids, merges):
    ids = list(ids)
    for (first, second), new_id in reversed(merges):
        expanded = []
        for i in ids:
            expanded += [first, second] if i == new_id else [i]
        ids = expanded
    return bytes(ids).decode("utf-8")


def _count_with_a_counter(pieces):
    counts = Counter()
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] += count
    return counts


def _train_with_the_package(pieces, num_merges):
    """What BPETokenizer.train does: the pieces written out, then the package's training."""
    from minitransformer.bpe import train_merges_incremental
    written_out = [piece for piece, count in pieces.items() for _ in range(count)]
    return train_merges_incremental(written_out, num_merges)


def _merge_with_the_package(pieces, pair, new_id):
    return {tuple(merge_pair(piece, pair, new_id)): count for piece, count in pieces.items()}


def _merge_adding_counts(pieces, pair, new_id):
    """Adds the counts of pieces that merge into the same one (which cannot happen)."""
    merged = Counter()
    for piece, count in pieces.items():
        merged[tuple(merge_pair(piece, pair, new_id))] += count
    return dict(merged)


def test_accepts_other_correct_forms(capsys):
    assert check_encode(lambda text, merges: BPETokenizer(merges).encode(text))
    assert check_decode(lambda ids, merges: BPETokenizer(merges).decode(ids))
    assert check_decode(_undo_last_merge_first)
    assert check_count_piece_pairs(_count_with_a_counter)
    assert check_merge_pieces(_merge_with_the_package)
    assert check_merge_pieces(_merge_adding_counts)
    assert check_train_piece_merges(_train_with_the_package)
    assert capsys.readouterr().out.count("✓") == 7


def test_merge_tables_may_be_tuples_as_in_bpetokenizer():
    """The statements allow a tuple of merges, the type of BPETokenizer.merges; one case of
    encode and one of decode passes one."""
    assert any(isinstance(merges, tuple) for _, merges in check_encode.cases)
    assert any(isinstance(merges, tuple) for _, merges in check_decode.cases)


def test_the_chapters_examples_are_cases():
    """aaabdaaabac -> XdXac, and Sennrich et al.'s words, are what the checkers test first."""
    text, merges = check_encode.cases[0]
    assert text == "aaabdaaabac"
    assert my_encode(text, merges) == [258, ord("d"), 258, ord("a"), ord("c")]
    assert check_decode.cases[0] == ([258, ord("d"), 258, ord("a"), ord("c")], merges)
    assert my_train_piece_merges({tuple(b"aaabdaaabac"): 1}, 10) == merges
    words, room = check_train_piece_merges.cases[0]
    assert {bytes(piece): count for piece, count in words.items()} == {
        b" low": 5, b" lower": 2, b" newest": 6, b" widest": 3}
    assert len(my_train_piece_merges(words, room)) < room  # room for more merges


def _hint(checker, wrong, capsys):
    assert not checker(wrong)
    out = capsys.readouterr().out
    assert "Hint: " in out, out
    return out.split("Hint: ", 1)[1].rstrip("\n")


def _assert_hint(checker, wrong, fragment, capsys):
    """The learner's wrong answer gets exactly the one hint that contains fragment: a hint
    listed earlier that matches the same answer would point the wrong way."""
    hints = [hint for hint in checker.mistakes if fragment in hint]
    assert len(hints) == 1, (fragment, hints)
    assert _hint(checker, wrong, capsys) == hints[0]


# --- my_encode ----------------------------------------------------------------------------------

def _merge_first_only(ids, pair, new_id):
    ids = list(ids)
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
            break
    return ids


def _encode_reversed(text, merges):
    return my_encode(text, list(reversed(merges)))


def _encode_ord(text, merges):
    ids = [ord(c) for c in text]
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return ids


def _encode_characters(text, merges):
    ids = list(text)
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return ids


def _encode_first_only(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = _merge_first_only(ids, pair, new_id)
    return ids


def _encode_position(text, merges):
    ids = list(text.encode("utf-8"))
    for k, (pair, _) in enumerate(merges):
        ids = merge_pair(ids, pair, k)
    return ids


def _encode_result_dropped(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        merge_pair(ids, pair, new_id)  # the merged list is thrown away
    return ids


def _encode_words(text, merges):
    ids = []
    for word in text.split():
        ids += my_encode(word, merges)
    return ids


def _encode_by_counting(text, merges):
    ids = list(text.encode("utf-8"))
    for _, new_id in merges:
        counts = Counter(zip(ids, ids[1:]))
        if counts:
            ids = merge_pair(ids, max(counts, key=counts.get), new_id)
    return ids


def _encode_as_a_tuple(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return tuple(ids)


@pytest.mark.parametrize("wrong, hint", [
    (_encode_as_a_tuple, "return the ids as a list"),
    (_encode_reversed, "in the order they were learned"),
    (_encode_result_dropped, "keep each result, ids = merge_pair(ids, pair, new_id)"),
    (_encode_words, "text.split() drops them"),
    (_encode_by_counting, "encoding does not count pairs"),
    (_encode_ord, "not from ord(c)"),
    (_encode_characters, "list(text) gives characters"),
    (_encode_first_only, "not only the first one"),
    (_encode_position, "not the entry's position"),
])
def test_encode_hints(wrong, hint, capsys):
    _assert_hint(check_encode, wrong, hint, capsys)


# --- my_decode ----------------------------------------------------------------------------------

def _table(merges):
    table = [bytes([i]) for i in range(256)]
    for (first, second), _ in merges:
        table.append(table[first] + table[second])
    return table


def _decode_ids_as_characters(ids, merges):
    return "".join(chr(i) for i in ids)


def _decode_byte_by_byte(ids, merges):
    table = _table(merges)
    text = ""
    for i in ids:
        for byte in table[i]:
            text += chr(byte)
    return text


def _decode_latin1(ids, merges):
    return b"".join(_table(merges)[i] for i in ids).decode("latin-1")


def _decode_token_by_token(ids, merges):
    table = _table(merges)
    return "".join(table[i].decode("utf-8") for i in ids)


def _decode_token_by_token_replaced(ids, merges):
    table = _table(merges)
    return "".join(table[i].decode("utf-8", errors="replace") for i in ids)


def _decode_undo_in_learned_order(ids, merges):
    ids = list(ids)
    for (first, second), new_id in merges:
        expanded = []
        for i in ids:
            expanded += [first, second] if i == new_id else [i]
        ids = expanded
    return bytes(ids).decode("utf-8")


def _decode_one_level(ids, merges):
    table = {new_id: bytes(pair) for pair, new_id in merges}
    return b"".join(table.get(i) or bytes([i]) for i in ids).decode("utf-8")


def _decode_without_expanding(ids, merges):
    return bytes(ids).decode("utf-8")


def _decode_str_of_bytes(ids, merges):
    return str(b"".join(_table(merges)[i] for i in ids))


def _decode_ignoring_errors(ids, merges):
    text = ""
    for i in ids:
        text += _table(merges)[i].decode("utf-8", errors="ignore")
    return text


def _decode_one_level_as_characters(ids, merges):
    parts = {new_id: pair for pair, new_id in merges}
    text = ""
    for i in ids:
        if i in parts:
            first, second = parts[i]
            text += chr(first) + chr(second)
        else:
            text += chr(i)
    return text


def _decode_merges_only(ids, merges):
    table = {}
    for (first, second), new_id in merges:
        table[new_id] = table[first] + table[second]
    return b"".join(table[i] for i in ids).decode("utf-8")


def _decode_to_bytes(ids, merges):
    return b"".join(_table(merges)[i] for i in ids)


def _decode_to_pieces(ids, merges):
    table = _table(merges)
    return [table[i].decode("utf-8", errors="replace") for i in ids]


@pytest.mark.parametrize("wrong, hint", [
    (_decode_ids_as_characters, "chr(258) is 'Ă'"),
    (_decode_byte_by_byte, "chr(195) + chr(169) is 'Ã©'"),
    (_decode_latin1, "chr(195) + chr(169) is 'Ã©'"),
    (_decode_token_by_token, "a token can hold part of a character"),
    (_decode_token_by_token_replaced, "each � marks a token decoded on its own"),
    (_decode_undo_in_learned_order, "Undo the merges from the last one learned"),
    (_decode_one_level, "its parts can be merged tokens themselves (X = ZY)"),
    (_decode_without_expanding, "bytes() takes only 0 to 255"),
    (_decode_merges_only, "tokens 0 to 255 are the bytes themselves"),
    (_decode_to_bytes, "return the text as a str"),
    (_decode_to_pieces, "not a list with one entry per token"),
    (_decode_str_of_bytes, "str() of bytes"),
    (_decode_ignoring_errors, "errors='ignore' dropped both"),
    (_decode_one_level_as_characters, "'Ā' is chr(256)"),
])
def test_decode_hints(wrong, hint, capsys):
    _assert_hint(check_decode, wrong, hint, capsys)


# --- my_count_piece_pairs -----------------------------------------------------------------------

def _pieces_counted_once(pieces):
    counts = {}
    for piece in pieces:
        for pair in zip(piece, piece[1:]):
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def _count_overwritten(pieces):
    counts = {}
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            counts[pair] = count
    return counts


def _count_joined(pieces):
    ids = []
    for piece in pieces:
        ids += piece
    return dict(Counter(zip(ids, ids[1:])))


def _count_written_out(pieces):
    ids = []
    for piece, count in pieces.items():
        ids += list(piece) * count
    return dict(Counter(zip(ids, ids[1:])))


def _count_each_pair_once_per_piece(pieces):
    counts = {}
    for piece, count in pieces.items():
        for pair in set(zip(piece, piece[1:])):
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_without_overlaps(pieces):
    counts = {}
    for piece, count in pieces.items():
        i = 0
        while i + 1 < len(piece):
            pair = (piece[i], piece[i + 1])
            counts[pair] = counts.get(pair, 0) + count
            i += 2 if i + 2 < len(piece) and (piece[i + 1], piece[i + 2]) == pair else 1
    return counts


def _count_even_positions(pieces):
    counts = {}
    for piece, count in pieces.items():
        for i in range(0, len(piece) - 1, 2):
            pair = (piece[i], piece[i + 1])
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_range_minus_two(pieces):
    counts = {}
    for piece, count in pieces.items():
        for i in range(len(piece) - 2):
            pair = (piece[i], piece[i + 1])
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_past_the_end(pieces):
    counts = {}
    for piece, count in pieces.items():
        for i in range(len(piece)):
            pair = (piece[i], piece[i + 1])
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_wrapping(pieces):
    counts = {}
    for piece, count in pieces.items():
        for i in range(len(piece)):
            pair = (piece[i - 1], piece[i])
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_sorted(pieces):
    counts = {}
    for piece, count in pieces.items():
        for a, b in zip(piece, piece[1:]):
            pair = (min(a, b), max(a, b))
            counts[pair] = counts.get(pair, 0) + count
    return counts


def _count_first_sighting_once(pieces):
    counts = {}
    for piece, count in pieces.items():
        for pair in zip(piece, piece[1:]):
            if pair in counts:
                counts[pair] += count
            else:
                counts[pair] = 1
    return counts


def _count_text_keys(pieces):
    counts = {}
    for piece, count in pieces.items():
        for a, b in zip(piece, piece[1:]):
            counts[chr(a) + chr(b)] = counts.get(chr(a) + chr(b), 0) + count
    return counts


def _count_bytes_keys(pieces):
    counts = Counter()
    for piece, count in pieces.items():
        for i in range(len(piece) - 1):
            counts[bytes(piece[i:i + 2])] += count
    return counts


def _count_ids(pieces):
    counts = Counter()
    for piece, count in pieces.items():
        for i in piece:
            counts[i] += count
    return counts


@pytest.mark.parametrize("wrong, hint", [
    (_pieces_counted_once, "each piece stands for count copies of itself"),
    (_count_overwritten, "not counts[pair] = count"),
    (_count_joined, "instead of joining the pieces into one list"),
    (_count_written_out, "not even into a copy of itself"),
    (lambda pieces: pieces, "not whole pieces"),
    (_count_ids, "not single ids"),
    (_count_each_pair_once_per_piece, "a piece can hold a pair more than once"),
    (_count_without_overlaps, "without skipping ahead after a match"),
    (_count_even_positions, "not only at the even ones"),
    (_count_range_minus_two, "the last pair of each piece is missing"),
    (_count_past_the_end, "stop before piece[i + 1] runs past the end"),
    (_count_wrapping, "piece[i - 1] is piece[-1]"),
    (_count_sorted, "the order inside a pair matters"),
    (lambda pieces: Counter(my_count_piece_pairs(pieces)).most_common(),
     "such as most_common() or list(counts.items()) gives"),
    (lambda pieces: list(my_count_piece_pairs(pieces).items()),
     "such as most_common() or list(counts.items()) gives"),
    (lambda pieces: sorted(my_count_piece_pairs(pieces).items()), "sorted() always makes"),
    (_count_first_sighting_once, "a pair seen for the first time occurs count times"),
    (_count_text_keys, "not text such as 'lo'"),
    (_count_bytes_keys, "bytes([108, 111]) is b'lo'"),
])
def test_count_piece_pairs_hints(wrong, hint, capsys):
    _assert_hint(check_count_piece_pairs, wrong, hint, capsys)


# --- my_merge_pieces ---------------------------------------------------------------------------

def _merge(*, step=2, keep_last=True, check_end=True, either_order=False, first_only=False,
           as_tuple=True, keep_count=True, keep_all=True):
    """my_merge_pieces with one line written differently."""
    def merge(pieces, pair, new_id):
        merged = {}
        for piece, count in pieces.items():
            ids, i, done = [], 0, False
            while i < (len(piece) if keep_last else len(piece) - 1):
                if check_end and i + 1 >= len(piece):
                    ids.append(piece[i])
                    i += 1
                    continue
                here = (piece[i], piece[i + 1])
                if not done and (here == pair or either_order and set(here) == set(pair)):
                    ids.append(new_id)
                    i += step
                    done = first_only
                else:
                    ids.append(piece[i])
                    i += 1
            if keep_all or new_id in ids:
                merged[tuple(ids) if as_tuple else ids] = count if keep_count else 1
        return merged
    return merge


def _merge_from_the_right(pieces, pair, new_id):
    merged = {}
    for piece, count in pieces.items():
        ids, i = [], len(piece) - 1
        while i >= 0:
            if i > 0 and (piece[i - 1], piece[i]) == pair:
                ids.insert(0, new_id)
                i -= 2
            else:
                ids.insert(0, piece[i])
                i -= 1
        merged[tuple(ids)] = count
    return merged


def _merge_keeps_the_old_pieces(pieces, pair, new_id):
    merged = {}
    for piece, count in pieces.items():
        merge_pair(piece, pair, new_id)  # the merged piece is thrown away
        merged[piece] = count
    return merged


def _merge_while_looping(pieces, pair, new_id):
    for piece, count in pieces.items():
        pieces[tuple(merge_pair(piece, pair, new_id))] = count
    return pieces


def _merge_to_a_list(pieces, pair, new_id):
    return [tuple(merge_pair(piece, pair, new_id)) for piece in pieces]


@pytest.mark.parametrize("wrong, hint", [
    (_merge(as_tuple=False), "a list cannot be a dict key"),
    (_merge(keep_count=False), "keep each piece's count"),
    (_merge(keep_all=False), "keep every piece"),
    (_merge_keeps_the_old_pieces, "nothing was merged"),
    (_merge(keep_last=False), "the last id of a piece is lost"),
    (_merge(step=1), "not Z Z a"),
    (_merge_from_the_right, "scan from left to right"),
    (_merge(first_only=True), "not only the first one"),
    (_merge(either_order=True), "the order inside a pair matters"),
    (_merge(check_end=False), "check i + 1 < len(piece)"),
    (_merge_while_looping, "raises this RuntimeError"),
    (_merge_to_a_list, "not a list of the merged pieces"),
])
def test_merge_pieces_hints(wrong, hint, capsys):
    _assert_hint(check_merge_pieces, wrong, hint, capsys)


# --- my_train_piece_merges ----------------------------------------------------------------------

def _smallest(counts):
    return min(counts, key=lambda p: (-counts[p], p))


def _train(*, choose=_smallest, count=my_count_piece_pairs, stop_at=2, first_id=256,
           extra=0, recount=True, empty_check=True, record_first=False, keep_count=True,
           as_tuple=True, keep_merged=True, forget_chosen=False, record=None):
    """my_train_piece_merges with one line written differently."""
    def train(pieces, num_merges):
        merges = []
        counts = count(pieces)
        for new_id in range(first_id, first_id + num_merges + extra):
            if recount:
                counts = count(pieces)
            if empty_check and not counts:
                break
            pair = choose(counts)
            if record_first:
                merges.append((pair, new_id))
            if counts[pair] < stop_at:
                break
            merged = {}
            for piece, c in pieces.items():
                new_piece = merge_pair(piece, pair, new_id)
                merged[tuple(new_piece) if as_tuple else new_piece] = c if keep_count else 1
            if keep_merged:
                pieces = merged
            if forget_chosen:
                del counts[pair]
            if not record_first:
                merges.append(record(pair, new_id) if record else (pair, new_id))
        return merges
    return train


def _train_on_joined_pieces(repeat):
    def train(pieces, num_merges):
        ids = []
        for piece, count in pieces.items():
            ids += list(piece) * (count if repeat else 1)
        merges = []
        for new_id in range(256, 256 + num_merges):
            counts = Counter(zip(ids, ids[1:]))
            if not counts:
                break
            pair = _smallest(counts)
            if counts[pair] < 2:
                break
            ids = merge_pair(ids, pair, new_id)
            merges.append((pair, new_id))
        return merges
    return train


def _one_merge_short(pieces, num_merges):
    return my_train_piece_merges(pieces, num_merges - 1)


def _train_range_mistake(pieces, num_merges):
    # for new_id in range(256, num_merges): no merge at all while num_merges <= 256
    return my_train_piece_merges(pieces, num_merges - 256) if num_merges > 256 else []


def _first_id_after_the_bytes_used(pieces, num_merges):
    first = max((i for piece in pieces for i in piece), default=-1) + 1
    return _train(first_id=first)(pieces, num_merges)


def _count_each_pair_once_with_update(pieces):
    """Counter.update with a dict: each different pair once per piece, weighted."""
    counts = Counter()
    for piece, count in pieces.items():
        counts.update({pair: count for pair in zip(piece, piece[1:])})
    return counts


def _train_to_a_dict(pieces, num_merges):
    merges = {}
    for new_id in range(256, 256 + num_merges):
        counts = my_count_piece_pairs(pieces)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        pieces = my_merge_pieces(pieces, pair, new_id)
        merges[pair] = new_id
    return merges


@pytest.mark.parametrize("wrong, hint", [
    (_train(count=_count_each_pair_once_with_update), "a piece can hold a pair more than once"),
    (_train(count=_count_first_sighting_once), "a pair seen for the first time"),
    (_train(choose=lambda c: sorted(c, key=c.get)[-1]), "takes the tied pair seen last"),
    (_train(choose=lambda c: min(c, key=lambda p: (-c[p], p[1], p[0]))),
     "compared as tuples are"),
    (_train(record=lambda pair, new_id: (new_id, pair)), "not (new_id, (first, second))"),
    (_train(record=lambda pair, new_id: pair), "the pair alone does not say"),
    (_train_to_a_dict, "not a dict {pair: new_id}"),
    (lambda pieces, n: tuple(my_train_piece_merges(pieces, n)),
     "a tuple does not compare equal to a list"),
    (_one_merge_short, "one is missing"),
    (_train(extra=1), "one merge too many"),
    (_train(choose=lambda c: min(c, key=c.get)), "choose the most frequent pair, not the least"),
    (_train(count=_pieces_counted_once), "each piece counts as many times as it occurs"),
    (_train_on_joined_pieces(repeat=True), "weighted by its count, instead of joining"),
    # joined once each: on the first case only the weights matter, and that is the hint
    (_train_on_joined_pieces(repeat=False), "each piece counts as many times as it occurs"),
    (_train(keep_count=False), "keep each piece's count when you merge it"),
    (_train(as_tuple=False), "a list cannot be a dict key"),
    (_train(recount=False, forget_chosen=True), "Recount the pairs after every merge"),
    (_train(recount=False), "the same pair comes back every time"),
    (_train(keep_merged=False), "merge every piece and keep the merged pieces"),
    (_train(choose=lambda c: max(c, key=c.get)), "keep the pair seen first"),
    (_train(choose=lambda c: Counter(c).most_common(1)[0][0]), "keep the pair seen first"),
    (_train(choose=lambda c: max(c, key=lambda p: (c[p], p))), "sends them to the largest"),
    (_train(stop_at=0), "stop when the most frequent pair occurs only once"),
    (_train(stop_at=3), "a pair that occurs twice is still merged"),
    (_train(record_first=True), "check the count before you record the merge"),
    (_train_range_mistake, "no merge was recorded"),
    (_first_id_after_the_bytes_used, "new ids continue after the 256 byte values"),
    (_train(first_id=0), "new ids start at 256, not 0"),
    (_train(first_id=255), "off by one"),
    (_train(record=lambda pair, new_id: [pair, new_id]), "a list [pair, new_id]"),
    (_train(record=lambda pair, new_id: (pair[0], pair[1], new_id)), "not as three numbers"),
    (_train(empty_check=False), "min() of no pairs fails"),
    (_train(choose=lambda c: max(c, key=lambda p: (c[p], -p[0], -p[1])), empty_check=False),
     "max() of no pairs fails"),
])
def test_train_piece_merges_hints(wrong, hint, capsys):
    _assert_hint(check_train_piece_merges, wrong, hint, capsys)


def test_a_stub_is_not_implemented_yet(capsys):
    def my_count_piece_pairs(pieces):
        raise NotImplementedError

    assert not check_count_piece_pairs(my_count_piece_pairs)
    assert capsys.readouterr().out == "✗ not implemented yet\n"


def test_a_wrong_merge_table_is_reported_with_its_first_difference(capsys):
    """A table of 15 merges is hard to compare by eye: the message names the first merge
    that differs, or where a table that agrees so far stops or goes on."""
    assert not check_train_piece_merges(_train(choose=lambda c: sorted(c, key=c.get)[-1]))
    out = capsys.readouterr().out
    assert ": merge 1 differs, expected ((101, 115), 256) but got ((115, 116), 256). Hint: " \
        in out, out
    assert not check_train_piece_merges(_one_merge_short)
    out = capsys.readouterr().out
    assert ": the first 4 merges agree, then ((258, 259), 260) is missing. Hint: " in out, out
    assert not check_train_piece_merges(_train(extra=1))
    out = capsys.readouterr().out
    assert ": the first 5 merges agree, then yours goes on with ((32, 110), 261). Hint: " \
        in out, out
    assert not check_train_piece_merges(_train(record=lambda pair, new_id: pair))
    out = capsys.readouterr().out  # the pairs alone are summarised as an array of shape (15, 2)
    assert "list of shape (15, 2): merge 1 differs, expected ((101, 115), 256) " \
        "but got (101, 115). Hint: " in out, out


# --- mistakes found by a learner's review of chapters 8-12 (issue 25) ------------------------

def _encode_from_the_right(text, merges):
    """Each merge written out as a scan from the last id to the first."""
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        merged, i = [], len(ids) - 1
        while i >= 0:
            if i > 0 and (ids[i - 1], ids[i]) == tuple(pair):
                merged.insert(0, new_id)
                i -= 2
            else:
                merged.insert(0, ids[i])
                i -= 1
        ids = merged
    return ids


def _encode_to_bytes(text, merges):
    ids = list(text.encode("utf-8"))
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return bytes(ids)


@pytest.mark.parametrize("wrong, hint", [
    (_encode_from_the_right, "scan from left to right, as merge_pair does"),
    (_encode_to_bytes, "bytes() holds only the numbers 0 to 255"),
    (lambda text, merges: text.encode("utf-8"), "it is a bytes object"),
], ids=["right to left", "bytes(ids)", "text.encode"])
def test_encode_hints_found_in_review(wrong, hint, capsys):
    # learner review (issue 25): these got no hint
    _assert_hint(check_encode, wrong, hint, capsys)


def _merge_in_place(pieces, pair, new_id):
    """Changes pieces as it goes, over a copy of its items, and returns it."""
    for piece, count in list(pieces.items()):
        del pieces[piece]
        ids, i = [], 0
        while i < len(piece):
            if i + 1 < len(piece) and (piece[i], piece[i + 1]) == pair:
                ids.append(new_id)
                i += 2
            else:
                ids.append(piece[i])
                i += 1
        pieces[tuple(ids)] = count
    return pieces


def _merge_emptying_pieces(pieces, pair, new_id):
    """Returns a new dict, but takes the pieces out of the argument one by one."""
    merged = {}
    while pieces:
        piece, count = pieces.popitem()
        merged[tuple(merge_pair(piece, pair, new_id))] = count
    return merged


CHANGED_PIECES_HINT = (
    "Hint: leave pieces as it was: build a new dict, merged = {}, put each merged piece into it "
    "with its count, and return that one; whoever called your function may still need the "
    "pieces as they were before the merge\n")


def test_merge_pieces_that_changes_its_argument_in_place(capsys):
    # learner review (issue 25): "leave pieces as it was" was not checked, and this passed
    assert not check_merge_pieces(_merge_in_place)
    assert capsys.readouterr().out == (
        "✗ case 1: for input ({(32, 108, 111, 119): 5, (32, 108, 111, 119, 101, 114): 2, "
        "(32, 110, 101, 119, 101, 115, 116): 6}, (111, 119), 256) your function returned the "
        "right dict but changed pieces to {(32, 108, 256): 5, (32, 108, 256, 101, 114): 2, "
        "(32, 110, 101, 119, 101, 115, 116): 6}. " + CHANGED_PIECES_HINT)


def test_merge_pieces_that_empties_its_argument(capsys):
    assert not check_merge_pieces(_merge_emptying_pieces)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert "your function returned the right dict but changed pieces to {}. " in out
    assert out.endswith(CHANGED_PIECES_HINT)
