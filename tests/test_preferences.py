"""DPO (chapter 17): sequence log-probabilities against a per-token loop, the loss against its
equation and against TRL 1.16's ``DPOTrainer``, the first step's ln 2, and the mistakes the
comparisons catch (chosen and rejected swapped, no reference, the prompt summed too).

TRL's loss and gradients for a fixed batch, without training: a ``DPOTrainer`` is built on our
model and reference (saved with ``save_pretrained``, read by ``AutoModelForCausalLM``), our
tokenizer with its chat template and pad token, and the same pairs; its own train dataloader
gives the collated batch, and ``DPOTrainer.compute_loss`` (which calls
``DPOTrainer._compute_loss``, sigmoid loss) the loss, which is then back-propagated.
``bf16=False``: TRL's configs default to ``bf16=True``, and the trainer then runs the reference
(not the policy) under bfloat16 autocast even on the CPU: its log-probabilities moved by 1e-2.
"""

import math
import os
import re

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch
import torch.nn.functional as F

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.chat import END_OF_TURN, PAD, encode_chat
from minitransformer.gpt import GPT2_NAMES
from minitransformer.llama import LLAMA_NAMES
from minitransformer.lora import add_lora, merge_lora
from minitransformer.preferences import (
    DPO,
    dpo_batch,
    dpo_batches,
    dpo_loss,
    dpo_train,
    implicit_rewards,
    kl_estimate,
    per_token_log_probs,
    preference_accuracy,
    preference_batch,
    sequence_log_probs,
)
from minitransformer.pretrained import to_theirs
from minitransformer.sft import IGNORE_INDEX
from test_chat import CORPUS, SPECIALS  # tests/ is on sys.path
from helpers import perturbed

LN2 = math.log(2)

PLAIN = [
    {"prompt": "The cat sat on", "chosen": " the mat.", "rejected": " a dog"},
    {"prompt": "Once upon a time", "chosen": " there was a king", "rejected": "!"},
    {"prompt": "é 😀 日本語:", "chosen": " yes", "rejected": " no, not at all, never"},
    {"prompt": "Say it twice:", "chosen": "\nit it", "rejected": ""},
]
CONVERSATIONAL = [
    {"prompt": [{"role": "user", "content": "translate: open my photos"}],
     "chosen": [{"role": "assistant", "content": "foti mia abra"}],
     "rejected": [{"role": "assistant", "content": "abra mia foti"}]},
    {"prompt": [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "Héllo 😀, what is the cat?"}],
     "chosen": [{"role": "assistant", "content": "An animal."}],
     "rejected": [{"role": "assistant", "content": "The cat is a small animal that"}]},
    {"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "say no"}],
     "chosen": [{"role": "assistant", "content": "no"}],
     "rejected": [{"role": "assistant", "content": ""}]},
]
DATA = {"plain": PLAIN, "conversational": CONVERSATIONAL}


@pytest.fixture(scope="module")
def tok():
    text = CORPUS.read_text(encoding="utf-8")[:20_000]
    return BPETokenizer.train(text, 400, pattern=GPT2_PATTERN, special_tokens=SPECIALS)


def make(name, tok, seed):
    torch.manual_seed(0)
    if name == "gpt":
        model = GPT(GPTConfig(vocab_size=len(tok), context_length=128, d_model=32,
                              num_heads=4, num_layers=2))
    else:
        model = Llama(LlamaConfig(vocab_size=len(tok), context_length=128, num_layers=2,
                                  num_heads=4, num_kv_heads=2, d_model=32))
    return perturbed(model, seed)


# ----- sequence log-probabilities -----------------------------------------------------------------

def test_sequence_log_probs_equals_a_loop_over_tokens():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, dtype=torch.float64)
    targets = torch.randint(11, (3, 7))
    targets[0, :3] = IGNORE_INDEX          # a prompt
    targets[1, 5:] = IGNORE_INDEX          # padding
    targets[2, :] = IGNORE_INDEX           # nothing to score
    expected = torch.zeros(3, dtype=torch.float64)
    for b in range(3):
        for t in range(7):
            if targets[b, t] != -100:
                probs = torch.exp(logits[b, t]) / torch.exp(logits[b, t]).sum()
                expected[b] += torch.log(probs[targets[b, t]])
    torch.testing.assert_close(sequence_log_probs(logits, targets), expected)
    per_token = per_token_log_probs(logits, targets)
    assert per_token.shape == (3, 7) and (per_token[targets == -100] == 0).all()
    ours32 = sequence_log_probs(logits.float(), targets)
    assert ours32.dtype == torch.float32
    torch.testing.assert_close(ours32.double(), expected, atol=1e-5, rtol=1e-6)


def test_sequence_log_probs_leave_out_prompt_and_padding(tok):
    """With a model: each pair scored alone and unpadded, summed over the response only."""
    model = make("gpt", tok, 1)
    for pairs in DATA.values():
        idx, targets = dpo_batch(tok, pairs)
        with torch.no_grad():
            ours = sequence_log_probs(model(idx)[0], targets)
        for row in range(idx.shape[0]):
            pair = pairs[row % len(pairs)]
            key = "chosen" if row < len(pairs) else "rejected"
            if isinstance(pair["prompt"], str):
                prompt = tok.encode(pair["prompt"])
                full = tok.encode(pair["prompt"] + pair[key]) + [tok.special_tokens[END_OF_TURN]]
            else:
                prompt = encode_chat(tok, pair["prompt"], add_generation_prompt=True)[0]
                full = encode_chat(tok, pair["prompt"] + pair[key])[0]
                assert full[:len(prompt)] == prompt
            with torch.no_grad():
                logp = model(torch.tensor([full[:-1]]))[0][0].double().log_softmax(-1)
            alone = sum(logp[t - 1, full[t]].item() for t in range(len(prompt), len(full)))
            assert ours[row].item() == pytest.approx(alone, abs=1e-4)


def test_preference_batch_layout(tok):
    prompts = [p["prompt"] for p in CONVERSATIONAL]
    responses = [p["chosen"] for p in CONVERSATIONAL]
    idx, targets = preference_batch(tok, prompts, responses)
    pad = tok.special_tokens[PAD]
    for row, (prompt, response) in enumerate(zip(prompts, responses)):
        ids, mask = encode_chat(tok, prompt + response)
        start = len(encode_chat(tok, prompt, add_generation_prompt=True)[0])
        mask = [m and t >= start for t, m in enumerate(mask)]    # earlier replies: prompt
        n = len(ids) - 1
        assert idx[row, :n].tolist() == ids[:-1]
        assert targets[row, :n].tolist() == [i if m else -100 for i, m in zip(ids, mask)][1:]
        assert (idx[row, n:] == pad).all() and (targets[row, n:] == -100).all()
    # the response ends with its turn's <|end|>, a plain one with an added <|end|> (TRL's EOS)
    end = tok.special_tokens[END_OF_TURN]
    plain = preference_batch(tok, ["a b"], [" c"])[1][0].tolist()
    assert plain[-1] == end and plain[-2] == tok.encode(" c")[-1]


# ----- the loss -----------------------------------------------------------------------------------

def test_dpo_loss_is_its_equation():
    torch.manual_seed(0)
    pc, pr, rc, rr = (torch.randn(5, dtype=torch.float64) * 3 for _ in range(4))
    beta = 0.3
    by_hand = sum(math.log(1 + math.exp(-beta * ((a - c) - (b - d))))
                  for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())) / 5
    assert dpo_loss(pc, pr, rc, rr, beta=beta).item() == pytest.approx(by_hand, abs=1e-12)
    # the mistakes give other numbers
    assert abs(dpo_loss(pr, pc, rr, rc, beta=beta).item() - by_hand) > 1e-2     # swapped
    no_ref = -F.logsigmoid(beta * (pc - pr)).mean().item()
    assert abs(no_ref - by_hand) > 1e-2
    torch.testing.assert_close(implicit_rewards(pc, rc, beta=beta), beta * (pc - rc))
    assert preference_accuracy(torch.tensor([1.0, 2.0, 0.0, 5.0]),
                               torch.tensor([0.0, 3.0, 0.0, 4.0])) == 0.5


def test_a_beta_that_overflows_is_named_not_a_nan():
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-1.0, -5.0, -3.0, -3.0))   # margin 4
    assert dpo_loss(pc, pr, rc, rr, beta=1e30).item() == 0.0       # huge but finite: sigmoid 1
    for beta, margins in ((1e300, (pc, pr, rc, rr)), (1e38, (pr, pc, rr, rc))):
        with pytest.raises(ValueError, match=re.escape(f"beta={beta!r} times the "
                                                       "log-probability margins (up to 4) "
                                                       "overflows torch.float32")):
            dpo_loss(*margins, beta=beta)
    zero = torch.zeros(1)                    # the first step: policy = reference, margin 0
    with pytest.raises(ValueError, match="overflows"):
        dpo_loss(zero, zero, zero, zero, beta=1e300)


@pytest.mark.parametrize("data", ["plain", "conversational"])
def test_first_loss_is_ln2_whatever_the_data(tok, data):
    for seed in (1, 2):
        dpo = DPO(make("gpt", tok, seed), beta=0.5)
        loss = dpo(*dpo_batch(tok, DATA[data]))[1]
        assert loss.item() == pytest.approx(LN2, abs=1e-6)
        assert dpo.metrics["reward_accuracy"] == 0.0 and dpo.metrics["margin"] == 0.0


def test_dpo_moves_the_policy_and_not_the_reference(tok):
    policy = make("gpt", tok, 1)
    reference = make("gpt", tok, 1)
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    history = dpo_train(policy, tok, PLAIN + CONVERSATIONAL, reference=reference, beta=0.5,
                        steps=8, lr=3e-3, batch_size=4, progress=False)
    assert history.train_losses[0] == pytest.approx(LN2, abs=1e-6)
    assert history.train_losses[-1] < 0.6
    assert all(torch.equal(before[k], v) for k, v in reference.state_dict().items())
    pairs = PLAIN + CONVERSATIONAL
    idx, targets = dpo_batch(tok, pairs)
    with torch.no_grad():
        policy_logits, ref_logits = policy(idx)[0], reference(idx)[0]
        scores = sequence_log_probs(policy_logits, targets)
        ref_scores = sequence_log_probs(ref_logits, targets)
    chosen, rejected = implicit_rewards(scores, ref_scores, beta=0.5).chunk(2)
    assert preference_accuracy(chosen, rejected) > 0.5
    kl = kl_estimate(policy_logits, ref_logits, targets)
    assert kl.shape == (2 * len(pairs),) and (kl > 0).all()
    assert (kl_estimate(ref_logits, ref_logits, targets).abs() < 1e-6).all()


def test_lora_policy_starts_at_ln2_and_trains_only_the_adapter(tok):
    policy = make("llama", tok, 1)
    reference = make("llama", tok, 1)
    add_lora(policy, r=4, alpha=8.0, targets=["q_proj", "v_proj"])
    frozen = {k: v.clone() for k, v in policy.state_dict().items() if "lora_" not in k}
    history = dpo_train(policy, tok, CONVERSATIONAL, reference=reference, steps=4, lr=1e-2,
                        batch_size=3, progress=False)
    assert history.train_losses[0] == pytest.approx(LN2, abs=1e-6)
    state = policy.state_dict()
    assert all(torch.equal(state[k], v) for k, v in frozen.items())
    assert history.train_losses[-1] < LN2
    merged = merge_lora(policy)
    assert not any("lora_" in k for k in merged.state_dict())


def test_kl_estimate_is_the_exact_kl_summed_over_the_response():
    torch.manual_seed(0)
    p_logits, q_logits = torch.randn(2, 2, 5, 7, dtype=torch.float64)
    targets = torch.randint(7, (2, 5))
    targets[0, :2] = IGNORE_INDEX
    targets[1, 4:] = IGNORE_INDEX
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    expected = torch.zeros(2, dtype=torch.float64)
    for b in range(2):
        for t in range(5):
            if targets[b, t] != -100:
                expected[b] += sum(p[b, t, v] * math.log(p[b, t, v] / q[b, t, v])
                                   for v in range(7))
    torch.testing.assert_close(kl_estimate(p_logits, q_logits, targets), expected)
    assert (kl_estimate(q_logits, p_logits, targets) - expected).abs().max() > 1e-3  # KL(p||q)


# ----- against TRL ----------------------------------------------------------------------

def with_prompt_summed(idx, targets):
    """The mistake of summing over the prompt too: every real position scored."""
    scored = targets.clone()
    next_tokens = idx.roll(-1, dims=1)
    for row in range(idx.shape[0]):
        real = (targets[row] != -100).nonzero().max().item()
        first = (targets[row] != -100).nonzero().min().item()
        scored[row, :first] = next_tokens[row, :first]
        assert (scored[row, :real + 1] != -100).all()
    return scored


@pytest.fixture(scope="module")
def trl_dpo(tok, tmp_path_factory):
    """TRL's loss and gradient (by our parameter names) for one batch of all the pairs."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    def run(name, pairs, beta):
        path = tmp_path_factory.mktemp(name)
        for folder, seed in (("policy", 1), ("reference", 2)):
            tok.save_pretrained(path / folder)
            make(name, tok, seed).save_pretrained(path / folder)
        model = AutoModelForCausalLM.from_pretrained(path / "policy", dtype=torch.float32)
        ref = AutoModelForCausalLM.from_pretrained(path / "reference", dtype=torch.float32)
        args = DPOConfig(output_dir=str(path / "out"), use_cpu=True, report_to=[],
                         save_strategy="no", disable_tqdm=True, beta=beta, bf16=False,
                         per_device_train_batch_size=len(pairs))
        trainer = DPOTrainer(model=model, ref_model=ref, args=args,
                             processing_class=AutoTokenizer.from_pretrained(path / "policy"),
                             train_dataset=Dataset.from_list(pairs))
        assert trainer.loss_types == ["sigmoid"]
        rows = [trainer.train_dataset[i] for i in range(len(pairs))]
        batch = next(iter(trainer.get_train_dataloader()))   # the whole data set, collated
        assert batch["input_ids"].shape[0] == 2 * len(pairs)
        model.eval()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        logged = {k: v[-1] for k, v in trainer._metrics["eval"].items()}  # what TRL logs
        return loss.item(), grads, rows, logged

    return run


def our_grads(model, name):
    """Our gradients under transformers' names (the checkpoint's table, as save_pretrained)."""
    grads = {n: p.grad for n, p in model.named_parameters()}
    if name == "gpt":
        return {f"transformer.{k}": v for k, v in to_theirs(grads, GPT2_NAMES, 2).items()}
    return to_theirs(grads, LLAMA_NAMES, 2)


@pytest.mark.parametrize("name, data", [("gpt", "plain"), ("gpt", "conversational"),
                                        ("llama", "conversational")])
def test_loss_and_gradients_equal_trl_dpo_trainer(tok, trl_dpo, name, data):
    pairs, beta = DATA[data], 0.7
    theirs, their_grads, rows, logged = trl_dpo(name, pairs, beta)
    idx, targets = dpo_batch(tok, pairs)
    for n, row in enumerate(rows):            # TRL's prompt and responses are ours
        for k, key in enumerate(("chosen_ids", "rejected_ids")):
            line = k * len(pairs) + n
            scored = targets[line][targets[line] != -100].tolist()
            assert row[key] == scored
            start = (targets[line] != -100).nonzero().min().item()
            assert row["prompt_ids"] == idx[line, :start + 1].tolist()

    policy, reference = make(name, tok, 1), make(name, tok, 2)
    dpo = DPO(policy, reference, beta=beta)
    loss = dpo(idx, targets)[1]
    loss.backward()
    assert abs(loss.item() - theirs) <= 1e-5, (loss.item(), theirs)
    assert abs(loss.item() - LN2) > 1e-2       # policy and reference differ: not a trivial ln 2
    ours = our_grads(policy, name)
    assert ours.keys() <= their_grads.keys()
    for key, grad in ours.items():
        torch.testing.assert_close(grad, their_grads[key], atol=1e-5, rtol=0, msg=key)
    assert max(g.abs().max().item() for g in ours.values()) > 1e-3   # not all zeros
    for mine, trls in (("chosen_reward", "rewards/chosen"), ("margin", "rewards/margins"),
                       ("rejected_reward", "rewards/rejected"),
                       ("reward_accuracy", "rewards/accuracies")):
        assert dpo.metrics[mine] == pytest.approx(logged[trls], abs=1e-5), mine

    # what the comparison catches: each mistake is farther from TRL than the tolerance
    with torch.no_grad():
        pol = sequence_log_probs(policy(idx)[0], targets)
        ref = sequence_log_probs(reference(idx)[0], targets)
        full = with_prompt_summed(idx, targets)
        pol_p = sequence_log_probs(policy(idx)[0], full)
        ref_p = sequence_log_probs(reference(idx)[0], full)
    (pc, pr), (rc, rr) = pol.chunk(2), ref.chunk(2)
    assert dpo_loss(pc, pr, rc, rr, beta=beta).item() == pytest.approx(theirs, abs=1e-5)
    assert pc.mean().item() == pytest.approx(logged["logps/chosen"], abs=1e-5)
    assert pr.mean().item() == pytest.approx(logged["logps/rejected"], abs=1e-5)
    swapped = dpo_loss(pr, pc, rr, rc, beta=beta).item()
    no_ref = -F.logsigmoid(beta * (pc - pr)).mean().item()
    for wrong in (swapped, no_ref):
        assert abs(wrong - theirs) > 1e-3, (wrong, theirs)
    # The prompt's log-probability is the same in a pair's two rows, so it cancels in the
    # loss (and its gradient); summed in, it shows in the log-probabilities and the rewards.
    prompt_too = dpo_loss(*pol_p.chunk(2), *ref_p.chunk(2), beta=beta).item()
    assert prompt_too == pytest.approx(theirs, abs=1e-5)
    assert abs(pol_p[:len(pairs)].mean().item() - logged["logps/chosen"]) > 1e-1
    wrong_rewards = implicit_rewards(pol_p, ref_p, beta=beta)[:len(pairs)].mean().item()
    assert abs(wrong_rewards - logged["rewards/chosen"]) > 1e-3


# ----- refusals ---------------------------------------------------------------------------------

def test_refusals(tok):
    pc = torch.zeros(3)
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo_loss(pc, pc, pc, pc, beta=0.0)
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo_loss(pc, pc, pc, pc, beta=-1)
    with pytest.raises(ValueError, match="same shape"):
        dpo_loss(pc, torch.zeros(2), pc, pc, beta=0.1)
    with pytest.raises(TypeError, match="policy_chosen"):
        dpo_loss([0.0], pc, pc, pc, beta=0.1)
    with pytest.raises(ValueError, match=r"targets must be \(B, T\)"):
        sequence_log_probs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError,
                       match=r"targets holds token id -1, outside the vocabulary \[0, 5\)"):
        sequence_log_probs(torch.zeros(1, 2, 5), torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError,
                       match=r"targets holds token id 5, outside the vocabulary \[0, 5\)"):
        sequence_log_probs(torch.zeros(1, 2, 5), torch.tensor([[0, 5]]))
    bad = [({"prompt": "a", "chosen": "b"}, ValueError, r"pairs\[0\]: the pair has no 'rejected'"),
           ({"prompt": "a", "chosen": "b", "rejected": [{"role": "assistant", "content": "x"}]},
            TypeError, r"pairs\[0\]: the pair mixes plain text and lists of messages"),
           ({"prompt": "", "chosen": "b", "rejected": "c"}, ValueError,
            r"pairs\[0\]: prompt is empty"),
           ({"prompt": "a", "chosen": "b<|end|>", "rejected": "c"}, ValueError,
            r"pairs\[0\]: chosen contains the special token '<\|end\|>'"),
           ({"prompt": [{"role": "user", "content": "a"}],
             "chosen": [{"role": "user", "content": "b"}],
             "rejected": [{"role": "assistant", "content": "c"}]}, ValueError,
            r"pairs\[0\]: chosen must begin with an assistant message"),
           ({"prompt": [{"role": "user", "content": "a"}], "chosen": [],
             "rejected": [{"role": "assistant", "content": "c"}]}, ValueError,
            "chosen must begin with an assistant message"),
           ({"prompt": [{"role": "bot", "content": "a"}],
             "chosen": [{"role": "assistant", "content": "b"}],
             "rejected": [{"role": "assistant", "content": "c"}]}, ValueError, "role 'bot'"),
           (["a", "b", "c"], TypeError, r"pairs\[0\]: the pair must be a dict")]
    for pair, error, match in bad:
        with pytest.raises(error, match=match):
            dpo_batch(tok, [pair])
    with pytest.raises(ValueError, match="pairs is empty"):
        dpo_batch(tok, [])
    with pytest.raises(ValueError, match=r"pairs\[0\]: chosen is \d+ tokens long with its "
                                         r"prompt, more than the context of 3"):
        dpo_batch(tok, PLAIN[:1], context_length=3)
    with pytest.raises(ValueError, match="prompts and responses must be equally many"):
        preference_batch(tok, ["a", "b"], [" c"])
    with pytest.raises(ValueError, match=r"pairs\[1\]: the pair has no 'prompt'"):
        next(dpo_batches(tok, [PLAIN[0], {}], batch_size=2,
                         generator=torch.Generator().manual_seed(0)))
    model = make("gpt", tok, 1)
    with pytest.raises(ValueError, match="policy and reference must be on one device, got "
                                         r"\['cpu', 'meta'\]"):
        DPO(model, make("gpt", tok, 1).to("meta"))
    with pytest.raises(ValueError, match="reference is the policy itself"):
        DPO(model, model)
    with pytest.raises(ValueError, match="beta must be positive"):
        DPO(model, beta=0)
    with pytest.raises(ValueError, match=r"idx must be \(2B, T\)"):
        DPO(model)(*preference_batch(tok, ["a"], [" b"]))


# ----- the course's preference pairs ----------------------------------------------------

def parse(prompt):
    """The task and sentence of an instruction, by its wording."""
    from minitransformer.data import INSTRUCTION_TASKS

    for task, wordings in INSTRUCTION_TASKS.items():
        for wording in wordings:
            head, _, tail = wording.partition("{}")
            if prompt.startswith(head) and prompt.endswith(tail):
                return task, prompt[len(head):len(prompt) - len(tail)]
    raise AssertionError(f"no wording matches {prompt!r}")


def test_preference_splits(tok):
    from minitransformer.data import instruction_answer, preference_pairs, preference_splits

    train, val = preference_splits(200, 40, seed=3)
    assert (train, val) == preference_splits(200, 40, seed=3)
    assert preference_pairs(200, seed=3) == train
    assert train != preference_splits(200, 40, seed=4)[0]
    tasks = []
    for pair in train + val:
        assert set(pair) == {"prompt", "chosen", "rejected"}
        (user,), (chosen,), (rejected,) = pair["prompt"], pair["chosen"], pair["rejected"]
        assert user["role"] == "user" and chosen["role"] == rejected["role"] == "assistant"
        task, sentence = parse(user["content"])
        tasks.append(task)
        assert chosen["content"] == instruction_answer(task, sentence)    # the right answer
        assert rejected["content"] != chosen["content"]                   # a near miss
        assert abs(len(rejected["content"].split()) - len(chosen["content"].split())) <= 1
    assert set(tasks[:200]) == {"translate", "is_command", "repeat", "reverse"}
    assert tasks[200:204] == ["translate", "is_command", "repeat", "reverse"]  # in turn
    seen = {parse(p["prompt"][0]["content"])[1] for p in train}
    assert not any(parse(p["prompt"][0]["content"])[1] in seen for p in val)
    idx, targets = dpo_batch(tok, train[:8])          # the format dpo_batch reads
    assert idx.shape[0] == 16
    only = preference_pairs(20, seed=1, tasks=["translate"])
    assert {parse(p["prompt"][0]["content"])[0] for p in only} == {"translate"}
    with pytest.raises(ValueError, match="unknown task 'sing'"):
        preference_splits(1, 1, tasks=["sing"])
    with pytest.raises(ValueError, match="seed"):
        preference_pairs(3, seed=-1)
    with pytest.raises(TypeError, match="tasks must be a list"):
        preference_pairs(3, tasks="translate")
