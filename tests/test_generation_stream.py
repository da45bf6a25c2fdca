"""stream_tokens (minitransformer.generation): one prompt continued token by token from one
KV cache, with the tokens of generate."""

import dataclasses

import pytest
import torch

from helpers import tiny_gpt, tiny_llama
from minitransformer import generate, stream_tokens


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
    (dict(prompt=[]), ValueError, "prompt is empty: it needs at least one token"),
    (dict(prompt=[1, 13]), ValueError, "token id 13"),
    (dict(prompt=[1, -1]), ValueError, r"prompt\[1\] must be at least 0"),
    (dict(prompt=[[1, 2]]), TypeError, r"prompt\[0\] must be an int"),
    (dict(prompt=torch.tensor([[1, 2]])), ValueError, r"one row of token ids, got shape"),
    (dict(prompt="12"), TypeError, "prompt must be a list of token ids, got str"),
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


# --- SamplingParams: the options in one value ----------------------------------------------

from minitransformer import SamplingParams, generate_batch, sample_next  # noqa: E402
from minitransformer.serving import Engine, Request  # noqa: E402


def test_sampling_params_give_the_tokens_of_the_keywords():
    model = tiny_gpt()
    options = dict(temperature=1.3, top_k=7, top_p=0.9, presence_penalty=0.4,
                   frequency_penalty=0.1)
    keywords = generate(model, torch.tensor([PROMPT]), 12, **options,
                        generator=torch.Generator().manual_seed(5))
    params = SamplingParams(**options, seed=5)
    assert torch.equal(generate(model, torch.tensor([PROMPT]), 12, sampling=params), keywords)
    assert list(stream_tokens(model, PROMPT, 12, sampling=params)) == keywords[0, 5:].tolist()
    # generate_batch seeds every row with sampling.seed; the engine's request keeps its options
    assert generate_batch(model, [PROMPT], 12, sampling=params) == [keywords[0, 5:].tolist()]
    assert generate_batch(model, [PROMPT], 12, **options, seeds=[5]) == [
        keywords[0, 5:].tolist()]
    request = Request(PROMPT, max_tokens=12, **options, seed=5)
    assert request.sampling == params
    engine = Engine(model, kv_blocks=8, block_size=4, eos_ids=())
    assert engine.run([request])[0].token_ids == keywords[0, 5:].tolist()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-1.0), ValueError, "temperature must be at least 0"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_k=0), ValueError, "top_k must be at least 1"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(presence_penalty=float("inf")), ValueError, "presence_penalty must be finite"),
    (dict(frequency_penalty=None), TypeError, "frequency_penalty must be a number"),
    (dict(seed=-1), ValueError, "seed must be at least 0"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
])
def test_sampling_params_name_a_bad_option(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_are_checked_against_the_vocabulary_and_not_mixed_with_keywords():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="top_k must be at most the vocabulary size 13"):
        generate(model, torch.tensor([PROMPT]), 2, sampling=SamplingParams(top_k=14))
    with pytest.raises(TypeError, match="not both: got sampling= and top_k="):
        generate(model, torch.tensor([PROMPT]), 2, sampling=SamplingParams(), top_k=3)
    with pytest.raises(TypeError, match="sampling.seed or generator=, not both"):
        stream_tokens(model, PROMPT, 2, sampling=SamplingParams(seed=1),
                      generator=torch.Generator())
    with pytest.raises(TypeError, match="sampling must be a SamplingParams, got dict"):
        generate(model, torch.tensor([PROMPT]), 2, sampling={"temperature": 0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().temperature = 0.0


def test_nan_weights_are_named_not_a_softmax_error():
    model = tiny_gpt()
    with torch.no_grad():
        model.head.weight[3, 0] = float("nan")
    for temperature in (0, 1.0):          # greedy would otherwise pick a NaN silently
        with pytest.raises(ValueError, match="the model's scores .logits. hold NaN: are its "
                                             "weights NaN"):
            generate(model, torch.tensor([PROMPT]), 3, temperature=temperature)
        with pytest.raises(ValueError, match="hold NaN: are its weights NaN"):
            list(stream_tokens(model, PROMPT, 3, temperature=temperature))


def test_a_penalty_that_overflows_the_scores_is_named():
    model = tiny_gpt()
    with pytest.raises(ValueError, match=r"frequency_penalty=1e\+308 overflowed the scores "
                                         r"\(torch.float32\) to NaN: use smaller penalties"):
        generate(model, torch.tensor([PROMPT]), 3, frequency_penalty=1e308)
    logits, counts = torch.zeros(1, 4), torch.tensor([[0, 1, 0, 0]])
    with pytest.raises(ValueError, match="presence_penalty=1e\\+300 .* overflowed"):
        sample_next(logits, presence_penalty=1e300, counts=counts)
    # a large penalty that stays finite is no error: the word is ruled out
    assert sample_next(logits, presence_penalty=1e30, counts=counts, temperature=0).item() == 0
