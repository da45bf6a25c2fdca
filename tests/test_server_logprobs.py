"""Log-probabilities (issue 43): the engine's and the server's, in OpenAI's shapes.

They are the model's raw log-probabilities, ``log_softmax`` of its scores before temperature
and penalties (as vLLM gives them by default): equal to ``log_softmax`` of ``forward`` on the
same tokens within 1e-5, whatever the sampling. ``echo`` with ``max_tokens: 0`` gives the
prompt's own (the first token's is null), what lm-eval's loglikelihood asks for.
"""

from __future__ import annotations

import pytest
import torch

openai = pytest.importorskip("openai", reason="the openai client is not installed")

from test_server import build_model_dir, running, serve_model_dir  # noqa: E402

from minitransformer.chat import apply_chat_template  # noqa: E402
from minitransformer.serving import Request  # noqa: E402

ATOL = 1e-5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    record = serve_model_dir(build_model_dir(tmp_path_factory.mktemp("logprobs")))
    with running(record.app) as url:
        record.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield record
    assert record.engine.num_free_blocks == record.engine.num_blocks


def forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    """``log_softmax`` of ``forward``'s scores at every position of ``ids``: ``(T, V)``."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    logits = logits[0] if isinstance(logits, tuple) else logits
    return torch.log_softmax(logits[0].float(), dim=-1)


def assert_matches(reference: torch.Tensor, position: int, token: int, value: float,
                   top: list[tuple[int, float]], k: int) -> None:
    assert value == pytest.approx(reference[position, token].item(), abs=ATOL)
    values, ids = reference[position].topk(k)
    assert [t for t, _ in top] == ids.tolist()
    assert [v for _, v in top] == pytest.approx(values.tolist(), abs=ATOL)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0},
                                      {"temperature": 1.7, "seed": 3, "top_p": 0.9,
                                       "presence_penalty": 1.5, "frequency_penalty": 0.5}])
def test_the_engine_s_logprobs_are_log_softmax_of_forward_whatever_the_sampling(served,
                                                                                sampling):
    engine, tokenizer = served.engine, served.tokenizer
    prompt = tokenizer.encode("The cat sat on")
    (done,) = engine.run([Request(prompt, max_tokens=8, logprobs=4, prompt_logprobs=True,
                                  stop_token_ids=[], **sampling)])
    ids = prompt + done.token_ids
    reference = forward_logprobs(engine.model, ids)
    assert len(done.logprobs) == len(done.token_ids) == 8
    for k, entry in enumerate(done.logprobs):
        assert entry.token_id == done.token_ids[k]
        assert_matches(reference, len(prompt) + k - 1, entry.token_id, entry.logprob,
                       list(entry.top), 4)
    assert done.prompt_logprobs[0] is None and len(done.prompt_logprobs) == len(prompt)
    for k, entry in enumerate(done.prompt_logprobs[1:], start=1):
        assert entry.token_id == prompt[k]
        assert_matches(reference, k - 1, prompt[k], entry.logprob, list(entry.top), 4)
    assert engine.num_free_blocks == engine.num_blocks


def test_chat_logprobs_are_openai_s_shape_and_forward_s_values_streamed_or_not(served):
    engine, tokenizer = served.engine, served.tokenizer
    messages = [{"role": "user", "content": "Why attention?"}]
    ids = apply_chat_template(tokenizer, messages, add_generation_prompt=True)
    (done,) = engine.run([Request(ids, max_tokens=6, temperature=0, logprobs=0)])
    reference = forward_logprobs(engine.model, ids + done.token_ids)
    answer = served.client.chat.completions.create(
        model=served.name, messages=messages, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=3)
    content = answer.choices[0].logprobs.content
    ends = engine.eos_ids
    written = [t for t in done.token_ids if t not in ends]
    assert len(content) == len(written) and written
    assert b"".join(bytes(e.bytes) for e in content).decode() == \
        answer.choices[0].message.content
    for k, entry in enumerate(content):
        token = done.token_ids[k]
        assert entry.bytes == list(tokenizer.token_bytes(token))
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 3 and entry.token == tokenizer.token_bytes(token).decode()
        assert entry.logprob == pytest.approx(reference[len(ids) + k - 1, token].item(),
                                              abs=ATOL)
        values = reference[len(ids) + k - 1].topk(3).values.tolist()
        assert top == pytest.approx(values, abs=ATOL)
    stream = served.client.chat.completions.create(
        model=served.name, messages=messages, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=3, stream=True)
    streamed = [e for chunk in stream for c in chunk.choices if c.logprobs
                for e in c.logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    plain = served.client.chat.completions.create(model=served.name, messages=messages,
                                                  max_tokens=6, temperature=0, top_logprobs=0)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == answer.choices[0].message.content


def test_echo_with_max_tokens_0_gives_the_prompt_s_logprobs_as_lm_eval_reads_them(served):
    engine, tokenizer = served.engine, served.tokenizer
    prompt = tokenizer.encode("Once upon a time there")
    reference = forward_logprobs(engine.model, prompt)
    for given in (prompt, tokenizer.decode(prompt)):
        answer = served.client.completions.create(model=served.name, prompt=given,
                                                  max_tokens=0, echo=True, logprobs=2,
                                                  temperature=0)
        (choice,) = answer.choices
        assert choice.text == tokenizer.decode(prompt)
        assert answer.usage.completion_tokens == 0 and answer.usage.prompt_tokens == len(prompt)
        lp = choice.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(prompt) and "".join(lp.tokens) == choice.text
        for k in range(1, len(prompt)):
            assert lp.token_logprobs[k] == pytest.approx(reference[k - 1, prompt[k]].item(),
                                                         abs=ATOL)
            # the two likeliest, and the token itself
            best = reference[k - 1].topk(2).values.tolist()
            assert max(lp.top_logprobs[k].values()) == pytest.approx(best[0], abs=ATOL)
            assert lp.top_logprobs[k][lp.tokens[k]] == lp.token_logprobs[k]
        assert lp.text_offset == [sum(map(len, lp.tokens[:k])) for k in range(len(prompt))]


def test_completion_logprobs_streamed_equal_the_whole_answer_s(served):
    request = {"model": served.name, "prompt": "Attention is", "max_tokens": 5,
               "temperature": 0, "logprobs": 3, "echo": True}
    whole = served.client.completions.create(**request).choices[0]
    assert len(whole.logprobs.tokens) == len(served.tokenizer.encode("Attention is")) + 5
    tokens, values = [], []
    text = ""
    for chunk in served.client.completions.create(**request, stream=True):
        for c in chunk.choices:
            text += c.text
            if c.logprobs:
                tokens += c.logprobs.tokens
                values += c.logprobs.token_logprobs
    assert text == whole.text
    assert tokens == whole.logprobs.tokens and values == whole.logprobs.token_logprobs
