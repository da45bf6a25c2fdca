"""The chat page that ``minitransformer serve`` shows at ``/`` (chapter 18), in Chromium.

Debian's Chromium, driven by Playwright (never ``playwright install``: no browser is
downloaded), opens the page of a server running in this process. A reader types a message: the
answer appears piece by piece while it streams, and is the reply that ``minitransformer chat``
prints; a second turn sends the whole conversation and gets chat's second reply. The answer is
shown as Markdown built from DOM nodes, so that text such as ``<img onerror>`` or ``<script>``
stays text. Stop and New chat abort the request, and the server cancels it and frees its
blocks; a reply of an abandoned chat never reaches the next request. The page is one file,
loads nothing from elsewhere and needs no build step.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from test_server import (  # noqa: E402
    build_model_dir,
    cli_chat,
    running,
    serve_model_dir,
    wait_until,
)

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
    # the model's text is never parsed as HTML
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(",
                         html)


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
        const text = last && last.dataset.text;
        if (last && window.seen[window.seen.length - 1] !== text) window.seen.push(text);
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
    return page.locator(".message.assistant").last.get_attribute("data-text")


def shown_texts(page) -> list[str]:
    """Each bubble's text: the user's as shown, the assistant's as written (before Markdown)."""
    return page.evaluate("""() => [...document.querySelectorAll('.message')].map(
        (m) => m.dataset.text ?? m.textContent)""")


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
    assert shown_texts(page) == [TURNS[0], expected[0], TURNS[1], expected[1]]
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


# ----- Markdown, safely -----------------------------------------------------------------------

HOSTILE = ("Use **bold** and `x < y`, *really*:\n\n```python\nprint('<b>no</b>')\n"
           "if a < b: pass\n```\n\n- one <img src=x onerror=\"window.pwned=1\">\n"
           "- two <script>window.pwned=2</script>\n\n1. first\n2. **second**\n\n"
           "# Title\nlast <b>line</b>\nand <iframe src=javascript:alert(1)>")


def fake_stream(route, text: str, pieces: int = 7) -> None:
    """Answer the page's request with ``text`` in server-sent events, as the server would."""
    size = -(-len(text) // pieces)
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [{"choices": [{"index": 0, "delta": {"content": text[k:k + size]}}]}
               for k in range(0, len(text), size)]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=body)


def test_the_answer_is_markdown_and_the_model_s_html_stays_text(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("() => document.getElementById('model').textContent !== "
                           "'the model'")
    page.route("**/v1/chat/completions", lambda route: fake_stream(route, HOSTILE))
    try:
        assert ask(page, "Show me") == HOSTILE
    finally:
        page.unroute("**/v1/chat/completions")
    answer = page.locator(".message.assistant").last
    structure = answer.evaluate("""(a) => ({
        tags: [...a.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()),
        strong: [...a.querySelectorAll('strong')].map((e) => e.textContent),
        em: [...a.querySelectorAll('em')].map((e) => e.textContent),
        code: [...a.querySelectorAll('p code')].map((e) => e.textContent),
        pre: [...a.querySelectorAll('pre > code')].map((e) => e.textContent),
        ul: [...a.querySelectorAll('ul > li')].map((e) => e.textContent),
        ol: [...a.querySelectorAll('ol > li')].map((e) => e.textContent),
        heading: [...a.querySelectorAll('h4')].map((e) => e.textContent),
    })""")
    assert set(structure["tags"]) <= {"p", "strong", "em", "code", "pre", "ul", "ol", "li",
                                      "h4"}, structure["tags"]
    assert structure["strong"] == ["bold", "second"] and structure["em"] == ["really"]
    assert structure["code"] == ["x < y"]
    assert structure["pre"] == ["print('<b>no</b>')\nif a < b: pass"]
    assert structure["ul"] == ['one <img src=x onerror="window.pwned=1">',
                               "two <script>window.pwned=2</script>"]
    assert structure["ol"] == ["first", "second"] and structure["heading"] == ["Title"]
    assert "last <b>line</b>" in answer.text_content()
    assert page.evaluate("() => document.querySelectorAll("
                         "'#log img, #log script, #log b, #log iframe').length") == 0
    page.wait_for_timeout(200)                      # an image's onerror would have run
    assert page.evaluate("() => window.pwned") is None


def test_a_text_streamed_in_pieces_is_rendered_as_it_grows(page, served):
    """An open code fence while streaming is a code block up to the end of the text."""
    page.goto(served.url + "/")
    page.evaluate(WATCH_ANSWERS)
    text = "Code:\n```\n<script>window.pwned=3</script>\nx = 1\n```\ndone"
    page.route("**/v1/chat/completions", lambda route: fake_stream(route, text, pieces=12))
    try:
        assert ask(page, "code") == text
    finally:
        page.unroute("**/v1/chat/completions")
    assert len(page.evaluate("window.seen")) >= 5
    assert page.locator(".message.assistant pre code").last.text_content() == (
        "<script>window.pwned=3</script>\nx = 1")
    assert page.evaluate("() => window.pwned") is None


# ----- Stop and New chat -----------------------------------------------------------------------

def _start_long_answer(page, served, text: str) -> int:
    """Send ``text`` with room for 40 slow tokens; once a piece of the answer shows, the id
    of its request in the engine."""
    before = {e.request_id for e in served.events}
    served.delay = 0.05                             # 40 tokens: 2 s
    page.fill("#max-tokens", "40")
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function("() => { const a = document.querySelectorAll('.message.assistant');"
                           " return a.length && a[a.length - 1].dataset.text; }")
    assert wait_until(lambda: any(e.request_id not in before for e in served.events))
    return next(e.request_id for e in served.events if e.request_id not in before)


def _finish_of(served, request_id: int) -> str | None:
    return next((e.finish_reason for e in served.events
                 if e.request_id == request_id and e.finish_reason), None)


def test_new_chat_aborts_the_answer_and_the_server_frees_it(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("() => document.getElementById('model').textContent !== "
                           "'the model'")
    page.requests.clear()
    request_id = _start_long_answer(page, served, "Tell me more")
    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    assert not page.is_disabled("#send") and page.is_hidden("#stop")
    # the server saw the disconnect: cancelled in the engine, its blocks free
    assert wait_until(lambda: _finish_of(served, request_id) == "cancelled", 10)
    assert wait_until(lambda: served.engine.num_free_blocks == served.engine.num_blocks, 10)
    served.delay = 0.0
    page.fill("#max-tokens", str(LIMIT))
    page.wait_for_timeout(300)          # the abandoned request has had time to come back
    assert page.locator(".message").count() == 0 and page.inner_text("#error") == ""
    assert ask(page, "Hi") == cli_chat(served.folder, ["Hi"], LIMIT)[0]
    last = [r for r in page.requests if r.method == "POST"][-1].post_data_json
    assert last["messages"] == [{"role": "user", "content": "Hi"}]    # nothing carried over
    assert shown_texts(page) == ["Hi", cli_chat(served.folder, ["Hi"], LIMIT)[0]]


def test_stop_ends_the_answer_keeps_what_was_written_and_frees_the_request(page, served):
    page.goto(served.url + "/")
    page.wait_for_function("() => document.getElementById('model').textContent !== "
                           "'the model'")
    page.requests.clear()
    assert page.is_hidden("#stop")
    request_id = _start_long_answer(page, served, "A story")
    assert page.is_visible("#stop")
    page.click("#stop")
    page.wait_for_function("() => !document.getElementById('send').disabled "
                           "&& !document.querySelector('.pending')")
    assert page.is_hidden("#stop") and page.inner_text("#error") == ""
    assert wait_until(lambda: _finish_of(served, request_id) == "cancelled", 10)
    assert wait_until(lambda: served.engine.num_free_blocks == served.engine.num_blocks, 10)
    partial = page.locator(".message.assistant").last.get_attribute("data-text")
    full = cli_chat(served.folder, ["A story"], 40)[0]
    assert partial and full.startswith(partial) and len(partial) < len(full)
    served.delay = 0.0
    page.fill("#max-tokens", "3")
    ask(page, "Go on")
    last = [r for r in page.requests if r.method == "POST"][-1].post_data_json
    assert last["messages"] == [{"role": "user", "content": "A story"},
                                {"role": "assistant", "content": partial},
                                {"role": "user", "content": "Go on"}]


# ----- a server with an API key ----------------------------------------------------------------

def test_with_an_api_key_the_page_asks_for_it_and_sends_it(page, served):
    from minitransformer.server import create_app

    app = create_app(served.engine, served.tokenizer, model_name="keyed", api_key="k-123")
    with running(app) as url:
        page.goto(url + "/")
        page.wait_for_function("() => document.getElementById('error').textContent !== ''")
        assert "API key" in page.inner_text("#error") and page.is_visible("#api-key")
        page.fill("#api-key", "wrong")
        page.fill("#max-tokens", "3")
        page.fill("#input", "Hi")
        page.press("#input", "Enter")
        page.wait_for_function("() => document.getElementById('error').textContent"
                               ".includes('incorrect')")
        assert page.input_value("#input") == "Hi" and page.locator(".message").count() == 0
        page.fill("#api-key", "k-123")
        assert ask(page, "Hi") == cli_chat(served.folder, ["Hi"], 3)[0]
        assert page.inner_text("#model") == "keyed"
