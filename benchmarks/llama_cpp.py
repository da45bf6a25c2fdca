"""Our GGUF files in llama.cpp: equal greedy tokens, and speed side by side (chapter 19, issue 44).

Run from the repository root, after ``make llama-cpp`` (llama-cpp-python built once into the
cache, outside the clone):
    .venv/bin/python benchmarks/llama_cpp.py [--threads 2] [--tokens 32] [--json FILE]

SmolLM2-135M-Instruct's file (Q4_1, downloaded by ``make``) is read by ``Llama.from_gguf``
(dequantised to float32) and written again by ``gguf.save_llama`` as F32 and as Q8_0. Then,
on five chat prompts (SmolLM2's own template, greedy, ``--tokens`` new tokens each):

* F32: llama.cpp reading our F32 file against our float32 model: the tokens must be equal
  (the same numbers; only the order of additions differs, so a near-tie could flip: the
  script prints the top-two logit margin where they part);
* Q8_0: llama.cpp reading our Q8_0 file against our model reading the same file. Both hold
  the same 8-bit weights, but llama.cpp's Q8_0 dot products also round each row of
  activations to 8 bits, which we do not: agreement is measured, not required;
* Q4_1: the original file, in llama.cpp, against our dequantised float32 model, the same way.

Speed: tokens per second of greedy decoding at ``--threads`` (batch 1, the same prompt), for
ours in float32 (the fast step) and llama.cpp at F32, Q8_0 and Q4_1, each as a fraction of its
own bandwidth limit (bandwidth measured in the run / bytes of weights per token). The load
average is printed first and last: timings on a busy machine mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from minitransformer import generate, pretrained
from minitransformer.bpe import BPETokenizer
from minitransformer.chat import apply_chat_template
from minitransformer.gguf import save_llama
from minitransformer.llama import Llama

LLAMA_CPP_VERSION = "0.3.36"
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "How many legs does a spider have?", "Give me three tips for sleeping well.",
           "What is 12 times 7?"]


def llama_cpp_module():
    """``llama_cpp`` from the cache folder ``make llama-cpp`` builds, or exit with a line."""
    folder = pretrained.cache_folder() / f"llama-cpp-python-{LLAMA_CPP_VERSION}"
    if not folder.is_dir():
        sys.exit(f"llama_cpp.py: {folder} is missing: run `make llama-cpp` first")
    sys.path.insert(0, str(folder))
    import llama_cpp
    return llama_cpp


def bandwidth_gbs() -> float:
    """GB/s of summing a 512 MB float32 tensor (best of 5)."""
    x = torch.ones(128 * 2 ** 20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def ours_greedy(model: Llama, ids: list[int], tokens: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = generate(model, torch.tensor([ids]), tokens, temperature=0)[0, len(ids):].tolist()
    return out, time.perf_counter() - start


def theirs_greedy(llm, ids: list[int], tokens: int) -> tuple[list[int], float]:
    out: list[int] = []
    start = time.perf_counter()
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if len(out) == tokens:
            break
    return out, time.perf_counter() - start


def agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens are equal."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def margin(model: Llama, ids: list[int], tokens: list[int], at: int) -> float:
    """Our top-two logit margin at the position where the two continuations part."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens[:at]]))[0][0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", help="also write the figures as JSON")
    args = parser.parse_args()
    llama_cpp = llama_cpp_module()
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, {args.threads} threads, "
          f"{args.tokens} greedy tokens, llama-cpp-python {llama_cpp.__version__}")
    source = pretrained.smollm2_path()
    tokenizer = BPETokenizer.from_gguf(source)
    model = Llama.from_gguf(source).eval()
    prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": p}],
                                   add_generation_prompt=True) for p in PROMPTS]
    figures: dict[str, dict] = {}
    gbs = bandwidth_gbs()
    print(f"memory bandwidth {gbs:.1f} GB/s")
    with tempfile.TemporaryDirectory() as tmp:
        files = {"F32": Path(tmp) / "f32.gguf", "Q8_0": Path(tmp) / "q8_0.gguf",
                 "Q4_1": source}
        for kind in ("F32", "Q8_0"):
            save_llama(model, files[kind], type=kind, tokenizer=tokenizer)
        for kind, path in files.items():
            ours_model = model if kind != "Q8_0" else Llama.from_gguf(path).eval()
            llm = llama_cpp.Llama(model_path=str(path), n_threads=args.threads, n_ctx=512,
                                  verbose=False)
            equal, parts, ours_times, theirs_times = 0, [], [], []
            for ids in prompts:
                ours, t_ours = ours_greedy(ours_model, ids, args.tokens)
                theirs, t_theirs = theirs_greedy(llm, ids, args.tokens)
                ours_times.append(args.tokens / t_ours)
                theirs_times.append(args.tokens / t_theirs)
                same = agreement(ours, theirs)
                equal += same == args.tokens
                if same < args.tokens:
                    parts.append({"prompt": PROMPTS[prompts.index(ids)], "parted_at": same,
                                  "our_margin": round(margin(ours_model, ids, ours, same), 4)})
            size = os.path.getsize(path)
            theirs_rate = statistics.median(theirs_times)
            figures[kind] = {
                "prompts_equal": equal, "prompts": len(prompts), "parted": parts,
                "llama_cpp_tok_s": round(theirs_rate, 1),
                "llama_cpp_fraction_of_limit": round(theirs_rate * size / (gbs * 1e9), 2),
                "ours_float32_tok_s": round(statistics.median(ours_times), 1)}
            print(f"{kind}: greedy tokens equal on {equal}/{len(prompts)} prompts; llama.cpp "
                  f"{theirs_rate:.1f} tok/s ({figures[kind]['llama_cpp_fraction_of_limit']:.0%}"
                  f" of its limit, file {size / 1e6:.0f} MB), ours (float32) "
                  f"{figures[kind]['ours_float32_tok_s']:.1f} tok/s")
            for part in parts:
                print(f"  parted at token {part['parted_at']} of {part['prompt']!r}, where our "
                      f"top-two margin is {part['our_margin']}")
            del llm
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"bandwidth_gbs": round(gbs, 1), **figures},
                                              indent=1) + "\n")


if __name__ == "__main__":
    main()
