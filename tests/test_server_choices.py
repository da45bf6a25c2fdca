"""Several prompts and ``n`` choices in one request (issue 43).

``/v1/completions`` takes a string, a list of strings, a list of token ids, or a list of lists
of them; each prompt is a choice (in index order), and all of a request's choices go into the
engine together, so that they share its steps. ``n`` choices per prompt, for both endpoints:
choice ``j`` is seeded with ``seed + j``, so it is the request with ``n=1`` and that seed.
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai", reason="the openai client is not installed")

from test_server import build_model_dir, running, serve_model_dir  # noqa: E402

PROMPTS = ["The cat", "Once upon", "Attention is", "Hello"]
HI = [{"role": "user", "content": "Tell me more"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    record = serve_model_dir(build_model_dir(tmp_path_factory.mktemp("choices")))
    with running(record.app) as url:
        record.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield record
    assert record.engine.num_free_blocks == record.engine.num_blocks


def alone(served, prompt, **options) -> str:
    answer = served.client.completions.create(model=served.name, prompt=prompt, max_tokens=6,
                                              **options)
    (choice,) = answer.choices
    return choice.text


@pytest.mark.parametrize("as_ids", [False, True])
def test_several_prompts_are_several_choices_in_order_run_as_one_batch(served, as_ids):
    prompts = [served.tokenizer.encode(p) for p in PROMPTS] if as_ids else PROMPTS
    expected = [alone(served, p, temperature=0) for p in prompts]
    assert len(set(expected)) == len(expected)
    served.in_flight.clear()
    answer = served.client.completions.create(model=served.name, prompt=prompts, max_tokens=6,
                                              temperature=0)
    assert served.in_flight[0] == len(PROMPTS)          # all in the engine's first step
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert [c.text for c in answer.choices] == expected
    assert answer.usage.completion_tokens == 24
    assert answer.usage.prompt_tokens == sum(len(served.tokenizer.encode(p)) for p in PROMPTS)
    streamed = ["", "", "", ""]
    for chunk in served.client.completions.create(model=served.name, prompt=prompts,
                                                  max_tokens=6, temperature=0, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == expected


def test_n_seeded_completions_are_each_the_request_alone_with_seed_plus_index(served):
    expected = [[alone(served, p, temperature=1.5, seed=7 + j) for j in range(3)]
                for p in PROMPTS[:2]]
    assert all(len(set(row)) == 3 for row in expected), expected
    answer = served.client.completions.create(model=served.name, prompt=PROMPTS[:2], n=3,
                                              max_tokens=6, temperature=1.5, seed=7)
    assert [c.index for c in answer.choices] == list(range(6))
    assert [c.text for c in answer.choices] == [t for row in expected for t in row]


@pytest.mark.parametrize("stream", [False, True])
def test_n_chat_choices_are_each_the_request_alone_with_seed_plus_index(served, stream):
    def ask(**options):
        return served.client.chat.completions.create(model=served.name, messages=HI,
                                                     max_tokens=8, temperature=1.5,
                                                     **options)
    expected = [ask(seed=11 + j).choices[0].message.content for j in range(3)]
    assert len(set(expected)) == 3
    if stream:
        got = ["", "", ""]
        for chunk in ask(seed=11, n=3, stream=True):
            for c in chunk.choices:
                got[c.index] += c.delta.content or ""
    else:
        got = [c.message.content for c in ask(seed=11, n=3).choices]
    assert got == expected
