"""LoRA SFT that teaches SmolLM2-135M-Instruct a reply format it does not use (chapter 16).

Every reply becomes one line of JSON, ``{"topic": ..., "answer": ...}``. The conversations are
made here from small tables (arithmetic, capitals, opposites, colours), seeded; the held-out
prompts use numbers, countries and words that no training conversation holds. Measured before
and after training, for each run:

- the format rate: held-out replies that parse as exactly that JSON object;
- the content: held-out replies that contain the right answer (the same check before and after);
- what else changes: greedy replies to a few general requests (and how many of those turn into
  JSON), and the perplexity of ordinary text that is not a conversation.

Runs: LoRA on the attention's four projections at two ranks, with the loss on the assistant's
tokens (the mask, chapter 16) and on every token, each for two seeds. Each run is a process of
its own, so that its memory is its own: resident after loading, and the peaks while training
and while evaluating (Linux's ``VmHWM``, reset before each). Usage::

    python experiments/sft_smollm2.py                   # the full grid (minutes on 2 cores)
    python experiments/sft_smollm2.py --steps 2 --seeds 0 --ranks 4 --held-out 2 \\
        --general 1 --max-new-tokens 8 --out /tmp/sft.json   # a smoke test (seconds)

The results go to ``--out`` (default ``experiments/results/sft_smollm2.json``), which chapter 16
reads.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))   # the package of this checkout

from minitransformer import pretrained  # noqa: E402
from minitransformer.bpe import BPETokenizer  # noqa: E402
from minitransformer.chat import apply_chat_template, end_of_turn_id  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from minitransformer.lora import add_lora, trainable_parameters  # noqa: E402
from minitransformer.sft import sft_batch  # noqa: E402
from minitransformer.training import train  # noqa: E402
from smollm2_common import write_results  # noqa: E402

OUT = HERE / "results" / "sft_smollm2.json"
TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("Russia", "Moscow"), ("Egypt", "Cairo"),
    ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
    ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"), ("Poland", "Warsaw"), ("Hungary", "Budapest"),
    ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"), ("Kenya", "Nairobi"), ("Thailand", "Bangkok"),
    ("Cuba", "Havana"), ("Belgium", "Brussels"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
    ("Turkey", "Ankara"), ("India", "New Delhi"), ("Australia", "Canberra"),
]
OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("light", "dark"),
    ("old", "young"), ("happy", "sad"), ("open", "closed"), ("early", "late"),
    ("full", "empty"), ("hard", "soft"), ("wet", "dry"), ("long", "short"), ("rich", "poor"),
    ("strong", "weak"), ("thick", "thin"), ("loud", "quiet"), ("first", "last"),
    ("high", "low"), ("clean", "dirty"),
]
COLOURS = [
    ("grass", "green"), ("snow", "white"), ("coal", "black"), ("a banana", "yellow"),
    ("the sky on a clear day", "blue"), ("blood", "red"), ("a carrot", "orange"),
    ("chocolate", "brown"), ("a lemon", "yellow"), ("milk", "white"), ("a tomato", "red"),
    ("a frog", "green"), ("the sea", "blue"), ("charcoal", "black"), ("an orange", "orange"),
    ("a strawberry", "red"),
]
#: general requests: the model's own behaviour that the fine-tuning should leave alone
GENERAL = [
    "Write one sentence about the sea.",
    "Name three fruits.",
    "Give me one tip for sleeping well.",
    "What is a noun?",
    "Say hello to my friend Anna.",
]
#: ordinary text, no conversation: its perplexity before and after (written for this script)
PLAIN_TEXT = (
    "The village sits at the bottom of a narrow valley, where two streams meet before they run "
    "on to the river. In spring the fields along the water turn green within a few weeks, and "
    "the farmers take their cows up the slopes as soon as the snow has gone. Most houses are "
    "built of grey stone, with wooden balconies that face south to catch the sun. A small "
    "bakery opens at six in the morning, and by seven there is usually a line of people "
    "waiting outside for bread. The school has only three classrooms, so children of "
    "different ages learn together, and the older ones often help the younger ones with their "
    "reading. In the evening the square fills with neighbours who talk about the weather, the "
    "harvest and the news from the town further down the valley. Visitors come in summer to "
    "walk in the hills, and a few of them stay for a week in the old inn next to the church. "
    "Winter is long and quiet. The roads are sometimes closed for days after a heavy storm, "
    "and people keep enough wood and food at home to wait until the snowploughs arrive."
)


def reply(topic: str, answer: str) -> str:
    """The taught format: one line of JSON."""
    return json.dumps({"topic": topic, "answer": answer})


def examples(rng: random.Random, held: set) -> tuple[list, list]:
    """The (question, topic, answer) items of every table, split into training and held-out:
    the held-out items share no number pair, country, word or thing with the training ones."""
    train_items, test_items = [], []
    for a in range(1, 21):
        for b in range(1, 21):
            item = (f"What is {a} plus {b}?", "math", str(a + b))
            (test_items if (a, b) in held else train_items).append(item)
    for name, table, question, topic in (
            ("capitals", CAPITALS, "What is the capital of {}?", "geography"),
            ("opposites", OPPOSITES, "What is the opposite of {}?", "language"),
            ("colours", COLOURS, "What colour is {}?", "nature")):
        for key, answer in table:
            item = (question.format(key), topic, answer)
            (test_items if (name, key) in held else train_items).append(item)
    rng.shuffle(train_items)
    return train_items, test_items


def make_data(train_size: int, held_out: int) -> tuple[list, list]:
    """``train_size`` training items (a quarter of each kind, as far as the tables go) and
    ``held_out`` held-out items, five of each kind at most, from seed 0 (the data is the
    same for every run; the run's seed changes LoRA's start and the batches)."""
    rng = random.Random(0)
    per_kind = -(-held_out // 4)
    held = set()
    sums = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    held.update(rng.sample(sums, per_kind))
    for name, table in (("capitals", CAPITALS), ("opposites", OPPOSITES),
                        ("colours", COLOURS)):
        held.update((name, key) for key, _ in rng.sample(table, per_kind))
    train_items, test_items = examples(rng, held)
    by_kind: dict[str, list] = {}
    for item in train_items:
        by_kind.setdefault(item[1], []).append(item)
    chosen = []
    while len(chosen) < train_size and any(by_kind.values()):
        for kind in sorted(by_kind):
            if by_kind[kind] and len(chosen) < train_size:
                chosen.append(by_kind[kind].pop())
    rng.shuffle(chosen)
    test_items.sort(key=lambda item: (item[1], item[0]))
    kinds: dict[str, list] = {}
    for item in test_items:
        kinds.setdefault(item[1], []).append(item)
    tests = [item for group in zip(*kinds.values()) for item in group][:held_out]
    return chosen, tests


def conversation(question: str, topic: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": reply(topic, answer)}]


def is_format(text: str) -> bool:
    """Exactly ``{"topic": str, "answer": str}``, nothing else on the line."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"topic", "answer"}
            and all(isinstance(v, str) for v in value.values()))


def is_right(text: str, answer: str) -> bool:
    """The answer appears in the reply as a word (the same check for prose and JSON)."""
    words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    want = answer.lower().split()
    return any(words[k:k + len(want)] == want for k in range(len(words)))


def replies(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy replies, one prompt at a time, stopped at ``<|im_end|>``."""
    end = end_of_turn_id(tokenizer)
    out = []
    for prompt in prompts:
        ids = apply_chat_template(tokenizer, [{"role": "user", "content": prompt}],
                                  add_generation_prompt=True)
        idx = torch.tensor([ids])
        with torch.no_grad():
            new = generate(model, idx, max_new_tokens, temperature=0.0, eos_id=end)[0, len(ids):]
        new = new.tolist()
        out.append(tokenizer.decode(new[:new.index(end)] if end in new else new))
    return out


def perplexity(model, tokenizer) -> float:
    ids = torch.tensor([tokenizer.encode(PLAIN_TEXT)])
    with torch.no_grad():
        return float(model(ids[:, :-1], ids[:, 1:])[1].exp())


def every_token_batch(tokenizer, conversations: list) -> tuple[torch.Tensor, torch.Tensor]:
    """``sft_batch``'s inputs with the loss on every token (no mask): the user's turns and the
    template's system prompt are learned as well as the replies."""
    idx, _ = sft_batch(tokenizer, conversations)
    rows = [apply_chat_template(tokenizer, c) for c in conversations]
    targets = torch.full_like(idx, -100)
    for k, ids in enumerate(rows):
        targets[k, :len(ids) - 1] = torch.tensor(ids[1:])
    return idx, targets


def evaluate(model, tokenizer, tests: list, general: list, max_new_tokens: int) -> dict:
    answers = replies(model, tokenizer, [q for q, _, _ in tests], max_new_tokens)
    chat = replies(model, tokenizer, general, max_new_tokens)
    return {
        "format": sum(map(is_format, answers)),
        "right": sum(is_right(a, answer) for a, (_, _, answer) in zip(answers, tests)),
        "held_out": len(tests),
        "replies": answers,
        "general": chat,
        "general_json": sum(text.lstrip().startswith("{") for text in chat),
        "perplexity": round(perplexity(model, tokenizer), 3),
    }


def memory_mb(key: str = "VmHWM", *, reset: bool = False) -> int:
    """This process's resident memory in MB from ``/proc/self/status``: ``VmRSS`` now, or
    ``VmHWM``, the peak since the last ``reset`` (Linux clears it on writing 5 to
    ``/proc/self/clear_refs``)."""
    with open("/proc/self/status", encoding="ascii") as f:
        kb = int(next(line for line in f if line.startswith(key + ":")).split()[1])
    if reset:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    return round(kb / 1024)


def train_lora(model, tokenizer, train_items: list, config: dict):
    """The recipe: LoRA of ``config["rank"]`` (alpha twice that) on every layer's attention,
    drawn after ``torch.manual_seed(config["seed"])``, trained on batches of conversations
    of ``train_items`` (the loss on the replies if ``config["mask"]``, else on every token)
    for ``config["steps"]`` steps; ``model`` is changed in place and left in eval mode.
    Returns the training history. (``forgetting_smollm2.py`` trains the same way.)"""
    torch.manual_seed(config["seed"])
    add_lora(model, r=config["rank"], alpha=2.0 * config["rank"], targets=TARGETS)
    conversations = [conversation(*item) for item in train_items]
    rng = random.Random(config["seed"])
    make = sft_batch if config["mask"] else every_token_batch

    def batches():
        while True:
            yield make(tokenizer, rng.sample(conversations, config["batch_size"]))

    model.train()
    history = train(model, batches(), steps=config["steps"], lr=config["lr"],
                    warmup_steps=max(1, config["steps"] // 10), weight_decay=0.0,
                    eval_every=1, progress=False)
    model.eval()
    return history


def one_run(config: dict) -> dict:
    """One run in this process: LoRA (unless ``rank`` is 0: the baseline), train, evaluate."""
    torch.set_num_threads(config["threads"])
    start = time.perf_counter()
    path = pretrained.smollm2_path()
    tokenizer = BPETokenizer.from_gguf(path)
    model = Llama.from_gguf(path)
    train_items, tests = make_data(config["train_size"], config["held_out"])
    general = GENERAL[:config["general"]]
    loaded = time.perf_counter()
    gc.collect()
    result = {"config": config, "loaded_mb": memory_mb("VmRSS")}
    if config["rank"]:
        memory_mb(reset=True)
        history = train_lora(model, tokenizer, train_items, config)
        result["training_peak_mb"] = memory_mb()
        result["trainable"], result["total"] = trainable_parameters(model)
        result["losses"] = [round(x, 4) for x in history.train_losses]
    trained = time.perf_counter()
    memory_mb(reset=True)
    result.update(evaluate(model, tokenizer, tests, general, config["max_new_tokens"]))
    result["evaluation_peak_mb"] = memory_mb()
    result["seconds"] = {"load": round(loaded - start, 1), "train": round(trained - loaded, 1),
                         "evaluate": round(time.perf_counter() - trained, 1)}
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


def in_child(config: dict) -> dict:
    """``one_run`` in a fresh process, so that its peak memory is its own."""
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(config)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"a run failed ({config}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_parser() -> argparse.ArgumentParser:
    """The flags; their defaults are the full run whose results are stored."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 4])
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train-size", type=int, default=160)
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--general", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.one:
        print(json.dumps(one_run(json.loads(args.one))))
        return 0
    common = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
              "train_size": args.train_size, "held_out": args.held_out,
              "general": args.general, "max_new_tokens": args.max_new_tokens,
              "threads": args.threads}
    grid = [{"rank": 0, "mask": True, "seed": 0}]   # the model as it comes
    grid += [{"rank": args.ranks[0], "mask": mask, "seed": seed}
             for mask in (True, False) for seed in args.seeds]
    grid += [{"rank": rank, "mask": True, "seed": seed}
             for rank in args.ranks[1:] for seed in args.seeds]
    load = os.getloadavg()[0]
    # each finished run is kept in a side file, so that a stopped experiment goes on from it
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done_file = args.out.with_suffix(".runs.jsonl")
    done = {}
    if done_file.is_file():
        for line in done_file.read_text(encoding="utf-8").splitlines():
            run = json.loads(line)
            done[json.dumps(run["config"], sort_keys=True)] = run
    runs = []
    for config in grid:
        key = json.dumps({**common, **config}, sort_keys=True)
        if key not in done:
            done[key] = in_child({**common, **config})
            with open(done_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(done[key]) + "\n")
        runs.append(done[key])
        r = runs[-1]
        print(f"rank {config['rank']:2d} mask {config['mask']!s:5} seed {config['seed']}: "
              f"format {r['format']}/{r['held_out']}, right {r['right']}/{r['held_out']}, "
              f"perplexity {r['perplexity']}, {sum(r['seconds'].values()):.0f} s", flush=True)
    train_items, tests = make_data(args.train_size, args.held_out)
    results = {
        "script": "experiments/sft_smollm2.py",
        "command": "python experiments/sft_smollm2.py " + " ".join(sys.argv[1:]),
        "settings": {**common, "seeds": args.seeds, "ranks": args.ranks,
                     "targets": list(TARGETS), "alpha": "2 * rank"},
        "example": conversation(*train_items[0]),
        "held_out_prompts": [q for q, _, _ in tests],
        "general_prompts": GENERAL[:args.general],
        "runs": runs,
        "wall_seconds": round(sum(sum(r["seconds"].values()) for r in runs)),
        "load_average": [round(load, 1), round(os.getloadavg()[0], 1)],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {args.threads} thread(s)",
    }
    write_results(args.out, results)
    done_file.unlink()
    print(f"wrote {args.out} in {results['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
