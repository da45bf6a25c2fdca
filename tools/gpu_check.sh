#!/usr/bin/env bash
# The GPU check (README, "On a GPU"): one prepared run on a machine with a CUDA GPU, offline.
#
#   tools/gpu_check.sh [RESULTS_DIR]        (default: $OUT if set, else gpu_check_results/)
#
# 1. Installs what the machine's Python lacks (nbval, ipykernel, ...) from the wheels in
#    tools/wheels/ (`make gpu-wheels` downloads them; no network here). Never torch: the
#    machine's own PyTorch and CUDA are used, whatever their versions.
# 2. The two steps of `make test-gpu`, with this Python, side by side: the tests that take the
#    `device` fixture, on the device (on CUDA only those, unless GPU_UNIT_ALL=1: CI runs the
#    rest on a CPU every time), and every chapter under nbval with MINITRANSFORMER_DEVICE set
#    (GPU_CHAPTERS: other notebooks or folders). No book build, no browser tests.
# 3. Where SmolLM2's file is (`make smollm2`): tools/gpu_smollm2.py (the real model of chapters
#    14 and 16-20 on the device, against the CPU and transformers) and its decoding speed against
#    transformers'. Then benchmarks/decode_vs_transformers.py at GPT-2 small's shape (ours
#    against transformers on the same weights: tokens per second and ratio) and
#    benchmarks/kv_cache.py, on the device.
# 4. Writes summary.txt and summary.json (passed, failed, figures, device, torch and CUDA
#    versions) and one log per step into RESULTS_DIR. Exit status 0 when every step passed.
#
# Variables: GPU_STEPS (the steps to run, default "install unit chapters smollm2 decode kv_cache"),
# MINITRANSFORMER_DEVICE (default cuda; `cpu` runs the same check on a machine
# without a GPU), PYTHON (default python3, or .venv/bin/python where python3 has no torch),
# GPU_WORKERS (pytest-xdist workers, default min(8, cores)), GPU_CHECK_INSTALL=0 (install nothing),
# GPU_CHECK_TIMEOUTS=0 (no per-step time limits; they apply on CUDA only, to end within 8 min).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RESULTS=${1:-${OUT:-$ROOT/gpu_check_results}}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
DEVICE=${MINITRANSFORMER_DEVICE:-cuda}
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
# GNU nproc honours OMP_NUM_THREADS, which images often set to 1: count the cores without it.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
WORKERS=${GPU_WORKERS:-$(( CORES < 8 ? CORES : 8 ))}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# One thread per process (the chapters set their own); no MPLBACKEND: nbval compares the inline
# backend's figure reprs.
export OMP_NUM_THREADS=1
START=$(date +%s)
STEPS_FILE=$RESULTS/steps.txt   # name:status:seconds, a line per step (steps may run at once)
: >"$STEPS_FILE"

# Per-step limits (seconds) on CUDA, so that the whole check ends within about 9 minutes.
limit() {
    if [ "${GPU_CHECK_TIMEOUTS:-1}" = 0 ] || [ "${DEVICE%%:*}" != cuda ]; then echo 0; else echo "$1"; fi
}

step() {        # step NAME LIMIT_S COMMAND...: runs it, its output into NAME.log
    local name=$1 seconds=$2 began status
    shift 2
    case " ${GPU_STEPS:-install unit chapters smollm2 decode kv_cache} " in
        *" ${name%_*} "*|*" $name "*) ;;
        *) return 0 ;;
    esac
    began=$(date +%s)
    echo "== $name: $*" >"$RESULTS/$name.log"
    echo "== $name ($(date +%T))"
    if [ "$seconds" -gt 0 ] && command -v timeout >/dev/null; then
        timeout --kill-after=10 "$seconds" "$@" >>"$RESULTS/$name.log" 2>&1
    else
        "$@" >>"$RESULTS/$name.log" 2>&1
    fi
    status=$?
    [ "$status" = 124 ] && echo "== $name: stopped after its limit of ${seconds} s" >>"$RESULTS/$name.log"
    tail -n 2 "$RESULTS/$name.log" | cut -c1-300
    echo "$name:$status:$(( $(date +%s) - began ))" >>"$STEPS_FILE"
}

# --- 1. what the machine lacks, from tools/wheels/ --------------------------------------------
MISSING=$("$PY" - <<'EOF'
import importlib.util
needed = {"nbval": "nbval", "ipykernel": "ipykernel", "jupyter_client": "jupyter_client",
          "nbformat": "nbformat", "xdist": "pytest-xdist", "hypothesis": "hypothesis",
          "cloudpickle": "cloudpickle", "regex": "regex", "safetensors": "safetensors",
          "tqdm": "tqdm", "pytest": "pytest"}
print(" ".join(dist for module, dist in needed.items() if importlib.util.find_spec(module) is None))
EOF
)
install() {
    if [ -z "$MISSING" ]; then echo "nothing to install: $PY has every package"; return 0; fi
    if [ "${GPU_CHECK_INSTALL:-1}" = 0 ]; then echo "missing, not installed: $MISSING"; return 1; fi
    if [ ! -d tools/wheels ]; then echo "missing $MISSING, and no tools/wheels/ (make gpu-wheels)"; return 1; fi
    # Into the machine's environment, resolving against what it already has (torch untouched);
    # where that environment is not writable, into a folder put on PYTHONPATH.
    "$PY" -m pip install --quiet --no-index --find-links tools/wheels $MISSING && return 0
    "$PY" -m pip install --quiet --no-index --find-links tools/wheels --break-system-packages \
        $MISSING && return 0
    "$PY" -m pip install --quiet --no-index --find-links tools/wheels --target /tmp/gpu_check_site \
        $MISSING
}
step install "$(limit 90)" install
[ -d /tmp/gpu_check_site ] && export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"

# --- 2. make test-gpu's two steps, side by side ---------------------------------------------
# On CUDA the unit step runs the tests that take the `device` fixture, on the device only (the
# others run on the CPU, as CI runs them every time); GPU_UNIT_ALL=1 runs the whole suite.
BROWSER_TESTS="--ignore=tests/test_jupyterlab.py --ignore=tests/test_book_pages.py --ignore=tests/test_api_page.py"
if [ "${DEVICE%%:*}" = cuda ] && [ "${GPU_UNIT_ALL:-0}" = 0 ]; then
    UNIT_TESTS=$(grep -l 'def test[^(]*([^)]*\bdevice\b' tests/test_*.py | tr '\n' ' ')
    UNIT_SELECT=(-k "$DEVICE")
    UNIT_WORKERS=$(( WORKERS < 4 ? WORKERS : 4 ))
else
    UNIT_TESTS="tests/ $BROWSER_TESTS"
    UNIT_SELECT=()
    UNIT_WORKERS=$WORKERS
fi
CHAPTER_WORKERS=${GPU_CHAPTER_WORKERS:-$(( CORES > 6 ? CORES - 4 : WORKERS ))}
# shellcheck disable=SC2086
step unit "$(limit 200)" env MINITRANSFORMER_TEST_DEVICES="$DEVICE" "$PY" -m pytest -q \
    -p no:cacheprovider -n "$UNIT_WORKERS" --dist loadscope $UNIT_TESTS "${UNIT_SELECT[@]}" &
step chapters "$(limit 260)" env MINITRANSFORMER_DEVICE="$DEVICE" "$PY" -m pytest -q \
    -p no:cacheprovider -n "$CHAPTER_WORKERS" --dist loadscope ${GPU_CHAPTERS:-book/}
wait
# A kernel can die while many start at once (seen on the H200 with 12): run those notebooks
# again, two at a time.
DIED=$(grep -o 'book/[^ :]*\.ipynb::Cell [0-9]* - RuntimeError: Kernel died' \
    "$RESULTS/chapters.log" 2>/dev/null | cut -d: -f1 | sort -u | tr '\n' ' ')
if [ -n "$DIED" ]; then
    # shellcheck disable=SC2086
    step chapters_retry "$(limit 200)" env MINITRANSFORMER_DEVICE="$DEVICE" "$PY" -m pytest -q \
        -p no:cacheprovider -n 2 --dist loadscope $DIED
fi

# --- 3. the real model and the benchmarks on the device ---------------------------------------
BENCH=$(mktemp -d)
if "$PY" -c "from minitransformer.pretrained import smollm2_path; smollm2_path()" 2>/dev/null; then
    step smollm2 "$(limit 120)" "$PY" tools/gpu_smollm2.py --device "$DEVICE" \
        --json "$BENCH/smollm2.json"
    step decode_smollm2 "$(limit 90)" "$PY" benchmarks/decode_vs_transformers.py \
        --device "$DEVICE" --size smollm2 --rounds 3 --threads 2 \
        --json "$BENCH/decode_smollm2.json"
else
    step smollm2 0 sh -c 'echo "the model file is not here (make smollm2): SmolLM2 not checked"; exit 1'
fi
step decode "$(limit 60)" "$PY" benchmarks/decode_vs_transformers.py --device "$DEVICE" \
    --size gpt2-small --rounds 3 --threads "$(( CORES < 2 ? CORES : 2 ))" --json "$BENCH/decode.json"
step kv_cache "$(limit 60)" "$PY" benchmarks/kv_cache.py --device "$DEVICE" --new-tokens 256 512 \
    --repeats 3 --threads "$(( CORES < 2 ? CORES : 2 ))" --json "$BENCH/kv_cache.json"

# --- 4. the summary -----------------------------------------------------------------------------
TOTAL=$(( $(date +%s) - START ))
mapfile -t STEPS <"$STEPS_FILE"
"$PY" - "$RESULTS" "$BENCH" "$DEVICE" "$TOTAL" "${STEPS[@]}" <<'EOF'
import json, platform, re, subprocess, sys
from pathlib import Path

results, bench, device, total, *steps = sys.argv[1:]
results, bench = Path(results), Path(bench)
summary = {"device_asked": device, "wall_seconds": int(total), "python": platform.python_version()}
try:
    import torch
    summary["torch"] = torch.__version__
    summary["cuda"] = torch.version.cuda
    summary["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        summary["gpu"] = torch.cuda.get_device_name(0)
        summary["gpu_memory_GiB"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
except Exception as exc:  # the summary is written whatever broke
    summary["torch"] = f"not importable: {exc}"
try:
    summary["driver"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20).stdout.strip() or None
except (OSError, subprocess.SubprocessError):
    summary["driver"] = None
summary["cpu"] = platform.processor() or platform.machine()

counts = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
summary["steps"] = {}
for item in steps:
    name, status, seconds = item.rsplit(":", 2)
    log = (results / f"{name}.log").read_text(errors="replace")
    entry = {"status": int(status), "ok": status == "0", "seconds": int(seconds)}
    if name in ("unit", "chapters", "chapters_retry"):
        finals = [line for line in log.splitlines() if counts.search(line) and " in " in line]
        if finals:
            entry.update({kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                          for n, kind in counts.findall(finals[-1])})
        entry["failures"] = [line.split(" ", 1)[1][:300] for line in log.splitlines()
                             if line.startswith(("FAILED ", "ERROR "))][:40]
    figures = bench / f"{name}.json"
    if figures.is_file():
        entry["figures"] = json.loads(figures.read_text())
    summary["steps"][name] = entry
summary["passed"] = all(entry["ok"] for entry in summary["steps"].values())
(results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

lines = [f"GPU check: {'PASSED' if summary['passed'] else 'FAILED'} in {total} s",
         f"device asked: {device}; GPU: {summary.get('gpu', 'none')}; torch {summary.get('torch')}"
         f", CUDA {summary.get('cuda')}, driver {summary.get('driver')}, Python {summary['python']}"]
for name, entry in summary["steps"].items():
    tally = ", ".join(f"{entry[k]} {k}" for k in ("passed", "failed", "error", "skipped")
                      if k in entry)
    lines.append(f"{name:>9}: {'ok' if entry['ok'] else 'FAILED (exit ' + str(entry['status']) + ')'}"
                 f", {entry['seconds']} s{', ' + tally if tally else ''}")
    lines += [f"           {failure}" for failure in entry.get("failures", [])]
decode = summary["steps"].get("decode", {}).get("figures", {}).get("gpt2-small")
if decode:
    lines.append(f"   decode: GPT-2 small shape, ours {decode['ours_tokens_per_s']} tok/s, "
                 f"transformers {decode['transformers_tokens_per_s']} tok/s, ratio "
                 f"{decode['ratio']}x, greedy tokens equal: {decode['greedy_tokens_equal']}")
real = summary["steps"].get("decode_smollm2", {}).get("figures", {}).get("smollm2")
if real:
    lines.append(f"   decode: SmolLM2-135M, ours {real['ours_tokens_per_s']} tok/s, "
                 f"transformers {real['transformers_tokens_per_s']} tok/s, ratio "
                 f"{real['ratio']}x, greedy tokens equal: {real['greedy_tokens_equal']}")
smol = summary["steps"].get("smollm2", {}).get("figures")
if smol:
    lines += [f"  smollm2: {key}: {value}" for key, value in smol.items()
              if isinstance(value, dict) and "traceback" not in value]
kv = summary["steps"].get("kv_cache", {}).get("figures")
if kv:
    first = next(iter(kv["speed_up"].values()))
    lines.append(f" kv_cache: cached speed-up {', '.join(f'{v}x at {n}' for n, v in first.items())}"
                 f" new tokens; last/first 64 tokens {kv['last_over_first_64']}; Llama "
                 f"{kv['llama_speed_up_512']}x at 512")
(results / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if summary["passed"] else 1)
EOF
STATUS=$?
rm -rf "$BENCH"
echo "summary: $RESULTS/summary.txt"
exit $STATUS
