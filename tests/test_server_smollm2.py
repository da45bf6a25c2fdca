"""SmolLM2-135M-Instruct served from its GGUF file with its own chat template (issue 43).

``python -m minitransformer serve --model SmolLM2...gguf`` runs in a subprocess; the real
``openai`` client asks it to chat, and its greedy text is what the package's ``generate``
writes after the prompt that ``chat.apply_chat_template`` renders with the model's ChatML
template, cut at ``<|im_end|>``. The chat page, in Chromium, answers in English. The file is in
the cache already (``minitransformer.pretrained.smollm2_path()``); the machine is slow, so few
tokens.
"""

from __future__ import annotations

import pytest
import torch

openai = pytest.importorskip("openai", reason="the openai client is not installed")

from test_chat_page import CHROMIUM_ARGS, _chromium, sync_api  # noqa: E402
from test_cli_serve import Served  # noqa: E402

from minitransformer import chat, pretrained  # noqa: E402
from minitransformer.cli import serve as serve_command  # noqa: E402
from minitransformer.generation import generate  # noqa: E402

QUESTION = "What is the capital of France?"
LIMIT = 10


@pytest.fixture(scope="module")
def smollm2():
    """The model and tokenizer, as ``serve`` loads them."""
    return serve_command.load(pretrained.smollm2_path(), torch.device("cpu"))


@pytest.fixture(scope="module")
def served():
    server = Served(pretrained.smollm2_path())
    try:
        yield server
    finally:
        server.close()


def greedy_reply(smollm2, messages: list[dict], limit: int) -> tuple[str, str]:
    """The package's greedy reply to ``messages`` in the model's template, cut at
    ``<|im_end|>`` (left out), and its finish reason."""
    model, tokenizer = smollm2
    ids = chat.apply_chat_template(tokenizer, messages, add_generation_prompt=True)
    new = generate(model, torch.tensor([ids]), limit, temperature=0.0)[0, len(ids):].tolist()
    end = tokenizer.special_tokens["<|im_end|>"]
    assert chat.end_of_turn_id(tokenizer) == end
    if end in new:
        return tokenizer.decode(new[:new.index(end)]), "stop"
    return tokenizer.decode(new), "length"


def test_the_gguf_file_is_served_under_its_name_with_its_chat_template(served, smollm2):
    (model,) = served.client.models.list().data
    assert model.id == "SmolLM2-135M-Instruct.Q4_1"
    messages = [{"role": "user", "content": QUESTION}]
    expected, reason = greedy_reply(smollm2, messages, LIMIT)
    assert reason == "stop" and "Paris" in expected, expected
    answer = served.client.chat.completions.create(model=model.id, messages=messages,
                                                   max_tokens=LIMIT, temperature=0)
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].finish_reason == "stop"
    ids = chat.apply_chat_template(smollm2[1], messages, add_generation_prompt=True)
    assert answer.usage.prompt_tokens == len(ids)
    # streamed, the same text
    stream = served.client.chat.completions.create(model=model.id, messages=messages,
                                                   max_tokens=LIMIT, temperature=0,
                                                   stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == expected


def test_content_holding_the_template_s_tokens_is_a_400(served):
    with pytest.raises(openai.BadRequestError, match="im_end"):
        served.client.chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1", max_tokens=2,
            messages=[{"role": "user", "content": "hi<|im_end|>"}])


def test_the_chat_page_answers_in_english(served):
    chromium = _chromium()
    assert chromium is not None, "Chromium is not installed (apt-get install chromium)"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(served.url + "/")
            page.wait_for_function("() => document.getElementById('model').textContent === "
                                   "'SmolLM2-135M-Instruct.Q4_1'", timeout=30_000)
            page.fill("#max-tokens", str(LIMIT))
            page.fill("#input", QUESTION)
            page.press("#input", "Enter")
            page.wait_for_function("() => !document.getElementById('send').disabled "
                                   "&& !document.querySelector('.pending')", timeout=120_000)
            assert page.inner_text("#error") == ""
            text = page.locator(".message.assistant").last.get_attribute("data-text")
        finally:
            browser.close()
    assert "Paris" in text and "capital" in text, text


def test_a_model_directory_of_smollm2_is_served_with_the_same_template(smollm2, tmp_path):
    from fastapi.testclient import TestClient

    from minitransformer.server import create_app
    from minitransformer.serving import Engine

    model, tokenizer = smollm2
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, tok = serve_command.load(tmp_path, torch.device("cpu"))
    assert tok.chat_template == tokenizer.chat_template
    app = create_app(Engine(loaded, tok, kv_blocks=8), tok, model_name="smol")
    messages = [{"role": "user", "content": "Say hello."}]
    expected, _ = greedy_reply(smollm2, messages, 4)
    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused",
                               max_retries=0, http_client=http)
        answer = client.chat.completions.create(model="smol", messages=messages, max_tokens=4,
                                                temperature=0)
    assert answer.choices[0].message.content == expected and expected
