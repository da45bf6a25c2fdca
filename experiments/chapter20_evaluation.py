"""Chapter 20's full run: SmolLM2-135M-Instruct's per-item log-likelihoods on the 200 HellaSwag
and 200 MMLU items of tests/data/eval, stored in experiments/chapter20_evaluation.json for the
chapter's error bars (the chapter recomputes the first items and checks they equal these).

    OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/chapter20_evaluation.py

Models: the shipped Q4_1 file read to float32 ("Q4_1"), and the same weights re-quantised in
memory to Q4_0 with the embedding (also the output head) kept in Q8_0, as chapter 19 does
("Q4_0"). HellaSwag is scored by both; MMLU by the Q4_1 model in three prompt formats:
``lm-eval`` (lm-eval's zero-shot prompt, the letters as answers), ``no subject`` (the same
without the subject's line) and ``cloze`` (``Question: ...\\nAnswer:`` with each choice's text as
the answer). One thread, batches of 8; about 10 minutes on one core.
"""

from __future__ import annotations

import json
import time
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
    lettered = "\n".join(f"{x}. {c}" for x, c in zip("ABCD", doc["choices"]))
    label = int(doc["answer"])
    return {"lm-eval": ev.mmlu_item(doc),
            "no subject": (f"{question}\n{lettered}\nAnswer:", list("ABCD"), label),
            "cloze": (f"Question: {question}\nAnswer:", list(doc["choices"]), label)}


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").open(encoding="utf-8")]


def main() -> None:
    torch.set_num_threads(1)
    path = smollm2_path()
    tokenizer = BPETokenizer.from_gguf(path)
    models = {"Q4_1": Llama.from_gguf(path).eval()}
    models["Q4_0"] = requantized(models["Q4_1"], "Q4_0")
    hellaswag = [ev.hellaswag_item(d) for d in read("hellaswag")]
    mmlu = [mmlu_formats(d) for d in read("mmlu")]
    results: dict = {"hellaswag": {}, "mmlu": {}}
    start = time.process_time()
    for name, model in models.items():
        scores = ev.score_multiple_choice(model, tokenizer, hellaswag)
        results["hellaswag"][name] = [[round(x, 6) for x in s.log_likelihoods] for s in scores]
        print(name, "hellaswag acc", sum(s.acc for s in scores) / len(scores), flush=True)
    for fmt in mmlu[0]:
        scores = ev.score_multiple_choice(models["Q4_1"], tokenizer, [m[fmt] for m in mmlu])
        results["mmlu"][fmt] = [[round(x, 6) for x in s.log_likelihoods] for s in scores]
        print(fmt, "mmlu acc", sum(s.acc for s in scores) / len(scores),
              "acc_norm", sum(s.acc_norm for s in scores) / len(scores), flush=True)
    results["cpu_seconds"] = round(time.process_time() - start)
    OUT.write_text(json.dumps(results, indent=0) + "\n", encoding="utf-8")
    print("wrote", OUT, results["cpu_seconds"], "CPU seconds")


if __name__ == "__main__":
    main()
