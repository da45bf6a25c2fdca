"""Models as directories (minitransformer.pretrained; GPT and Seq2Seq save_pretrained and
from_pretrained, chapters 9 and 13): round trips, GPT-2's layout read and written by transformers
with equal logits and tokens, and a clear error for every directory that is not right."""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network

import pytest  # noqa: E402
import torch  # noqa: E402

import minitransformer as mt  # noqa: E402
from minitransformer.gpt import GPT, GPTConfig  # noqa: E402
from minitransformer.seq2seq import Seq2Seq, Seq2SeqConfig  # noqa: E402
from helpers import perturbed

transformers = pytest.importorskip("transformers")


def small_gpt(dtype=torch.float32, **changes) -> GPT:
    sizes = dict(vocab_size=61, context_length=24, num_layers=2, num_heads=2, d_model=16)
    torch.manual_seed(0)
    return perturbed(GPT(GPTConfig(**{**sizes, **changes}), dtype=dtype))


IDX = torch.randint(61, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_save_and_load_round_trip_every_tensor(tmp_path, activation, positional):
    model = small_gpt(activation=activation, positional=positional, norm_eps=1e-6)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    copy = GPT.from_pretrained(tmp_path)
    assert copy.config == model.config
    assert not copy.training
    assert copy.head.weight is copy.token_embedding.weight
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_transformers_loads_what_we_save_with_equal_logits_and_tokens(tmp_path, activation,
                                                                       positional):
    model = small_gpt(activation=activation, positional=positional)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2"
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["activation_function"] == {"gelu": "gelu", "gelu_tanh": "gelu_new"}[activation]
    for auto in (transformers.GPT2LMHeadModel, transformers.AutoModelForCausalLM):
        theirs, info = auto.from_pretrained(tmp_path, output_loading_info=True)
        assert not (info["missing_keys"] or info["unexpected_keys"]
                    or info["mismatched_keys"]), info
    theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDX).logits, model(IDX)[0], rtol=0, atol=1e-4)
        ours_tokens = mt.generate(model, IDX[:, :4], 16, temperature=0)
        their_tokens = theirs.generate(IDX[:, :4], max_new_tokens=16, do_sample=False,
                                       min_new_tokens=16, pad_token_id=0)
    assert torch.equal(ours_tokens, their_tokens)


def test_float64_logits_agree_below_1e_10(tmp_path):
    model = small_gpt(dtype=torch.float64, activation="gelu_tanh")
    model.save_pretrained(tmp_path)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert theirs.dtype == torch.float64
    with torch.no_grad():
        gap = (theirs(IDX).logits - model(IDX)[0]).abs().max().item()
    assert gap < 1e-10
    assert GPT.from_pretrained(tmp_path).token_embedding.weight.dtype == torch.float64
    assert GPT.from_pretrained(tmp_path, dtype=torch.float32).head.weight.dtype == torch.float32


def their_gpt2(**config) -> torch.nn.Module:
    sizes = dict(vocab_size=61, n_positions=24, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return perturbed(transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**sizes,
                                                                            **config})))


@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_a_checkpoint_written_by_transformers_loads_with_equal_logits(tmp_path, activation):
    theirs = their_gpt2(activation_function=activation, n_inner=40, layer_norm_epsilon=1e-6)
    theirs.save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path)
    assert model.config.d_ff == 40 and model.config.norm_eps == 1e-6
    with torch.no_grad():
        torch.testing.assert_close(model(IDX)[0], theirs(IDX).logits, rtol=0, atol=1e-4)


def test_the_published_layout_without_prefix_and_with_mask_buffers_loads(tmp_path):
    """The gpt2 checkpoint on the Hub names its tensors h.0..., wte.weight (no transformer.
    prefix) and also stores each layer's causal-mask buffer attn.bias."""
    from safetensors.torch import save_file

    theirs = their_gpt2()
    theirs.save_pretrained(tmp_path)
    tensors = {name.removeprefix("transformer."): t.contiguous()
               for name, t in theirs.state_dict().items() if name != "lm_head.weight"}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 24, 24))
    save_file(tensors, tmp_path / "model.safetensors")
    model = GPT.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(IDX)[0], theirs(IDX).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("field, value, named", [
    ("model_type", "llama", "model_type is 'llama'"),
    ("tie_word_embeddings", False, "tie_word_embeddings is false"),
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx is set"),
    ("reorder_and_upcast_attn", True, "reorder_and_upcast_attn is set"),
    ("attn_pdrop", 0.3, "unequal dropouts"),
    ("activation_function", "relu", "activation_function is 'relu'"),
    ("n_head", 5, "d_model must be divisible by num_heads"),
])
def test_a_config_gpt_cannot_express_is_refused_by_name(tmp_path, field, value, named):
    small_gpt().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named) as error:
        GPT.from_pretrained(tmp_path)
    assert "config.json" in str(error.value)


@pytest.mark.parametrize("field, value, message", [
    ("n_layer", 3, r"has no tensor 'h.2.ln_1.weight'"),
    ("n_layer", 1, r"holds 'h.1.\S+', which a GPT-2 model with n_layer=1 does not have"),
    ("n_embd", 32, r"wte.weight \(our token_embedding.weight\) has shape \(61, 16\) in the "
                   r"file, \(61, 32\) in the model"),
    ("vocab_size", 60, r"wte.weight \(our token_embedding.weight\) has shape \(61, 16\)"),
])
def test_a_config_that_does_not_match_the_weights_names_the_tensor(tmp_path, field, value,
                                                                    message):
    small_gpt().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)


_UNPICKLED = []


def _ran_while_unpickling():
    _UNPICKLED.append(True)
    return {}


class _CodeInAFile:
    def __reduce__(self):
        return (_ran_while_unpickling, ())


def test_broken_files_get_errors_that_name_them_and_never_run_code(tmp_path):
    small_gpt().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])                       # truncated
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors"):
        GPT.from_pretrained(tmp_path)
    torch.save(_CodeInAFile(), weights)                               # a pickle in disguise
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors") as e:
        GPT.from_pretrained(tmp_path)
    assert "weights_only" not in str(e.value)
    assert _UNPICKLED == []
    weights.write_bytes(good)
    (tmp_path / "config.json").write_text("not json {")
    with pytest.raises(ValueError, match="config.json is not a JSON file"):
        GPT.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json must hold a JSON object"):
        GPT.from_pretrained(tmp_path)


def test_missing_paths_and_pickles_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        GPT.from_pretrained(tmp_path / "nowhere" / "at all")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match="is a file; a checkpoint is a directory"):
        GPT.from_pretrained(text)
    folder = tmp_path / "old"
    folder.mkdir()
    torch.save(_CodeInAFile(), folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin may hold the weights as a "
                                                "pickle, which this package never loads"):
        GPT.from_pretrained(folder)
    assert _UNPICKLED == []
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        GPT.from_pretrained(3)


def test_a_repo_id_offline_fails_at_once_with_a_one_line_way_out(tmp_path):
    """HF_HUB_OFFLINE is read when huggingface_hub is imported: a fresh process."""
    code = ("import minitransformer as mt\n"
            "try:\n    mt.GPT.from_pretrained('openai-community/gpt2')\n"
            "except FileNotFoundError as e:\n    print('ERROR', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    line = result.stdout.strip()
    assert line.startswith("ERROR no local directory 'openai-community/gpt2', and it could "
                           "not be downloaded as a Hub repo id"), result
    assert "download config.json and model.safetensors" in line
    assert "\n" not in line


def test_without_huggingface_hub_a_repo_id_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)       # import fails
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no local directory 'gpt2', and "
                                                r"huggingface_hub is not installed .*\(pip "
                                                r"install 'minitransformer\[hub\]'\)"):
        GPT.from_pretrained("gpt2")


def test_a_post_norm_gpt_is_not_written_as_gpt2(tmp_path):
    model = small_gpt()
    model.layers[0].norm_first = False
    with pytest.raises(ValueError, match="cannot be saved as a GPT-2 checkpoint"):
        model.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def seq2seq() -> Seq2Seq:
    torch.manual_seed(0)
    return perturbed(Seq2Seq(Seq2SeqConfig(15, 17, 12, 2, 2, 16, label_smoothing=0.1)))


def test_seq2seq_round_trip(tmp_path):
    model = seq2seq()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "minitransformer-seq2seq"
    assert config["label_smoothing"] == 0.1
    copy = Seq2Seq.from_pretrained(tmp_path)
    assert copy.config == model.config
    assert copy.head.weight is copy.tgt_token_embedding.weight
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name
    src = torch.tensor([[3, 4, 5, 6]])
    assert torch.equal(copy.translate(src, 8), model.translate(src, 8))


def test_seq2seq_refuses_another_model_type_and_a_mismatched_config(tmp_path):
    seq2seq().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type is 'minitransformer-seq2seq', not 'gpt2'"):
        GPT.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_heads": 4, "d_model": 32}))
    with pytest.raises(ValueError, match=r"src_token_embedding.weight has shape \(15, 16\) in "
                                         r"the file, \(15, 32\) in the model"):
        Seq2Seq.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "colour": "red"}))
    with pytest.raises(ValueError, match="colour"):
        Seq2Seq.from_pretrained(tmp_path)
    small_gpt().save_pretrained(tmp_path / "gpt")
    with pytest.raises(ValueError, match="model_type must be 'minitransformer-seq2seq', got "
                                         "'gpt2'"):
        Seq2Seq.from_pretrained(tmp_path / "gpt")


def test_from_pretrained_builds_on_the_device_asked_for(tmp_path):
    small_gpt().save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path, device="meta")
    assert model.head.weight.device.type == "meta"


def test_the_tokenizer_s_eos_makes_transformers_stop_where_we_stop(tmp_path):
    model = small_gpt()
    free = mt.generate(model, IDX[:1, :4], 12, temperature=0)
    eos = int(free[0, 8])                                           # the 5th new token
    model.save_pretrained(tmp_path, eos_token_id=eos)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eos_token_id"] == eos and config["bos_token_id"] is None
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        their_tokens = theirs.generate(IDX[:1, :4], max_new_tokens=12, do_sample=False,
                                       pad_token_id=eos)
    ours = mt.generate(model, IDX[:1, :4], 12, temperature=0, eos_id=eos)
    assert torch.equal(ours, their_tokens)
    assert ours.shape[1] < 4 + 12 and ours[0, -1] == eos
    with pytest.raises(ValueError, match="eos_token_id=61 is not a token of the vocabulary"):
        model.save_pretrained(tmp_path, eos_token_id=61)


def test_bfloat16_round_trip_keeps_the_dtype_and_every_tensor(tmp_path):
    model = small_gpt(dtype=torch.bfloat16, activation="gelu_tanh")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    copy = GPT.from_pretrained(tmp_path)
    assert copy.token_embedding.weight.dtype == torch.bfloat16
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert theirs.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(mt.generate(copy, IDX[:, :4], 8, temperature=0),
                           theirs.generate(IDX[:, :4], max_new_tokens=8, min_new_tokens=8,
                                           do_sample=False, pad_token_id=0))


def test_older_files_extra_buffers_and_a_stored_head_are_skipped(tmp_path):
    """transformers 4 files may hold attn.masked_bias, and a file may store the tied head as
    lm_head.weight: neither is a weight of ours, and neither is an error."""
    from safetensors.torch import load_file, save_file

    model = small_gpt()
    model.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for i in range(2):
        tensors[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors")
    copy = GPT.from_pretrained(tmp_path)
    for (name, ours), (_, theirs) in zip(model.state_dict().items(),
                                         copy.state_dict().items()):
        assert torch.equal(ours, theirs), name


def test_a_sinusoidal_table_changed_elsewhere_comes_back_as_learned_positions(tmp_path):
    """transformers keeps our "minitransformer" key when it saves; a wpe trained or edited
    there is no longer the sinusoidal table, so it loads as GPT-2's learned positions."""
    small_gpt(positional="sinusoidal").save_pretrained(tmp_path)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        theirs.transformer.wpe.weight.add_(0.05 * torch.randn_like(theirs.transformer.wpe.weight))
    theirs.save_pretrained(tmp_path / "edited")
    model = GPT.from_pretrained(tmp_path / "edited")
    assert model.config.positional == "learned"
    with torch.no_grad():
        torch.testing.assert_close(model(IDX)[0], theirs(IDX).logits, rtol=0, atol=1e-4)
    assert GPT.from_pretrained(tmp_path).config.positional == "sinusoidal"  # untouched: kept


def test_a_mask_buffer_in_another_dtype_is_skipped_and_duplicates_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    small_gpt().save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["transformer.h.0.attn.bias"] = torch.ones(1, 1, 24, 24, dtype=torch.float64)
    save_file(tensors, tmp_path / "model.safetensors")
    assert GPT.from_pretrained(tmp_path).head.weight.dtype == torch.float32
    tensors["wte.weight"] = tensors["transformer.wte.weight"] + 1
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="holds 'wte.weight' twice, with and without the "
                                         "prefix 'transformer.'"):
        GPT.from_pretrained(tmp_path)
