"""Several LoRA adapters served over one base model (issue 43): ``serve --lora NAME=DIR``.

A request chooses the base or an adapter by its ``model``, as with vLLM's ``--lora-modules``.
The engine merges one adapter at a time into the weights (an ``AdapterSet``) and switches when
the oldest waiting request asks for another, so each request's greedy tokens are those of
``generate`` on that adapter's merged model alone, whatever the others in the queue ask for,
and the base weights are bit for bit the base's again after any number of switches.
"""

from __future__ import annotations

import copy

import pytest
import torch

openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx", reason="the openai client's httpx is not installed")

from helpers import tiny_gpt, tiny_llama  # noqa: E402
from test_server import build_model_dir, running, serve_model_dir  # noqa: E402

from minitransformer import GPT, BPETokenizer  # noqa: E402
from minitransformer.bpe import GPT2_PATTERN  # noqa: E402
from minitransformer.chat import CHAT_TOKENS, apply_chat_template  # noqa: E402
from minitransformer.cli import main  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.lora import (AdapterSet, add_lora, load_adapter, merge_lora,  # noqa: E402
                                  save_adapter)
from minitransformer.server import create_app  # noqa: E402
from minitransformer.serving import Engine, Request  # noqa: E402

GPT_TARGETS = ["out_proj", "linear1", "linear2"]      # GPT-2's fused c_attn: not q, k, v
LLAMA_TARGETS = ["q_proj", "v_proj", "down_proj"]


def make_adapter(base: torch.nn.Module, folder, *, seed: int, targets: list[str],
                 r: int = 2, alpha: float = 4.0, scale: float = 0.5):
    """An adapter for ``base`` written in PEFT's layout, with B drawn (B = 0 changes
    nothing, and a test that forgot the adapter would pass); ``base`` is left as it was."""
    model = copy.deepcopy(base)
    add_lora(model, r=r, alpha=alpha, targets=targets)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    save_adapter(model, folder, base_model_name_or_path="base")
    return folder


def merged(base: torch.nn.Module, adapter) -> torch.nn.Module:
    """The base with the adapter merged, as ``finetune --merge`` writes it."""
    return merge_lora(load_adapter(copy.deepcopy(base), adapter)).eval()


def greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    out = generate(model, torch.tensor([prompt]), n, temperature=0.0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["gpt", "llama"])
def three(request, tmp_path_factory):
    """A tiny model, two adapters on it, and each one's merged model (None: the base)."""
    folder = tmp_path_factory.mktemp(f"lora-{request.param}")
    if request.param == "gpt":
        base, targets = tiny_gpt(vocab_size=40, d_model=32, context_length=48), GPT_TARGETS
    else:
        base, targets = tiny_llama(vocab_size=40, d_model=32, context_length=48), LLAMA_TARGETS
    paths = {name: make_adapter(base, folder / name, seed=seed, targets=targets)
             for name, seed in (("a", 1), ("b", 2))}
    models = {None: base, **{name: merged(base, path) for name, path in paths.items()}}
    return base, paths, models


def engine_over(base, paths, **options) -> Engine:
    adapters = AdapterSet(base)
    for name, path in paths.items():
        adapters.add(name, path)
    return Engine(base, None, max_batch=4, kv_blocks=64, adapters=adapters, **options)


PROMPTS = [[1, 5, 9, 2], [3, 3, 7], [11, 4, 8, 15, 16, 23, 2, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8,
                                     9, 10], [20, 1], [6, 6, 6, 30, 2]]


def test_the_adapters_change_the_tokens(three):
    _, _, models = three
    outputs = {name: [greedy(m, p, 6) for p in PROMPTS] for name, m in models.items()}
    assert outputs[None] != outputs["a"] != outputs["b"] != outputs[None]


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_mixed_stream_gets_each_adapter_s_merged_tokens(three, prefix_caching):
    """Base, a and b interleaved in one queue (the same prompts to each, so that prefix
    caching would share blocks across adapters if it could): every request's greedy tokens
    are generate's on its own merged model."""
    base, paths, models = three
    before = {k: v.clone() for k, v in base.state_dict().items()}
    engine = engine_over(base, paths, prefix_caching=prefix_caching)
    order = [None, "a", "a", "b", None, "b", "a", None, "b", "b", "a", None]
    long = PROMPTS[2] * 2                          # 40 tokens: two full blocks to share
    jobs = [(name, long if k % 2 else PROMPTS[k % len(PROMPTS)] * 2)
            for k, name in enumerate(order)]
    done = engine.run([Request(p, max_tokens=6, temperature=0.0, adapter=name)
                       for name, p in jobs])
    for (name, prompt), completion in zip(jobs, done):
        assert completion.token_ids == greedy(models[name], prompt, 6), name
    shared = sum(len(p) for _, p in jobs) - engine.prefilled
    assert shared > 0 if prefix_caching else shared == 0     # "a", "a": one shares
    assert engine.switches >= 7                    # each change of adapter in the queue
    assert engine.num_free_blocks == engine.num_blocks
    engine.adapters.activate(None)
    after = base.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit for bit


def test_an_adapter_s_weights_are_merge_lora_s_bit_for_bit_and_the_base_comes_back(three):
    base, paths, models = three
    before = {k: v.clone() for k, v in base.state_dict().items()}
    adapters = AdapterSet(base)
    for name, path in paths.items():
        adapters.add(name, path)
    for name in ["a", "b", None, "b", "a", "a", None, "a", None]:
        adapters.activate(name)
        reference = (models[name] if name else None)
        state = base.state_dict()
        expected = before if reference is None else reference.state_dict()
        assert all(torch.equal(state[k], expected[k]) for k in state), name


def test_the_fast_step_s_packed_weights_see_each_switch(three):
    """The engine packs its weights once (pack_weights): a switch must be seen by them, and
    a request to the base after an adapter's gets the base's tokens."""
    base, paths, models = three
    engine = engine_over(base, paths)
    prompt = PROMPTS[2]
    for name in ["a", None, "b", None, "a"]:
        (done,) = engine.run([Request(prompt * 2, max_tokens=5, temperature=0.0,
                                      adapter=name)])
        assert done.token_ids == greedy(models[name], prompt * 2, 5), name


def test_first_come_first_served_no_request_passes_the_head(three):
    """When the oldest waiting request wants another adapter, those behind it wait too: the
    requests start in the order they came."""
    base, paths, _ = three
    engine = engine_over(base, paths)
    order = ["a", "a", "b", "a", None, "a"]
    ids = [engine.submit(Request(PROMPTS[0], max_tokens=3, temperature=0.0, adapter=name))
           for name in order]
    started = []
    while engine.has_work:
        for event in engine.step():
            if event.request_id not in started:
                started.append(event.request_id)
    assert started == ids


def test_the_engine_refuses_an_unknown_adapter_and_a_set_over_another_model(three):
    base, paths, _ = three
    engine = engine_over(base, paths)
    with pytest.raises(ValueError, match="'c'.*no such adapter.*'a', 'b'"):
        engine.submit(Request([1, 2], max_tokens=2, adapter="c"))
    with pytest.raises(ValueError, match="no such adapter.*none"):
        Engine(base, None).submit(Request([1, 2], max_tokens=2, adapter="a"))
    with pytest.raises(ValueError, match="another model"):
        Engine(copy.deepcopy(base), None, adapters=AdapterSet(base))
    adapters = AdapterSet(base)
    adapters.add("a", paths["a"])
    with pytest.raises(ValueError, match="already"):
        adapters.add("a", paths["b"])
    with pytest.raises(ValueError, match="no adapter is called 'z'"):
        adapters.activate("z")


# ----- the server and the command line ---------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("lora-base"))


@pytest.fixture(scope="module")
def adapter_dirs(model_dir, tmp_path_factory):
    base = GPT.from_pretrained(model_dir)
    folder = tmp_path_factory.mktemp("lora-adapters")
    tokenizer = BPETokenizer.from_pretrained(model_dir)
    paths = {}
    for name, seed in (("poet", 3), ("pirate", 4)):
        paths[name] = make_adapter(base, folder / name, seed=seed, targets=GPT_TARGETS,
                                   scale=0.3)
        tokenizer.save_pretrained(paths[name])           # as finetune writes it
    return paths


@pytest.fixture(scope="module")
def served(model_dir, adapter_dirs):
    record = serve_model_dir(model_dir)
    adapters = AdapterSet(record.engine.model)
    for name, path in adapter_dirs.items():
        adapters.add(name, path)
    record.engine = Engine(record.engine.model, record.tokenizer, max_batch=16, kv_blocks=80,
                           adapters=adapters)
    app = create_app(record.engine, record.tokenizer, model_name=record.name)
    with running(app) as url:
        record.url = url
        record.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        yield record


def test_models_lists_the_base_and_each_adapter_with_its_parent(served):
    cards = served.client.models.list().data
    assert [c.id for c in cards] == [served.name, "poet", "pirate"]
    assert [getattr(c, "parent", "missing") for c in cards] == [None, served.name, served.name]
    assert served.client.models.retrieve("pirate").parent == served.name


def test_a_request_to_each_model_gets_that_model_s_reply(served, model_dir, adapter_dirs):
    """Chats to the base and to each adapter, sent at once from threads: each reply is the
    greedy reply of its merged model alone, and names the model it was asked of."""
    from concurrent.futures import ThreadPoolExecutor

    base = GPT.from_pretrained(model_dir).eval()
    models = {served.name: base, **{n: merged(base, p) for n, p in adapter_dirs.items()}}
    turns = ["Hello there", "Why?", "Tell me more"]
    jobs = [(name, turn) for turn in turns for name in models]
    stops = set(served.engine.eos_ids)

    def expected(name, turn):
        prompt = apply_chat_template(served.tokenizer, [{"role": "user", "content": turn}],
                                     add_generation_prompt=True)
        ids = greedy(models[name], prompt, 8)
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return served.tokenizer.decode(ids[:cut])

    def ask(job):
        name, turn = job
        reply = served.client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": turn}], max_tokens=8,
            temperature=0)
        return reply.model, reply.choices[0].message.content

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(ask, jobs))
    want = [(name, expected(name, turn)) for name, turn in jobs]
    assert got == want
    assert len({text for _, text in want}) > len(turns)      # the adapters change replies
    completion = served.client.completions.create(model="poet", prompt="The cat",
                                                  max_tokens=6, temperature=0)
    ids = greedy(models["poet"], served.tokenizer.encode("The cat"), 6)
    assert completion.choices[0].text == served.tokenizer.decode(ids)


def test_an_unknown_model_is_a_404_model_not_found_naming_those_served(served):
    with pytest.raises(openai.NotFoundError) as caught:
        served.client.chat.completions.create(
            model="sailor", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    error = caught.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert '"poet"' in error["message"] and '"pirate"' in error["message"]
    answer = httpx.get(f"{served.url}/v1/models/sailor")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"


def test_create_app_refuses_an_adapter_named_as_the_base(served):
    with pytest.raises(ValueError, match="base model's name"):
        create_app(served.engine, served.tokenizer, model_name="poet")


def refused(capsys, *argv) -> str:
    status = main(["serve", "--port", "0", "--device", "cpu", *map(str, argv)])
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_the_command_line_refuses_bad_lora_flags_in_one_line(capsys, model_dir, adapter_dirs,
                                                             tmp_path):
    poet = adapter_dirs["poet"]
    assert "NAME=DIR" in refused(capsys, "--model", model_dir, "--lora", str(poet))
    assert "NAME=DIR" in refused(capsys, "--model", model_dir, "--lora", f"={poet}")
    assert "two adapters are called 'x'" in refused(
        capsys, "--model", model_dir, "--lora", f"x={poet}", "--lora", f"x={poet}")
    assert "base model's name" in refused(capsys, "--model", model_dir, "--lora",
                                          f"{model_dir.name}={poet}")
    assert "base model's name" in refused(capsys, "--model", model_dir, "--name", "m",
                                          "--lora", f"m={poet}")
    assert "not a LoRA adapter directory" in refused(capsys, "--model", model_dir, "--lora",
                                                     f"x={tmp_path}")
    assert "is a LoRA adapter" in refused(capsys, "--model", poet, "--lora", f"x={poet}")


def test_an_adapter_for_another_base_is_refused_in_one_line(capsys, model_dir, adapter_dirs,
                                                            tmp_path):
    wider = build_model_dir(tmp_path / "wider", d_model=32)
    other = make_adapter(GPT.from_pretrained(wider), tmp_path / "wide-adapter",
                         seed=0, targets=GPT_TARGETS)
    assert "d_model 32" in refused(capsys, "--model", model_dir, "--lora", f"w={other}")
    # the same shapes, another vocabulary: the tokenizer differs
    text = "a completely different text for another tokenizer " * 40
    renamed = tmp_path / "renamed"
    make_adapter(GPT.from_pretrained(model_dir), renamed, seed=0, targets=GPT_TARGETS)
    BPETokenizer.train(text, 300, pattern=GPT2_PATTERN, special_tokens=CHAT_TOKENS
                       ).save_pretrained(renamed)
    assert "tokenizer differs" in refused(capsys, "--model", model_dir, "--lora",
                                          f"v={renamed}")


def test_the_lora_flags_reach_the_engine(model_dir, adapter_dirs, monkeypatch):
    import minitransformer.cli.serve as serve_module
    import minitransformer.serving as serving

    made, engine_class = [], serving.Engine

    def recorded(*args, **kwargs):
        made.append(kwargs)
        return engine_class(*args, **kwargs)

    monkeypatch.setattr(serving, "Engine", recorded)
    monkeypatch.setattr(serve_module, "serve", lambda app, sock, uvicorn: None)  # no loop
    flags = [f"--lora={name}={path}" for name, path in adapter_dirs.items()]
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu",
                 *flags]) == 0
    assert [kwargs["adapters"].names for kwargs in made] == [("poet", "pirate")]
    assert main(["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu"]) == 0
    assert made[-1]["adapters"] is None
