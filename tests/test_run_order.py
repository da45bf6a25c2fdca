"""How `make test` runs the suite: the files longest first with the built pages' tests last
(helpers.run_order, used by tests/conftest.py), and the wait for the book built beside the tests
(helpers.wait_for_book)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers import BOOK_PAGE_TESTS, BOOK_STATUS_VAR, run_order, wait_for_book

ROOT = Path(__file__).resolve().parent.parent


def test_longest_file_first_book_pages_last_and_each_file_in_order():
    seconds = {"book/16.ipynb": 130.0, "tests/test_a.py": 5.0, "tests/test_book_pages.py": 70.0}
    nodeids = ["tests/test_a.py::one", "tests/test_book_pages.py::pages", "tests/test_new.py::x",
               "book/16.ipynb::Cell 0", "tests/test_a.py::two", "book/16.ipynb::Cell 1"]
    ordered = sorted(nodeids, key=lambda nodeid: run_order(nodeid, seconds))
    assert ordered == ["book/16.ipynb::Cell 0", "book/16.ipynb::Cell 1", "tests/test_a.py::one",
                       "tests/test_a.py::two", "tests/test_new.py::x",  # unmeasured: 1 s
                       "tests/test_book_pages.py::pages"]


def test_the_table_names_files_that_exist_with_positive_seconds():
    table = json.loads((ROOT / "tests" / "durations.json").read_text(encoding="utf-8"))
    assert len(table) > 100
    missing = [name for name in table if not (ROOT / name).is_file()]
    assert not missing, f"tests/durations.json names files that are gone: {missing}"
    assert all(value >= 0 for value in table.values())
    assert all(name in table for name in BOOK_PAGE_TESTS)


def test_run_by_hand_nothing_is_awaited(monkeypatch):
    monkeypatch.delenv(BOOK_STATUS_VAR, raising=False)
    wait_for_book(timeout=0)


def test_a_finished_build_lets_the_pages_be_tested(monkeypatch, tmp_path):
    status = tmp_path / "book.status"
    monkeypatch.setenv(BOOK_STATUS_VAR, str(status))

    def finish():
        time.sleep(1.5)
        status.write_text("0\n")

    writer = threading.Thread(target=finish)
    writer.start()
    started = time.monotonic()
    wait_for_book(timeout=60)
    writer.join()
    assert time.monotonic() - started >= 1.0    # it waited for the status


def test_a_failed_build_fails_the_pages_tests(monkeypatch, tmp_path):
    status = tmp_path / "book.status"
    status.write_text("2\n")
    monkeypatch.setenv(BOOK_STATUS_VAR, str(status))
    with pytest.raises(pytest.fail.Exception, match="book build failed .exit status 2"):
        wait_for_book(timeout=5)


def test_a_build_that_never_ends_fails_after_the_timeout(monkeypatch, tmp_path):
    monkeypatch.setenv(BOOK_STATUS_VAR, str(tmp_path / "book.status"))
    with pytest.raises(pytest.fail.Exception, match="wrote no status"):
        wait_for_book(timeout=1.5)
