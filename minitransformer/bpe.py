"""Byte-pair encoding: a tokenizer that learns its vocabulary (chapter 12).

The vocabulary starts as the 256 byte values, so any text can be written in it. Training then
repeats one step: find the most frequent pair of adjacent tokens and give it a new id. The
chapter's functions read like that description (``count_pairs``, ``merge_pair``,
``train_merges``); ``train_merges_incremental`` gives the same merges faster by updating
the pair counts around each merge instead of recounting everything, and
``benchmarks/bpe.py`` times the two.

Rules that make the result unique:

- pairs are counted with overlaps (``aaa`` holds the pair ``aa`` twice) and replaced left to
  right (``aaa`` becomes ``Za``);
- ties go to the smallest pair ``(first id, second id)``;
- training stops early when no pair occurs at least twice.

With a ``pattern`` (a regular expression, for example ``GPT2_PATTERN``) the text is first
split into pieces, and merges never cross a piece boundary. Text the pattern does not match is
kept as pieces of its own, so nothing is ever lost.

This module imports nothing else of the package but the shared argument checks.
"""

from __future__ import annotations

import heapq
import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence

import regex

from minitransformer._checks import check_int, check_type

# GPT-2's split pattern (Radford et al. 2019): contractions, letters, digits, other symbols,
# whitespace. \p{L} and \p{N} are Unicode classes that the standard ``re`` module rejects.
GPT2_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")

Pair = tuple[int, int]
Merge = tuple[Pair, int]

_FORMAT = "minitransformer.bpe"
_FORMAT_VERSION = 1
_CACHE_LIMIT = 100_000


# ----- the algorithm, as the chapter writes it -------------------------------------------------

def count_pairs(ids: Sequence[int]) -> Counter[Pair]:
    """How often each adjacent pair occurs in ``ids``, overlaps included."""
    return Counter(zip(ids, ids[1:]))


def merge_pair(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """``ids`` with every occurrence of ``pair``, scanned left to right, replaced by ``new_id``."""
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def most_frequent_pair(counts: Counter[Pair]) -> tuple[Pair, int]:
    """The most frequent pair and its count; ties go to the smallest pair."""
    pair, count = min(counts.items(), key=lambda item: (-item[1], item[0]))
    return pair, count


def train_merges(pieces: Iterable[Sequence[int]], num_merges: int, *,
                 first_id: int = 256) -> list[Merge]:
    """Learn up to ``num_merges`` merges from ``pieces`` (lists of ids), recounting every pair
    after every merge: the readable reference, and the benchmark's slow baseline."""
    pieces = [list(piece) for piece in pieces]
    merges = []
    for new_id in range(first_id, first_id + num_merges):
        counts = Counter()
        for ids in pieces:
            counts.update(count_pairs(ids))
        if not counts:
            break
        pair, count = most_frequent_pair(counts)
        if count < 2:
            break
        pieces = [merge_pair(ids, pair, new_id) for ids in pieces]
        merges.append((pair, new_id))
    return merges


def apply_merges(ids: Sequence[int], merges: Iterable[Merge]) -> list[int]:
    """Encode by applying the merges one after the other, in the order they were learned."""
    ids = list(ids)
    for pair, new_id in merges:
        ids = merge_pair(ids, pair, new_id)
    return ids


# ----- the speed trick: update the counts around each merge -------------------------------------

def train_merges_incremental(pieces: Iterable[Sequence[int]], num_merges: int, *,
                             first_id: int = 256) -> list[Merge]:
    """The same merges as ``train_merges``, found without recounting.

    Identical pieces are stored once with a weight. All tokens sit in one array of linked
    nodes (``nxt``/``prv``, -1 at a piece's ends); ``where[pair]`` holds the nodes at which
    ``pair`` starts. A merge visits only those nodes and adjusts the counts of the pairs it
    destroys and creates; a heap of ``(-count, pair)`` finds the next merge.
    """
    weights = Counter(tuple(piece) for piece in pieces)
    tok, nxt, prv, weight = [], [], [], []
    for piece, w in weights.items():
        if not piece:
            continue
        start, end = len(tok), len(tok) + len(piece)
        tok.extend(piece)
        nxt.extend(range(start + 1, end + 1))
        nxt[-1] = -1
        prv.extend(range(start - 1, end - 1))
        prv[start] = -1
        weight.extend([w] * len(piece))
    counts: Counter[Pair] = Counter()
    where: dict[Pair, set[int]] = {}
    for i, j in enumerate(nxt):
        if j >= 0:
            pair = (tok[i], tok[j])
            counts[pair] += weight[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)

    merges = []
    for new_id in range(first_id, first_id + num_merges):
        while heap and -heap[0][0] != counts.get(heap[0][1], 0):
            heapq.heappop(heap)  # stale: the count changed since this entry was pushed
        if not heap or -heap[0][0] < 2:
            break
        _, pair = heapq.heappop(heap)
        changed = _merge_everywhere(pair, new_id, tok, nxt, prv, weight, counts, where)
        for p in changed:
            if counts.get(p, 0) > 0:
                heapq.heappush(heap, (-counts[p], p))
        merges.append((pair, new_id))
    return merges


def _merge_everywhere(pair, new_id, tok, nxt, prv, weight, counts, where) -> set[Pair]:
    """Merge ``pair`` at every node in ``where[pair]``, left to right; return the pairs whose
    counts changed."""
    first, second = pair
    changed = set()

    def move(old: Pair, new: Pair, node: int, w: int) -> None:
        counts[old] -= w
        if counts[old] == 0:
            del counts[old]
        counts[new] += w
        where.setdefault(new, set()).add(node)
        changed.update((old, new))

    for i in sorted(where.pop(pair)):
        j = nxt[i]
        if tok[i] != first or j < 0 or tok[j] != second:
            continue  # this occurrence was consumed by an overlapping one to its left
        w = weight[i]
        before, after = prv[i], nxt[j]
        if before >= 0:
            move((tok[before], first), (tok[before], new_id), before, w)
        if after >= 0:
            move((second, tok[after]), (new_id, tok[after]), i, w)
        counts[pair] -= w
        tok[i], tok[j] = new_id, -1
        nxt[i] = after
        if after >= 0:
            prv[after] = i
    counts.pop(pair, None)
    changed.discard(pair)
    return changed


def _encode_by_rank(ids: list[int], ranks: dict[Pair, int]) -> list[int]:
    """Apply merges by rank with a heap: same result as ``apply_merges``, but each step
    takes the earliest-learned pair present instead of trying every merge in turn."""
    n = len(ids)
    if n < 2:
        return ids
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = [(ranks[p], i) for i, p in enumerate(zip(ids, ids[1:])) if p in ranks]
    heapq.heapify(heap)
    pop, push, rank_of = heapq.heappop, heapq.heappush, ranks.get
    while heap:
        new_id, i = pop(heap)
        j = nxt[i]
        if j < 0 or rank_of((ids[i], ids[j])) != new_id:
            continue  # stale: i was merged away, or its pair changed
        after = nxt[j]
        ids[i], ids[j] = new_id, -1
        nxt[i] = after
        if after >= 0:
            prv[after] = i
            rank = rank_of((new_id, ids[after]))
            if rank is not None:
                push(heap, (rank, i))
        before = prv[i]
        if before >= 0:
            rank = rank_of((ids[before], new_id))
            if rank is not None:
                push(heap, (rank, before))
    return [t for t in ids if t >= 0]


# ----- the tokenizer ----------------------------------------------------------------------------

class BPETokenizer:
    """A byte-level BPE tokenizer: 256 byte tokens, then one token per merge.

    Build one with ``train``, from a merge table (``BPETokenizer(merges, pattern=...)``),
    or with ``load``. ``decode(encode(s)) == s`` for every string ``s``. Decoding ids whose
    bytes are not valid UTF-8 (a token sequence cut in the middle of a character) puts U+FFFD
    in their place, as GPT-2 does, instead of raising.
    """

    def __init__(self, merges: Iterable[Merge] = (), *, pattern: str | None = None) -> None:
        self.merges: tuple[Merge, ...] = _checked_merges(merges)
        self.pattern = pattern
        self._splitter = _compile(pattern)
        self._ranks = {pair: new_id for pair, new_id in self.merges}
        self._bytes = [bytes([b]) for b in range(256)]
        for (first, second), _ in self.merges:
            self._bytes.append(self._bytes[first] + self._bytes[second])
        self._cache: dict[bytes, list[int]] = {}

    @classmethod
    def train(cls, text: str, vocab_size: int, *, pattern: str | None = None) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges from ``text`` (fewer if no pair repeats).

        Raises ``TypeError`` for a non-string text or pattern or a non-int size, and
        ``ValueError`` for ``vocab_size < 256`` or a pattern that does not compile.
        """
        check_type("text", text, str, "a str")
        check_int("vocab_size", vocab_size, low=256)
        splitter = _compile(pattern)
        pieces = [piece.encode("utf-8") for piece in _split(text, splitter)]
        merges = train_merges_incremental(pieces, vocab_size - 256)
        return cls(merges, pattern=pattern)

    def __len__(self) -> int:
        """The vocabulary size: 256 bytes plus one token per merge."""
        return 256 + len(self.merges)

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        check_type("text", text, str, "a str")
        if self._splitter is None:
            return _encode_by_rank(list(text.encode("utf-8")), self._ranks)
        ids = []
        for piece in _split(text, self._splitter):
            data = piece.encode("utf-8")
            cached = self._cache.get(data)
            if cached is None:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                cached = self._cache[data] = _encode_by_rank(list(data), self._ranks)
            ids.extend(cached)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a list of ids; ids outside ``[0, len(self))`` are a ``ValueError``."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The raw bytes of a list of ids."""
        check_type("ids", ids, (list, tuple), "a list of ints (use .tolist() on a tensor)")
        table = self._bytes
        for k, i in enumerate(ids):
            check_int(f"ids[{k}]", i, low=0)
            if i >= len(table):
                raise ValueError(f"ids[{k}] is {i}, outside the vocabulary [0, {len(table)})")
        return b"".join(table[i] for i in ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, e.g. ``b' the'``."""
        check_int("token_id", token_id, low=0)
        if token_id >= len(self._bytes):
            raise ValueError(f"token_id is {token_id}, outside the vocabulary "
                             f"[0, {len(self._bytes)})")
        return self._bytes[token_id]

    def save(self, path: str | os.PathLike) -> None:
        """Write the merges and the pattern to ``path`` as JSON."""
        check_type("path", path, (str, os.PathLike), "a str or path")
        data = {"format": _FORMAT, "version": _FORMAT_VERSION, "pattern": self.pattern,
                "merges": [[first, second, new_id] for (first, second), new_id in self.merges]}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by ``save``; anything else is a ``ValueError``."""
        check_type("path", path, (str, os.PathLike), "a str or path")
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ValueError(f"{path} is not a BPE tokenizer file: not JSON ({error})") \
                    from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a BPE tokenizer file: no \"format\": "
                             f"\"{_FORMAT}\" entry")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"{path} has format version {data.get('version')!r}, this code "
                             f"reads version {_FORMAT_VERSION}")
        merges = data.get("merges")
        if not isinstance(merges, list) or not all(
                isinstance(m, list) and len(m) == 3 for m in merges):
            raise ValueError(f"{path} is corrupt: \"merges\" must be a list of "
                             f"[first, second, new_id] triples")
        pattern = data.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise ValueError(f"{path} is corrupt: \"pattern\" must be a string or null")
        try:
            return cls([((a, b), new_id) for a, b, new_id in merges], pattern=pattern)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path} is corrupt: {error}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BPETokenizer):
            return NotImplemented
        return self.merges == other.merges and self.pattern == other.pattern

    __hash__ = None  # equal by content, so not hashable

    def __repr__(self) -> str:
        pattern = "GPT2_PATTERN" if self.pattern == GPT2_PATTERN else repr(self.pattern)
        return f"BPETokenizer(vocab_size={len(self)}, pattern={pattern})"


def _checked_merges(merges: Iterable[Merge]) -> tuple[Merge, ...]:
    """Merges as ``((first, second), new_id)`` with new ids 256, 257, ... in order, each pair
    made of earlier tokens."""
    check_type("merges", merges, Iterable, "an iterable of ((first, second), new_id)")
    checked = []
    for k, merge in enumerate(merges):
        try:
            (first, second), new_id = merge
        except (TypeError, ValueError):
            raise TypeError(f"merges[{k}] must be ((first, second), new_id), got "
                            f"{merge!r}") from None
        expected = 256 + k
        check_int(f"merges[{k}] new_id", new_id, low=expected)
        if new_id != expected:
            raise ValueError(f"merges[{k}] must create id {expected}, got {new_id}")
        for name, value in (("first", first), ("second", second)):
            check_int(f"merges[{k}] {name}", value, low=0)
            if value >= new_id:
                raise ValueError(f"merges[{k}] {name} is {value}, not an earlier token "
                                 f"(below {new_id})")
        checked.append(((first, second), new_id))
    pairs = [pair for pair, _ in checked]
    if len(set(pairs)) != len(pairs):
        raise ValueError("merges must not repeat a pair")
    return tuple(checked)


def _compile(pattern: str | None) -> regex.Pattern | None:
    if pattern is None:
        return None
    check_type("pattern", pattern, str, "a str (a regular expression) or None")
    try:
        return regex.compile(pattern)
    except regex.error as error:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {error}") \
            from None


def _split(text: str, splitter: regex.Pattern | None) -> list[str]:
    """The pieces of ``text``: the pattern's matches, and the text between them, in order."""
    if splitter is None:
        return [text] if text else []
    pieces, end = [], 0
    for match in splitter.finditer(text):
        if match.start() > end:
            pieces.append(text[end:match.start()])
        if match.end() > match.start():
            pieces.append(match.group())
        end = max(end, match.end())
    if end < len(text):
        pieces.append(text[end:])
    return pieces
