"""What a new user's wrong calls get (issue: package hardening). Each case once crashed deep
inside torch, hung, or gave a silently wrong result; now it gets a TypeError or ValueError that
names the problem, or the right answer. Plus what nanoGPT and transformers users expect from
generate: eos_id, top_p, repetition penalties, -100 targets."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.data import pad_sequences  # noqa: E402
from minitransformer.generation import beam_search, generate, sample_next  # noqa: E402


def gpt(**changes) -> mt.GPT:
    sizes = dict(vocab_size=31, context_length=16, num_layers=2, num_heads=2, d_model=16)
    torch.manual_seed(0)
    return mt.GPT(mt.GPTConfig(**{**sizes, **changes})).eval()


def seq2seq() -> mt.Seq2Seq:
    torch.manual_seed(0)
    return mt.Seq2Seq(mt.Seq2SeqConfig(31, 31, 12, 1, 2, 16)).eval()


IDS = torch.tensor([[1, 2, 3], [4, 5, 6]])


# --- decode_step runs forward's checks -------------------------------------------------------

@pytest.mark.parametrize("idx, cache, error, message", [
    (IDS, mt.KVCache(3), ValueError, "kv_cache has 3 layers, the model 2 layers"),
    (IDS, None, TypeError, "kv_cache must be a KVCache"),
    (torch.tensor([[1, 31]]), mt.KVCache(2), ValueError, "token id 31, outside the vocabulary"),
    (IDS.float(), mt.KVCache(2), TypeError, "idx must be an integer tensor"),
    (IDS.to(torch.uint8), mt.KVCache(2), TypeError, "int64 or int32 token ids, got dtype "
                                                    "torch.uint8"),
    (IDS.to("meta"), mt.KVCache(2), ValueError, "idx is on meta and the model on cpu"),
])
def test_decode_step_checks_its_arguments_as_forward_does(idx, cache, error, message):
    model = gpt()
    with pytest.raises(error, match=message):
        model.decode_step(idx, cache)
    with pytest.raises(error, match=message):
        model(idx, kv_cache=cache) if cache is not None else model.decode_step(idx, cache)


def test_decode_step_refuses_a_cache_of_another_batch():
    model = gpt()
    cache = mt.KVCache(2)
    model.decode_step(IDS, cache)
    with pytest.raises(ValueError, match="kv_cache holds a batch of 2 rows and idx has 1"):
        model.decode_step(IDS[:1, :1], cache)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_small_integer_ids_are_refused_by_name_everywhere(dtype):
    with pytest.raises(TypeError, match=f"got dtype {dtype}: convert it with idx.long()"):
        gpt()(IDS.to(dtype))
    with pytest.raises(TypeError, match=f"got dtype {dtype}"):
        generate(gpt(), IDS.to(dtype), 2)
    with pytest.raises(TypeError, match=f"src must hold int64 or int32 token ids, got dtype "
                                        f"{dtype}"):
        seq2seq().translate(IDS.to(dtype), 3)


def test_int32_ids_and_targets_work():
    model = gpt()
    logits, loss = model(IDS.int(), IDS.int())
    expected, expected_loss = model(IDS, IDS)
    assert torch.equal(logits, expected) and torch.equal(loss, expected_loss)


def test_ids_on_another_device_than_the_model_are_refused():
    with pytest.raises(ValueError, match="idx is on meta and the model on cpu"):
        gpt()(IDS.to("meta"))
    with pytest.raises(ValueError, match="src is on meta and the model on cpu"):
        seq2seq().translate(IDS.to("meta"), 3)
    with pytest.raises(ValueError, match="idx is on meta and the model on cpu"):
        generate(gpt(), IDS.to("meta"), 2)


# --- small things that were silently wrong ---------------------------------------------------

def test_a_bool_is_not_a_layer_of_the_cache():
    key = torch.zeros(1, 2, 1, 4)
    with pytest.raises(ValueError, match="layer_idx must be an int in \\[0, 2\\), got True"):
        mt.KVCache(2).update(True, key, key)


def test_pad_sequences_refuses_negative_and_non_integer_ids():
    with pytest.raises(ValueError, match=r"token ids \(sequences\[0\]\) must be at least 0, "
                                         r"got -5"):
        pad_sequences([[-5, 2]])
    with pytest.raises(TypeError, match=r"token ids \(sequences\[1\]\) must be an int"):
        pad_sequences([[1], [2.5]])
    with pytest.raises(TypeError, match=r"sequences\[0\] must be a list of token ids"):
        pad_sequences(["abc"])


def test_beam_search_refuses_more_beams_than_tokens():
    with pytest.raises(ValueError, match="beam_size=40 is more than the 31 target tokens"):
        beam_search(seq2seq(), IDS, beam_size=40, max_new_tokens=3)


def test_seq2seq_config_is_frozen():
    config = mt.Seq2SeqConfig(31, 31, 12, 1, 2, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.eos_id = config.bos_id
    assert dataclasses.replace(config, d_model=32).d_ff == 64       # d_ff default kept for 16


def test_exact_match_of_no_rows_is_an_error_not_a_zero_division():
    empty = torch.zeros(0, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="exact_match needs at least one row"):
        mt.exact_match(empty, empty)


# --- generate checks the model it is given ---------------------------------------------------

def test_generate_points_encoder_decoder_users_to_translate_and_beam_search():
    with pytest.raises(TypeError, match=r"use model.translate\(src, max_new_tokens\) or "
                                        r"beam_search"):
        generate(seq2seq(), IDS, 3)


@pytest.mark.parametrize("model", [nn.Linear(2, 2), nn.Identity(), "gpt"])
def test_generate_refuses_what_is_not_a_language_model(model):
    with pytest.raises(TypeError, match="(generate needs a language model such as GPT|"
                                        "model must be an nn.Module)"):
        generate(model, IDS, 3)


def test_a_prompt_longer_than_the_context_is_refused_not_cropped():
    """The choice (documented in generate): refused. Learned positions end at the context."""
    with pytest.raises(ValueError, match="has 17 positions, more than context_length=16"):
        generate(gpt(), torch.zeros(1, 17, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="make 17, more than context_length=16"):
        generate(gpt(), torch.zeros(1, 10, dtype=torch.long), 7)


# --- eos_id -----------------------------------------------------------------------------------

class Scripted(nn.Module):
    """A 'language model' whose next token is fixed per row and step: its logits put all the
    weight on script[row][step]."""

    def __init__(self, script: list[list[int]], vocab_size: int = 10):
        super().__init__()
        self.script = script
        self.config = mt.GPTConfig(vocab_size, 32, 1, 1, 4)
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, idx, targets=None, *, kv_cache=None):
        step = idx.shape[1] - 3                                   # prompts of 3 tokens
        logits = torch.full((idx.shape[0], idx.shape[1], self.config.vocab_size), -10.0)
        for row, tokens in enumerate(self.script):
            logits[row, -1, tokens[min(step, len(tokens) - 1)]] = 10.0
        return logits, None


def test_eos_stops_each_row_pads_it_with_eos_and_ends_when_all_stopped():
    model = Scripted([[4, 9, 5, 5, 5, 5], [4, 4, 4, 9, 6, 6]])
    out = generate(model, IDS, 6, use_cache=False, temperature=0, eos_id=9)
    assert out[:, 3:].tolist() == [[4, 9, 9, 9], [4, 4, 4, 9]]   # ended after 4 of 6 steps
    out = generate(model, IDS, 6, use_cache=False, temperature=0)
    assert out.shape == (2, 9)
    with pytest.raises(ValueError, match="eos_id=10 is not a token of the vocabulary"):
        generate(model, IDS, 2, use_cache=False, eos_id=10)


def test_eos_with_the_cache_gives_the_same_tokens():
    model = gpt()
    free = generate(model, IDS, 10, temperature=0)
    eos = int(free[0, 5])
    cached, uncached = (generate(model, IDS, 10, temperature=0, eos_id=eos, use_cache=use)
                        for use in (True, False))
    assert torch.equal(cached, uncached)
    assert (cached[0, 5:] == eos).all()


# --- top_p ------------------------------------------------------------------------------------

@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.7, 0.95, 1.0])
def test_top_p_keeps_what_transformers_top_p_warper_keeps(top_p):
    transformers = pytest.importorskip("transformers")
    logits = torch.randn(6, 31, generator=torch.Generator().manual_seed(0)) * 3
    warper = transformers.generation.logits_process.TopPLogitsWarper(top_p)
    kept_theirs = torch.isfinite(warper(None, logits.clone()))
    draws = sample_next(logits.repeat(300, 1), top_p=top_p,
                        generator=torch.Generator().manual_seed(0)).view(300, 6)
    for row in range(6):
        drawn = set(draws[:, row].tolist())
        allowed = set(torch.nonzero(kept_theirs[row]).flatten().tolist())
        assert drawn <= allowed
    from minitransformer.generation import _outside_nucleus
    assert torch.equal(~_outside_nucleus(logits - logits.amax(-1, keepdim=True), top_p),
                       kept_theirs)


@pytest.mark.parametrize("top_p, error", [(0, ValueError), (1.5, ValueError),
                                          (float("nan"), ValueError), ("0.5", TypeError)])
def test_top_p_is_checked_as_top_k_is(top_p, error):
    with pytest.raises(error, match="top_p"):
        sample_next(torch.zeros(3), top_p=top_p)
    with pytest.raises(error, match="top_p"):
        generate(gpt(), IDS, 2, top_p=top_p)


# --- presence and frequency penalties --------------------------------------------------------

def test_penalties_subtract_as_openai_defines_them():
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    counts = torch.tensor([[3, 0, 1, 0]])
    assert sample_next(logits, temperature=0).item() == 0
    # 2 - 0.5 * 1 = 1.5 < 1.9: token 1 wins
    assert sample_next(logits, temperature=0, presence_penalty=0.5, counts=counts).item() == 1
    # 2 - 0.05 * 3 = 1.85 < 1.9
    assert sample_next(logits, temperature=0, frequency_penalty=0.05, counts=counts).item() == 1
    assert sample_next(logits, temperature=0, frequency_penalty=0.01, counts=counts).item() == 0
    with pytest.raises(ValueError, match="presence_penalty must be finite"):
        sample_next(logits, presence_penalty=float("inf"), counts=counts)
    with pytest.raises(ValueError, match="needs counts of the logits' shape"):
        sample_next(logits, frequency_penalty=1.0)


def test_generate_counts_only_generated_tokens_for_the_penalties():
    model = Scripted([[4, 4, 4, 4]])
    prompt = torch.tensor([[7, 7, 7]])
    # the prompt is not counted: a huge presence penalty stops 4 only after it is written
    with torch.no_grad():
        out = generate(model, prompt, 3, use_cache=False, temperature=0,
                       presence_penalty=100.0)
    assert out[0, 3].item() == 4
    assert out[0, 4].item() != 4 and out[0, 5].item() != 4


def test_a_presence_penalty_reduces_repeats_of_a_gpt():
    model = gpt(vocab_size=31, context_length=64)
    prompt = torch.tensor([[1, 2, 3]])
    plain = generate(model, prompt, 60, temperature=0)[0, 3:]
    penalised = generate(model, prompt, 60, temperature=0, presence_penalty=5.0)[0, 3:]
    assert len(set(penalised.tolist())) > len(set(plain.tolist()))
    cached, uncached = (generate(model, prompt, 30, temperature=0, frequency_penalty=0.5,
                                 use_cache=use) for use in (True, False))
    assert torch.equal(cached, uncached)


# --- the fast decode step follows either GELU -------------------------------------------------

def test_the_tanh_gelu_keeps_the_fast_decode_step_and_matches_forward():
    model = gpt(activation="gelu_tanh")
    assert model._is_as_built()
    cache = mt.KVCache(2)
    step = model.decode_step(IDS, cache)
    assert torch.equal(step, model(IDS)[0])
    exact = gpt()
    assert not torch.equal(exact(IDS)[0], model(IDS)[0])         # the GELU matters
