"""Seconds per test file, from a pytest run with --durations=0, into tests/durations.json.

tests/conftest.py hands the files to pytest-xdist's two workers longest first, from that table, so
that no worker is left with a long file at the end while the other waits. Refresh it after a file
grows or a new slow one appears (a file missing from the table counts as one second):

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest -n 2 --dist loadscope --durations=0 > LOG
    .venv/bin/python tools/test_durations.py LOG
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"
LINE = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")


def main(log: str) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in Path(log).read_text(encoding="utf-8").splitlines():
        found = LINE.match(line)
        if found:
            seconds[found.group(2)] += float(found.group(1))
    if not seconds:
        sys.exit(f"no --durations lines in {log}")
    table = {name: round(value, 1) for name, value in sorted(seconds.items())}
    OUT.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"{len(table)} files, {sum(table.values()):.0f} s in all, written to {OUT}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/test_durations.py PYTEST_LOG")
    main(sys.argv[1])
