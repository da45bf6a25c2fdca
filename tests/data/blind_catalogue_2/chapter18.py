"""Blind catalogue 2: wrong answers to chapter 18's exercises (written from the book only)."""
# ruff: noqa: E501  (one wrong answer per line in WRONG_ANSWERS)

import torch


# 18.1 left_pad ---------------------------------------------------------------

def _left(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = True
    return idx, mask


def pad_right(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        idx[row, :len(p)] = torch.tensor(p)
        mask[row, :len(p)] = True
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return idx, mask, pos


def pad_positions_arange(prompts, pad_id):
    idx, mask = _left(prompts, pad_id)
    pos = torch.arange(idx.shape[1]).expand_as(idx)
    return idx, mask, pos


def pad_mask_from_ids(prompts, pad_id):
    idx, _ = _left(prompts, pad_id)
    mask = idx != pad_id
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return idx, mask, pos


def pad_positions_minus_one(prompts, pad_id):
    idx, mask = _left(prompts, pad_id)
    pos = mask.long().cumsum(-1) - 1
    return idx, mask, pos


def pad_mask_long(prompts, pad_id):
    idx, mask = _left(prompts, pad_id)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return idx, mask.long(), pos


def pad_positions_from_one(prompts, pad_id):
    idx, mask = _left(prompts, pad_id)
    pos = mask.long().cumsum(-1)
    return idx, mask, pos


# 18.2 grow_block_table -------------------------------------------------------

def grow_floor(block_table, num_tokens, free_blocks, block_size):
    needed = num_tokens // block_size
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_plus_one(block_table, num_tokens, free_blocks, block_size):
    needed = -(-(num_tokens + 1) // block_size)
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_mutates(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    while len(block_table) < needed:
        block_table.append(free_blocks.pop(0))
    return block_table, free_blocks


def grow_from_end(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    if missing == 0:
        return list(block_table), list(free_blocks)
    return block_table + free_blocks[-missing:], free_blocks[:-missing]


def grow_ignores_table(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    return block_table + free_blocks[:needed], free_blocks[needed:]


def grow_one_at_most(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = 1 if needed > len(block_table) else 0
    return block_table + free_blocks[:missing], free_blocks[missing:]


# 18.3 blocks_to_free ---------------------------------------------------------

def free_all_own(block_tables, finished):
    return sorted(block_tables[finished])


def free_table_order(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return [b for b in block_tables[finished] if b not in in_use]


def free_counts_itself(block_tables, finished):
    in_use = {b for t in block_tables.values() for b in t}
    return sorted(set(block_tables[finished]) - in_use)


def free_deletes_key(block_tables, finished):
    table = block_tables.pop(finished)
    in_use = {b for t in block_tables.values() for b in t}
    return sorted(set(table) - in_use)


def free_shared_ones(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return sorted(set(block_tables[finished]) & in_use)


def free_returns_set(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return set(block_tables[finished]) - in_use


# 18.4 merge_partials ---------------------------------------------------------

def merge_no_rescale_l(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 + l2, a[:, None] * o1 + b[:, None] * o2


def merge_factors_inverted(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m - m1), torch.exp(m - m2)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_normalised_o(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    l = a * l1 + b * l2
    return m, l, (a[:, None] * o1 + b[:, None] * o2) / l[:, None]


def merge_global_max(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1.max(), m2.max()).expand_as(m1)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_inplace(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    l1.mul_(a).add_(b * l2)
    o1.mul_(a[:, None]).add_(b[:, None] * o2)
    return m, l1, o1


def merge_o2_unscaled(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + o2


WRONG_ANSWERS = [
    ("18.1", "check_left_pad", "pads on the right", pad_right),
    ("18.1", "check_left_pad", "positions 0..T-1 on every row, pads included", pad_positions_arange),
    ("18.1", "check_left_pad", "mask from idx != pad_id (a prompt may hold pad_id)", pad_mask_from_ids),
    ("18.1", "check_left_pad", "positions -1 on the pads (no clamp)", pad_positions_minus_one),
    ("18.1", "check_left_pad", "attention mask as integers, not boolean", pad_mask_long),
    ("18.1", "check_left_pad", "positions start at 1 on the first real token", pad_positions_from_one),
    ("18.2", "check_grow_block_table", "floor division: a part-full block not counted", grow_floor),
    ("18.2", "check_grow_block_table", "adds one to num_tokens", grow_plus_one),
    ("18.2", "check_grow_block_table", "changes the caller's lists in place", grow_mutates),
    ("18.2", "check_grow_block_table", "takes the blocks from the end of free_blocks", grow_from_end),
    ("18.2", "check_grow_block_table", "adds all needed blocks, ignoring those the table has", grow_ignores_table),
    ("18.2", "check_grow_block_table", "adds at most one block", grow_one_at_most),
    ("18.3", "check_blocks_to_free", "frees all its blocks, shared ones too", free_all_own),
    ("18.3", "check_blocks_to_free", "in table order, not sorted", free_table_order),
    ("18.3", "check_blocks_to_free", "counts the finished request's own table as in use", free_counts_itself),
    ("18.3", "check_blocks_to_free", "deletes the finished request from block_tables", free_deletes_key),
    ("18.3", "check_blocks_to_free", "returns the shared blocks instead of the unshared", free_shared_ones),
    ("18.3", "check_blocks_to_free", "returns a set, not a sorted list", free_returns_set),
    ("18.4", "check_merge_partials", "adds l1 + l2 without rescaling", merge_no_rescale_l),
    ("18.4", "check_merge_partials", "factors exp(m - m_i) instead of exp(m_i - m)", merge_factors_inverted),
    ("18.4", "check_merge_partials", "divides o by l", merge_normalised_o),
    ("18.4", "check_merge_partials", "one max over all queries, not per query", merge_global_max),
    ("18.4", "check_merge_partials", "updates l1 and o1 in place", merge_inplace),
    ("18.4", "check_merge_partials", "forgets to rescale o2", merge_o2_unscaled),
]
