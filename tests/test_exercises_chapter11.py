"""The checkers of chapter 11: they accept correct answers and explain plausible wrong ones."""

import pytest
import torch

from minitransformer import KVCache
from minitransformer.exercises import chapter11
from minitransformer.exercises.chapter11 import (
    check_cache_bytes,
    check_cache_update,
    check_max_positions,
    check_position_offset,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_cache_update(cached, new):
    if cached is None:
        return new
    return torch.cat([cached, new], dim=-2)


def my_embed_new_tokens(idx, token_table, position_table, past_len):
    positions = torch.arange(past_len, past_len + idx.shape[1])
    return token_table[idx] + position_table[positions]


def my_cache_bytes(num_layers, batch, num_heads, length, d_head, bytes_per_number):
    per_layer = 2 * batch * num_heads * length * d_head      # keys and values
    return num_layers * per_layer * bytes_per_number


def my_max_positions(memory_bytes, num_layers, batch, num_heads, d_head,
                     bytes_per_number):
    one_position = my_cache_bytes(num_layers, batch, num_heads, 1, d_head, bytes_per_number)
    return memory_bytes // one_position


def bytes_of_a_filled_cache(num_layers, batch, num_heads, length, d_head, bytes_per_number):
    """The package's cache, filled on the meta device (no memory), asked for its size."""
    dtype = {2: torch.float16, 4: torch.float32, 8: torch.float64}[bytes_per_number]
    cache = KVCache(num_layers)
    new = torch.empty(batch, num_heads, length, d_head, dtype=dtype, device="meta")
    for layer in range(num_layers):
        cache.update(layer, new, new)
    return cache.nbytes


CHECKERS = {
    "cache_update": (check_cache_update, my_cache_update),
    "position_offset": (check_position_offset, my_embed_new_tokens),
    "cache_bytes": (check_cache_bytes, my_cache_bytes),
    "cache_bytes_from_the_package": (check_cache_bytes, bytes_of_a_filled_cache),
    "max_positions": (check_max_positions, my_max_positions),
    "max_positions_from_the_package": (
        check_max_positions,
        lambda M, L, B, h, d, b: M // bytes_of_a_filled_cache(L, B, h, 1, d, b)),
}


def test_module_exports_every_checker():
    assert sorted(chapter11.__all__) == ["check_cache_bytes", "check_cache_update",
                                         "check_max_positions", "check_position_offset"]


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_the_update_checker_agrees_with_the_package_cache():
    for cached, new in check_cache_update.cases:
        cache = KVCache(1)
        if cached is not None:
            cache.update(0, cached, cached)
        keys, _ = cache.update(0, new, new)
        torch.testing.assert_close(keys, my_cache_update(cached, new), rtol=0, atol=0)


# --- specific wrong answers a learner writes, with the hint they see -----------------------

def test_update_with_the_new_keys_first(capsys):
    assert not check_cache_update(lambda cached, new: new if cached is None
                                  else torch.cat([new, cached], dim=2))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2: for input ([[[[")
    assert out.endswith("Hint: the new positions go after the cached ones: "
                        "torch.cat([cached, new], ...)\n")


def test_update_with_the_default_dim(capsys):
    assert not check_cache_update(lambda cached, new: new if cached is None
                                  else torch.cat([cached, new]))
    out = capsys.readouterr().out
    assert "your function raised RuntimeError" in out
    assert out.endswith("Hint: torch.cat joins along dim 0 unless told otherwise: the "
                        "positions are dim 2 of (B, num_heads, T, d_head)\n")


def test_update_that_forgets_an_empty_cache(capsys):
    assert not check_cache_update(lambda cached, new: torch.cat([cached, new], dim=2))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (None, [[[[")
    assert "your function raised TypeError" in out
    assert out.endswith("Hint: before the first step nothing is cached (cached is None): "
                        "return new as it is\n")


def test_update_with_stack_instead_of_cat(capsys):
    assert not check_cache_update(lambda cached, new: new if cached is None
                                  else torch.stack([cached, new], dim=2))
    out = capsys.readouterr().out
    assert "your function raised RuntimeError" in out
    assert out.endswith("torch.cat joins them along an existing one, the positions (dim 2)\n")


def test_update_that_returns_the_cached_keys_alone(capsys):
    assert not check_cache_update(lambda cached, new: new if cached is None else cached)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert out.endswith("Hint: append the new positions: return the cached ones followed by "
                        "the new ones, not the cached ones alone\n")


def test_update_that_adds_instead_of_appending(capsys):
    assert not check_cache_update(lambda cached, new: new if cached is None else cached + new)
    assert capsys.readouterr().out.endswith("not added to their numbers\n")


def test_offset_forgotten(capsys):
    def from_zero(idx, token_table, position_table, past_len):
        return token_table[idx] + position_table[: idx.shape[1]]

    assert not check_position_offset(from_zero)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2: for input ([[3]], ")
    assert out.endswith("so their positions are past_len, past_len + 1, ...\n")


@pytest.mark.parametrize("first", ["slice", "arange"])
def test_offset_one_too_small(first, capsys):
    def one_early(idx, token_table, position_table, past_len):
        if first == "slice":
            return token_table[idx] + position_table[past_len - 1:past_len - 1 + idx.shape[1]]
        positions = torch.arange(past_len - 1, past_len - 1 + idx.shape[1])
        return token_table[idx] + position_table[positions]

    assert not check_position_offset(one_early)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")                 # past_len 0: position -1
    assert "Hint: off by one" in out and "past_len - 1" in out


def test_token_ids_used_as_positions(capsys):
    def ids_as_positions(idx, token_table, position_table, past_len):
        return token_table[idx] + position_table[idx + past_len]

    assert not check_position_offset(ids_as_positions)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[3]], ")
    assert out.endswith("index position_table with positions, token_table with idx\n")


def test_one_position_for_a_whole_chunk(capsys):
    def one_position(idx, token_table, position_table, past_len):
        return token_table[idx] + position_table[past_len]

    assert not check_position_offset(one_position)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3:")
    assert out.endswith("past_len up to past_len + T - 1, where T = idx.shape[1] (len(idx) and "
                        "idx.shape[0] count the rows of the batch, B)\n")


def test_bytes_without_the_values(capsys):
    assert not check_cache_bytes(lambda L, B, h, T, d, b: L * B * h * T * d * b)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (1, 1, 1, 1, 1, 4) expected 8 but got 4. Hint: the cache holds a "
        "key and a value for every position: twice the keys alone\n")


def test_bytes_quadratic_in_the_length(capsys):
    assert not check_cache_bytes(lambda L, B, h, T, d, b: 2 * L * B * h * T * T * d * b)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2: for input (5, 3, 6, 100, 16, 4) expected 1152000 but got")
    assert out.endswith("which are not cached\n")


def test_bytes_without_the_heads_get_the_heads_hint(capsys):
    # with 4 heads and 4 bytes per number, this used to get the bytes hint
    assert not check_cache_bytes(lambda L, B, h, T, d, b: 2 * L * B * T * d * b)
    assert capsys.readouterr().out == (
        "✗ case 2: for input (5, 3, 6, 100, 16, 4) expected 1152000 but got 192000. Hint: "
        "every head has its own keys and values: multiply by num_heads\n")


@pytest.mark.parametrize("left_out, hint", [
    ("L", "multiply by num_layers"), ("B", "multiply by batch"), ("h", "multiply by num_heads"),
    ("d", "multiply by d_head"), ("b", "multiply by bytes_per_number")])
def test_each_factor_left_out_gets_its_own_hint(left_out, hint, capsys):
    def without(L, B, h, T, d, b):
        factors = {"L": L, "B": B, "h": h, "d": d, "b": b}
        factors[left_out] = 1
        return 2 * T * factors["L"] * factors["B"] * factors["h"] * factors["d"] * factors["b"]

    assert not check_cache_bytes(without)
    assert hint in capsys.readouterr().out


def test_bytes_with_queries_or_in_gigabytes(capsys):
    assert not check_cache_bytes(lambda L, B, h, T, d, b: 3 * L * B * h * T * d * b)
    assert capsys.readouterr().out.endswith("the factor is 2, not 3\n")
    for unit in (1e9, 2 ** 30):
        assert not check_cache_bytes(
            lambda L, B, h, T, d, b, unit=unit: 2 * L * B * h * T * d * b / unit)
        assert capsys.readouterr().out.endswith("turn it into gigabytes only when you print it\n")


def test_bytes_counted_as_numbers(capsys):
    assert not check_cache_bytes(lambda L, B, h, T, d, b: 2 * L * B * h * T * d)
    assert capsys.readouterr().out.endswith(
        "Hint: count bytes, not numbers: multiply by bytes_per_number (4 for float32, 2 for "
        "float16)\n")


# Found in review (2026-11-22): plausible mistakes that got no hint or a wrong one.
def test_bytes_with_the_heads_counted_twice(capsys):
    # num_heads * (num_heads * d_head): with 8 heads in case 2 this got the "bits" hint
    assert not check_cache_bytes(lambda L, B, h, T, d, b: 2 * L * B * h * T * (h * d) * b)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert out.endswith("Hint: num_heads counted twice: the heads together are num_heads * "
                        "d_head = d_model wide, so multiply by num_heads and by d_head once "
                        "each\n")


def test_update_that_tests_the_cache_with_not(capsys):
    assert not check_cache_update(lambda cached, new: new if not cached
                                  else torch.cat([cached, new], dim=2))
    out = capsys.readouterr().out
    assert "your function raised RuntimeError" in out
    assert out.endswith("Hint: test for the empty cache with `cached is None`: `not cached` asks "
                        "a tensor of many numbers for a single True or False, which torch "
                        "refuses\n")


def test_offset_with_an_arange_that_ends_too_early(capsys):
    def ends_at_t(idx, token_table, position_table, past_len):
        return token_table[idx] + position_table[torch.arange(past_len, idx.shape[1])]

    assert not check_position_offset(ends_at_t)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")                 # past_len 5, one token: no positions
    assert out.endswith("the new positions are torch.arange(past_len, past_len + T), with "
                        "T = idx.shape[1]\n")


@pytest.mark.parametrize("count", [len, lambda idx: idx.shape[0]])
def test_offset_with_the_batch_size_for_t(count, capsys):
    def batch_for_t(idx, token_table, position_table, past_len):
        return token_table[idx] + position_table[past_len:past_len + count(idx)]

    assert not check_position_offset(batch_for_t)
    assert capsys.readouterr().out.endswith(
        "(len(idx) and idx.shape[0] count the rows of the batch, B)\n")


@pytest.mark.parametrize("wrong, hint", [
    (lambda M, L, B, h, d, b: M / (2 * L * B * h * d * b), "divide with //, which rounds down"),
    (lambda M, L, B, h, d, b: round(M / (2 * L * B * h * d * b)), "not to the nearest"),
    (lambda M, L, B, h, d, b: -(-M // (2 * L * B * h * d * b)), "round down, not up"),
    (lambda M, L, B, h, d, b: M // (L * B * h * d * b), "holds a key and a value"),
    (lambda M, L, B, h, d, b: M // (3 * L * B * h * d * b), "the factor is 2, not 3"),
    (lambda M, L, B, h, d, b: M // (2 * L * B * h * d), "memory_bytes counts bytes"),
    (lambda M, L, B, h, d, b: M // (2 * L * B * h * d * b * 8), "that would be bits"),
    (lambda M, L, B, h, d, b: M // (2 * L * h * d * b), "batch times as many bytes"),
    (lambda M, L, B, h, d, b: M // (2 * B * h * d * b), "num_layers times as many bytes"),
    (lambda M, L, B, h, d, b: M // (2 * L * B * d * b), "num_heads times as many bytes"),
    (lambda M, L, B, h, d, b: M // (2 * L * B * h * h * d * b), "num_heads counted twice"),
    (lambda M, L, B, h, d, b: M // (2 * L * B * h * b), "d_head times as many bytes"),
    (lambda M, L, B, h, d, b: 2 * L * B * h * d * b, "not the bytes of one position"),
])
def test_max_positions_mistakes_get_their_hint(wrong, hint, capsys):
    assert not check_max_positions(wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ case ") and "Hint: " in out
    assert hint in out.split("Hint: ", 1)[1]


def test_max_positions_is_zero_when_not_one_position_fits(capsys):
    assert not check_max_positions(lambda M, L, B, h, d, b: max(1, M // (2 * L * B * h * d * b)))
    assert capsys.readouterr().out.startswith(
        "✗ case 4: for input (100, 2, 1, 2, 4, 4) expected 0 but got 1")


# Found in review (2026-11-24): mistakes that got no hint, or another mistake's.
@pytest.mark.parametrize("wrong, hint", [
    (lambda L, B, h, T, d, b: 2 * L * B * h * d * b, "multiply by length"),
    (lambda L, B, h, T, d, b: 2 * L * B * h * T * d * b / 8, "do not divide by 8"),
    (lambda L, B, h, T, d, b: 2 * L * B * h * T * d * b / 2 ** 20, "turn it into MiB"),
])
def test_bytes_mistakes_found_in_review(wrong, hint, capsys):
    assert not check_cache_bytes(wrong)
    out = capsys.readouterr().out
    assert "Hint: " in out and hint in out.split("Hint: ", 1)[1]


def test_max_positions_without_d_head_is_not_told_about_bytes(capsys):
    # case 2 had d_head == bytes_per_number == 4, so leaving out d_head got the bytes hint
    assert not check_max_positions(lambda M, L, B, h, d, b: M // (2 * L * B * h * b))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 2:")
    assert "bytes_per_number" not in out.split("Hint: ", 1)[1]


@pytest.mark.parametrize("checker", [check_cache_bytes, check_max_positions])
def test_every_mistake_answers_case_2_differently(checker):
    # the checkers' comments promise it: whichever mistake a learner makes, the first case
    # that tells mistakes apart names that one
    args = checker.cases[1]
    answers = [round(float(wrong(*args)), 9) for wrong in checker.mistakes.values()]
    reference = round(float(checker.reference(*args)), 9)
    distinct = [a for a in answers if a != reference]
    assert len(set(distinct)) == len(distinct), dict(zip(checker.mistakes, answers))


# --- mistakes found by a learner's review of chapters 8-12 (issue 25) ------------------------

@pytest.mark.parametrize("batched, hint", [
    (False, "Hint: add the token vectors too: the positions say where each new token stands, "
            "token_table[idx] (B, T, d_model) says which token it is, and the sum keeps the "
            "batch dimension (the (T, d_model) positions broadcast over it)\n"),
    (True, "Hint: add the token vectors too: the positions say where each new token stands, "
           "token_table[idx] says which token it is; the input vector is their sum\n"),
], ids=["(T, d_model)", "(B, T, d_model)"])
def test_offset_with_the_positions_only(batched, hint, capsys):
    # learner review (issue 25): the positions alone, offset right, got no hint
    def positions_only(idx, token_table, position_table, past_len):
        positions = torch.arange(past_len, past_len + idx.shape[1])
        vectors = position_table[positions]                          # (T, d_model)
        return vectors.expand(idx.shape[0], -1, -1) if batched else vectors

    assert not check_position_offset(positions_only)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input ([[3]], ")
    assert out.endswith(hint)


# Issue 25: "how many bytes" is a whole number; a float of the right value used to pass.
@pytest.mark.parametrize("as_float", [
    lambda L, B, h, T, d, b: float(2 * L * B * h * T * d * b),
    lambda L, B, h, T, d, b: 2.0 * L * B * h * T * d * b,
    lambda L, B, h, T, d, b: torch.tensor(2 * L * B * h * T * d * b).float().item()])
def test_bytes_as_a_float_is_refused_with_the_whole_number_hint(as_float, capsys):
    assert not check_cache_bytes(as_float)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (1, 1, 1, 1, 1, 4) expected the whole number 8 but got the float "
        "8.0. Hint: a count is a whole number: return an int. Multiply whole numbers, and "
        "divide with //, which keeps an int, not /, which always gives a float\n")


def test_positions_as_floats_get_the_whole_number_hint_true_division_the_rounding_one(capsys):
    def divided(memory_bytes, num_layers, batch, num_heads, d_head, bytes_per_number):
        return memory_bytes / (2 * num_layers * batch * num_heads * d_head * bytes_per_number)

    assert not check_max_positions(divided)           # a fraction of a position in case 2
    assert "Hint: a position either fits or it does not" in capsys.readouterr().out
    assert not check_max_positions(lambda *args: float(my_max_positions(*args)))
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (1000, 1, 1, 1, 1, 4) expected the whole number "
                          "125 but got the float 125.0.")
    assert out.endswith("not /, which always gives a float\n")


def test_numpy_integers_count_as_whole_numbers(capsys):
    import numpy as np

    assert check_cache_bytes(lambda *args: np.int64(my_cache_bytes(*args)))
    assert check_cache_bytes(my_cache_bytes)
