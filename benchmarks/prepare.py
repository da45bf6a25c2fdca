"""Memory and speed of ``prepare`` as the input grows (issue 31, chapter 15 "Your own data").

    .venv/bin/python benchmarks/prepare.py [--sizes 5 20 80] [--gb] [--workers 1 2]
                                           [--dir DIR] [--vocab-size 2048]
    .venv/bin/python benchmarks/prepare.py --big [--big-mb 1024] [--dir DIR]

Writes text files of the given sizes in MB (``--gb`` adds a 1 GB one), generated from the book's
corpus and the multilingual samples of ``tests/data`` (words drawn with Zipf-like weights,
numbers, some non-English lines), then for each file and each worker count runs ``prepare``
in a fresh process and prints:

- the peak memory of the run: the proportional set size summed over its processes (the
  workers are forked and share pages, which PSS counts once), sampled every 20 ms with psutil;
- the encoding throughput in MB of text per second (the tokenizer is learned once beforehand
  and reused with ``tokenizer=``, so the time is the encoding's);
- the same per CPU second (user + system time of the run's processes): what one idle core
  would give, a fairer number on a busy machine;
- Hugging Face ``tokenizers``' own ``encode_batch`` of the same file's lines, on as many threads
  as workers, loaded from the same ``vocab.json``/``merges.txt``, and our ratio to it (wall);
- one run that learns the tokenizer too (``vocab_size``), to show that the sample keeps its
  memory bounded.

``--big`` measures the 1 GB targets instead, on one generated file of ``--big-mb`` MB in a
temporary directory (removed afterwards, with everything written into it):

- ``prepare --workers 2`` learning the tokenizer from its sample and encoding the whole file,
  as the command line runs it: wall time, MB/s, and its peak memory, both as PSS (the shared
  pages of the forked workers counted once) and as RSS summed over the processes (counted in
  each: an upper bound);
- ``train --data DATA_DIR`` on the result: the seconds from launch to the first step line
  (``--eval-every 1``), and, to tell the program's own start from the machine's load, the
  seconds that ``import minitransformer.cli`` alone takes in a fresh interpreter.

Targets: peak memory <= 1 GB for a 1 GB file on 2 cores, flat in the size; encoding >= 4 MB/s
with 2 workers; training starts within 5 s on a prepared 1 GB directory. The machine's load is
printed: other work on the cores slows every number.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "book" / "data" / "corpus.txt"
SAMPLES = sorted((ROOT / "tests" / "data").glob("*.txt"))
MB = 1 << 20

RUN = """
import json, resource, sys, time
from minitransformer.token_files import prepare

def cpu():
    return sum(getattr(resource.getrusage(who), field) for field in ("ru_utime", "ru_stime")
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))

kwargs = json.loads(sys.argv[3])
start, start_cpu = time.perf_counter(), cpu()
index = prepare(sys.argv[1], sys.argv[2], progress=False, **kwargs)
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": cpu() - start_cpu,
                  "tokens": sum(index["tokens"].values()), "dtype": index["dtype"]}))
"""

HF = """
import json, os, sys, time
os.environ["RAYON_NUM_THREADS"] = sys.argv[3]
from tokenizers import Tokenizer, models, pre_tokenizers
fast = Tokenizer(models.BPE.from_file(sys.argv[2] + "/vocab.json", sys.argv[2] + "/merges.txt"))
fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
start, start_cpu, tokens = time.perf_counter(), time.process_time(), 0
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    while True:
        lines = f.readlines(8 << 20)
        if not lines:
            break
        tokens += sum(len(e.ids) for e in fast.encode_batch(lines))
print(json.dumps({"seconds": time.perf_counter() - start, "tokens": tokens,
                  "cpu": time.process_time() - start_cpu}))
"""


def generate(path: Path, size: int, seed: int = 0) -> None:
    """About ``size`` bytes of text: lines of corpus words with Zipf-like weights, numbers and
    now and then a line of another language."""
    rng = random.Random(seed)
    words = sorted(set(CORPUS.read_text(encoding="utf-8").split()))
    weights = [1 / (rank + 1) for rank in range(len(words))]
    foreign = [line for p in SAMPLES for line in p.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    lines = []
    for _ in range(20_000):
        if rng.random() < 0.1:
            lines.append(rng.choice(foreign) + "\n")
            continue
        line = rng.choices(words, weights, k=rng.randint(4, 18))
        if rng.random() < 0.3:
            line.insert(rng.randrange(len(line)), str(rng.randint(0, 10 ** rng.randint(1, 6))))
        lines.append(" ".join(line) + "\n")
    written = 0
    with open(path, "wb") as f:
        while written < size:
            rng.shuffle(lines)
            block = "".join(lines).encode("utf-8")[:size - written]
            block = block[:block.rfind(b"\n") + 1] or block
            f.write(block)
            written += len(block)


def measured(command: list[str], env: dict, *, rss: list | None = None,
             json_out: bool = True, every: float = 0.02) -> tuple[dict, float]:
    """Run ``command``; its JSON line and its peak memory in MB: the proportional set size
    (PSS) summed over it and its children, so pages the forked workers share count once,
    sampled ``every`` seconds (reading PSS costs CPU time of its own). ``rss``: a list to
    append the peak of the RSS summed over the processes to."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, text=True)
    root, peak, peak_rss = psutil.Process(proc.pid), 0, 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            infos = [p.memory_full_info() for p in procs]
            peak = max(peak, sum(i.pss for i in infos))
            peak_rss = max(peak_rss, sum(i.rss for i in infos))
        except psutil.Error:
            pass
        time.sleep(every)
    out = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(command[:3])}: exit {proc.returncode}")
    if rss is not None:
        rss.append(peak_rss / MB)
    return (json.loads(out.strip().splitlines()[-1]) if json_out else {}), peak / MB


def first_step(command: list[str], env: dict) -> tuple[float, str]:
    """Seconds from launching ``command`` to its first line that begins with ``step``, and
    that line; the command is stopped there."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step"):
                return time.perf_counter() - start, line.strip()
    finally:
        proc.kill()
        proc.wait()
    raise SystemExit(f"failed: {' '.join(command[:4])}: no step line")


def children_cpu() -> float:
    """User and system seconds of the finished child processes (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def big(args, env: dict) -> None:
    """The 1 GB targets (``--big``): prepare's peak memory and speed, train's start."""
    size = int(args.big_mb * MB)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
              flush=True)
        text, data, out = tmp / "text.txt", tmp / "data", tmp / "run"
        start = time.perf_counter()
        generate(text, size)
        print(f"generated {size / MB:,.0f} MB in {time.perf_counter() - start:.0f} s",
              flush=True)
        rss: list = []
        start, cpu = time.perf_counter(), children_cpu()
        _, peak = measured([sys.executable, "-m", "minitransformer", "prepare", "--data",
                            str(text), "--out", str(data), "--workers", "2", "--vocab-size",
                            str(args.vocab_size), "--no-progress"], env, rss=rss,
                           json_out=False, every=0.25)
        seconds, cpu = time.perf_counter() - start, children_cpu() - cpu
        print(f"prepare --workers 2 --vocab-size {args.vocab_size} of {size / MB:,.0f} MB: "
              f"{seconds:.0f} s, {size / MB / seconds:.2f} MB/s, {size / MB / cpu:.2f} MB per "
              f"CPU second (learning included), peak "
              f"memory {peak:.0f} MB PSS, {rss[0]:.0f} MB RSS summed (target <= 1024 MB)",
              flush=True)
        print(f"load average: {os.getloadavg()[0]:.1f}", flush=True)
        imports = []
        for _ in range(3):
            begin = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import minitransformer.cli"], env=env,
                           check=True)
            imports.append(time.perf_counter() - begin)
        seconds, line = first_step([sys.executable, "-m", "minitransformer", "train",
                                    "--data", str(data), "--out", str(out), "--steps", "2",
                                    "--eval-every", "1", "--no-progress"], env)
        print(f"train --data DATA_DIR ({size / MB:,.0f} MB of text): first step line after "
              f"{seconds:.1f} s (target <= 5 s): {line}")
        print(f"  of which a fresh interpreter's import minitransformer.cli: "
              f"{min(imports):.1f} to {max(imports):.1f} s")
        print(f"load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[5, 20, 80],
                        help="file sizes in MB")
    parser.add_argument("--gb", action="store_true", help="add a 1 GB file (minutes)")
    parser.add_argument("--big", action="store_true", help="measure the 1 GB targets instead: "
                        "prepare's peak memory and train's start (minutes)")
    parser.add_argument("--big-mb", type=float, default=1024, help="--big's file size in MB")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--learn-on", type=float, help="the file (MB) that the tokenizer is "
                        "learned from and encoded, with its peak memory (default: the largest)")
    args = parser.parse_args()
    sizes = [*args.sizes, *([1024] if args.gb else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if args.big:
        big(args, env)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        files = {}
        for size in sizes:
            files[size] = tmp / f"text_{size:g}MB.txt"
            generate(files[size], int(size * MB))
        tokenizer = tmp / "tokenizer"
        learn = dict(vocab_size=args.vocab_size, workers=max(args.workers))
        learn_on = args.learn_on if args.learn_on in files else sizes[-1]
        result, peak = measured([sys.executable, "-c", RUN, str(files[learn_on]), str(tokenizer),
                                 json.dumps(learn)], env)
        print(f"learn a {args.vocab_size}-token tokenizer from a sample of the "
              f"{learn_on:g} MB file and encode it: {result['seconds']:.1f} s, peak "
              f"{peak:.0f} MB, {result['dtype']}\n")
        print(f"{'file MB':>8} {'workers':>7} {'peak MB':>8} {'MB/s':>7} "
              f"{'MB/cpu-s':>8} {'HF MB/s':>8} {'HF MB/cpu-s':>11} {'ours/HF':>8}")
        runs = []
        for size, path in files.items():
            for workers in args.workers:
                hf, _ = measured([sys.executable, "-c", HF, str(path), str(tokenizer),
                                  str(workers)], env)
                hf_speed = path.stat().st_size / MB / hf["seconds"]
                hf_cpu = path.stat().st_size / MB / hf["cpu"]
                out = tmp / f"out_{size:g}_{workers}"
                kwargs = dict(tokenizer=str(tokenizer), workers=workers)
                result, peak = measured([sys.executable, "-c", RUN, str(path), str(out),
                                         json.dumps(kwargs)], env)
                speed = path.stat().st_size / MB / result["seconds"]
                per_cpu = path.stat().st_size / MB / result["cpu"]
                runs.append((size, workers, peak, speed))
                print(f"{size:>8g} {workers:>7} {peak:>8.0f} {speed:>7.2f} "
                      f"{per_cpu:>8.2f} {hf_speed:>8.2f} {hf_cpu:>11.2f} "
                      f"{speed / hf_speed:>8.3f}", flush=True)
                for file in out.iterdir():
                    file.unlink()
                out.rmdir()
        print(f"\nload average after: {os.getloadavg()[0]:.1f}")
        peak = max(r[2] for r in runs)
        print(f"peak memory of any run: {peak:.0f} MB (target <= 1024 MB)")
        two = [r[3] for r in runs if r[1] == 2]
        if two:
            print(f"2 workers: {min(two):.2f} to {max(two):.2f} MB/s (target >= 4 MB/s)")

if __name__ == "__main__":
    main()
