"""How long does chapter 10's encoder-decoder take to learn to translate? (chapter 10)

Run from the repository root:
    .venv/bin/python benchmarks/train_seq2seq.py [--threads 1] [--seed 0]

It trains the chapter's model with the chapter's recipe (the same corpus, sizes, steps and
learning rate as book/10_cross_attention.ipynb), times the training alone, then translates the
held-out sentences greedily and prints the exact-match accuracy (every word right, in the right
order, and the translation stops where it should). Targets: exact match >= 95% after at most
2 minutes of training on 2 CPU cores. It uses one thread by default, as the chapter does: the
matrices are small, and on a shared 2-core machine under load 4-7, two threads took 680 s for the
300 steps that one thread did in 23 s. Timings on a busy machine mean little: the load average is
printed first.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from minitransformer import Seq2Seq, Seq2SeqConfig, beam_search, exact_match, train
from minitransformer.data import (
    translation_batch,
    translation_batches,
    translation_splits,
    translation_vocabularies,
)

# The chapter's recipe.
NUM_TRAIN, NUM_VAL = 20_000, 500
CONTEXT_LENGTH, BATCH_SIZE = 16, 64
SIZES = {"num_layers": 2, "num_heads": 4, "d_model": 64, "d_ff": 128}
STEPS, LR = 300, 3e-3
TARGET_ACCURACY, TARGET_SECONDS = 0.95, 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average (1, 5, 15 min): {os.getloadavg()}; threads: {args.threads}")

    train_pairs, val_pairs = translation_splits(NUM_TRAIN, NUM_VAL, seed=0)
    src_vocab, tgt_vocab = translation_vocabularies()
    torch.manual_seed(args.seed)
    model = Seq2Seq(Seq2SeqConfig(len(src_vocab), len(tgt_vocab), CONTEXT_LENGTH, **SIZES))
    batches = translation_batches(train_pairs, src_vocab, tgt_vocab, batch_size=BATCH_SIZE,
                                  seed=args.seed)

    start = time.perf_counter()
    history = train(model, batches, steps=STEPS, lr=LR, eval_every=50, progress=False)
    seconds = time.perf_counter() - start

    src, _, targets = translation_batch(val_pairs, src_vocab, tgt_vocab)
    start = time.perf_counter()
    greedy = exact_match(model.translate(src, CONTEXT_LENGTH - 1), targets)
    translate_seconds = time.perf_counter() - start
    beam = exact_match(beam_search(model, src, beam_size=4, max_new_tokens=CONTEXT_LENGTH - 1),
                       targets)

    print(f"training: {STEPS} steps of {BATCH_SIZE} pairs in {seconds:.1f} s "
          f"({1000 * seconds / STEPS:.0f} ms/step); loss {history.train_losses[0]:.3f} -> "
          f"{history.train_losses[-1]:.4f}")
    print(f"exact match on {NUM_VAL} held-out sentences: greedy {greedy:.1%}, beam 4 {beam:.1%} "
          f"(translating them greedily took {translate_seconds:.2f} s)")
    print(f"exact match >= {TARGET_ACCURACY:.0%}: {greedy >= TARGET_ACCURACY}; "
          f"training <= {TARGET_SECONDS:.0f} s: {seconds <= TARGET_SECONDS}")


if __name__ == "__main__":
    main()
