"""stream_tokens (minitransformer.generation): one prompt continued token by token from one
KV cache, with the tokens of generate."""

import pytest
import torch

from minitransformer import GPT, GPTConfig, Llama, LlamaConfig, generate, stream_tokens


def tiny_gpt(context_length=40):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=13, context_length=context_length, num_layers=2,
                         num_heads=2, d_model=16)).eval()


def tiny_llama(context_length=40):
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=13, context_length=context_length, num_layers=2,
                             num_heads=4, num_kv_heads=2, d_model=16)).eval()


MODELS = {"gpt": tiny_gpt, "llama": tiny_llama}
PROMPT = [3, 1, 4, 1, 5]
SAMPLING = {"greedy": dict(temperature=0),
            "seeded": dict(temperature=1.5, top_k=9, top_p=0.95, presence_penalty=0.3,
                           frequency_penalty=0.2)}


def seeded(kwargs):
    """A fresh seeded generator for a sampled run, none for greedy."""
    return {} if kwargs.get("temperature") == 0 else {
        "generator": torch.Generator().manual_seed(11)}


def reference(model, n, kwargs, **more):
    out = generate(model, torch.tensor([PROMPT]), n, **kwargs, **seeded(kwargs), **more)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("kind", MODELS)
def test_the_stream_is_generates_tokens(kind, sampling, fast):
    model, kwargs = MODELS[kind](), SAMPLING[sampling]
    expected = reference(model, 20, kwargs, fast=fast)
    got = list(stream_tokens(model, PROMPT, 20, fast=fast, **kwargs, **seeded(kwargs)))
    assert got == expected and all(type(t) is int for t in got)
    # a tensor prompt streams the same tokens
    tensor = list(stream_tokens(model, torch.tensor(PROMPT), 20, fast=fast, **kwargs,
                                **seeded(kwargs)))
    assert tensor == expected


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("kind", MODELS)
def test_a_stop_token_ends_the_stream_after_it_is_yielded(kind, sampling):
    model, kwargs = MODELS[kind](), SAMPLING[sampling]
    free = reference(model, 20, kwargs)
    stop = free[4]                                  # a token the run writes
    first = free.index(stop)
    got = list(stream_tokens(model, PROMPT, 20, stop_ids={stop}, **kwargs, **seeded(kwargs)))
    assert got == free[:first + 1] and got[-1] == stop
    # generate with eos_id writes the same tokens, then pads with eos_id
    with_eos = reference(model, 20, kwargs, eos_id=stop)
    assert with_eos[:len(got)] == got and set(with_eos[len(got):]) <= {stop}
    # several stop ids: the first of them written ends it
    other = free[7]
    both = list(stream_tokens(model, PROMPT, 20, stop_ids=[other, stop], **kwargs,
                              **seeded(kwargs)))
    end = min(free.index(other), first)
    assert both == free[:end + 1]
    # a stop id never written: max_new_tokens tokens
    unused = next(t for t in range(13) if t not in free)
    assert list(stream_tokens(model, PROMPT, 20, stop_ids=(unused,), **kwargs,
                              **seeded(kwargs))) == free


def counting(model):
    """Wrap the model's decode steps so that every call's number of new tokens is recorded
    (the outermost call only: the fast step prefills through the ordinary one)."""
    lengths, inside = [], []
    for name in ("make_decode_step", "make_fast_decode_step"):
        make = getattr(model, name, None)
        if make is None:
            continue

        def wrapped(*args, _make=make, **kwargs):
            step = _make(*args, **kwargs)

            def counted(idx, kv_cache, **more):
                if not inside:
                    lengths.append(idx.shape[1])
                inside.append(True)
                try:
                    return step(idx, kv_cache, **more)
                finally:
                    inside.pop()
            return counted
        setattr(model, name, wrapped)
    return lengths


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("kind", MODELS)
def test_a_long_prompt_is_prefilled_once(kind, fast):
    model = MODELS[kind](context_length=320)
    lengths = counting(model)
    prompt = torch.randint(0, 13, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    stream = stream_tokens(model, prompt, 12, temperature=0, fast=fast)
    assert lengths == []                            # nothing runs before the first token
    first = next(stream)
    assert lengths == [300]                         # the prefill
    rest = list(stream)
    assert lengths == [300] + [1] * 11              # then one token per step
    expected = generate(model, torch.tensor([prompt]), 12, temperature=0, fast=fast)
    assert [first] + rest == expected[0, 300:].tolist()


def test_generate_prefills_once_as_well():
    model = tiny_gpt()
    lengths = counting(model)
    generate(model, torch.tensor([PROMPT, PROMPT]), 6, temperature=0)
    assert lengths == [len(PROMPT)] + [1] * 5


def test_between_tokens_the_caller_keeps_its_modes():
    model = tiny_gpt().train()
    stream = stream_tokens(model, PROMPT, 5, temperature=0)
    token = next(stream)
    assert model.training and not torch.is_inference_mode_enabled()
    assert [token] + list(stream) == reference(model, 5, dict(temperature=0))
    assert model.training                           # generate puts it back as well
    stream = stream_tokens(model, PROMPT, 5, temperature=0)
    next(stream)
    stream.close()                                  # leaving early
    assert model.training and not torch.is_inference_mode_enabled()


def test_no_new_tokens_yields_nothing():
    assert list(stream_tokens(tiny_gpt(), PROMPT, 0)) == []


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompt=[]), ValueError, "prompt must hold at least one token"),
    (dict(prompt=[1, 13]), ValueError, "token id 13"),
    (dict(prompt=[1, -1]), ValueError, r"prompt\[1\] must be at least 0"),
    (dict(prompt=[[1, 2]]), TypeError, r"prompt\[0\] must be an int"),
    (dict(prompt=torch.tensor([[1, 2]])), ValueError, r"one prompt of shape \(T,\)"),
    (dict(prompt="12"), TypeError, "prompt must be a list of token ids or a tensor"),
    (dict(max_new_tokens=39), ValueError, "2 tokens plus max_new_tokens=39 make 41"),
    (dict(stop_ids=13), TypeError, "stop_ids must be a set, list or tuple of token ids"),
    (dict(stop_ids={13}), ValueError, r"stop_ids=13 is not a token of the vocabulary"),
    (dict(stop_ids=[-2]), ValueError, "stop_ids must be at least 0"),
    (dict(top_k=14), ValueError, "top_k must be at most the vocabulary size 13"),
    (dict(temperature=-1.0), ValueError, "temperature must be at least 0"),
    (dict(fast="yes"), TypeError, "fast must be True or False"),
])
def test_bad_arguments_are_refused_when_called_not_at_the_first_token(kwargs, error, message):
    args = dict(prompt=[1, 2], max_new_tokens=2) | kwargs
    with pytest.raises(error, match=message):
        stream_tokens(tiny_gpt(), args.pop("prompt"), args.pop("max_new_tokens"), **args)
