"""experiments/forgetting_smollm2.py (chapter 20's "did fine-tuning cost general ability?"):
a 2-step run of tiny sizes writes what the chapter reads, its comparisons are the package's
paired error bars of the stored per-item scores, and the stored results are a run of the
script as committed (its default settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers
import pytest

from minitransformer import evaluation as ev

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "forgetting_smollm2.py"
STORED = ROOT / "experiments" / "results" / "forgetting_smollm2.json"
TASKS = ("mmlu", "mmlu_cloze", "hellaswag")


def experiment_module():
    return helpers.experiment_module("forgetting_smollm2")


def check_comparisons(results: dict) -> None:
    """Every stored comparison is what the package computes from the stored scores."""
    module = experiment_module()
    base = results["scores"]["original"]
    for name, comparisons in results["comparisons"].items():
        tuned = results["scores"][name]
        for key, stored in comparisons.items():
            if key == "text":
                assert stored == json.loads(json.dumps(
                    module.compare_text(tuned["text"], base["text"])))
                continue
            task, metric = key.split("/")
            diff, se = ev.paired_stderr(tuned[task][metric], base[task][metric])
            assert stored["difference"] == pytest.approx(diff)
            assert stored["paired_stderr"] == pytest.approx(se)
            assert stored["minimum_detectable"] == pytest.approx(2.8016 * se, rel=1e-4)
            test = ev.mcnemar(tuned[task][metric], base[task][metric])
            assert (stored["only_tuned"], stored["only_base"]) == test[:2]
            n = len(base[task][metric])
            assert stored["items_needed_95"] == module.items_needed(n, diff, se, module.Z_95)
            assert stored["items_needed_95_power_80"] == module.items_needed(
                n, diff, se, module.Z_95_POWER_80)


def test_two_steps_write_what_the_chapter_reads(tmp_path):
    out = tmp_path / "forgetting.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "2", "--mmlu", "4", "--cloze", "2",
         "--hellaswag", "2", "--pieces", "2", "--dpo-prompts", "14", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["forgetting.json"]
    results = json.loads(out.read_text())
    assert results["items"] == {"mmlu": 4, "mmlu_cloze": 2, "hellaswag": 2}
    assert set(results["scores"]) == {"original", "sft", "dpo"}
    for scores in results["scores"].values():
        for task, n in results["items"].items():
            assert len(scores[task]["acc"]) == len(scores[task]["acc_norm"]) == n
        assert len(scores["text"]) == results["pieces"] == 2
    for recipe in results["recipes"].values():
        assert recipe["steps"] == 2 and len(recipe["losses"]) == 2
    assert results["recipes"]["sft"]["rank"] == 16 and results["recipes"]["dpo"]["beta"] == 0.1
    assert results["recipes"]["dpo"]["prompts"] == 14
    # the held-out text is chapter 20's: its first piece scores as the chapter's does
    assert results["scores"]["original"]["text"][0][1:] == [287, 1146]
    check_comparisons(results)


def test_items_needed():
    module = experiment_module()
    assert module.items_needed(200, 0.0, 0.01, 1.96) is None
    assert module.items_needed(100, 0.02, 0.01, 2.0) == 100   # already 2 standard errors
    assert module.items_needed(100, 0.01, 0.01, 2.0) == 400   # half the difference: 4 times
    assert module.items_needed(100, -0.01, 0.01, 2.0) == 400  # either sign
    assert round(module.Z_95, 3) == 1.960 and round(module.Z_95_POWER_80, 3) == 2.802
    pieces = module.held_out_pieces()
    assert len(pieces) == 10 and all(pieces)


def test_stored_results_are_the_scripts_defaults():
    results = json.loads(STORED.read_text())
    defaults = vars(experiment_module().make_parser().parse_args([]))
    settings = results["settings"]
    # --pieces and --dpo-prompts came after the run, at the values it used (stored below)
    assert set(settings) == set(defaults) - {"out", "pieces", "dpo_prompts"}
    for key, value in settings.items():
        assert value == defaults[key], key
    assert results["pieces"] == defaults["pieces"] == 10
    assert sum(tokens for _, tokens, _ in results["scores"]["original"]["text"]) > 3000
    assert results["recipes"]["dpo"]["prompts"] == defaults["dpo_prompts"]
    assert results["command"].strip() == "python experiments/forgetting_smollm2.py"
    assert results["items"] == {"mmlu": defaults["mmlu"], "mmlu_cloze": defaults["cloze"],
                                "hellaswag": defaults["hellaswag"]}
    sft, dpo = results["recipes"]["sft"], results["recipes"]["dpo"]
    assert len(sft["losses"]) == 20 and len(dpo["losses"]) == 12   # each recipe's own steps
    check_comparisons(results)
