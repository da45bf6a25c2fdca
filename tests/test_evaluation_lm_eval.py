"""minitransformer.evaluation equals lm-eval 0.4.13 (its ``hf`` model, on a directory written by
``save_pretrained``): the same contexts and continuations, each log-likelihood within 1e-4,
``acc`` and ``acc_norm`` item by item, their means and standard errors to 4 decimals, and bits
per byte of a rolling log-likelihood over texts longer than the context.

A tiny Llama with the course's tokenizer scores many items (cheap); SmolLM2-135M-Instruct, loaded
with ``Llama.from_gguf`` and saved for transformers, scores 10 HellaSwag and 10 MMLU items here
(tools/compare_lm_eval.py runs the full 200 + 200). Tasks are local YAML over the committed
subsets; nothing is downloaded (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1).
"""

import lm_eval_helpers as helpers
import pytest
import torch

from minitransformer import pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.llama import Llama, LlamaConfig
from helpers import smollm2_transformers_tokenizer

EOS = 756   # <|endoftext|> of tests/data/gpt2_tiny, lm-eval's prefix for rolling windows


def check(report: dict) -> None:
    for task, entry in report.items():
        assert entry["max_ll_difference"] < 1e-4, (task, entry)
        if task == "text_local":
            ours, theirs = entry["bits_per_byte"]
            assert ours == pytest.approx(theirs, abs=1e-6), (task, entry)
            continue
        assert entry["contexts_equal"], task
        for metric in ("acc", "acc_norm"):
            assert entry[f"{metric}_per_item_equal"], (task, metric)
            for key in (metric, f"{metric}_stderr"):
                ours, theirs = entry[key]
                assert round(ours, 4) == round(theirs, 4), (task, key, entry)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama (context 128) with weights far from the initialisation, and the course's
    tokenizer, saved together for transformers."""
    tokenizer = BPETokenizer.from_pretrained(helpers.DATA.parent / "gpt2_tiny")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(tokenizer), context_length=128, num_layers=2,
                              num_heads=4, num_kv_heads=2, d_model=32, d_ff=64))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(folder, eos_token_id=EOS)
    tokenizer.save_pretrained(folder)
    return model.eval(), tokenizer, folder


def test_tiny_llama_equals_lm_eval(tiny, tmp_path):
    model, tokenizer, folder = tiny
    docs = {"hellaswag_local": helpers.read("hellaswag")[:100],
            "mmlu_local": helpers.read("mmlu")[:100],
            "text_local": [{"text": t} for t in helpers.texts(10)]}
    output = helpers.run_lm_eval(folder, tmp_path, helpers.write_tasks(tmp_path, docs))
    report = helpers.compare(model, tokenizer, docs, output, prefix_id=EOS)
    check(report)
    assert min(len(tokenizer.encode(d["text"])) for d in docs["text_local"]) > 2 * 128
    accs = [report[t]["acc"][0] for t in ("hellaswag_local", "mmlu_local")]
    assert all(0 < a < 1 for a in accs)        # neither all right nor all wrong: a real test


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    model = Llama.from_gguf(pretrained.smollm2_path())
    folder = tmp_path_factory.mktemp("smollm2")
    tokenizer = smollm2_transformers_tokenizer()
    model.save_pretrained(folder, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id)
    tokenizer.save_pretrained(folder)
    return model, helpers.HFTokenizer(tokenizer), folder


def test_smollm2_equals_lm_eval(smollm2, tmp_path):
    model, tokenizer, folder = smollm2
    docs = {"hellaswag_local": helpers.read("hellaswag")[:10],
            "mmlu_local": helpers.read("mmlu")[:10]}
    output = helpers.run_lm_eval(folder, tmp_path, helpers.write_tasks(tmp_path, docs))
    check(helpers.compare(model, tokenizer, docs, output))
