"""The checkers of chapter 19: they accept correct answers, agree with the package's own
quantisers, and explain plausible wrong ones. Each wrong answer is written the way a learner
would write it, and each hint is asserted at least once."""

import pytest
import torch

from minitransformer.exercises import chapter19
from minitransformer.exercises.chapter19 import (check_q4_1_bytes, check_q8_0_block,
                                                 check_unpack_nibbles)
from minitransformer.gguf import GGML_TYPES
from minitransformer.quantize import quantize_q4_1, quantize_q8_0


def my_q8_0_block(x):
    d = x.abs().max() / 127
    if d == 0:
        return d, torch.zeros(32, dtype=torch.int8)
    v = x / d
    return d, (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)


def my_unpack_nibbles(packed):
    packed = packed.to(torch.int64)
    return torch.cat([packed & 0x0F, packed >> 4])


def my_q4_1_bytes(n):
    return n // 32 * (2 + 2 + 16)


def test_correct_answers_pass():
    assert check_q8_0_block.run(my_q8_0_block)
    assert check_unpack_nibbles.run(my_unpack_nibbles)
    assert check_unpack_nibbles.run(lambda p: torch.cat([p % 16, p // 16]).long())
    assert check_q4_1_bytes.run(my_q4_1_bytes)
    assert check_q4_1_bytes.run(lambda n: 20 * (n // 32))


def test_the_references_are_the_package_and_ggml():
    g = torch.Generator().manual_seed(0)
    for (x,) in [*chapter19._q8_0_cases()[:3], (torch.randn(32, generator=g) * 5,)]:
        _, q = chapter19._q8_0_block(x)
        assert torch.equal(quantize_q8_0(x)[2:].view(torch.int8), q)
    x = torch.randn(32, generator=g)
    raw = quantize_q4_1(x)
    q = torch.trunc((x - x.min()) / ((x.max() - x.min()) / 15) + 0.5).clamp(0, 15).long()
    assert torch.equal(chapter19._unpack(raw[4:]), q)
    q4_1 = next(t for t in GGML_TYPES.values() if t.name == "Q4_1")
    assert chapter19._q4_1_bytes(576 * 1536) == 576 * 1536 // q4_1.block_size * q4_1.type_size


def rounded(v):
    return (torch.sign(v) * torch.floor(v.abs() + 0.5)).to(torch.int8)


def scaled(x, d, rounding=rounded):
    return d, rounding(x / d)


@pytest.mark.parametrize("checker, wrong, hint", [
    (check_q8_0_block, lambda x: scaled(x, x.abs().max() / 127,
                                        lambda v: torch.round(v).to(torch.int8)),
     "torch.round rounds them to the even"),
    (check_q8_0_block, lambda x: scaled(x, x.abs().max() / 127, lambda v: v.to(torch.int8)),
     "truncate"),
    (check_q8_0_block, lambda x: scaled(x, x.abs().max() / 128), "int8's -128 stays unused"),
    (check_q8_0_block, lambda x: scaled(x, x.abs().max() / 255), "not 255"),
    (check_q8_0_block, lambda x: scaled(x, x.max() / 127), "x.max() misses"),
    (check_unpack_nibbles, lambda p: torch.stack([p.long() & 15, p.long() >> 4], 1).reshape(-1),
     "side by side"),
    (check_unpack_nibbles, lambda p: torch.cat([p.long() >> 4, p.long() & 15]),
     "low nibbles (byte & 0x0F) come first"),
    (check_unpack_nibbles, lambda p: torch.cat([p.long() & 15, p.long() & 0xF0]),
     "keeps it in place"),
    (check_unpack_nibbles, lambda p: torch.cat([p.long() & 255, p.long() >> 8]),
     "not 8 bits"),
    (check_q4_1_bytes, lambda n: n // 32 * 18, "Q4_0 has d alone"),
    (check_q4_1_bytes, lambda n: n // 32 * 24, "not float32's 4"),
    (check_q4_1_bytes, lambda n: n // 32 * 36, "32 values take 16 bytes"),
    (check_q4_1_bytes, lambda n: n // 2, "counts the values alone"),
    (check_q4_1_bytes, lambda n: n // 2 + 4, "not once for the whole tensor"),
    (check_q4_1_bytes, lambda n: n / 32 * 20, "return an int"),
])
def test_wrong_answers_fail_with_their_hint(checker, wrong, hint):
    verdict = checker.run(wrong)
    assert not verdict and hint in verdict.message, verdict.message


def test_the_stubs_are_not_implemented():
    def stub(*args):
        raise NotImplementedError
    for checker in (check_q8_0_block, check_unpack_nibbles, check_q4_1_bytes):
        assert "not implemented yet" in checker.run(stub).message
