"""Checkers for the exercises of chapter 10, *Cross-attention and the encoder-decoder*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_cross_attention` -- ``my_cross_attention(target, memory, w_q, w_k, w_v)``: one
  head of cross-attention, queries from the target and keys and values from the memory.
* :data:`check_source_padding_mask` -- ``source_padding_mask(src, pad_id)``: the ``(B, 1, 1,
  T_src)`` mask, True at real source tokens.
* :data:`check_decoder_input_and_targets` -- ``decoder_input_and_targets(sentences, bos_id,
  eos_id, pad_id)``: the padded decoder input ``<bos> + words`` and targets ``words + <eos>``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_cross_attention", "check_decoder_input_and_targets",
           "check_source_padding_mask"]


# --- my_cross_attention(target, memory, w_q, w_k, w_v) -> (..., T_tgt, d_v) ------------------

def _cross_attention(target: Tensor, memory: Tensor, w_q: Tensor, w_k: Tensor,
                     w_v: Tensor) -> Tensor:
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v        # (T_tgt, d_k), (T_src, d_k), ...
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])  # (T_tgt, T_src)
    return torch.softmax(scores, dim=-1) @ v                   # (T_tgt, d_v)


def _cross_attention_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(10)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator)

    def short(*shape: int) -> Tensor:       # one decimal: a failing case is printed in full
        return rand(*shape).round(decimals=1)

    # the target and the source have different lengths, so a mix-up shows in the shape; the
    # first case is small and its values have different widths d_v and d_k
    return [(short(2, 2), short(3, 2), short(2, 2), short(2, 2), short(2, 3)),
            (rand(3, 6), rand(5, 6), rand(6, 4), rand(6, 4), rand(6, 3)),
            (rand(2, 4, 8), rand(2, 7, 8), rand(8, 4), rand(8, 4), rand(8, 5))]


def _queries_from_the_memory(target, memory, w_q, w_k, w_v):
    return _cross_attention(memory, target, w_q, w_k, w_v)


def _values_from_the_target(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, target @ w_v
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1) @ v


def _self_attention_instead(target, memory, w_q, w_k, w_v):
    return _cross_attention(target, target, w_q, w_k, w_v)


def _without_scaling(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def _softmax_over_the_queries(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-2) @ v


def _scaled_by_d_model(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(target.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def _scaled_by_d_v(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def _the_weights(target, memory, w_q, w_k, w_v):
    q, k = target @ w_q, memory @ w_k
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1]), dim=-1)


def _transposed_with_dot_t(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    k_t = k.permute(*reversed(range(k.ndim)))     # what k.T does, without its warning on 3-D
    return torch.softmax(q @ k_t / math.sqrt(k.shape[-1]), dim=-1) @ v


def _transposed_the_first_two(target, memory, w_q, w_k, w_v):
    q, k, v = target @ w_q, memory @ w_k, memory @ w_v
    return torch.softmax(q @ k.transpose(0, 1) / math.sqrt(k.shape[-1]), dim=-1) @ v


check_cross_attention = Checker(
    reference=_cross_attention,
    cases=_cross_attention_cases(),
    mistakes={
        "the queries come from the target (the sentence being written) and the keys and values "
        "from the memory (the sentence being read): the output has one row per target token":
            _queries_from_the_memory,
        "the values come from the memory too, like the keys: each target token receives a "
        "weighted sum of source vectors": _values_from_the_target,
        "that is self-attention on the target: take the keys and values from memory":
            _self_attention_instead,
        "divide the scores by sqrt(d_k), the width of the keys": _without_scaling,
        "softmax over the keys, the last dimension (dim=-1): each target token's weights over "
        "the source positions sum to 1": _softmax_over_the_queries,
        "divide by sqrt(d_k), the width of the queries and keys (k.shape[-1]), not by the "
        "width of the inputs (target.shape[-1], d_model): here they differ": _scaled_by_d_model,
        "divide by sqrt(d_k), the width of the queries and keys (k.shape[-1]), not by the "
        "width of the values (v.shape[-1], d_v): here they differ": _scaled_by_d_v,
        "those are the weights (T_tgt, T_src); return what they mix, weights @ v, one row of "
        "width d_v per target token": _the_weights,
        "k.T reverses every dimension of a batched (B, T_src, d_k) tensor: swap only the last "
        "two with k.transpose(-2, -1)": _transposed_with_dot_t,
        "k.transpose(0, 1) swaps the first two dimensions, which in a batched (B, T_src, d_k) "
        "tensor are the batch and the positions: swap the last two with k.transpose(-2, -1)":
            _transposed_the_first_two,
    },
)


# --- source_padding_mask(src, pad_id) -> (B, 1, 1, T_src) bool -----------------------------

def _source_padding_mask(src: Tensor, pad_id: int) -> Tensor:
    return (src != pad_id)[:, None, None, :]


def _inverted(src, pad_id):
    return (src == pad_id)[:, None, None, :]


def _without_the_head_and_query_dims(src, pad_id):
    return src != pad_id


def _on_the_query_dimension(src, pad_id):
    return (src != pad_id)[:, None, :, None]


def _as_numbers(src, pad_id):
    return (src != pad_id)[:, None, None, :].float()


def _additive_minus_infinity(src, pad_id):
    scores = torch.zeros(src.shape).masked_fill(src == pad_id, float("-inf"))
    return scores[:, None, None, :]


def _pad_id_zero(src, pad_id):
    return (src != 0)[:, None, None, :]


def _one_dimension_short(src, pad_id):
    return (src != pad_id)[:, None, :]


def _one_row_per_source_token(src, pad_id):
    return (src != pad_id)[:, None, None, :].expand(-1, 1, src.shape[1], -1)


check_source_padding_mask = Checker(
    reference=_source_padding_mask,
    cases=[(torch.tensor([[5, 6, 7], [8, 0, 0]]), 0),
           (torch.tensor([[4, 3, 0, 0, 0], [9, 9, 9, 9, 0], [7, 0, 0, 0, 0]]), 0),
           (torch.tensor([[3, 1, 1], [2, 2, 3]]), 1)],
    mistakes={
        "the mask says where a query may attend, True = may attend: True at real tokens, False "
        "at padding": _inverted,
        "give the mask two more dimensions, (B, 1, 1, T_src), so that it broadcasts over the "
        "heads and over every query: mask[:, None, None, :]": _without_the_head_and_query_dims,
        "the source positions are the keys, the last dimension of the scores (B, h, T_tgt, "
        "T_src): put them last, mask[:, None, None, :]": _on_the_query_dimension,
        "keep the mask boolean (src != pad_id is already True/False): a float mask is added to "
        "the scores, and adding 1 hides nothing": _as_numbers,
        "compare with the argument pad_id, not with 0: this case pads with 1": _pad_id_zero,
        "(B, 1, T_src) is one dimension short: broadcasting against (B, h, T_tgt, T_src) adds "
        "the missing one in front, so the batch lands on the heads; use mask[:, None, None, :]":
            _one_dimension_short,
        "leave the query dimension at size 1, (B, 1, 1, T_src): in cross-attention there are "
        "T_tgt queries, not T_src, and a size-1 dimension fits any number":
            _one_row_per_source_token,
        "that is the additive form (0 and -inf, added to the scores); the book's masks are "
        "boolean, True = may attend: src != pad_id": _additive_minus_infinity,
    },
)


# --- decoder_input_and_targets(sentences, bos_id, eos_id, pad_id) -> (tgt_in, targets) ------

def _decoder_input_and_targets(sentences: list[list[int]], bos_id: int, eos_id: int,
                               pad_id: int) -> tuple[Tensor, Tensor]:
    width = max(len(words) for words in sentences) + 1
    tgt_in = [[bos_id, *words] + [pad_id] * (width - 1 - len(words)) for words in sentences]
    targets = [[*words, eos_id] + [pad_id] * (width - 1 - len(words)) for words in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


_PAIR_CASES = [([[5, 6, 7]], 1, 2, 0),
               ([[5, 6, 7], [8]], 1, 2, 0),
               ([[9, 4], [3, 3, 3, 3], [6, 5, 4]], 1, 2, 0),
               ([[7, 8], [9]], 4, 5, 3)]


def _not_shifted(sentences, bos_id, eos_id, pad_id):
    _, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return targets, targets


def _shifted_the_wrong_way(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return targets, tgt_in


def _padded_with_eos(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return tgt_in.masked_fill(tgt_in == pad_id, eos_id), targets.masked_fill(
        targets == pad_id, eos_id)


def _without_eos(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return tgt_in, targets.masked_fill(targets == eos_id, pad_id)


def _without_bos(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return torch.cat([tgt_in[:, 1:], torch.full_like(tgt_in[:, :1], pad_id)], dim=1), targets


def _padded_on_the_left(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences) + 1
    tgt_in = [[pad_id] * (width - 1 - len(words)) + [bos_id, *words] for words in sentences]
    targets = [[pad_id] * (width - 1 - len(words)) + [*words, eos_id] for words in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


def _eos_after_the_padding(sentences, bos_id, eos_id, pad_id):
    tgt_in, _ = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    width = tgt_in.shape[1]
    targets = [[*words] + [pad_id] * (width - 1 - len(words)) + [eos_id]
               for words in sentences]
    return tgt_in, torch.tensor(targets)


def _sliced_from_one_row(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences) + 2
    rows = torch.tensor([[bos_id, *words, eos_id] + [pad_id] * (width - 2 - len(words))
                         for words in sentences])
    return rows[:, :-1], rows[:, 1:]


def _width_one_short(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences)      # the longest row comes out longer
    tgt_in = [[bos_id, *words] + [pad_id] * (width - 1 - len(words)) for words in sentences]
    targets = [[*words, eos_id] + [pad_id] * (width - 1 - len(words)) for words in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


def _width_one_short_filled_in(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences)      # the longest row does not fit
    tgt_in = torch.full((len(sentences), width), pad_id)
    targets = torch.full((len(sentences), width), pad_id)
    for row, words in enumerate(sentences):
        tgt_in[row, :len(words) + 1] = torch.tensor([bos_id, *words])
        targets[row, :len(words) + 1] = torch.tensor([*words, eos_id])
    return tgt_in, targets


def _one_column_too_many(sentences, bos_id, eos_id, pad_id):
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    extra = torch.full((len(sentences), 1), pad_id)
    return torch.cat([tgt_in, extra], dim=1), torch.cat([targets, extra], dim=1)


def _eos_in_the_input(sentences, bos_id, eos_id, pad_id):
    width = max(len(words) for words in sentences) + 2
    tgt_in = [[bos_id, *words, eos_id] + [pad_id] * (width - 2 - len(words))
              for words in sentences]
    targets = [[*words, eos_id] + [pad_id] * (width - 1 - len(words)) for words in sentences]
    return torch.tensor(tgt_in), torch.tensor(targets)


def _cut_to_t_max(sentences, bos_id, eos_id, pad_id):
    """Rows padded, then cut to the longest sentence's length: its last word and its
    <eos> fall off."""
    tgt_in, targets = _decoder_input_and_targets(sentences, bos_id, eos_id, pad_id)
    return tgt_in[:, :-1], targets[:, :-1]


def _special_ids_hard_coded(sentences, bos_id, eos_id, pad_id):
    return _decoder_input_and_targets(sentences, 1, 2, 0)


check_decoder_input_and_targets = Checker(
    reference=_decoder_input_and_targets,
    cases=_PAIR_CASES,
    mistakes={
        "the decoder input starts with bos_id and the targets are the same words moved one "
        "place to the left, ending in eos_id: position t is trained to predict the word after "
        "what it has read": _not_shifted,
        "the two are swapped: the decoder input starts with bos_id, the targets end with "
        "eos_id": _shifted_the_wrong_way,
        "fill the shorter rows with pad_id, which the loss ignores, not with eos_id":
            _padded_with_eos,
        "end every target row with eos_id (before the padding): that is how the model learns "
        "where a translation stops": _without_eos,
        "start every decoder input with bos_id: the first word is predicted from <bos> alone":
            _without_bos,
        "pad on the right: every row starts with bos_id at position 0, and the padding comes "
        "after the words (after eos_id in the targets)": _padded_on_the_left,
        "eos_id goes right after the last word, before the padding: targets[t] is the token "
        "that follows what tgt_in holds up to t": _eos_after_the_padding,
        "the decoder input is bos_id and the words, then pad_id, with no eos_id: slicing one "
        "padded row <bos> words <eos> leaves eos_id in the shorter rows' input":
            _sliced_from_one_row,
        "both tensors are (B, T_max + 1): the longest sentence needs T_max + 1 places, with "
        "<bos> in front or <eos> behind, so width = max(len(words) for words in sentences) + 1":
            _width_one_short,
        "both tensors are (B, T_max + 1): the longest sentence needs T_max + 1 places, with "
        "<bos> in front or <eos> behind, so make the torch.full tensors max(len(words) for "
        "words in sentences) + 1 wide": _width_one_short_filled_in,
        "both tensors are (B, T_max + 1), and yours have one more column, all pad_id: <bos> "
        "and the longest sentence fill T_max + 1 places exactly, so that row needs no "
        "padding (a row gets width - 1 - len(words) pad_id, with width = T_max + 1)":
            _one_column_too_many,
        "the decoder input is bos_id and the words, with no eos_id: the last word's position "
        "is the one trained to predict eos_id, and an <eos> read as input would have nothing "
        "after it to predict. Both tensors are (B, T_max + 1)": _eos_in_the_input,
        "both tensors are (B, T_max + 1): the longest sentence needs T_max + 1 places, with "
        "<bos> in front or <eos> behind; cut to T_max, its last word falls off tgt_in and "
        "its eos_id off targets": _cut_to_t_max,
        "use the arguments bos_id, eos_id and pad_id rather than 1, 2 and 0: this case uses 4, "
        "5 and 3": _special_ids_hard_coded,
    },
)
