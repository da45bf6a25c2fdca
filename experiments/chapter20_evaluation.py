"""Chapter 20's full run: SmolLM2-135M-Instruct's per-item log-likelihoods on the 200 HellaSwag
and 200 MMLU items of tests/data/eval, stored in experiments/chapter20_evaluation.json for the
chapter's error bars (the chapter recomputes the first items and checks they equal these).

    OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/chapter20_evaluation.py

Models: the shipped Q4_1 file read to float32 ("Q4_1"), and the same weights re-quantised in
memory to Q4_0 with the embedding (also the output head) kept in Q8_0, as chapter 19 does
("Q4_0"). HellaSwag is scored by both; MMLU by the Q4_1 model in two prompt formats:
``lm-eval`` (lm-eval's zero-shot prompt, the letters as answers) and, on the first 100 items,
``cloze`` (``Question: ...\\nAnswer:`` with each choice's text as the answer). One thread,
batches of 8: about 10 CPU minutes in all. The four parts can run as four processes
(``--part``), then ``--merge`` joins their files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from minitransformer import evaluation as ev
from minitransformer import gguf, quantize
from minitransformer.bpe import BPETokenizer
from minitransformer.llama import Llama
from minitransformer.pretrained import smollm2_path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "eval"
OUT = ROOT / "experiments" / "chapter20_evaluation.json"


def requantized(model: Llama, kind: str) -> Llama:
    """Every matrix rounded to ``kind`` and read back; the embedding (the head) in Q8_0."""
    copy = Llama(model.config).eval()
    state = {}
    for name, value in model.state_dict().items():
        if value.dim() == 2:
            k = "Q8_0" if name in ("token_embedding.weight", "head.weight") else kind
            raw = quantize.quantize_gguf(value, k).numpy()
            value = torch.from_numpy(gguf.dequantize(raw, k)).reshape(value.shape)
        state[name] = value
    copy.load_state_dict(state)
    return copy


def mmlu_formats(doc: dict) -> dict[str, tuple[str, list[str], int]]:
    question = doc["question"].strip()
    label = int(doc["answer"])
    return {"lm-eval": ev.mmlu_item(doc),
            "cloze": (f"Question: {question}\nAnswer:", list(doc["choices"]), label)}


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").open(encoding="utf-8")]


PARTS = ("hellaswag:Q4_1", "hellaswag:Q4_0", "mmlu:lm-eval", "mmlu:cloze")
CLOZE_ITEMS = 100     # the cloze format scores 4 rows an item: the first 100 items


def run_part(part: str) -> dict:
    """One part of the run, ``task:names`` (the models for HellaSwag, the formats for MMLU),
    as ``{task: {name: per-item log-likelihoods}}``."""
    task, names = part.split(":")
    path = smollm2_path()
    tokenizer = BPETokenizer.from_gguf(path)
    model = Llama.from_gguf(path).eval()
    results: dict = {task: {}}
    for name in names.split(","):
        if task == "hellaswag":
            scored = model if name == "Q4_1" else requantized(model, name)
            items = [ev.hellaswag_item(d) for d in read("hellaswag")]
        else:
            docs = read("mmlu")[:CLOZE_ITEMS if name == "cloze" else None]
            scored, items = model, [mmlu_formats(d)[name] for d in docs]
        scores = ev.score_multiple_choice(scored, tokenizer, items)
        results[task][name] = [[round(x, 6) for x in s.log_likelihoods] for s in scores]
        print(part, name, "acc", sum(s.acc for s in scores) / len(scores), "acc_norm",
              sum(s.acc_norm for s in scores) / len(scores), flush=True)
    return results


def main() -> None:
    """Every part in turn (``--part P`` runs one and writes it beside OUT; ``--merge``
    joins the parts' files into OUT), then OUT."""
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS)
    parser.add_argument("--merge", action="store_true")
    args = parser.parse_args()
    part_file = lambda part: OUT.with_name(f"{OUT.stem}.{PARTS.index(part)}.json")  # noqa: E731
    if args.part:
        part_file(args.part).write_text(json.dumps(run_part(args.part)), encoding="utf-8")
        return
    results: dict = {"hellaswag": {}, "mmlu": {}}
    for part in PARTS:
        found = part_file(part)
        done = json.loads(found.read_text()) if args.merge else run_part(part)
        for task, values in done.items():
            results[task].update(values)
        if args.merge:
            found.unlink()
    OUT.write_text(json.dumps(results, indent=0) + "\n", encoding="utf-8")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
