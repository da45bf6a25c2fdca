"""lm-eval 0.4.13 as the reference for minitransformer.evaluation: local task definitions over
the committed subsets (tests/data/eval), a run of lm-eval's ``hf`` model on a checkpoint
directory, and the same items scored by our functions. Used by tests/test_evaluation_lm_eval.py
and tools/compare_lm_eval.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["HF_DATASETS_OFFLINE"] = "1"   # before datasets / transformers are imported
os.environ["HF_HUB_OFFLINE"] = "1"

from minitransformer import evaluation as ev

DATA = Path(__file__).resolve().parent / "data" / "eval"

_COMMON = """dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""
_CHOICE = """output_type: multiple_choice
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""
TASKS = {
    "hellaswag_local": _CHOICE + """doc_to_text: "{{query}}"
doc_to_target: label
doc_to_choice: choices
""",
    "mmlu_local": _CHOICE + r"""description: "The following are multiple choice questions (with answers) about {{subject.replace('_', ' ')}}.\n\n"
doc_to_text: "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
""",
    "text_local": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
}


def read(name: str) -> list[dict]:
    """A committed subset, ``hellaswag``, ``mmlu`` or ``gsm8k``."""
    with (DATA / f"{name}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def texts(count: int, per_text: int = 5) -> list[str]:
    """Documents for the rolling log-likelihood: GSM8K solutions, ``per_text`` to a text."""
    answers = [doc["answer"] for doc in read("gsm8k")]
    return ["\n\n".join(answers[i * per_text:(i + 1) * per_text]) for i in range(count)]


def write_tasks(folder: Path, docs: dict[str, list[dict]]) -> list[str]:
    """A YAML and a JSONL per task of ``docs`` (``{"hellaswag_local": [...], ...}``) in
    ``folder``, for ``TaskManager(include_path=folder)``; returns the task names."""
    folder.mkdir(parents=True, exist_ok=True)
    for task, items in docs.items():
        data = folder / f"{task}.jsonl"
        data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in items),
                        encoding="utf-8")
        (folder / f"{task}.yaml").write_text(f"task: {task}\n" + _COMMON.format(data=data)
                                             + TASKS[task], encoding="utf-8")
    return list(docs)


def run_lm_eval(model_dir: Path, task_dir: Path, tasks: list[str], *,
                batch_size: int = 8) -> dict:
    """lm-eval's ``hf`` model (float32, CPU) on ``tasks``; its results and samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={model_dir},device=cpu,dtype=float32",
        tasks=tasks, task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True, batch_size=batch_size)


class HFTokenizer:
    """A transformers tokenizer as :mod:`minitransformer.evaluation` reads one: ``encode``
    without special tokens (lm-eval's ``tok_encode`` for a model without ``add_bos_token``)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


ITEMS = {"hellaswag_local": ev.hellaswag_item, "mmlu_local": ev.mmlu_item}


def compare(model, tokenizer, docs: dict[str, list[dict]], output: dict, *,
            prefix_id: int | None = None, batch_size: int = 8) -> dict[str, dict]:
    """Our scores of the same items next to lm-eval's ``output``: per task, both metrics
    with their standard errors, the largest difference of a log-likelihood, and whether
    every context we build equals lm-eval's."""
    report = {}
    for task, items in docs.items():
        samples = sorted(output["samples"][task], key=lambda s: s["doc_id"])
        theirs = output["results"][task]
        if task == "text_local":
            scores = [ev.score_text(model, tokenizer, d["text"], prefix_id=prefix_id,
                                    batch_size=batch_size) for d in items]
            ours = ev.TextScore.combine(scores)
            report[task] = {
                "bits_per_byte": (ours.bits_per_byte, theirs["bits_per_byte,none"]),
                "max_ll_difference": max(abs(-s.nll - t["resps"][0][0])
                                         for s, t in zip(scores, samples)),
                "items": len(items)}
            continue
        as_items = [ITEMS[task](d) for d in items]
        scores = ev.score_multiple_choice(model, tokenizer, as_items, batch_size=batch_size)
        entry = {"items": len(items), "contexts_equal": all(
            all(arg[0] == context and arg[1] == " " + choice
                for arg, choice in zip(s["arguments"], choices))
            for s, (context, choices, _) in zip(samples, as_items))}
        entry["max_ll_difference"] = max(
            abs(ours - resp[0][0]) for score, s in zip(scores, samples)
            for ours, resp in zip(score.log_likelihoods, s["resps"]))
        for metric in ("acc", "acc_norm"):
            mean, stderr = ev.mean_stderr([getattr(score, metric) for score in scores])
            entry[metric] = (mean, theirs[f"{metric},none"])
            entry[f"{metric}_stderr"] = (stderr, theirs[f"{metric}_stderr,none"])
            entry[f"{metric}_per_item_equal"] = all(
                getattr(score, metric) == s[metric] for score, s in zip(scores, samples))
        report[task] = entry
    return report
