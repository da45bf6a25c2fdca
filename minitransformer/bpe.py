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

GPT-2's own files (``vocab.json``, ``merges.txt``; chapter 13) name tokens by their bytes written
with ``bytes_to_unicode`` and number them in their own order. ``BPETokenizer.from_pretrained``
reads them into the chapter's ids (0..255 the bytes, 256 + k merge k) plus a table ``file_ids``
from those ids to the file's; ``save_pretrained`` writes them back.

A real model's tokenizer comes the same way from a GGUF file's metadata
(``BPETokenizer.from_gguf``; llama.cpp's key names), with the split its pre-tokenizer name
gives (``PRE_TOKENIZERS``: SmolLM2's ``"smollm"`` is ``SMOLLM_PATTERN``), its bos, eos and pad
tokens and its Jinja chat template (``minitransformer.chat`` renders it).

This module imports nothing else of the package but the shared argument checks, the chat
format (``chat``) and, in ``from_gguf`` only, the GGUF reader.
"""

from __future__ import annotations

import heapq
import json
import os
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

import regex

from minitransformer import chat
from minitransformer._checks import check_int, check_type

# GPT-2's split pattern (Radford et al. 2019): contractions, letters, digits, other symbols,
# whitespace. \p{L} and \p{N} are Unicode classes that the standard ``re`` module rejects.
GPT2_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")
# SmolLM's (and StarCoder's) split: every number character (\p{N}) is a piece of its own, then
# GPT-2's pattern splits the text between them. llama.cpp applies the two expressions one
# after the other (its pre-tokenizer "smollm"); the tokenizers library does the same with
# Digits(individual_digits=True) before ByteLevel. In one expression, whitespace just before
# a number character counts as whitespace at the end of a piece: ``(?![^\s\p{N}])`` where
# GPT-2 has ``(?!\S)``.
SMOLLM_PATTERN = (r"""\p{N}|'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?[^\s\p{L}\p{N}]+"""
                  r"""|\s+(?![^\s\p{N}])|\s+""")
#: llama.cpp's pre-tokenizer names (GGUF ``tokenizer.ggml.pre``) whose split is one of these.
PRE_TOKENIZERS = {"gpt2": GPT2_PATTERN, "smollm": SMOLLM_PATTERN, "starcoder": SMOLLM_PATTERN}
_PATTERN_NAMES = {GPT2_PATTERN: "GPT2_PATTERN", SMOLLM_PATTERN: "SMOLLM_PATTERN"}

Pair = tuple[int, int]
Merge = tuple[Pair, int]

_FORMAT = "minitransformer.bpe"
_FORMAT_VERSIONS = (1, 2, 3)  # 2 adds special tokens and file ids, 3 missing bytes (null file
#                              ids), roles and a chat template; each tokenizer writes the least
_CACHE_LIMIT = 100_000
VOCAB_FILE, MERGES_FILE, CONFIG_FILE = "vocab.json", "merges.txt", "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"  # the tokenizers library's one-file format (transformers 5)
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 writes a chat template
END_OF_TEXT = "<|endoftext|>"  # GPT-2's tokenizer class makes it bos, eos and unk by default


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
    """A byte-level BPE tokenizer: 256 byte tokens, then one token per merge, then the special
    tokens.

    Build one with ``train``, from a merge table (``BPETokenizer(merges, pattern=...)``),
    with ``load``, or from GPT-2's files with ``from_pretrained``. ``decode(encode(s)) == s``
    for every string ``s``. Decoding ids whose bytes are not valid UTF-8 (a token sequence cut
    in the middle of a character) puts U+FFFD in their place, as GPT-2 does, instead of raising.

    ``merges`` always uses the chapter's ids: 0..255 are the bytes, merge ``k`` makes
    ``256 + k``, special token ``j`` is ``256 + len(merges) + j``. ``encode``, ``decode``,
    ``token_bytes`` and ``special_tokens`` use the ids a model sees: the same ones, or, when
    ``file_ids`` is given (``from_pretrained`` gives GPT-2's order), ``file_ids[i]`` for the
    chapter's id ``i``.

    A real vocabulary may lack some bytes: SmolLM2's has no token for 21 of them (0x04, 0x06,
    0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2, 0xf5-0xff; most cannot occur in UTF-8 at
    all). ``file_ids[b]`` is then ``None`` for such a byte ``b``, and ``missing_bytes`` lists
    them. ``encode`` drops them from the text before merging, as transformers and the
    tokenizers library do, and warns (a ``UserWarning`` naming each byte). So for SmolLM2
    ``decode(encode(s))`` is ``s`` without the control characters U+0004, U+0006, U+0013,
    U+0014, U+0016 and U+001D, and with each character of U+40000 to U+BFFFF (unassigned
    planes, whose first byte is 0xf1 or 0xf2) turned into three U+FFFD: its other three bytes
    have tokens but no longer make a character. Every other string comes back whole.

    The chat side (``minitransformer.chat``) reads ``bos_token``, ``eos_token``, ``pad_token``
    and ``unk_token`` (names of special tokens, or ``None``) and ``chat_template`` (a Jinja
    template, as transformers' ``tokenizer_config.json`` holds it). Left unset, a role is what
    ``save_pretrained`` writes for it (GPT-2's ``<|endoftext|>`` as bos, eos and unk when it is
    a special token; ``<|end|>`` and ``<|pad|>`` as eos and pad for a tokenizer holding
    ``chat.CHAT_TOKENS``), and the chat template of a tokenizer holding ``chat.CHAT_TOKENS`` is
    the course's own (``chat.jinja_chat_template``).
    """

    def __init__(self, merges: Iterable[Merge] = (), *, pattern: str | None = None,
                 special_tokens: Iterable[str] = (),
                 file_ids: Sequence[int | None] | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, unk_token: str | None = None,
                 chat_template: str | None = None) -> None:
        self.merges: tuple[Merge, ...] = _checked_merges(merges)
        self.pattern = pattern
        self._splitter = _compile(pattern)
        self._ranks = {pair: new_id for pair, new_id in self.merges}
        self._bytes = [bytes([b]) for b in range(256)]
        for (first, second), _ in self.merges:
            self._bytes.append(self._bytes[first] + self._bytes[second])
        specials = _checked_special_tokens(special_tokens)
        self._bytes.extend(s.encode("utf-8") for s in specials)
        self.file_ids = _checked_file_ids(file_ids, len(self._bytes))
        to_file = self.file_ids or range(len(self._bytes))
        #: the bytes that the vocabulary has no token for (dropped by ``encode``)
        self.missing_bytes = bytes(b for b in range(256) if to_file[b] is None)
        missing = set(self.missing_bytes)
        for (first, second), new_id in self.merges:
            if first in missing or second in missing:
                raise ValueError(f"merge {new_id - 256} joins byte "
                                 f"{min(first, second):#04x}, which has no file id")
        first_special = 256 + len(self.merges)
        self.special_tokens: dict[str, int] = {
            s: to_file[first_special + j] for j, s in enumerate(specials)}
        self._special_splitter = None if not specials else regex.compile(
            "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)))
        self._token_bytes = [b""] * (len(self._bytes) - len(self.missing_bytes))
        for i, b in enumerate(self._bytes):  # by the ids a model sees
            if to_file[i] is not None:
                self._token_bytes[to_file[i]] = b
        # Only what differs from the defaults is kept, so that equal tokenizers compare equal
        # however they were made (save_pretrained writes the defaults out).
        defaults = _default_roles(self.special_tokens)
        self._roles: dict[str, str] = {}
        for role, name in (("bos_token", bos_token), ("eos_token", eos_token),
                           ("pad_token", pad_token), ("unk_token", unk_token)):
            if name is not None:
                check_type(role, name, str, "a str (a special token) or None")
                if name not in self.special_tokens:
                    raise ValueError(f"{role} {name!r} is not one of the special tokens "
                                     f"{_short_list(self.special_tokens)}")
                if name != defaults[role]:
                    self._roles[role] = name
        self._chat_template = None
        if chat_template is not None:
            check_type("chat_template", chat_template, str, "a str (a Jinja template) or None")
            if chat_template != self.chat_template:
                self._chat_template = chat_template
        self._cache: dict[str, list[int]] = {}

    # ----- what the chat format reads ----------------------------------------------------------

    @property
    def bos_token(self) -> str | None:
        """The beginning-of-sequence token's name, or ``None``."""
        return self._role("bos_token")

    @property
    def eos_token(self) -> str | None:
        """The end-of-sequence token's name (a chat model's end of turn), or ``None``."""
        return self._role("eos_token")

    @property
    def pad_token(self) -> str | None:
        """The padding token's name, or ``None``."""
        return self._role("pad_token")

    @property
    def unk_token(self) -> str | None:
        """The unknown token's name (transformers' ``unk_token``; ``encode`` never writes it),
        or ``None``."""
        return self._role("unk_token")

    def _role(self, role: str) -> str | None:
        return self._roles.get(role, _default_roles(self.special_tokens)[role])

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template, a str. It is the one given, else the course's own
        for a tokenizer that holds ``chat.CHAT_TOKENS``, else ``None``."""
        if self._chat_template is not None:
            return self._chat_template
        if chat.has_chat_tokens(self.special_tokens):
            return chat.jinja_chat_template(list(self.special_tokens))
        return None

    @classmethod
    def train(cls, text: str, vocab_size: int, *, pattern: str | None = None,
              special_tokens: Iterable[str] = ()) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text`` (fewer if no
        pair repeats). The special tokens' text in ``text`` is left out of the pieces.

        Raises ``TypeError`` for a non-string text or pattern or a non-int size, and
        ``ValueError`` for a ``vocab_size`` too small for the bytes and special tokens, a
        pattern that does not compile, or pieces too short to hold any pair to merge.
        """
        check_type("text", text, str, "a str")
        specials = _checked_special_tokens(special_tokens)
        check_int("vocab_size", vocab_size, low=256 + len(specials))
        splitter = _compile(pattern)
        pieces = [piece.encode("utf-8")
                  for part, special in _split_special(text, specials) if not special
                  for piece in _split(part, splitter)]
        num_merges = vocab_size - 256 - len(specials)
        if num_merges and not any(len(piece) > 1 for piece in pieces):
            raise ValueError(f"no pair to merge: {_why_no_pairs(text, pattern)}, so none of "
                             f"the {num_merges} merges that vocab_size={vocab_size} asks for "
                             f"can be learned")
        merges = train_merges_incremental(pieces, num_merges)
        return cls(merges, pattern=pattern, special_tokens=specials)

    def __len__(self) -> int:
        """The vocabulary size: 256 bytes (less ``missing_bytes``), one token per merge, the
        special tokens."""
        return len(self._token_bytes)

    def encode(self, text: str, *, split_special_tokens: bool = False) -> list[int]:
        """The token ids of ``text``.

        A special token's text in ``text`` becomes its id, and the text around it is encoded
        on its own, as transformers does; ``split_special_tokens=True`` encodes it as ordinary
        text (tiktoken's ``encode_ordinary``).
        """
        check_type("text", text, str, "a str")
        check_type("split_special_tokens", split_special_tokens, bool, "a bool")
        if split_special_tokens or self._special_splitter is None:
            return self._encode_ordinary(text)
        ids = []
        for part, special in _split_special(text, self.special_tokens, self._special_splitter):
            ids.extend([self.special_tokens[part]] if special else self._encode_ordinary(part))
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        if self.missing_bytes:
            self._warn_missing_bytes(text)
        if self._splitter is None:
            return self._to_file(_encode_by_rank(self._piece_bytes(text), self._ranks))
        # A piece's ids do not depend on its neighbours: frequent pieces (words, spaces) are
        # encoded once and looked up, keyed by the str itself (no UTF-8 encoding per piece).
        ids: list[int] = []
        extend, cache = ids.extend, self._cache
        for piece in _split(text, self._splitter):
            cached = cache.get(piece)
            if cached is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cached = cache[piece] = self._to_file(
                    _encode_by_rank(self._piece_bytes(piece), self._ranks))
            extend(cached)
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """``encode(text)`` and, for each id, the ``(start, end)`` characters of ``text`` its
        token stands for (transformers' ``return_offsets_mapping``). A token that holds part
        of a character's bytes spans the whole character; a special token spans its text."""
        check_type("text", text, str, "a str")
        parts = ([(text, False)] if self._special_splitter is None
                 else _split_special(text, self.special_tokens, self._special_splitter))
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        position = 0
        for part, special in parts:
            if special:
                ids.append(self.special_tokens[part])
                offsets.append((position, position + len(part)))
                position += len(part)
                continue
            if self.missing_bytes:
                self._warn_missing_bytes(part)
            for piece in _split(part, self._splitter):
                # the character that each byte kept for merging belongs to
                owner = [k for k, c in enumerate(piece) for _ in self._piece_bytes(c)]
                piece_ids = self._to_file(_encode_by_rank(self._piece_bytes(piece), self._ranks))
                b = 0
                for i in piece_ids:
                    n = len(self._token_bytes[i])
                    offsets.append((position + owner[b], position + owner[b + n - 1] + 1))
                    b += n
                ids.extend(piece_ids)
                position += len(piece)
        return ids, offsets

    def _piece_bytes(self, piece: str) -> list[int]:
        """The bytes of a piece, less those the vocabulary has no token for."""
        data = piece.encode("utf-8")
        return list(data.translate(None, self.missing_bytes) if self.missing_bytes else data)

    def _warn_missing_bytes(self, text: str) -> None:
        data = text.encode("utf-8")
        if len(data.translate(None, self.missing_bytes)) != len(data):
            found = ", ".join(f"{b:#04x}" for b in sorted(set(data) & set(self.missing_bytes)))
            warnings.warn(f"the vocabulary has no token for the byte(s) {found} of the text; "
                          f"encode drops them, as transformers does", UserWarning, stacklevel=4)

    def _to_file(self, ids: list[int]) -> list[int]:
        return ids if self.file_ids is None else [self.file_ids[i] for i in ids]

    def encode_iterable(self, lines: Iterable[str]) -> Iterator[int]:
        """The ids of the text ``"".join(lines)``, one at a time: the same ids as ``encode`` of
        the whole text, special tokens included, for an open text file or any iterable of str.

        Text is encoded as soon as no later text can change its pieces: up to the last special
        token, and, with ``GPT2_PATTERN`` or ``SMOLLM_PATTERN``, up to the last place where
        a space follows a non-space (no piece of those patterns holds a non-space followed by
        a space). So the
        memory held is about the longest stretch without such a place, a line for ordinary
        text. With another pattern, or none, it is the longest stretch between special tokens.

        Raises ``TypeError`` (when iterated) for an item that is not a str.
        """
        if isinstance(lines, (bytes, bytearray)) or not isinstance(lines, Iterable):
            raise TypeError(f"lines must be an iterable of str (an open text file), got "
                            f"{type(lines).__name__}")
        return self._encode_stream(lines)

    def _encode_stream(self, lines: Iterable[str]) -> Iterator[int]:
        parts: list[str] = []
        size, next_try = 0, _STREAM_CHUNK
        for k, line in enumerate(lines):
            if not isinstance(line, str):
                raise TypeError(f"lines[{k}] must be a str, got {type(line).__name__} (open "
                                f"the file in text mode)")
            parts.append(line)
            size += len(line)
            if size < next_try:
                continue
            text = "".join(parts)
            cut = stream_cut(text, self)
            if cut:
                yield from self.encode(text[:cut])
                text = text[cut:]
            parts, size = [text], len(text)
            next_try = size + max(_STREAM_CHUNK, size if not cut else 0)  # grow, not retry
        yield from self.encode("".join(parts))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a list of ids; ids outside ``[0, len(self))`` are a ``ValueError``."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The raw bytes of a list of ids."""
        check_type("ids", ids, (list, tuple), "a list of ints (use .tolist() on a tensor)")
        table = self._token_bytes
        for k, i in enumerate(ids):
            check_int(f"ids[{k}]", i, low=0)
            if i >= len(table):
                raise ValueError(f"ids[{k}] is {i}, outside the vocabulary [0, {len(table)})")
        return b"".join(table[i] for i in ids)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, e.g. ``b' the'``."""
        check_int("token_id", token_id, low=0)
        if token_id >= len(self._token_bytes):
            raise ValueError(f"token_id is {token_id}, outside the vocabulary "
                             f"[0, {len(self._token_bytes)})")
        return self._token_bytes[token_id]

    def save(self, path: str | os.PathLike) -> None:
        """Write the merges, the pattern, the special tokens and the file ids to ``path`` as
        JSON."""
        check_type("path", path, (str, os.PathLike), "a str or path")
        specials = list(self.special_tokens)
        version = (3 if self.missing_bytes or self._roles or self._chat_template is not None
                   else 2 if specials or self.file_ids else 1)
        data = {"format": _FORMAT, "version": version, "pattern": self.pattern,
                "merges": [[first, second, new_id] for (first, second), new_id in self.merges]}
        if version >= 2:
            data.update(special_tokens=specials, file_ids=self.file_ids)
        if version == 3:
            data.update(roles=self._roles, chat_template=self._chat_template)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by ``save``; anything else is a ``ValueError``."""
        check_type("path", path, (str, os.PathLike), "a str or path")
        data = _read_json(path, "a BPE tokenizer file")
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a BPE tokenizer file: no \"format\": "
                             f"\"{_FORMAT}\" entry")
        version = data.get("version")
        if type(version) is not int or version not in _FORMAT_VERSIONS:
            raise ValueError(f"{path} has format version {version!r}, this code reads versions "
                             f"{', '.join(map(str, _FORMAT_VERSIONS))}")
        merges = data.get("merges")
        if not isinstance(merges, list) or not all(
                isinstance(m, list) and len(m) == 3 for m in merges):
            raise ValueError(f"{path} is corrupt: \"merges\" must be a list of "
                             f"[first, second, new_id] triples")
        pattern = data.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise ValueError(f"{path} is corrupt: \"pattern\" must be a string or null")
        specials, file_ids = data.get("special_tokens", []), data.get("file_ids")
        if version == 1 and ("special_tokens" in data or "file_ids" in data):
            raise ValueError(f"{path} is corrupt: version 1 has no special tokens or file ids")
        roles, template = data.get("roles", {}), data.get("chat_template")
        if version < 3 and ("roles" in data or "chat_template" in data):
            raise ValueError(f"{path} is corrupt: version {version} has no roles or chat "
                             f"template")
        if not isinstance(roles, dict) or not set(roles) <= set(_default_roles({})):
            raise ValueError(f"{path} is corrupt: \"roles\" must be an object with keys among "
                             f"{sorted(_default_roles({}))}")
        try:
            return cls([((a, b), new_id) for a, b, new_id in merges], pattern=pattern,
                       special_tokens=specials, file_ids=file_ids, chat_template=template,
                       **roles)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path} is corrupt: {error}") from None

    # ----- GPT-2's files (chapter 13) ---------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a GPT-2 tokenizer from the directory ``path``: ``tokenizer.json`` when it is
        there (the tokenizers library's file, the only one transformers 5 writes), else GPT-2's
        ``vocab.json`` (token name -> id, names written with ``bytes_to_unicode``) and
        ``merges.txt`` (an optional ``#version`` line, then one merge per line, ``first
        second``, earliest first).

        The pattern is ``GPT2_PATTERN``, or ``SMOLLM_PATTERN`` when ``tokenizer.json``'s
        pre-tokenizer is SmolLM's (``Digits`` then ``ByteLevel``). The roles (``bos_token``,
        ``eos_token``, ``pad_token``, ``unk_token``) that name special tokens and the
        ``chat_template`` come from ``tokenizer_config.json`` (or ``chat_template.jinja``).
        A byte without a token is allowed (``missing_bytes``). Every token must be a byte,
        made by a merge, or a declared special token: an added token of ``tokenizer.json``, or
        one that ``tokenizer_config.json`` names (``added_tokens_decoder``, ``bos_token``,
        ...; ``<|endoftext|>``, GPT-2's default, when it names none). The ids are the file's,
        in any order. Splitting text into pieces uses the ``regex`` module's Unicode tables;
        transformers' (Oniguruma) may know fewer characters, so text with characters added to
        Unicode since can split differently.

        Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for
        one that is not GPT-2's format: a merge of a token not in the vocabulary, a token that
        is neither made by the merges nor declared special (transformers would never produce
        it), a ``tokenizer.json`` whose normalizer, pre-tokenizer or model is not GPT-2's.
        """
        check_type("path", path, (str, os.PathLike), "a str or path")
        if not str(os.fspath(path)).strip():
            raise ValueError(f"path is empty ({os.fspath(path)!r}): pass the tokenizer's "
                             f"directory")
        if not os.path.isdir(path):
            kind = "is a file, not" if os.path.exists(path) else "names no"
            raise FileNotFoundError(2, f"{os.fspath(path)!r} {kind} directory (a GPT-2 "
                                    f"tokenizer is a directory holding {TOKENIZER_FILE}, or "
                                    f"{VOCAB_FILE} and {MERGES_FILE})", os.fspath(path))
        declared = _declared_special_tokens(path)
        roles, template = _config_chat(path)
        tokenizer_path = os.path.join(path, TOKENIZER_FILE)
        if os.path.isfile(tokenizer_path):
            vocab, merge_lines, added, pattern = _read_tokenizer_json(tokenizer_path)
            return cls._from_files(vocab, merge_lines, declared | added, tokenizer_path,
                                   tokenizer_path, pattern=pattern, roles=roles,
                                   chat_template=template)
        vocab_path = os.path.join(path, VOCAB_FILE)
        merges_path = os.path.join(path, MERGES_FILE)
        for file in (vocab_path, merges_path):
            if not os.path.isfile(file):
                raise FileNotFoundError(
                    2, f"no {os.path.basename(file)} in {os.fspath(path)!r} (a GPT-2 tokenizer "
                    f"directory holds {TOKENIZER_FILE}, or {VOCAB_FILE} and {MERGES_FILE}; "
                    f"download GPT-2's with "
                    f"huggingface_hub.snapshot_download(\"openai-community/gpt2\"))", file)
        vocab = _read_vocab(vocab_path)
        merge_lines = [(f"{merges_path} line {line_no} ({first} {second})", first, second)
                       for line_no, first, second in _read_merge_lines(merges_path)]
        return cls._from_files(vocab, merge_lines, declared, vocab_path, merges_path,
                               roles=roles, chat_template=template)

    @classmethod
    def _from_files(cls, vocab: dict[str, int], merge_lines: list[tuple[str, str, str]],
                    declared: set[str], vocab_path: str, merges_path: str, *,
                    pattern: str = GPT2_PATTERN, roles: Mapping[str, str] | None = None,
                    chat_template: str | None = None,
                    undeclared: str = f"no file declares it a special token (declare it in "
                                      f"{CONFIG_FILE}'s added_tokens_decoder, or remove it)",
                    ) -> BPETokenizer:
        """The tokenizer of a vocabulary (name -> file id) and its merges ``(where, first,
        second)``; ``declared`` are the names that may be special tokens. A role (``roles``,
        e.g. ``{"eos_token": "<|im_end|>"}``) that names no special token is left out."""
        byte_names = list(bytes_to_unicode().values())   # in byte order
        own = {name: b for b, name in enumerate(byte_names) if name in vocab}  # name -> own id
        merges, merged = [], []
        for where, first, second in merge_lines:
            for name in (first, second, first + second):
                if name not in vocab:
                    raise ValueError(f"{where}: {name!r} is not in {vocab_path}")
            for name in (first, second):
                if name not in own:
                    raise ValueError(f"{where}: {name!r} is made by no earlier line")
            if first + second in own:
                raise ValueError(f"{where}: {first + second!r} is already made by an earlier "
                                 f"line; each token must be made once")
            own[first + second] = 256 + len(merges)
            merges.append(((own[first], own[second]), 256 + len(merges)))
            merged.append(first + second)
        specials = sorted((i, name) for name, i in vocab.items() if name not in own)
        for i, name in specials:
            if name not in declared:
                raise ValueError(f"{vocab_path}: the token {name!r} (id {i}) is neither a byte "
                                 f"nor made by the merges of {merges_path}, and {undeclared}: "
                                 f"transformers would never produce it")
        file_ids = ([vocab.get(name) for name in byte_names] + [vocab[name] for name in merged]
                    + [i for i, _ in specials])
        names = {name for _, name in specials}
        roles = {role: name for role, name in (roles or {}).items() if name in names}
        try:
            return cls(merges, pattern=pattern, special_tokens=[name for _, name in specials],
                       file_ids=file_ids, chat_template=chat_template, **roles)
        except (TypeError, ValueError) as error:
            where = (vocab_path if vocab_path == merges_path
                     else f"{vocab_path} and {merges_path}")
            raise ValueError(f"{where} do not make a tokenizer: {error}") from None

    # ----- llama.cpp's GGUF files --------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> BPETokenizer:
        """The tokenizer stored in a GGUF file's metadata (``minitransformer.gguf.GGUFFile``);
        see :meth:`from_gguf_metadata`. Raises as ``GGUFFile`` does for a missing file or one
        that is not GGUF."""
        from minitransformer.gguf import GGUFFile  # numpy and torch, only when needed
        return cls.from_gguf_metadata(GGUFFile(path).metadata, source=os.fspath(path))

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, object], *,
                           source: str = "the GGUF metadata") -> BPETokenizer:
        """The tokenizer that llama.cpp's metadata keys describe, for a byte-level BPE
        (``tokenizer.ggml.model`` ``"gpt2"``).

        ``tokenizer.ggml.tokens`` are the token names, spelled with ``bytes_to_unicode``, their
        index their id; ``tokenizer.ggml.merges`` the merges (``"first second"``, earliest
        first); the tokens that ``tokenizer.ggml.token_type`` marks control (3) or user-defined
        (4) are the special tokens, matched whole in text as transformers and llama.cpp do.
        ``tokenizer.ggml.pre`` names the split: a name of :data:`PRE_TOKENIZERS` (SmolLM2's
        ``"smollm"`` is ``SMOLLM_PATTERN``, llama.cpp's expressions for it). The bos, eos, pad
        and unknown token ids become the roles when they name special tokens, and
        ``tokenizer.chat_template`` the chat template. Bytes without a token are
        ``missing_bytes`` (see the class).

        Raises ``TypeError`` for metadata that is not a dict and ``ValueError`` naming
        ``source`` and the key for another tokenizer model, an unknown pre-tokenizer, a missing
        or malformed key, or tokens and merges that do not make a tokenizer.
        """
        check_type("metadata", metadata, Mapping, "a dict (GGUFFile(path).metadata)")
        check_type("source", source, str, "a str")

        def get(key: str, kind: type | tuple, what: str, default: object = ...) -> object:
            value = metadata.get(key, default)
            if value is ...:
                raise ValueError(f"{source} has no {key} ({what})")
            if value is not default and (not isinstance(value, kind) or isinstance(value, bool)
                                         and kind is int):
                raise ValueError(f"{source}: {key} must be {what}, got {value!r:.60}")
            return value

        model = get("tokenizer.ggml.model", str, "the tokenizer model's name")
        if model != "gpt2":
            raise ValueError(f"{source}: tokenizer.ggml.model is {model!r}; BPETokenizer reads "
                             f"byte-level BPE ('gpt2') only")
        pre = get("tokenizer.ggml.pre", str, "the pre-tokenizer's name")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"{source}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer this "
                             f"code does not know (it knows {sorted(PRE_TOKENIZERS)})")
        tokens = get("tokenizer.ggml.tokens", list, "a list of token names")
        types = get("tokenizer.ggml.token_type", list, "a list of token types (ints)",
                    [1] * len(tokens))
        merges = get("tokenizer.ggml.merges", list, "a list of merges (\"first second\")")
        if len(types) != len(tokens):
            raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries "
                             f"for {len(tokens)} tokens")
        vocab: dict[str, int] = {}
        for i, name in enumerate(tokens):
            if not isinstance(name, str) or not name:
                raise ValueError(f"{source}: tokenizer.ggml.tokens[{i}] is not a non-empty "
                                 f"string: {name!r:.60}")
            if vocab.setdefault(name, i) != i:
                raise ValueError(f"{source}: tokenizer.ggml.tokens holds {name!r} twice (ids "
                                 f"{vocab[name]} and {i})")
        lines = []
        for k, merge in enumerate(merges):
            pair = merge.split(" ") if isinstance(merge, str) else None
            if pair is None or len(pair) != 2 or not all(pair):
                raise ValueError(f"{source}: tokenizer.ggml.merges[{k}] is not two tokens "
                                 f"separated by one space: {merge!r:.60}")
            lines.append((f"{source} tokenizer.ggml.merges[{k}] ({merge})", *pair))
        declared = {name for name, kind in zip(tokens, types) if kind in (3, 4)}
        roles = {}
        for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                          ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
            i = get(f"tokenizer.ggml.{key}", int, "a token id", None)
            if i is not None:
                if not 0 <= i < len(tokens):
                    raise ValueError(f"{source}: tokenizer.ggml.{key} is {i}, outside the "
                                     f"{len(tokens)} tokens")
                roles[role] = tokens[i]
        template = get("tokenizer.chat_template", str, "a Jinja template", None)
        where = f"{source} tokenizer.ggml.tokens"
        return cls._from_files(
            vocab, lines, declared, where, f"{source} tokenizer.ggml.merges",
            pattern=PRE_TOKENIZERS[pre], roles=roles, chat_template=template,
            undeclared="tokenizer.ggml.token_type marks it neither control (3) nor "
                       "user-defined (4)")

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write GPT-2's files to the directory ``path`` (created if needed): ``vocab.json``,
        ``merges.txt``, the same vocabulary and merges as the tokenizers library's
        ``tokenizer.json`` (what transformers 5 reads first), and the ``tokenizer_config.json``
        that
        ``transformers.AutoTokenizer.from_pretrained(path)`` reads, declaring this tokenizer's
        special tokens and no others (``<|endoftext|>``, when there, as GPT-2's end of text).

        The roles (``bos_token``, ...) and the ``chat_template`` go to ``tokenizer_config.json``;
        a byte in ``missing_bytes`` is in neither file, as in the vocabulary read.

        Only a tokenizer with ``pattern=GPT2_PATTERN`` or ``SMOLLM_PATTERN`` can be written:
        transformers splits text with the pattern ``tokenizer.json`` names before merging
        (SmolLM's as ``Digits`` then ``ByteLevel``; ``vocab.json`` and ``merges.txt`` alone mean
        GPT-2's). Raises ``ValueError`` for another pattern and for two tokens that
        ``vocab.json`` would give the same name.
        """
        check_type("path", path, (str, os.PathLike), "a str or path")
        if self.pattern not in (GPT2_PATTERN, SMOLLM_PATTERN):
            shown = "None" if self.pattern is None else repr(self.pattern)
            raise ValueError(f"only a tokenizer with pattern=GPT2_PATTERN or SMOLLM_PATTERN can "
                             f"be written as GPT-2's files (transformers splits text with those "
                             f"patterns); this one has pattern={shown}")
        vocab, pairs = self._file_vocab()
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, VOCAB_FILE), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(os.path.join(path, MERGES_FILE), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            f.writelines(f"{a} {b}\n" for a, b in pairs)
        with open(os.path.join(path, TOKENIZER_FILE), "w", encoding="utf-8") as f:
            json.dump(_tokenizer_json(vocab, pairs, self.special_tokens, self.pattern), f,
                      ensure_ascii=False)
        with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
            config = _transformers_config(self.special_tokens, {
                role: self._role(role) for role in _default_roles({})}, self.pattern)
            if chat.has_chat_tokens(self.special_tokens) and self._chat_template is None:
                config.update(chat.chat_tokenizer_config(self.special_tokens))
            elif self.chat_template is not None:
                config["chat_template"] = self.chat_template
            config.update(self._roles)
            json.dump(config, f, indent=2)
            f.write("\n")

    def _file_vocab(self) -> tuple[dict[str, int], list[tuple[str, str]]]:
        """The vocabulary (token name -> file id, in id order) and the merges as name pairs,
        as GPT-2's files (and GGUF's) spell them."""
        char = bytes_to_unicode()
        names = ["".join(char[b] for b in data) for data in self._bytes[:256 + len(self.merges)]]
        names += list(self.special_tokens)
        ids = self.file_ids or range(len(names))
        vocab: dict[str, int] = {}
        for own_id, name in enumerate(names):
            if ids[own_id] is None:
                continue  # a byte the vocabulary lacks
            if name in vocab:
                raise ValueError(f"tokens {vocab[name]} and {ids[own_id]} would both be named "
                                 f"{name!r} in {VOCAB_FILE}: GPT-2's files cannot hold both")
            vocab[name] = ids[own_id]
        vocab = dict(sorted(vocab.items(), key=lambda item: item[1]))
        return vocab, [(names[a], names[b]) for (a, b), _ in self.merges]

    def gguf_metadata(self) -> dict[str, object]:
        """llama.cpp's ``tokenizer.*`` metadata keys for this tokenizer, what
        :meth:`from_gguf_metadata` reads back into an equal tokenizer: ``tokenizer.ggml.model``
        ``"gpt2"``, ``pre`` (``"gpt2"`` or ``"smollm"``), ``tokens`` (by id), ``token_type`` (1
        normal, 3 control: the special tokens), ``merges``, the bos, eos, pad and unknown ids of
        the roles, ``add_space_prefix`` and ``add_bos_token`` false, and
        ``tokenizer.chat_template`` when there is one.

        Raises ``ValueError`` for a pattern other than GPT-2's or SmolLM's, or a vocabulary
        whose ids are not 0, 1, 2, ... (a missing byte leaves a hole GGUF cannot hold).
        """
        pre = {GPT2_PATTERN: "gpt2", SMOLLM_PATTERN: "smollm"}.get(self.pattern)
        if pre is None:
            raise ValueError("only a tokenizer with pattern=GPT2_PATTERN or SMOLLM_PATTERN can be "
                             "written as GGUF metadata (llama.cpp knows their names)")
        vocab, pairs = self._file_vocab()
        if list(vocab.values()) != list(range(len(vocab))):
            raise ValueError(f"the token ids are not 0 to {len(vocab) - 1} without holes (a byte "
                             f"the vocabulary lacks): GGUF lists tokens by id")
        specials = set(self.special_tokens)
        meta: dict[str, object] = {
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": list(vocab),
            "tokenizer.ggml.token_type": [3 if name in specials else 1 for name in vocab],
            "tokenizer.ggml.merges": [f"{a} {b}" for a, b in pairs]}
        for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                          ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
            if self._role(role) is not None:
                meta[f"tokenizer.ggml.{key}"] = vocab[self._role(role)]
        meta["tokenizer.ggml.add_space_prefix"] = meta["tokenizer.ggml.add_bos_token"] = False
        if self.chat_template is not None:
            meta["tokenizer.chat_template"] = self.chat_template
        return meta

    def apply_chat_template(self, messages: Sequence[dict], *,
                            add_generation_prompt: bool = False) -> list[int]:
        """The ids of a conversation in the chat format (``minitransformer.chat``)."""
        return chat.apply_chat_template(self, messages,
                                        add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = False
                    ) -> tuple[list[int], list[bool]]:
        """The ids of a conversation and its assistant mask (``minitransformer.chat``)."""
        return chat.encode_chat(self, messages, add_generation_prompt=add_generation_prompt)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BPETokenizer):
            return NotImplemented
        return (self.merges == other.merges and self.pattern == other.pattern
                and list(self.special_tokens.items()) == list(other.special_tokens.items())
                and self.file_ids == other.file_ids and self._roles == other._roles
                and self._chat_template == other._chat_template)

    __hash__ = None  # equal by content, so not hashable

    def __repr__(self) -> str:
        pattern = _PATTERN_NAMES.get(self.pattern, repr(self.pattern))
        specials = f", special_tokens={list(self.special_tokens)}" if self.special_tokens else ""
        return f"BPETokenizer(vocab_size={len(self)}, pattern={pattern}{specials})"


def _checked_merges(merges: Iterable[Merge]) -> tuple[Merge, ...]:
    """Merges as ``((first, second), new_id)`` with new ids 256, 257, ... in order, each pair
    made of earlier tokens."""
    check_type("merges", merges, Iterable, "an iterable of ((first, second), new_id)")
    checked = []
    for k, merge in enumerate(merges):
        if not (isinstance(merge, (tuple, list)) and len(merge) == 2
                and isinstance(merge[0], (tuple, list)) and len(merge[0]) == 2):
            raise TypeError(f"merges[{k}] must be ((first, second), new_id), got {merge!r}")
        (first, second), new_id = merge
        expected = 256 + k
        if type(new_id) is not int or new_id != expected:  # plain ints skip the slow check
            check_int(f"merges[{k}] new_id", new_id, low=expected)
            if new_id != expected:
                raise ValueError(f"merges[{k}] must create id {expected}, got {new_id}")
        for name, value in (("first", first), ("second", second)):
            if type(value) is not int or value < 0:
                check_int(f"merges[{k}] {name}", value, low=0)
            if value >= new_id:
                raise ValueError(f"merges[{k}] {name} is {value}, not an earlier token "
                                 f"(below {new_id})")
        checked.append(((first, second), new_id))
    pairs = [pair for pair, _ in checked]
    if len(set(pairs)) != len(pairs):
        raise ValueError("merges must not repeat a pair")
    return tuple(checked)


def _checked_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    if isinstance(special_tokens, (str, bytes)) or not isinstance(special_tokens, Iterable):
        raise TypeError(f"special_tokens must be a list of str, got "
                        f"{type(special_tokens).__name__}")
    specials = list(special_tokens)
    for j, s in enumerate(specials):
        check_type(f"special_tokens[{j}]", s, str, "a str")
        if not s:
            raise ValueError(f"special_tokens[{j}] is empty")
    if len(set(specials)) != len(specials):
        raise ValueError("special_tokens must not repeat a token")
    return specials


def _checked_file_ids(file_ids: Sequence[int | None] | None,
                      size: int) -> tuple[int | None, ...] | None:
    """``file_ids`` as a tuple: ``None`` for a byte (ids 0..255) the vocabulary lacks, and each
    id of ``[0, n)`` once, ``n`` the number of the others; ``None`` for the identity."""
    if file_ids is None:
        return None
    check_type("file_ids", file_ids, (list, tuple), "a list of ints or None")
    if len(file_ids) != size:
        raise ValueError(f"file_ids must give one id per token, {size}, got {len(file_ids)}")
    for k, i in enumerate(file_ids):
        if i is None and k >= 256:
            raise ValueError(f"file_ids[{k}] is None, but only a byte (ids 0..255) may lack a "
                             f"file id")
        if i is not None and type(i) is not int:
            check_int(f"file_ids[{k}]", i, low=0)
    present = [i for i in file_ids if i is not None]
    if sorted(present) != list(range(len(present))):
        raise ValueError(f"file_ids must hold each id of [0, {len(present)}) once")
    file_ids = tuple(None if i is None else int(i) for i in file_ids)
    return None if file_ids == tuple(range(size)) else file_ids


def _default_roles(special_tokens: Mapping[str, int]) -> dict[str, str | None]:
    """The bos, eos, pad and unk tokens of a tokenizer that names none: GPT-2's
    ``<|endoftext|>`` (when it is a special token) as bos, eos and unk, and the chat format's
    end of turn and pad for a tokenizer holding ``chat.CHAT_TOKENS``."""
    end = END_OF_TEXT if END_OF_TEXT in special_tokens else None
    roles = {"bos_token": end, "eos_token": end, "pad_token": None, "unk_token": end}
    if chat.has_chat_tokens(special_tokens):
        roles.update(eos_token=chat.END_OF_TURN, pad_token=chat.PAD)
    return roles


def _short_list(names: Iterable[str], limit: int = 8) -> str:
    names = list(names)
    shown = ", ".join(map(repr, names[:limit]))
    return f"[{shown}{', ...' if len(names) > limit else ''}]"


def _compile(pattern: str | None) -> regex.Pattern | None:
    if pattern is None:
        return None
    check_type("pattern", pattern, str, "a str (a regular expression) or None")
    try:
        return regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as error:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {error}") \
            from None


def _split(text: str, splitter: regex.Pattern | None) -> list[str]:
    """The pieces of ``text``: the pattern's matches, and the text between them, in order."""
    if splitter is None:
        return [text] if text else []
    if not splitter.groups:
        # findall is about twice as fast as the loop below; when its matches add up to the
        # whole text (as GPT2_PATTERN's always do), there is nothing between them
        pieces = splitter.findall(text)
        if sum(map(len, pieces)) == len(text):
            return [piece for piece in pieces if piece] if "" in pieces else pieces
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


def _split_special(text: str, specials: Iterable[str],
                   splitter: regex.Pattern | None = None) -> list[tuple[str, bool]]:
    """``text`` cut around the special tokens' text, longest first: ``(part, is_special)``."""
    if splitter is None:
        specials = sorted(specials, key=len, reverse=True)
        if not specials:
            return [(text, False)]
        splitter = regex.compile("|".join(regex.escape(s) for s in specials))
    parts, end = [], 0
    for match in splitter.finditer(text):
        parts += [(text[end:match.start()], False), (match.group(), True)]
        end = match.end()
    return [*parts, (text[end:], False)]


def _why_no_pairs(text: str, pattern: str | None) -> str:
    if not text:
        return "the text is empty"
    if pattern is None:
        return "the text is a single byte"
    return "the pattern split the text into pieces of one byte each"


_STREAM_CHUNK = 1 << 16   # characters gathered before encode_iterable looks for a cut
_SPACE_AFTER_NON_SPACE = regex.compile(r"(?r)\S\s")   # reverse: finds the last one


def stream_cut(text: str, tokenizer: BPETokenizer) -> int:
    """The largest ``c`` such that ``text[:c]`` and ``text[c:] + more`` encode, for any
    ``more``, to the ids of ``text + more``; 0 if there is none.

    A special token found at a position ``s`` is final once ``text`` holds ``s`` plus the
    longest special token's length (no longer one can start at or before ``s``). Cuts go at the
    final ones' ends and starts and, with ``GPT2_PATTERN`` or ``SMOLLM_PATTERN``, before a
    space that follows a non-space outside them (each alternative of the patterns stops
    there, having looked at most one character ahead).
    """
    longest = max(map(len, tokenizer.special_tokens), default=0)
    limit = len(text) - max(1, longest - 1)    # positions below limit are final
    if limit <= 0:
        return 0
    spans = []
    if tokenizer._special_splitter is not None:
        for match in tokenizer._special_splitter.finditer(text):
            if match.start() >= limit:
                break
            spans.append(match.span())
    cut = max((end if end <= limit else start for start, end in spans), default=0)
    if tokenizer.pattern in (GPT2_PATTERN, SMOLLM_PATTERN):
        endpos = limit + 1
        while endpos > 1:
            match = _SPACE_AFTER_NON_SPACE.search(text, 0, endpos)
            if match is None or match.end() - 1 <= cut:
                break
            c = match.end() - 1
            inside = next((s for s, e in spans if s < c < e), None)
            if inside is None:
                return c
            endpos = inside + 1
    return cut


# ----- GPT-2's file format -----------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, so that a token's bytes can be
    written as a JSON key and a ``merges.txt`` word: the 188 printable bytes (``!`` to ``~``,
    ``¡`` to ``¬``, ``®`` to ``ÿ``) stand for themselves, the other 68 for ``chr(256)``,
    ``chr(257)``, ... in byte order, so a space (byte 32) is ``Ġ`` and a newline ``Ċ``."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    table, others = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + others)
            others += 1
    return table


def _read_json(path: str | os.PathLike, what: str) -> object:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_repeated_keys)
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, too deep, too long
        raise ValueError(f"{path} is not {what}: not JSON ({error})") from None
    except _RepeatedKey as error:
        raise ValueError(f"{path} is not {what}: the key {error.args[0]!r} appears twice") \
            from None


class _RepeatedKey(Exception):
    pass


def _no_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    data = {}
    for key, value in pairs:
        if key in data:
            raise _RepeatedKey(key)
        data[key] = value
    return data


def _read_vocab(path: str) -> dict[str, int]:
    """``vocab.json``: a JSON object from token name to id, the ids 0..N-1 each once."""
    vocab = _read_json(path, "GPT-2's vocab.json")
    if not isinstance(vocab, dict):
        raise ValueError(f"{path} is not GPT-2's vocab.json: not a JSON object")
    return _checked_vocab(vocab, path)


def _checked_vocab(vocab: dict, path: str) -> dict[str, int]:
    for name, i in vocab.items():
        if not name:
            raise ValueError(f"{path}: a token has an empty name")
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"{path}: the id of {name!r} must be an int >= 0, got {i!r}")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{path}: the ids must be 0..{len(vocab) - 1}, each once")
    return vocab


def _special_name(value: object, where: str) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, an object with a
    ``content``, or ``null``."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{where} must be a token (a string or an object with a content), got "
                     f"{value!r:.60}")


def _declared_special_tokens(path: str | os.PathLike) -> set[str]:
    """The tokens ``tokenizer_config.json`` declares special: its ``added_tokens_decoder``,
    ``additional_special_tokens``, ``extra_special_tokens`` and the bos, eos, unk and pad
    tokens, with GPT-2's default ``<|endoftext|>`` for a bos, eos or unk it does not set (and
    when there is no such file)."""
    roles: dict[str, object] = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT,
                                "unk_token": END_OF_TEXT, "pad_token": None}
    config_path = os.path.join(path, CONFIG_FILE)
    listed: list[tuple[str, object]] = []
    if os.path.isfile(config_path):
        config = _read_json(config_path, "a tokenizer_config.json")
        if not isinstance(config, dict):
            raise ValueError(f"{config_path} is not a tokenizer_config.json: not a JSON object")
        roles.update((role, config[role]) for role in roles if role in config)
        for key in ("additional_special_tokens", "extra_special_tokens", "added_tokens_decoder"):
            value = config.get(key) or []
            if isinstance(value, dict):
                value = list(value.values())
            if not isinstance(value, list):
                raise ValueError(f"{config_path}: {key} must be a list or an object, got "
                                 f"{value!r:.60}")
            listed += [(f"{config_path}: an entry of {key}", item) for item in value]
    listed += [(f"{config_path}: {role}", value) for role, value in roles.items()]
    return {name for where, value in listed
            if (name := _special_name(value, where)) is not None}


def _read_tokenizer_json(path: str) -> tuple[dict[str, int], list[tuple[str, str, str]],
                                              set[str], str]:
    """``(vocab, merges, added, pattern)`` of the tokenizers library's ``tokenizer.json`` for a
    GPT-2 style byte-level BPE: the vocabulary with the added tokens (name -> id), the merges
    as ``(where, first, second)``, the added tokens' names, and the split pattern
    (``GPT2_PATTERN``, or ``SMOLLM_PATTERN`` for SmolLM's digits-then-ByteLevel sequence)."""
    data = _read_json(path, "a tokenizers tokenizer.json")
    if isinstance(data, dict) and data.get("format") == _FORMAT:
        raise ValueError(f"{path} is this package's own tokenizer file (BPETokenizer.save), "
                         f"not the tokenizers library's: read it with BPETokenizer.load")
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(f"{path} is not a tokenizers tokenizer.json: no \"model\" object")

    def refuse(why: str) -> ValueError:
        return ValueError(f"{path}: {why}, which GPT-2's byte-level BPE (BPETokenizer) "
                          f"does not do")

    model = data["model"]
    if model.get("type") != "BPE":
        raise refuse(f"the model type is {model.get('type')!r}, not 'BPE'")
    for key, fine in (("dropout", (None,)), ("continuing_subword_prefix", (None, "")),
                      ("end_of_word_suffix", (None, "")), ("ignore_merges", (None, False)),
                      ("byte_fallback", (None, False))):
        if model.get(key) not in fine:
            raise refuse(f"the model's {key} is {model.get(key)!r}")
    if data.get("normalizer") is not None:
        raise refuse(f"it has a normalizer ({_kind(data['normalizer'])})")
    pre = data.get("pre_tokenizer")
    pattern = _pattern_of_pre_tokenizer(pre)
    if pattern is None:
        raise refuse(f"the pre_tokenizer is {_kind(pre)}, not ByteLevel with GPT-2's pattern "
                     f"and add_prefix_space false (alone, or after Digits with "
                     f"individual_digits, as SmolLM's)")
    post = data.get("post_processor")
    if post is not None and post.get("type") != "ByteLevel" and not _adds_nothing(post):
        raise refuse(f"the post_processor ({_kind(post)}) adds tokens around each text")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise ValueError(f"{path} is not a tokenizers tokenizer.json: model.vocab is not an "
                         f"object")
    vocab = dict(vocab)
    added = set()
    for k, token in enumerate(data.get("added_tokens") or []):
        where = f"{path}: added_tokens[{k}]"
        if not (isinstance(token, dict) and isinstance(token.get("content"), str)
                and token["content"] and type(token.get("id")) is int):
            raise ValueError(f"{where} must be an object with a content and an int id")
        for flag in ("lstrip", "rstrip", "single_word"):
            if token.get(flag):
                raise refuse(f"added token {token['content']!r} has {flag} set")
        name = token["content"]
        if vocab.setdefault(name, token["id"]) != token["id"]:
            raise ValueError(f"{where}: {name!r} has id {token['id']}, but {vocab[name]} in "
                             f"model.vocab")
        added.add(name)
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise ValueError(f"{path} is not a tokenizers tokenizer.json: model.merges is not a "
                         f"list")
    lines = []
    for k, merge in enumerate(merges):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(part, str) and part for part in pair)):
            raise ValueError(f"{path}: model.merges[{k}] is not two tokens: {merge!r:.60}")
        lines.append((f"{path} merge {k} ({pair[0]} {pair[1]})", *pair))
    return _checked_vocab(vocab, path), lines, added, pattern


def _byte_level(pre: object) -> bool:
    return (isinstance(pre, dict) and pre.get("type") == "ByteLevel"
            and pre.get("add_prefix_space") is False and pre.get("use_regex", True) is True)


def _pattern_of_pre_tokenizer(pre: object) -> str | None:
    """The pattern of a ``tokenizer.json`` pre-tokenizer: ``GPT2_PATTERN`` for GPT-2's
    ``ByteLevel``, ``SMOLLM_PATTERN`` for ``Digits(individual_digits)`` then ``ByteLevel``;
    ``None`` for any other."""
    if _byte_level(pre):
        return GPT2_PATTERN
    steps = pre.get("pretokenizers") if isinstance(pre, dict) else None
    if (isinstance(steps, list) and pre.get("type") == "Sequence" and len(steps) == 2
            and steps[0] == {"type": "Digits", "individual_digits": True}
            and _byte_level(steps[1])):
        return SMOLLM_PATTERN
    return None


def _pre_tokenizer_json(pattern: str) -> dict:
    """The ``tokenizer.json`` pre-tokenizer that splits as ``pattern`` does."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    if pattern == SMOLLM_PATTERN:
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}
    return byte_level


def _config_chat(path: str | os.PathLike) -> tuple[dict[str, str], str | None]:
    """The roles (``{"eos_token": name, ...}``) and the chat template that the directory's
    ``tokenizer_config.json`` names; the template may also be ``chat_template.jinja``, where
    transformers 5 writes it."""
    config_path = os.path.join(path, CONFIG_FILE)
    config = _read_json(config_path, "a tokenizer_config.json") \
        if os.path.isfile(config_path) else {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a tokenizer_config.json: not a JSON object")
    roles = {role: name for role in _default_roles({})
             if (name := _special_name(config.get(role), f"{config_path}: {role}"))}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    jinja_path = os.path.join(path, CHAT_TEMPLATE_FILE)
    if template is None and os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{config_path}: chat_template must be a string, got "
                         f"{template!r:.60}")
    return roles, template


def _kind(component: object) -> str:
    return repr(component.get("type")) if isinstance(component, dict) else repr(component)


def _adds_nothing(post: object) -> bool:
    """A ``TemplateProcessing`` that puts no token around a text (what transformers 5 writes
    for GPT-2)."""
    return (isinstance(post, dict) and post.get("type") == "TemplateProcessing"
            and all(isinstance(item, dict) and "Sequence" in item
                    for key in ("single", "pair") for item in post.get(key) or []))


def _tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]],
                    special_tokens: dict[str, int], pattern: str = GPT2_PATTERN) -> dict:
    """The tokenizers library's ``tokenizer.json`` of GPT-2's byte-level BPE: its vocabulary,
    merges and special tokens, split as ``pattern`` (GPT-2's or SmolLM's) and decoded as GPT-2
    does."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for s, i in sorted(special_tokens.items(), key=lambda item: item[1])],
        "normalizer": None, "pre_tokenizer": _pre_tokenizer_json(pattern),
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": [list(pair) for pair in merges]},
    }


def _read_merge_lines(path: str) -> list[tuple[int, str, str]]:
    """``(line number, first, second)`` for each merge of ``merges.txt``, earliest first."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not GPT-2's merges.txt: not UTF-8 ({error})") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    merges = []
    for line_no, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if line_no == 1 and line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path} line {line_no} is not two tokens separated by one "
                             f"space: {line!r}")
        merges.append((line_no, *parts))
    return merges


def _transformers_config(special_tokens: dict[str, int], roles: dict[str, str | None],
                         pattern: str = GPT2_PATTERN) -> dict:
    """``tokenizer_config.json`` for transformers: GPT-2's tokenizer class (for GPT-2's
    pattern; the generic class, which keeps ``tokenizer.json``'s pre-tokenizer, for another),
    these roles, and exactly these special tokens (GPT-2's class would otherwise add an
    ``<|endoftext|>``)."""
    return {
        "tokenizer_class": ("GPT2Tokenizer" if pattern == GPT2_PATTERN
                            else "PreTrainedTokenizerFast"),
        "add_prefix_space": False,
        **{role: roles[role] for role in ("bos_token", "eos_token", "unk_token", "pad_token")},
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for s, i in special_tokens.items()},
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
    }
