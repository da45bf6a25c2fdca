"""Time BPE training and encoding on the book's corpus (chapter 12).

    .venv/bin/python benchmarks/bpe.py [--vocab-size 1000] [--baseline-bytes 10000]

Prints, with and without GPT-2's split pattern: the time to train a ``vocab_size`` vocabulary
(incremental pair counts, what ``BPETokenizer.train`` uses), the time to encode the whole corpus,
and the compression in bytes per token. Then the speed-up of the incremental training over the
baseline that recounts every pair after every merge, both run on the same prefix of the corpus
(the baseline is too slow for the whole of it), after checking that the two learn the same merges.
Targets (issue 13): training <= 10 s and encoding <= 2 s on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from minitransformer.bpe import (
    GPT2_PATTERN,
    BPETokenizer,
    _compile,
    _split,
    train_merges,
    train_merges_incremental,
)

CORPUS = Path(__file__).resolve().parent.parent / "book" / "data" / "corpus.txt"


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def pieces(text: str, pattern: str | None) -> list[bytes]:
    return [piece.encode("utf-8") for piece in _split(text, _compile(pattern))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--baseline-bytes", type=int, default=10_000,
                        help="length of the corpus prefix for the baseline comparison")
    args = parser.parse_args()
    text = CORPUS.read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    print(f"corpus: {CORPUS.name}, {size:,} bytes, {len(text):,} characters")
    print(f"target: training <= 10 s, encoding <= 2 s (vocab_size={args.vocab_size})\n")

    for name, pattern in (("no pattern", None), ("GPT-2 pattern", GPT2_PATTERN)):
        tokenizer, train_s = timed(BPETokenizer.train, text, args.vocab_size, pattern=pattern)
        ids, encode_s = timed(tokenizer.encode, text)
        assert tokenizer.decode(ids) == text
        print(f"{name:>13}: train {train_s:6.2f} s ({len(tokenizer)} tokens), "
              f"encode {encode_s:5.2f} s, {size / len(ids):.2f} bytes per token "
              f"({len(ids):,} tokens)")

    prefix = text.encode("utf-8")[:args.baseline_bytes].decode("utf-8", errors="ignore")
    num_merges = args.vocab_size - 256
    print(f"\nincremental vs. recount-every-merge baseline, first {len(prefix):,} characters "
          f"of the corpus, up to {num_merges} merges:")
    for name, pattern in (("no pattern", None), ("GPT-2 pattern", GPT2_PATTERN)):
        data = pieces(prefix, pattern)
        slow, slow_s = timed(train_merges, data, num_merges)
        fast, fast_s = timed(train_merges_incremental, data, num_merges)
        same = "same merges" if slow == fast else "DIFFERENT MERGES"
        print(f"{name:>13}: baseline {slow_s:6.2f} s, incremental {fast_s:5.2f} s, "
              f"{slow_s / fast_s:5.1f}x faster, {same} ({len(fast)} merges)")


if __name__ == "__main__":
    main()
