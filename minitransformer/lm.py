"""What every decoder-only language model of the package shares (GPT, chapter 9; Llama,
chapter 14): the loss and its targets, the checks of a cache and of a padded batch, the mask
and positions of a padded batch (chapter 18), and the weights' initialisation.

:class:`~minitransformer.gpt.GPT` and :class:`~minitransformer.llama.Llama` are siblings: both
import these, neither imports the other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer import _checks
from minitransformer.cache import KVCache
from minitransformer.masks import causal_mask

IGNORE_INDEX = -100  # a target that the loss leaves out, as in F.cross_entropy and transformers
INIT_STD = 0.02  # GPT-2's: every weight starts normal with this standard deviation


def global_forward_hooks() -> bool:
    """Whether hooks registered for every module (``nn.modules.module.register_module_forward_
    hook`` and its pre-hook twin) are present: PyTorch keeps them in private dictionaries."""
    module = nn.modules.module
    return bool(getattr(module, "_global_forward_hooks", None)
                or getattr(module, "_global_forward_pre_hooks", None))


def check_targets(targets: Tensor, idx: Tensor, vocab_size: int) -> None:
    """A language model's ``targets``: ids shaped like ``idx``, ``-100`` for "no target"."""
    _checks.check_token_ids("targets", targets, vocab_size, ignore_index=IGNORE_INDEX)
    if targets.shape != idx.shape:
        raise ValueError(f"targets must have the shape of idx {_checks.shape(idx)}, "
                         f"got {_checks.shape(targets)}")


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """The mean cross-entropy of ``logits`` ``(B, T, N)`` against ``targets`` ``(B, T)``, over
    the positions whose target is not ``-100``."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten().long(),
                           ignore_index=IGNORE_INDEX)


def check_model_cache(config: object, kv_cache: KVCache, idx_shape: torch.Size) -> int:
    """The positions ``kv_cache`` holds, after checking that it is the cache of a model with
    ``config.num_layers`` layers for a batch of ``idx_shape`` ``(B, T)``, with room for ``T``
    more positions within ``config.context_length`` (GPT's and Llama's check)."""
    _checks.check_type("kv_cache", kv_cache, KVCache, "a KVCache")
    c = config
    if kv_cache.num_layers != c.num_layers:
        raise ValueError(f"kv_cache has {kv_cache.num_layers} layers, the model "
                         f"{c.num_layers} layers: make it with KVCache({c.num_layers})")
    batch, length = idx_shape
    held = kv_cache.keys[0]
    if held is not None and held.shape[0] != batch:
        raise ValueError(f"kv_cache holds a batch of {held.shape[0]} rows and idx has "
                         f"{batch}: reset() the cache for a new batch")
    past = kv_cache.seq_len
    if past + length > c.context_length:
        raise ValueError(f"the cache holds {past} positions and idx has {length} new ones: "
                         f"{past + length} positions, more than context_length="
                         f"{c.context_length}")
    return past


def check_batch_inputs(config: object, idx: Tensor, past: int, attention_mask: object,
                       position_ids: object) -> Tensor | None:
    """The ``attention_mask`` and ``position_ids`` of a padded batch (chapter 18), checked for
    ``idx`` ``(B, T)`` after ``past`` cached positions (GPT's and Llama's check). Returns the
    positions to use, or ``None`` for the usual ``past, ..., past + T - 1``."""
    batch, length = idx.shape
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.dtype != torch.bool:
            raise TypeError(f"attention_mask must be a boolean tensor (True = a real token), "
                            f"got {_checks._type_name(attention_mask)}")
        if tuple(attention_mask.shape) != (batch, past + length):
            raise ValueError(f"attention_mask must have shape (B, cached + T) = "
                             f"{(batch, past + length)}, got {_checks.shape(attention_mask)}")
        if attention_mask.device != idx.device:
            raise ValueError(f"attention_mask is on {attention_mask.device} and idx on "
                             f"{idx.device}")
    if position_ids is None:
        return None if attention_mask is None else positions_from_mask(attention_mask, length)
    _checks.check_int_tensor("position_ids", position_ids, ndim=2)
    if tuple(position_ids.shape) != (batch, length):
        raise ValueError(f"position_ids must have the shape of idx {(batch, length)}, got "
                         f"{_checks.shape(position_ids)}")
    if position_ids.device != idx.device:
        raise ValueError(f"position_ids is on {position_ids.device} and idx on {idx.device}")
    if position_ids.numel() and position_ids.device.type != "meta":
        low, high = int(position_ids.min()), int(position_ids.max())
        if low < 0 or high >= config.context_length:
            raise ValueError(f"position_ids holds {low if low < 0 else high}, outside "
                             f"[0, context_length={config.context_length})")
    return position_ids.long()


def positions_from_mask(attention_mask: Tensor, length: int) -> Tensor:
    """Each new token's position counted from its row's first real token: the number of real
    tokens before it (0 on left padding, whose output nobody reads). ``(B, T)`` long."""
    before = attention_mask.long().cumsum(dim=1) - 1                  # (B, P + T)
    return before[:, attention_mask.shape[1] - length:].clamp(min=0)


def attention_mask_for(attention_mask: Tensor | None, length: int, past: int,
                    device: torch.device) -> Tensor | None:
    """The mask the blocks take: causal (the ``length`` new queries are the last of
    ``past + length`` keys), and, with a padding ``attention_mask`` ``(B, past + length)``,
    no key that is padding: ``(B, 1, T, past + T)``. A query on padding sees itself only, so
    that its softmax has a key (its output is never read); a real query never sees padding."""
    if attention_mask is None:
        return causal_mask(length, past + length, device=device) if length > 1 else None
    causal = causal_mask(length, past + length, device=device)       # (T, P + T)
    own = torch.arange(past + length, device=device) == (
        torch.arange(past, past + length, device=device)[:, None])  # (T, P + T): the diagonal
    return (causal & attention_mask[:, None, None, :]) | own          # (B, 1, T, P + T)


def init_weights(module: nn.Module) -> None:
    """N(0, 0.02) weights, zero biases: as GPT-1 (Radford et al., 2018) and GPT-2 start."""
    # on the meta device there are no numbers to draw (from_pretrained checks shapes there)
    if isinstance(module, (nn.Linear, nn.Embedding)) and not module.weight.is_meta:
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
