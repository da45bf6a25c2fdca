"""``minitransformer eval``: score a model on a benchmark or a text (chapter 20).

The model is a model directory, a llama.cpp ``.gguf`` file (a Llama: SmolLM2's, or one that
``quantize`` wrote), or a running server's URL, scored through its ``/v1/completions`` with
``echo`` and ``logprobs`` and tokenized by its ``/tokenize``
(:class:`~minitransformer.served.ServedModel`): the same log-likelihoods as in this process.

``hellaswag`` and ``mmlu`` are scored by log-likelihood (``acc``, ``acc_norm``), ``gsm8k`` by
a greedy answer's last number (``exact_match``), ``perplexity`` by the rolling log-likelihood
of a text (``bits_per_byte``, ``perplexity``), all through :mod:`minitransformer.evaluation`.
Without ``--data`` the benchmarks read the subsets committed in this repository
(``tests/data/eval``). A progress bar counts the items on stderr when it is a terminal; ``--json``
also keeps every item's score (``per_item``), so two runs can be compared item by item.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import tqdm

from minitransformer import evaluation as ev
from minitransformer.cli.common import (
    CommandLineError,
    device,
    load_model,
    model_path,
    positive,
    read_json_lines,
    read_text,
    seed,
)
from minitransformer.served import ServedModel
from minitransformer.training import BAR_FORMAT

TASKS = ("hellaswag", "mmlu", "gsm8k", "perplexity")
#: where a GSM8K answer ends: lm-eval's ``until`` (its task's), and an empty line (zero-shot,
#: the model would go on to a new question of its own)
SUBSETS = Path(__file__).resolve().parents[2] / "tests" / "data" / "eval"
FIELDS = {"hellaswag": ("query", "choices", "label"),
          "mmlu": ("subject", "question", "choices", "answer"),
          "gsm8k": ("question", "answer")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``eval``."""
    parser.description = (
        "Score a model (a directory, a .gguf file or a server's URL) as lm-eval does: acc "
        "and acc_norm by log-likelihood (hellaswag, mmlu), exact match of a greedy answer "
        "(gsm8k), bits per byte and perplexity of a text (perplexity), with standard errors.")
    add = parser.add_argument
    add("--model", metavar="DIR|FILE|URL", required=True, help="a model directory written by "
        "train, finetune or dpo, a llama.cpp .gguf file of a Llama (smollm2: the cached "
        "SmolLM2 file), or a running server's URL, http://host:port (minitransformer serve's "
        "/v1/completions with echo and logprobs)")
    add("--served-model", metavar="NAME", help="with a URL: the served model to score "
        "(default: the base model)")
    add("--api-key", metavar="KEY", help="with a URL: the server's API key")
    add("--task", choices=TASKS, required=True, help="hellaswag, mmlu (acc, acc_norm), gsm8k "
        "(exact_match of the last number, zero-shot, greedy) or perplexity (bits_per_byte)")
    add("--data", metavar="FILE", help="JSON lines with the fields of tests/data/eval's "
        "subsets (default: those subsets); for perplexity a UTF-8 text, or JSON lines with "
        "a \"text\" field (one document each)")
    add("--limit", type=positive, help="score only the first N items")
    add("--window", type=positive, help="perplexity: the most tokens read at once (default: "
        "the context length; a server's, less 2)")
    add("--stride", type=positive, help="perplexity: how far each window of the context "
        "moves on (default: the window, as lm-eval)")
    add("--max-new-tokens", type=positive, default=256, help="gsm8k: the longest answer "
        "(default 256)")
    add("--batch-size", type=positive, default=8, help="sequences per forward (default 8)")
    add("--json", metavar="OUT", help="also write the scores as JSON to OUT (a new file), "
        "with each item's under \"per_item\" (log-likelihoods, answers, or a text's "
        "negative log-likelihood)")
    add("--seed", type=seed, default=0, help="the bootstrap interval's seed "
        "(default 0)")
    add("--device", help="default: minitransformer.default_device()")
    add("--no-progress", action="store_true", help="no progress bar (there is none when "
        "stderr is not a terminal)")


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
    """The model and its tokenizer: a model directory, a LoRA adapter directory or a .gguf
    file loaded here (:func:`~minitransformer.cli.common.load_model`), or a server (which
    tokenizes too)."""
    if args.model.startswith(("http://", "https://")):
        try:
            served = ServedModel(args.model, model=args.served_model, api_key=args.api_key)
        except (ConnectionError, ValueError) as exc:
            raise CommandLineError(f"--model {args.model}: {exc}") from None
        return served, served
    if args.served_model is not None or args.api_key is not None:
        raise CommandLineError("--served-model and --api-key are for a server's URL "
                               "(--model http://host:port)")
    return load_model(model_path(args.model), device(args.device))


def _accuracy(name: str, values: list[float], seed: int) -> dict:
    scores = {name: sum(values) / len(values)}
    if len(values) > 1:
        scores[f"{name}_stderr"] = ev.mean_stderr(values)[1]
        scores[f"{name}_95"] = list(ev.bootstrap_interval(values, seed=seed))
    return scores


def _end_of_text(tokenizer) -> int | None:
    """The id of ``<|endoftext|>``: a text's first token is predicted after it, and an
    answer ends at it."""
    if isinstance(tokenizer, ServedModel):
        return tokenizer.token_id("<|endoftext|>")
    return tokenizer.special_tokens.get("<|endoftext|>")


def _in_chunks(score, docs: list, size: int, args: argparse.Namespace) -> list:
    """``score(chunk)`` (a list, one entry per item) over chunks of ``size`` items, with a
    progress bar on stderr when it is a terminal."""
    bar = tqdm.tqdm(total=len(docs), desc=args.task, unit="item", mininterval=0.5,
                    bar_format=BAR_FORMAT, disable=True if args.no_progress else None)
    out = []
    with contextlib.closing(bar):
        for start in range(0, len(docs), size):
            out += score(docs[start:start + size])
            bar.update(min(size, len(docs) - start))
    return out


def _score(model, tokenizer, docs: list[dict], args: argparse.Namespace) -> dict:
    end = _end_of_text(tokenizer)
    if args.task == "perplexity":
        if end is None:
            raise CommandLineError(f"--model {args.model}: its tokenizer has no <|endoftext|> "
                                   f"to predict a text's first token after")
        scores = _in_chunks(lambda chunk: [ev.score_text(
            model, tokenizer, d["text"], prefix_id=end, window=args.window,  # refuses a window
            stride=args.stride, batch_size=args.batch_size) for d in chunk],  # too long
            docs, 1, args)
        total = ev.TextScore.combine(scores)
        result = {"bits_per_byte": total.bits_per_byte, "perplexity": total.perplexity,
                  "tokens": total.num_tokens, "bytes": total.num_bytes}
        if len(scores) > 1:                  # the documents are the independent units
            result["bits_per_byte_stderr"] = ev.bits_per_byte_stderr(scores)[1]
            result["perplexity_stderr"] = ev.perplexity_stderr(scores)[1]
        return {**result, "per_item": [s._asdict() for s in scores]}
    if args.task == "gsm8k":
        prompts = [f"Question: {d['question']}\nAnswer:" for d in docs]
        context = (model.context_length if isinstance(model, ServedModel)
                   else model.config.context_length)
        room = context - max(len(tokenizer.encode(p)) for p in prompts)
        if room < 1:
            raise CommandLineError(f"--model {args.model}: a question fills its context of "
                                   f"{context} tokens, leaving no room for an answer")
        answers = _in_chunks(lambda chunk: ev.generate_answers(
            model, tokenizer, chunk, max_new_tokens=min(args.max_new_tokens, room), eos_id=end,
            stop=ev.GSM8K_STOP, batch_size=args.batch_size), prompts, args.batch_size, args)
        extracted = [ev.extract_last_number(a) for a in answers]
        targets = [ev.gsm8k_target(d) for d in docs]
        found = ev.exact_match(extracted, targets)
        return {**_accuracy("exact_match", found, args.seed), "per_item": [
            {"answer": a, "extracted": x, "target": t, "exact_match": f}
            for a, x, t, f in zip(answers, extracted, targets, found)]}
    item = ev.hellaswag_item if args.task == "hellaswag" else ev.mmlu_item
    scores = _in_chunks(lambda chunk: ev.score_multiple_choice(
        model, tokenizer, chunk, batch_size=args.batch_size), [item(d) for d in docs],
        8 * args.batch_size, args)
    return {**_accuracy("acc", [s.acc for s in scores], args.seed),
            **_accuracy("acc_norm", [s.acc_norm for s in scores], args.seed),
            "per_item": [s._asdict() for s in scores]}


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
        if name == "per_item":              # the JSON's alone
            continue
        if isinstance(value, list):
            value = [round(v, 4) for v in value]
        print(f"{name}: {round(value, 4) if isinstance(value, float) else value}")
    if args.json:
        _write_json(args.json, scores)
    return 0
