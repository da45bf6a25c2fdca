"""What the experiments on SmolLM2-135M-Instruct share (``dpo_smollm2.py``,
``grpo_smollm2.py``, ``sft_smollm2.py``): the model and tokenizer loaded, the LoRA set-up of
the preference runs, and the results written whole. (A script's own folder is on
``sys.path``, so ``import smollm2_common`` finds this file.)"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch

from minitransformer.bpe import BPETokenizer
from minitransformer.checkpoints import write_json
from minitransformer.llama import Llama
from minitransformer.lora import add_lora
from minitransformer.pretrained import smollm2_path

#: LoRA on the attention of the last ten of the 30 layers: the backward pass stops at layer 20,
#: which makes a step about a third cheaper on this CPU than adapters in every layer.
LORA_TARGETS = tuple(f"layers.{i}.self_attn.{name}" for i in range(20, 30)
                     for name in ("q_proj", "k_proj", "v_proj", "out_proj"))
#: The LoRA settings of the preference runs, as their results record them.
LORA = {"r": 16, "alpha": 32, "targets": "q, k, v, out of layers 20-29"}


def load_smollm2(*, frozen: bool = True) -> tuple[Llama, BPETokenizer]:
    """SmolLM2 from the cached GGUF file (``frozen``: no gradients, the reference a LoRA copy
    trains against), and its tokenizer."""
    path = smollm2_path()
    model = Llama.from_gguf(path)
    if frozen:
        model.requires_grad_(False)
    return model, BPETokenizer.from_gguf(path)


def lora_copy(base: Llama, seed: int) -> Llama:
    """A copy of ``base`` with :data:`LORA`'s adapters, drawn after ``torch.manual_seed(seed)``
    (``base`` is left as it is)."""
    torch.manual_seed(seed)                      # the LoRA matrices' initialisation
    return add_lora(copy.deepcopy(base), r=LORA["r"], alpha=LORA["alpha"], targets=LORA_TARGETS)


def clock() -> tuple[float, float]:
    """The start of a script: the time and the load average, for :func:`timing`."""
    return time.perf_counter(), os.getloadavg()[0]


def timing(start: tuple[float, float]) -> dict:
    """The seconds since ``start`` (:func:`clock`), the load average then and now, and the
    PyTorch version: what each result file records beside its numbers."""
    began, load = start
    return {"seconds": round(time.perf_counter() - began, 1),
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
            "torch": torch.__version__}


def write_results(out: Path, results: dict) -> None:
    """``results`` as JSON at ``out`` (its folder made), whole or not at all:
    :func:`minitransformer.checkpoints.write_json`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, results)
