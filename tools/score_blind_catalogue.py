"""Score the blind catalogue 2 against the exercise checkers.

Each wrong answer of tests/data/blind_catalogue_2/chapterNN.py is handed to the checker the
notebook calls; its printed line is captured. A truthy verdict is a defect (PASSES). The
other verdicts are sorted by hand into HINTED / GENERIC / MISLEADING in
tests/data/blind_catalogue_2/judgments.json (key "label function_name"); an entry missing
there is shown as UNJUDGED. Prints the table and writes RESULTS.md next to the catalogue.

Run: PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python tools/score_blind_catalogue.py
"""

import contextlib
import importlib
import importlib.util
import io
import json
import pathlib
import traceback

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "blind_catalogue_2"
CHAPTERS = (16, 17, 18)
KINDS = ("PASSES", "HINTED", "GENERIC", "MISLEADING", "UNJUDGED")


def load(chapter):
    spec = importlib.util.spec_from_file_location(
        f"blind2_chapter{chapter}", HERE / f"chapter{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WRONG_ANSWERS


def run(chapter, checker, fn):
    exercises = importlib.import_module(f"minitransformer.exercises.chapter{chapter}")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            verdict = getattr(exercises, checker)(fn)
    except Exception:  # a checker that raises is itself worth seeing
        verdict = None
        out.write("CHECKER RAISED: " + traceback.format_exc().strip().splitlines()[-1])
    return bool(verdict), " ".join(out.getvalue().split())


def main():
    path = HERE / "judgments.json"
    judgments = json.loads(path.read_text()) if path.exists() else {}
    rows, details = [], []
    for chapter in CHAPTERS:
        counts = dict.fromkeys(KINDS, 0)
        for label, checker, mistake, fn in load(chapter):
            passed, line = run(chapter, checker, fn)
            key = f"{label} {fn.__name__}"
            kind = "PASSES" if passed else judgments.get(key, "UNJUDGED")
            counts[kind] += 1
            details.append((kind, key, mistake, line))
            print(f"[{kind}] {key}: {mistake}\n    -> {line}")
        rows.append((chapter, counts))
    table = ["| chapter | " + " | ".join(KINDS) + " | total |",
             "|---" * (len(KINDS) + 2) + "|"]
    total = dict.fromkeys(KINDS, 0)
    for chapter, counts in rows:
        table.append(f"| {chapter} | " + " | ".join(str(counts[k]) for k in KINDS)
                     + f" | {sum(counts.values())} |")
        for k in KINDS:
            total[k] += counts[k]
    table.append("| all | " + " | ".join(str(total[k]) for k in KINDS)
                 + f" | {sum(total.values())} |")
    print("\n".join(table))
    lines = ["# Blind catalogue 2: scores", "",
             "Written blind (from the chapters only), then scored by",
             "`tools/score_blind_catalogue.py`; HINTED / GENERIC / MISLEADING are judged by hand",
             "(judgments.json) from each printed line. Answers were not changed after scoring.",
             "", *table, "", "## Entries not hinted", ""]
    for kind, key, mistake, line in details:
        if kind != "HINTED":
            lines.append(f"- **{kind}** `{key}` ({mistake}): {line or '(nothing printed)'}")
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
