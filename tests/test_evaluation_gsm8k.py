"""GSM8K scored as lm-eval 0.4.13 scores it: the greedy answer to ``Question: ...\\nAnswer:``
and the last number in it, against the number after ``####``.

The rule is lm-eval's own, read from its installed ``gsm8k.yaml``: the ``flexible-extract``
filter (the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``) and ``exact_match`` with its
``regexes_to_ignore`` (commas, ``$``, the solution before ``####``, a final dot). Our
:func:`~minitransformer.evaluation.extract_last_number` gives the same number on every answer
whose last number is written as people write numbers (digits, thousands commas, a decimal part
not ending in 0). They differ on zeros after a decimal point (``18.00``: ours reads 18, lm-eval's
``18.00`` misses the target 18) and on runs that are no number (``14...``, ``1.2.3``), which
lm-eval's pattern takes whole.

Then a tiny Llama whose head can only write digits, spaces, dots, commas, ``-`` and line breaks
answers 12 questions: ``eval --task gsm8k`` writes the same text as lm-eval's ``hf`` model
(greedy, cut at the same ``until``) and, where its last number is well formed, the same number
out of it.
"""

import json
import re
from pathlib import Path

import lm_eval_helpers as helpers
import pytest
import torch
import yaml
from cli_helpers import one_thread, run  # noqa: F401  (one_thread: an autouse fixture)

from minitransformer import evaluation as ev
from minitransformer.bpe import BPETokenizer
from minitransformer.evaluation import GSM8K_STOP as STOP
from minitransformer.llama import Llama, LlamaConfig

EOS = 756           # <|endoftext|> of tests/data/gpt2_tiny


def lm_eval_rule() -> dict:
    """lm-eval's gsm8k task, as installed."""
    import lm_eval
    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    return yaml.safe_load(path.read_text())


def lm_eval_extract(answers: list[str]) -> list[str]:
    """lm-eval's flexible-extract filter, then its metric's normalisation of a prediction."""
    from lm_eval.filters.extraction import RegexFilter

    task = lm_eval_rule()
    (flexible,) = [f for f in task["filter_list"] if f["name"] == "flexible-extract"]
    regex = flexible["filter"][0]
    found = RegexFilter(regex["regex_pattern"], regex["group_select"]).apply(
        [[a] for a in answers], [{}] * len(answers))
    metric = task["metric_list"][0]
    out = []
    for (text,) in found:
        for pattern in metric["regexes_to_ignore"]:
            text = re.sub(pattern, "", text)
        out.append(text.lower() if metric["ignore_case"] else text)
    return out


def lm_eval_exact_match(answers: list[str], solutions: list[str]) -> list[float]:
    """lm-eval's exact_match of each answer against its solution (``...#### 18``)."""
    from lm_eval.api.metrics import exact_match_hf_evaluate

    metric = lm_eval_rule()["metric_list"][0]
    return [float(exact_match_hf_evaluate(
        [text], [solution], regexes_to_ignore=metric["regexes_to_ignore"],
        ignore_case=metric["ignore_case"],
        ignore_punctuation=metric["ignore_punctuation"])["exact_match"])
        for text, solution in zip(lm_eval_extract(answers), solutions)]


WELL_FORMED = re.compile(r"-?\$?(\d{1,3}(,\d{3})+|\d+)(\.\d*[1-9])?")


def well_formed(answer: str) -> bool:
    """Whether the last number lm-eval's pattern finds in ``answer`` (less a final dot or
    comma) is a number as people write one: digits, thousands commas, a decimal part that
    does not end in 0; or there is none. On these the two rules agree."""
    found = re.findall(r"-?[$0-9.,]{2,}|-?[0-9]+", answer)
    return not found or bool(WELL_FORMED.fullmatch(re.sub(r"[.,]$", "", found[-1])))


def test_the_last_number_is_lm_eval_s_flexible_extract():
    docs = helpers.read("gsm8k")
    solutions = [d["answer"] for d in docs]
    targets = [ev.gsm8k_target(d) for d in docs]
    # the reference solutions themselves (their last number is the answer), and each one
    # scored against the next question's answer: hits and misses on real text
    answers, against = solutions * 2, solutions + solutions[1:] + solutions[:1]
    ours = ev.exact_match([ev.extract_last_number(a) for a in answers],
                          [ev.gsm8k_target({"answer": s}) for s in against])
    assert ours == lm_eval_exact_match(answers, against)
    assert sum(ours[:100]) == 100 and sum(ours[100:]) < 10
    written = [" 18", " 1,200 eggs.", " $1,200", "She pays $18.", " -3 degrees", " 18 + 6 = 24",
               "The answer is 24. ", " 2 or 3 and then 4", " no number at all", " 3-4",
               " 0.5 of 10 is 5", "1. 2. 3. 4.", " 5%", " 7,"]
    wanted = ["18", "1200", "1200", "18", "-3", "24", "24", "4", "4", "-4", "5", "4", "5", "7"]
    ours = ev.exact_match([ev.extract_last_number(a) for a in written], wanted)
    assert ours == lm_eval_exact_match(written, [f"#### {w}" for w in wanted])
    assert ours == [1.0] * 8 + [0.0] + [1.0] * 5
    assert [ev.extract_last_number(a) for a in written][:3] == lm_eval_extract(written)[:3]
    differ = [" 18.00", " The answer is 14...", " 1.2.14"]
    assert ev.exact_match([ev.extract_last_number(a) for a in differ],
                          ["18", "14", "14"]) == [1.0, 1.0, 0.0]
    assert lm_eval_exact_match(differ, ["#### 18", "#### 14", "#### 1214"]) == [0.0] * 3
    assert not any(well_formed(a) for a in differ)
    assert all(well_formed(a) for a in written + solutions)
    assert targets[:3] == [ev.extract_last_number(s.split("####")[-1]) for s in solutions[:3]]


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A tiny Llama whose head writes only tokens made of digits and ``" .,-\\n"``."""
    tokenizer = BPETokenizer.from_pretrained(helpers.DATA.parent / "gpt2_tiny")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(tokenizer), context_length=512, num_layers=2,
                              num_heads=4, num_kv_heads=2, d_model=32, d_ff=64))
    allowed = set(b"0123456789 .,-\n")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for i in range(len(tokenizer)):
            if i == EOS or not set(tokenizer.token_bytes(i)) <= allowed:
                model.head.weight[i] = 0.0
        model.head.weight.mul_(4.0)
    folder = tmp_path_factory.mktemp("digits")
    model.save_pretrained(folder, eos_token_id=EOS)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer, folder


GSM8K_LOCAL = """task: gsm8k_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
num_fewshot: 0
doc_to_text: {doc_to_text}
doc_to_target: {doc_to_target}
generation_kwargs:
  until: {until}
  do_sample: false
  max_gen_toks: {tokens}
filter_list: {filters}
metric_list: {metrics}
"""


def test_eval_gsm8k_answers_and_numbers_equal_lm_eval_s(digits_model, tmp_path):
    model, tokenizer, folder = digits_model
    docs = helpers.read("gsm8k")[:12]
    task = lm_eval_rule()
    (tmp_path / "gsm8k_local.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "gsm8k_local.yaml").write_text(GSM8K_LOCAL.format(
        data=tmp_path / "gsm8k_local.jsonl", doc_to_text=json.dumps(task["doc_to_text"]),
        doc_to_target=json.dumps(task["doc_to_target"]), until=json.dumps(STOP), tokens=24,
        filters=json.dumps(task["filter_list"]), metrics=json.dumps(task["metric_list"])))
    output = helpers.run_lm_eval(folder, tmp_path, ["gsm8k_local"])
    samples = sorted((s for s in output["samples"]["gsm8k_local"]      # one per filter
                      if s["filter"] == "flexible-extract"), key=lambda s: s["doc_id"])
    theirs = [s["resps"][0][0] for s in samples]
    out = tmp_path / "ours.json"
    status, _, stderr = run("eval", "--model", folder, "--task", "gsm8k", "--limit", 12,
                            "--max-new-tokens", 24, "--json", out)
    assert (status, stderr) == (0, "")
    ours = json.loads(out.read_text())["per_item"]
    assert [item["answer"] for item in ours] == theirs
    assert [s["arguments"][0][0] for s in samples] == [
        f"Question: {d['question']}\nAnswer:" for d in docs]
    numbers = [ev.extract_last_number(a) for a in theirs]
    assert sum(n is not None and len(n) > 1 for n in numbers) >= 4     # numbers to read
    compared = 0
    for answer, mine, lm_evals in zip(theirs, [i["extracted"] for i in ours],
                                      lm_eval_extract(theirs)):
        if well_formed(answer):
            assert (mine or "[invalid]") == lm_evals, answer
            compared += mine is not None
    assert compared >= 8            # 12 of 12 when written
    flexible = [s["exact_match"] for s in samples]     # the last filter's, flexible-extract
    assert flexible == lm_eval_exact_match(theirs, [d["answer"] for d in docs])
