"""DPO and GRPO on the real model (chapter 17): the package's losses on SmolLM2-135M-Instruct
against TRL 1.16 on the same GGUF file, read by transformers
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``).

- DPO: ``DPOTrainer.compute_loss`` on its own collated batch (conversational pairs, rendered
  by SmolLM2's ChatML template, and plain pairs, to which TRL adds ``<|im_end|>``) equals
  :class:`~minitransformer.preferences.DPO` on :func:`dpo_batch`, and so do the gradients of
  all 272 tensors, within 1e-5. The policy is SmolLM2 with its norms perturbed (the same
  perturbation on both sides), so the loss is not the trivial ln 2. One difference is taken
  out: transformers gives the padding token's embedding row (``<|im_end|>``, which SmolLM2
  pads with) no gradient where it is an input (``nn.Embedding(padding_idx=2)``); the
  package trains it, as it trains every row. And transformers' rotary angles and RMSNorms are
  computed in float64 here, as ours are in a float64 model (transformers casts them to
  float32).
- GRPO: ``GRPOTrainer._compute_loss`` (what ``compute_loss`` calls) is given the inputs its
  generation step would build for fixed completions (prompt and completion ids and masks,
  advantages, old and reference log-probabilities), and equals
  :func:`~minitransformer.grpo.grpo_loss` on the package's log-probabilities.

Both sides run in float64 (``bf16=False``: TRL's configs default to ``bfloat16`` autocast): what
is compared is the algorithm, not the rounding of 30 layers of float32 sums, which moves the
tied embedding's gradient by more than 1e-5. That includes TRL's fused LM head
(``trl.kernels.ChunkedLogProbFunction``, which both trainers put on the model): it computes the
log-softmax, its gradient and the gradient products in float32 whatever the model's dtype,
and returns float32 log-probabilities. It is replaced by the same computation in float64
(:class:`Float64LogProbs`), after a test checks the two agree within float32's rounding.
Sequences are short, so each test takes seconds on a quiet machine.
"""

import copy
import functools
import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never the network

import pytest
import torch
import trl.trainer.utils
from trl.kernels import ChunkedLogProbFunction

from minitransformer import pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import apply_chat_template, end_of_turn_id
from minitransformer.grpo import completion_batch, group_advantages, grpo_loss
from minitransformer.llama import Llama, llama_names
from minitransformer.preferences import DPO, dpo_batch, per_token_log_probs
from helpers import smollm2_transformers_model, smollm2_transformers_tokenizer

CONVERSATIONAL = [
    {"prompt": [{"role": "user", "content": "Tell me about the moon."}],
     "chosen": [{"role": "assistant", "content": "The moon orbits the Earth."}],
     "rejected": [{"role": "assistant", "content": "The moon orbits the Earth. It is bright. "
                                                   "People have walked on it."}]},
    {"prompt": [{"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "Capital of France?"}],
     "chosen": [{"role": "assistant", "content": "Paris."}],
     "rejected": [{"role": "assistant", "content": "It is Paris, I think."}]},
]
PLAIN = [
    {"prompt": "The cat sat on", "chosen": " the mat.", "rejected": " a dog"},
    {"prompt": "Question: 2 + 3 =", "chosen": " 5", "rejected": " 6, or maybe 7"},
]
DATA = {"conversational": CONVERSATIONAL, "plain": PLAIN}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Float64LogProbs:
    """TRL's fused LM head (``ChunkedLogProbFunction.apply``, same arguments and outputs) in the
    hidden states' dtype, by plain autograd: TRL's own computes in float32 whatever that dtype.

    Measured on the plain pairs below, TRL's float32 head against this one: the sequences'
    log-probabilities differ by up to 4.3e-6, the loss by 5.7e-7, the gradients by up to
    3.8e-5 (``layers.6.post_attention_layernorm``; the largest gradient is 40); with this head
    in TRL, TRL and the package agree within 1e-13 in all of them. The conversational pairs'
    loss (0.074 against the plain pairs' 1.64) scales their gradients down about ten-fold,
    and the float32 head's error with them (3.7e-6 at most), which is why only the plain pairs
    had needed a wider tolerance (1e-4 relative, 2e-3 on the embedding). In the GRPO test the
    float32 head moves the gradients by up to 2.7e-6.
    """

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size,
              final_logit_softcapping=None, logit_scale=1.0,
              outputs=("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")):
        z = hidden @ weight.t() if bias is None else hidden @ weight.t() + bias
        z = z * logit_scale
        if final_logit_softcapping is not None:
            z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
        z = z / temperature
        log_p = z.log_softmax(-1)
        log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1) if "entropy" in outputs else None
        sum_sq = (torch.logsumexp(2 * log_p, -1).detach() if "log_sum_sq_probs" in outputs
                  else None)
        mean = z.mean(-1).detach() if "mean_logits" in outputs else None
        top1 = z.argmax(-1) == targets if "is_top1" in outputs else None   # the first maximum
        return log_probs, entropy, sum_sq, mean, top1


@pytest.fixture
def float64_head(monkeypatch):
    """TRL's trainers, with :class:`Float64LogProbs` for their fused LM head (looked up in
    ``trl.trainer.utils`` at each forward)."""
    assert trl.trainer.utils._ChunkedLogProbFunction is ChunkedLogProbFunction
    monkeypatch.setattr(trl.trainer.utils, "_ChunkedLogProbFunction", Float64LogProbs)


def test_trls_fused_head_is_the_float64_head_in_float32():
    """On float64 inputs, over several vocabulary chunks: TRL's head returns float32
    log-probabilities, within float32's rounding of the float64 head's; so are the entropies
    and the gradients of both (float64, from float32 products)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 16, dtype=torch.float64, generator=g)
    weight = torch.randn(300, 16, dtype=torch.float64, generator=g)
    targets = torch.randint(0, 300, (6,), generator=g)
    weights = torch.randn(2, 6, dtype=torch.float64, generator=g)
    results = []
    for head in (ChunkedLogProbFunction, Float64LogProbs):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        log_probs, entropy, *_ = head.apply(h, w, None, targets, 0.7, 128, None, 1.0,
                                            ("log_probs", "entropy"))
        ((log_probs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
        results.append((log_probs, entropy, h.grad, w.grad))
    theirs, ours = results
    assert theirs[0].dtype == theirs[1].dtype == torch.float32    # the cause, and the fix
    assert ours[0].dtype == torch.float64 and theirs[2].dtype == torch.float64
    for mine, their in zip(ours, theirs):
        torch.testing.assert_close(mine, their.double(), atol=1e-5, rtol=1e-5)
    assert (ours[0] - theirs[0]).abs().max() > 1e-9                 # float32, not float64


@pytest.fixture(scope="module")
def path():
    return pretrained.smollm2_path()


@pytest.fixture(scope="module")
def tok(path):
    return BPETokenizer.from_gguf(path)


@pytest.fixture(scope="module")
def their_tok():
    return smollm2_transformers_tokenizer()


def perturb_norms(model: Llama) -> Llama:
    """The same small, seeded change on every RMSNorm weight: a policy that is not the
    reference, with no quantisation-shaped structure left unchanged."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def loaded():
    """transformers' model read from the GGUF file (once per process: dequantising takes
    seconds)."""
    return smollm2_transformers_model()


def test_transformers_reads_the_weights_we_read(path, loaded):
    ours = Llama.from_gguf(path)
    state = pretrained.to_theirs(ours.state_dict(), llama_names(ours.config),
                                 ours.config.num_layers)
    theirs = loaded.state_dict()
    for name, tensor in state.items():
        assert torch.equal(tensor, theirs[name]), name


def rms_norm(module, x):
    """transformers' ``LlamaRMSNorm.forward`` without its cast to float32."""
    return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                            + module.variance_epsilon))


def theirs_from_ours(model: Llama, loaded):
    """transformers' Llama of the GGUF file's config, holding ``model``'s weights. (The
    config, as ``helpers`` keeps it, has no ``quantization_config``: a model read from GGUF
    counts as quantised, which TRL's trainers refuse.)"""
    config = copy.deepcopy(loaded.config)
    hf = type(loaded)(config).double()
    # transformers builds the embedding with padding_idx = the pad token, which for SmolLM2 is
    # <|im_end|> (id 2): its row then gets no gradient from where it is an input, though every
    # reply ends with it. Ours trains it; without the padding_idx the two gradients are equal.
    assert hf.model.embed_tokens.padding_idx == 2
    hf.model.embed_tokens.padding_idx = None
    # and it computes the rotary angles and the RMSNorms in float32 whatever the model's dtype;
    # ours, in float64 for a float64 model. Both in float64 here, so that 1e-5 measures the
    # algorithm, not float32's rounding.
    head_dim = model.config.d_model // model.config.num_heads
    inv = model.config.rope_theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64)
                                       / head_dim)

    def rotary(x, position_ids):
        angles = position_ids[..., None].double() * inv                  # (B, T, d/2)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    hf.model.rotary_emb.forward = rotary
    for module in hf.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = functools.partial(rms_norm, module)
    state = pretrained.to_theirs(model.state_dict(), llama_names(model.config),
                                 model.config.num_layers)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight          # tied, as ours
    return hf


def assert_gradients_equal(ours: Llama, theirs) -> None:
    """Every one of the 272 gradients, under transformers' names, within 1e-5."""
    grads = {n: p.grad for n, p in ours.named_parameters()}
    mine = pretrained.to_theirs(grads, llama_names(ours.config), ours.config.num_layers)
    their_grads = dict(theirs.named_parameters())
    assert len(mine) == 272
    for name, grad in mine.items():
        torch.testing.assert_close(grad, their_grads[name].grad, atol=1e-5, rtol=0.0,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert max(g.abs().max().item() for g in mine.values()) > 1e-3    # not all zero


@pytest.mark.parametrize("data", ["conversational", "plain"])
def test_dpo_loss_and_gradients_equal_trl_on_smollm2(path, tok, their_tok, loaded, tmp_path,
                                                     float64_head, data):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    pairs, beta = DATA[data], 0.5
    reference = Llama.from_gguf(path, dtype=torch.float64)
    policy = perturb_norms(Llama.from_gguf(path, dtype=torch.float64))
    their_policy = theirs_from_ours(policy, loaded)
    their_ref = theirs_from_ours(reference, loaded)
    args = DPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[],
                     save_strategy="no", disable_tqdm=True, beta=beta, bf16=False,
                     per_device_train_batch_size=len(pairs))
    trainer = DPOTrainer(model=their_policy, ref_model=their_ref, args=args,
                         processing_class=their_tok, train_dataset=Dataset.from_list(pairs))
    batch = next(iter(trainer.get_train_dataloader()))
    their_policy.eval()
    theirs = trainer.compute_loss(their_policy, dict(batch))
    theirs.backward()
    logged = {k: v[-1] for k, v in trainer._metrics["eval"].items()}

    idx, targets = dpo_batch(tok, pairs)
    rows = [trainer.train_dataset[i] for i in range(len(pairs))]
    for n, row in enumerate(rows):                        # TRL's token split is ours
        for k, key in enumerate(("chosen_ids", "rejected_ids")):
            line = k * len(pairs) + n
            assert row[key] == targets[line][targets[line] != -100].tolist()
    assert all(row["chosen_ids"][-1] == end_of_turn_id(tok) or data == "conversational"
               for row in rows)                           # TRL's added <|im_end|>, and ours
    dpo = DPO(policy, reference, beta=beta)
    ours = dpo(idx, targets)[1]
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert abs(ours.item() - math.log(2)) > 1e-2          # the policy is not the reference
    assert dpo.metrics["margin"] == pytest.approx(logged["rewards/margins"], abs=1e-5)

    # The plain pairs' gradients had needed 1e-4 of their size (2e-3 on the embedding): that
    # was TRL's fused LM head computing in float32 (Float64LogProbs says by how much). With
    # it in float64, plain and conversational pairs alike are within 1e-5 absolute.
    assert_gradients_equal(policy, their_policy)


# ----- GRPO -------------------------------------------------------------------------------

REPLIES = [["2 + 3 = 5", "2 + 3 = 6.", "5", "The sum of 2 and 3 is 5."],
           ["4 + 5 = 9", "4 + 5 = 9", "9, since 4 + 5 = 9.", "4 + 5 = 8"]]


@pytest.fixture(scope="module")
def grpo_case(path, tok):
    """Two prompts of one length (TRL pads prompts on the left, which moves the positions),
    four fixed replies each, with rewards and ``<|im_end|>`` closing each reply."""
    prompts = [apply_chat_template(tok, [{"role": "user", "content": f"What is {a} + {b}?"}],
                                   add_generation_prompt=True) for a, b in ((2, 3), (4, 5))]
    assert len(prompts[0]) == len(prompts[1])
    end = end_of_turn_id(tok)
    completions = [tok.encode(text) + [end] for group in REPLIES for text in group]
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    return prompts, completions, rewards


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("dapo", 0.04)])
def test_grpo_loss_equals_trl_on_smollm2_fixed_completions(path, tok, their_tok, loaded,
                                                           grpo_case, tmp_path, float64_head,
                                                           loss_type, beta):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts, completions, rewards = grpo_case
    group_size = 4
    model = perturb_norms(Llama.from_gguf(path, dtype=torch.float64))
    hf = theirs_from_ours(model, loaded).eval()
    advantages = group_advantages(rewards, group_size)
    idx, targets = completion_batch(prompts, completions)
    start = len(prompts[0]) - 1
    log_probs = per_token_log_probs(model(idx)[0], targets)[:, start:]      # (8, T)
    mask = targets[:, start:] != -100
    length = mask.shape[1]
    g = torch.Generator().manual_seed(1)
    noise = 0.3 * torch.randn((2, *log_probs.shape), generator=g, dtype=torch.float64)
    old = (log_probs.detach() + noise[0]).masked_fill(~mask, 0)
    ref = (log_probs.detach() + noise[1]).masked_fill(~mask, 0)
    ours = grpo_loss(log_probs, old, advantages, mask, epsilon=0.2, beta=beta,
                     ref_log_probs=ref if beta else None, loss_type=loss_type)

    end = end_of_turn_id(tok)
    completion_ids = torch.tensor([c + [end] * (length - len(c)) for c in completions])
    prompt_ids = torch.tensor(prompts).repeat_interleave(group_size, dim=0)
    # with beta > 0 TRL's constructor loads a reference model by the policy's name; here the
    # reference's log-probabilities are given as inputs, so beta is set after construction
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[],
                      save_strategy="no", disable_tqdm=True, loss_type=loss_type, beta=0.0,
                      epsilon=0.2, num_generations=group_size, per_device_train_batch_size=8,
                      max_completion_length=length, temperature=1.0, bf16=False,
                      use_bias_correction_kl=False)
    trainer = GRPOTrainer(model=hf, args=args, processing_class=their_tok,
                          train_dataset=Dataset.from_list([{"prompt": "x"}] * 8),
                          reward_funcs=lambda completions, **kw: [0.0] * len(completions))
    trainer.beta = beta
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
              "completion_ids": completion_ids, "completion_mask": mask.long(),
              "advantages": advantages, "old_per_token_logps": old,
              "num_items_in_batch": mask.sum()}
    if beta:
        inputs["ref_per_token_logps"] = ref
    theirs = trainer._compute_loss(trainer.model, inputs)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-5)
    assert abs(ours.item()) > 1e-3                        # not trivially 0 on both sides
    ours.backward()
    theirs.backward()
    assert_gradients_equal(model, hf)
