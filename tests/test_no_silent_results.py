"""No silent results (issue 29): every refusal below was, before, a wrong answer given without a
word, a crash from inside, a long wait or a look-up on the Hub. Each is one line naming the
problem."""

from __future__ import annotations

import json
import os
import sys
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer import data, default_device  # noqa: E402
from minitransformer.gpt import GPT, GPTConfig  # noqa: E402
from minitransformer.llama import Llama, LlamaConfig  # noqa: E402
from minitransformer.seq2seq import Seq2Seq, Seq2SeqConfig  # noqa: E402

IDX = torch.randint(61, (2, 6), generator=torch.Generator().manual_seed(1))


def small_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=61, context_length=24, num_layers=2, num_heads=2,
                         d_model=16)).eval()


def small_llama(tie: bool = True) -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(61, 24, 2, 4, 16, num_kv_heads=2, tie_embeddings=tie)).eval()


def small_seq2seq(num_layers: int = 2) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(61, 61, 24, num_layers, 2, 16)).eval()


def edit_tensors(folder, edit) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# ----- a tied head stored as other numbers ------------------------------------------------------

def test_a_tied_gpt_with_another_stored_head_is_refused(tmp_path):
    """The file's own lm_head would give other logits; the tied table silently won."""
    model = small_gpt()
    model.save_pretrained(tmp_path)
    other = torch.randn(61, 16, generator=torch.Generator().manual_seed(2))
    edit_tensors(tmp_path, lambda t: t.update({"lm_head.weight": other}))
    with pytest.raises(ValueError, match=r"stores a lm_head.weight that differs from "
                                         r"wte.weight, but .*config.json says the head is "
                                         r"tied") as error:
        GPT.from_pretrained(tmp_path)
    assert str(tmp_path / "model.safetensors") in one_line(error)


def test_a_tied_llama_with_another_stored_head_is_refused(tmp_path):
    small_llama(tie=True).save_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    with pytest.raises(ValueError, match="lm_head.weight that differs from "
                                         "model.embed_tokens.weight"):
        Llama.from_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    assert Llama.from_pretrained(tmp_path).head.weight is not None   # the same numbers: fine


def test_a_seq2seq_with_another_stored_head_is_refused(tmp_path):
    small_seq2seq().save_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.update(
        {"head.weight": t["tgt_token_embedding.weight"] * 2}))
    with pytest.raises(ValueError, match="head.weight that differs from "
                                         "tgt_token_embedding.weight"):
        Seq2Seq.from_pretrained(tmp_path)


# ----- Seq2Seq: a tensor the model does not have ------------------------------------------------

def test_a_seq2seq_checkpoint_with_an_extra_tensor_is_refused(tmp_path):
    small_seq2seq().save_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.update({"encoder_layers.0.extra": torch.zeros(3)}))
    with pytest.raises(ValueError, match="holds 'encoder_layers.0.extra', which a Seq2Seq with "
                                         "num_layers=2 does not have"):
        Seq2Seq.from_pretrained(tmp_path)


def test_a_seq2seq_config_with_fewer_layers_than_the_file_is_refused(tmp_path):
    small_seq2seq(num_layers=2).save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c.update(num_layers=1))
    with pytest.raises(ValueError, match=r"holds '(en|de)coder_layers.1.\S+', which a Seq2Seq "
                                         r"with num_layers=1 does not have"):
        Seq2Seq.from_pretrained(tmp_path)


# ----- paths, configs, dtypes -------------------------------------------------------------------

@pytest.mark.parametrize("cls", [GPT, Llama, Seq2Seq])
@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_path_is_refused(cls, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small_gpt().save_pretrained(tmp_path)        # "" was the current directory, and loaded it
    with pytest.raises(ValueError, match="path is empty"):
        cls.from_pretrained(path)


@pytest.mark.parametrize("cls, model", [(GPT, small_gpt), (Llama, small_llama),
                                        (Seq2Seq, small_seq2seq)])
def test_a_config_nested_too_deep_is_a_value_error(tmp_path, cls, model):
    model().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ValueError, match="config.json is nested too deeply"):
        cls.from_pretrained(tmp_path)


@pytest.mark.parametrize("cls, model", [(GPT, small_gpt), (Llama, small_llama),
                                        (Seq2Seq, small_seq2seq)])
@pytest.mark.parametrize("float8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_checkpoint_is_refused_by_dtype(tmp_path, cls, model, float8):
    model().save_pretrained(tmp_path)
    edit_tensors(tmp_path, lambda t: t.update({k: v.to(float8) for k, v in t.items()}))
    name = str(float8).removeprefix("torch.")
    with pytest.raises(ValueError, match=f"stores its weights as {name}, a format this package "
                                         f"cannot compute in"):
        cls.from_pretrained(tmp_path)
    model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"dtype is {name}, a storage format"):
        cls.from_pretrained(tmp_path, dtype=float8)


def test_a_pickle_is_refused_with_the_command_that_converts_it(tmp_path):
    torch.save({"wte.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"pytorch_model.bin may hold the weights as a "
                                                r"pickle.*convert it with: python -m "
                                                r"minitransformer convert ") as error:
        GPT.from_pretrained(tmp_path)
    assert one_line(error).endswith(f"convert {tmp_path})")


@pytest.fixture
def no_hub(monkeypatch):
    """A huggingface_hub whose download fails the test: nothing may be looked up."""
    looked_up = []
    hub = types.ModuleType("huggingface_hub")
    hub.snapshot_download = lambda *a, **k: looked_up.append(a) or "/nowhere"
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    return looked_up


@pytest.mark.parametrize("cls", [GPT, Llama, Seq2Seq])
def test_a_path_under_a_folder_that_is_here_is_local_not_a_hub_name(tmp_path, monkeypatch,
                                                                    no_hub, cls):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no such directory: runs/corpus \(runs/ is "
                                                r"here but holds no corpus; a local path, not "
                                                r"looked up on the Hugging Face Hub\)"):
        cls.from_pretrained("runs/corpus")
    assert no_hub == []
    with pytest.raises(FileNotFoundError):         # no folder "openai-community" here: the Hub
        cls.from_pretrained("openai-community/gpt2")
    assert no_hub == [("openai-community/gpt2",)]


# ----- shapes before any allocation -------------------------------------------------------------

@pytest.mark.parametrize("cls, model, field", [(GPT, small_gpt, "n_embd"),
                                               (Llama, small_llama, "hidden_size")])
def test_a_config_far_wider_than_its_tensors_is_refused_before_building(tmp_path, monkeypatch,
                                                                        cls, model, field):
    """n_embd 65536 over 16-wide tensors: a 17 GB model was built, then refused. Now only a
    model on the meta device (no numbers) is built before the shapes are compared."""
    model().save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c.update({field: 65536, "intermediate_size": 4 * 65536,
                                              "head_dim": 65536 // 4}))
    built = []
    init = cls.__init__

    def recording_init(self, config, *, device=None, dtype=None):
        built.append(str(device))
        init(self, config, device=device, dtype=dtype)

    monkeypatch.setattr(cls, "__init__", recording_init)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"does not fit its config: .* \(61, 16\) in the file, "
                                         r"\(61, 65536\) in the model"):
        cls.from_pretrained(tmp_path)
    assert built and set(built) == {"meta"}              # no real model was ever allocated
    assert time.perf_counter() - start < 5                # 0.0 s here (load 9)


def test_a_seq2seq_config_wider_than_its_tensors_is_refused_before_building(tmp_path,
                                                                            monkeypatch):
    small_seq2seq().save_pretrained(tmp_path)
    edit_config(tmp_path, lambda c: c.update(d_model=65536))
    built = []
    init = Seq2Seq.__init__
    monkeypatch.setattr(Seq2Seq, "__init__", lambda self, config, *, device=None, dtype=None: (
        built.append(str(device)), init(self, config, device=device, dtype=dtype))[-1])
    with pytest.raises(ValueError, match=r"\(61, 16\) in the file, \(61, 65536\) in the model"):
        Seq2Seq.from_pretrained(tmp_path)
    assert set(built) == {"meta"}


def test_a_matching_checkpoint_still_loads_on_the_device_and_dtype_asked_for(tmp_path):
    model = small_gpt()
    model.save_pretrained(tmp_path)
    copy = GPT.from_pretrained(tmp_path, device="cpu", dtype=torch.float64)
    assert copy.token_embedding.weight.dtype == torch.float64
    assert copy.head.weight is copy.token_embedding.weight
    torch.testing.assert_close(copy(IDX)[0].float(), model(IDX)[0])


# ----- devices that are not here ----------------------------------------------------------------

MISSING = [name for name in ("mps", "cuda", "cuda:7", "xpu")
           if name not in ("cuda",) or not torch.cuda.is_available()]
MISSING = [name for name in MISSING if not (name == "cuda:7" and torch.cuda.device_count() > 7)
           and not (name == "mps" and torch.backends.mps.is_available())]


def device_entries(tmp_path):
    small_gpt().save_pretrained(tmp_path / "gpt")
    small_llama().save_pretrained(tmp_path / "llama")
    small_seq2seq().save_pretrained(tmp_path / "s2s")
    vocab = mt.Vocabulary.from_sentences(["check the program ran"], specials=(data.EOS,))
    src, tgt = data.translation_vocabularies()
    pairs = data.translation_pairs(3)
    return {
        "GPT": lambda d: GPT(small_gpt().config, device=d),
        "Llama": lambda d: Llama(small_llama().config, device=d),
        "Seq2Seq": lambda d: Seq2Seq(small_seq2seq().config, device=d),
        "MultiHeadAttention": lambda d: mt.MultiHeadAttention(8, 2, device=d),
        "LayerNorm": lambda d: mt.LayerNorm(8, device=d),
        "sinusoidal_positional_encoding": lambda d: mt.sinusoidal_positional_encoding(
            4, 8, device=d),
        "rotary_angles": lambda d: mt.rotary_angles(3, 4, device=d),
        "GPT.from_pretrained": lambda d: GPT.from_pretrained(tmp_path / "gpt", device=d),
        "Llama.from_pretrained": lambda d: Llama.from_pretrained(tmp_path / "llama", device=d),
        "Seq2Seq.from_pretrained": lambda d: Seq2Seq.from_pretrained(tmp_path / "s2s",
                                                                     device=d),
        "token_stream": lambda d: data.token_stream(["check the program ran"], vocab,
                                                    device=d),
        "cue_batch": lambda d: data.cue_batch(["check the program log whether it ran down "
                                               "please"], vocab, device=d),
        "pad_sequences": lambda d: data.pad_sequences([[1, 2], [3]], device=d),
        "translation_batch": lambda d: data.translation_batch(pairs, src, tgt, device=d),
        "translation_batches": lambda d: next(data.translation_batches(
            pairs, src, tgt, batch_size=2, device=d)),
    }


@pytest.mark.skipif(not MISSING, reason="every device name is available here")
def test_a_device_that_is_not_here_is_refused_by_name_everywhere(tmp_path):
    crashes = []
    for name, entry in device_entries(tmp_path).items():
        for device in [*MISSING, torch.device(MISSING[0]), "toaster"]:
            try:
                entry(device)
            except ValueError as error:
                shown = str(torch.device(device)) if device != "toaster" else "toaster"
                if f"'{shown}'" not in str(error) or "\n" in str(error):
                    crashes.append(f"{name}({device!r}): {error}")
            except Exception as error:  # noqa: BLE001 - what the test looks for
                crashes.append(f"{name}({device!r}): {type(error).__name__}: {error!s:.100}")
            else:
                crashes.append(f"{name}({device!r}) was accepted")
    assert not crashes, "\n".join(crashes)


@pytest.mark.skipif(not MISSING, reason="every device name is available here")
def test_default_device_refuses_a_device_that_is_not_here(monkeypatch):
    monkeypatch.setenv("MINITRANSFORMER_DEVICE", MISSING[0])
    with pytest.raises(ValueError, match=f"MINITRANSFORMER_DEVICE='{MISSING[0]}' is not "
                                         f"available here"):
        default_device()


def test_devices_that_are_here_are_accepted():
    assert GPT(small_gpt().config, device="cpu").head.weight.device.type == "cpu"
    assert GPT(small_gpt().config, device=torch.device("meta")).head.weight.is_meta
    assert data.pad_sequences([[1]], device="cpu").device.type == "cpu"


# ----- data: an impossible request at once ------------------------------------------------------

def test_command_splits_refuses_more_sentences_than_exist_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"has 27400 distinct sentences with max_distance=12, "
                                         r"fewer than the 30000 asked for"):
        data.command_splits(29_000, 1_000)
    with pytest.raises(ValueError, match="has 40 distinct sentences with max_distance=3"):
        data.command_splits(40, 1, max_distance=3)
    assert time.perf_counter() - start < 1.0                  # it took 107-198 s
    train, val = data.command_splits(30, 10, max_distance=3)  # all 40: still found
    assert len(set(train + val)) == 40 == data.count_commands(3)


def test_count_commands_is_what_the_draws_reach():
    import random
    for max_distance in (3, 4, 5):
        rng = random.Random(0)
        seen = {" ".join(data._sentence(rng, max_distance)) for _ in range(60_000)}
        assert len(seen) == data.count_commands(max_distance)


def test_translation_pairs_refuses_more_than_the_grammar_makes_at_once():
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"has 103782000 distinct commands, fewer than the "
                                         r"1000000000 pairs"):
        data.translation_pairs(10**9)                          # it looped for ever
    with pytest.raises(ValueError, match="distinct commands"):
        data.translation_splits(10**9, 1)
    assert time.perf_counter() - start < 1.0


# ----- generation -------------------------------------------------------------------------------

@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("model", [small_gpt, small_llama])
def test_generate_on_an_empty_batch_returns_an_empty_result(model, use_cache):
    out = mt.generate(model(), torch.zeros(0, 3, dtype=torch.long), 4, use_cache=use_cache,
                      eos_id=2)
    assert out.shape == (0, 7) and out.dtype == torch.long


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-300, 5e-324])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_tiny_temperature_is_greedy(temperature, dtype):
    logits = torch.randn(4, 61, generator=torch.Generator().manual_seed(3)).to(dtype)
    for top_p in (None, 0.5):
        chosen = mt.sample_next(logits, temperature=temperature, top_k=5, top_p=top_p)
        assert torch.equal(chosen, logits.argmax(-1))
    model = small_gpt()
    greedy = mt.generate(model, IDX, 5, temperature=0)
    assert torch.equal(mt.generate(model, IDX, 5, temperature=temperature), greedy)


@pytest.mark.parametrize("counts, message", [
    (torch.full((2, 61), -1), "counts must be >= 0"),
    (torch.full((2, 61), float("nan")), "counts must be finite numbers >= 0, got NaN"),
    (torch.full((2, 61), float("inf")), "counts must be finite"),
    (torch.full((2, 61), -0.5), "counts must be >= 0"),
])
def test_negative_or_nan_counts_are_refused(counts, message):
    """A negative count turned the frequency penalty into a reward; NaN made every score NaN."""
    logits = torch.randn(2, 61)
    for penalties in ({"frequency_penalty": 0.5}, {"presence_penalty": 0.5}):
        with pytest.raises(ValueError, match=message):
            mt.sample_next(logits, counts=counts, **penalties)
    ok = mt.sample_next(logits, counts=torch.zeros(2, 61, dtype=torch.bool),
                        presence_penalty=1.0)
    assert ok.shape == (2,)


def test_beam_search_on_an_empty_batch_returns_an_empty_result():
    from minitransformer import Seq2Seq, Seq2SeqConfig, beam_search
    model = Seq2Seq(Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=12, context_length=8,
                                  num_layers=1, num_heads=2, d_model=8))
    out = beam_search(model, torch.zeros(0, 3, dtype=torch.long), beam_size=2,
                      max_new_tokens=3)
    assert out.shape == (0, 1) and out.dtype == torch.long


def test_a_missing_tokenizer_directory_is_named_as_missing(tmp_path, monkeypatch):
    from minitransformer import BPETokenizer
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(FileNotFoundError, match="'runs/corpus' names no directory"):
        BPETokenizer.from_pretrained("runs/corpus")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file, not directory"):
        BPETokenizer.from_pretrained("notes.txt")
