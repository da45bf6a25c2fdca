"""Real clients against the server (issue 43): lm-eval and LangChain.

lm-eval 0.4.13's ``local-completions`` model (``/v1/completions``, with ``echo`` and
``logprobs`` for log-likelihoods) runs a multiple-choice task and a generation task, defined in
``tests/data/lm_eval`` over local JSON Lines, against the server on a small course model; its
accuracy, every choice's log-likelihood and every generated text equal those of lm-eval's own
``hf`` model (transformers, on the CPU) on the same directory, with requests sent as token ids
and as text. LangChain's ``ChatOpenAI`` (invoke, stream, batch) and ``OpenAI`` (batch over a
list of prompts) get what the ``openai`` client gets.
"""

from __future__ import annotations

import os

import pytest

os.environ["HF_DATASETS_OFFLINE"] = "1"        # before datasets is imported
os.environ["HF_HUB_OFFLINE"] = "1"

import lm_eval  # noqa: E402
import openai  # noqa: E402
from langchain_openai import ChatOpenAI, OpenAI  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from test_server import ROOT, build_model_dir, running, serve_model_dir  # noqa: E402

TASKS = ["minitransformer_mc", "minitransformer_gen"]
CONTEXT = 128


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = build_model_dir(tmp_path_factory.mktemp("clients"), context_length=CONTEXT)
    record = serve_model_dir(folder)
    with running(record.app) as url:
        record.url, record.folder = url, folder
        record.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield record
    assert record.engine.num_free_blocks == record.engine.num_blocks


def evaluate(model: str, model_args: dict, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(ROOT)                     # the YAML's data_files are relative to it
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    return lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=TASKS, batch_size=1, log_samples=True,
        task_manager=TaskManager(include_path=str(ROOT / "tests" / "data" / "lm_eval")))


def summary(results: dict) -> tuple:
    """The accuracy and exact match (4 decimals), and every sample's responses."""
    scores = (round(results["results"]["minitransformer_mc"]["acc,none"], 4),
              round(results["results"]["minitransformer_gen"]["exact_match,none"], 4))
    mc = [[(round(ll, 4), greedy) for (ll, greedy) in s["filtered_resps"]]
          for s in results["samples"]["minitransformer_mc"]]
    gen = [s["filtered_resps"] for s in results["samples"]["minitransformer_gen"]]
    return scores, mc, gen


@pytest.fixture(scope="module")
def with_hf(served, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        return summary(evaluate("hf", {"pretrained": str(served.folder), "device": "cpu"},
                                tmp_path_factory.mktemp("hf"), monkeypatch))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("tokenized", [True, False])
def test_lm_eval_local_completions_scores_as_lm_eval_s_hf_model(served, with_hf, tokenized,
                                                               tmp_path, monkeypatch):
    scores, mc, gen = with_hf
    assert len(mc) == 6 and len(gen) == 5 and any(g[0] for g in gen)
    got = summary(evaluate("local-completions", {
        "base_url": f"{served.url}/v1/completions", "model": served.name,
        "tokenized_requests": tokenized, "tokenizer": str(served.folder),
        "tokenizer_backend": "huggingface", "max_length": CONTEXT, "num_concurrent": 1,
        "max_retries": 1}, tmp_path, monkeypatch))
    assert got == (scores, mc, gen)


def test_langchain_chat_invoke_stream_and_batch_get_what_openai_gets(served):
    def expected(text: str) -> str:
        return served.client.chat.completions.create(
            model=served.name, messages=[{"role": "user", "content": text}], max_tokens=8,
            temperature=0).choices[0].message.content

    chat = ChatOpenAI(model=served.name, base_url=f"{served.url}/v1", api_key="unused",
                      temperature=0, max_tokens=8, max_retries=0)
    turns = ["Why attention?", "Hello there", "A story"]
    answers = [expected(t) for t in turns]
    assert len(set(answers)) == 3
    assert chat.invoke(turns[0]).content == answers[0]
    assert "".join(chunk.content for chunk in chat.stream(turns[1])) == answers[1]
    assert [m.content for m in chat.batch(turns)] == answers


def test_langchain_openai_batch_with_a_list_prompt(served):
    prompts = ["The cat", "Once upon", "Attention is"]
    answer = served.client.completions.create(model=served.name, prompt=prompts,
                                              max_tokens=6, temperature=0)
    expected = [c.text for c in answer.choices]
    llm = OpenAI(model=served.name, base_url=f"{served.url}/v1", api_key="unused",
                 temperature=0, max_tokens=6, max_retries=0, batch_size=3)
    assert llm.batch(prompts) == expected
    assert llm.invoke(prompts[1]) == expected[1]
