"""The full check of SmolLM2-135M-Instruct read by our own code (issue 41), longer than a test.

Run from the repository root, after `make smollm2`:
    OMP_NUM_THREADS=1 .venv/bin/python tools/check_smollm2.py [--prompts 10] [--tokens 128]

For each of the chat prompts of tests/test_smollm2.py (token ids by transformers' tokenizer read
from the GGUF file), both models continue greedily for ``--tokens`` tokens, each with its own KV
cache: ours with ``Llama.from_gguf`` and ``minitransformer.generate(temperature=0)``, theirs with
``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`` called step by step with its
``cache``. Neither stops at the end-of-turn token, so every prompt compares the same number of
tokens. It prints the CPU time of dequantising the whole file (one thread), the largest logit
difference on the prompts relative to the largest logit, and how many prompts agree on every
new token.
Exit status 1 when a figure misses its target (2 s, 1e-4, all prompts).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

from minitransformer import pretrained  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.gguf import GGUFFile  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from test_smollm2 import PROMPTS  # noqa: E402


def greedy(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' model continued greedily through its own KV cache, never stopping (its
    ``generate`` would stop at, or with ``min_new_tokens`` forbid, the end-of-turn token)."""
    out = model(ids, use_cache=True)
    for _ in range(new_tokens):
        ids = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
        if _ + 1 < new_tokens:
            out = model(ids[:, -1:], cache=out.cache, use_cache=True)
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = pretrained.smollm2_path()

    file = GGUFFile(path)
    start = time.process_time()
    for name in file.tensors:
        file.tensor(name)
    dequant = time.process_time() - start
    print(f"dequantising all {len(file.tensors)} tensors: {dequant:.2f} s of CPU (target < 2)")

    from transformers import AutoModelForCausalLM, AutoTokenizer
    start = time.perf_counter()
    ours = Llama.from_gguf(path)
    print(f"Llama.from_gguf: {time.perf_counter() - start:.1f} s, "
          f"{sum(p.numel() for p in ours.parameters()):,} parameters")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    worst, agree = 0.0, 0
    for text in PROMPTS[:args.prompts]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, return_dict=True,
                                            return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = theirs(ids).logits
            worst = max(worst, ((ours(ids)[0] - expected).abs().max()
                                / expected.abs().max()).item())
            mine = generate(ours, ids, args.tokens, temperature=0.0)
            reference = greedy(theirs, ids, args.tokens)
        same = torch.equal(mine, reference)
        agree += same
        first = (mine[0] != reference[0]).nonzero()
        print(f"{text[:40]!r:44} {'equal' if same else f'differs at {first[0].item()}'}: "
              f"{tokenizer.decode(mine[0, ids.shape[1]:])[:60]!r}")
    n = min(args.prompts, len(PROMPTS))
    print(f"largest logit difference / largest logit: {worst:.2e} (target <= 1e-4)")
    print(f"greedy tokens equal on {agree}/{n} prompts x {args.tokens} new tokens")
    return 0 if dequant < 2 and worst <= 1e-4 and agree == n else 1


if __name__ == "__main__":
    sys.exit(main())
