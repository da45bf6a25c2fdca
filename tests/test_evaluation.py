"""minitransformer.evaluation against direct computations (one unpadded forward per sequence,
statistics by hand and by scipy); lm-eval itself is the reference in test_evaluation_lm_eval.py.
"""

import itertools
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from scipy import stats

from minitransformer import evaluation as ev
from minitransformer.bpe import BPETokenizer
from minitransformer.gpt import GPT, GPTConfig
from minitransformer.llama import Llama, LlamaConfig

DATA = Path(__file__).resolve().parent / "data"
TOKENIZER = BPETokenizer.from_pretrained(DATA / "gpt2_tiny")
TEXT = ("The man walks to the barbell. He bends down, grabs the pole and lifts the weight "
        "over his head; the crowd cheers. Then he drops it and walks away, smiling.")


@pytest.fixture(scope="module", params=["llama", "gpt"])
def model(request):
    torch.manual_seed(0)
    if request.param == "llama":
        m = Llama(LlamaConfig(vocab_size=len(TOKENIZER), context_length=16, num_layers=2,
                              num_heads=4, num_kv_heads=2, d_model=32, d_ff=64))
    else:
        m = GPT(GPTConfig(vocab_size=len(TOKENIZER), context_length=16, num_layers=2,
                          num_heads=4, d_model=32))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))   # scores far from uniform
    return m.eval()


def direct_log_probs(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1, one unpadded forward (of the last 17 ids)."""
    ids = ids[-17:]
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0][0]
    log_probs = torch.log_softmax(logits.double(), -1)
    return [log_probs[t - 1, ids[t]].item() for t in range(1, len(ids))]


def test_log_likelihoods_equal_direct_sums(model):
    texts = ["A man is sitting on a roof.", "he", "The lady", "lifts the weight over her head."]
    pairs = [(TOKENIZER.encode(a), TOKENIZER.encode(" " + b)) for a in texts for b in texts]
    got = ev.log_likelihoods(model, pairs, batch_size=5)
    for (context, continuation), (ll, greedy) in zip(pairs, got):
        ids = (context + continuation)[-17:]
        expected = direct_log_probs(model, ids)[-len(continuation):]
        assert ll == pytest.approx(sum(expected), abs=1e-4)
        with torch.no_grad():
            best = model(torch.tensor([ids[:-1]]))[0][0, -len(continuation):].argmax(-1)
        assert greedy == (best.tolist() == continuation)


def test_continuation_tokens_moves_trailing_spaces():
    context, continuation = ev.continuation_tokens(TOKENIZER, "The man  ", "walks")
    assert context == TOKENIZER.encode("The man")
    assert context + continuation == TOKENIZER.encode("The man  walks")


def test_score_choices_acc_and_acc_norm(model):
    context, choices = "The man walks to the", ["barbell.", "crowd that cheers loudly.", "pole"]
    lls = []
    for choice in choices:
        c, k = ev.continuation_tokens(TOKENIZER, context, " " + choice)
        lls.append(sum(direct_log_probs(model, c + k)[-len(k):]))
    for label in range(3):
        got = ev.score_choices(model, TOKENIZER, context, choices, label)
        assert got.log_likelihoods == pytest.approx(lls, abs=1e-4)
        assert got.acc == float(max(range(3), key=lambda i: lls[i]) == label)
        norm = [ll / len(c) for ll, c in zip(lls, choices)]
        assert got.acc_norm == float(max(range(3), key=lambda i: norm[i]) == label)


def test_score_text_stride_one_gives_every_token_a_full_window(model):
    ids = [756] + TOKENIZER.encode(TEXT)
    assert len(ids) > 40
    expected = 0.0
    for t in range(1, len(ids)):
        window = ids[max(0, t - 16):t + 1]
        expected -= direct_log_probs(model, window)[-1]
    got = ev.score_text(model, TOKENIZER, TEXT, prefix_id=756, stride=1, batch_size=7)
    assert got.nll == pytest.approx(expected, abs=1e-3)
    assert got.num_tokens == len(ids) - 1 and got.num_bytes == len(TEXT.encode())
    assert got.bits_per_byte == pytest.approx(expected / math.log(2) / len(TEXT.encode()))
    assert got.perplexity == pytest.approx(math.exp(expected / (len(ids) - 1)))


def test_score_text_default_stride_is_disjoint_windows(model):
    ids = [756] + TOKENIZER.encode(TEXT)
    expected, done = 0.0, 0
    n = len(ids) - 1
    while done < n:                    # lm-eval: chunks of 16 predictions, the last one full
        end = min(done + 16, n)
        start = max(0, end - 16)
        expected -= sum(direct_log_probs(model, ids[start:end + 1])[-(end - done):])
        done = end
    got = ev.score_text(model, TOKENIZER, TEXT, prefix_id=756)
    assert got.nll == pytest.approx(expected, abs=1e-3)
    short = ev.score_text(model, TOKENIZER, "Hello there.", prefix_id=756)
    ids = [756] + TOKENIZER.encode("Hello there.")
    assert short.nll == pytest.approx(-sum(direct_log_probs(model, ids)), abs=1e-4)
    both = ev.TextScore.combine([got, short])
    assert both.num_bytes == got.num_bytes + short.num_bytes
    assert both.nll == pytest.approx(got.nll + short.nll)


def test_rolling_windows_cover_every_token_once():
    for n in range(40):
        for window in (1, 4, 7):
            for stride in range(1, window + 1):
                windows = ev.rolling_windows(n, window, stride)
                assert sum(s for _, s in windows) == n
                assert all(end <= n and s <= min(end, window) for end, s in windows)
                assert all(a[0] < b[0] for a, b in itertools.pairwise(windows))


def test_items_of_the_committed_subsets():
    hs = [json.loads(x) for x in (DATA / "eval" / "hellaswag.jsonl").open()]
    mmlu = [json.loads(x) for x in (DATA / "eval" / "mmlu.jsonl").open()]
    gsm = [json.loads(x) for x in (DATA / "eval" / "gsm8k.jsonl").open()]
    assert (len(hs), len(mmlu), len(gsm)) == (200, 200, 100)
    context, choices, label = ev.hellaswag_item(hs[0])
    assert len(choices) == 4 and 0 <= label < 4 and context == hs[0]["query"]
    context, choices, label = ev.mmlu_item(mmlu[0])
    assert choices == ["A", "B", "C", "D"] and context.endswith("\nAnswer:")
    assert context.startswith("The following are multiple choice questions (with answers) "
                              "about abstract algebra.\n\n")
    targets = [ev.gsm8k_target(doc) for doc in gsm]
    assert all(t is not None and t.lstrip("-").isdigit() for t in targets)


def test_answer_extraction_and_exact_match():
    assert ev.extract_last_number("She has 3 apples, then 1,250 more: 1,253.") == "1253"
    assert ev.extract_last_number("It costs $-4.50 or 7.0") == "7"
    assert ev.extract_last_number("no number") is None
    assert ev.extract_choice_letter("I think (C) is right, not A") == "C"
    assert ev.extract_choice_letter("Answer: none") is None
    assert ev.exact_match(["18", None, " 3 "], ["18", "2", "3"]) == [1.0, 0.0, 1.0]


def test_generate_answers_are_greedy_decodes(model):
    from minitransformer.generation import generate
    prompts = ["The man", "He bends down"]
    got = ev.generate_answers(model, TOKENIZER, prompts, max_new_tokens=5, batch_size=1)
    for prompt, answer in zip(prompts, got):
        idx = torch.tensor([TOKENIZER.encode(prompt)])
        new = generate(model, idx, 5, temperature=0.0)[0, idx.shape[1]:].tolist()
        assert answer == TOKENIZER.decode(new)
    cut = ev.generate_answers(model, TOKENIZER, prompts, max_new_tokens=5, stop=[got[0][2:4]])
    assert cut[0] == got[0].split(got[0][2:4])[0]


def test_mean_stderr_is_lm_evals_formula():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    mean, stderr = ev.mean_stderr(values)
    assert mean == pytest.approx(statistics.mean(values))
    assert stderr == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)))


def test_bootstrap_interval_is_seeded_and_near_the_normal_one():
    values = [float(i % 3 == 0) for i in range(300)]
    low, high = ev.bootstrap_interval(values, num_samples=2000, seed=1)
    assert (low, high) == ev.bootstrap_interval(values, num_samples=2000, seed=1)
    mean, stderr = ev.mean_stderr(values)
    assert low < mean < high
    assert (high - low) / 2 == pytest.approx(1.96 * stderr, rel=0.15)


def test_mcnemar_equals_scipys_binomial_test():
    a = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    b = [1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
    got = ev.mcnemar(a, b)
    assert (got.only_a, got.only_b) == (9, 1)
    assert got.p_value == pytest.approx(stats.binomtest(1, 10, 0.5).pvalue)
    assert ev.mcnemar(a, a).p_value == 1.0


def test_paired_bootstrap_sees_a_real_difference_and_not_a_null_one():
    a = [float(i % 4 != 0) for i in range(200)]          # 0.75
    b = [float(i % 2 == 0) for i in range(200)]          # 0.50
    diff, low, high = ev.paired_bootstrap(a, b, seed=3)
    assert diff == pytest.approx(0.25) and 0 < low < diff < high
    diff, low, high = ev.paired_bootstrap(a, a[::-1], seed=3)
    assert low <= 0 <= high


@pytest.mark.parametrize("call, error, message", [
    (lambda m: ev.log_likelihoods("model", []), TypeError, "model must be a GPT, a Llama or"),
    (lambda m: ev.log_likelihoods(m, [([1], [])]), ValueError, "empty continuation"),
    (lambda m: ev.log_likelihoods(m, [([], [1])]), ValueError, "empty context"),
    (lambda m: ev.log_likelihoods(m, [([1], [9999])]), ValueError, "outside the vocabulary"),
    (lambda m: ev.log_likelihoods(m, [([1], [2] * 17)]), ValueError, r"reads at once \(16\)"),
    (lambda m: ev.log_likelihoods(m, [([1], [2])], batch_size=0), ValueError, "batch_size"),
    (lambda m: ev.score_choices(m, TOKENIZER, "Q", ["a"], 0), ValueError, "at least 2"),
    (lambda m: ev.score_choices(m, TOKENIZER, "Q", ["a", "b"], 2), ValueError, "label 2"),
    (lambda m: ev.score_choices(m, TOKENIZER, "Q", ["a", ""], 0), ValueError, "is empty"),
    (lambda m: ev.score_choices(m, TOKENIZER, 3, ["a", "b"], 0), TypeError, "context"),
    (lambda m: ev.score_choices(m, object(), "Q", ["a", "b"], 0), TypeError, "encode"),
    (lambda m: ev.score_text(m, TOKENIZER, "", prefix_id=1), ValueError, "text is empty"),
    (lambda m: ev.score_text(m, TOKENIZER, "x", prefix_id=1, stride=17), ValueError, "stride"),
    (lambda m: ev.score_text(m, TOKENIZER, "x", prefix_id=-1), ValueError, "prefix_id"),
    (lambda m: ev.mean_stderr([]), ValueError, "empty"),
    (lambda m: ev.mean_stderr([1.0]), ValueError, "at least 2"),
    (lambda m: ev.mean_stderr([1.0, float("nan")]), ValueError, "finite"),
    (lambda m: ev.mean_stderr("10"), TypeError, "list of numbers"),
    (lambda m: ev.bootstrap_interval([1, 0], confidence=1.0), ValueError, "confidence"),
    (lambda m: ev.mcnemar([1, 0], [1]), ValueError, "same items"),
    (lambda m: ev.mcnemar([1, 0.5], [1, 0]), ValueError, "0 or 1"),
    (lambda m: ev.exact_match(["1"], ["1", "2"]), ValueError, "1 predictions for 2"),
    (lambda m: ev.extract_last_number(12), TypeError, "text must be a str"),
    (lambda m: ev.TextScore.combine([]), ValueError, "empty"),
])
def test_bad_input_is_refused(model, call, error, message):
    with pytest.raises(error, match=message):
        call(model)
