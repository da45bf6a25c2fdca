"""experiments/dpo_smollm2.py and grpo_smollm2.py (chapter 17's SmolLM2 sections): a 2-step run
of tiny sizes writes the results the chapter reads; the task's checks are programs that
catch the mistakes they are for; the stored results are complete runs of the scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(EXPERIMENTS / name), *args],
                          capture_output=True, text=True, env=env, timeout=900, check=False)


def module(name: str):
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(EXPERIMENTS))


def test_dpo_two_steps_write_what_the_chapter_reads(tmp_path):
    out = tmp_path / "dpo.json"
    done = run_script("dpo_smollm2.py", "--steps", "2", "--seeds", "0", "--betas", "0.1",
                      "--prompts", "5", "--held-out", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["complete"] and len(results["runs"]) == 1
    run = results["runs"][0]
    assert len(run["train_losses"]) == 2
    assert run["train_losses"][0] == pytest.approx(0.6931, abs=1e-3)  # ln 2: policy = reference
    assert run["trainable_parameters"] == 10 * 16 * (576 + 576 + 576 + 192 + 576 + 192 + 576
                                                     + 576)
    after, before = run["after"], results["before"]
    assert 0 <= after["preference_accuracy"] <= 1 and after["kl"] >= 0
    assert 0 < before["stop_probability"] < 1 and before["preference_accuracy"] == 0
    summary = results["summary"]["0.1"]
    assert set(summary) >= {"preference_accuracy", "margin", "kl", "stop_probability", "words",
                            "one_sentence_rate"}
    pair = results["example_pair"]
    assert pair["rejected"][0]["content"].startswith(pair["chosen"][0]["content"])
    assert [p.name for p in tmp_path.iterdir()] == ["dpo.json"]     # no temporary file left


def test_grpo_two_steps_write_what_the_chapter_reads(tmp_path):
    out = tmp_path / "grpo.json"
    done = run_script("grpo_smollm2.py", "--steps", "2", "--seeds", "0", "--held-out", "4",
                      "--rewards", "correct+format", "--batch-size", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["complete"] and len(results["runs"]) == 1
    run = results["runs"][0]
    assert [h["step"] for h in run["history"]] == [1, 2]
    assert abs(run["history"][0]["loss"]) < 1e-6           # on-policy: the first loss is 0
    for h in run["history"]:
        assert h["signal_fraction"] in (0.0, 1.0)          # one group a step
    assert len(results["base"]["replies"]) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["grpo.json"]    # no temporary file left
    assert set(results["summary"]["correct+format"]) >= {"accuracy_before", "accuracy_after",
                                                        "gain", "seed_spread",
                                                        "signal_fraction"}


def test_the_arithmetic_checks():
    grpo = module("grpo_smollm2")
    replies = ["6 + 7 = 13", "6 + 7 = 13.", "6 + 7 = 12", "The sum is 13", "6+7=13 and 13",
               " 6 + 7 = 13 \n", "13", "6 + 7 = 13 = 14"]
    n = len(replies)
    correct = grpo.reward_correct(replies, answer=[13] * n)
    assert correct == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    formatted = grpo.reward_format(replies, a=[6] * n, b=[7] * n)
    assert formatted == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert grpo.reward_format(["7 + 6 = 13"], a=[6], b=[7]) == [0.0]   # the question's order
    reward = grpo.Reward(bonus=True)
    assert reward(["6 + 7 = 13", "6 + 7 = 12", "13 it is"], answer=[13] * 3, a=[6] * 3,
                  b=[7] * 3) == [1.5, 0.5, 0.0]
    assert grpo.signal_fraction([1, 1, 1, 1, 0, 1, 0, 0], group_size=4) == 0.5
    assert grpo.signal_fraction([0.5] * 8, group_size=4) == 0.0
    train, held_out = grpo.problems(10)
    assert len(train) + len(held_out) == 79 and len(held_out) == 10
    questions = {(r["a"], r["b"]) for r in train}
    assert questions.isdisjoint((r["a"], r["b"]) for r in held_out)
    assert (3, 4) not in questions and all(r["answer"] == r["a"] + r["b"] for r in train)


def test_the_pairs_are_cut_from_one_reply():
    dpo = module("dpo_smollm2")
    rows = dpo.prompt_rows(["rain", "snow"])
    replies = [("Rain is water. It falls from clouds. It is", False), ("Snow is cold.", True)]
    pairs = dpo.make_pairs(rows, replies)
    assert len(pairs) == 1                                 # one sentence makes no pair
    assert pairs[0]["chosen"][0]["content"] == "Rain is water."
    assert pairs[0]["rejected"][0]["content"] == "Rain is water. It falls from clouds."
    assert dpo.behaviour([("One. Two.", True), ("One.", True), ("One.", False)]) == \
        {"words": 4 / 3, "one_sentence_rate": 1 / 3}


@pytest.mark.parametrize("name", ["dpo_smollm2", "grpo_smollm2"])
def test_the_stored_results_are_a_complete_run_of_the_script(name):
    results = json.loads((EXPERIMENTS / "results" / f"{name}.json").read_text())
    assert results["script"] == f"experiments/{name}.py"
    assert results["argv"] == [] and results["complete"]
    defaults = vars(module(name).arguments().parse_args([]))
    for key, value in results["settings"].items():
        if key in defaults:                   # the settings recorded are the defaults
            assert value == defaults[key], key
    assert len(results["settings"]["seeds"]) == 2 and len(results["runs"]) >= 4
