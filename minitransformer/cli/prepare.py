"""``minitransformer prepare``: text files or directories tokenized once into a prepared
directory (``train.bin``, ``val.bin``, the tokenizer, ``index.json``) that ``train --data
DATA_DIR`` reads as memory maps (:mod:`minitransformer.token_files`)."""

from __future__ import annotations

import argparse
import sys
import warnings

from minitransformer.cli.common import CommandLineError
from minitransformer.token_files import LEAST_VOCAB_SIZE, _default_workers, prepare

#: --vocab-size when neither it nor --tokenizer is given: train's default
VOCAB_SIZE = 512


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
