"""Nothing the package creates lands on an implicit device.

Every public function and module runs here with ``torch.set_default_device("meta")``, DEVICE
inputs and ``device="cpu"``: a tensor made without an explicit device would land on "meta", so
every tensor that comes back (outputs, parameters, buffers) must be on the DEVICE. This is the
cheap proof, without a GPU, that nothing ends up on the wrong device on a CUDA machine.

To cover a new public name, append a case below (``@case("name")`` on a function that builds DEVICE
inputs and returns what the name produced), or list it in ``NOT_TENSOR_CREATING`` with the reason.
A name in ``minitransformer.__all__`` that is in neither fails
``test_every_public_name_is_covered``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import minitransformer as mt  # noqa: E402

# The device the cases build their inputs and modules on: the CPU, or the `device` fixture's
# (tests/conftest.py: CUDA too, when PyTorch sees a GPU), set by the test for each case.
DEVICE = "cpu"

# Public names that create no tensor (plain Python, numpy or matplotlib), with the reason.
NOT_TENSOR_CREATING = {
    "BPETokenizer": "pure Python: strings and lists of ids",
    "GPT2_PATTERN": "a regular expression string",
    "SkipModel": "numpy tables",
    "Vocabulary": "words and Python ints",
    "chain_graph": "a matplotlib figure of a numpy table",
    "default_device": "returns a torch.device, creates no tensor",
    "embedding_scatter": "a matplotlib figure",
    "one_hot": "numpy",
    "positional_encoding_heatmap": "a matplotlib figure",
    "probability_bars": "a matplotlib figure",
    "second_order_matrix": "numpy",
    "tokenize": "strings",
    "transition_matrix": "numpy",
    "walk_chain": "numpy",
}

# Public name -> a function that calls it on DEVICE inputs and returns what it produced.
CASES: dict[str, Callable[[], object]] = {}


def case(*names: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    def register(function: Callable[[], object]) -> Callable[[], object]:
        for name in names:
            CASES[name] = function
        return function
    return register


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=dtype,
                       generator=torch.Generator(device=DEVICE).manual_seed(0))


# --- the cases (append yours at the end) -------------------------------------------------------

@case("softmax")
def _softmax():
    return mt.softmax(randn(2, 5).masked_fill(torch.eye(2, 5, device=DEVICE).bool(), float("-inf")))


@case("causal_mask")
def _causal_mask():
    return mt.causal_mask(3, 5), mt.causal_mask(4, device=DEVICE)


@case("padding_mask")
def _padding_mask():
    return mt.padding_mask(torch.tensor([[1, 2, 0]], device=DEVICE), 0)


@case("sinusoidal_positional_encoding")
def _positional():
    return (mt.sinusoidal_positional_encoding(5, 8, offset=3, device=DEVICE),
            mt.sinusoidal_positional_encoding(5, 8, dtype=torch.float64))


@case("scaled_dot_product_attention")
def _sdpa():
    q, k, v = randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 3)
    mask = mt.causal_mask(4, 6, device=DEVICE)
    return (mt.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.2, return_weights=True),
            mt.scaled_dot_product_attention(q, k, v, torch.zeros(4, 6, device=DEVICE)))


@case("blocked_attention")
def _blocked():
    q, k, v = randn(2, 9, 8), randn(2, 9, 8), randn(2, 9, 3)
    with torch.no_grad():      # the scratch-buffer path
        scratch = mt.blocked_attention(q, k, v, mt.causal_mask(9, device=DEVICE), query_block=4)
    return scratch, mt.blocked_attention(q.requires_grad_(), k, v, query_block=4)


@case("MultiHeadAttention")
def _mha():
    mha = mt.MultiHeadAttention(8, 2, dropout=0.1, device=DEVICE)
    x, memory = randn(2, 3, 8), randn(2, 5, 8)
    mask = mt.padding_mask(torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], device=DEVICE), 0)
    return (mha, mha(x, memory, attn_mask=mask), mha(x, return_weights=True),
            mha.attend(x, x, x, attn_mask=mt.causal_mask(3, device=DEVICE)),
            mt.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, device=DEVICE)),
            mha.to_torch())


@case("sample_next")
def _sample_next():
    logits = randn(3, 7)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    return (mt.sample_next(logits, temperature=0.8, top_k=3, generator=generator),
            mt.sample_next(logits, temperature=0), mt.sample_next(randn(0, 7)))


@case("FeedForward")
def _feed_forward():
    block = mt.FeedForward(8, 16, dropout=0.1, activation="gelu", device=DEVICE)
    return block, block(randn(2, 3, 8))


@case("layer_norm")
def _layer_norm_function():
    return mt.layer_norm(randn(2, 3, 8), randn(8), randn(8))


@case("LayerNorm")
def _layer_norm():
    norm = mt.LayerNorm(8, device=DEVICE)
    return norm, norm(randn(2, 3, 8))


@case("EncoderLayer")
def _encoder_layer():
    layer = mt.EncoderLayer(8, 2, 16, dropout=0.1, device=DEVICE)
    x = randn(2, 3, 8)
    return layer, layer(x, attn_mask=mt.causal_mask(3, device=DEVICE))


@case("DecoderLayer")
def _decoder_layer():
    layer = mt.DecoderLayer(8, 2, 16, dropout=0.1, norm_first=True, device=DEVICE)
    x, memory = randn(2, 3, 8), randn(2, 5, 8)
    return layer, layer(x, memory, tgt_mask=mt.causal_mask(3, device=DEVICE))


@case("heatmap")
def _heatmap():
    scores = randn(3, 3).masked_fill(~mt.causal_mask(3, device=DEVICE), float("-inf"))
    return mt.heatmap(scores)


@case("KVCache")
def _kv_cache():
    grown, preallocated = mt.KVCache(2), mt.KVCache(2, max_len=6)
    new = randn(2, 3, 4, 8)
    return grown.update(0, new, new), grown.update(0, new, new), \
        preallocated.update(1, new, new), preallocated.keys, preallocated.values


@case("GPT", "GPTConfig")
def _gpt():
    from minitransformer.data import cue_batch, random_batches, token_stream

    results = []
    for positional in ("learned", "sinusoidal"):
        config = mt.GPTConfig(vocab_size=47, context_length=8, num_layers=1, num_heads=2,
                              d_model=8, positional=positional)
        model = mt.GPT(config, device=DEVICE)
        idx = torch.tensor([[1, 2, 3]], device=DEVICE)
        results += [model, model(idx, idx), model.attention_weights(idx)]
    vocab = mt.Vocabulary.from_sentences(["check the server if it ran hot please"],
                                         specials=("<eos>",))
    stream = token_stream(["check the server if it ran hot please"] * 2, vocab, device=DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    batches = random_batches(stream, batch_size=2, context_length=4, generator=generator)
    cues = cue_batch(["check the server if it ran hot please"], vocab, device=DEVICE)
    return results, stream, next(batches), cues


@case("generate", "stream_tokens", "SamplingParams")
def _generate():
    config = mt.GPTConfig(vocab_size=9, context_length=8, num_layers=1, num_heads=2, d_model=8)
    model = mt.GPT(config, device=DEVICE)
    prompt = torch.tensor([[1, 2]], device=DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    # a stream runs on the model's device (a meta tensor could not give its tokens as ints)
    streamed = list(mt.stream_tokens(model, [1, 2], 3, sampling=mt.SamplingParams(seed=0)))
    return (mt.generate(model, prompt, 3, generator=generator, top_k=2),
            mt.generate(model, prompt, 3, temperature=0),
            torch.tensor(streamed, device=DEVICE))


@case("train", "evaluate")
def _train():
    config = mt.GPTConfig(vocab_size=9, context_length=8, num_layers=1, num_heads=2, d_model=8)
    model = mt.GPT(config, device=DEVICE)
    batch = (torch.tensor([[1, 2, 3]], device=DEVICE), torch.tensor([[2, 3, 4]], device=DEVICE))
    history = mt.train(model, [batch], steps=2, lr=1e-3, val_batches=[batch], eval_every=1,
                       progress=False)
    assert isinstance(mt.evaluate(model, [batch]), float) and len(history.val_losses) == 2
    return model


@case("Seq2Seq", "Seq2SeqConfig", "beam_search", "exact_match")
def _seq2seq():
    from minitransformer.data import (
        translation_batch,
        translation_batches,
        translation_vocabularies,
    )

    config = mt.Seq2SeqConfig(src_vocab_size=49, tgt_vocab_size=49, context_length=16,
                              num_layers=1, num_heads=2, d_model=8, label_smoothing=0.1)
    model = mt.Seq2Seq(config, device=DEVICE)
    src_vocab, tgt_vocab = translation_vocabularies()
    pairs = [("delete songs", "kanti tilo"), ("show me my files please", "bo dosi mia mi miro")]
    src, tgt_in, targets = translation_batch(pairs, src_vocab, tgt_vocab, device=DEVICE)
    batches = translation_batches(pairs, src_vocab, tgt_vocab, batch_size=2, device=DEVICE)
    greedy = model.translate(src, 5)
    return (model, model(src, tgt_in, targets), model.cross_attention_weights(src, tgt_in),
            greedy, model.translate(src, 5, use_cache=False), next(batches),
            mt.beam_search(model, src, beam_size=3, max_new_tokens=5),
            mt.exact_match(greedy, targets), model.read_source(src).repeat_interleave(2))


@case("EncoderClassifier")
def _encoder_classifier():
    from minitransformer.classifier import EncoderConfig

    config = EncoderConfig(vocab_size=9, context_length=6, num_layers=1, num_heads=2, d_model=8)
    idx = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]], device=DEVICE)
    labels = torch.tensor([0, 1], device=DEVICE)
    results = []
    for pooling in ("cls", "mean"):
        model = mt.EncoderClassifier(config, 2, pooling=pooling, device=DEVICE)
        results += [model, model(idx, labels), model.encode(idx)]
    return results


@case("rms_norm", "RMSNorm")
def _rms_norm():
    norm = mt.RMSNorm(8, device=DEVICE)
    return norm, norm(randn(2, 3, 8)), mt.rms_norm(randn(2, 3, 8), randn(8))


@case("SwiGLU")
def _swiglu():
    block = mt.SwiGLU(8, 12, device=DEVICE)
    return block, block(randn(2, 3, 8))


@case("rotary_angles", "apply_rotary", "rotate_half")
def _rotary():
    cos, sin = mt.rotary_angles(3, 8, offset=2)
    x = randn(1, 2, 3, 8)
    return (cos, sin, mt.rotary_angles(3, 8, device=DEVICE, dtype=torch.float64),
            mt.apply_rotary(x, cos, sin), mt.rotate_half(x))


@case("GroupedQueryAttention", "expand_kv_heads")
def _gqa():
    attn = mt.GroupedQueryAttention(16, 4, num_kv_heads=2, device=DEVICE)
    x = randn(2, 3, 16)
    cache = mt.KVCache(1)
    return (attn, attn(x, rotary=mt.rotary_angles(3, 4), attn_mask=mt.causal_mask(3),
                       kv_cache=cache), cache.keys, mt.expand_kv_heads(randn(1, 2, 3, 4), 4))


@case("Llama", "LlamaConfig")
def _llama():
    config = mt.LlamaConfig(vocab_size=11, context_length=8, num_layers=1, num_heads=4,
                            d_model=16, num_kv_heads=2, tie_embeddings=True)
    model = mt.Llama(config, device=DEVICE)
    idx = torch.tensor([[1, 2, 3]], device=DEVICE)
    cache = mt.KVCache(1)
    return (model, model(idx, idx), model(idx, kv_cache=cache), cache.keys,
            model.decode_step(idx[:, :1], mt.KVCache(1)),
            mt.generate(model, idx, 3, temperature=0))


@case("DPO", "dpo_batch", "dpo_loss", "dpo_train", "implicit_rewards", "kl_estimate",
      "per_token_log_probs", "preference_accuracy", "preference_batch", "sequence_log_probs")
def _preferences():
    from minitransformer.chat import CHAT_TOKENS

    tokenizer = mt.BPETokenizer.train("the cat sat on the mat " * 4, 262,
                                      special_tokens=CHAT_TOKENS)
    pairs = [{"prompt": "the cat", "chosen": " sat", "rejected": " mat"},
             {"prompt": [{"role": "user", "content": "cat?"}],
              "chosen": [{"role": "assistant", "content": "sat"}],
              "rejected": [{"role": "assistant", "content": "mat"}]}]
    config = mt.GPTConfig(vocab_size=len(tokenizer), context_length=32, num_layers=1,
                          num_heads=2, d_model=8)
    policy = mt.GPT(config, device=DEVICE)
    idx, targets = mt.dpo_batch(tokenizer, pairs, device=DEVICE)
    dpo = mt.DPO(policy, beta=0.1)
    logits, loss = dpo(idx, targets)
    scores = mt.sequence_log_probs(logits, targets)
    chosen, rejected = scores.chunk(2)
    assert isinstance(mt.preference_accuracy(chosen, rejected), float)
    history = mt.dpo_train(policy, tokenizer, pairs, steps=2, lr=1e-3, batch_size=2,
                           progress=False)
    assert len(history.train_losses) == 2
    return (idx, targets, dpo, loss, scores, mt.per_token_log_probs(logits, targets),
            mt.preference_batch(tokenizer, ["the"], [" cat"], device=DEVICE),
            mt.implicit_rewards(chosen, rejected, beta=0.1),
            mt.dpo_loss(chosen, rejected, chosen, rejected, beta=0.1),
            mt.kl_estimate(logits, logits.detach(), targets))


@case("group_advantages", "grpo_loss", "sample_group", "grpo_step", "grpo_train")
def _grpo():
    from minitransformer import data
    from minitransformer.chat import CHAT_TOKENS

    advantages = mt.group_advantages(torch.tensor([0.0, 1.0, 1.0, 3.0], device=DEVICE), 2)
    log_probs = randn(4, 3).requires_grad_()
    mask = torch.ones(4, 3, dtype=torch.bool, device=DEVICE)
    loss = mt.grpo_loss(log_probs, log_probs.detach(), advantages, mask, beta=0.1,
                        ref_log_probs=randn(4, 3))
    config = mt.GPTConfig(vocab_size=16, context_length=16, d_model=8, num_heads=2,
                          num_layers=1)
    model = mt.GPT(config, device=DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    assert len(mt.sample_group(model, [[1, 2], [3]], 2, 3, generator=generator)) == 4
    mt.grpo_step(model, torch.optim.AdamW(model.parameters()), [[1, 2]],
                 lambda completions: [float(sum(c)) for c in completions], group_size=2,
                 max_new_tokens=3, ref_model=model, generator=generator)
    tok = mt.BPETokenizer.train("repeat: open my photos please " * 4, 270,
                                special_tokens=list(CHAT_TOKENS))
    chat = mt.GPT(mt.GPTConfig(vocab_size=len(tok), context_length=64, d_model=8,
                               num_heads=2, num_layers=1), device=DEVICE)
    rows = data.verifiable_splits(2, 0, tasks=["repeat"])[0]
    mt.grpo_train(chat, tok, rows, data.reward_exact, steps=1, batch_size=2, group_size=2,
                  lr=1e-3, max_new_tokens=3)
    return advantages, loss, log_probs.grad, model, chat

@case("left_pad", "generate_batch")
def _batching():
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(vocab_size=11, context_length=8, num_layers=1, num_heads=2,
                                d_model=8), device=DEVICE)
    llama = mt.Llama(mt.LlamaConfig(vocab_size=11, context_length=8, num_layers=1, num_heads=2,
                                    d_model=8), device=DEVICE)
    idx, mask, positions = mt.left_pad([[1, 2, 3], [4]], pad_id=0, device=DEVICE)
    tokens = [mt.generate_batch(m, [[1, 2], [3]], 2, temperature=0.5, seeds=[1, 2],
                                presence_penalty=0.1) for m in (model, llama)]
    return (idx, mask, positions, model(idx, attention_mask=mask)[0],
            llama(idx, attention_mask=mask, position_ids=positions)[0],
            torch.tensor(tokens, device=DEVICE))


@case("BlockPool", "gather_blocks", "paged_attention", "merge_partials")
def _paged():
    pool = mt.BlockPool(4, 2, num_layers=1, num_kv_heads=1, head_dim=4, device=DEVICE)
    table = pool.allocate(2)
    view = pool.view([table], [0], 3)
    keys, values = view.update(0, randn(1, 1, 3, 4), randn(1, 1, 3, 4))
    m, total, out = mt.merge_partials(randn(2), randn(2).exp(), randn(2, 3),
                                      randn(2), randn(2).exp(), randn(2, 3))
    return (pool.keys, pool.values, view.attention_mask, view.position_ids, keys, values,
            mt.gather_blocks(pool.keys[0], table, 3),
            mt.paged_attention(randn(2, 4), pool.keys[0], pool.values[0], table, 3),
            m, total, out)


@case("Engine", "Request")
def _engine():
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(vocab_size=11, context_length=16, num_layers=1, num_heads=2,
                                d_model=8), device=DEVICE)
    engine = mt.Engine(model, max_batch=2, kv_blocks=6, block_size=2)
    done = engine.run([mt.Request([1, 2, 3], max_tokens=4, temperature=0),
                       mt.Request([4], max_tokens=3, temperature=0.8, seed=1,
                                  frequency_penalty=0.5)])
    return engine.pool.keys, torch.tensor([c.token_ids[:3] for c in done], device=DEVICE)


# --- the tests ------------------------------------------------------------------------------

@pytest.fixture
def meta_default_device():
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(previous)
        plt.close("all")


def tensors_in(result: object) -> Iterator[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, nn.Module):
        yield from result.parameters()
        yield from result.buffers()
    elif isinstance(result, (tuple, list)):
        for item in result:
            yield from tensors_in(item)
    elif isinstance(result, dict):
        for item in result.values():
            yield from tensors_in(item)


@pytest.mark.parametrize("name", sorted(CASES))
def test_everything_is_created_on_the_inputs_device_when_the_default_device_is_meta(
        name, device, meta_default_device, monkeypatch):
    monkeypatch.setitem(globals(), "DEVICE", str(device))
    assert torch.empty(1).device.type == "meta"          # the trap is set
    result = CASES[name]()
    tensors = list(tensors_in(result))
    if name != "heatmap":
        assert tensors, f"the {name} case returned no tensor to check"
    for tensor in tensors:
        assert tensor.device.type == device.type, f"{name} made a tensor of shape " \
                                                  f"{tuple(tensor.shape)} on {tensor.device}"


def test_the_default_device_is_restored(meta_default_device):
    assert torch.empty(1).device.type == "meta"


def test_the_default_device_was_restored_after_the_other_tests():
    assert torch.empty(1).device.type == "cpu"


def test_every_public_name_is_covered():
    public = set(mt.__all__)
    missing = sorted(public - set(CASES) - set(NOT_TENSOR_CREATING))
    assert not missing, f"add a case (or a NOT_TENSOR_CREATING reason) for {missing}"
    assert not set(CASES) & set(NOT_TENSOR_CREATING)
    assert set(CASES) | set(NOT_TENSOR_CREATING) <= public, "a listed name is not public"


def test_numpy_names_listed_as_not_tensor_creating_really_return_no_tensor():
    vocab = mt.Vocabulary(["a", "b"])
    matrix = mt.transition_matrix(["a b a"], vocab)
    assert isinstance(matrix, np.ndarray)
    assert isinstance(mt.one_hot([0, 1], 2), np.ndarray)
    assert mt.walk_chain(matrix, vocab, "a", rng=np.random.default_rng(0), max_len=3) == \
        ["a", "b", "a"]
