"""references.bib, the bibliography page's source: every entry says who, what and when.

A reader who meets a citation in the text looks it up in the bibliography and should find who
wrote or published it, its title and a date. Where the author of a blog post or notes is not
known, the entry says where it was published (`howpublished`, or an `organization`) and gives the
date the course's copy was taken (`urldate`) instead of inventing either.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = parse_file(str(ROOT / "references.bib"), bib_format="bibtex").entries
AUTHOR_LIKE = ("author", "editor")          # people, parsed by pybtex into entry.persons
PUBLISHER_LIKE = ("organization", "howpublished", "institution")
DATES = ("year", "date", "urldate")


def test_the_bibliography_has_entries():
    assert len(ENTRIES) > 20


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_every_entry_says_who_what_and_when(key):
    entry = ENTRIES[key]
    fields = {name.lower(): value.strip() for name, value in entry.fields.items()}
    who = [role for role in AUTHOR_LIKE if entry.persons.get(role)]
    who += [name for name in PUBLISHER_LIKE if fields.get(name)]
    assert who, f"{key}: no author, editor, organization or howpublished"
    assert fields.get("title"), f"{key}: no title"
    dates = [name for name in DATES if fields.get(name)]
    assert dates, f"{key}: no year, date or urldate"


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_dates_are_well_formed(key):
    fields = {name.lower(): value.strip() for name, value in ENTRIES[key].fields.items()}
    if "year" in fields:
        assert re.fullmatch(r"(19|20)\d\d", fields["year"]), f"{key}: year {fields['year']!r}"
    for name in ("date", "urldate"):
        if name in fields:
            assert re.fullmatch(r"(19|20)\d\d(-\d\d(-\d\d)?)?", fields[name]), (
                f"{key}: {name} {fields[name]!r} is not YYYY, YYYY-MM or YYYY-MM-DD")
    if "url" in fields:
        assert fields["url"].startswith("https://"), f"{key}: url {fields['url']!r}"
