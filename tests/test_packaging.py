"""The wheel carries the whole package (every subpackage, e.g. the exercise checkers), built offline.

The build runs on a copy of the sources in a temporary folder, so it leaves no build/ or egg-info
behind in the repository.
"""

from __future__ import annotations

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


def test_the_wheel_has_the_project_version(wheel):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
    assert wheel.name.startswith(f"minitransformer-{version}-")


def test_the_changelog_describes_the_current_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog
