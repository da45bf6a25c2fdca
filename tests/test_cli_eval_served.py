"""``minitransformer eval --model http://host:port`` (issue 45): a model that ``python -m
minitransformer serve`` runs in a subprocess, scored through its ``/v1/completions`` (``echo``
and ``logprobs``) and tokenized by its ``/tokenize``, gives what ``eval`` gives on the model
directory in this process: every choice's log-likelihood within 1e-4 and the same accuracies
(HellaSwag, MMLU), each text's negative log-likelihood to a relative 1e-6 through windows
shorter than the text (perplexity), and the same greedy answers (GSM8K). The model is a small
Llama with weights moved off their initial values, so that choices differ in likelihood.
"""

from __future__ import annotations

import json
import socket

import pytest
import torch
from cli_helpers import one_thread, run  # noqa: F401  (one_thread: an autouse fixture)
from helpers import perturbed
from test_cli_serve import Served

from minitransformer import evaluation as ev
from minitransformer.bpe import BPETokenizer
from minitransformer.llama import Llama, LlamaConfig
from minitransformer.served import ServedModel

CONTEXT = 512
ITEMS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = BPETokenizer.from_pretrained("tests/data/gpt2_tiny")
    torch.manual_seed(0)
    model = perturbed(Llama(LlamaConfig(vocab_size=len(tokenizer), context_length=CONTEXT,
                                        num_layers=2, num_heads=4, num_kv_heads=2,
                                        d_model=32, d_ff=64)))
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


@pytest.fixture(scope="module")
def served(model_dir):
    server = Served(model_dir[0])
    try:
        yield server
    finally:
        server.close()


def both(model_dir, served, tmp_path, *flags) -> tuple[dict, dict]:
    """``eval FLAGS --json`` on the directory and on the server: the two JSON objects."""
    written = []
    for name, model in (("here", model_dir[0]), ("served", served.url)):
        out = tmp_path / f"{name}.json"
        status, _, stderr = run("eval", "--model", model, *flags, "--json", out)
        assert (status, stderr) == (0, ""), (name, stderr)
        written.append(json.loads(out.read_text()))
    return written[0], written[1]


@pytest.mark.parametrize("task", ["hellaswag", "mmlu"])
def test_multiple_choice_log_likelihoods_equal_the_model_here(model_dir, served, tmp_path, task):
    tokenizer = model_dir[1]
    here, there = both(model_dir, served, tmp_path, "--task", task, "--limit", ITEMS)
    item = ev.hellaswag_item if task == "hellaswag" else ev.mmlu_item
    with open(f"tests/data/eval/{task}.jsonl") as f:
        docs = [item(json.loads(line)) for line in f][:ITEMS]
    longest = max(len(tokenizer.encode(context + " " + choice))
                  for context, choices, _ in docs for choice in choices)
    assert longest < CONTEXT - 1          # read whole by both: no item is cut
    assert len(here["per_item"]) == len(there["per_item"]) == ITEMS
    for ours, theirs in zip(here["per_item"], there["per_item"]):
        assert ours["log_likelihoods"] == pytest.approx(theirs["log_likelihoods"], abs=1e-4)
        assert (ours["label"], ours["acc"], ours["acc_norm"]) == (
            theirs["label"], theirs["acc"], theirs["acc_norm"])
        assert max(ours["log_likelihoods"]) - min(ours["log_likelihoods"]) > 1e-2
    for key in ("acc", "acc_norm", "acc_stderr", "acc_norm_stderr"):
        assert here[key] == there[key], key


def test_perplexity_equals_the_model_here_through_windows(model_dir, served, tmp_path):
    tokenizer = model_dir[1]
    with open("tests/data/eval/gsm8k.jsonl") as f:
        answers = [json.loads(line)["answer"] for line in f]
    texts = ["\n\n".join(answers[i:i + 4]) for i in (0, 4, 8)]
    assert min(len(tokenizer.encode(t)) for t in texts) > CONTEXT   # several windows of 200
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    here, there = both(model_dir, served, tmp_path, "--task", "perplexity", "--data", data,
                       "--window", 200, "--stride", 120)
    for ours, theirs in zip(here["per_item"], there["per_item"], strict=True):
        # a sum over hundreds of tokens: float32 sums here, float64 of each token's there
        assert ours["nll"] == pytest.approx(theirs["nll"], rel=1e-6)
        assert (ours["num_tokens"], ours["num_bytes"]) == (theirs["num_tokens"],
                                                           theirs["num_bytes"])
    for key in ("perplexity", "bits_per_byte", "perplexity_stderr", "bits_per_byte_stderr"):
        assert here[key] == pytest.approx(there[key], rel=1e-6), key


def test_gsm8k_answers_equal_the_model_here(model_dir, served, tmp_path):
    here, there = both(model_dir, served, tmp_path, "--task", "gsm8k", "--limit", 6,
                       "--max-new-tokens", 12)
    answers = [item["answer"] for item in here["per_item"]]
    assert answers == [item["answer"] for item in there["per_item"]]
    assert all(answers) and len(set(answers)) > 1
    assert here["exact_match"] == there["exact_match"]


def test_the_served_model_tokenizes_as_the_server_s_tokenizer(model_dir, served):
    tokenizer = model_dir[1]
    remote = ServedModel(served.url + "/v1")
    assert remote.context_length == CONTEXT and remote.window == CONTEXT - 2
    text = "The man walks to the barbell. " * 200       # longer than the context: /tokenize
    assert remote.encode(text) == tokenizer.encode(text)        # takes it
    assert remote.decode(tokenizer.encode("héllo")) == "héllo"
    assert remote.token_id("<|endoftext|>") == tokenizer.special_tokens["<|endoftext|>"]
    with pytest.raises(ValueError, match="does not serve 'gpt-4'"):
        ServedModel(served.url, model="gpt-4")


def test_server_mistakes_are_one_line_and_exit_2(served, tmp_path):
    with socket.socket() as s:           # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases = [
        ([unreachable, "--task", "mmlu"], f"cannot reach {unreachable}"),
        ([served.url, "--task", "mmlu", "--served-model", "gpt-4"], "does not serve 'gpt-4'"),
        ([served.url + "/nothing", "--task", "mmlu"], "HTTP 404"),
        ([served.url, "--task", "perplexity", "--data", "tests/data/german.txt", "--window",
          CONTEXT], f"window must be at most {CONTEXT - 2}"),
    ]
    for flags, message in cases:
        status, stdout, stderr = run("eval", "--model", *flags)
        assert status == 2 and stdout == "", flags
        assert stderr.count("\n") == 1 and message in stderr, (flags, stderr)

