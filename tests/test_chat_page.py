"""The chat page that ``minitransformer serve`` shows at ``/`` (chapter 18), in Chromium.

Debian's Chromium, driven by Playwright (never ``playwright install``: no browser is
downloaded), opens the page of a server running in this process. A reader types a message: the
answer appears piece by piece while it streams, and is the reply that ``minitransformer chat``
prints; a second turn sends the whole conversation and gets chat's second reply. The page is one
file, loads nothing from elsewhere and needs no build step.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from test_server import build_model_dir, cli_chat, running, serve_model_dir  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "minitransformer" / "static" / "chat.html"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
LIMIT = 12
TURNS = ["Hello there", "and then?"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_the_page_is_one_file_with_nothing_from_elsewhere():
    html = PAGE.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", html), "loads another file"
    assert not re.search(r"https?://|//cdn|import\s", html), "refers to another site"
    assert html.count("<script>") == 1 and "fetch(\"/v1/chat/completions\"" in html


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = build_model_dir(tmp_path_factory.mktemp("chat-page"))
    record = serve_model_dir(folder)
    record.delay = 0.05                         # a token every 50 ms: the stream shows
    with running(record.app) as url:
        record.url, record.folder = url, folder
        yield record


@pytest.fixture(scope="module")
def page(served):
    chromium = _chromium()
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.requests = []
        page.on("request", lambda request: page.requests.append(request))
        yield page
        browser.close()


WATCH_ANSWERS = """() => {
    window.seen = [];                 // every text the last answer showed, in order
    new MutationObserver(() => {
        const answers = document.querySelectorAll(".message.assistant");
        const last = answers[answers.length - 1];
        if (last && window.seen[window.seen.length - 1] !== last.textContent)
            window.seen.push(last.textContent);
    }).observe(document.getElementById("log"),
               {childList: true, subtree: true, characterData: true});
}"""


def ask(page, text: str) -> str:
    """Type ``text``, press Enter, wait for the answer to finish; its text."""
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function("() => !document.getElementById('send').disabled "
                           "&& !document.querySelector('.pending')", timeout=30_000)
    assert page.inner_text("#error") == ""
    return page.locator(".message.assistant").last.text_content()


def test_an_answer_streams_in_and_a_second_turn_keeps_the_conversation(page, served):
    expected = cli_chat(served.folder, TURNS, LIMIT)
    assert all(expected) and expected[1] != cli_chat(served.folder, TURNS[1:], LIMIT)[0]
    page.goto(served.url + "/")
    page.wait_for_function(f"() => document.getElementById('model').textContent === "
                           f"'{served.name}'")
    page.fill("#max-tokens", str(LIMIT))
    page.evaluate(WATCH_ANSWERS)

    assert ask(page, TURNS[0]) == expected[0]
    shown = [text for text in page.evaluate("window.seen") if text]
    # streamed: the answer grew piece by piece before it was whole
    assert len(shown) >= 3 and shown[-1] == expected[0], shown
    assert all(expected[0].startswith(text) for text in shown), shown

    assert ask(page, TURNS[1]) == expected[1]
    bubbles = page.locator(".message").all_text_contents()
    assert bubbles == [TURNS[0], expected[0], TURNS[1], expected[1]]
    posts = [r for r in page.requests if r.method == "POST"]
    assert [r.url for r in posts] == [served.url + "/v1/chat/completions"] * 2
    second = posts[1].post_data_json
    assert second["stream"] is True and second["temperature"] == 0
    assert second["messages"] == [{"role": "user", "content": TURNS[0]},
                                  {"role": "assistant", "content": expected[0]},
                                  {"role": "user", "content": TURNS[1]}]
    assert all(r.url.startswith(served.url + "/") for r in page.requests)


def test_a_refused_turn_shows_the_server_s_message_and_can_be_sent_again(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("() => document.getElementById('model').textContent !== "
                           "'the model'")
    page.fill("#max-tokens", "1000")                # past the model's context
    page.fill("#input", "Hi")
    page.press("#input", "Enter")
    page.wait_for_function("() => document.getElementById('error').textContent !== ''")
    assert "context" in page.inner_text("#error")
    assert page.locator(".message").count() == 0    # the turn did not happen...
    assert page.input_value("#input") == "Hi"       # ...and its text is back in the box
    page.fill("#max-tokens", "3")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('.message').length === 2 "
                           "&& !document.querySelector('.pending')")
    assert page.inner_text("#error") == ""
