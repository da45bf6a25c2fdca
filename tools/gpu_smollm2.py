"""SmolLM2-135M-Instruct on a GPU: the real model of chapters 14 and 16-20, part of the GPU check.

Run from the repository root, after `make smollm2` (tools/gpu_check.sh runs it):
    python tools/gpu_smollm2.py [--device cuda] [--prompts 5] [--tokens 64] [--parts A,B]
        [--json FILE]

The chapters run SmolLM2 on the CPU; this script runs what they do with it on ``--device`` and
compares each result with the same computation on the CPU or with ``transformers`` on the device
(TF32 off, attention through the math kernel, as the tests' ``device`` fixture sets):

* chapter 14: ``Llama.from_gguf`` on the device; its logits on chat prompts against
  transformers' GGUF loader on the same device, and against ours on the CPU (largest difference
  relative to the largest logit); greedy continuations equal token for token;
* bfloat16: how many new tokens agree with float32's before the first difference;
* chapter 16: a LoRA SFT loss and its gradients on the device against the CPU;
* chapter 17: DPO's loss on the device against the CPU;
* chapter 18: the serving ``Engine`` on the device, greedy, against ``generate``;
* chapter 20: the perplexity of a short text on the device against the CPU.

Each part is reported on its own (a failing part does not stop the others). Exit status 1 when a
part fails or misses its tolerance. ``--device cpu`` runs the same script on a machine without a
GPU (then each comparison is the CPU against itself).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from minitransformer import pretrained  # noqa: E402
from minitransformer.bpe import BPETokenizer  # noqa: E402
from minitransformer.chat import apply_chat_template  # noqa: E402
from minitransformer.generation import generate  # noqa: E402
from minitransformer.llama import Llama  # noqa: E402
from test_smollm2 import PROMPTS as SMOLLM2_PROMPTS  # noqa: E402

PROMPTS = SMOLLM2_PROMPTS[:8]        # the chat prompts of tests/test_smollm2.py
TEXT = ("The river rose in the night, and by morning the low fields were under water. "
        "Farmers moved their animals to the hills and waited for the rain to stop.")
TOLERANCE = 1e-4     # relative to the largest logit, float32 on both sides


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def greedy_theirs(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' model continued greedily through its own cache, never stopping."""
    out = model(ids, use_cache=True)
    for step in range(new_tokens):
        ids = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
        if step + 1 < new_tokens:
            out = model(ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    return ids


def agreeing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens two 1-row continuations share."""
    a, b = a.flatten().tolist(), b.flatten().tolist()
    same = 0
    for x, y in zip(a, b):
        if x != y:
            break
        same += 1
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--parts", help="comma-separated parts to run (default: all; the models "
                        "are always loaded)")
    parser.add_argument("--json")
    args = parser.parse_args()
    chosen = set(args.parts.split(",")) if args.parts else None
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa_kernel(SDPBackend.MATH).__enter__()
    torch.manual_seed(0)
    path = pretrained.smollm2_path()
    tok = BPETokenizer.from_gguf(path)
    prompts = [torch.tensor([apply_chat_template(
        tok, [{"role": "user", "content": p}], add_generation_prompt=True)])
        for p in PROMPTS[:args.prompts]]
    report: dict = {"device": str(device), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}
    models: dict = {}

    def part(name):
        def wrap(fn):
            if chosen is not None and name not in chosen and name != "load":
                return
            began = time.perf_counter()
            try:
                entry = fn()
            except Exception as exc:  # each part reports on its own
                entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500],
                         "traceback": traceback.format_exc()[-1500:]}
            entry["seconds"] = round(time.perf_counter() - began, 1)
            report[name] = entry
            print(f"{name}: {json.dumps(entry)[:700]}", flush=True)
        return wrap

    @part("load")
    def _():
        models["cpu"] = Llama.from_gguf(path)
        models["ours"] = Llama.from_gguf(path, device=device)
        return {"ok": next(models["ours"].parameters()).device.type == device.type,
                "parameters": sum(p.numel() for p in models["ours"].parameters())}

    @part("logits_vs_transformers")
    def _():
        from transformers import AutoModelForCausalLM
        theirs = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32).to(device).eval()
        models["theirs"] = theirs
        worst_theirs = worst_cpu = 0.0
        with torch.no_grad():
            for ids in prompts:
                ours = models["ours"](ids.to(device))[0]
                worst_theirs = max(worst_theirs, relative(ours, theirs(ids.to(device)).logits))
                worst_cpu = max(worst_cpu, relative(ours, models["cpu"](ids)[0]))
        return {"ok": worst_theirs < TOLERANCE and worst_cpu < TOLERANCE,
                "max_rel_diff_vs_transformers": float(f"{worst_theirs:.3g}"),
                "max_rel_diff_vs_cpu": float(f"{worst_cpu:.3g}")}

    @part("greedy")
    def _():
        equal_theirs = equal_cpu = 0
        first_diff = []
        with torch.no_grad():
            for ids in prompts:
                ours = generate(models["ours"], ids.to(device), args.tokens, temperature=0)
                cpu = generate(models["cpu"], ids, args.tokens, temperature=0)
                theirs = greedy_theirs(models["theirs"], ids.to(device), args.tokens)
                equal_theirs += torch.equal(ours.cpu(), theirs.cpu())
                equal_cpu += torch.equal(ours.cpu(), cpu)
                first_diff.append(agreeing(ours[0, ids.shape[1]:], cpu[0, ids.shape[1]:]))
        n = len(prompts)
        return {"ok": equal_theirs == n, "prompts": n, "new_tokens": args.tokens,
                "equal_to_transformers": equal_theirs, "equal_to_cpu": equal_cpu,
                "tokens_agreeing_with_cpu": first_diff}

    @part("bfloat16")
    def _():
        half = Llama.from_gguf(path, device=device, dtype=torch.bfloat16)
        agree = []
        with torch.no_grad():
            for ids in prompts:
                a = generate(half, ids.to(device), args.tokens, temperature=0)
                b = generate(models["ours"], ids.to(device), args.tokens, temperature=0)
                agree.append(agreeing(a[0, ids.shape[1]:], b[0, ids.shape[1]:]))
        del half
        return {"ok": True, "new_tokens": args.tokens, "tokens_agreeing_with_float32": agree}

    @part("lora_sft")
    def _():
        from minitransformer.lora import add_lora
        from minitransformer.sft import sft_loss   # marks SmolLM2's template itself

        talks = [[{"role": "user", "content": "What is 2 plus 3?"},
                  {"role": "assistant", "content": '{"topic": "sums", "answer": "5"}'}],
                 [{"role": "user", "content": "Name the capital of Peru."},
                  {"role": "assistant", "content": '{"topic": "capitals", "answer": "Lima"}'}]]
        losses, grads = {}, {}
        for where, base in (("cpu", models["cpu"]), ("device", models["ours"])):
            model = copy.deepcopy(base).train()
            add_lora(model, r=8, alpha=16.0, targets=("q_proj", "v_proj"))
            torch.manual_seed(0)              # the same initial A on both
            for name, p in model.named_parameters():
                if name.endswith("lora_A.weight"):
                    p.data.copy_(torch.randn(p.shape, generator=torch.Generator()
                                             .manual_seed(len(name))) * 0.01)
            loss = sft_loss(model, tok, talks)
            loss.backward()
            losses[where] = float(loss)
            grads[where] = torch.cat([p.grad.flatten().cpu() for n, p in
                                      model.named_parameters() if p.grad is not None])
            del model
        grad_diff = relative(grads["device"], grads["cpu"])
        return {"ok": abs(losses["device"] - losses["cpu"]) < 1e-4 and grad_diff < 1e-3,
                "loss_cpu": round(losses["cpu"], 6), "loss_device": round(losses["device"], 6),
                "grad_max_rel_diff": float(f"{grad_diff:.3g}"),
                "trainable": int(grads["cpu"].numel())}

    @part("dpo")
    def _():
        from minitransformer.preferences import dpo_loss, sequence_log_probs

        prompt = apply_chat_template(tok, [{"role": "user", "content": "Say hello."}],
                                     add_generation_prompt=True)
        chosen = tok.encode("Hello! How can I help you today?<|im_end|>")
        rejected = tok.encode("No.<|im_end|>")

        def logp(model, answer, where):
            ids = torch.tensor([prompt + answer], device=where)
            logits = model(ids[:, :-1])[0][:, len(prompt) - 1:]
            return sequence_log_probs(logits, ids[:, len(prompt):])

        values = {}
        with torch.no_grad():
            for where, model, dev in (("cpu", models["cpu"], "cpu"),
                                      ("device", models["ours"], device)):
                pc, pr = logp(model, chosen, dev), logp(model, rejected, dev)
                values[where] = float(dpo_loss(pc, pr, pc - 0.5, pr + 0.5, beta=0.1))
        return {"ok": abs(values["device"] - values["cpu"]) < 1e-5,
                "loss_cpu": round(values["cpu"], 7), "loss_device": round(values["device"], 7)}

    @part("serving_engine")
    def _():
        from minitransformer.serving import Engine, Request

        engine = Engine(models["ours"], tok, max_batch=8, kv_blocks=256)
        done = engine.run([Request(ids[0].tolist(), max_tokens=args.tokens, temperature=0,
                                   stop_token_ids=[]) for ids in prompts])
        equal = 0
        with torch.no_grad():
            for ids, completion in zip(prompts, done):
                alone = generate(models["ours"], ids.to(device), args.tokens, temperature=0)
                equal += alone[0, ids.shape[1]:].tolist() == completion.token_ids
        return {"ok": equal == len(prompts), "requests": len(prompts),
                "equal_to_generate": equal}

    @part("perplexity")
    def _():
        from minitransformer.evaluation import score_text

        eos = tok.encode("<|im_end|>")[0]
        scores = {}
        with torch.no_grad():
            for where in ("cpu", "ours"):
                scores[where] = score_text(models[where], tok, TEXT, prefix_id=eos)
        a, b = scores["cpu"].perplexity, scores["ours"].perplexity
        return {"ok": abs(a - b) / a < 1e-5,
                "perplexity_cpu": round(a, 5), "perplexity_device": round(b, 5)}

    report["passed"] = all(entry.get("ok") for key, entry in report.items()
                           if isinstance(entry, dict))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print("SmolLM2 on", device, "PASSED" if report["passed"] else "FAILED")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
