"""``minitransformer eval``: the scores of minitransformer.evaluation on a model directory and
on a GGUF file that ``quantize`` wrote, printed and written as JSON; every mistake one line on
stderr and exit status 2. (A server's URL: tests/test_cli_eval_served.py.)"""

import json

import pytest
import torch
from cli_helpers import one_thread, run  # noqa: F401  (one_thread: an autouse fixture)

from minitransformer import evaluation as ev
from minitransformer.bpe import BPETokenizer
from minitransformer.gguf import GGUFFile, write_gguf
from minitransformer.llama import Llama, LlamaConfig

DATA = "tests/data/eval"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = BPETokenizer.from_pretrained("tests/data/gpt2_tiny")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(tokenizer), context_length=256, num_layers=1,
                              num_heads=2, d_model=32, d_ff=64))
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model.eval(), tokenizer


@pytest.mark.parametrize("task, item", [("hellaswag", ev.hellaswag_item),
                                        ("mmlu", ev.mmlu_item)])
def test_multiple_choice_scores_and_json(model_dir, tmp_path, task, item):
    folder, model, tokenizer = model_dir
    out = tmp_path / "scores.json"
    status, stdout, stderr = run("eval", "--model", folder, "--task", task, "--limit", 12,
                                 "--json", out)
    assert (status, stderr) == (0, "")
    with open(f"{DATA}/{task}.jsonl") as f:
        docs = [json.loads(line) for line in f][:12]
    scores = ev.score_multiple_choice(model, tokenizer, [item(d) for d in docs])
    written = json.loads(out.read_text())
    assert written["items"] == 12 and written["task"] == task
    for metric in ("acc", "acc_norm"):
        mean, stderr = ev.mean_stderr([getattr(s, metric) for s in scores])
        assert written[metric] == pytest.approx(mean)
        assert written[f"{metric}_stderr"] == pytest.approx(stderr)
        assert f"{metric}: {round(mean, 4)}" in stdout


@pytest.fixture(scope="module")
def gguf_file(model_dir, tmp_path_factory):
    """The model as the GGUF file ``quantize --to q8_0`` writes."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.q8_0.gguf"
    status, _, stderr = run("quantize", model_dir[0], "--to", "q8_0", "--out", path)
    assert status == 0, stderr
    return path


def test_a_gguf_file_scores_as_its_model_loaded_here(gguf_file, tmp_path):
    out = tmp_path / "scores.json"
    status, _, stderr = run("eval", "--model", gguf_file, "--task", "hellaswag", "--limit", 8,
                            "--json", out)
    assert (status, stderr) == (0, "")
    model, tokenizer = Llama.from_gguf(gguf_file), BPETokenizer.from_gguf(gguf_file)
    with open(f"{DATA}/hellaswag.jsonl") as f:
        docs = [ev.hellaswag_item(json.loads(line)) for line in f][:8]
    expected = ev.score_multiple_choice(model, tokenizer, docs)
    written = json.loads(out.read_text())
    assert [item["log_likelihoods"] for item in written["per_item"]] == [
        s.log_likelihoods for s in expected]
    assert written["acc"] == pytest.approx(ev.mean_stderr([s.acc for s in expected])[0])


def test_perplexity_of_a_text(model_dir, tmp_path):
    folder, model, tokenizer = model_dir
    text = "The man walks to the barbell and lifts it over his head. " * 30
    (tmp_path / "text.txt").write_text(text)
    out = tmp_path / "scores.json"
    status, _, stderr = run("eval", "--model", folder, "--task", "perplexity", "--data",
                            tmp_path / "text.txt", "--stride", 128, "--json", out)
    assert (status, stderr) == (0, "")
    expected = ev.score_text(model, tokenizer, text, prefix_id=756, stride=128)
    written = json.loads(out.read_text())
    assert written["bits_per_byte"] == pytest.approx(expected.bits_per_byte)
    assert written["perplexity"] == pytest.approx(expected.perplexity)


def test_perplexity_of_documents_has_standard_errors(model_dir, tmp_path):
    folder, model, tokenizer = model_dir
    texts = ["The man walks to the barbell.", "He lifts it over his head, and smiles.",
             "A woman sits on a roof; it is raining."]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "scores.json"
    status, _, stderr = run("eval", "--model", folder, "--task", "perplexity", "--data",
                            tmp_path / "docs.jsonl", "--json", out)
    assert (status, stderr) == (0, "")
    scores = [ev.score_text(model, tokenizer, t, prefix_id=756) for t in texts]
    written = json.loads(out.read_text())
    assert written["perplexity"] == pytest.approx(ev.TextScore.combine(scores).perplexity)
    assert written["perplexity_stderr"] == pytest.approx(ev.perplexity_stderr(scores)[1])
    assert written["bits_per_byte_stderr"] == pytest.approx(ev.bits_per_byte_stderr(scores)[1])
    assert written["perplexity_stderr"] > 0


def test_gsm8k_exact_match(model_dir, tmp_path):
    folder, _, _ = model_dir
    out = tmp_path / "scores.json"
    status, stdout, stderr = run("eval", "--model", folder, "--task", "gsm8k", "--limit", 2,
                                 "--max-new-tokens", 3, "--json", out)
    assert (status, stderr) == (0, "")
    assert json.loads(out.read_text())["exact_match"] == 0.0   # a random model, 3 tokens
    assert "exact_match: 0.0" in stdout


def test_mistakes_are_one_line_and_exit_2(model_dir, gguf_file, tmp_path):
    folder, _, _ = model_dir
    source = GGUFFile(gguf_file)
    not_llama = tmp_path / "gpt2.gguf"          # the same file, said to be another architecture
    write_gguf(not_llama, {**source.metadata, "general.architecture": "gpt2"},
               {"token_embd.weight": torch.zeros(4, 4)}, types=source.metadata_types)
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("not a GGUF file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "choices": ["a", "b"], "label": 0}\n{"query": "q"}\n')
    existing = tmp_path / "exists.json"
    existing.write_text("mine")
    cases = [
        (["--model", tmp_path / "none", "--task", "mmlu"], "no such directory or .gguf file"),
        (["--model", tmp_path, "--task", "mmlu"], "not a model directory"),
        (["--model", not_llama, "--task", "mmlu"], "general.architecture is 'gpt2', not "
                                                   "'llama'"),
        (["--model", not_gguf, "--task", "mmlu"], "text.gguf"),
        (["--model", folder, "--task", "mmlu", "--api-key", "k"], "for a server's URL"),
        (["--model", folder, "--task", "perplexity", "--data", "tests/data/german.txt",
          "--window", 300], "window must be at most 256"),
        (["--model", folder, "--task", "perplexity", "--data", "tests/data/german.txt",
          "--stride", 300], "stride must be at most window=256"),
        (["--model", folder, "--task", "arc"], "invalid choice"),
        (["--model", folder, "--task", "perplexity"], "needs --data"),
        (["--model", folder, "--task", "hellaswag", "--data", bad], "bad.jsonl:2 has no"),
        (["--model", folder, "--task", "hellaswag", "--data", tmp_path / "no.jsonl"],
         "no such file"),
        (["--model", folder, "--task", "mmlu", "--json", existing], "exists"),
        (["--model", folder, "--task", "mmlu", "--limit", 0], "at least 1"),
    ]
    for flags, message in cases:
        status, stdout, stderr = run("eval", *flags)
        assert status == 2 and stdout == "", flags
        assert stderr.count("\n") == 1 and message in stderr, (flags, stderr)
    assert existing.read_text() == "mine"


def test_smollm2_s_gguf_file_scores_as_the_stored_full_run(tmp_path):
    """``--model smollm2``: the cached GGUF file; its first HellaSwag items' log-likelihoods
    are those experiments/chapter20_evaluation.py stored (Llama.from_gguf, to 6 decimals)."""
    out = tmp_path / "scores.json"
    status, _, stderr = run("eval", "--model", "smollm2", "--task", "hellaswag", "--limit", 3,
                            "--device", "cpu", "--json", out)
    assert (status, stderr) == (0, "")
    with open("experiments/chapter20_evaluation.json") as f:
        stored = json.load(f)["hellaswag"]["Q4_1"][:3]
    written = [item["log_likelihoods"] for item in json.loads(out.read_text())["per_item"]]
    for ours, theirs in zip(written, stored, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-4)
