"""The wheel carries the whole package (every subpackage, e.g. the exercise checkers), built
offline.

The build runs on a copy of the sources in a temporary folder, so it leaves no build/ or egg-info
behind in the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minitransformer"


def source_files() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")
            if "__pycache__" not in path.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "minitransformer",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out)],
        cwd=source, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("minitransformer-*.whl")
    return built


def test_the_wheel_holds_every_python_file_of_the_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.endswith(".py")}
    assert "minitransformer/exercises/__init__.py" in packed
    assert packed == source_files()


def test_the_wheel_holds_the_chat_page_that_serve_shows(wheel):
    pages = {path.relative_to(ROOT).as_posix() for path in (PACKAGE / "static").glob("*")}
    assert "minitransformer/static/chat.html" in pages
    with zipfile.ZipFile(wheel) as archive:
        assert pages <= set(archive.namelist())


def test_the_wheel_has_the_project_version(wheel):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert wheel.name.startswith(f"minitransformer-{version}-")


def test_the_changelog_describes_the_current_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog


def _third_party_imports() -> dict[str, set[str]]:
    """Every top-level module the package imports (at any depth, guarded or not) that is neither
    the standard library nor the package itself -> the files importing it."""
    import ast

    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("minitransformer",
                                                                      "__future__"):
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


# the import name where it differs from the distribution's name on the package index
_DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow"}
# imported only inside a function, behind a try/except ImportError, with an extra to install
# (fastapi: by minitransformer.server, which cli/serve.py imports that way)
_OPTIONAL = {"huggingface_hub": "hub", "fastapi": "serve", "uvicorn": "serve"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_every_import_of_the_package_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_requirement_name(r) for r in project["dependencies"]}
    extras = {extra: {_requirement_name(r) for r in reqs}
              for extra, reqs in project.get("optional-dependencies", {}).items()}
    imports = _third_party_imports()
    assert "tqdm" in imports and "safetensors" in imports      # the scan sees real imports
    for module, files in sorted(imports.items()):
        name = _DISTRIBUTION.get(module, module).lower().replace("_", "-")
        if module in _OPTIONAL:
            assert name in extras.get(_OPTIONAL[module], set()), (module, files)
            assert name not in required, f"{module} is optional: an extra, not a dependency"
        else:
            assert name in required, f"{module} is imported by {sorted(files)} but not " \
                                     f"declared in [project] dependencies"
    assert "transformers" not in imports, "the package must never import transformers"
    unused = required - {_DISTRIBUTION.get(m, m).lower().replace("_", "-") for m in imports}
    assert not unused, f"declared but never imported: {sorted(unused)}"


def test_the_optional_import_is_guarded():
    """huggingface_hub may be missing: it is imported inside a try that catches ImportError."""
    source = (PACKAGE / "pretrained.py").read_text()
    assert "try:\n        import huggingface_hub\n    except ImportError:" in source


def test_the_wheel_installs_without_dependencies_and_imports(wheel, tmp_path):
    """A venv that sees this environment's packages (torch, numpy, ...) but not the checkout:
    the wheel alone must import, train one step and save a checkpoint there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    # a venv made from a venv sees the base interpreter's packages, not this environment's:
    # add this environment's site-packages by path (its .pth files, among them the editable
    # install of the checkout, are not run that way)
    import site
    inner = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    result = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index",
                             "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    code = (
        "import sys, tempfile, torch, minitransformer as mt\n"
        "assert 'site-packages' in mt.__file__, mt.__file__\n"
        "import minitransformer.training as T, minitransformer.generation as G\n"
        "assert T.train is mt.train and G.generate is mt.generate\n"
        "m = mt.GPT(mt.GPTConfig(11, 8, 1, 2, 8))\n"
        "x = torch.zeros(1, 8, dtype=torch.long)\n"
        "mt.train(m, [(x, x)], steps=1, lr=1e-3, progress=False)\n"
        "d = tempfile.mkdtemp(); m.save_pretrained(d)\n"
        "print(type(mt.GPT.from_pretrained(d)).__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "GPT"


def test_every_submodule_is_a_module_not_shadowed_by_a_function():
    import importlib
    import types

    import minitransformer

    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem.startswith("__"):                 # __init__, and __main__ runs the CLI
            continue
        name = f"minitransformer.{path.stem}"
        module = importlib.import_module(name)
        assert isinstance(module, types.ModuleType), name
        attribute = getattr(minitransformer, path.stem, module)
        assert isinstance(attribute, types.ModuleType), \
            f"minitransformer.{path.stem} is a {type(attribute).__name__}, hiding the module"
