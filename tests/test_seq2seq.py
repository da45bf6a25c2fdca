"""The encoder-decoder (seq2seq.py) and chapter 10's parallel corpus (data.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minitransformer import data
from minitransformer.cache import KVCache
from minitransformer.generation import beam_search
from minitransformer.masks import causal_mask, padding_mask
from minitransformer.seq2seq import (
    Seq2Seq,
    Seq2SeqConfig,
    SourceMemory,
    exact_match,
    strip_special,
)
from minitransformer.training import train
from helpers import one_thread  # noqa: F401 (a fixture)

PAD, BOS, EOS = 0, 1, 2


def small_config(**overrides) -> Seq2SeqConfig:
    sizes = {"src_vocab_size": 13, "tgt_vocab_size": 11, "context_length": 12, "num_layers": 2,
                 "num_heads": 2, "d_model": 16}
    return Seq2SeqConfig(**{**sizes, **overrides})


def small_model(seed: int = 0, **overrides) -> Seq2Seq:
    torch.manual_seed(seed)
    return Seq2Seq(small_config(**overrides)).eval()


def batch(seed: int = 1):
    """A padded source batch (rows of 6, 4 and 2 tokens) and a decoder input with targets."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 13, (3, 6), generator=g)
    src[1, 4:] = PAD
    src[2, 2:] = PAD
    tgt = torch.randint(3, 11, (3, 6), generator=g)
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


@pytest.fixture(scope="module")
def corpus():
    train_pairs, val_pairs = data.translation_splits(3000, 64, seed=0)
    src_vocab, tgt_vocab = data.translation_vocabularies()
    return train_pairs, val_pairs, src_vocab, tgt_vocab


@pytest.fixture(scope="module")
def trained(corpus):
    """A small model trained briefly on the corpus: it writes <eos>, mostly in the right place."""
    train_pairs, _, src_vocab, tgt_vocab = corpus
    torch.manual_seed(0)
    config = Seq2SeqConfig(len(src_vocab), len(tgt_vocab), 16, 1, 2, 32, d_ff=64)
    model = Seq2Seq(config)
    batches = data.translation_batches(train_pairs, src_vocab, tgt_vocab, batch_size=32)
    history = train(model, batches, steps=150, lr=1e-2, eval_every=50, progress=False)
    return model, history


# --- config and construction ---------------------------------------------------------------------

def test_config_defaults():
    config = small_config()
    assert config.d_ff == 4 * config.d_model
    assert (config.pad_id, config.bos_id, config.eos_id) == (0, 1, 2)
    assert config.dropout == config.label_smoothing == 0.0


@pytest.mark.parametrize("overrides, message", [
    ({"d_model": 15, "num_heads": 2}, "divisible"),
    ({"context_length": 0}, "context_length"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"dropout": -0.1}, "dropout"),
    ({"eos_id": 1}, "must differ"),
    ({"pad_id": 11}, "pad_id=11"),
])
def test_bad_config_is_a_value_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_config_must_be_a_config():
    with pytest.raises(TypeError, match="Seq2SeqConfig"):
        Seq2Seq({"d_model": 16})


def test_init_is_gpt2_style_and_the_head_is_tied():
    model = small_model()
    assert model.head.weight is model.tgt_token_embedding.weight
    weights = torch.cat([model.src_token_embedding.weight.flatten(),
                         model.encoder_layers[0].self_attn.q_proj.weight.flatten(),
                         model.decoder_layers[1].multihead_attn.k_proj.weight.flatten()])
    assert abs(weights.std().item() - 0.02) < 0.004
    assert model.decoder_layers[0].feed_forward.linear1.bias.abs().max() == 0
    config = small_config()
    src, tgt_in, targets = batch()
    _, loss = model(src, tgt_in, targets)
    assert abs(loss.item() - math.log(config.tgt_vocab_size)) < 0.5


def test_device_and_dtype_are_used():
    model = Seq2Seq(small_config(), device="cpu", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    src, tgt_in, targets = batch()
    logits, loss = model(src, tgt_in, targets)
    assert logits.dtype == loss.dtype == torch.float64


# --- shapes and the three masks ------------------------------------------------------------------

def test_shapes():
    model = small_model()
    src, tgt_in, _targets = batch()
    memory = model.encode(src)
    assert memory.shape == (3, 6, 16)
    assert model.decode(tgt_in, memory, src).shape == (3, 6, 11)
    logits, loss = model(src, tgt_in)
    assert logits.shape == (3, 6, 11) and loss is None
    weights = model.cross_attention_weights(src, tgt_in)
    assert len(weights) == 2 and weights[0].shape == (3, 2, 6, 6)   # (B, h, T_tgt, T_src)


def test_forward_is_encode_then_decode():
    model = small_model()
    src, tgt_in, _ = batch()
    logits, _ = model(src, tgt_in)
    torch.testing.assert_close(logits, model.decode(tgt_in, model.encode(src), src))


def test_later_target_tokens_do_not_change_earlier_logits():
    model = small_model()
    src, tgt_in, _ = batch()
    changed = tgt_in.clone()
    changed[:, 3:] = torch.randint(3, 11, (3, 3), generator=torch.Generator().manual_seed(5))
    before, _ = model(src, tgt_in)
    after, _ = model(src, changed)
    torch.testing.assert_close(before[:, :3], after[:, :3], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 3:], after[:, 3:])


def test_source_words_do_change_the_logits():
    model = small_model()
    src, tgt_in, _ = batch()
    other = src.clone()
    other[0, 0] = 3 if src[0, 0] != 3 else 4
    assert not torch.allclose(model(src, tgt_in)[0][0], model(other, tgt_in)[0][0])


def test_extra_source_padding_changes_no_logit():
    model = small_model()
    src, tgt_in, _ = batch()
    longer = torch.cat([src, torch.full((3, 5), PAD)], dim=1)
    torch.testing.assert_close(model(longer, tgt_in)[0], model(src, tgt_in)[0], rtol=0, atol=1e-5)
    memory, longer_memory = model.encode(src), model.encode(longer)
    real = src != PAD
    torch.testing.assert_close(longer_memory[:, :6][real], memory[real], rtol=0, atol=1e-5)


def test_padded_source_positions_get_exactly_zero_weight():
    model = small_model()
    src, tgt_in, _ = batch()
    for weights in model.cross_attention_weights(src, tgt_in):
        assert torch.all(weights[1, :, :, 4:] == 0) and torch.all(weights[2, :, :, 2:] == 0)
        assert torch.all(weights[1, :, :, :4] > 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 6))


def test_next_token_logits_from_projected_memory_equal_the_full_pass():
    """Memory projected once (SourceMemory.keys_values): the logits of decode, step by step."""
    model = small_model()
    src, tgt_in, _ = batch()
    source = model.read_source(src, use_cache=True)
    full = model.decode(tgt_in, model.encode(src), src)
    for t in range(1, 7):
        torch.testing.assert_close(model.next_token_logits(tgt_in[:, :t], source),
                                   full[:, t - 1], rtol=0, atol=1e-6)


def test_cross_attention_weights_equal_the_written_out_weights():
    """softmax(q k^T / sqrt(d_k)), q from each decoder layer's state after its self-attention,
    k from the memory, padding hidden."""
    model = small_model()
    src, tgt_in, _ = batch()
    memory, keep = model.encode(src), src != PAD                      # keep (B, T_src)
    causal = causal_mask(tgt_in.shape[1])
    with torch.no_grad():
        y = (model.tgt_token_embedding(tgt_in)
             + model.tgt_position_embedding(torch.arange(tgt_in.shape[1])))
        for layer, weights in zip(model.decoder_layers,
                                  model.cross_attention_weights(src, tgt_in)):
            attn = layer.multihead_attn
            h = y + layer.self_attn(layer.norm1(y), attn_mask=causal)
            q = attn.split_heads(attn.q_proj(layer.norm2(h)))          # (B, h, T_tgt, d_k)
            k = attn.split_heads(attn.k_proj(memory))                  # (B, h, T_src, d_k)
            scores = q @ k.transpose(-2, -1) / math.sqrt(attn.d_k)
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
            torch.testing.assert_close(weights, torch.softmax(scores, dim=-1))
            y = layer(y, memory, tgt_mask=causal, memory_mask=padding_mask(src, PAD))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_cross_attention_weights_are_taken_in_eval_mode_and_the_mode_restored(mode):
    """As translate does: no dropout in the weights a figure shows, and the mode unchanged."""
    model = small_model(dropout=0.5).train(mode == "train")
    src, tgt_in, _ = batch()
    weights = model.cross_attention_weights(src, tgt_in)
    assert all(m.training == (mode == "train") for m in model.modules())
    expected = small_model(dropout=0.5).cross_attention_weights(src, tgt_in)   # eval, same seed
    for got, want in zip(weights, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def randomize_decoder_norms(model: Seq2Seq) -> Seq2Seq:
    with torch.no_grad():
        for layer in model.decoder_layers:
            for norm in (layer.norm1, layer.norm2, layer.norm3):
                norm.weight.normal_(1.0, 0.3)
                norm.bias.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
def test_generation_runs_the_decoder_layers_own_block(norm_first):
    """Cached decoding and the weights go through DecoderLayer.decode, whatever its order: turned
    to post-norm, the step-by-step logits (memory projected once, target keys and values cached)
    still equal the full pass, and the weights still match the layer's own cross-attention."""
    model = randomize_decoder_norms(small_model())
    for layer in model.decoder_layers:
        layer.norm_first = norm_first
    src, tgt_in, _ = batch()
    full = model.decode(tgt_in, model.encode(src), src)
    source = model.read_source(src, use_cache=True)
    source = SourceMemory(torch.zeros_like(source.memory), source.mask, source.keys_values)
    cache = KVCache(2)
    for t in range(tgt_in.shape[1]):
        torch.testing.assert_close(model.next_token_logits(tgt_in[:, t:t + 1], source,
                                                           kv_cache=cache),
                                   full[:, t], rtol=0, atol=1e-5)
    mask = padding_mask(src, PAD)
    layer = model.decoder_layers[0]
    with torch.no_grad():
        y = model._embed(tgt_in, model.tgt_token_embedding, model.tgt_position_embedding)
        _, expected = layer.decode(y, model.encode(src), tgt_mask=causal_mask(tgt_in.shape[1]),
                                   memory_mask=mask, return_cross_weights=True)
    torch.testing.assert_close(model.cross_attention_weights(src, tgt_in)[0], expected)


def test_projected_memory_changes_no_random_draw_in_training():
    """With dropout, in training: the memory projected once gives the logits of the memory
    projected in the layer, under the same seed (a memory of zeros sits beside the keys and
    values, so they are what is read)."""
    model = small_model(dropout=0.3).train()
    src, tgt_in, _ = batch()
    with torch.no_grad():
        source = model.read_source(src, use_cache=True)
        projected = SourceMemory(torch.zeros_like(source.memory), source.mask,
                                 source.keys_values)
        plain = SourceMemory(source.memory, source.mask, None)

        def logits(seed, source):
            _ = torch.manual_seed(seed)
            return model.next_token_logits(tgt_in, source)
        torch.testing.assert_close(logits(1, projected), logits(1, plain), rtol=0, atol=0)
        assert not torch.allclose(logits(2, projected), logits(1, plain))


def test_padded_targets_are_left_out_of_the_loss():
    model = small_model()
    src, tgt_in, targets = batch()
    tgt_in, targets = tgt_in.clone(), targets.clone()
    targets[0, 4:] = PAD
    logits, loss = model(src, tgt_in, targets)
    keep = targets != PAD
    expected = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, expected)
    # more padding on the target side changes neither the real logits nor the loss
    longer_in = torch.cat([tgt_in, torch.full((3, 3), PAD)], dim=1)
    longer_targets = torch.cat([targets, torch.full((3, 3), PAD)], dim=1)
    longer_logits, longer_loss = model(src, longer_in, longer_targets)
    torch.testing.assert_close(longer_logits[:, :6], logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(longer_loss, loss, rtol=0, atol=1e-6)


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_follows_its_formula(eps):
    """loss = (1 - eps) * cross-entropy + eps * mean over the N words of -log p."""
    src, tgt_in, targets = batch()
    targets = targets.clone()
    targets[2, 3:] = PAD
    plain = small_model()
    smooth = small_model(label_smoothing=eps)
    logits, loss = smooth(src, tgt_in, targets)
    _, plain_loss = plain(src, tgt_in, targets)
    keep = targets != PAD
    log_p = logits[keep].log_softmax(-1)                        # (positions, N)
    nll = -log_p.gather(1, targets[keep][:, None]).mean()
    uniform = -log_p.mean(-1).mean()
    torch.testing.assert_close(loss, (1 - eps) * nll + eps * uniform)
    torch.testing.assert_close(nll, plain_loss)
    assert loss > plain_loss       # an untrained model: -log p of a random word is large


# --- decoding ------------------------------------------------------------------------------------

def test_translate_rows_start_with_bos_and_stop_at_eos(trained, corpus):
    model, _ = trained
    _, val_pairs, src_vocab, tgt_vocab = corpus
    src, _, _ = data.translation_batch(val_pairs, src_vocab, tgt_vocab)
    out = model.translate(src, 15)
    assert out.dtype == torch.long and out.shape[0] == len(val_pairs) and out.shape[1] <= 16
    assert torch.all(out[:, 0] == BOS)
    ended = 0
    for row in out.tolist():
        if EOS in row:
            ended += 1
            assert all(token == PAD for token in row[row.index(EOS) + 1:])
        assert BOS not in row[1:]
    assert ended >= 0.8 * len(val_pairs)
    assert out[:, -1].ne(PAD).any()      # no column of padding only at the end


def test_translate_stops_at_max_new_tokens():
    model = small_model()
    src, _, _ = batch()
    out = model.translate(src, 4)
    assert out.shape[1] <= 5 and torch.all(out[:, 0] == BOS)


@pytest.mark.parametrize("which", ["random", "trained"])
def test_cached_and_uncached_translations_are_identical(which, request):
    if which == "random":
        model = small_model()
        src, _, _ = batch()
        steps = 11
    else:
        model, _ = request.getfixturevalue("trained")
        _, val_pairs, src_vocab, tgt_vocab = request.getfixturevalue("corpus")
        src, _, _ = data.translation_batch(val_pairs, src_vocab, tgt_vocab)
        steps = 15
    assert torch.equal(model.translate(src, steps, use_cache=True),
                       model.translate(src, steps, use_cache=False))


def test_the_cache_projects_the_memory_once():
    model = small_model()
    src, _, _ = batch()
    calls = []
    handle = model.decoder_layers[0].multihead_attn.k_proj.register_forward_hook(
        lambda module, inputs, output: calls.append(inputs[0].shape))
    model.translate(src, 6, use_cache=True)
    cached = len(calls)
    calls.clear()
    model.translate(src, 6, use_cache=False)
    handle.remove()
    assert cached == 1 and len(calls) == 6


def test_source_memory_holds_keys_values_per_layer():
    model = small_model()
    src, _, _ = batch()
    source = model.read_source(src)
    assert isinstance(source, SourceMemory) and len(source.keys_values) == 2
    assert source.keys_values[0][0].shape == (3, 2, 6, 8)          # (B, h, T_src, d_k)
    assert model.read_source(src, use_cache=False).keys_values is None
    repeated = source.repeat_interleave(3)
    assert repeated.memory.shape[0] == 9 and torch.equal(repeated.mask[3], source.mask[1])


@pytest.mark.parametrize("which", ["random", "trained"])
def test_beam_of_one_is_greedy(which, request):
    if which == "random":
        model = small_model()
        src, _, _ = batch()
    else:
        model, _ = request.getfixturevalue("trained")
        _, val_pairs, src_vocab, tgt_vocab = request.getfixturevalue("corpus")
        src, _, _ = data.translation_batch(val_pairs, src_vocab, tgt_vocab)
    assert torch.equal(beam_search(model, src, beam_size=1, max_new_tokens=11),
                       model.translate(src, 11))


def _log_prob(model, src, out):
    """The total log-probability a model gives each translation (up to and with <eos>)."""
    logits, _ = model(src, out[:, :-1])
    log_p = logits.log_softmax(-1).gather(2, out[:, 1:, None])[..., 0]
    written = torch.ones_like(log_p, dtype=torch.bool)
    for row, ids in enumerate(out.tolist()):
        if EOS in ids:
            written[row, ids.index(EOS):] = False
            written[row, ids.index(EOS) - 1] = True
    return (log_p * written).sum(1)


def test_wider_beams_keep_the_layout_and_find_likely_translations(trained, corpus):
    model, _ = trained
    _, val_pairs, src_vocab, tgt_vocab = corpus
    src, _, _ = data.translation_batch(val_pairs, src_vocab, tgt_vocab)
    greedy = model.translate(src, 15)
    beam = beam_search(model, src, beam_size=4, max_new_tokens=15)
    assert torch.all(beam[:, 0] == BOS)
    for row in beam.tolist():
        assert EOS not in row or all(t == PAD for t in row[row.index(EOS) + 1:])
    with torch.no_grad():
        # on average over sentences the beam finds translations at least as likely as greedy's
        assert _log_prob(model, src, beam).mean() >= _log_prob(model, src, greedy).mean() - 1e-4


# --- training ------------------------------------------------------------------------------------

def test_a_short_seeded_run_lowers_the_loss(trained):
    _, history = trained
    assert history.train_losses[-1] < 0.5 * history.train_losses[0]


def test_training_is_repeatable(corpus):
    train_pairs, _, src_vocab, tgt_vocab = corpus
    losses = []
    for _ in range(2):
        torch.manual_seed(3)
        model = Seq2Seq(Seq2SeqConfig(len(src_vocab), len(tgt_vocab), 16, 1, 2, 16))
        batches = data.translation_batches(train_pairs, src_vocab, tgt_vocab, batch_size=16)
        losses.append(train(model, batches, steps=8, lr=1e-3, eval_every=4,
                            progress=False).train_losses)
    assert losses[0] == losses[1]


# --- errors --------------------------------------------------------------------------------------

def test_too_long_sequences_are_value_errors():
    model = small_model()
    src, tgt_in, _targets = batch()
    long_src = torch.full((3, 13), 5)
    with pytest.raises(ValueError, match="src has 13 positions, more than context_length=12"):
        model(long_src, tgt_in)
    long_tgt = torch.cat([tgt_in, torch.full((3, 7), 4)], dim=1)
    with pytest.raises(ValueError, match="tgt_in has 13 positions"):
        model(src, long_tgt)
    with pytest.raises(ValueError, match="context_length=12"):
        model.translate(src, 12)


def test_out_of_range_tokens_are_value_errors():
    model = small_model()
    src, tgt_in, targets = batch()
    bad_src = src.clone()
    bad_src[0, 0] = 13
    with pytest.raises(ValueError, match=r"src holds token id 13, outside the vocabulary \[0, 13"):
        model(bad_src, tgt_in)
    bad_tgt = tgt_in.clone()
    bad_tgt[1, 2] = 11
    with pytest.raises(ValueError, match="tgt_in holds token id 11"):
        model(src, bad_tgt)
    bad_targets = targets.clone()
    bad_targets[0, 0] = -1
    with pytest.raises(ValueError, match="targets holds token id -1"):
        model(src, tgt_in, bad_targets)
    with pytest.raises(ValueError, match="src holds token id 13"):
        model.translate(bad_src, 5)


def test_decoder_input_must_start_with_bos():
    model = small_model()
    src, _tgt_in, targets = batch()
    with pytest.raises(ValueError, match="tgt_in must start with bos_id=1.*row 0 starts with"):
        model(src, targets)


@pytest.mark.parametrize("problem", ["batch", "targets shape", "all padding", "memory", "dtype"])
def test_other_bad_inputs_are_named(problem):
    model = small_model()
    src, tgt_in, targets = batch()
    if problem == "batch":
        with pytest.raises(ValueError, match="same batch size"):
            model(src[:2], tgt_in)
    elif problem == "targets shape":
        with pytest.raises(ValueError, match="targets must have the shape of tgt_in"):
            model(src, tgt_in, targets[:, :4])
    elif problem == "all padding":
        src[1] = PAD
        with pytest.raises(ValueError, match="src row 1 is all padding"):
            model.encode(src)
    elif problem == "memory":
        with pytest.raises(ValueError, match=r"memory must have shape \(B, T_src, d_model\)"):
            model.decode(tgt_in, torch.zeros(3, 5, 16), src)
    else:
        with pytest.raises(TypeError, match="integer tensor"):
            model(src.float(), tgt_in)


def test_beam_search_arguments():
    model = small_model()
    src, _, _ = batch()
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        beam_search(model, src, beam_size=0, max_new_tokens=3)
    with pytest.raises(TypeError, match="Seq2Seq"):
        beam_search(torch.nn.Linear(2, 2), src, beam_size=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="context_length=12"):
        beam_search(model, src, beam_size=2, max_new_tokens=12)


# --- exact match ---------------------------------------------------------------------------------

def test_strip_special_and_exact_match():
    assert strip_special([1, 7, 4, 2, 0]) == [7, 4]
    assert strip_special(torch.tensor([7, 4, 2, 0, 0])) == [7, 4]
    translations = torch.tensor([[1, 7, 4, 2, 0], [1, 5, 2, 0, 0], [1, 5, 6, 6, 6]])
    targets = torch.tensor([[7, 4, 2], [5, 6, 2], [5, 6, 2]])
    assert exact_match(translations, targets) == pytest.approx(1 / 3)   # no <eos>: no match
    with pytest.raises(ValueError, match="same number of rows"):
        exact_match(translations[:2], targets)


# --- the corpus ----------------------------------------------------------------------------------

def test_corpus_is_deterministic_and_distinct():
    assert data.translation_pairs(50, seed=4) == data.translation_pairs(50, seed=4)
    assert data.translation_pairs(50, seed=4) != data.translation_pairs(50, seed=5)
    pairs = data.translation_pairs(500, seed=0)
    assert len({source for source, _ in pairs}) == 500


def test_splits_are_disjoint():
    train_pairs, val_pairs = data.translation_splits(2000, 300, seed=1)
    assert len(train_pairs) == 2000 and len(val_pairs) == 300
    assert not {s for s, _ in train_pairs} & {s for s, _ in val_pairs}


def test_the_target_language_has_its_own_words_and_order():
    source = "show me my old files in the shared folder please"
    target = data.translate_command(source)
    assert target == "bo dosi vela mia dosujo komuna la en mi miro"
    assert not set(source.split()) & set(target.split())
    position = {data.TRANSLATION_LEXICON[w]: i for i, w in enumerate(source.split())}
    alignment = [position[w] for w in target.split()]
    assert alignment == [9, 4, 3, 2, 8, 7, 6, 5, 1, 0]         # far from the diagonal
    for src_sentence, tgt_sentence in data.translation_pairs(200, seed=2):
        src_words, tgt_words = src_sentence.split(), tgt_sentence.split()
        assert len(src_words) == len(tgt_words)
        assert tgt_words[-1] == data.TRANSLATION_LEXICON[src_words[0]]    # the verb goes last


def test_lengths_vary():
    lengths = {len(source.split()) for source, _ in data.translation_pairs(3000, seed=0)}
    assert min(lengths) <= 3 and max(lengths) >= 11


def test_translate_command_rejects_other_sentences():
    with pytest.raises(ValueError, match="unknown words"):
        data.translate_command("show me the battery")
    with pytest.raises(ValueError, match="not a command"):
        data.translate_command("files please")


def test_vocabularies_reserve_the_specials():
    src_vocab, tgt_vocab = data.translation_vocabularies()
    for vocab in (src_vocab, tgt_vocab):
        assert vocab.words[:3] == ["<pad>", "<bos>", "<eos>"]
    assert "files" in src_vocab and "dosi" in tgt_vocab and "files" not in tgt_vocab


def test_batches_are_padded_and_shifted(corpus):
    train_pairs, _, src_vocab, tgt_vocab = corpus
    pairs = [("delete songs", "kanti tilo"),
             ("show me my old files in the shared folder please", data.translate_command(
                 "show me my old files in the shared folder please"))]
    src, tgt_in, targets = data.translation_batch(pairs, src_vocab, tgt_vocab)
    assert src.shape == (2, 10) and tgt_in.shape == targets.shape == (2, 11)
    assert src[0, 2:].eq(PAD).all() and tgt_in[:, 0].eq(BOS).all()
    assert targets[0].tolist()[:3] == [tgt_vocab.index("kanti"), tgt_vocab.index("tilo"), EOS]
    for row_in, row_out in zip(tgt_in.tolist(), targets.tolist()):   # the same words, shifted
        assert [t for t in row_in[1:] if t != PAD] == strip_special(row_out)
    stream = data.translation_batches(train_pairs, src_vocab, tgt_vocab, batch_size=8, seed=3)
    again = data.translation_batches(train_pairs, src_vocab, tgt_vocab, batch_size=8, seed=3)
    first, second = next(stream), next(again)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[0].shape[0] == 8
    with pytest.raises(ValueError, match="batch_size=9 is more than the 2 pairs"):
        next(data.translation_batches(pairs, src_vocab, tgt_vocab, batch_size=9))


# --- found in review (chapter 10): failing until seq2seq.py / generate.py are fixed -------------

@pytest.mark.parametrize("decode", ["translate", "beam_search"])
def test_a_rejected_source_leaves_the_training_mode_alone(decode):
    """translate and beam_search switch to eval() and back; a source that fails its check must
    not leave a model that was training in eval mode (the check runs after self.eval())."""
    model = small_model().train()
    bad = torch.tensor([[20, 3]])                       # 20 is outside the source vocabulary
    with pytest.raises(ValueError, match="outside the vocabulary"):
        if decode == "translate":
            model.translate(bad, 4)
        else:
            beam_search(model, bad, beam_size=2, max_new_tokens=4)
    assert model.training, (f"{decode} raised on a bad source but left the model in eval mode: "
                            "check the source before self.eval(), or restore the mode in finally")


def test_exact_match_of_a_list_is_a_type_error():
    """Project rule: a wrong type is a TypeError (a wrong value a ValueError)."""
    with pytest.raises(TypeError, match="translations"):
        exact_match([[BOS, 5, EOS]], torch.tensor([[5, EOS]]))


@pytest.mark.parametrize("decode", [
    "translate", "cross_attention_weights",
    "beam_search",
])
def test_an_error_while_decoding_leaves_the_training_mode_alone(decode):
    """The mode is restored in finally: an error raised after self.eval() (here from the
    decoder; for a learner, often a KeyboardInterrupt) does not leave a training model in eval
    mode, where its dropout would be silently off."""
    model = small_model(dropout=0.1).train()
    src, tgt_in, _ = batch()

    def broken(*args, **kwargs):
        raise RuntimeError("the decoder failed")

    model._decode = broken                              # an instance attribute, this model only
    with pytest.raises(RuntimeError, match="the decoder failed"):
        if decode == "translate":
            model.translate(src, 4)
        elif decode == "cross_attention_weights":
            model.cross_attention_weights(src, tgt_in)
        else:
            beam_search(model, src, beam_size=2, max_new_tokens=4)
    assert all(m.training for m in model.modules())


@pytest.mark.parametrize("method", ["translate", "read_source"])
def test_use_cache_must_be_a_bool(method):
    """As in generate: use_cache="no" is truthy, and would have switched the cache on."""
    model = small_model()
    src, _, _ = batch()
    with pytest.raises(TypeError, match="use_cache must be True or False, got str"):
        if method == "translate":
            model.translate(src, 4, use_cache="no")
        else:
            model.read_source(src, use_cache="no")
