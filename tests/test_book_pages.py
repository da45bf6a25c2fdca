"""The built book, as a reader's browser shows it.

`make test` builds the book into _build/html first. These tests open its pages in headless Chromium
and check what a reader would see: typeset math (offline), the chapters' figures, and links and
assets that all resolve. They are skipped, with the reason shown, only where Chromium is absent or
the book has not been built outside CI; in CI (CI=true) a missing build is a failure.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--virtual-time-budget=8000",
]


def _book_pages() -> list[str]:
    """The pages of _toc.yml, as paths relative to the book root without a suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        pages.extend(entry["file"] for entry in part["chapters"])
    return pages


def _chapter_notebooks() -> list[str]:
    return [page for page in _book_pages() if (ROOT / f"{page}.ipynb").exists()]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def built_book() -> Path:
    if not (HTML / "index.html").exists():
        message = "the book is not built: run `make book` (make test builds it first)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return HTML


@pytest.fixture(scope="module")
def chromium() -> str:
    path = _chromium()
    if path is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    return path


def _dump_dom(chromium: str, page: Path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, f"Chromium failed on {page}: {result.stderr[-2000:]}"
    return result.stdout


def _visible_text(dom: str) -> str:
    """The DOM without scripts, styles and code blocks, where raw LaTeX must not survive."""
    return re.sub(r"<(script|style|pre|code)\b.*?</\1>", "", dom, flags=re.S | re.I)


def _png_outputs(notebook: Path) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum("image/png" in output.get("data", {})
               for cell in cells if cell["cell_type"] == "code" for output in cell.get("outputs", []))


@pytest.mark.parametrize("page", _book_pages())
def test_page_math_is_typeset_offline(built_book, chromium, page):
    dom = _dump_dom(chromium, built_book / f"{page}.html")
    source = built_book / f"{page}.html"
    has_math = 'class="math' in source.read_text(encoding="utf-8")
    text = _visible_text(dom)
    leftovers = re.findall(r"\\\(|\\\)|\\\[|\\\]|\$\$", text)
    assert not leftovers, f"{page}: raw LaTeX delimiters left untypeset: {leftovers[:5]}"
    if has_math:
        assert "<mjx-container" in dom, f"{page}: has math but MathJax typeset none of it"


@pytest.mark.parametrize("page", _chapter_notebooks())
def test_chapter_figures_are_on_the_page(built_book, chromium, page):
    figures = _png_outputs(ROOT / f"{page}.ipynb")
    assert figures > 0, f"{page} has no figure"
    dom = _dump_dom(chromium, built_book / f"{page}.html")
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', dom)
    assert len(images) >= figures, f"{page}: {figures} figures in the notebook, {len(images)} on the page"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name):
                self.targets.append(attrs[name])


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_every_local_link_and_asset_resolves(built_book):
    # _static/ holds the themes' Jinja macro files (*.html templates, never opened by a reader)
    pages = sorted(p for p in built_book.rglob("*.html") if "_static" not in p.relative_to(built_book).parts)
    assert pages, "no HTML pages were built"
    parsed = {page: _parse(page) for page in pages}
    broken = []
    for page, links in parsed.items():
        for target in links.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "data:", "javascript:")):
                continue
            path = unquote(parts.path)
            resolved = (page.parent / path).resolve() if path else page
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.exists():
                broken.append(f"{page.relative_to(built_book)} -> {target}")
            elif parts.fragment and resolved.suffix == ".html":
                ids = parsed[resolved].ids if resolved in parsed else _parse(resolved).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.relative_to(built_book)} -> {target} (no such anchor)")
    assert not broken, "broken local links:\n" + "\n".join(broken[:40])


def test_mathjax_is_served_locally(built_book):
    page = (built_book / f"{_book_pages()[1]}.html").read_text(encoding="utf-8")
    scripts = re.findall(r'<script[^>]+src="([^"]*mathjax[^"]*)"', page, flags=re.I)
    assert scripts, "no MathJax script on the chapter page"
    assert all(not urlsplit(src).scheme for src in scripts), f"MathJax loads from the network: {scripts}"
