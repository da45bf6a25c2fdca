"""``minitransformer eval``: score a model directory on a benchmark or a text (chapter 20).

``hellaswag`` and ``mmlu`` are scored by log-likelihood (``acc``, ``acc_norm``), ``gsm8k`` by
a greedy answer's last number (``exact_match``), ``perplexity`` by the rolling log-likelihood
of a text (``bits_per_byte``, ``perplexity``), all through :mod:`minitransformer.evaluation`.
Without ``--data`` the benchmarks read the subsets committed in this repository
(``tests/data/eval``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from minitransformer import evaluation as ev
from minitransformer.cli.common import (
    CommandLineError,
    device,
    model_class,
    positive,
    read_json_lines,
    read_text,
    seed,
)

TASKS = ("hellaswag", "mmlu", "gsm8k", "perplexity")
SUBSETS = Path(__file__).resolve().parents[2] / "tests" / "data" / "eval"
FIELDS = {"hellaswag": ("query", "choices", "label"),
          "mmlu": ("subject", "question", "choices", "answer"),
          "gsm8k": ("question", "answer")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``eval``."""
    parser.description = (
        "Score a model directory as lm-eval does: acc and acc_norm by log-likelihood "
        "(hellaswag, mmlu), exact match of a greedy answer (gsm8k), bits per byte and "
        "perplexity of a text (perplexity), with standard errors.")
    add = parser.add_argument
    add("--model", metavar="DIR", required=True, help="a model directory written by train, "
        "finetune or dpo (config.json, model.safetensors, tokenizer files)")
    add("--task", choices=TASKS, required=True, help="hellaswag, mmlu (acc, acc_norm), gsm8k "
        "(exact_match of the last number, zero-shot, greedy) or perplexity (bits_per_byte)")
    add("--data", metavar="FILE", help="JSON lines with the fields of tests/data/eval's "
        "subsets (default: those subsets); for perplexity a UTF-8 text, or JSON lines with "
        "a \"text\" field (one document each)")
    add("--limit", type=positive, help="score only the first N items")
    add("--stride", type=positive, help="perplexity: how far each window of the context "
        "moves on (default: the context length, as lm-eval)")
    add("--max-new-tokens", type=positive, default=256, help="gsm8k: the longest answer "
        "(default 256)")
    add("--batch-size", type=positive, default=8, help="sequences per forward (default 8)")
    add("--json", metavar="OUT", help="also write the scores as JSON to OUT (a new file)")
    add("--seed", type=seed, default=0, help="the bootstrap interval's seed "
        "(default 0)")
    add("--device", help="default: minitransformer.default_device()")


def _documents(args: argparse.Namespace) -> list[dict]:
    if args.task == "perplexity":
        if args.data is None:
            raise CommandLineError("--task perplexity needs --data: the text to score")
        if not args.data.endswith(".jsonl"):
            return [{"text": read_text(args.data)[0]}]
    path = args.data or str(SUBSETS / f"{args.task}.jsonl")
    if args.data is None and not Path(path).is_file():
        raise CommandLineError(f"--task {args.task} without --data reads {path}, which is "
                               f"not here: give --data")
    fields = FIELDS.get(args.task, ("text",))
    docs = []
    for n, doc in read_json_lines(path)[0]:
        missing = [f for f in fields if not isinstance(doc, dict) or f not in doc]
        if missing:
            raise CommandLineError(f"--data {path}:{n} has no {', '.join(missing)} (a "
                                   f"{args.task} line needs {', '.join(fields)})")
        docs.append(doc)
    if not docs:
        raise CommandLineError(f"--data {path} has no items")
    return docs[:args.limit]


def _load(args: argparse.Namespace):
    from minitransformer.bpe import BPETokenizer

    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise CommandLineError(f"--model {args.model}: not a model directory (no "
                               f"config.json)")
    tokenizer = BPETokenizer.from_pretrained(folder)
    return model_class(folder).from_pretrained(folder, device=device(args.device)), tokenizer


def _accuracy(name: str, values: list[float], seed: int) -> dict:
    scores = {name: sum(values) / len(values)}
    if len(values) > 1:
        scores[f"{name}_stderr"] = ev.mean_stderr(values)[1]
        scores[f"{name}_95"] = list(ev.bootstrap_interval(values, seed=seed))
    return scores


def _score(model, tokenizer, docs: list[dict], args: argparse.Namespace) -> dict:
    end = tokenizer.special_tokens.get("<|endoftext|>")
    if args.task == "perplexity":
        if end is None:
            raise CommandLineError(f"--model {args.model}: its tokenizer has no <|endoftext|> "
                                   f"to predict a text's first token after")
        scores = [ev.score_text(model, tokenizer, d["text"], prefix_id=end,
                                stride=args.stride, batch_size=args.batch_size) for d in docs]
        total = ev.TextScore.combine(scores)
        result = {"bits_per_byte": total.bits_per_byte, "perplexity": total.perplexity,
                  "tokens": total.num_tokens, "bytes": total.num_bytes}
        if len(scores) > 1:                  # the documents are the independent units
            result["bits_per_byte_stderr"] = ev.bits_per_byte_stderr(scores)[1]
            result["perplexity_stderr"] = ev.perplexity_stderr(scores)[1]
        return result
    if args.task == "gsm8k":
        prompts = [f"Question: {d['question']}\nAnswer:" for d in docs]
        room = model.config.context_length - max(len(tokenizer.encode(p)) for p in prompts)
        if room < 1:
            raise CommandLineError(f"--model {args.model}: a question fills its context of "
                                   f"{model.config.context_length} tokens, leaving no room "
                                   f"for an answer")
        answers = ev.generate_answers(model, tokenizer, prompts,
                                      max_new_tokens=min(args.max_new_tokens, room),
                                      eos_id=end, stop=["Question:", "\n\n"],
                                      batch_size=args.batch_size)
        found = ev.exact_match([ev.extract_last_number(a) for a in answers],
                               [ev.gsm8k_target(d) for d in docs])
        return _accuracy("exact_match", found, args.seed)
    item = ev.hellaswag_item if args.task == "hellaswag" else ev.mmlu_item
    scores = ev.score_multiple_choice(model, tokenizer, [item(d) for d in docs],
                                      batch_size=args.batch_size)
    return {**_accuracy("acc", [s.acc for s in scores], args.seed),
            **_accuracy("acc_norm", [s.acc_norm for s in scores], args.seed)}


def _write_json(path: str, scores: dict) -> None:
    out = Path(path)
    if out.exists():
        raise CommandLineError(f"--json {path} exists: give a new file name")
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(scores, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, out)


def run(args: argparse.Namespace) -> int:
    if args.json and Path(args.json).exists():
        raise CommandLineError(f"--json {args.json} exists: give a new file name")
    docs = _documents(args)
    model, tokenizer = _load(args)
    scores = {"task": args.task, "items": len(docs), **_score(model, tokenizer, docs, args)}
    for name, value in scores.items():
        if isinstance(value, list):
            value = [round(v, 4) for v in value]
        print(f"{name}: {round(value, 4) if isinstance(value, float) else value}")
    if args.json:
        _write_json(args.json, scores)
    return 0
