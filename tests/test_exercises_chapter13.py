"""The checkers of chapter 13: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it, and each asserts the one
hint it should get.
"""

import pytest
import torch
import torch.nn.functional as F

import minitransformer
from minitransformer.bpe import bytes_to_unicode
from minitransformer.exercises import chapter13
from minitransformer.exercises.chapter13 import (
    check_byte_to_char,
    check_conv1d,
    check_fuse_qkv,
    check_parameter_count,
)
from minitransformer.gpt import GPT, GPTConfig, count_parameters

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_conv1d(x, weight, bias):
    return x @ weight + bias


def my_fuse_qkv(q_weight, k_weight, v_weight):
    fused = torch.cat([q_weight, k_weight, v_weight], dim=0)
    return fused.t()


def my_gpt2_parameter_count(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    embeddings = vocab_size * d + context_length * d
    norms = 2 * (2 * d)
    attention = 4 * (d * d + d)
    feed_forward = (d * d_ff + d_ff) + (d_ff * d + d)
    return embeddings + num_layers * (norms + attention + feed_forward) + 2 * d


def my_byte_to_char(b):
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    others = [c for c in range(256) if c not in printable]
    return chr(256 + others.index(b))


CHECKERS = {
    "conv1d": (check_conv1d, my_conv1d),
    "fuse_qkv": (check_fuse_qkv, my_fuse_qkv),
    "parameter_count": (check_parameter_count, my_gpt2_parameter_count),
    "byte_to_char": (check_byte_to_char, my_byte_to_char),
}


def test_module_exports_every_checker():
    assert sorted(chapter13.__all__) == sorted(
        f"check_{name}" for name in CHECKERS)
    assert not set(chapter13.__all__) & set(minitransformer.__all__)


@pytest.mark.parametrize("name", CHECKERS)
def test_accepts_the_book_solution(name, capsys):
    checker, solution = CHECKERS[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def test_accepts_other_correct_forms(capsys):
    assert check_conv1d(lambda x, w, b: F.linear(x, w.t(), b))
    assert check_conv1d(lambda x, w, b: torch.addmm(b, x.reshape(-1, x.shape[-1]), w)
                        .reshape(*x.shape[:-1], -1))
    assert check_fuse_qkv(lambda q, k, v: torch.cat([q.t(), k.t(), v.t()], dim=1))
    assert check_fuse_qkv(lambda q, k, v: torch.cat([q, k, v]).T.contiguous())
    assert check_parameter_count(
        lambda n, t, layers, d, f: n * d + t * d + layers * (4 * d * d + 2 * d * f + 9 * d + f)
        + 2 * d)
    table = bytes_to_unicode()
    assert check_byte_to_char(lambda b: table[b])
    assert capsys.readouterr().out.count("✓") == 6


def test_the_parameter_count_is_the_models():
    """The reference agrees with our GPT and with GPT-2 small's published size."""
    reference = check_parameter_count.reference
    for v, t, n, d, f in [(100, 32, 2, 64, 256), (1000, 64, 3, 16, 40)]:
        model = GPT(GPTConfig(vocab_size=v, context_length=t, num_layers=n, num_heads=2,
                              d_model=d, d_ff=f), device="meta")
        assert reference(v, t, n, d, f) == count_parameters(model)
    assert reference(50257, 1024, 12, 768, 3072) == 124_439_808
    assert (50257, 1024, 12, 768, 3072) in check_parameter_count.cases


def test_the_conv1d_reference_is_gpt2s_layer():
    transformers = pytest.importorskip("transformers")
    layer = transformers.pytorch_utils.Conv1D(5, 3)  # nf = out, nx = in
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(2, 4, 3)
    with torch.no_grad():
        torch.testing.assert_close(check_conv1d.reference(x, layer.weight, layer.bias),
                                   layer(x))


def _hint(checker, wrong, capsys):
    assert not checker(wrong)
    out = capsys.readouterr().out
    assert "Hint: " in out, out
    return out.split("Hint: ", 1)[1].rstrip("\n")


def _assert_hint(checker, wrong, fragment, capsys):
    """The learner's wrong answer gets exactly the one hint that contains fragment."""
    hints = [hint for hint in checker.mistakes if fragment in hint]
    assert len(hints) == 1, (fragment, hints)
    assert _hint(checker, wrong, capsys) == hints[0]


# --- my_conv1d ----------------------------------------------------------------------------------

def _as_linear(x, weight, bias):
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
        return layer(x)


@pytest.mark.parametrize("wrong, fragment", [
    (lambda x, w, b: F.linear(x, w, b), "no transpose"),
    (lambda x, w, b: x @ w.T + b, "no transpose"),
    (lambda x, w, b: torch.matmul(x, w.transpose(0, 1)) + b, "no transpose"),
    (_as_linear, "no transpose"),
    (lambda x, w, b: x @ w, "add the bias: y"),
    (lambda x, w, b: torch.matmul(x + b, w), "not to x"),
    (lambda x, w, b: x * w + b, "entry by entry"),
    (lambda x, w, b: torch.mm(x, w) + b, "torch.mm takes only matrices"),
    (lambda x, w, b: w @ x + b, "the input comes first"),
], ids=["F.linear", "x @ w.T", "matmul w.transpose", "nn.Linear", "no bias", "bias first",
        "elementwise", "torch.mm", "w @ x"])
def test_conv1d_hints(wrong, fragment, capsys):
    _assert_hint(check_conv1d, wrong, fragment, capsys)


def test_conv1d_first_case_is_square_and_second_is_batched():
    """A forgotten transpose gives numbers, not an error, on the first case; torch.mm only
    fails on a batch."""
    x, w, _ = check_conv1d.cases[0]
    assert w.shape[0] == w.shape[1] and x.ndim == 2
    assert check_conv1d.cases[1][0].ndim == 3


# --- my_fuse_qkv --------------------------------------------------------------------------------

def _interleaved(q, k, v):
    d = q.shape[0]
    out = torch.empty(d, 3 * d)
    for j in range(d):
        out[:, 3 * j], out[:, 3 * j + 1], out[:, 3 * j + 2] = q[j], k[j], v[j]
    return out


@pytest.mark.parametrize("wrong, fragment", [
    (lambda q, k, v: torch.cat((q, k, v)), "transpose the result into (d, 3d)"),
    (lambda q, k, v: torch.cat([q, k, v], dim=-1), "side by side along dim 1"),
    (lambda q, k, v: torch.cat([q, k, v]).view(q.shape[0], 3 * q.shape[0]), "reshape keeps"),
    (_interleaved, "not interleaved"),
    (lambda q, k, v: torch.cat([q.t(), k.t(), v.t()]), "join the transposed weights along dim 1"),
    (lambda q, k, v: torch.cat([q, k, v], dim=1).t(), "join the transposed weights along dim 1"),
    (lambda q, k, v: torch.stack([q, k, v], dim=0), "a new dimension, (3, d, d)"),
    (lambda q, k, v: torch.cat([k, q, v]).t(), "key's outputs come second"),
    (lambda q, k, v: torch.cat([v.t(), k.t(), q.t()], dim=1), "value's outputs come last"),
], ids=["no transpose", "dim 1", "view", "interleaved", "cat of .t() on dim 0",
        "dim 1 then .t()", "stack", "k q v", "v k q"])
def test_fuse_qkv_hints(wrong, fragment, capsys):
    _assert_hint(check_fuse_qkv, wrong, fragment, capsys)


def test_fuse_qkv_inverts_the_loader():
    """What the chapter's loader does to c_attn, .t().chunk(3), gives the three weights back."""
    for q, k, v in check_fuse_qkv.cases:
        parts = check_fuse_qkv.reference(q, k, v).t().chunk(3)
        assert all(torch.equal(a, b) for a, b in zip(parts, (q, k, v)))


# --- my_gpt2_parameter_count --------------------------------------------------------------------

def _without(**leave_out):
    def wrong(vocab_size, context_length, num_layers, d_model, d_ff):
        d, f = d_model, d_ff
        total = vocab_size * d
        if not leave_out.get("positions"):
            total += context_length * d
        if leave_out.get("head_twice"):
            total += vocab_size * d
        if leave_out.get("head_bias"):
            total += vocab_size
        width = 4 * d if leave_out.get("four_d") else f
        block = 4 * d * d + 2 * d * width
        if not leave_out.get("biases"):
            block += width + d
            if not leave_out.get("attention_biases"):
                block += 4 * d
        norm = d if leave_out.get("norm_bias") else 2 * d
        block += {"one": 1, "none": 0}.get(leave_out.get("block_norms"), 2) * norm
        if leave_out.get("three_projections"):
            block -= d * d + d
        layers = 1 if leave_out.get("one_block") else num_layers
        return total + layers * block + (0 if leave_out.get("final_norm") else norm)
    return wrong


@pytest.mark.parametrize("leave_out, fragment", [
    ({"positions": True}, "position table"),
    ({"head_twice": True}, "counted once"),
    ({"head_bias": True}, "head has no bias"),
    ({"biases": True}, "every linear layer has a bias"),
    ({"attention_biases": True}, "4 * d_model numbers per block"),
    ({"block_norms": "none"}, "4 * d_model numbers per block"),
    ({"norm_bias": True}, "a weight and a bias"),
    ({"block_norms": "one"}, "each block has two layer norms"),
    ({"final_norm": True}, "(ln_f): 2 * d_model more"),
    ({"three_projections": True}, "c_attn holds three"),
    ({"four_d": True}, "not always 4 * d_model"),
    ({"one_block": True}, "multiply one block's count"),
], ids=lambda value: "-".join(map(str, value)) if isinstance(value, dict) else None)
def test_parameter_count_hints(leave_out, fragment, capsys):
    _assert_hint(check_parameter_count, _without(**leave_out), fragment, capsys)


def test_parameter_count_written_with_twelve_d_squared(capsys):
    """12 d^2 + 13 d per block is right only when d_ff = 4 d: the d_ff hint says so."""
    def wrong(v, t, n, d, f):
        return v * d + t * d + n * (12 * d * d + 13 * d) + 2 * d
    _assert_hint(check_parameter_count, wrong, "not always 4 * d_model", capsys)


# --- my_byte_to_char ----------------------------------------------------------------------------

def _printable_as(printable):
    def wrong(b):
        if b in printable:
            return chr(b)
        n = 0
        for c in range(b):
            if c not in printable:
                n += 1
        return chr(256 + n)
    return wrong


def _moved_by_value(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        return chr(b)
    return chr(256 + b)


def _counted_from_one(b):
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    return chr(256 + sum(c not in printable for c in range(b + 1)))


def _the_number(b):
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return b
    return 256 + [c for c in range(256) if c not in printable].index(b)


@pytest.mark.parametrize("wrong, fragment", [
    (_printable_as([*range(32, 127), *range(161, 173), *range(174, 256)]), "a space (byte 32)"),
    (chr, "only the printable bytes stand for themselves"),
    (_moved_by_value, "numbered among themselves"),
    (_counted_from_one, "count from 0"),
    (_printable_as([*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("ÿ") + 1)]),
     "soft hyphen"),
    (_printable_as([*range(33, 128), *range(161, 173), *range(174, 256)]), "DEL"),
    (_printable_as([*range(33, 126), *range(161, 172), *range(174, 255)]),
     "range(a, b) stops before b"),
    (_the_number, "return the character"),
], ids=["space printable", "chr", "by value", "from one", "soft hyphen", "DEL", "ranges short",
        "number"])
def test_byte_to_char_hints(wrong, fragment, capsys):
    _assert_hint(check_byte_to_char, wrong, fragment, capsys)


def test_byte_to_char_checks_every_byte():
    """The nine checks together run all 256 bytes, each once."""
    checked = [b for group in check_byte_to_char.cases for b in group]
    assert sorted(checked) == list(range(256))


def test_a_rule_off_only_for_bytes_128_to_160_fails():
    """Issue 29: a rule right for the nine bytes checked before, wrong for 128-160."""
    assert not check_byte_to_char.run(_dels_place_forgotten)


def test_a_float_count_fails_even_when_its_value_is_right(capsys):
    def my_gpt2_parameter_count(vocab_size, context_length, num_layers, d_model, d_ff):
        return float(check_parameter_count.reference(vocab_size, context_length, num_layers,
                                                     d_model, d_ff))

    assert not check_parameter_count(my_gpt2_parameter_count)
    assert "expected the whole number 568 but got the float 568.0" in capsys.readouterr().out


def test_mistakes_alike_at_d_4_get_their_own_hints():
    """Issue 29: at d_model 4 and d_ff 16 a feed-forward without biases gives the count of a
    missing projection, and a missing c_proj bias that of a missing final norm."""
    for learner, listed in [(_count(ff_biases=0), "three projections"),
                            (_count(attention_biases=3), "final norm")]:
        message = check_parameter_count.run(learner).message
        case = check_parameter_count.cases[0]
        assert learner(*case) == check_parameter_count.mistakes[next(
            h for h in check_parameter_count.mistakes
            if ("c_attn holds three" if listed == "three projections" else "(ln_f): 2")
            in h)](*case)
        assert "c_attn holds three" not in message and "(ln_f): 2 * d_model more" not in message


# --- a catalogue of typical wrong answers, each with the hint it must get --------------------
# Written as a learner writes them. ``None``: a mistake no hint names; it must still fail, and
# get no hint at all rather than another mistake's. The share named is measured below.

def _learner_linear(x, weight, bias):
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0])
    layer.weight.data = weight
    layer.bias.data = bias
    return layer(x).detach()


def _loop_interleaved(q, k, v):
    columns = []
    for j in range(q.shape[0]):
        columns += [q[j], k[j], v[j]]
    return torch.stack(columns, dim=1)


def _count_float(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    block = 2 * 2 * d + 4 * (d ** 2.0 + d) + 2 * d * d_ff + d_ff + d
    return vocab_size * d + context_length * d + num_layers * block + 2 * d


def _count(**leave_out):
    """A learner's count with one piece written differently."""
    def my_gpt2_parameter_count(vocab_size, context_length, num_layers, d_model, d_ff):
        d, f = d_model, d_ff
        attention = 4 * d * d + leave_out.get("attention_biases", 4) * d
        feed_forward = d * f + f * d + leave_out.get("ff_biases", f + d)
        norms = 2 * 2 * d
        block = attention + feed_forward + norms
        total = vocab_size * d + context_length * d + num_layers * block + 2 * d
        return total - leave_out.get("minus", lambda v, t, n, d, f: 0)(
            vocab_size, context_length, num_layers, d_model, d_ff)
    return my_gpt2_parameter_count


def _dels_place_forgotten(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        return chr(b)
    if b < 33:
        return chr(256 + b)
    if b == 127:
        return chr(256 + 33)
    if b == 173:
        return chr(256 + 67)
    return chr(256 + 33 + (b - 128))            # as if DEL were not moved


def _soft_hyphen_written_in(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
        return chr(b)
    if b == 173:
        return chr(256 + 68)                    # counted, by hand, one too many
    return chr(256 + [c for c in range(256) if not (33 <= c <= 126 or 161 <= c <= 172
                                                    or 174 <= c <= 255)].index(b))


def _every_byte_counted(b):
    n = 0
    for c in range(256):
        if c == b:
            return chr(c) if c.bit_length() and chr(c).isprintable() and c != 32 \
                and c != 173 else chr(256 + n)
        n += 1


def _isprintable(b):
    printable = [c for c in range(256) if chr(c).isprintable()]
    if b in printable:
        return chr(b)
    return chr(256 + [c for c in range(256) if c not in printable].index(b))


CATALOGUE = [
    # my_conv1d
    ("conv1d F.linear", check_conv1d, lambda x, w, b: F.linear(x, w, b), "no transpose"),
    ("conv1d w.T", check_conv1d, lambda x, w, b: x @ w.T + b, "no transpose"),
    ("conv1d matmul t()", check_conv1d, lambda x, w, b: torch.matmul(x, w.t()) + b,
     "no transpose"),
    ("conv1d nn.Linear", check_conv1d, _learner_linear, "no transpose"),
    ("conv1d no bias", check_conv1d, lambda x, w, b: x @ w, "add the bias: y"),
    ("conv1d bias on x", check_conv1d, lambda x, w, b: (x + b) @ w, "not to x"),
    ("conv1d *", check_conv1d, lambda x, w, b: x * w + b, "entry by entry"),
    ("conv1d mm", check_conv1d, lambda x, w, b: torch.mm(x, w) + b, "torch.mm takes only"),
    ("conv1d w @ x", check_conv1d, lambda x, w, b: w @ x + b, "the input comes first"),
    ("conv1d einsum", check_conv1d, lambda x, w, b: torch.einsum("bi,io->bo", x, w) + b,
     "an einsum over"),
    ("conv1d sum over outputs", check_conv1d,
     lambda x, w, b: (x.unsqueeze(-1) * w).sum(dim=-1) + b, "sums over the inputs"),
    ("conv1d minus bias", check_conv1d, lambda x, w, b: x @ w - b, "do not subtract"),
    # my_fuse_qkv
    ("fuse no transpose", check_fuse_qkv, lambda q, k, v: torch.cat((q, k, v)),
     "transpose the result into (d, 3d)"),
    ("fuse vstack", check_fuse_qkv, lambda q, k, v: torch.vstack([q, k, v]),
     "transpose the result into (d, 3d)"),
    ("fuse dim -1", check_fuse_qkv, lambda q, k, v: torch.cat([q, k, v], dim=-1),
     "side by side along dim 1"),
    ("fuse hstack", check_fuse_qkv, lambda q, k, v: torch.hstack([q, k, v]),
     "side by side along dim 1"),
    ("fuse view", check_fuse_qkv,
     lambda q, k, v: torch.cat([q, k, v]).view(q.shape[0], 3 * q.shape[0]), "reshape keeps"),
    ("fuse interleaved", check_fuse_qkv, _loop_interleaved, "not interleaved"),
    ("fuse t() on dim 0", check_fuse_qkv, lambda q, k, v: torch.cat([q.t(), k.t(), v.t()]),
     "join the transposed weights along dim 1"),
    ("fuse stack", check_fuse_qkv, lambda q, k, v: torch.stack([q, k, v]),
     "torch.stack adds a new dimension, (3, d, d)"),
    ("fuse stack dim 1", check_fuse_qkv, lambda q, k, v: torch.stack([q, k, v], dim=1),
     "(d, 3, d) is not"),
    ("fuse stack dim 2", check_fuse_qkv,
     lambda q, k, v: torch.stack([q, k, v], dim=2).reshape(q.shape[0], -1),
     "before joining them"),
    ("fuse k q v", check_fuse_qkv, lambda q, k, v: torch.cat([k, q, v]).t(),
     "key's outputs come second"),
    ("fuse v k q", check_fuse_qkv, lambda q, k, v: torch.cat([v.t(), k.t(), q.t()], dim=1),
     "value's outputs come last"),
    ("fuse k v q", check_fuse_qkv, lambda q, k, v: torch.cat([k, v, q]).T,
     "query's outputs come first"),
    ("fuse sum", check_fuse_qkv, lambda q, k, v: (q + k + v).T, "a sum mixes"),
    # my_gpt2_parameter_count
    ("count no positions", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: t * d), "position table"),
    ("count head twice", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: -v * d), "counted once"),
    ("count head bias", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: -v), "head has no bias"),
    ("count no biases", check_parameter_count, _count(attention_biases=0, ff_biases=0),
     "every linear layer has a bias"),
    ("count no attention biases", check_parameter_count, _count(attention_biases=0),
     "4 * d_model numbers per block"),
    ("count no block norms", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: n * 4 * d), "4 * d_model numbers per block"),
    ("count feed-forward without biases", check_parameter_count, _count(ff_biases=0),
     "the feed-forward's two linear layers have biases"),
    ("count c_proj without bias", check_parameter_count, _count(attention_biases=3),
     "(c_proj) has a bias too"),
    ("count second bias d_ff", check_parameter_count,
     _count(ff_biases=None) if False else _count(minus=lambda v, t, n, d, f: n * (d - f)),
     "one number per output"),
    ("count one matrix", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: n * d * f), "two matrices"),
    ("count norm without bias", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: n * 2 * d + d), "a weight and a bias"),
    ("count one norm per block", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: n * 2 * d), "each block has two layer norms"),
    ("count no final norm", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: 2 * d), "(ln_f): 2 * d_model more"),
    ("count three norms a block", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: 2 * d - n * 2 * d), "comes once, after the last"),
    ("count three projections", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: n * (d * d + d)), "c_attn holds three"),
    ("count 4 d", check_parameter_count,
     lambda v, t, n, d, f: v * d + t * d + n * (12 * d * d + 13 * d) + 2 * d,
     "not always 4 * d_model"),
    ("count one block", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: (n - 1) * (12 * d * d - 8 * d * d + 2 * d * f + 9 * d
                                                   + f)), "multiply one block's count"),
    ("count float", check_parameter_count, _count_float, "a count is a whole number"),
    ("count no positions, no final norm", check_parameter_count,
     _count(minus=lambda v, t, n, d, f: t * d + 2 * d), None),
    # my_byte_to_char
    ("byte chr", check_byte_to_char, chr, "only the printable bytes stand for themselves"),
    ("byte latin-1", check_byte_to_char, lambda b: bytes([b]).decode("latin-1"),
     "only the printable bytes stand for themselves"),
    ("byte isprintable", check_byte_to_char, _isprintable, "a space (byte 32)"),
    ("byte soft hyphen", check_byte_to_char,
     _printable_as([*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("ÿ") + 1)]),
     "soft hyphen"),
    ("byte DEL", check_byte_to_char,
     _printable_as([*range(33, 128), *range(161, 173), *range(174, 256)]), "DEL"),
    ("byte 128-160 printable", check_byte_to_char,
     _printable_as([*range(33, 127), *range(128, 173), *range(174, 256)]),
     "the second range starts at"),
    ("byte by value", check_byte_to_char, _moved_by_value, "numbered among themselves"),
    ("byte counter for every byte", check_byte_to_char, _every_byte_counted,
     "numbered among themselves"),
    ("byte from one", check_byte_to_char, _counted_from_one, "count from 0"),
    ("byte ranges short", check_byte_to_char,
     _printable_as([*range(33, 126), *range(161, 172), *range(174, 255)]),
     "range(a, b) stops before b"),
    ("byte number", check_byte_to_char, _the_number, "return the character"),
    ("byte 128-160 off by one", check_byte_to_char, _dels_place_forgotten,
     "bytes 128 to 160 are numbered 1 too low"),
    ("byte 173 off by one", check_byte_to_char, _soft_hyphen_written_in,
     "byte 173 is numbered 1 too high"),
]


def _message(checker, wrong):
    verdict = checker.run(wrong)
    assert not verdict, "a wrong answer passed"
    assert "\n" not in verdict.message
    return verdict.message


@pytest.mark.parametrize("name, checker, wrong, fragment", CATALOGUE,
                         ids=[entry[0] for entry in CATALOGUE])
def test_catalogue(name, checker, wrong, fragment):
    message = _message(checker, wrong)
    if fragment is None:
        assert "Hint: " not in message, message
        return
    assert "Hint: " in message, message
    hint = message.split("Hint: ", 1)[1]
    listed = [h for h in checker.mistakes if fragment in h]
    assert len(listed) <= 1, (fragment, listed)
    assert fragment in hint, (fragment, message)
    if listed:
        assert hint == listed[0]


def test_catalogue_coverage():
    """At least 90% of the catalogue's wrong answers get a hint that names them; every
    exercise has at least eight."""
    named = sum(fragment is not None for *_, fragment in CATALOGUE)
    share = named / len(CATALOGUE)
    print(f"chapter 13: {named} of {len(CATALOGUE)} typical mistakes named ({share:.0%})")
    assert share >= 0.9
    for checker in (check_conv1d, check_fuse_qkv, check_parameter_count, check_byte_to_char):
        assert sum(entry[1] is checker for entry in CATALOGUE) >= 8


# --- issue 40: the wrong type, and answers that cannot be trained through ---------------------

def test_a_parameter_count_as_a_numpy_integer_fails_with_its_hint(capsys):
    import numpy as np

    def count(vocab_size, context_length, num_layers, d_model, d_ff):
        return np.int64(check_parameter_count.reference(vocab_size, context_length, num_layers,
                                                        d_model, d_ff))
    assert _hint(check_parameter_count, count, capsys).startswith("return a Python int")


def test_a_conv1d_under_no_grad_fails_with_the_gradient_hint(capsys):
    def my_conv1d(x, weight, bias):
        with torch.no_grad():
            return x @ weight + bias
    assert "does not carry a gradient" in _hint(check_conv1d, my_conv1d, capsys)


def test_a_byte_at_a_ranges_end_is_named(capsys):
    printable = [*range(33, 126), *range(161, 173), *range(174, 256)]      # '~' left out
    moved = [b for b in range(256) if b not in printable]

    def my_byte_to_char(b):
        return chr(b) if b in printable else chr(256 + moved.index(b))
    hint = _hint(check_byte_to_char, my_byte_to_char, capsys)
    assert hint.startswith("byte 126 ('~') is moved")
