"""The decoder-only language models of the package in one table: GPT (chapter 9) and Llama
(chapter 14).

Generation, batching, the serving engine, LoRA's files and the command line need the same few
things of either model: its config, its decode steps, transformers' names for its tensors. They
ask :func:`architecture_of` (a model) or :data:`ARCHITECTURES` (a name) instead of listing the
classes each time; a third model is one more row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor, nn

from minitransformer.cache import KVCache
from minitransformer.gpt import GPT, GPT2_NAMES, GPTConfig
from minitransformer.llama import Llama, LlamaConfig, llama_names
from minitransformer.pretrained import Rename


class DecodeStep(Protocol):
    """What ``make_decode_step()`` and ``make_fast_decode_step()`` return: the logits
    ``(B, T, vocab_size)`` of the new ids ``(B, T)``, whose keys and values go to the cache."""

    def __call__(self, idx: Tensor, kv_cache: KVCache, *, attention_mask: Tensor | None = None,
                 position_ids: Tensor | None = None) -> Tensor: ...


class DecoderModel(Protocol):
    """What the package uses of a decoder-only model (:class:`~minitransformer.gpt.GPT`,
    :class:`~minitransformer.llama.Llama`): ``config`` (``vocab_size``, ``context_length``,
    ``num_layers``, ``num_heads``, ``d_model``), the token embedding (its device and dtype are
    the model's), and the two decode steps."""

    config: Any
    token_embedding: nn.Embedding

    def make_decode_step(self) -> DecodeStep: ...

    def make_fast_decode_step(self, *, pack_weights: bool = False) -> DecodeStep: ...


@dataclass(frozen=True)
class Architecture:
    """One row of :data:`ARCHITECTURES`.

    Attributes:
        name: the command line's ``--arch``.
        model, config: the model class and its config class.
        model_type: ``config.json``'s ``model_type`` for a checkpoint of it.
        names: transformers' tensor names for a config (:class:`~minitransformer.pretrained.
            Rename` rows), as ``save_pretrained`` writes them.
        prefix: what transformers puts before those names in a model with a head (GPT-2's
            ``transformer.``).
        lora_targets: the layers LoRA adapts unless told otherwise (PEFT's default for Llama,
            the query and value projections; for GPT, whose query, key and value are one fused
            layer in GPT-2's files, the attention's output and the MLP's layers).
    """

    name: str
    model: type
    config: type
    model_type: str
    names: Callable[[Any], tuple[Rename, ...]]
    prefix: str
    lora_targets: tuple[str, ...]


ARCHITECTURES: dict[str, Architecture] = {
    "gpt": Architecture("gpt", GPT, GPTConfig, "gpt2", lambda config: GPT2_NAMES,
                        "transformer.", ("out_proj", "linear1", "linear2")),
    "llama": Architecture("llama", Llama, LlamaConfig, "llama", llama_names, "",
                          ("q_proj", "v_proj")),
}


def architecture_of(model: object, *, name: str = "model") -> Architecture:
    """The row of ``model``'s class (a subclass counts as its base).

    Raises:
        TypeError: ``model`` is none of the table's models, naming them.
    """
    for architecture in ARCHITECTURES.values():
        if isinstance(model, architecture.model):
            return architecture
    kinds = " or a ".join(a.model.__name__ for a in ARCHITECTURES.values())
    raise TypeError(f"{name} must be a {kinds}, got {type(model).__name__}")


def architecture_for(model_type: object) -> Architecture:
    """The row of a checkpoint's ``model_type`` (``config.json``); GPT's for any other."""
    for architecture in ARCHITECTURES.values():
        if architecture.model_type == model_type:
            return architecture
    return ARCHITECTURES["gpt"]
