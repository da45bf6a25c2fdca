"""Checkers for the exercises of chapter 18, *Serving many users*.

Each ``check_<thing>`` is called with the learner's function and prints one line (see
:mod:`minitransformer.exercises`):

* :data:`check_left_pad` -- ``my_left_pad(prompts, pad_id)``: ``(idx, attention_mask,
  position_ids)`` of a batch of prompts of different lengths, padded on the left: ``idx`` the
  token ids (``pad_id`` in front of the shorter prompts), ``attention_mask`` True on the real
  tokens, ``position_ids`` 0, 1, 2, ... from each prompt's first real token and 0 on the pads.
* :data:`check_grow_block_table` -- ``my_grow_block_table(block_table, num_tokens,
  free_blocks, block_size)``: ``(block_table, free_blocks)``, two new lists, after a request's
  table has grown to hold ``num_tokens`` tokens, the missing blocks taken from the front of the
  free list; the caller's lists stay as they were.
* :data:`check_blocks_to_free` -- ``my_blocks_to_free(block_tables, finished)``: the blocks,
  sorted, that go back to the pool when request ``finished`` ends: those of its table that no
  other request's table holds.
* :data:`check_merge_partials` -- ``my_merge_partials(m1, l1, o1, m2, l2, o2)``: the online
  softmax step. Each partial is the running maximum ``m`` of the scores, the sum ``l`` of
  ``exp(score - m)`` and the unnormalised output ``o``, the sum of ``exp(score - m) * value``;
  the result is the partial of both blocks' keys together.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minitransformer.exercises import Checker

__all__ = ["check_blocks_to_free", "check_grow_block_table", "check_left_pad",
           "check_merge_partials"]


# --- my_left_pad(prompts, pad_id) ---------------------------------------------------------------

def _pad(prompts, pad_id, *, left=True, fill=None, mask_dtype=torch.bool, invert=False,
         positions="real", pad_position=0, mask_from_ids=False):
    """The padded batch, or one of the ways to get it wrong (the keywords)."""
    width = max(len(p) for p in prompts)
    fill = pad_id if fill is None else fill
    idx = torch.full((len(prompts), width), fill, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    position_ids = torch.full((len(prompts), width), pad_position, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        where = slice(width - n, width) if left else slice(0, n)
        idx[row, where] = torch.tensor(prompt, dtype=torch.long)
        mask[row, where] = True
        if positions == "real":
            position_ids[row, where] = torch.arange(n)
        elif positions == "from one":
            position_ids[row, where] = torch.arange(1, n + 1)
    if positions == "columns":              # counted from the first column, pads included
        position_ids = torch.arange(width).expand(len(prompts), width).clone()
    elif positions == "columns on real":
        position_ids = torch.where(mask, torch.arange(width), pad_position)
    if mask_from_ids and mask_from_ids != "positions only":
        mask = idx != pad_id
        if mask_from_ids == "positions too":
            position_ids = (mask.long().cumsum(-1) - 1).clamp_min(0)
    if mask_from_ids == "positions only":
        position_ids = ((idx != pad_id).long().cumsum(-1) - 1).clamp_min(0)
        mask_from_ids = False
    if invert:
        mask = ~mask
    return idx, mask.to(mask_dtype), position_ids


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    return _pad(prompts, pad_id)


_RIGHT = ("pad on the left: the next token is written after the last column, so every prompt "
          "must end in the last column. Padded on the right, a short prompt's next token "
          "would follow its pads")

def _padded_on_the_right(cases, answers) -> bool:
    """Every answer's ids are the prompts padded on the right, whatever its mask and positions
    (the positions of the pads differ with the way they were computed)."""
    return all(torch.equal(torch.as_tensor(answer[0]).long(), _pad(*case, left=False)[0])
               for case, answer in zip(cases, answers))


def _only_the_pads_positions(cases, answers) -> bool:
    """Ids, mask and the real tokens' positions right; some pad's position not 0."""
    wrong = False
    for case, (idx, mask, positions) in zip(cases, answers):
        want = _left_pad(*case)
        positions = torch.as_tensor(positions)
        if not (torch.equal(torch.as_tensor(idx).long(), want[0])
                and torch.equal(torch.as_tensor(mask).bool(), want[1])
                and torch.equal(positions[want[1]].long(), want[2][want[1]])):
            return False
        wrong |= bool((positions[~want[1]] != 0).any())
    return wrong


def _width_of_the_first(cases, answers) -> bool:
    return any(torch.as_tensor(answer[0]).shape[-1] == len(case[0][0])
               != max(len(p) for p in case[0]) for case, answer in zip(cases, answers))


check_left_pad = Checker(
    reference=_left_pad,
    # case 4's first prompt contains the pad id itself (a real token 0, pad_id 0)
    cases=[([[5, 6, 7], [8, 9]], 1),
           ([[3], [4, 5, 6, 7], [8, 9]], 99),
           ([[10, 11], [12, 13]], 2),
           ([[0, 11, 0], [12], [13, 14, 15, 16, 17]], 0)],
    mistakes={
        _RIGHT: lambda p, pad: _pad(p, pad, left=False),
        _RIGHT + " (and count the positions from each prompt's first real token)":
            lambda p, pad: _pad(p, pad, left=False, positions="columns"),
        "count the positions from each prompt's first real token, not from the first column: a "
        "prompt behind 3 pads starts at position 0, as it does alone, not at 3":
            lambda p, pad: _pad(p, pad, positions="columns"),
        "count the positions from each prompt's first real token, not from the first column "
        "(the pads before it are not part of the text): its first token is at position 0":
            lambda p, pad: _pad(p, pad, positions="columns on real"),
        "positions start at 0: attention_mask.cumsum(-1) - 1 gives 0 on the first real token":
            lambda p, pad: _pad(p, pad, positions="from one"),
        "give the pads position 0: cumsum(-1) - 1 leaves -1 there, which is no position (an "
        "embedding table has no row -1); set them to 0, e.g. with masked_fill":
            lambda p, pad: _pad(p, pad, pad_position=-1),
        "your pads have position 1, as transformers gives them: no token attends to a pad, so "
        "any position works there, but this exercise asks for 0, so that the checker can "
        "compare": lambda p, pad: _pad(p, pad, pad_position=1),
        "the attention mask is boolean (dtype torch.bool), True on the real tokens, like the "
        "masks of every chapter: not 1 and 0":
            lambda p, pad: _pad(p, pad, mask_dtype=torch.long),
        "the attention mask is boolean, True on the real tokens, like the masks of every "
        "chapter: not 1.0 and 0.0": lambda p, pad: _pad(p, pad, mask_dtype=torch.float32),
        "the mask is the wrong way round: True marks a real token (may attend), False a pad, "
        "as in scaled_dot_product_attention (nn.MultiheadAttention's key_padding_mask is the "
        "opposite)": lambda p, pad: _pad(p, pad, invert=True),
        "fill with pad_id, not 0: the pads are the token pad_id":
            lambda p, pad: _pad(p, pad, fill=0),
        "build the mask from the lengths, not from idx != pad_id: a prompt may contain the pad "
        "token itself (case 4's first prompt is 0, 11, 0 with pad_id 0), and its real tokens "
        "must stay visible": lambda p, pad: _pad(p, pad, mask_from_ids=True),
        "build the mask from the lengths, not from idx != pad_id: a prompt may contain the pad "
        "token itself (case 4's first prompt is 0, 11, 0 with pad_id 0), and its real tokens "
        "must stay visible and be counted in the positions":
            lambda p, pad: _pad(p, pad, mask_from_ids="positions too"),
        "count the positions from the lengths too (attention_mask.cumsum(-1) - 1), not from "
        "idx != pad_id: a prompt may contain the pad token itself (case 4's first prompt is "
        "0, 11, 0 with pad_id 0)": lambda p, pad: _pad(p, pad, mask_from_ids="positions only"),
    },
    shapes={_RIGHT: _padded_on_the_right,
            "give the pads position 0: they are no part of the text, and a negative position "
            "is no row of a position table (the real tokens' positions are right)":
                _only_the_pads_positions,
            "the batch is as wide as its longest prompt, max(len(p) for p in prompts), not as "
            "the first": _width_of_the_first},
    match_every_case=True,
    thorough=True,
)


# --- my_grow_block_table(block_table, num_tokens, free_blocks, block_size) ----------------------

def _grow(block_table, num_tokens, free_blocks, block_size, *, count=None, taken=None,
          from_end=False, keep_free=False):
    needed = -(-num_tokens // block_size) if count is None else count(num_tokens, block_size)
    missing = max(0, needed - len(block_table)) if taken is None else taken(needed, block_table)
    if from_end:
        new = list(reversed(free_blocks))[:missing]
        rest = free_blocks[:len(free_blocks) - missing]
    else:       # a negative count slices from the end, as a learner's code does
        new, rest = free_blocks[:missing], free_blocks[missing:]
    return list(block_table) + new, list(free_blocks) if keep_free else rest


def _grow_block_table(block_table: list[int], num_tokens: int, free_blocks: list[int],
                      block_size: int) -> tuple[list[int], list[int]]:
    return _grow(block_table, num_tokens, free_blocks, block_size)


def _grow_cases() -> list[tuple]:
    # a prefill of 10 tokens into an empty table (2.5 blocks), a decode step that fills a block
    # exactly, one that starts a new block, a step within a block of a table that holds one
    # block more than its tokens need (cut back after a rejected draft), a prefill of exactly
    # two blocks, and a chunk that brings a table of one block to 30 tokens (1.9 blocks)
    return [([], 10, [7, 2, 9, 4, 0], 4),
            ([3, 5], 8, [1, 6, 0], 4),
            ([3, 5], 9, [1, 6, 0], 4),
            ([8, 5], 3, [2, 1], 4),
            ([], 32, [11, 4, 6, 1], 16),
            ([4], 30, [9, 2, 5, 0], 16)]


_FRONT = ("take the blocks from the front of the free list, in order (free_blocks[:k]), as the "
          "exercise asks")


def _other_free_blocks(cases, answers) -> bool:
    """Every table that needs k blocks grew by k distinct free blocks, not always the front
    ones (the end of the list, or the front reversed). A table that needs none is not looked
    at: free_blocks[-k:] takes the whole list when k is 0, a slip that the front's slice
    free_blocks[:k] does not have."""
    elsewhere = False
    for (table, num_tokens, free, block_size), answer in zip(cases, answers):
        grown = list(answer[0])
        k = len(_grow_block_table(table, num_tokens, free, block_size)[0]) - len(table)
        new = grown[len(table):]
        if grown[:len(table)] != list(table):
            return False
        if k == 0:
            continue
        if len(new) != k or len(set(new)) != k or not set(new) <= set(free):
            return False
        elsewhere |= new != list(free[:k])
    return elsewhere


def _grew_too_little(cases, answers) -> bool:
    """Some table grew by fewer blocks than it lacks, the ones it got taken from the front."""
    return any(len(answer[0]) < len(_grow_block_table(*case)[0])
               and list(answer[0]) == _grow_block_table(*case)[0][:len(answer[0])]
               for case, answer in zip(cases, answers))


check_grow_block_table = Checker(
    reference=_grow_block_table,
    cases=_grow_cases(),
    mistakes={
        "round the number of blocks up: 10 tokens in blocks of 4 need 3 blocks (the third "
        "half full), so blocks = ceil(num_tokens / block_size), or -(-num_tokens // block_size)":
            lambda t, n, f, b: _grow(t, n, f, b, count=lambda n, b: n // b),
        "round the number of blocks up, not to the nearest: a block a quarter full is still "
        "needed, so math.ceil(num_tokens / block_size), or -(-num_tokens // block_size), not "
        "round()": lambda t, n, f, b: _grow(t, n, f, b, count=lambda n, b: round(n / b)),
        "a table may already hold more blocks than its tokens need: take max(0, needed - "
        "len(block_table)) blocks (a negative count slices from the end of the list)":
            lambda t, n, f, b: _grow(t, n, f, b, taken=lambda need, table: need - len(table)),
        "a full block needs no new one: 8 tokens fit in 2 blocks of 4, so take a block only when "
        "num_tokens passes len(block_table) * block_size (ceil(n / b), not n // b + 1; and "
        "num_tokens already counts the newest token, no + 1)":
            lambda t, n, f, b: _grow(t, n, f, b, count=lambda n, b: n // b + 1),
        "the table already holds len(block_table) blocks: take only the ones it lacks":
            lambda t, n, f, b: _grow(t, n, f, b, taken=lambda need, table: need),
        "the table already holds len(block_table) blocks: when it must grow, take only the "
        "ones it lacks, needed - len(block_table), not all it needs":
            lambda t, n, f, b: _grow(t, n, f, b, taken=lambda need, table: need
                                     if need > len(table) else 0),
        "take a block only when the table cannot hold num_tokens tokens; a step inside a block "
        "takes none": lambda t, n, f, b: _grow(t, n, f, b,
                                               taken=lambda need, table: 1),
        _FRONT: lambda t, n, f, b: _grow(t, n, f, b, from_end=True),
        "a block you hand out must leave the free list, or the next request is given it too and "
        "writes over this one's keys and values": lambda t, n, f, b: _grow(t, n, f, b,
                                                                         keep_free=True),
    },
    shapes={_FRONT: _other_free_blocks,
            "take every block the table lacks at once: a prefill of many tokens needs several, "
            "max(0, ceil(num_tokens / block_size) - len(block_table)), not at most one":
                _grew_too_little},
    keep_arguments=(
        "return two new lists and leave block_table and free_blocks as they were (build them "
        "with block_table + ... and slices, or copy them first with list(...)): the caller "
        "still holds its lists, the pool's free list and the request's table, and decides "
        "itself what to do with the new ones"),
    match_every_case=True,
    thorough=True,
)


# --- my_blocks_to_free(block_tables, finished) --------------------------------------------------

def _still_used(block_tables, finished):
    return {block for request, table in block_tables.items() if request != finished
            for block in table}


def _blocks_to_free(block_tables: dict[int, list[int]], finished: int) -> list[int]:
    used = _still_used(block_tables, finished)
    return sorted(set(block_tables[finished]) - used)


def _free_cases() -> list[tuple]:
    # request 2 shares its first block with request 1 (the same prompt prefix); case 2 shares
    # three blocks with three requests, one only with the second other table; in case 3
    # nothing is shared; in case 4 everything is; in case 5 the shared block follows an
    # unshared one, the other table's request id is smaller, and the ids are large ints
    # built at run time (so that `is` does not find them equal)
    return [({1: [4, 0, 6], 2: [4, 7], 3: [2, 5]}, 2),
            ({7: [3, 8, 1, 9], 8: [3, 8, 2], 9: [3, 5, 1], 10: [6]}, 7),
            ({0: [5, 2], 1: [0, 3, 1]}, 1),
            ({4: [6, 1], 5: [6, 1, 3], 6: [6]}, 4),
            ({int("1001"): [12, 9, 10, 11], int("1000"): [9, 2]}, int("1001"))]


def _frees_a_shared_block(cases, answers) -> bool:
    return any(set(answer) & _still_used(*case) for case, answer in zip(cases, answers)
               if isinstance(answer, (list, tuple, set)))


def _keeps_an_unshared_block(cases, answers) -> bool:
    return any(set(_blocks_to_free(*case)) - set(answer) for case, answer in zip(cases, answers)
               if isinstance(answer, (list, tuple, set)))


check_blocks_to_free = Checker(
    reference=_blocks_to_free,
    cases=_free_cases(),
    mistakes={
        "a block that another request's table still holds (a shared prompt prefix) is still in "
        "use: free only the blocks that no other request holds":
            lambda tables, done: sorted(tables[done]),
        "free the finished request's blocks, not the others': the blocks in its own table that "
        "no other table holds": lambda tables, done: sorted(_still_used(tables, done)
                                                            - set(tables[done])),
        "the other way round: the shared blocks stay (another request still reads them), and "
        "the blocks only the finished request holds go back to the pool":
            lambda tables, done: sorted(set(tables[done]) & _still_used(tables, done)),
        "free the block ids that the table holds, not their places in it (0, 1, 2, ...): "
        "block_tables[finished] maps the request's blocks to blocks of the pool":
            lambda tables, done: sorted(set(range(len(tables[done])))
                                        - _still_used(tables, done)),
        "return the blocks sorted, as a list": lambda tables, done: [
            b for b in tables[done] if b not in _still_used(tables, done)],
        "return a sorted list, not a set: sorted(...) turns a set into one":
            lambda tables, done: set(_blocks_to_free(tables, done)),
        "compare request ids with != (their values), not with `is not` (the same object): "
        "two equal ids above 256 are often different objects, so the finished request's own "
        "table counted as another's and nothing was freed (case 5)":
            lambda tables, done: sorted(set(tables[done]) - {
                b for r, t in tables.items() if r is not done for b in t}),
        "sorted from the smallest id up, sorted(...), not in reverse":
            lambda tables, done: _blocks_to_free(tables, done)[::-1],
        "any other request may share a block, whether it started before or after this one: "
        "look at every other table, not only those of smaller ids":
            lambda tables, done: sorted(set(tables[done]) - {
                b for r, t in tables.items() if r < done for b in t}),
        "leave the finished request's own table out of the blocks still in use (request != "
        "finished): counted, every block of it looks shared and nothing is freed":
            lambda tables, done: sorted(set(tables[done]) - {
                b for t in tables.values() for b in t}),
        "free the blocks no other table holds even when some of its blocks are shared: the "
        "shared ones stay, the others go back to the pool": lambda tables, done: (
            [] if set(tables[done]) & _still_used(tables, done) else sorted(tables[done])),
        "free every block of the finished request's table that no other table holds, all of "
        "them, not only the last": lambda tables, done: sorted(
            set(tables[done][-1:]) - _still_used(tables, done)),
    },
    match_every_case=True,
    thorough=True,
    shapes={"a block that another request's table holds, anywhere in it, is still in use: check "
            "every other table (all of them, at any position), and keep its shared blocks":
                _frees_a_shared_block,
            "every block of the finished request's table that no other table holds goes back "
            "to the pool, wherever it sits in the table (before or after a shared one)":
                _keeps_an_unshared_block},
)


# --- my_merge_partials(m1, l1, o1, m2, l2, o2) --------------------------------------------------

def _merge(m1, l1, o1, m2, l2, o2, *, rescale_old=(True, True), rescale_new=(True, True),
           combine=torch.maximum, weights=False, normalise=False, flip=False):
    m = combine(m1, m2)

    def factor(mi):
        return torch.exp(m - mi) if flip else torch.exp(mi - m)

    one = torch.ones_like(m)
    a_l, a_o = (factor(m1) if r else one for r in rescale_old)
    b_l, b_o = (factor(m2) if r else one for r in rescale_new)
    l = a_l * l1 + b_l * l2
    if weights:         # as if o were normalised: weight each by its sum l
        o = ((a_o * l1)[..., None] * o1 + (b_o * l2)[..., None] * o2) / l[..., None]
    else:
        o = a_o[..., None] * o1 + b_o[..., None] * o2
    if normalise:
        o = o / l[..., None]
    return m, l, o


def _merge_partials(m1: Tensor, l1: Tensor, o1: Tensor, m2: Tensor, l2: Tensor,
                    o2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return _merge(m1, l1, o1, m2, l2, o2)


def partial_softmax(scores: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(m, l, o)`` of one block: ``scores`` (n, k) of n queries on its k keys, ``values``
    (k, d). ``m`` (n,) the largest score, ``l`` (n,) the sum of ``exp(score - m)``, ``o`` (n, d)
    the sum of ``exp(score - m) * value``."""
    m = scores.max(dim=-1).values
    weights = torch.exp(scores - m[:, None])
    return m, weights.sum(dim=-1), weights @ values


def _merge_cases() -> list[tuple]:
    generator = torch.Generator().manual_seed(18)
    cases = []
    # the second block's scores are shifted up in cases 1 and 3, down in case 2, so that the
    # larger maximum is sometimes the older block's, sometimes the newer one's
    for queries, keys1, keys2, dim, shift in ((1, 3, 2, 2, 2.0), (2, 4, 4, 3, -3.0),
                                              (3, 2, 5, 4, 1.5), (2, 3, 3, 2, 0.5)):
        s1 = torch.randn(queries, keys1, generator=generator) * 2
        s2 = torch.randn(queries, keys2, generator=generator) * 2 + shift
        v1 = torch.randn(keys1, dim, generator=generator)
        v2 = torch.randn(keys2, dim, generator=generator)
        cases.append((*partial_softmax(s1, v1), *partial_softmax(s2, v2)))
    return cases


def _python_max(m1, l1, o1, m2, l2, o2):
    m = max(m1, m2)         # one query: fine; several: "Boolean value of Tensor ..." error
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[..., None] * o1 + b[..., None] * o2


def _math_exp(m1, l1, o1, m2, l2, o2):
    import math

    m = torch.maximum(m1, m2)
    a, b = math.exp(m1 - m), math.exp(m2 - m)   # one query: fine; several: an error
    return m, a * l1 + b * l2, a * o1 + b * o2


def _global_max(m1, l1, o1, m2, l2, o2):
    m = torch.cat([m1, m2]).max().expand_as(m1)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[..., None] * o1 + b[..., None] * o2


def _unshifted(m1, l1, o1, m2, l2, o2):
    a, b = torch.exp(m1), torch.exp(m2)
    return torch.maximum(m1, m2), a * l1 + b * l2, a[..., None] * o1 + b[..., None] * o2


def _as_mean(m1, l1, o1, m2, l2, o2):
    m, l, o = _merge(m1, l1, o1, m2, l2, o2)
    return m, l, (o1 + o2) / 2


check_merge_partials = Checker(
    reference=_merge_partials,
    cases=_merge_cases(),
    mistakes={
        "rescale the older partial too: its l1 and o1 were summed relative to m1, so when the "
        "maximum grows to m, multiply both by exp(m1 - m)":
            lambda *a: _merge(*a, rescale_old=(False, False)),
        "rescale both partials to the common maximum: l1 and o1 by exp(m1 - m), l2 and o2 by "
        "exp(m2 - m) (whichever maximum was smaller gets a factor below 1)":
            lambda *a: _merge(*a, rescale_old=(False, False), rescale_new=(False, False)),
        "rescale the older output o1 as you rescale its sum l1: both by exp(m1 - m)":
            lambda *a: _merge(*a, rescale_old=(True, False)),
        "rescale the older sum l1 as you rescale its output o1: both by exp(m1 - m)":
            lambda *a: _merge(*a, rescale_old=(False, True)),
        "rescale the newer partial too: l2 and o2 by exp(m2 - m)":
            lambda *a: _merge(*a, rescale_new=(False, False)),
        "the factor is exp(m1 - m), at most 1 (m is the larger maximum): each term moves from "
        "its own maximum down to the common one": lambda *a: _merge(*a, flip=True),
        "the common maximum is the larger of the two, torch.maximum(m1, m2)":
            lambda *a: _merge(*a, combine=torch.minimum),
        "the common maximum is the larger of the two, torch.maximum(m1, m2), not their sum":
            lambda *a: _merge(*a, combine=torch.add),
        "the common maximum is the larger of the two, torch.maximum(m1, m2): the newer block's "
        "m2 is not always the larger (in case 2 its scores are smaller than the older block's)":
            lambda *a: _merge(*a, combine=lambda m1, m2: m2),
        "the common maximum is the larger of the two, torch.maximum(m1, m2): the older "
        "partial's m1 is not always the larger (in case 1 the newer block's scores are larger)":
            lambda *a: _merge(*a, combine=lambda m1, m2: m1),
        "o is not normalised yet: it is a sum of exp(score - m) * value, already weighted, so "
        "add the rescaled o1 and o2 without weighting them by l1 and l2":
            lambda *a: _merge(*a, weights=True),
        "keep o unnormalised (a sum, like l): divide by l only once, after the last block, or "
        "the next merge divides again": lambda *a: _merge(*a, normalise=True),
        "the outputs are sums weighted by exp(score - m): rescale each to the common maximum "
        "and add them, rather than take their mean": _as_mean,
        "take the larger maximum query by query with torch.maximum(m1, m2): Python's max "
        "compares whole tensors, which works for one query only": _python_max,
        "use torch.exp, which works on every query at once: math.exp takes a single number":
            _math_exp,
        "the common maximum is taken query by query, torch.maximum(m1, m2): one maximum over "
        "all the queries shrinks the factors of the queries with smaller scores":
            _global_max,
        "the common maximum is the larger of the two, torch.maximum(m1, m2), not logaddexp (a "
        "soft maximum): l and o are sums relative to an exact maximum":
            lambda *a: _merge(*a, combine=torch.logaddexp),
        "the factors are exp(m1 - m) and exp(m2 - m), relative to the common maximum: exp(m1) "
        "alone overflows for large scores, and l and o were summed relative to m1 and m2":
            _unshifted,
        "rescale the sums l1 and l2 as you rescale the outputs o1 and o2: l is the softmax's "
        "denominator, summed relative to the same maximum":
            lambda *a: _merge(*a, rescale_old=(False, True), rescale_new=(False, True)),
    },
    match_every_case=True,
    thorough=True,
    gradients=("m1", "l1", "o1", "m2", "l2", "o2"),
)
