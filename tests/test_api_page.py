"""The API reference page (book/api.md, built by autodoc): every public name, each with its chapter.

A name added to ``minitransformer.__all__`` without an entry in book/api.md fails here. The entry
must sit under the module that defines the name (its id is ``module.name``), show a signature, and
link to a chapter. Skipped only when the book is not built outside CI (CI=true: a failure).
"""

from __future__ import annotations

import html.parser
import os
import re
import sys
from pathlib import Path

import pytest
from helpers import wait_for_book

import minitransformer

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "_build" / "html" / "book" / "api.html"
CHAPTER_LINK = re.compile(r"(?:\./)?\d\d_[\w-]+\.html(?:#.*)?")


@pytest.fixture(scope="module")
def api_page() -> str:
    wait_for_book()
    if not API_PAGE.exists():
        message = "the API page is not built: run `make book` (make test builds it first)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return API_PAGE.read_text(encoding="utf-8")


class _Entries(html.parser.HTMLParser):
    """Each documented object's id -> (its signature text, the links in its description)."""

    def __init__(self) -> None:
        super().__init__()
        self.signature: dict[str, str] = {}
        self.links: dict[str, list[str]] = {}
        self._dt: str | None = None  # inside the <dt> of this id
        self._last_dt: str | None = None  # the <dd> that opens next describes this id
        self._dd: list[str | None] = []  # open <dd> elements, innermost last

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "dt" and "sig-object" in (attrs.get("class") or "") and attrs.get("id"):
            self._dt = self._last_dt = attrs["id"]
            self.signature[self._dt], self.links[self._dt] = "", []
        elif tag == "dd":
            self._dd.append(self._last_dt)
            self._last_dt = None
        if tag == "a" and attrs.get("href"):
            for owner in self._dd:
                if owner:
                    self.links[owner].append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "dt":
            self._dt = None
        elif tag == "dd" and self._dd:
            self._dd.pop()

    def handle_data(self, data):
        if self._dt:
            self.signature[self._dt] += data


def _entries(page: str) -> _Entries:
    parser = _Entries()
    parser.feed(page)
    return parser


def _defining_module(name: str) -> str:
    """The module a public name comes from: its __module__, or for a constant the module holding it."""
    obj = getattr(minitransformer, name)
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module.startswith("minitransformer.") and not isinstance(obj, str):
        return module
    holders = sorted(module_name for module_name, module in sys.modules.items()
                     if module_name.startswith("minitransformer.")
                     and getattr(module, name, None) is obj)
    assert holders, f"cannot tell which module defines minitransformer.{name}"
    return holders[0]


def _public() -> list[tuple[str, str]]:
    return [(name, f"{_defining_module(name)}.{name}") for name in minitransformer.__all__]


@pytest.mark.parametrize("name", sorted(minitransformer.__all__))
def test_public_name_has_an_entry_with_signature_and_chapter(api_page, name):
    target = f"{_defining_module(name)}.{name}"
    entries = _entries(api_page)
    kind = ("autoclass" if isinstance(getattr(minitransformer, name), type)
            else "autofunction" if callable(getattr(minitransformer, name)) else "autodata")
    assert target in entries.signature, (
        f"book/api.md has no entry for `{name}`: add `.. {kind}:: {target}` under its module's "
        "heading, followed by the chapter that teaches it")
    signature = entries.signature[target]
    assert name in signature, f"{target}: the entry does not show its name: {signature!r}"
    if callable(getattr(minitransformer, name)):
        assert "(" in signature, f"{target}: the entry shows no signature: {signature!r}"
    chapters = [href for href in entries.links[target] if CHAPTER_LINK.fullmatch(href)]
    assert chapters, f"{target}: the entry links to no chapter (Taught in :doc:`...`)"


def test_every_module_section_links_to_a_chapter(api_page):
    modules = sorted({target.rsplit(".", 1)[0] for _, target in _public()})
    sections = dict(re.findall(r'<section id="(minitransformer-[\w-]+)">(.*?)(?=<section id=|\Z)',
                               api_page, flags=re.S))
    for module in modules:
        slug = module.replace(".", "-").replace("_", "-")  # Sphinx's ids: paged_cache -> paged-cache
        anchor = next((key for key in sections if key.startswith(slug + "-")), None)
        assert anchor, f"book/api.md has no section for {module}"
        head = sections[anchor].split('<dl class="py', 1)[0]
        hrefs = re.findall(r'href="([^"]+)"', head)
        assert any(CHAPTER_LINK.fullmatch(href) for href in hrefs), (
            f"the {module} section names no chapter before its entries")
