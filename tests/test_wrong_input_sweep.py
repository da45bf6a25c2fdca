"""No public function crashes from inside on wrong input (issue: package hardening).

Each entry below is a call that works. The sweep replaces one argument at a time by each value
of ``WRONG`` and calls again: the call must succeed or raise ``TypeError``/``ValueError`` (or
``FileNotFoundError`` for paths) -- never ``IndexError``, ``KeyError``, ``AttributeError``,
``StopIteration``, ``ZeroDivisionError`` or a ``RuntimeError`` from inside torch.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer import data  # noqa: E402

WRONG = [None, "x", -1, 0, 2.5, True, [], [[]], [[-1]], {}, torch.tensor([]),
         torch.zeros(0, 0), torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long),
         torch.full((2, 3), -7), torch.zeros(2, 3, 4), np.zeros((2, 3)), float("nan"), object()]
ALLOWED = (TypeError, ValueError, FileNotFoundError)
# a word looked up in a Vocabulary raises KeyError naming the word, as a dict does (documented)
LOOKUPS = {"Vocabulary.encode", "Vocabulary.index", "Vocabulary.decode", "transition_matrix",
           "second_order_matrix", "token_stream", "cue_batch"}

torch.manual_seed(0)
VOCAB = mt.Vocabulary.from_sentences(["check the program ran", "run the tests"],
                                     specials=(data.EOS,))
GPT = mt.GPT(mt.GPTConfig(11, 8, 1, 2, 8)).eval()
S2S = mt.Seq2Seq(mt.Seq2SeqConfig(11, 11, 8, 1, 2, 8)).eval()
LLAMA = mt.Llama(mt.LlamaConfig(11, 8, 1, 4, 16, num_kv_heads=2)).eval()
IDS = torch.tensor([[3, 4, 5], [5, 6, 7]])
Q = torch.randn(2, 4, 3, 4)                                      # (B, h, T, head_dim)
MHA = mt.MultiHeadAttention(8, 2)
X = torch.randn(2, 3, 8)


def _batches():
    return [(IDS, IDS)]


# name -> (callable, positional args, keyword args) of a call that works
CALLS = {
    "GPT.forward": (GPT, (IDS,), {"targets": IDS}),
    "GPT.decode_step": (GPT.decode_step, (IDS, mt.KVCache(1)), {}),
    "GPT.attention_weights": (GPT.attention_weights, (IDS,), {}),
    "GPT.embed": (GPT.embed, (IDS,), {"offset": 0}),
    "GPTConfig": (mt.GPTConfig, (11, 8, 1, 2, 8), {"dropout": 0.1}),
    "generate": (mt.generate, (GPT, IDS, 2), {"temperature": 0.5, "top_k": 3, "top_p": 0.9,
                                              "presence_penalty": 0.1, "eos_id": 2}),
    "sample_next": (mt.sample_next, (torch.randn(2, 11),), {"temperature": 1.0, "top_k": 2}),
    "train": (mt.train, (GPT, _batches()), {"steps": 1, "lr": 1e-3, "val_batches": _batches(),
                                            "progress": False}),
    "evaluate": (mt.evaluate, (GPT, _batches()), {}),
    "Seq2Seq.forward": (S2S, (IDS, torch.tensor([[1, 4], [1, 5]])), {}),
    "Seq2Seq.translate": (S2S.translate, (IDS, 3), {}),
    "Seq2Seq.encode": (S2S.encode, (IDS,), {}),
    "beam_search": (mt.beam_search, (S2S, IDS), {"beam_size": 2, "max_new_tokens": 3}),
    "exact_match": (mt.exact_match, (IDS, IDS), {}),
    "Seq2SeqConfig": (mt.Seq2SeqConfig, (11, 11, 8, 1, 2, 8), {}),
    "KVCache": (mt.KVCache, (2,), {"max_len": 4}),
    "KVCache.update": (mt.KVCache(2).update, (0, torch.zeros(1, 2, 1, 4),
                                              torch.zeros(1, 2, 1, 4)), {}),
    "MultiHeadAttention": (MHA, (X,), {}),
    "scaled_dot_product_attention": (mt.scaled_dot_product_attention, (X, X, X), {}),
    "blocked_attention": (mt.blocked_attention, (X, X, X), {}),
    "causal_mask": (mt.causal_mask, (3,), {}),
    "padding_mask": (mt.padding_mask, (IDS, 0), {}),
    "softmax": (mt.softmax, (X,), {}),
    "layer_norm": (mt.layer_norm, (X, torch.ones(8), torch.zeros(8)), {}),
    "LayerNorm": (mt.LayerNorm(8), (X,), {}),
    "FeedForward": (mt.FeedForward(8, 16), (X,), {}),
    "EncoderLayer": (mt.EncoderLayer(8, 2, 16), (X,), {}),
    "DecoderLayer": (mt.DecoderLayer(8, 2, 16), (X, X), {}),
    "sinusoidal_positional_encoding": (mt.sinusoidal_positional_encoding, (4, 8), {}),
    "Vocabulary.encode": (VOCAB.encode, ("check the tests",), {}),
    "Vocabulary.decode": (VOCAB.decode, ([0, 1],), {}),
    "Vocabulary.index": (VOCAB.index, ("the",), {}),
    "one_hot": (mt.one_hot, ([0, 2], 3), {}),
    "tokenize": (mt.tokenize, ("a b",), {}),
    "transition_matrix": (mt.transition_matrix, (["check the program"], VOCAB), {}),
    "second_order_matrix": (mt.second_order_matrix, (["check the program"], VOCAB), {}),
    "pad_sequences": (data.pad_sequences, ([[1, 2], [3]],), {}),
    "token_stream": (data.token_stream, (["check the program"], VOCAB), {}),
    "shift_pairs": (data.shift_pairs, (IDS,), {}),
    "window_batches": (data.window_batches, (torch.arange(20),),
                       {"batch_size": 2, "context_length": 4}),
    "cue_batch": (data.cue_batch, (["check the program ran the"], VOCAB), {}),
    "command_sentences": (data.command_sentences, (3,), {}),
    "translation_batch": (data.translation_batch,
                          (data.translation_pairs(2),
                           *data.translation_vocabularies()), {}),
    "BPETokenizer.train": (mt.BPETokenizer.train, ("hello hello world", 260), {}),
    "BPETokenizer.decode": (mt.BPETokenizer().decode, ([104, 105],), {}),
    "BPETokenizer.encode": (mt.BPETokenizer().encode, ("hi",), {}),
    "heatmap": (mt.heatmap, (np.eye(2),), {}),
    "Llama.forward": (LLAMA, (IDS,), {"targets": IDS}),
    "Llama.decode_step": (LLAMA.decode_step, (IDS, mt.KVCache(1)), {}),
    "generate(Llama)": (mt.generate, (LLAMA, IDS, 2), {"temperature": 0, "eos_id": 2}),
    "LlamaConfig": (mt.LlamaConfig, (11, 8, 1, 4, 16), {"num_kv_heads": 2,
                                                        "rope_theta": 500.0}),
    "RMSNorm": (mt.RMSNorm(16), (torch.randn(2, 3, 16),), {}),
    "SwiGLU": (mt.SwiGLU(16, 24), (torch.randn(2, 3, 16),), {}),
    "GroupedQueryAttention": (mt.GroupedQueryAttention(16, 4, num_kv_heads=2),
                              (torch.randn(2, 3, 16),), {}),
    "rotary_angles": (mt.rotary_angles, (3, 4), {"offset": 2, "theta": 500.0}),
    "apply_rotary": (mt.apply_rotary, (Q, *mt.rotary_angles(3, 4)), {}),
    "expand_kv_heads": (mt.expand_kv_heads, (Q[:, :2], 4), {}),
    "rotate_half": (mt.rotate_half, (Q,), {}),
}


def _variants(args: tuple, kwargs: dict):
    for i in range(len(args)):
        for wrong in WRONG:
            yield f"arg {i} = {wrong!r:.30}", args[:i] + (wrong,) + args[i + 1:], kwargs
    for key in kwargs:
        for wrong in WRONG:
            yield f"{key} = {wrong!r:.30}", args, {**kwargs, key: wrong}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_wrong_arguments_get_a_type_or_value_error(name):
    function, args, kwargs = CALLS[name]
    function(*args, **kwargs)                                     # the call itself works
    crashes = []
    for described, a, k in _variants(args, kwargs):
        try:
            function(*a, **k)
        except ALLOWED:
            pass
        except KeyError as error:
            if name not in LOOKUPS or "vocabulary" not in str(error):
                crashes.append(f"{described}: KeyError: {str(error)[:120]}")
        except Exception as error:  # noqa: BLE001 - the point of the sweep
            crashes.append(f"{described}: {type(error).__name__}: {str(error)[:120]}")
        finally:
            plt.close("all")
    assert not crashes, f"{name}:\n" + "\n".join(crashes[:10])


def test_evaluate_checks_its_model():
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        mt.evaluate(None, _batches())
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        mt.evaluate(nn.Identity, _batches())
