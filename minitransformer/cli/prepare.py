"""``minitransformer prepare``: text files or directories tokenized once into a prepared
directory (``train.bin``, ``val.bin``, the tokenizer, ``index.json``) that ``train --data
DATA_DIR`` reads as memory maps (:mod:`minitransformer.token_files`)."""

from __future__ import annotations

import argparse
import sys
import warnings

from minitransformer.cli.common import CommandLineError, number, positive, seed
from minitransformer.token_files import LEAST_VOCAB_SIZE, _default_workers, prepare

#: --vocab-size when neither it nor --tokenizer is given: train's default
VOCAB_SIZE = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Tokenize UTF-8 text files or directories, as a stream in bounded memory, into "
        "DATA_DIR: train.bin and val.bin (token ids, uint16 when the vocabulary fits, else "
        "uint32), the tokenizer files, and index.json. A run that is killed leaves a directory "
        "that train refuses and prepare may write again.")
    add = parser.add_argument
    add("--data", metavar="PATH", nargs="+", required=True, help="UTF-8 text files, or "
        "directories read recursively in name order")
    add("--out", metavar="DATA_DIR", required=True, help="the directory to write (new or "
        "empty)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--vocab-size", type=positive, help="learn a BPE tokenizer of this "
                       f"many tokens from a seeded sample of the text (default {VOCAB_SIZE})")
    which.add_argument("--tokenizer", metavar="DIR", help="reuse a tokenizer: a directory "
                       "with vocab.json and merges.txt (ours, or GPT-2's own)")
    add("--val-fraction", type=number, default=0.1, help="the end of the text held out for "
        "the validation loss (default 0.1)")
    add("--workers", type=positive, help="encoding processes (default: the cores)")
    add("--seed", type=seed, default=0, help="seeds the tokenizer's sample (default 0)")
    add("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    vocab_size = args.vocab_size
    if vocab_size is None and args.tokenizer is None:
        vocab_size = VOCAB_SIZE
    if vocab_size is not None and vocab_size < LEAST_VOCAB_SIZE:
        raise CommandLineError(f"--vocab-size must be at least {LEAST_VOCAB_SIZE} (the 256 "
                               f"byte tokens and the {LEAST_VOCAB_SIZE - 256} chat tokens), "
                               f"got {vocab_size}")
    workers, cores = args.workers, _default_workers()
    if workers is not None and workers > cores:
        print(f"--workers {workers} is more than the {cores} cores here: using {cores}",
              file=sys.stderr)
        workers = cores
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = prepare(args.data, args.out, vocab_size=vocab_size, tokenizer=args.tokenizer,
                        val_fraction=args.val_fraction, workers=workers, seed=args.seed,
                        progress=not args.no_progress)
    for warning in caught:                   # one line each, not Python's file:line form
        print(f"warning: {warning.message}", file=sys.stderr)
    tokens = index["tokens"]
    print(f"prepared {args.out}: {tokens['train']:,} training and {tokens['val']:,} "
          f"validation tokens ({index['dtype']}) from {index['bytes']:,} bytes of "
          f"{len(index['sources'])} file{'s' * (len(index['sources']) > 1)}, "
          f"{index['vocab_size']} tokens in the vocabulary")
    return 0
