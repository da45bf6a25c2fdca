"""SmolLM2-135M-Instruct scored by minitransformer.evaluation and by lm-eval 0.4.13 on the
committed subsets (chapter 20): 200 HellaSwag + 200 MMLU items by default.

    python tools/compare_lm_eval.py [--limit N] [--json OUT]

The model is read with ``Llama.from_gguf`` and saved with ``save_pretrained`` (and
transformers' GGUF tokenizer) to a temporary directory that lm-eval's ``hf`` model reads. Prints,
per task, our acc and acc_norm with standard errors next to lm-eval's, whether every context and
per-item accuracy agrees, the largest log-likelihood difference, and the CPU seconds of each side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import lm_eval_helpers as helpers
from transformers import AutoTokenizer

from minitransformer import pretrained
from minitransformer.llama import Llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    path = pretrained.smollm2_path()
    model = Llama.from_gguf(path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    docs = {"hellaswag_local": helpers.read("hellaswag")[:args.limit],
            "mmlu_local": helpers.read("mmlu")[:args.limit]}
    with tempfile.TemporaryDirectory() as tmp:
        folder, tasks = Path(tmp) / "model", Path(tmp) / "tasks"
        model.save_pretrained(folder, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id)
        tokenizer.save_pretrained(folder)
        start = time.process_time()
        output = helpers.run_lm_eval(folder, tasks, helpers.write_tasks(tasks, docs))
        theirs_s = time.process_time() - start
    start = time.process_time()
    report = helpers.compare(model, helpers.HFTokenizer(tokenizer), docs, output)
    report["cpu_seconds"] = {"lm_eval": round(theirs_s, 1),
                             "ours": round(time.process_time() - start, 1)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
