"""experiments/sft_smollm2.py (chapter 16's SmolLM2 section): a 2-step run of tiny sizes writes
the results the chapter reads, and the stored results are a full run of the script as
committed (its default settings, every run of the grid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import helpers

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "sft_smollm2.py"
STORED = ROOT / "experiments" / "results" / "sft_smollm2.json"
LORA_PER_RANK = 30 * (576 + 576 + 576 + 192 + 576 + 192 + 576 + 576)   # q, k, v, out_proj


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=900, check=False)


def test_two_steps_write_what_the_chapter_reads(tmp_path):
    out = tmp_path / "sft.json"
    done = run_script("--steps", "2", "--seeds", "0", "--ranks", "4", "--batch-size", "2",
                      "--train-size", "8", "--held-out", "4", "--general", "1",
                      "--max-new-tokens", "4", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["sft.json"]  # no side or temporary file
    runs = results["runs"]
    assert [(r["config"]["rank"], r["config"]["mask"]) for r in runs] == \
        [(0, True), (4, True), (4, False)]
    base, masked, unmasked = runs
    assert "losses" not in base and "trainable" not in base
    for run in (masked, unmasked):
        assert run["trainable"] == 4 * LORA_PER_RANK
        assert len(run["losses"]) == 2
        assert run["training_peak_mb"] >= run["loaded_mb"] > 500   # 540 MB of float32
    for run in runs:
        assert run["held_out"] == len(run["replies"]) == 4
        assert 0 <= run["format"] <= 4 and 0 <= run["right"] <= 4
        assert len(run["general"]) == 1 and run["perplexity"] > 1
    assert base["format"] == 0                  # SmolLM2 does not answer in JSON by itself
    assert results["held_out_prompts"] and results["example"][1]["role"] == "assistant"


def experiment_module():
    return helpers.experiment_module("sft_smollm2")


def test_format_check_and_answer_check():
    experiment = experiment_module()
    assert experiment.is_format('{"topic": "math", "answer": "12"}')
    assert not experiment.is_format('{"topic": "math"}')
    assert not experiment.is_format('{"topic": "math", "answer": "12"} and more')
    assert not experiment.is_format("The answer is 12.")
    assert experiment.is_right("The capital is Buenos Aires.", "Buenos Aires")
    assert not experiment.is_right("It is 112.", "12")
    train, tests = experiment.make_data(160, 16)
    assert len(train) == 160 and len(tests) == 16
    assert not {q for q, _, _ in train} & {q for q, _, _ in tests}
    assert {t for _, t, _ in tests} == {"math", "geography", "language", "nature"}


def test_stored_results_are_the_scripts_full_grid():
    results = json.loads(STORED.read_text())
    defaults = vars(experiment_module().make_parser().parse_args([]))
    settings = results["settings"]
    for key, value in settings.items():
        if key in defaults:
            assert value == defaults[key], key
    assert results["command"].strip() == "python experiments/sft_smollm2.py"
    grid = [(r["config"]["rank"], r["config"]["mask"], r["config"]["seed"])
            for r in results["runs"]]
    ranks, seeds = settings["ranks"], settings["seeds"]
    assert len(seeds) == 2 and len(ranks) == 2
    assert grid == [(0, True, 0)] + [(ranks[0], m, s) for m in (True, False) for s in seeds] \
        + [(ranks[1], True, s) for s in seeds]
    for run in results["runs"]:
        assert run["held_out"] == settings["held_out"]
        if run["config"]["rank"]:
            assert run["trainable"] == run["config"]["rank"] * LORA_PER_RANK
            assert len(run["losses"]) == settings["steps"]
            assert run["training_peak_mb"] > run["loaded_mb"]
