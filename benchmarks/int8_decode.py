"""Weight-only int8 and int4 decoding against float32 and llama.cpp, in one run (issue 44,
chapter 19).

Run from the repository root:
    .venv/bin/python benchmarks/int8_decode.py [--threads 1 2] [--rounds 5] [--tokens 64]
        [--size smollm2|gpt2-small|both] [--no-llama-cpp] [--json FILE]

``--size smollm2`` reads SmolLM2-135M-Instruct's GGUF file (``python -m minitransformer
download smollm2``) three times: kept in float32; with every linear layer replaced by
``minitransformer.quantize.quantize_linears`` (int8 weights, one absmax scale per row); and by
``quantize_linears(bits=4)`` (``Int4Linear``: 4-bit codes with a scale and an offset per block
of 32, which hold the file's Q4_1 weights exactly; the head, tied to the Q8_0 embedding, in int8
per row). Embeddings stay float32. Beside them, llama.cpp (``make llama-cpp``'s build, as
``benchmarks/llama_cpp.py`` uses it) reads our Q8_0 file of the same model (``--no-llama-cpp``
leaves it out). ``--size gpt2-small`` is a randomly initialised GPT of GPT-2 small's shape
(124M parameters): speed only, since a random model's scores are too close for its greedy
tokens to mean anything.

Quality (smollm2): five chat prompts (SmolLM2's template, those of ``benchmarks/llama_cpp.py``),
``--tokens`` greedy tokens each through ``generate`` (the fast step), float32 against int8
and against int4:
how many prompts give equal tokens, how many tokens agree before the first difference, and
there the margin between float32's two best logits. Then float32's continuation is fed to both
models in one pass: the largest difference of the logits over all positions, relative to the
largest float32 logit, and at how many positions the quantized model's best token is
float32's (with the margins where it is not). ``benchmarks/int8_rounding.py`` finds which
rounding parts them.

Quality is measured on one thread (the tokens do not depend on it). Speed, at each of
``--threads``: batch 1, the first prompt continued by ``--tokens`` greedy tokens (prefill included),
one untimed warm-up each, then ``--rounds`` rounds in which the models take turns (the order
reversed every other round); each ratio is the median of the per-round ratios of tokens per
second to float32's, measured in the same run. The load average is printed first and last:
on a busy machine the ratio means little (two threads that wait for each other suffer most in
float32, whose products take longer).

The target (issue 44): at least 1.7x float32's fast step on a quiet machine at 2 threads, and
greedy tokens equal on at least 4 of 5 prompts over 64 tokens.

Why they are faster: ``int8_linear_fast`` multiplies through PyTorch's ``_weight_int8pack_mm``
and ``int4_linear_fast`` through ``_weight_int4pack_mm_for_cpu``, which read the int8 matrix
itself (a quarter of float32's bytes) or the packed 4-bit codes (an eighth). Both are fast only
for bfloat16 rows on this CPU (AVX-512 with bfloat16 instructions), and return bfloat16 sums:
with float32 rows the int8 kernel took 25x longer (3.1 ms against 83 us for 1536 x 576), the
int4 kernel 30x (float16 rows 50x). Those 8 significant bits are what parts the greedy tokens
(``benchmarks/int8_rounding.py``: rows and outputs at 8 bits leave 1 prompt of 5 equal, at 11
bits all 5; per-row int8 weights alone, with an exact product, 1 of 5).

Measured on the course's CPU (2 cores shared with other CPU-bound work, load average 2.6-4.2,
one thread, torch 2.13, 2026-11-28), so not evidence for the target at 2 threads on a quiet
machine; the per-round ratios ranged from 0.75x to 4.2x:

* SmolLM2, quality over 64 tokens: int8 equal to float32 on 0 of 5 prompts (parted at tokens 59,
  17, 6, 9, 6, where float32's margins were 0.45, 0.068, 0.013, 0.19, 0.0072); teacher-forced
  307 of 320, logits moved by up to 5.6% of the largest. int4: 3 of 5 (parted at 31, margin
  0.041, and 6, margin 0.0072); teacher-forced 313 of 320, logits moved by up to 3.4%.
  Not the 4 of 5 of the target, for either.
* SmolLM2, speed (median of 5 rounds): float32 10.0, int8 14.0 (1.55x), int4 16.0 (1.78x),
  llama.cpp at Q8_0 19.7 tokens/s (2.01x). So int8 is about 0.7 of llama.cpp's Q8_0 and int4
  about 0.8-0.9 here.
* GPT-2 small's shape (random weights): float32 21.3, int8 30.6 (1.50x), int4 44.3 tokens/s
  (2.17x); per-round int8 1.37-2.11x, int4 1.91-2.94x.
* Earlier, at load 3.7: SmolLM2 int8 1.33x; at 2 threads on the loaded machine both about 1-2.6
  tokens/s (two threads that wait for each other measure the machine, not the kernels).
* Other products tried, per matrix or per step, one thread, loaded: dequantising blocks of
  rows into a small float32 buffer and multiplying was 5x slower than float32's own product
  (the conversion costs more than the bytes it saves); fbgemm's ``linear_dynamic_fp16``
  (float16 weights, float32 rows and sums) kept all 5 prompts equal but decoded at only
  1.0-1.3x float32; ``torch.compile`` of the dequantising product with float32 sums matched
  float32 within 2e-4 but ran 1.2x float32 on the layers' matrices (2.7x on the head).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from minitransformer import GPT, GPTConfig, Llama, generate  # noqa: E402
from minitransformer.bpe import BPETokenizer  # noqa: E402
from minitransformer.chat import apply_chat_template  # noqa: E402
from minitransformer.gguf import save_llama  # noqa: E402
from minitransformer.pretrained import smollm2_path  # noqa: E402
from minitransformer.quantize import quantize_linears  # noqa: E402

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "How many legs does a spider have?", "Give me three tips for sleeping well.",
           "What is 12 times 7?"]
GPT2_SMALL = dict(vocab_size=50257, context_length=1024, num_layers=12, num_heads=12,
                  d_model=768, activation="gelu_tanh")


def models(size: str) -> tuple[dict[str, torch.nn.Module], list[list[int]]]:
    """The float32 model, its int8 and int4 twins (by name), and the prompts' ids."""
    if size == "smollm2":
        path = smollm2_path()
        tokenizer = BPETokenizer.from_gguf(path)
        prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": p}],
                                       add_generation_prompt=True) for p in PROMPTS]
        make = lambda: Llama.from_gguf(path).eval()       # noqa: E731
    else:
        torch.manual_seed(0)
        state = GPT(GPTConfig(**GPT2_SMALL)).state_dict()
        prompts = [torch.randint(0, 50257, (32,), generator=torch.Generator().manual_seed(i))
                   .tolist() for i in range(len(PROMPTS))]

        def make() -> torch.nn.Module:
            model = GPT(GPTConfig(**GPT2_SMALL))
            model.load_state_dict(state)
            return model.eval()
    return ({"float32": make(), "int8": quantize_linears(make()),
             "int4": quantize_linears(make(), bits=4)}, prompts)


def quality(f32, int8, prompts: list[list[int]], tokens: int) -> dict:
    equal, parts, worst, agree, margins = 0, [], 0.0, 0, []
    for ids in prompts:
        idx = torch.tensor([ids])
        a = generate(f32, idx, tokens, temperature=0)[0, len(ids):]
        b = generate(int8, idx, tokens, temperature=0)[0, len(ids):]
        same = int((a == b).int().cumprod(0).sum())
        whole = torch.cat([idx[0], a]).unsqueeze(0)
        l32 = f32(whole)[0][0, len(ids) - 1:-1]                    # (tokens, N)
        l8 = int8(whole)[0][0, len(ids) - 1:-1]
        worst = max(worst, float((l8 - l32).abs().max() / l32.abs().max()))
        top = l32.topk(2, dim=-1).values
        margin = top[:, 0] - top[:, 1]
        picked = l8.argmax(-1) == l32.argmax(-1)                   # float32's token fed back
        agree += int(picked.sum())
        margins += [round(float(m), 4) for m in margin[~picked]]
        if same == tokens:
            equal += 1
        else:
            parts.append({"parted_at": same, "float32_margin": round(float(margin[same]), 4)})
    return {"prompts_equal": equal, "prompts": len(prompts), "parted": parts,
            "max_logit_difference_relative": round(worst, 5),
            "teacher_forced_agree": agree, "teacher_forced_positions": tokens * len(prompts),
            "teacher_forced_margins_where_different": margins}


def speed(named: dict, ids: list[int], tokens: int, rounds: int, llm=None) -> dict:
    """Tokens per second of each model (and of llama.cpp's ``llm``, if given), taking turns
    (the order reversed every other round); the ratios to float32 per round, and medians."""
    idx = torch.tensor([ids])

    def tokens_per_second(name: str) -> float:
        start = time.perf_counter()
        if name == "llama.cpp":
            for n, _ in enumerate(llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                                repeat_penalty=1.0, reset=True), 1):
                if n == tokens:
                    break
        else:
            generate(named[name], idx, tokens, temperature=0)
        return tokens / (time.perf_counter() - start)

    names = list(named) + ["llama.cpp"] * (llm is not None)
    for name in names:
        tokens_per_second(name)                                     # warm-up
    rows = []
    for r in range(rounds):
        got = {name: tokens_per_second(name) for name in (names if r % 2 == 0 else names[::-1])}
        rows.append(got)
        print(f"  round {r + 1}: " + ", ".join(
            f"{name} {got[name]:.1f}" + (f" ({got[name] / got['float32']:.2f}x)"
                                         if name != "float32" else "") for name in names),
            flush=True)
    return {name: {"tokens_per_s": round(statistics.median(g[name] for g in rows), 2),
                   "ratio_to_float32": round(statistics.median(g[name] / g["float32"]
                                                               for g in rows), 3),
                   "ratios": [round(g[name] / g["float32"], 3) for g in rows]}
            for name in names}


def llama_cpp_q8_0(f32, folder: str, threads: int):
    """llama.cpp (``benchmarks/llama_cpp.py``'s build) on our Q8_0 file of ``f32``."""
    spec = importlib.util.spec_from_file_location(
        "llama_cpp_benchmark", Path(__file__).with_name("llama_cpp.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    llama_cpp = bench.llama_cpp_module()
    path = Path(folder) / "q8_0.gguf"
    save_llama(f32, path, type="Q8_0", tokenizer=BPETokenizer.from_gguf(smollm2_path()))
    return llama_cpp.Llama(model_path=str(path), n_threads=threads, n_ctx=512, verbose=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2],
                        help="the speed at each of these thread counts (default 2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--size", choices=["smollm2", "gpt2-small", "both"], default="smollm2")
    parser.add_argument("--json", help="also write the figures to this file, as JSON")
    parser.add_argument("--no-llama-cpp", action="store_true",
                        help="leave out llama.cpp at Q8_0 (timed beside ours on SmolLM2, from "
                        "the build `make llama-cpp` puts in the cache)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, load average {load:.2f}")
    figures: dict = {"tokens": args.tokens}
    sizes = ["smollm2", "gpt2-small"] if args.size == "both" else [args.size]
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            named, prompts = models(size)
            f32 = named["float32"]
            print(f"{size}:")
            figures[size] = {}
            if size == "smollm2":
                torch.set_num_threads(1)                 # the tokens do not depend on it
                for name in ("int8", "int4"):
                    q = figures[size][f"quality_{name}"] = quality(f32, named[name], prompts,
                                                                   args.tokens)
                    print(f"  {name}: greedy tokens equal to float32's on {q['prompts_equal']}/"
                          f"{q['prompts']} prompts over {args.tokens} tokens (target >= 4); "
                          f"largest logit difference "
                          f"{q['max_logit_difference_relative']:.2%} of the largest logit")
                    for part in q["parted"]:
                        print(f"    parted at token {part['parted_at']}, where float32's two "
                              f"best logits were {part['float32_margin']} apart")
                    print(f"    float32's tokens fed to both: {name}'s best is float32's at "
                          f"{q['teacher_forced_agree']}/{q['teacher_forced_positions']} "
                          f"positions; where not, float32's margin was at most "
                          f"{max(q['teacher_forced_margins_where_different'], default=0):.3f}")
            for threads in args.threads:
                torch.set_num_threads(threads)
                llm = (llama_cpp_q8_0(f32, tmp, threads)
                       if size == "smollm2" and not args.no_llama_cpp else None)
                print(f"  {threads} thread{'s' * (threads > 1)}, load average "
                      f"{os.getloadavg()[0]:.2f}:")
                s = figures[size][f"speed_{threads}_threads"] = speed(
                    named, prompts[0], args.tokens, args.rounds, llm)
                print("  median: " + ", ".join(
                    f"{name} {v['tokens_per_s']:.1f} tokens/s ({v['ratio_to_float32']:.2f}x)"
                    for name, v in s.items()) + " (target: int8 >= 1.7x float32 at 2 threads "
                    "on a quiet machine)")
                del llm
            del named, f32
    end = os.getloadavg()[0]
    print(f"load average {end:.2f} at the end")
    figures["load_average"] = [round(load, 2), round(end, 2)]
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
