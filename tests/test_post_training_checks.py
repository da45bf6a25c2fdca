"""Post-training's silent results (issue 40), each now refused or said, and the pieces of a
fine-tuning step that chapters 16-17 write out (CS336's alignment assignment): masked_mean,
the per-token entropy, an SFT step from log-probabilities and the REINFORCE loss, each against
a direct computation."""

from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, token_files  # noqa: E402
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer  # noqa: E402
from minitransformer.chat import CHAT_TOKENS  # noqa: E402
from minitransformer.grpo import policy_gradient_loss  # noqa: E402
from minitransformer.lora import LoRALinear, add_lora, load_adapter, save_adapter  # noqa: E402
from minitransformer.preferences import (  # noqa: E402
    DPO,
    dpo_batches,
    dpo_loss,
    dpo_train,
    identical_pairs,
    per_token_log_probs,
    preference_accuracy,
)
from minitransformer.seq2seq import Seq2Seq, Seq2SeqConfig  # noqa: E402
from minitransformer.sft import masked_mean, sft_step, token_entropy  # noqa: E402
from minitransformer.token_files import TokenFiles, prepare  # noqa: E402

# one_thread is an autouse fixture: imported, it runs this module on one thread
from cli_helpers import one_thread, run  # noqa: E402, F401

DATA = Path(__file__).resolve().parent / "data"
GPT2_TINY = DATA / "gpt2_tiny"
TEXT = DATA / "german.txt"


def tiny_gpt(vocab_size=300, seed=0, d_model=16) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size, context_length=48, num_layers=1, num_heads=2,
                         d_model=d_model)).eval()


def tiny_llama(vocab_size=61, d_model=16, num_layers=2) -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size, 24, num_layers, 4, d_model, num_kv_heads=2)).eval()


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    text = "Say cat dog bird fish ant owl. " * 20
    return BPETokenizer.train(text, 300, pattern=GPT2_PATTERN,
                              special_tokens=["<|endoftext|>", *CHAT_TOKENS])


# ----- token files -------------------------------------------------------------------------------

def test_a_prepared_folder_with_another_tokenizers_files_is_refused(tmp_path):
    out = tmp_path / "prepared"
    index = prepare([TEXT], out, vocab_size=300, workers=1, progress=False)
    assert index["tokenizer"]["sha256"] == token_files.tokenizer_sha256(out)
    TokenFiles(out)                                                  # its own files: read
    other = tmp_path / "other"
    prepare([DATA / "multilingual.txt"], other, vocab_size=300, workers=1, progress=False)
    for name in ("vocab.json", "merges.txt"):                        # same vocabulary size
        shutil.copy(other / name, out / name)
    with pytest.raises(ValueError, match="are not the tokenizer that made its ids"):
        TokenFiles(out)


def test_a_vocabulary_larger_than_the_text_can_learn_is_said(tmp_path):
    with pytest.warns(UserWarning, match=r"vocab_size=5,000,000 asked, but the tokenizer "
                                         r"learned only [\d,]+ tokens"):
        index = prepare([TEXT], tmp_path / "a", vocab_size=5_000_000, workers=1,
                        progress=False)
    assert index["vocab_size"] < 5_000_000
    status, stdout, stderr = run("prepare", "--data", TEXT, "--out", tmp_path / "b",
                                 "--vocab-size", "5000000", "--no-progress")
    assert status == 0
    assert stderr.startswith("warning: vocab_size=5,000,000 asked") and stderr.count("\n") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")                              # none when it fits
        prepare([TEXT], tmp_path / "c", vocab_size=300, workers=1, progress=False)


def test_workers_are_bounded_by_the_cores(tmp_path, monkeypatch):
    sizes = []
    real = token_files._context

    class Context:
        def Pool(self, processes, **kwargs):        # noqa: N802 (multiprocessing's name)
            sizes.append(processes)
            return real().Pool(processes, **kwargs)

    monkeypatch.setattr(token_files, "_context", Context)
    monkeypatch.setattr(token_files, "_default_workers", lambda: 2)
    monkeypatch.setattr(token_files, "_BLOCK", 512)                 # several chunks
    prepare([TEXT], tmp_path / "a", tokenizer=GPT2_TINY, workers=10**6, progress=False)
    assert sizes == [2]
    from minitransformer.cli import prepare as prepare_command
    monkeypatch.setattr(prepare_command, "_default_workers", lambda: 2)
    status, _, stderr = run("prepare", "--data", TEXT, "--out", tmp_path / "b", "--tokenizer",
                            GPT2_TINY, "--workers", "1000000", "--no-progress")
    assert status == 0 and sizes == [2, 2]
    assert stderr == "--workers 1000000 is more than the 2 cores here: using 2\n"


# ----- LoRA -------------------------------------------------------------------------------------

def test_a_rank_above_the_layers_smaller_side_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"r=10000 is more than the smaller side of "
                                         r"layers.0.self_attn.q_proj \(16 -> 16\)"):
        add_lora(tiny_llama(), r=10000, alpha=8.0)
    with pytest.raises(ValueError, match=r"r=17 is more than the smaller side"):
        LoRALinear(torch.nn.Linear(16, 40), 17, alpha=1.0)
    LoRALinear(torch.nn.Linear(16, 40), 16, alpha=1.0)               # full rank is allowed


@pytest.mark.parametrize("other", [dict(vocab_size=62), dict(num_layers=3)])
def test_an_adapter_is_refused_by_a_base_of_another_shape(tmp_path, other):
    model = add_lora(tiny_llama(), r=2, alpha=4.0)
    save_adapter(model, tmp_path / "adapter", base_model_name_or_path="base")
    load_adapter(tiny_llama(), tmp_path / "adapter")                 # its own shape: loads
    with pytest.raises(ValueError, match=f"was trained on a base with "
                                         f"{next(iter(other))}"):
        load_adapter(tiny_llama(**other), tmp_path / "adapter")


# ----- DPO ---------------------------------------------------------------------------------------

def test_dpo_loss_and_accuracy_refuse_what_has_no_answer():
    empty = torch.zeros(0)
    with pytest.raises(ValueError, match="the log-probabilities are empty"):
        dpo_loss(empty, empty, empty, empty, beta=0.1)
    with pytest.raises(ValueError, match=r"chosen\[0\] is nan"):
        preference_accuracy(torch.tensor([math.nan]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"rejected\[1\] is inf"):
        preference_accuracy(torch.tensor([1.0, 2.0]), torch.tensor([0.0, math.inf]))
    assert preference_accuracy(torch.tensor([1.0, -1.0]), torch.tensor([0.0, 0.0])) == 0.5


PAIRS = [{"prompt": f"Say {w}:", "chosen": f" {w}", "rejected": f" {o}"}
         for w, o in [("cat", "dog"), ("bird", "fish"), ("ant", "owl")]]


def test_dpo_refuses_a_reference_of_another_vocabulary(tok):
    with pytest.raises(ValueError, match="the reference has a vocabulary of 301 tokens, the "
                                         "policy 300"):
        dpo_train(tiny_gpt(300), tok, PAIRS, reference=tiny_gpt(301), steps=1,
                  progress=False)
    # a module without a config: the logits' shapes are compared at the first forward
    model = DPO(tiny_gpt(300), torch.nn.Sequential(tiny_gpt(301)))
    idx = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"the reference's logits \(2, 3, 301\) differ"):
        model.log_probs(idx, idx)
    history = dpo_train(tiny_gpt(300), tok, PAIRS, steps=1, progress=False)
    assert history.train_losses[0] == pytest.approx(math.log(2))   # the check can pass


def test_dpo_batches_without_a_generator_is_a_type_error(tok):
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        next(dpo_batches(tok, PAIRS, batch_size=2, generator=None))


def test_pairs_whose_chosen_is_rejected_are_warned_of(tok, tmp_path):
    same = [*PAIRS, {"prompt": "Say x:", "chosen": " cat", "rejected": " cat"}]
    assert identical_pairs(same) == [3] and identical_pairs(PAIRS) == []
    with pytest.warns(UserWarning, match=r"1 of 4 pairs have chosen equal to rejected "
                                         r"\(the first: pairs\[3\]\)"):
        dpo_train(tiny_gpt(), tok, same, steps=1, progress=False)
    with pytest.warns(UserWarning, match="so this run trains for nothing"):
        dpo_train(tiny_gpt(), tok, same[3:], steps=1, progress=False)


# ----- seq2seq -----------------------------------------------------------------------------------

def test_next_token_logits_refuses_an_id_past_the_vocabulary():
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(61, 50, 24, 1, 2, 16)).eval()
    source = model.read_source(torch.tensor([[1, 2, 3]]), use_cache=True)
    with pytest.raises(ValueError, match=r"tgt_in holds token id 55, outside the vocabulary "
                                         r"\[0, 50\)"):
        model.next_token_logits(torch.tensor([[1, 55]]), source)
    assert model.next_token_logits(torch.tensor([[1, 2]]), source).shape == (1, 50)


# ----- the pieces of a step, against direct computations -----------------------------------------

def test_masked_mean_is_the_mean_of_the_kept_values():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    assert masked_mean(values, mask).item() == pytest.approx((1 + 3 + 6) / 3)
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), torch.tensor([2.0, 6.0]))
    columns = torch.tensor([[True, True, False], [True, False, True]])
    torch.testing.assert_close(masked_mean(values, columns, dim=0), torch.tensor([2.5, 2, 6]))
    with pytest.raises(ValueError, match="mask has no True in some row along dim=0"):
        masked_mean(values, mask, dim=0)                            # column 1 has none
    with pytest.raises(TypeError, match="mask must be a boolean tensor"):
        masked_mean(values, mask.float())
    with pytest.raises(ValueError, match="mask must have the shape of values"):
        masked_mean(values, mask[0])
    with pytest.raises(ValueError, match="dim must be below values' 2 dimensions, got 2"):
        masked_mean(values, mask, dim=2)


def test_token_entropy_is_minus_p_log_p():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64)
    p = logits.softmax(-1)
    want = torch.tensor([[-sum(float(q) * math.log(float(q)) for q in p[b, t])
                          for t in range(3)] for b in range(2)], dtype=torch.float64)
    torch.testing.assert_close(token_entropy(logits), want)
    assert token_entropy(torch.zeros(5)).item() == pytest.approx(math.log(5))   # uniform
    assert token_entropy(torch.tensor([0.0, 1e4])).item() == pytest.approx(0.0, abs=1e-6)


def test_an_sft_step_from_log_probabilities_is_the_models_own_loss():
    model = tiny_gpt(40)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(40, (3, 9), generator=g)
    targets = torch.randint(40, (3, 9), generator=g)
    targets[:, :4] = -100                                           # the prompt
    targets[2, 7:] = -100                                           # padding
    want = model(idx, targets)[1]
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    log_probs = per_token_log_probs(model(idx)[0], targets)
    got = sft_step(log_probs, targets != -100, grad_accum=2)
    assert got.item() == pytest.approx(want.item() / 2, rel=1e-6)
    for p, grad in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad * 2, grad)
    # and the direct sum: minus the mean log-probability of the kept targets
    logp = F.log_softmax(model(idx)[0], -1)
    kept = [(b, t) for b in range(3) for t in range(9) if targets[b, t] != -100]
    direct = -sum(logp[b, t, targets[b, t]].item() for b, t in kept) / len(kept)
    assert got.item() == pytest.approx(direct / 2, rel=1e-5)


def test_policy_gradient_loss_is_minus_advantage_times_log_p():
    g = torch.Generator().manual_seed(2)
    log_probs = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    for baseline, shift in ((None, [0.0] * 3), (1.0, [1.0] * 3),
                            (torch.tensor([0.5, 0.5, 3.0], dtype=torch.float64),
                             [0.5, 0.5, 3.0])):
        got = policy_gradient_loss(log_probs, rewards, baseline=baseline)
        want = torch.tensor([[-(float(rewards[b]) - shift[b]) * float(log_probs[b, t])
                              for t in range(4)] for b in range(3)], dtype=torch.float64)
        torch.testing.assert_close(got, want)
    # the gradient flows to the log-probabilities only
    log_probs.requires_grad_(True)
    policy_gradient_loss(log_probs, rewards, baseline=1.0).sum().backward()
    torch.testing.assert_close(log_probs.grad, -(rewards - 1.0)[:, None].expand(3, 4))
    with pytest.raises(ValueError, match="rewards must hold one value per reply, 3"):
        policy_gradient_loss(log_probs, rewards[:2])
