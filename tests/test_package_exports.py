"""What minitransformer/__init__.py says it re-exports, checked against what the chapters import:
a name a notebook imports from the package itself is re-exported; a name it imports from a
submodule that does not re-export it comes from a module the package's docstring names."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import minitransformer as mt

BOOK = Path(__file__).resolve().parent.parent / "book"


def notebook_imports() -> list[tuple[str, str, str]]:
    """(notebook, module, name) of every ``from minitransformer... import name`` and every
    ``mt.name`` in the chapters' code cells."""
    found = []
    for path in sorted(BOOK.glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            lines = "".join(cell["source"]).splitlines()
            source = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.split(".")[0] == "minitransformer"):
                    found += [(path.name, node.module, alias.name) for alias in node.names]
                elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "mt"):
                    found.append((path.name, "minitransformer", node.attr))
    return found


def test_the_chapters_import_something():
    imports = notebook_imports()
    assert len({name for _, _, name in imports}) > 100   # the parse sees the chapters' imports


def test_a_name_imported_from_the_package_is_re_exported_or_a_module():
    public = set(mt.__all__) | set(mt._PLOT_NAMES)
    for notebook, module, name in notebook_imports():
        if module == "minitransformer":
            assert name in public or importlib.util.find_spec(f"minitransformer.{name}"), (
                f"{notebook} imports {name} from minitransformer, which does not re-export it")


def test_every_module_a_chapter_imports_from_is_named_in_the_docstring():
    for notebook, module, name in notebook_imports():
        if module == "minitransformer" or name in mt.__all__:
            continue
        named = (module if not module.startswith("minitransformer.exercises.")
                 else "minitransformer.exercises.chapterNN")
        assert named in mt.__doc__, (
            f"{notebook} imports {name} from {module}: the package's docstring must say that "
            f"this module's names are imported from it")
