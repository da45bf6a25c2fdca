"""The chapter notebooks, read as files: the rules of the developers' guide that need no kernel.

For every book/*.ipynb:
- code lines are at most 79 characters (the book's column at 1280 px; no sideways scrolling);
- figures are at most as wide as that column, 688 px: a wider PNG is shrunk to fit, and its
  labels with it;
- solution code cells (between a markdown ``{solution-start}`` and ``{solution-end}``) carry
  ``"jupyter": {"source_hidden": true}``, so JupyterLab folds them until the learner opens them;
- no code cell of an exercise (its stub, checker call or solution) binds a public name of
  ``minitransformer`` at the top level: a learner's ``def causal_mask`` would shadow the package's;
- no timing metadata (re-executing an unchanged notebook must change no byte);
- every code cell was executed, top to bottom in one fresh kernel (execution counts 1, 2, 3, ...);
- links to other pages of the book are markdown links to the file, ``[chapter 7](07_x.ipynb)``:
  Jupyter Book turns them into links to the page, and JupyterLab opens the notebook. A
  ``{doc}`chapter 7 <07_x>``` role works in the book only; in JupyterLab it pointed at a file
  without its extension, which does not exist (and one split over two lines rendered as text).

Each failure names the notebook's cell (its index in the file, as nbformat counts) and the line.
"""

from __future__ import annotations

import ast
import base64
import json
import re
from pathlib import Path

import pytest

import minitransformer

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_LINE = 79
COLUMN_PX = 688  # the main column at a 1280 px window, where MAX_LINE characters of code fit
PUBLIC = frozenset(minitransformer.__all__)
# sphinx-exercise markers, in MyST backtick or colon fences: ```{exercise} ... / :::{solution-start}
MARKER = re.compile(r"^\s*(?:`{3,}|:{3,})\{(exercise|exercise-start|exercise-end|solution|"
                    r"solution-start|solution-end)\}", re.M)
HEADING = re.compile(r"^#{1,6} ", re.M)


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def _first_line(cell: dict) -> str:
    line = next((line for line in _source(cell).splitlines() if line.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def _regions(cells: list[dict]) -> list[tuple[int, dict, bool, bool]]:
    """Each code cell as (index, cell, inside an exercise, inside a gated solution)."""
    in_exercise = in_solution = False
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            source = _source(cell)
            markers = list(MARKER.finditer(source))
            if HEADING.search(source) and not markers:
                in_exercise = in_solution = False
            for marker in markers:
                kind = marker.group(1)
                if kind in ("exercise", "exercise-start"):
                    in_exercise, in_solution = True, False
                elif kind == "solution-start":
                    in_exercise, in_solution = True, True
                elif kind == "solution-end":
                    in_exercise = in_solution = False
        elif cell["cell_type"] == "code":
            found.append((index, cell, in_exercise, in_solution))
    return found


def _code_cells(notebook: Path) -> list[tuple[int, dict, bool, bool]]:
    return _regions(_cells(notebook))


def _python(source: str) -> str:
    """The cell as plain Python: IPython magics and shell escapes become blank lines."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


def _top_level_bindings(tree: ast.Module) -> list[tuple[str, int]]:
    """Names a cell binds in the notebook's namespace, with their line (not inside def/class)."""
    bound = []

    def targets(node):
        if isinstance(node, ast.Name):
            bound.append((node.id, node.lineno))
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                targets(element)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.append((node.name, node.lineno))
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    targets(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                module = getattr(node, "module", None) or ""
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    # `from minitransformer import causal_mask` binds the package's own object
                    same = module.startswith("minitransformer") and alias.name == name
                    if not same:
                        bound.append((name, node.lineno))
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []) or [])
            if isinstance(node, ast.Match):
                for case in node.cases:
                    visit(case.body)

    def walruses(node):
        # `(x := ...)` binds in the notebook's namespace unless it sits in a function or lambda
        if isinstance(node, ast.NamedExpr):
            targets(node.target)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                      ast.Lambda)):
                walruses(child)

    visit(tree.body)
    walruses(tree)
    return bound


def _ids(notebook: Path) -> str:
    return notebook.stem


@pytest.fixture(params=NOTEBOOKS, ids=_ids)
def notebook(request) -> Path:
    return request.param


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 7, f"expected the chapter notebooks in book/, found {NOTEBOOKS}"


def test_code_lines_fit_the_column(notebook):
    too_long = [
        f"cell {index} line {number} ({len(line)} chars): {line.strip()[:60]}"
        for index, cell, _, _ in _code_cells(notebook)
        for number, line in enumerate(_source(cell).splitlines(), start=1)
        if len(line) > MAX_LINE
    ]
    assert not too_long, (f"{notebook.name}: {len(too_long)} code lines longer than {MAX_LINE} "
                          "characters:\n" + "\n".join(too_long))


def _output_texts(cell: dict) -> list[str]:
    """The text a code cell's outputs print: streams and plain-text results (no tracebacks)."""
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            texts.append("".join(output.get("text", "")))
        elif "text/plain" in output.get("data", {}) and "image/png" not in output["data"]:
            texts.append("".join(output["data"]["text/plain"]))
    return texts


def test_output_lines_fit_the_column(notebook):
    """Printed lines are at most 79 characters too: outputs share the code cells' font, so a
    longer one scrolls sideways at 1280 px (tests/test_book_pages.py measures it there)."""
    too_long = [
        f"cell {index} ({len(line)} chars): {line.strip()[:60]}"
        for index, cell, _, _ in _code_cells(notebook)
        for text in _output_texts(cell)
        for line in re.split(r"[\r\n]", text)
        if len(line) > MAX_LINE
    ]
    assert not too_long, (f"{notebook.name}: {len(too_long)} output lines longer than {MAX_LINE} "
                          "characters:\n" + "\n".join(too_long))


def _png_size(data: str) -> tuple[int, int]:
    """Width and height of a base64 PNG, read from its header (the IHDR chunk)."""
    header = base64.b64decode(data[:64])
    if header[:8] != b"\x89PNG\r\n\x1a\n" or header[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_figures_fit_the_column(notebook):
    """The book's column is 688 px wide at 1280 px: a wider figure is shrunk to fit, and text
    drawn at a readable size comes out too small (a 9-inch figure's 10-point labels at 76%)."""
    too_wide = [
        f"cell {index}: {width} px wide"
        for index, cell, _, _ in _code_cells(notebook)
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
        for width, _ in [_png_size(output["data"]["image/png"])]
        if width > COLUMN_PX
    ]
    assert not too_wide, (f"{notebook.name}: {len(too_wide)} figures wider than the {COLUMN_PX} px "
                          "column (make figsize at most 6.88 inches wide at 100 dpi):\n"
                          + "\n".join(too_wide))


def test_solution_cells_are_folded_in_jupyterlab(notebook):
    solutions = [(index, cell) for index, cell, _, in_solution in _code_cells(notebook) if in_solution]
    unfolded = [f"cell {index}: {_first_line(cell)}" for index, cell in solutions
                if cell["metadata"].get("jupyter", {}).get("source_hidden") is not True]
    assert not unfolded, (f"{notebook.name}: {len(unfolded)} of {len(solutions)} solution code cells "
                          "lack metadata \"jupyter\": {\"source_hidden\": true}:\n" + "\n".join(unfolded))


def test_exercises_do_not_shadow_package_names(notebook):
    shadowing = []
    for index, cell, in_exercise, _ in _code_cells(notebook):
        if not in_exercise:
            continue
        tree = ast.parse(_python(_source(cell)), filename=f"{notebook.name} cell {index}")
        for name, line in _top_level_bindings(tree):
            if name in PUBLIC:
                shadowing.append(f"cell {index} line {line}: binds `{name}`")
    assert not shadowing, (f"{notebook.name}: {len(shadowing)} exercise bindings shadow a public name "
                           "of minitransformer (name it `my_...`):\n" + "\n".join(shadowing))


def test_no_timing_metadata(notebook):
    timed = [f"cell {index}: metadata {sorted(set(cell['metadata']) & {'execution', 'ExecuteTime'})}"
             for index, cell in enumerate(_cells(notebook))
             if {"execution", "ExecuteTime"} & set(cell.get("metadata", {}))]
    assert not timed, (f"{notebook.name}: {len(timed)} cells carry timing metadata (re-execute with "
                       "`make execute NB=...`):\n" + "\n".join(timed))


def test_every_code_cell_ran_top_to_bottom_in_one_kernel(notebook):
    cells = [(index, cell) for index, cell, _, _ in _code_cells(notebook) if _source(cell).strip()]
    assert cells, f"{notebook.name} has no code"
    counts = [cell.get("execution_count") for _, cell in cells]
    never = [f"cell {index}: {_first_line(cell)}" for index, cell in cells
             if cell.get("execution_count") is None]
    assert not never, (f"{notebook.name}: {len(never)} code cells were never executed:\n"
                       + "\n".join(never))
    assert counts == list(range(1, len(counts) + 1)), (
        f"{notebook.name}: execution counts {counts} are not 1..{len(counts)} in order; re-execute "
        "the notebook top to bottom in a fresh kernel (`make execute NB=...`)")


LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def _book_links(notebook: Path) -> list[tuple[int, str]]:
    """(cell index, target) of every markdown link to a file of the book (not a URL or #anchor)."""
    return [(index, match.group(1)) for index, cell in enumerate(_cells(notebook))
            if cell["cell_type"] == "markdown"
            for match in LINK.finditer(_source(cell))
            if not re.match(r"[a-z]+:|#", match.group(1))]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_links_to_other_pages_open_in_the_book_and_in_jupyterlab(notebook):
    roles = [(index, role) for index, cell in enumerate(_cells(notebook))
             if cell["cell_type"] == "markdown"
             for role in re.findall(r"\{doc\}`[^`]*`", _source(cell))]
    assert not roles, (f"{notebook.name}: write [text](file.ipynb) instead of {{doc}}, which "
                       f"JupyterLab cannot open: cells {roles}")
    missing = [(index, target) for index, target in _book_links(notebook)
               if not (notebook.parent / target.split("#")[0]).is_file()]
    assert not missing, f"{notebook.name}: links to files that do not exist: {missing}"


def test_the_rules_catch_what_they_claim():
    """The parsers above, on small made-up notebooks (a rule that cannot fail is no rule)."""
    def md(text):
        return {"cell_type": "markdown", "metadata": {}, "source": text}

    def code(text, **metadata):
        return {"cell_type": "code", "metadata": metadata, "source": text, "execution_count": 1,
                "outputs": []}

    cells = [
        md("# Exercises"),
        md("```{exercise} Mask\n:label: ex\n\nWrite it.\n```"),
        code("def causal_mask(n):\n    raise NotImplementedError"),
        code("check(causal_mask)"),
        md("```{solution-start} ex\n:class: dropdown\n```"),
        code("%%time\nsoftmax = 1\nfor one_hot, x in []:\n    pass"),
        md("```{solution-end}\n```"),
        code("def causal_mask(n):  # outside any exercise: not this rule's business\n    pass"),
    ]
    regions = [(i, inside, solution) for i, _, inside, solution in _regions(cells)]
    assert regions == [(2, True, False), (3, True, False), (5, True, True), (7, False, False)]
    names = [name for name, _ in _top_level_bindings(ast.parse(_python(_source(cells[5]))))]
    assert names == ["softmax", "one_hot", "x"]
    tree = ast.parse("from minitransformer import causal_mask\nfrom mine import padding_mask\n"
                     "import numpy as np\nwith open('f') as heatmap:\n    if (tokenize := 1):\n"
                     "        pass\ndef f():\n    one_hot = 1\n")
    assert sorted(name for name, _ in _top_level_bindings(tree)) == ["f", "heatmap", "np",
                                                                     "padding_mask", "tokenize"]
    png = b"\x89PNG\r\n\x1a\n" + bytes([0, 0, 0, 13]) + b"IHDR" + (700).to_bytes(4, "big") + \
        (300).to_bytes(4, "big") + bytes(8)
    assert _png_size(base64.b64encode(png).decode()) == (700, 300)
    text = ("See [chapter 7](07_x.ipynb), [the notation](notation.md#symbols), "
            "[PyTorch](https://pytorch.org) and [above](#masks).")
    assert [m.group(1) for m in LINK.finditer(text)] == ["07_x.ipynb", "notation.md#symbols",
                                                         "https://pytorch.org", "#masks"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.name)
def test_the_chapter_is_listed_under_its_own_title(notebook):
    """_toc.yml, the intro's map and the README's table list every chapter, the table under the
    notebook's own title (found in review: three rows had drifted from the titles)."""
    number, stem = int(notebook.name[:2]), notebook.stem
    title = _source(_cells(notebook)[0]).splitlines()[0].removeprefix("# ").strip()
    assert f"book/{stem}" in (ROOT / "_toc.yml").read_text(encoding="utf-8")
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert re.search(rf"^{number}\. {{doc}}`{stem}`", intro, re.M), f"{stem} not in the intro's map"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| {number} \| ([^|]+) \|", readme, re.M)
    assert row and row.group(1).strip() == title, (
        f"README's row {number}: {row.group(1).strip() if row else None!r}, the chapter: {title!r}")
