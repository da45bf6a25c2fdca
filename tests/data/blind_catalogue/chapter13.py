"""Wrong answers to the exercises of chapter 13 (your GPT is GPT-2), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
"""

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# 13.1  my_conv1d(x, weight, bias)
# ---------------------------------------------------------------------------


def conv1d_linear_habit(x, weight, bias):
    return x @ weight.T + bias               # nn.Linear's layout: right only if square


def conv1d_f_linear(x, weight, bias):
    return F.linear(x, weight, bias)         # F.linear transposes the weight


def conv1d_no_bias(x, weight, bias):
    return x @ weight


def conv1d_flattened(x, weight, bias):
    return x.reshape(-1, x.shape[-1]) @ weight + bias   # leading dims not restored


def conv1d_mm(x, weight, bias):
    return torch.mm(x, weight) + bias        # 2-D inputs only


def conv1d_bias_first(x, weight, bias):
    return (x + bias) @ weight               # bias on the input side


def conv1d_no_grad(x, weight, bias):
    with torch.no_grad():                    # "it is only a layer"
        return x @ weight + bias


def conv1d_numpy(x, weight, bias):
    return x.detach().numpy() @ weight.detach().numpy() + bias.detach().numpy()


def conv1d_float64(x, weight, bias):
    return x.double() @ weight.double() + bias.double()


def conv1d_transposed_output(x, weight, bias):
    return weight.T @ x.T + bias[:, None]    # (out, N): the result's layout transposed


# ---------------------------------------------------------------------------
# 13.2  my_fuse_qkv(q_weight, k_weight, v_weight)
# ---------------------------------------------------------------------------


def fuse_cat_dim1_untransposed(q_weight, k_weight, v_weight):
    return torch.cat([q_weight, k_weight, v_weight], dim=1)   # (d, 3d), not transposed


def fuse_no_transpose(q_weight, k_weight, v_weight):
    return torch.cat([q_weight, k_weight, v_weight], dim=0)   # (3d, d)


def fuse_wrong_order(q_weight, k_weight, v_weight):
    return torch.cat([k_weight, q_weight, v_weight], dim=0).t()


def fuse_stack(q_weight, k_weight, v_weight):
    return torch.stack([q_weight.t(), k_weight.t(), v_weight.t()])   # (3, d, d)


def fuse_interleaved(q_weight, k_weight, v_weight):
    d = q_weight.shape[0]                    # columns q0 k0 v0 q1 k1 v1 ...
    return torch.stack([q_weight.t(), k_weight.t(), v_weight.t()], dim=-1).reshape(d, 3 * d)


def fuse_transposed_rows(q_weight, k_weight, v_weight):
    return torch.cat([q_weight.t(), k_weight.t(), v_weight.t()], dim=0)   # (3d, d)


def fuse_in_place_transpose(q_weight, k_weight, v_weight):
    for w in (q_weight, k_weight, v_weight):
        w.t_()                               # the caller's tensors are transposed
    return torch.cat([q_weight, k_weight, v_weight], dim=1)


def fuse_reshape_not_transpose(q_weight, k_weight, v_weight):
    d = q_weight.shape[0]
    return torch.cat([q_weight, k_weight, v_weight], dim=0).reshape(d, 3 * d)


def fuse_numpy(q_weight, k_weight, v_weight):
    arrays = [w.detach().numpy() for w in (q_weight, k_weight, v_weight)]
    return np.concatenate(arrays, axis=0).T


def fuse_reversed(q_weight, k_weight, v_weight):
    return torch.cat([v_weight, k_weight, q_weight], dim=0).t()


# ---------------------------------------------------------------------------
# 13.3  my_gpt2_parameter_count(vocab_size, context_length, num_layers, d_model, d_ff)
# ---------------------------------------------------------------------------


def _block(d, d_ff):
    return 2 * (2 * d) + 4 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)


def count_untied_head(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model                              # the head counted a second time
    return 2 * vocab_size * d + context_length * d + num_layers * _block(d, d_ff) + 2 * d


def count_no_final_norm(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    return vocab_size * d + context_length * d + num_layers * _block(d, d_ff)


def count_norms_without_bias(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    block = 2 * d + 4 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
    return vocab_size * d + context_length * d + num_layers * block + d


def count_attention_without_bias(vocab_size, context_length, num_layers, d_model,
                                 d_ff):
    d = d_model
    block = 4 * d + 4 * d * d + (d * d_ff + d_ff) + (d_ff * d + d)
    return vocab_size * d + context_length * d + num_layers * block + 2 * d


def count_three_attention_linears(vocab_size, context_length, num_layers, d_model,
                                  d_ff):
    d = d_model                              # the output projection forgotten
    block = 4 * d + 3 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
    return vocab_size * d + context_length * d + num_layers * block + 2 * d


def count_no_positions(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model                              # "positions are not parameters"
    return vocab_size * d + num_layers * _block(d, d_ff) + 2 * d


def count_assumes_4d(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model                              # 12 d^2 + 13 d: only when d_ff = 4 d
    return vocab_size * d + context_length * d + num_layers * (12 * d * d + 13 * d) + 2 * d


def count_float(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    ratio = d_ff / d                         # a float creeps in
    block = 4 * d + 4 * (d * d + d) + 2 * ratio * d * d + d_ff + d
    return vocab_size * d + context_length * d + num_layers * block + 2 * d


def count_final_norm_per_layer(vocab_size, context_length, num_layers, d_model,
                               d_ff):
    d = d_model
    return vocab_size * d + context_length * d + num_layers * (_block(d, d_ff) + 2 * d)


def count_numpy_int(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    shapes = [(vocab_size, d), (context_length, d), (2 * d,)]
    for _ in range(num_layers):
        shapes += [(2 * d,), (2 * d,), (d, d), (d,), (d, d), (d,), (d, d), (d,),
                   (d, d), (d,), (d, d_ff), (d_ff,), (d_ff, d), (d,)]
    return sum(np.prod(s) for s in shapes)   # a numpy integer, not an int


def count_ff_one_bias(vocab_size, context_length, num_layers, d_model, d_ff):
    d = d_model
    block = 4 * d + 4 * (d * d + d) + 2 * d * d_ff + d   # the d_ff bias forgotten
    return vocab_size * d + context_length * d + num_layers * block + 2 * d


# ---------------------------------------------------------------------------
# 13.4  my_byte_to_char(b)
# ---------------------------------------------------------------------------

_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]


def byte_offset_by_value(b):
    if b in _PRINTABLE:
        return chr(b)
    return chr(256 + b)                      # right up to 32, wrong from 127 on


def byte_soft_hyphen_printable(b):
    printable = [*range(33, 127), *range(161, 256)]   # 173 kept
    if b in printable:
        return chr(b)
    others = [c for c in range(256) if c not in printable]
    return chr(256 + others.index(b))


def byte_tilde_excluded(b):
    printable = [*range(33, 126), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    others = [c for c in range(256) if c not in printable]
    return chr(256 + others.index(b))


def byte_space_printable(b):
    printable = [*range(32, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    others = [c for c in range(256) if c not in printable]
    return chr(256 + others.index(b))


def byte_not_sign_excluded(b):
    printable = [*range(33, 127), *range(161, 172), *range(174, 256)]
    if b in printable:
        return chr(b)
    others = [c for c in range(256) if c not in printable]
    return chr(256 + others.index(b))


def byte_off_by_one(b):
    if b in _PRINTABLE:
        return chr(b)
    others = [c for c in range(256) if c not in _PRINTABLE]
    return chr(256 + others.index(b) + 1)   # numbered from 1


def byte_returns_code_point(b):
    if b in _PRINTABLE:
        return b                             # the number, not the character
    others = [c for c in range(256) if c not in _PRINTABLE]
    return 256 + others.index(b)


def byte_identity(b):
    return chr(b)                            # every byte stands for itself


def byte_isprintable(b):
    if chr(b).isprintable():                 # space counts as printable
        return chr(b)
    others = [c for c in range(256) if not chr(c).isprintable()]
    return chr(256 + others.index(b))


def byte_piecewise_segments(b):
    if b in _PRINTABLE:
        return chr(b)
    if b < 33:
        return chr(256 + b)
    if b <= 160:
        return chr(256 + b - 127)            # restarts the count: forgets the first 33
    return chr(256 + 67)


WRONG_ANSWERS = [
    ("13.1", "check_conv1d", "x @ W^T + b (nn.Linear habit): right only if square",
     conv1d_linear_habit),
    ("13.1", "check_conv1d", "F.linear(x, W, b): transposes the (in, out) weight",
     conv1d_f_linear),
    ("13.1", "check_conv1d", "bias forgotten", conv1d_no_bias),
    ("13.1", "check_conv1d", "leading dimensions flattened and not restored",
     conv1d_flattened),
    ("13.1", "check_conv1d", "torch.mm: fails on (B, T, in)", conv1d_mm),
    ("13.1", "check_conv1d", "bias added to x before the product", conv1d_bias_first),
    ("13.1", "check_conv1d", "under torch.no_grad: no gradient", conv1d_no_grad),
    ("13.1", "check_conv1d", "numpy arrays", conv1d_numpy),
    ("13.1", "check_conv1d", "float64 result", conv1d_float64),
    ("13.1", "check_conv1d", "W^T x^T: output (out, N), transposed", conv1d_transposed_output),

    ("13.2", "check_fuse_qkv", "cat along dim 1 without transposing each weight",
     fuse_cat_dim1_untransposed),
    ("13.2", "check_fuse_qkv", "cat along dim 0, no transpose: (3d, d)", fuse_no_transpose),
    ("13.2", "check_fuse_qkv", "key first, then query, then value", fuse_wrong_order),
    ("13.2", "check_fuse_qkv", "torch.stack: (3, d, d)", fuse_stack),
    ("13.2", "check_fuse_qkv", "stack on the last dim then reshape: interleaved columns",
     fuse_interleaved),
    ("13.2", "check_fuse_qkv", "transposed weights cat along dim 0: (3d, d)",
     fuse_transposed_rows),
    ("13.2", "check_fuse_qkv", "t_() transposes the caller's weights in place",
     fuse_in_place_transpose),
    ("13.2", "check_fuse_qkv", "reshape instead of transpose", fuse_reshape_not_transpose),
    ("13.2", "check_fuse_qkv", "numpy array", fuse_numpy),
    ("13.2", "check_fuse_qkv", "value, key, query order", fuse_reversed),

    ("13.3", "check_parameter_count", "head counted although tied", count_untied_head),
    ("13.3", "check_parameter_count", "final layer norm forgotten", count_no_final_norm),
    ("13.3", "check_parameter_count", "layer norms without their bias",
     count_norms_without_bias),
    ("13.3", "check_parameter_count", "attention's linear layers without biases",
     count_attention_without_bias),
    ("13.3", "check_parameter_count", "three attention linears: output projection forgotten",
     count_three_attention_linears),
    ("13.3", "check_parameter_count", "position table not counted", count_no_positions),
    ("13.3", "check_parameter_count", "12 d^2 + 13 d per block: assumes d_ff = 4 d",
     count_assumes_4d),
    ("13.3", "check_parameter_count", "d_ff / d makes the result a float", count_float),
    ("13.3", "check_parameter_count", "final norm counted in every block",
     count_final_norm_per_layer),
    ("13.3", "check_parameter_count", "np.prod: returns a numpy integer, not an int",
     count_numpy_int),
    ("13.3", "check_parameter_count", "feed-forward's first bias forgotten", count_ff_one_bias),

    ("13.4", "check_byte_to_char", "chr(256 + b): offset by the byte's value",
     byte_offset_by_value),
    ("13.4", "check_byte_to_char", "soft hyphen 173 taken as printable",
     byte_soft_hyphen_printable),
    ("13.4", "check_byte_to_char", "range(33, 126): '~' moved", byte_tilde_excluded),
    ("13.4", "check_byte_to_char", "space taken as printable", byte_space_printable),
    ("13.4", "check_byte_to_char", "range(161, 172): '¬' moved", byte_not_sign_excluded),
    ("13.4", "check_byte_to_char", "off by one in the moved bytes' numbering",
     byte_off_by_one),
    ("13.4", "check_byte_to_char", "returns the code point (int), not the character",
     byte_returns_code_point),
    ("13.4", "check_byte_to_char", "chr(b) for every byte", byte_identity),
    ("13.4", "check_byte_to_char", "str.isprintable(): space and others misclassified",
     byte_isprintable),
    ("13.4", "check_byte_to_char", "count restarted for 127-160", byte_piecewise_segments),
]
