"""Did fine-tuning cost SmolLM2-135M-Instruct general ability? (chapter 20)

Chapter 16 taught SmolLM2 a JSON reply format by LoRA SFT (``sft_smollm2.py``), chapter 17
taught it to stop after one sentence by DPO (``dpo_smollm2.py``). This script trains one model
by each recipe, with its stored default settings (the first seed; DPO's first beta), and
scores the original and each tuned model on the same items and texts:

- MMLU, the committed 200 items of ``tests/data/eval`` in lm-eval's zero-shot format (the
  letters), and the first ``--cloze`` of them in the cloze format (each answer's own text);
- HellaSwag, the first ``--hellaswag`` of its 200 committed items;
- the loss per token, perplexity and bits per byte of chapter 20's held-out text: the last
  tenth of the book's prose (``book/data/corpus.txt``) in 10 pieces.

For each tuned model against the original it stores the paired difference with the package's
error bars (``evaluation.paired_stderr``, ``paired_bootstrap``, ``mcnemar``), the minimum
detectable difference, and how many items the measured difference would need to be significant
(at 95%, and with 80% power): a standard error shrinks as ``1/sqrt(n)``, so ``n`` items become
``n * (z * se / difference)**2``. Usage::

    python experiments/forgetting_smollm2.py            # the stored results (about 30 minutes)
    python experiments/forgetting_smollm2.py --steps 2 --mmlu 4 --cloze 2 --hellaswag 2 \\
        --out /tmp/forgetting.json                      # a smoke test (a minute)

The results go to ``--out`` (default ``experiments/results/forgetting_smollm2.json``), which
chapter 20 reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))   # the package of this checkout

import dpo_smollm2  # noqa: E402
import sft_smollm2  # noqa: E402
from minitransformer import evaluation as ev  # noqa: E402
from smollm2_common import clock, load_smollm2, timing, write_results  # noqa: E402

OUT = HERE / "results" / "forgetting_smollm2.json"
DATA = ROOT / "tests" / "data" / "eval"
CORPUS = ROOT / "book" / "data" / "corpus.txt"
PIECES = 10
Z_95 = ev.minimum_detectable_difference(1.0, power=0.5)        # 1.96
Z_95_POWER_80 = ev.minimum_detectable_difference(1.0)         # 2.80


def read(name: str) -> list[dict]:
    with (DATA / f"{name}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def held_out_pieces() -> list[str]:
    """Chapter 20's held-out text: the last tenth of the book's prose, its paragraphs in
    ``PIECES`` runs of (nearly) equal count, as ``numpy.array_split`` cuts them."""
    text = CORPUS.read_text(encoding="utf-8")
    paragraphs = text[int(len(text) * 0.9):].split("\n\n")[1:]
    size, extra = divmod(len(paragraphs), PIECES)
    pieces, start = [], 0
    for k in range(PIECES):
        end = start + size + (k < extra)
        pieces.append(" ".join(paragraphs[start:end]))
        start = end
    return pieces


def cloze_item(doc: dict) -> tuple[str, list[str], int]:
    """MMLU in the cloze format: the question, then each answer's own text."""
    return (f"Question: {doc['question'].strip()}\nAnswer:", list(doc["choices"]),
            int(doc["answer"]))


def items(args: argparse.Namespace) -> dict[str, list]:
    mmlu = read("mmlu")
    return {"mmlu": [ev.mmlu_item(d) for d in mmlu[:args.mmlu]],
            "mmlu_cloze": [cloze_item(d) for d in mmlu[:args.cloze]],
            "hellaswag": [ev.hellaswag_item(d) for d in read("hellaswag")[:args.hellaswag]]}


def score(model, tokenizer, tasks: dict[str, list], pieces: list[str]) -> dict:
    """Per item: ``acc`` and ``acc_norm`` (0 or 1) of each task; per piece of text: its
    negative log-likelihood, tokens and bytes; and the seconds it took."""
    start = time.perf_counter()
    out: dict = {}
    for task, task_items in tasks.items():
        scores = ev.score_multiple_choice(model, tokenizer, task_items)
        out[task] = {"acc": [int(s.acc) for s in scores],
                     "acc_norm": [int(s.acc_norm) for s in scores]}
    prefix = tokenizer.special_tokens["<|endoftext|>"]
    out["text"] = [list(ev.score_text(model, tokenizer, piece, prefix_id=prefix))
                   for piece in pieces]
    out["text"] = [[round(nll, 4), tokens, size] for nll, tokens, size in out["text"]]
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def items_needed(n: int, difference: float, stderr: float, z: float) -> int | None:
    """The items at which ``difference`` would lie ``z`` standard errors from 0, the error
    shrinking as ``1/sqrt(n)`` (None for no difference)."""
    if difference == 0:
        return None
    return math.ceil(n * (z * stderr / abs(difference)) ** 2)


def compare_items(tuned: list[int], base: list[int]) -> dict:
    """``tuned - base`` on the same items, with the package's paired error bars."""
    diff, se = ev.paired_stderr(tuned, base)
    _, low, high = ev.paired_bootstrap(tuned, base, num_samples=2000, seed=0)
    test = ev.mcnemar(tuned, base)
    n = len(base)
    return {"base": sum(base) / n, "tuned": sum(tuned) / n, "difference": diff,
            "paired_stderr": se, "bootstrap_95": [low, high], "only_tuned": test.only_a,
            "only_base": test.only_b, "mcnemar_p": test.p_value,
            "minimum_detectable": ev.minimum_detectable_difference(se),
            "items_needed_95": items_needed(n, diff, se, Z_95),
            "items_needed_95_power_80": items_needed(n, diff, se, Z_95_POWER_80)}


def compare_text(tuned: list, base: list) -> dict:
    """``tuned - base`` on the same pieces: the loss per token (paired over pieces), the
    perplexity and the bits per byte with their error bars."""
    tuned_scores, base_scores = ([ev.TextScore(*s) for s in run] for run in (tuned, base))
    per_token = [[s.nll / s.num_tokens for s in run] for run in (tuned_scores, base_scores)]
    diff, se = ev.paired_stderr(*per_token)
    out = {"loss_difference": diff, "paired_stderr": se,
           "pieces_worse": sum(t > b for t, b in zip(*per_token)),
           "minimum_detectable": ev.minimum_detectable_difference(se),
           "pieces_needed_95": items_needed(len(base), diff, se, Z_95)}
    for name, scores in (("base", base_scores), ("tuned", tuned_scores)):
        out[name] = {"perplexity": ev.perplexity_stderr(scores),
                     "bits_per_byte": ev.bits_per_byte_stderr(scores)}
    return out


def make_parser() -> argparse.ArgumentParser:
    """The flags; their defaults are the run whose results are stored."""
    sft, dpo = sft_smollm2.make_parser(), dpo_smollm2.arguments()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps of both recipes (default: each recipe's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", choices=("sft", "dpo"), default=["sft", "dpo"])
    parser.add_argument("--sft-rank", type=int, default=sft.get_default("ranks")[0])
    parser.add_argument("--dpo-beta", type=float, default=dpo.get_default("betas")[0])
    parser.add_argument("--mmlu", type=int, default=200, help="MMLU items, lm-eval's format")
    parser.add_argument("--cloze", type=int, default=100, help="MMLU items, cloze format")
    parser.add_argument("--hellaswag", type=int, default=200, help="HellaSwag items")
    parser.add_argument("--pieces", type=int, default=PIECES,
                        help=f"the first pieces of the held-out text scored (2 to {PIECES})")
    parser.add_argument("--dpo-prompts", type=int, default=dpo.get_default("prompts"),
                        help="prompts of the DPO recipe's data, held-out ones included")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def train_sft(base, tokenizer, args: argparse.Namespace) -> tuple:
    """Chapter 16's recipe (``sft_smollm2.train_lora``) on a copy of ``base``."""
    sft = sft_smollm2.make_parser().parse_args([])
    config = {"rank": args.sft_rank, "mask": True, "seed": args.seed,
              "steps": args.steps or sft.steps, "batch_size": sft.batch_size, "lr": sft.lr}
    train_items, _ = sft_smollm2.make_data(sft.train_size, sft.held_out)
    model = copy.deepcopy(base)
    history = sft_smollm2.train_lora(model, tokenizer, train_items, config)
    return model, {**config, "train_size": sft.train_size}, history


def train_dpo(base, tokenizer, args: argparse.Namespace) -> tuple:
    """Chapter 17's recipe (``dpo_smollm2.preference_data`` and ``train_policy``)."""
    dpo = dpo_smollm2.arguments().parse_args([])
    config = {"beta": args.dpo_beta, "seed": args.seed, "steps": args.steps or dpo.steps,
              "batch_size": dpo.batch_size, "lr": dpo.lr, "prompts": args.dpo_prompts,
              "held_out": dpo.held_out}
    _, _, _, train_pairs = dpo_smollm2.preference_data(base, tokenizer, args.dpo_prompts,
                                                       dpo.held_out)
    policy, history = dpo_smollm2.train_policy(
        base, tokenizer, train_pairs, beta=config["beta"], seed=config["seed"],
        steps=config["steps"], lr=config["lr"], batch_size=config["batch_size"])
    policy.eval()
    return policy, {**config, "train_pairs": len(train_pairs)}, history


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not 2 <= args.pieces <= PIECES:
        parser.error(f"--pieces {args.pieces}: a standard error needs 2 to {PIECES} pieces")
    torch.set_num_threads(args.threads)
    start = clock()
    base, tokenizer = load_smollm2()
    base.eval()
    tasks, pieces = items(args), held_out_pieces()[:args.pieces]
    scores = {"original": score(base, tokenizer, tasks, pieces)}
    print(f"original scored in {scores['original']['seconds']:.0f} s", flush=True)
    recipes, comparisons = {}, {}
    for name in args.models:
        began = time.perf_counter()
        model, config, history = (train_sft if name == "sft" else train_dpo)(
            base, tokenizer, args)
        config["train_seconds"] = round(time.perf_counter() - began, 1)
        config["losses"] = [round(x, 4) for x in history.train_losses]
        recipes[name] = config
        scores[name] = score(model, tokenizer, tasks, pieces)
        del model
        comparisons[name] = {
            f"{task}/{metric}": compare_items(scores[name][task][metric],
                                              scores["original"][task][metric])
            for task in tasks if tasks[task] for metric in ("acc", "acc_norm")}
        comparisons[name]["text"] = compare_text(scores[name]["text"],
                                                 scores["original"]["text"])
        text = comparisons[name]["text"]
        print(f"{name}: trained in {config['train_seconds']:.0f} s, scored in "
              f"{scores[name]['seconds']:.0f} s; MMLU acc "
              f"{comparisons[name]['mmlu/acc']['difference']:+.3f}, loss per token "
              f"{text['loss_difference']:+.4f} ± {text['paired_stderr']:.4f}", flush=True)
    results = {
        "script": "experiments/forgetting_smollm2.py",
        "command": " ".join(["python experiments/forgetting_smollm2.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "settings": {key: (str(value) if isinstance(value, Path) else value)
                     for key, value in vars(args).items() if key != "out"},
        "items": {task: len(task_items) for task, task_items in tasks.items()},
        "pieces": len(pieces),
        "recipes": recipes, "scores": scores, "comparisons": comparisons,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {args.threads} thread(s)",
        **timing(start),
    }
    write_results(args.out, results)
    print(f"wrote {args.out} in {results['seconds']:.0f} s, load average "
          f"{results['load_average']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
