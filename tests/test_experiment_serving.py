"""experiments/serving_smollm2.py (chapter 18's SmolLM2 section): a run of 2 requests writes the
figures the chapter reads, the engine's tokens equal the sequential ones, the shared system
prompt is found in the cache; the stored results are a full run of the script's defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "serving_smollm2.py"
STORED = ROOT / "experiments" / "results" / "serving_smollm2.json"
FIGURES = {"sequential_tokens_per_s", "continuous_tokens_per_s", "continuous_over_sequential",
           "flips", "flips_cached", "prefix_hits", "ttft_ms_median", "ttft_ms_median_cached"}


def test_two_requests_write_what_the_chapter_reads(tmp_path):
    out = tmp_path / "serving.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--requests", "2", "--max-tokens", "2",
                           "--rounds", "1", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    (only,) = results["rounds"]
    assert FIGURES <= set(only) and FIGURES <= set(results["median"])
    assert only["flips"] == only["flips_cached"] == 0
    # every prompt begins with the same system prompt: the second finds at least one block
    assert only["prefix_hits"] >= 16
    assert only["prefilled_cached"] == only["prefilled"] - only["prefix_hits"]
    assert only["ttft_prefilled_cached"] < only["ttft_prefilled"]
    assert len(results["prompt_tokens"]) == 2


def test_stored_results_are_the_scripts_defaults():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import serving_smollm2
    finally:
        sys.path.remove(str(SCRIPT.parent))
    defaults = vars(serving_smollm2.make_parser().parse_args([]))
    stored = json.loads(STORED.read_text())
    for key, value in stored["settings"].items():
        if key in defaults:
            assert value == defaults[key], key
    assert len(stored["rounds"]) == defaults["rounds"]
    assert all(r["flips"] == 0 for r in stored["rounds"])
