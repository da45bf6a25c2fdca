"""The built book, as a reader's browser shows it.

`make test` builds the book into _build/html first. These tests open its pages in Debian's Chromium,
driven by Playwright (never `playwright install`: no browser is downloaded), at 1280x900, and check
what a reader sees: typeset maths (offline), the chapters' figures, no code cell, output or display
equation that needs sideways scrolling, solution dropdowns that open on a click and show their code,
figure-only cells whose code is folded, one search box, and links and assets that all resolve.
One browser serves every page, and each page is loaded once. They are skipped, with the reason
shown, only where Chromium is absent or the book has not been built outside CI; in CI (CI=true) a
missing build is a failure. BOOK_HTML=path tests a book built elsewhere (`jupyter-book build . --path-output DIR`
puts it in DIR/_build/html).
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from helpers import wait_for_book

ROOT = Path(__file__).resolve().parent.parent
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
VIEWPORT = {"width": 1280, "height": 900}
# Playwright adds --headless and a fresh profile; the rest are TOOLCHAIN.md's flags for this machine.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# URLs a button may carry only once the book has a real home (see _config.yml).
PLACEHOLDER_URLS = ("github.com/minitransformer/transformers-from-scratch", "github.com/OWNER/REPO",
                    "github.com/executablebooks/jupyter-book")
LAUNCH_URLS = ("mybinder.org", "colab.research.google.com")


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
    wait_for_book()
    if not (HTML / "index.html").exists():
        message = "the book is not built: run `make book` (make test builds it first)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return HTML


@pytest.fixture(scope="module")
def browser(built_book):
    path = _chromium()
    if path is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


# --- what the notebooks hold ------------------------------------------------------------------

def _cells(page: str) -> list[dict]:
    return json.loads((ROOT / f"{page}.ipynb").read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def _shown_code_cells(page: str) -> list[tuple[int, dict]]:
    """(index in the notebook, cell) of each code cell the page shows, in order."""
    return [(index, cell) for index, cell in enumerate(_cells(page)) if cell["cell_type"] == "code"
            and "remove-cell" not in cell["metadata"].get("tags", [])]


def _text_outputs(page: str) -> int:
    """Printed text (stdout, stderr) of the shown cells: each is a `pre` block on the page."""
    return sum(output["output_type"] == "stream"
               for _, cell in _shown_code_cells(page) for output in cell.get("outputs", []))


def _png_outputs(page: str) -> int:
    return sum("image/png" in output.get("data", {})
               for _, cell in _shown_code_cells(page) for output in cell.get("outputs", []))


def _solution_sources(page: str) -> list[str]:
    """The first code cell after each markdown {solution-start}: what its dropdown must show."""
    found, waiting = [], False
    for cell in _cells(page):
        if cell["cell_type"] == "markdown" and "{solution-start}" in _source(cell):
            waiting = True
        elif cell["cell_type"] == "code" and waiting:
            found.append(_source(cell).strip())
            waiting = False
    return found


# --- what the browser shows -------------------------------------------------------------------

WAIT_FOR_MATHJAX = """async () => {
    const deadline = Date.now() + 15000;
    while (Date.now() < deadline) {
        const mj = window.MathJax;
        if (!mj) return false;  // this page loads no MathJax
        if (mj.startup && mj.startup.promise) { await mj.startup.promise; return true; }
        await new Promise(resolve => setTimeout(resolve, 50));
    }
    return false;  // configured but never started: the script did not load
}"""

CELLS_AS_LOADED = """() => [...document.querySelectorAll('div.cell')].map(cell => {
    const details = cell.querySelector(':scope > details.hide');
    const pre = cell.querySelector('div.cell_input pre');
    const images = [...cell.querySelectorAll('div.cell_output img')];
    return {
        hideInput: cell.classList.contains('tag_hide-input'),
        folded: details !== null && !details.open,
        // a closed <details> keeps its content laid out (content-visibility: hidden) in Chromium
        inputShown: pre !== null && pre.checkVisibility({visibilityProperty: true}),
        figures: images.filter(img => img.naturalWidth > 0 && img.getBoundingClientRect().height > 0)
                       .length,
    };
})"""

# Per div.cell: its code block and its output blocks (stdout, stderr, results, errors); then every
# display equation, which MathJax typesets into an mjx-container that scrolls its own overflow.
WIDTHS_UNFOLDED = """() => {
    document.querySelectorAll('div.cell details.hide').forEach(details => { details.open = true; });
    const measure = pre => {
        const lines = pre.innerText.split('\\n');
        const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), '');
        return {scrollWidth: pre.scrollWidth, clientWidth: pre.clientWidth, longest};
    };
    const cells = [...document.querySelectorAll('div.cell')].map(cell => {
        const pre = cell.querySelector('div.cell_input pre');
        return {code: pre ? measure(pre) : null,
                outputs: [...cell.querySelectorAll('div.cell_output pre')].map(measure)};
    });
    const items = window.MathJax && MathJax.startup && MathJax.startup.document;
    const math = [...document.querySelectorAll('mjx-container[display]')].map(container => {
        const found = items ? items.getMathItemsWithin(container) : [];
        const wrapper = container.parentElement;
        return {scrollWidth: Math.max(container.scrollWidth, wrapper.scrollWidth),
                clientWidth: Math.min(container.clientWidth, wrapper.clientWidth),
                tex: found.length ? found[0].math : container.textContent};
    });
    return {cells, math};
}"""

# Every way into the search the page shows: the themes' search fields and search icons (they open
# the same dialog), and any search input outside that dialog.
SEARCH_BOXES_SHOWN = """() => [...document.querySelectorAll(
        '.search-button__button, input[type=search]')]
    .filter(e => e.checkVisibility({visibilityProperty: true, opacityProperty: true}))
    .map(e => e.className)"""

_REPORTS: dict[str, dict] = {}


def _report(browser, page: str) -> dict:
    """Everything the tests ask of one page, from a single load (cached for the module)."""
    if page in _REPORTS:
        return _REPORTS[page]
    tab = browser.new_page(viewport=VIEWPORT)
    try:
        tab.goto((HTML / f"{page}.html").as_uri(), wait_until="load")
        report = {"mathjax_started": tab.evaluate(WAIT_FOR_MATHJAX), "dom": tab.content(),
                  "cells": tab.evaluate(CELLS_AS_LOADED),
                  "figures": tab.evaluate("() => [...document.querySelectorAll('img')].filter("
                                          "img => /\\.png$/i.test(img.getAttribute('src') || '')"
                                          " && img.naturalWidth > 0).length"),
                  "search_boxes": tab.evaluate(SEARCH_BOXES_SHOWN),
                  "dropdowns": []}
        for dropdown in tab.locator("div.solution.dropdown").all():
            code = dropdown.locator("div.cell_input pre").first
            entry = {"title": dropdown.locator(".admonition-title").first.inner_text().strip(),
                     "hidden_before": not code.is_visible()}
            dropdown.locator("button.toggle-button").first.click()
            try:
                code.wait_for(state="visible", timeout=3000)
                tab.wait_for_function("e => getComputedStyle(e).opacity === '1'",
                                      arg=code.element_handle(), timeout=3000)
                entry["shown_after"], entry["code"] = True, code.inner_text().strip()
            except Exception:  # a timeout: the click did not show the code
                entry["shown_after"], entry["code"] = False, ""
            report["dropdowns"].append(entry)
        report["widths"] = tab.evaluate(WIDTHS_UNFOLDED)
    finally:
        tab.close()
    _REPORTS[page] = report
    return report


def _visible_text(dom: str) -> str:
    """The DOM without scripts, styles and code blocks, where raw LaTeX must not survive."""
    return re.sub(r"<(script|style|pre|code)\b.*?</\1>", "", dom, flags=re.S | re.I)


def _label(page: str, position: int) -> str:
    """The notebook cell behind the page's position-th code cell."""
    shown = _shown_code_cells(page)
    return f"cell {shown[position][0]}" if position < len(shown) else f"code block {position}"


@pytest.mark.parametrize("page", _book_pages())
def test_page_math_is_typeset_offline(browser, page):
    report = _report(browser, page)
    has_math = 'class="math' in (HTML / f"{page}.html").read_text(encoding="utf-8")
    leftovers = re.findall(r"\\\(|\\\)|\\\[|\\\]|\$\$", _visible_text(report["dom"]))
    assert not leftovers, f"{page}: raw LaTeX delimiters left untypeset: {leftovers[:5]}"
    if has_math:
        assert report["mathjax_started"], f"{page}: has math but MathJax never started (offline?)"
        assert "<mjx-container" in report["dom"], f"{page}: has math but MathJax typeset none of it"


@pytest.mark.parametrize("page", _book_pages())
def test_the_page_shows_one_search_box(browser, page):
    """pydata-sphinx-theme 0.17 adds a search field in a header bar while sphinx-book-theme keeps
    its own in the sidebar: two boxes for one search (_config.yml keeps the header's)."""
    shown = _report(browser, page)["search_boxes"]
    assert len(shown) == 1, f"{page}: {len(shown)} search boxes in view at 1280 px: {shown}"


@pytest.mark.parametrize("page", _chapter_notebooks())
def test_chapter_figures_are_on_the_page(browser, page):
    figures = _png_outputs(page)
    assert figures > 0, f"{page} has no figure"
    shown = _report(browser, page)["figures"]
    assert shown >= figures, f"{page}: {figures} figures in the notebook, {shown} loaded on the page"


def _math_label(page: str, tex: str) -> str:
    """The markdown cell that holds a display equation, found by its TeX."""
    words = " ".join(tex.split())[:40]
    for index, cell in enumerate(_cells(page)):
        if cell["cell_type"] == "markdown" and words in " ".join(_source(cell).split()):
            return f"markdown cell {index}"
    return "display math"


def _too_wide(label: str, what: str, w: dict) -> str | None:
    """A line of the failure message for a block wider than its column, else None."""
    if w["scrollWidth"] <= w["clientWidth"]:
        return None
    if what == "equation":
        detail = f"TeX: {' '.join(w['tex'].split())[:70]}"
    else:
        line = w["longest"].rstrip()
        detail = f"longest line {len(line)} chars: {line.strip()[:70]}"
    return f"  {label}: {w['scrollWidth']} px of {what} in a {w['clientWidth']} px block; {detail}"


@pytest.mark.parametrize("page", _chapter_notebooks())
def test_nothing_needs_sideways_scrolling(browser, page):
    """Code, the text it prints and display equations all fit the column (_static/code-cells.css)."""
    widths = _report(browser, page)["widths"]
    code = [(position, cell["code"]) for position, cell in enumerate(widths["cells"])
            if cell["code"] is not None]
    outputs = [(position, w) for position, cell in enumerate(widths["cells"])
               for w in cell["outputs"]]
    code_cells = [cell for _, cell in _shown_code_cells(page) if _source(cell).strip()]
    assert len(code) >= len(code_cells), (
        f"{page}: measured {len(code)} code blocks, the notebook shows {len(code_cells)}")
    assert len(outputs) >= _text_outputs(page), (
        f"{page}: measured {len(outputs)} output blocks, the notebook prints {_text_outputs(page)}")
    wide = [_too_wide(_label(page, position), "code", w) for position, w in code]
    wide += [_too_wide(f"{_label(page, position)} output", "output", w) for position, w in outputs]
    wide += [_too_wide(_math_label(page, w["tex"]), "equation", w) for w in widths["math"]]
    wide = [message for message in wide if message]
    assert not wide, (f"{page}: {len(wide)} blocks need sideways scrolling at "
                      f"{VIEWPORT['width']} px (of {len(code)} code cells, {len(outputs)} outputs "
                      f"and {len(widths['math'])} display equations):\n" + "\n".join(wide))


@pytest.mark.parametrize("page", _chapter_notebooks())
def test_solution_dropdowns_open_on_click_and_show_their_code(browser, page):
    expected = _solution_sources(page)
    dropdowns = _report(browser, page)["dropdowns"]
    assert len(dropdowns) == len(expected), (
        f"{page}: {len(expected)} {{solution-start}} in the notebook, {len(dropdowns)} dropdowns")
    for entry, source in zip(dropdowns, expected):
        assert entry["hidden_before"], f"{page}: '{entry['title']}' shows its code before a click"
        assert entry["shown_after"], f"{page}: '{entry['title']}' still hides its code after a click"
        assert entry["code"] == source, (f"{page}: '{entry['title']}' shows\n{entry['code']}\n"
                                         f"instead of the notebook's solution\n{source}")


@pytest.mark.parametrize("page", _chapter_notebooks())
def test_figure_only_cells_are_folded(browser, page):
    tagged = [index for index, cell in _shown_code_cells(page)
              if "hide-input" in cell["metadata"].get("tags", [])]
    cells = _report(browser, page)["cells"]
    on_page = [position for position, cell in enumerate(cells) if cell["hideInput"]]
    assert len(on_page) == len(tagged), (
        f"{page}: {len(tagged)} cells tagged hide-input, {len(on_page)} on the page")
    problems = []
    for position in on_page:
        cell = cells[position]
        if not cell["folded"] or cell["inputShown"]:
            problems.append(f"{_label(page, position)}: its code is in view, not folded")
        if cell["figures"] == 0:
            problems.append(f"{_label(page, position)}: folded, but shows no figure")
    assert not problems, f"{page}:\n" + "\n".join(problems)


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


def _built_pages(built_book: Path) -> list[Path]:
    # _static/ holds the themes' Jinja macro files (*.html templates, never opened by a reader)
    return sorted(p for p in built_book.rglob("*.html")
                  if "_static" not in p.relative_to(built_book).parts)


def test_every_local_link_and_asset_resolves(built_book):
    pages = _built_pages(built_book)
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


def test_no_button_points_at_a_placeholder(built_book):
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    forbidden = PLACEHOLDER_URLS + (() if config.get("launch_buttons") else LAUNCH_URLS)
    found = [f"{page.relative_to(built_book)} -> {target}"
             for page in _built_pages(built_book) for target in _parse(page).targets
             if any(url in target for url in forbidden)]
    assert not found, "links to a place the project does not live:\n" + "\n".join(found[:20])
    chapter = (built_book / f"{_chapter_notebooks()[0]}.html").read_text(encoding="utf-8")
    assert re.search(r'href="[^"]*_sources/[^"]+\.ipynb"', chapter), "the .ipynb download is gone"


def test_mathjax_is_served_locally(built_book):
    page = (built_book / f"{_book_pages()[1]}.html").read_text(encoding="utf-8")
    scripts = re.findall(r'<script[^>]+src="([^"]*mathjax[^"]*)"', page, flags=re.I)
    assert scripts, "no MathJax script on the chapter page"
    assert all(not urlsplit(src).scheme for src in scripts), f"MathJax loads from the network: {scripts}"
