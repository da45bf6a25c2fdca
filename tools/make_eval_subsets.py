"""Draw the committed evaluation subsets of tests/data/eval/ (chapter 20) from their sources.

    python tools/make_eval_subsets.py HELLASWAG_TXT CS336_DATA_DIR [OUT_DIR]

HELLASWAG_TXT: ``hellaswag_val_full.txt`` (klosax/hellaswag_text_data, the 10,042 items of
HellaSwag's validation set, 6 lines each: "activity_label: ctx", the label, 4 endings).
CS336_DATA_DIR: the ``data/`` folder of stanford-cs336/assignment5-alignment (``mmlu/test/*.csv``,
``gsm8k/test.jsonl``). Each draw is ``random.Random(SEED).sample`` over the items in file
order, kept in file order; SHA-256 sums of every source file and subset go to stdout.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import sys
from pathlib import Path

SEED = 20
SIZES = {"hellaswag": 200, "mmlu": 200, "gsm8k": 100}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def draw(items: list, size: int) -> list:
    chosen = sorted(random.Random(SEED).sample(range(len(items)), size))
    return [dict(items[i], index=i) for i in chosen]


def hellaswag(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    assert len(lines) % 6 == 0, len(lines)
    return [{"query": lines[i], "choices": lines[i + 2:i + 6], "label": int(lines[i + 1])}
            for i in range(0, len(lines), 6)]


def mmlu(folder: Path) -> list[dict]:
    items = []
    for path in sorted(folder.glob("*_test.csv")):
        subject = path.name.removesuffix("_test.csv")
        with path.open(newline="", encoding="utf-8") as f:
            for row in csv.reader(f):
                question, *choices, answer = row
                assert len(choices) == 4 and answer in "ABCD", row
                items.append({"subject": subject, "question": question, "choices": choices,
                              "answer": "ABCD".index(answer)})
    return items


def gsm8k(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def main(hellaswag_txt: str, cs336_data: str, out: str = "tests/data/eval") -> None:
    data, out = Path(cs336_data), Path(out)
    sources = {"hellaswag": [Path(hellaswag_txt)],
               "mmlu": sorted((data / "mmlu" / "test").glob("*_test.csv")),
               "gsm8k": [data / "gsm8k" / "test.jsonl"]}
    items = {"hellaswag": hellaswag(Path(hellaswag_txt)), "mmlu": mmlu(data / "mmlu" / "test"),
             "gsm8k": gsm8k(data / "gsm8k" / "test.jsonl")}
    for name, size in SIZES.items():
        target = out / f"{name}.jsonl"
        target.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n"
                                  for item in draw(items[name], size)), encoding="utf-8")
        print(f"{name}: {size} of {len(items[name])} items -> {target} {sha256(target)}")
        for path in sources[name]:
            print(f"  source {sha256(path)}  {path.name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
