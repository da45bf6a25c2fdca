"""How long does chapter 9's GPT take to learn the word after *ran*? (chapter 9)

Run from the repository root:  .venv/bin/python benchmarks/train_gpt.py [--threads 1 2] [--seed 0]
(`make bench` runs it with the other benchmarks.)

It trains the chapter's model with the chapter's recipe (the same data, sizes, steps and learning
rate as book/09_training_a_gpt.ipynb), times the training alone, then measures the next-word
accuracy after *ran* on the held-out sentences, overall and by the far word's distance, next to
the first- and second-order Markov models of chapter 2. It does so once for each thread count
given (the chapter uses 1: the model's matrices are small). Targets: accuracy >= 99% after at
most 60 s of training on a 2-core CPU. Timings on a busy machine mean little: the load average
is printed before each run.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from minitransformer import GPT, GPTConfig, Vocabulary, second_order_matrix, train
from minitransformer import transition_matrix
from minitransformer.data import (
    EOS,
    command_splits,
    cue_batch,
    random_batches,
    token_stream,
    window_batches,
)

# The chapter's recipe.
NUM_TRAIN, NUM_VAL = 4000, 500
CONTEXT_LENGTH, BATCH_SIZE = 32, 32
SIZES = dict(num_layers=2, num_heads=4, d_model=64)
STEPS, LR = 400, 3e-3
TARGET_ACCURACY, TARGET_SECONDS = 0.99, 60.0


def markov_accuracy(train_sentences: list[str], val_sentences: list[str],
                    vocab: Vocabulary) -> tuple[float, float]:
    """Next-word accuracy after *ran* of the first- and second-order models (argmax of a row)."""
    n = len(vocab)
    first = transition_matrix(train_sentences, vocab)
    second = second_order_matrix(train_sentences, vocab)
    right = np.zeros(2)
    for sentence in val_sentences:
        ids = vocab.encode(sentence)
        ran = ids.index(vocab.index("ran"))
        guesses = (first[ids[ran]].argmax(), second[ids[ran - 1] * n + ids[ran]].argmax())
        right += [guess == ids[ran + 1] for guess in guesses]
    return tuple(right / len(val_sentences))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for threads in args.threads:
        run(threads, args.seed)


def run(threads: int, seed: int) -> None:
    torch.set_num_threads(threads)
    print(f"load average (1, 5, 15 min): {os.getloadavg()}; threads: {threads}")
    train_sentences, val_sentences = command_splits(NUM_TRAIN, NUM_VAL, seed=0)
    vocab = Vocabulary.from_sentences(train_sentences + val_sentences, specials=(EOS,))
    stream = token_stream(train_sentences, vocab)
    val = window_batches(token_stream(val_sentences, vocab), batch_size=64,
                         context_length=CONTEXT_LENGTH)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(len(vocab), CONTEXT_LENGTH, **SIZES))
    batches = random_batches(stream, batch_size=BATCH_SIZE, context_length=CONTEXT_LENGTH,
                             generator=torch.Generator().manual_seed(seed))

    start = time.perf_counter()
    history = train(model, batches, steps=STEPS, lr=LR, val_batches=val, eval_every=20,
                    progress=False)
    seconds = time.perf_counter() - start

    idx, position, cue, distance = cue_batch(val_sentences, vocab)
    with torch.no_grad():
        logits, _ = model(idx)
    right = logits[torch.arange(len(cue)), position].argmax(-1) == cue
    accuracy = right.float().mean().item()
    first, second = markov_accuracy(train_sentences, val_sentences, vocab)

    print(f"  {STEPS} steps in {seconds:.1f} s ({1000 * seconds / STEPS:.1f} ms per step, "
          f"validation every 20 steps included); final validation loss "
          f"{history.val_losses[-1]:.3f}")
    print(f"  accuracy after 'ran' on {len(cue)} held-out sentences: first-order Markov "
          f"{first:.1%}, second-order Markov {second:.1%}, GPT {accuracy:.1%}")
    print("  GPT accuracy by distance of the far word: " + ", ".join(
        f"{d}: {right[distance == d].float().mean().item():.0%}"
        for d in distance.unique().tolist()))
    print(f"  accuracy >= {TARGET_ACCURACY:.0%}: {accuracy >= TARGET_ACCURACY}; "
          f"training <= {TARGET_SECONDS:.0f} s: {seconds <= TARGET_SECONDS}")

if __name__ == "__main__":
    main()
