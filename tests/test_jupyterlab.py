"""The notebooks as a learner sees them in JupyterLab (`make lab`), with jupyterlab-myst.

Starts `jupyter lab` on a free port over a copy of one chapter (so nothing can write to book/),
opens it in Debian's Chromium through Playwright and checks what the learner sees: every markdown
cell rendered by MyST, `{exercise}` as numbered exercise boxes, `{solution-start}` as a folded
"Solution to" box, maths typeset, links to other chapters as links to their files (with the
extension, so that JupyterLab opens the notebook), no raw directive text, and each solution code
cell (`"jupyter": {"source_hidden": true}`) folded. Skipped only where Chromium is missing, and
never under CI=true. The server and its kernel are stopped afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# Render every cell at once (no windowing), no news pop-up over the page, never save anything.
LAB_SETTINGS = {
    "notebook-extension/tracker": {"windowingMode": "none"},
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "docmanager-extension/plugin": {"autosave": False},
}
STARTUP_SECONDS = 90  # a busy shared 2-core machine; about 5 s when quiet


def _chapter() -> Path:
    """The first chapter notebook with a gated solution."""
    for notebook in sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb")):
        if "{solution-start}" in notebook.read_text(encoding="utf-8"):
            return notebook
    pytest.fail("no chapter notebook has a {solution-start}")


def _markdown(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    chromium = shutil.which("chromium")
    if chromium is None:
        message = "Chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    home = tmp_path_factory.mktemp("lab")
    notebook = _chapter()
    shutil.copy(notebook, home / notebook.name)
    for name, values in LAB_SETTINGS.items():
        plugin, _, file = name.partition("/")
        path = home / "settings" / "@jupyterlab" / plugin / f"{file}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
         "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={home}",
         f"--LabApp.user_settings_dir={home / 'settings'}",
         f"--LabApp.workspaces_dir={home / 'workspaces'}"],
        cwd=home, stdout=subprocess.DEVNULL, stderr=(home / "server.log").open("w"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log = (home / "server.log").read_text(encoding="utf-8")[-2000:]
                    pytest.fail(f"jupyter lab did not start:\n{log}")
                time.sleep(0.5)
        yield chromium, f"http://127.0.0.1:{port}/lab/tree/{notebook.name}", notebook, home
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the kernel it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture(scope="module")
def rendered(lab):
    """The notebook's cells as JupyterLab shows them, once every markdown cell is rendered."""
    chromium, url, notebook, home = lab
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.wait_for_function(
                "n => document.querySelectorAll('.jp-MarkdownCell .myst').length >= n",
                arg=len(_markdown(notebook)), timeout=STARTUP_SECONDS * 1000)
            page.wait_for_timeout(500)
            view = page.evaluate("""() => {
                const markdown = [...document.querySelectorAll(".jp-MarkdownCell .myst")].filter(m => !m.parentElement.closest(".myst"));
                const code = [...document.querySelectorAll('.jp-CodeCell')];
                return {
                    text: markdown.map(m => m.innerText),
                    // {solution-end} renders as an untitled box of the same class: skip it
                    exercises: markdown.flatMap(m => [...m.querySelectorAll('aside.myst-exercise')])
                        .map(e => (e.querySelector('.myst-exercise-title') || e).innerText.trim())
                        .filter(title => title !== ''),
                    solutions: markdown.flatMap(m => [...m.querySelectorAll('details.myst-exercise')])
                        .map(e => ({title: e.querySelector('summary').innerText.trim(), open: e.open})),
                    maths: markdown.reduce((n, m) => n + m.querySelectorAll('.katex').length, 0),
                    links: markdown.flatMap(m => [...m.querySelectorAll('a[href]')])
                        .map(a => a.getAttribute('href')),
                    folded: code.filter(c => c.querySelector('.jp-InputPlaceholder')).length,
                    codeCells: code.length,
                };
            }""")
            exercise = page.locator("aside.myst-exercise").first
            exercise.scroll_into_view_if_needed()
            page.screenshot(path=str(home / "exercise.png"))
        finally:
            browser.close()
    return view, notebook


def test_exercises_render_as_numbered_boxes(rendered):
    view, notebook = rendered
    titles = [re.search(r"\{exercise\}\s*(.*)", m).group(1).strip()
              for m in _markdown(notebook) if "{exercise}" in m]
    assert len(view["exercises"]) == len(titles), (
        f"{notebook.name}: {len(titles)} exercises, {len(view['exercises'])} rendered as boxes")
    for number, (shown, title) in enumerate(zip(view["exercises"], titles), start=1):
        assert shown.startswith(f"Exercise {number}") and title in shown, (
            f"exercise {number} is titled {shown!r}, expected 'Exercise {number} ({title})'")


def test_solutions_render_as_folded_boxes(rendered):
    view, notebook = rendered
    starts = sum("{solution-start}" in m for m in _markdown(notebook))
    assert len(view["solutions"]) == starts, (
        f"{notebook.name}: {starts} solutions, {len(view['solutions'])} rendered as boxes")
    assert all("Solution to" in s["title"] and not s["open"] for s in view["solutions"]), view["solutions"]


def test_solution_code_cells_are_folded(rendered):
    view, notebook = rendered
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    hidden = sum(c["cell_type"] == "code" and c["metadata"].get("jupyter", {}).get("source_hidden")
                 is True for c in cells)
    starts = sum("{solution-start}" in m for m in _markdown(notebook))
    assert hidden >= starts, (f"{notebook.name}: {starts} solutions but only {hidden} code cells "
                              "with source_hidden")
    assert view["folded"] == hidden, (f"{notebook.name}: {hidden} code cells with source_hidden, "
                                      f"{view['folded']} folded in JupyterLab")


def test_no_raw_myst_markup_maths_typeset_and_doc_links(rendered):
    view, notebook = rendered
    raw = [line for text in view["text"] for line in text.splitlines()
           if re.search(r"```|:::|\{(exercise|solution-start|solution-end|doc|numref|math)\}", line)]
    assert not raw, "markup shown raw in JupyterLab:\n" + "\n".join(raw[:10])
    markdown = "\n".join(_markdown(notebook))
    if "$" in markdown:
        assert view["maths"] > 0, "the maths is not typeset"
    # links to other chapters are [text](07_x.ipynb), which JupyterLab opens as the notebook
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not re.match(r"[a-z]+:|#", t)]
    assert targets, f"{notebook.name} links to no other page: the link check would test nothing"
    unlinked = [t for t in targets if not any(t.split("#")[0] in href for href in view["links"])]
    assert not unlinked, f"links not rendered with their file name: {unlinked}"
