"""Wrong answers to the exercises of chapter 18 (serving many users), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
"""

import math

import numpy as np
import torch

# ---------------------------------------------------------------------------
# 18.1  my_left_pad(prompts, pad_id)
# ---------------------------------------------------------------------------


def _positions(mask):
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def pad_right(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):   # padded on the right
        idx[row, :len(prompt)] = torch.tensor(prompt)
        mask[row, :len(prompt)] = True
    return idx, mask, _positions(mask)


def pad_mask_from_ids(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
    mask = idx != pad_id                     # wrong if a prompt holds pad_id
    return idx, mask, _positions(mask)


def pad_positions_from_column(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    positions = torch.arange(width).expand(len(prompts), width)   # from the pad
    return idx, mask, positions


def pad_positions_minus_one(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, mask.long().cumsum(-1) - 1   # -1 on the pads


def pad_positions_from_one(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, mask.long().cumsum(-1)   # 1, 2, 3, ...


def pad_positions_negative(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    starts = []
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
        starts.append(width - len(prompt))
    positions = torch.arange(width)[None, :] - torch.tensor(starts)[:, None]
    return idx, mask, positions                # -3, -2, -1 on the pads


def pad_long_mask(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)   # 0/1, not bool
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return idx, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def pad_float_ids(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), width) + pad_id   # float32 ids
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.float32)
        mask[row, width - len(prompt):] = True
    return idx, mask, _positions(mask)


def pad_width_of_first(prompts, pad_id):
    width = len(prompts[0])                  # assumes the first is the longest
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        prompt = prompt[-width:]
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, _positions(mask)


def pad_mutates_prompts(prompts, pad_id):
    width = max(len(p) for p in prompts)
    masks = []
    for prompt in prompts:
        n = width - len(prompt)
        prompt[:0] = [pad_id] * n            # pads inserted into the caller's lists
        masks.append([False] * n + [True] * (width - n))
    mask = torch.tensor(masks)
    return torch.tensor(prompts), mask, _positions(mask)


def pad_sorted_rows(prompts, pad_id):
    prompts = sorted(prompts, key=len)       # rows reordered by length
    width = len(prompts[-1])
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, _positions(mask)


def pad_extra_column(prompts, pad_id):
    width = max(len(p) for p in prompts) + 1   # room for the next token
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - 1 - len(prompt):width - 1] = torch.tensor(prompt)
        mask[row, width - 1 - len(prompt):width - 1] = True
    return idx, mask, _positions(mask)


def pad_returns_list(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return [idx, mask, _positions(mask)]     # a list, not a tuple


def pad_numpy(prompts, pad_id):
    width = max(len(p) for p in prompts)
    idx = np.full((len(prompts), width), pad_id)
    mask = np.zeros((len(prompts), width), dtype=bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = True
    return idx, mask, np.maximum(mask.cumsum(-1) - 1, 0)


def pad_positions_not_counting_repeats(prompts, pad_id):
    # positions from the ids: the first real token found by "the first non-pad"
    width = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = True
    return idx, mask, _positions(idx != pad_id)


# ---------------------------------------------------------------------------
# 18.2  my_grow_block_table(block_table, num_tokens, free_blocks, block_size)
# ---------------------------------------------------------------------------


def grow_floor(block_table, num_tokens, free_blocks, block_size):
    needed = num_tokens // block_size        # a part-full block forgotten
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_plus_one(block_table, num_tokens, free_blocks, block_size):
    needed = num_tokens // block_size + 1    # one too many on a full block
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_in_place(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    while len(block_table) < needed:
        block_table.append(free_blocks.pop(0))   # the caller's lists change
    return block_table, free_blocks


def grow_from_the_end(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    if missing == 0:
        return list(block_table), list(free_blocks)
    taken = free_blocks[-missing:][::-1]     # like pop(), from the end
    return block_table + taken, free_blocks[:-missing]


def grow_no_max(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = needed - len(block_table)      # negative when the table is ahead
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_one_per_call(block_table, num_tokens, free_blocks, block_size):
    # a decode step adds one token: a new block when it starts one
    if num_tokens % block_size == 1 or block_size == 1:
        return block_table + free_blocks[:1], free_blocks[1:]
    return list(block_table), list(free_blocks)


def grow_counts_next_token(block_table, num_tokens, free_blocks, block_size):
    needed = -(-(num_tokens + 1) // block_size)   # room for the next token too
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_aliases_inputs(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    if missing == 0:
        return block_table, free_blocks      # the caller's own lists back
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_smallest_free(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    ordered = sorted(free_blocks)            # lowest ids first, not the front
    return block_table + ordered[:missing], ordered[missing:]


def grow_swapped_result(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    return free_blocks[missing:], block_table + free_blocks[:missing]


def grow_sorted_table(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    return sorted(block_table + free_blocks[:missing]), free_blocks[missing:]


def grow_takes_needed(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)    # all of them, not the missing ones
    if len(block_table) >= needed:
        return list(block_table), list(free_blocks)
    return block_table + free_blocks[:needed], free_blocks[needed:]


def grow_hard_coded_16(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // 16)            # the chapter's block size
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_set_difference(block_table, num_tokens, free_blocks, block_size):
    needed = -(-num_tokens // block_size)
    missing = max(0, needed - len(block_table))
    taken = free_blocks[:missing]
    return block_table + taken, list(set(free_blocks) - set(taken))   # order lost


def grow_float_ceil(block_table, num_tokens, free_blocks, block_size):
    needed = round(num_tokens / block_size)  # rounds, does not ceil
    missing = max(0, needed - len(block_table))
    return block_table + free_blocks[:missing], free_blocks[missing:]


def grow_returns_tuples(block_table, num_tokens, free_blocks, block_size):
    needed = math.ceil(num_tokens / block_size)
    missing = max(0, needed - len(block_table))
    return (tuple(block_table) + tuple(free_blocks[:missing]),
            tuple(free_blocks[missing:]))


# ---------------------------------------------------------------------------
# 18.3  my_blocks_to_free(block_tables, finished)
# ---------------------------------------------------------------------------


def free_all_of_its_blocks(block_tables, finished):
    return sorted(block_tables[finished])    # shared blocks freed too


def free_unsorted(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return [b for b in block_tables[finished] if b not in in_use]   # table order


def free_shared_ones(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return sorted(set(block_tables[finished]) & in_use)   # the wrong side


def free_counts_itself(block_tables, finished):
    in_use = {b for t in block_tables.values() for b in t}   # its own included
    return sorted(set(block_tables[finished]) - in_use)


def free_deletes_entry(block_tables, finished):
    table = block_tables.pop(finished)       # the caller's dict changes
    in_use = {b for t in block_tables.values() for b in t}
    return sorted(set(table) - in_use)


def free_reverse_sorted(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return sorted(set(block_tables[finished]) - in_use, reverse=True)


def free_returns_set(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    return set(block_tables[finished]) - in_use


def free_one_other_table(block_tables, finished):
    others = [t for r, t in block_tables.items() if r != finished]
    in_use = set(others[0]) if others else set()   # only the first other request
    return sorted(set(block_tables[finished]) - in_use)


def free_identity_compare(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r is not finished for b in t}
    return sorted(set(block_tables[finished]) - in_use)


def free_same_position_only(block_tables, finished):
    # shared prefixes assumed: a block is shared only at the same index
    mine = block_tables[finished]
    out = []
    for k, b in enumerate(mine):
        if not any(len(t) > k and t[k] == b
                   for r, t in block_tables.items() if r != finished):
            out.append(b)
    return sorted(out)


def free_all_or_nothing(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    mine = block_tables[finished]
    if any(b in in_use for b in mine):       # shared: keep the whole table
        return []
    return sorted(mine)


def free_remove_while_iterating(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    table = block_tables[finished]
    for b in table:                          # skips the block after each removal,
        if b in in_use:                      # and edits the caller's table
            table.remove(b)
    return sorted(table)


def free_older_requests_only(block_tables, finished):
    # sharing assumed only with requests that started earlier (smaller ids)
    in_use = {b for r, t in block_tables.items() if r < finished for b in t}
    return sorted(set(block_tables[finished]) - in_use)


def free_prefix_until_first_shared(block_tables, finished):
    in_use = {b for r, t in block_tables.items() if r != finished for b in t}
    out = []
    for b in reversed(block_tables[finished]):   # from the end, stop at the prefix
        if b in in_use:
            break
        out.append(b)
    return sorted(out)


# ---------------------------------------------------------------------------
# 18.4  my_merge_partials(m1, l1, o1, m2, l2, o2)
# ---------------------------------------------------------------------------


def merge_inverted_scale(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m - m1), torch.exp(m - m2)   # at least 1: upside down
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_no_rescale(m1, l1, o1, m2, l2, o2):
    return torch.maximum(m1, m2), l1 + l2, o1 + o2


def merge_broadcast_wrong_axis(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a * o1 + b * o2   # (n,) along d: needs n == d


def merge_divides_by_l(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    l = a * l1 + b * l2
    o = a[:, None] * o1 + b[:, None] * o2
    return m, l, o / l[:, None]              # normalised: no longer a partial


def merge_assumes_first_larger(m1, l1, o1, m2, l2, o2):
    b = torch.exp(m2 - m1)                   # right only where m1 >= m2
    return m1, l1 + b * l2, o1 + b[:, None] * o2


def merge_global_max(m1, l1, o1, m2, l2, o2):
    m = torch.max(torch.cat([m1, m2]))       # one maximum for every query
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m.expand_as(m1), a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_logsumexp(m1, l1, o1, m2, l2, o2):
    m = torch.logaddexp(m1, m2)              # a soft maximum
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_in_place(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    l1.mul_(a).add_(b * l2)                  # the caller's partial changes
    o1.mul_(a[:, None]).add_(b[:, None] * o2)
    return m, l1, o1


def merge_unshifted_exp(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1), torch.exp(m2)      # not relative to the maximum
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_returns_list(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return [m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2]


def merge_l_not_rescaled(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, l1 + l2, a[:, None] * o1 + b[:, None] * o2   # only o rescaled


def merge_python_max(m1, l1, o1, m2, l2, o2):
    m = max(m1, m2)                          # only works for one query
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_min(m1, l1, o1, m2, l2, o2):
    m = torch.minimum(m1, m2)                # the smaller: exp can overflow
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_float64(m1, l1, o1, m2, l2, o2):
    m1, l1, o1, m2, l2, o2 = (t.double() for t in (m1, l1, o1, m2, l2, o2))
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


def merge_averaged(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2)
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, (a * l1 + b * l2) / 2, (a[:, None] * o1 + b[:, None] * o2) / 2


def merge_detached_max(m1, l1, o1, m2, l2, o2):
    m = torch.maximum(m1, m2).detach()       # "max has no gradient"
    a, b = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a * l1 + b * l2, a[:, None] * o1 + b[:, None] * o2


WRONG_ANSWERS = [
    ("18.1", "check_left_pad", "padded on the right", pad_right),
    ("18.1", "check_left_pad", "mask from idx != pad_id: a prompt holding pad_id is masked",
     pad_mask_from_ids),
    ("18.1", "check_left_pad", "position ids counted from the first column (the pad)",
     pad_positions_from_column),
    ("18.1", "check_left_pad", "position ids -1 on the pads (no clamp)",
     pad_positions_minus_one),
    ("18.1", "check_left_pad", "position ids 1, 2, 3, ... (cumsum without -1)",
     pad_positions_from_one),
    ("18.1", "check_left_pad", "position ids negative on the pads (arange - start)",
     pad_positions_negative),
    ("18.1", "check_left_pad", "attention mask of 0/1 longs, not booleans", pad_long_mask),
    ("18.1", "check_left_pad", "ids as float32", pad_float_ids),
    ("18.1", "check_left_pad", "width of the first prompt, assumed the longest",
     pad_width_of_first),
    ("18.1", "check_left_pad", "pads inserted into the caller's prompt lists",
     pad_mutates_prompts),
    ("18.1", "check_left_pad", "rows sorted by length", pad_sorted_rows),
    ("18.1", "check_left_pad", "one extra pad column at the end (off by one)",
     pad_extra_column),
    ("18.1", "check_left_pad", "returns a list, not a tuple", pad_returns_list),
    ("18.1", "check_left_pad", "numpy arrays", pad_numpy),
    ("18.1", "check_left_pad", "position ids from idx != pad_id (prompt holding pad_id)",
     pad_positions_not_counting_repeats),

    ("18.2", "check_grow_block_table", "floor division: the part-full block forgotten",
     grow_floor),
    ("18.2", "check_grow_block_table", "n // size + 1: one too many on a full block",
     grow_plus_one),
    ("18.2", "check_grow_block_table", "append/pop(0) on the caller's lists",
     grow_in_place),
    ("18.2", "check_grow_block_table", "blocks taken from the end of the free list",
     grow_from_the_end),
    ("18.2", "check_grow_block_table", "no max(0, .): a negative slice when the table is ahead",
     grow_no_max),
    ("18.2", "check_grow_block_table", "at most one block per call (decode only)",
     grow_one_per_call),
    ("18.2", "check_grow_block_table", "room for num_tokens + 1 (the next token counted)",
     grow_counts_next_token),
    ("18.2", "check_grow_block_table", "returns the caller's own lists when nothing is missing",
     grow_aliases_inputs),
    ("18.2", "check_grow_block_table", "smallest free ids first (sorted), not the front",
     grow_smallest_free),
    ("18.2", "check_grow_block_table", "returns (free, table)", grow_swapped_result),
    ("18.2", "check_grow_block_table", "new table sorted", grow_sorted_table),
    ("18.2", "check_grow_block_table", "takes every needed block, not only the missing ones",
     grow_takes_needed),
    ("18.2", "check_grow_block_table", "block size hard-coded as 16", grow_hard_coded_16),
    ("18.2", "check_grow_block_table", "set difference: the free list's order lost",
     grow_set_difference),
    ("18.2", "check_grow_block_table", "round() instead of a ceiling", grow_float_ceil),
    ("18.2", "check_grow_block_table", "returns tuples, not lists", grow_returns_tuples),

    ("18.3", "check_blocks_to_free", "every block of its table, shared ones too",
     free_all_of_its_blocks),
    ("18.3", "check_blocks_to_free", "not sorted: in table order", free_unsorted),
    ("18.3", "check_blocks_to_free", "the shared blocks instead of the unshared",
     free_shared_ones),
    ("18.3", "check_blocks_to_free", "its own table counted as in use: always empty",
     free_counts_itself),
    ("18.3", "check_blocks_to_free", "pops the finished request from the caller's dict",
     free_deletes_entry),
    ("18.3", "check_blocks_to_free", "sorted in reverse", free_reverse_sorted),
    ("18.3", "check_blocks_to_free", "returns a set", free_returns_set),
    ("18.3", "check_blocks_to_free", "only the first other request's table checked",
     free_one_other_table),
    ("18.3", "check_blocks_to_free", "request ids compared with 'is not' (large ints)",
     free_identity_compare),
    ("18.3", "check_blocks_to_free", "shared only if at the same index in another table",
     free_same_position_only),
    ("18.3", "check_blocks_to_free", "nothing freed if any block is shared",
     free_all_or_nothing),
    ("18.3", "check_blocks_to_free", "list.remove while iterating the caller's table",
     free_remove_while_iterating),
    ("18.3", "check_blocks_to_free", "sharing only with requests of smaller id",
     free_older_requests_only),
    ("18.3", "check_blocks_to_free", "frees the tail after the last shared block only",
     free_prefix_until_first_shared),

    ("18.4", "check_merge_partials", "scale factors inverted: exp(m - m1)",
     merge_inverted_scale),
    ("18.4", "check_merge_partials", "no rescaling: l1 + l2, o1 + o2", merge_no_rescale),
    ("18.4", "check_merge_partials", "(n,) scale times (n, d) o without [:, None]",
     merge_broadcast_wrong_axis),
    ("18.4", "check_merge_partials", "o divided by l: the output, not the partial",
     merge_divides_by_l),
    ("18.4", "check_merge_partials", "assumes m1 >= m2", merge_assumes_first_larger),
    ("18.4", "check_merge_partials", "one maximum over all queries", merge_global_max),
    ("18.4", "check_merge_partials", "logaddexp instead of the maximum", merge_logsumexp),
    ("18.4", "check_merge_partials", "rescales the caller's l1 and o1 in place",
     merge_in_place),
    ("18.4", "check_merge_partials", "exp(m1) not exp(m1 - m): overflow", merge_unshifted_exp),
    ("18.4", "check_merge_partials", "returns a list", merge_returns_list),
    ("18.4", "check_merge_partials", "l not rescaled, only o", merge_l_not_rescaled),
    ("18.4", "check_merge_partials", "python max() on tensors: only for one query",
     merge_python_max),
    ("18.4", "check_merge_partials", "minimum instead of maximum", merge_min),
    ("18.4", "check_merge_partials", "float64 result", merge_float64),
    ("18.4", "check_merge_partials", "sums averaged (divided by 2)", merge_averaged),
    ("18.4", "check_merge_partials", "maximum detached", merge_detached_max),
]
