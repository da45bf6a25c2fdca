"""The intro's and the README's openings describe the whole course, as far as it goes today.

Issue 29 found the intro still ending at chapter 12 and the README at chapter 13 when the book had
15 chapters, and both promising "every chapter runs in under a minute" when chapters 13-15 took up
to 99 s. A new chapter fails here until both openings name it and the measured run times cover it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAST = max(int(path.name[:2]) for path in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))


def _intro_opening() -> str:
    text = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    return text[:text.index("\n## ")]


def _readme_opening() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[:text.index("\n## ")]


def _names_chapter(text: str, number: int) -> bool:
    """'chapter 15', 'chapters 13 to 15', 'chapters 13–15' or 'chapter 15)'."""
    return re.search(rf"\bchapters? (?:\d+ ?(?:to|–|-|and) ?)?{number}\b", text) is not None


@pytest.mark.parametrize("opening", [_intro_opening, _readme_opening], ids=["intro", "README"])
def test_the_opening_reaches_the_last_chapter(opening):
    text = opening()
    assert _names_chapter(text, LAST), f"the opening does not name chapter {LAST}"


@pytest.mark.parametrize("opening", [_intro_opening, _readme_opening], ids=["intro", "README"])
def test_run_times_are_measured_and_cover_the_last_chapter(opening):
    text = opening()
    assert not re.search(r"every chapter runs[^.]*under a minute", text)
    times = re.search(r"[Mm]easured[^.]*\.", text) or re.search(r"[^.]*\bmeasured\b[^.]*", text)
    assert times, "no measured run times in the opening"
    assert re.search(rf"\b{LAST}\b[^.]*\b(s|min|minutes?|seconds)\b", text), (
        f"the run times do not say how long chapter {LAST} takes")
