"""The serving benchmarks still run, at a tiny size, with the options issue 43 added
(``benchmarks/serving.py --logprobs``, ``benchmarks/prefix_caching.py``'s 16 requests): their
timings mean nothing here, but the log-probabilities they check and the positions they count
do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *flags: str) -> str:
    """``benchmarks/SCRIPT FLAGS``' standard output (it must succeed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *flags],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_serving_with_logprobs():
    out = bench("serving.py", "--quick", "--size", "book", "--counts", "3", "--rounds", "2",
                "--logprobs", "3", "--threads", "1")
    assert out.startswith("load average ")
    for name in ("continuous +lp", "transformers +lp"):
        assert re.search(rf"^  {re.escape(name)} +\d", out, re.M), name
    assert re.search(r"logprobs \(top 3\), without \| with: continuous / the fastest "
                     r"sequential [\d.]+x \| [\d.]+x .*continuous / transformers [\d.]+x \| "
                     r"[\d.]+x", out)
    check = re.search(r"logprobs returned vs log_softmax\(forward\), (\d+) positions: chosen "
                      r"tokens' differ by at most (\S+), alternatives' by (\S+); alternatives "
                      r"not the likeliest 3: (\d+); vs transformers' on the (\d+) requests "
                      r"with the same tokens: at most (\S+)", out)
    assert check, out
    positions, chosen, alternatives, wrong, same, theirs = check.groups()
    assert int(positions) > 3 and int(wrong) == 0 and int(same) >= 1
    assert max(float(chosen), float(alternatives), float(theirs)) < 1e-4


def test_serving_refuses_too_many_logprobs():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"),
                           "--logprobs", "21"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 2 and "--logprobs must be 0 to 20" in done.stderr


def test_prefix_caching_sixteen_requests():
    out = bench("prefix_caching.py", "--quick")
    assert out.startswith("load average")
    for case in ("while the first runs", "after the first ended"):
        assert re.search(rf"{case}: .*\(208 positions prefilled\), with [\d.]+ ms \(16\)", out)
    for case in ("all at once", "one per step"):         # 208 + 15 x 16 with the prefix cached
        assert re.search(rf"16 requests, 200 shared tokens \+ 8 each, arriving {case}: median "
                         rf"time to first token without prefix caching [\d.]+ ms \(3328 "
                         rf"positions prefilled\), with [\d.]+ ms \(448\)", out), case
