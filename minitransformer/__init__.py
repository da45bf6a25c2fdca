"""minitransformer: the companion package of the course *Transformers from scratch*.

Each module holds one idea of the book and names the chapter that explains it. The names in
``__all__`` below are re-exported here: the pieces the chapters build and then use again (the
layers, attention, masks, the models and their configs, generation, training's ``train`` and
``evaluate``, the cache, the tokenizer, preference tuning, serving), so a chapter writes
``from minitransformer import one_hot``. The figures (``heatmap`` and its kin) are loaded on first
use.

The rest a chapter imports from the module that defines it, and says so in its import:

* a chapter's data sets and batches: :mod:`minitransformer.data` (``random_batches``,
  ``window_batches``, ``command_splits``, ``EOS``, ...);
* the pieces of a loop the chapter writes out itself: :mod:`minitransformer.optim`
  (``AdamW``, ``clip_grad_norm``), :mod:`minitransformer.functional` (``cross_entropy``),
  :mod:`minitransformer.training` (``learning_rate``, ``TrainingLoop``, ``SCHEDULES``),
  :mod:`minitransformer.bpe` (BPE's training steps, ``bytes_to_unicode``);
* one chapter's helpers: :mod:`minitransformer.gpt` (``count_parameters``, ``GPT2_NAMES``),
  :mod:`minitransformer.pretrained`, :mod:`minitransformer.classifier`,
  :mod:`minitransformer.seq2seq`, :mod:`minitransformer.token_files`,
  :mod:`minitransformer.checkpoints`, :mod:`minitransformer.cli`, and chapters 16-18's
  :mod:`minitransformer.chat`, :mod:`minitransformer.sft`, :mod:`minitransformer.lora`,
  :mod:`minitransformer.grpo`;
* the real model of chapters 14 and 19: :mod:`minitransformer.gguf` (the file),
  :mod:`minitransformer.quantize`, :mod:`minitransformer.llama` and
  :mod:`minitransformer.generation` (``stream_tokens``, ``SamplingParams``);
* chapter 20's measures: :mod:`minitransformer.evaluation`;
* each chapter's exercise checks: ``minitransformer.exercises.chapterNN``.

``tests/test_package_exports.py`` holds the notebooks to this.
"""

from minitransformer.attention import (
    MultiHeadAttention,
    blocked_attention,
    scaled_dot_product_attention,
)
from minitransformer.batching import generate_batch, left_pad
from minitransformer.bpe import GPT2_PATTERN, BPETokenizer
from minitransformer.cache import KVCache
from minitransformer.classifier import EncoderClassifier
from minitransformer.device import default_device
from minitransformer.functional import layer_norm, rms_norm, softmax
from minitransformer.generation import (
    SamplingParams,
    beam_search,
    generate,
    sample_next,
    stream_tokens,
)
from minitransformer.gpt import GPT, GPTConfig
from minitransformer.grpo import group_advantages, grpo_loss, grpo_step, grpo_train, sample_group
from minitransformer.layers import DecoderLayer, EncoderLayer, FeedForward, LayerNorm
from minitransformer.layers import RMSNorm, SwiGLU
from minitransformer.llama import GroupedQueryAttention, Llama, LlamaConfig, expand_kv_heads
from minitransformer.markov import SkipModel, second_order_matrix, transition_matrix, walk_chain
from minitransformer.masks import causal_mask, padding_mask
from minitransformer.paged_cache import BlockPool, gather_blocks, merge_partials, paged_attention
from minitransformer.positional import sinusoidal_positional_encoding
from minitransformer.preferences import (
    DPO,
    dpo_batch,
    dpo_loss,
    dpo_train,
    implicit_rewards,
    kl_estimate,
    per_token_log_probs,
    preference_accuracy,
    preference_batch,
    sequence_log_probs,
)
from minitransformer.rotary import apply_rotary, rotary_angles, rotate_half
from minitransformer.serving import Engine, Request
from minitransformer.seq2seq import Seq2Seq, Seq2SeqConfig, exact_match
from minitransformer.training import evaluate, train
from minitransformer.vocab import Vocabulary, one_hot, tokenize

__all__ = [
    "BPETokenizer",
    "DecoderLayer",
    "EncoderClassifier",
    "EncoderLayer",
    "FeedForward",
    "GPT",
    "GPTConfig",
    "KVCache",
    "GPT2_PATTERN",
    "LayerNorm",
    "MultiHeadAttention",
    "Seq2Seq",
    "Seq2SeqConfig",
    "SamplingParams",
    "SkipModel",
    "Vocabulary",
    "beam_search",
    "blocked_attention",
    "causal_mask",
    "chain_graph",
    "default_device",
    "embedding_scatter",
    "evaluate",
    "exact_match",
    "generate",
    "heatmap",
    "layer_norm",
    "one_hot",
    "padding_mask",
    "positional_encoding_heatmap",
    "probability_bars",
    "sample_next",
    "scaled_dot_product_attention",
    "second_order_matrix",
    "sinusoidal_positional_encoding",
    "softmax",
    "stream_tokens",
    "tokenize",
    "train",
    "transition_matrix",
    "walk_chain",
    # chapter 14
    "GroupedQueryAttention",
    "Llama",
    "LlamaConfig",
    "RMSNorm",
    "SwiGLU",
    "apply_rotary",
    "expand_kv_heads",
    "rms_norm",
    "rotary_angles",
    "rotate_half",
    # chapter 17
    "DPO",
    "dpo_batch",
    "dpo_loss",
    "dpo_train",
    "implicit_rewards",
    "kl_estimate",
    "per_token_log_probs",
    "preference_accuracy",
    "preference_batch",
    "sequence_log_probs",
    # chapter 17 (GRPO)
    "group_advantages",
    "grpo_loss",
    "grpo_step",
    "grpo_train",
    "sample_group",
    # chapter 18
    "BlockPool",
    "Engine",
    "Request",
    "gather_blocks",
    "generate_batch",
    "left_pad",
    "merge_partials",
    "paged_attention",
]

# The figures need matplotlib, slow to import: loaded on first use, so the command line and
# library users who draw nothing do not pay for it (`from minitransformer import heatmap` works).
_PLOT_NAMES = ("chain_graph", "embedding_scatter", "heatmap", "positional_encoding_heatmap",
               "probability_bars")


def __getattr__(name: str) -> object:
    if name in _PLOT_NAMES:
        from minitransformer import plot

        return getattr(plot, name)
    raise AttributeError(f"module 'minitransformer' has no attribute {name!r}")



def __dir__() -> list[str]:
    return sorted({*globals(), *_PLOT_NAMES})
