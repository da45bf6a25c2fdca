"""How `make test` runs the suite: the files longest first, the built pages' tests once enough
work is handed out (helpers.file_order, used by tests/conftest.py), and the wait for the book
built beside the tests (helpers.wait_for_book)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers import (BOOK_PAGE_TESTS, BOOK_PAGES_AFTER, BOOK_STATUS_VAR, file_order,
                     wait_for_book)

ROOT = Path(__file__).resolve().parent.parent


def test_longest_file_first_and_the_book_pages_after_enough_work():
    seconds = {"book/16.ipynb": 500.0, "tests/test_a.py": 150.0, "tests/test_b.py": 20.0,
               "tests/test_book_pages.py": 70.0, "tests/test_api_page.py": 18.0}
    files = ["tests/test_a.py", "tests/test_api_page.py", "tests/test_new.py",
             "tests/test_book_pages.py", "book/16.ipynb", "tests/test_b.py"]
    # 500 + 150 s of work pass BOOK_PAGES_AFTER (600): the pages come next; unmeasured: 1 s
    assert file_order(files, seconds) == [
        "book/16.ipynb", "tests/test_a.py", "tests/test_api_page.py", "tests/test_book_pages.py",
        "tests/test_b.py", "tests/test_new.py"]
    assert BOOK_PAGES_AFTER == 600
    # too little work in all: the pages come last
    assert file_order(["tests/test_book_pages.py", "tests/test_b.py"], seconds) == [
        "tests/test_b.py", "tests/test_book_pages.py"]


def test_the_collected_items_follow_the_file_order(request):
    """conftest's hook has ordered this very run: each file's tests together, files in
    file_order's order (when the whole suite runs: this file alone is trivially in order)."""
    names = [item.nodeid.split("::")[0] for item in request.session.items]
    files = list(dict.fromkeys(names))
    assert names == sorted(names, key=files.index)          # each file's tests together
    table = json.loads((ROOT / "tests" / "durations.json").read_text(encoding="utf-8"))
    assert files == file_order(files, table)


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


def test_the_memory_of_a_worker_is_measured():
    """conftest gives memory back after a file that leaves the worker above GIVE_BACK_ABOVE_MB:
    that needs the worker's resident memory, read on Linux (elsewhere 0: nothing is done)."""
    import sys

    from conftest import GIVE_BACK_ABOVE_MB, _resident_mb

    if sys.platform.startswith("linux"):
        assert 50 < _resident_mb() < 1_000_000
    assert GIVE_BACK_ABOVE_MB == 3000
