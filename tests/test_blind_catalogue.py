"""Every wrong answer of the blind catalogue fails its checker, with a hint.

tests/data/blind_catalogue/chapterNN.py holds wrong answers to the exercises of chapters 13 to
18, written by another engineer from the chapters' text alone, without reading the checkers or
running them (``WRONG_ANSWERS = [(label, checker_name, mistake, function), ...]``). Each entry
here must fail, on one line, with a hint ("Hint: ..."); where the hint was judged to name the
mistake, the fragment of it in ``EXPECTED`` must be in it, so that a checker that loses the
hint, or gives another one, fails this test.

Verdicts per chapter, before issue 40's changes to the checkers (the checkers of commit
122a787) and after: passes / a hint that names the mistake / a misleading hint / no hint (only
"expected X but got Y").

=======  =======  ===================  ==================
chapter  entries  before               after
=======  =======  ===================  ==================
13       41       6 / 29 / 0 / 6       0 / 41 / 0 / 0
14       44       2 / 33 / 0 / 9       0 / 44 / 0 / 0
15       44       4 / 34 / 0 / 6       0 / 44 / 0 / 0
16       92       15 / 40 / 1 / 36     0 / 92 / 0 / 0
17       64       13 / 35 / 1 / 15     0 / 64 / 0 / 0
18       61       11 / 23 / 1 / 26     0 / 61 / 0 / 0
all      346      51 / 194 / 3 / 98    0 / 346 / 0 / 0
=======  =======  ===================  ==================

Before, 56% of the catalogue got a hint that names its mistake; the three misleading ones were
16.6's count from the first layer ("not 2 * r * in"), 17.2's sign inside softplus ("the margin
is the wrong way round") and 18.2's block size written in ("round up"). After, every entry gets
one (the least specific, 13.1's flattened batch, is told its answer "lacks a dimension of size
1"). The catalogue was seen while the checkers were improved: the classes of mistakes it
showed were fixed in every checker of chapters 13 to 18 where they apply (an answer that cannot
be trained through, of the wrong type or container, that changes its arguments, that is random,
that writes a number in, or whose values relate to the expected ones by a sign, a factor, an
order or a shape), and a fresh blind catalogue is the fair measure of what they generalise to.

(The numbers were measured with ``/tmp`` scripts that ran each entry on both versions of the
checkers; "misleading" is a judgement, made entry by entry, of the hints that name another
mistake than the one the catalogue describes.)
"""

import importlib
import importlib.util
import warnings
from pathlib import Path

import pytest

CATALOGUE = Path(__file__).resolve().parent / "data" / "blind_catalogue"
CHAPTERS = sorted(path.stem.removeprefix("chapter") for path in CATALOGUE.glob("chapter*.py"))


def _wrong_answers(chapter: str) -> list:
    spec = importlib.util.spec_from_file_location(f"blind_catalogue_{chapter}",
                                                  CATALOGUE / f"chapter{chapter}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WRONG_ANSWERS


ENTRIES = [(chapter, label, checker, mistake, function)
           for chapter in CHAPTERS
           for label, checker, mistake, function in _wrong_answers(chapter)]

#: The two-rank checker starts two processes per answer: its entries run on one launch.
TWO_RANKS = "check_average_gradients"

#: chapterNN:function -> a fragment of the hint judged to name the mistake (each was read
#: against the catalogue's description of the mistake).
EXPECTED = {
    '13:conv1d_linear_habit': 'x @ weight.T + bias (F.linear, nn.Linear) is the',
    '13:conv1d_f_linear': 'x @ weight.T + bias (F.linear, nn.Linear) is the',
    '13:conv1d_no_bias': 'add the bias: y = x @ weight + bias',
    '13:conv1d_flattened': 'your answer lacks a dimension of size 1, shape (2, 2)',
    '13:conv1d_mm': 'x may have more dimensions than two, (batch, positions,',
    '13:conv1d_bias_first': 'the bias is added to the product, not to x: (x @',
    '13:conv1d_no_grad': 'the result does not carry a gradient: .item(), float(),',
    '13:conv1d_numpy': 'return a torch tensor, not a numpy array: the next step',
    '13:conv1d_float64': "float64 (double) where the inputs are float32: numpy's",
    '13:conv1d_transposed_output': 'your answer is the expected one transposed, shape (3,',
    '13:fuse_cat_dim1_untransposed': 'side by side along dim 1 gives the right shape, but',
    '13:fuse_no_transpose': 'Conv1D stores (in, out): the three weights stacked',
    '13:fuse_wrong_order': "the order is query, key, value: the key's outputs come",
    '13:fuse_stack': 'the right number of entries in another shape, (3, 2, 2)',
    '13:fuse_interleaved': 'the outputs sit in three blocks side by side, all of',
    '13:fuse_transposed_rows': "this is (3d, d), c_attn's transpose: once transposed,",
    '13:fuse_in_place_transpose': 'leave the arguments as they were: an in-place operation',
    '13:fuse_reshape_not_transpose': 'reshape keeps the numbers in their order and only',
    '13:fuse_numpy': 'return a torch tensor, not a numpy array: the next step',
    '13:fuse_reversed': "the order is query, key, value: the value's outputs",
    '13:count_untied_head': 'the head is tied to the token table: the same',
    '13:count_no_final_norm': 'after the last block comes the final layer norm (ln_f):',
    '13:count_norms_without_bias': 'a layer norm has a weight and a bias, d_model numbers',
    '13:count_attention_without_bias': '4 * d_model numbers per block are missing: the biases',
    '13:count_three_attention_linears': 'attention has four projections: query, key, value and',
    '13:count_no_positions': 'the position table is a parameter too: context_length',
    '13:count_assumes_4d': "use d_ff, the argument, for the feed-forward's width:",
    '13:count_float': 'a count is a whole number: return an int. Multiply',
    '13:count_final_norm_per_layer': 'the final layer norm (ln_f) comes once, after the last',
    '13:count_numpy_int': "return a Python int: np.prod, np.sum and numpy's",
    '13:count_ff_one_bias': "the feed-forward's first layer (c_fc) has a bias too,",
    '13:byte_offset_by_value': 'the moved bytes are numbered among themselves, in',
    '13:byte_soft_hyphen_printable': "byte 173, the soft hyphen, lies between '¡' and 'ÿ' but",
    '13:byte_tilde_excluded': "byte 126 ('~') is moved: the printable ranges are '!'",
    '13:byte_space_printable': 'a space (byte 32) is not printable: it is moved like',
    '13:byte_not_sign_excluded': "byte 172 ('¬') is moved: the printable ranges are '!'",
    '13:byte_off_by_one': 'the first moved byte, byte 0, gets chr(256): count from',
    '13:byte_returns_code_point': 'return the character, a str: chr(256 + n), not the',
    '13:byte_identity': 'only the printable bytes stand for themselves: the',
    '13:byte_isprintable': 'a space (byte 32) is not printable: it is moved like',
    '13:byte_piecewise_segments': 'bytes 127 to 160 are numbered 33 too low: the 68 moved',
    '14:rms_subtracts_mean': 'RMSNorm does not subtract the mean: divide x itself by',
    '14:rms_eps_outside': 'eps goes inside the square root, added to the mean of',
    '14:rms_wrong_dim': 'the mean runs over the last dimension (dim=-1), the',
    '14:rms_sum_not_mean': 'the mean of the squares, not their sum: dividing by the',
    '14:rms_no_sqrt': 'take the square root of the mean square: the root mean',
    '14:rms_variance': 'x.var() and x.std() measure the spread around the mean',
    '14:rms_norm_not_rms': 'x.norm() is the root of the sum of the squares, sqrt(d)',
    '14:rms_no_weight': 'multiply by weight, the learned gain of each feature,',
    '14:rms_no_keepdim': "keepdim=True keeps the mean's last dimension (of size",
    '14:rms_in_place': 'leave the arguments as they were: an in-place operation',
    '14:rms_weight_added': 'RMSNorm has a gain and no bias: multiply by weight, do',
    '14:rms_eps_ignored': 'add eps to the mean of the squares, inside the square',
    '14:rope_interleaved_pairs': 'pair dimension i with i + d/2 (the two halves), as',
    '14:rope_offset_ignored': 'the rows of x sit at positions offset, offset + 1, ...:',
    '14:rope_offset_plus_one': 'off by one: the first row of x sits at position offset,',
    '14:rope_missing_two': 'the frequencies are theta ** (-2i / d) for i = 0, 1,',
    '14:rope_positive_exponent': 'the exponent is negative, theta ** (-2i / d): the first',
    '14:rope_sign_flipped': 'turn the other way: rotate_half(x) is (-x2, x1), so x *',
    '14:rope_angles_interleaved': 'the angles of the first half repeat for the second',
    '14:rope_cos_sin_swapped': 'cos goes with x and sin with rotate_half(x): x * cos +',
    '14:rope_integer_exponent': '// is floor division: -torch.arange(0, d, 2) // d is -1',
    '14:rope_length_from_heads': 'the positions are along dim -2 of (B, h, T, d): T is',
    '14:rope_hard_coded_theta': "use the theta argument for the base, not the paper's",
    '14:rope_in_place': 'leave the arguments as they were: an in-place operation',
    '14:expand_repeat': 'neighbouring query heads share a KV head (heads 0 and 1',
    '14:expand_wrong_dim': 'repeat the heads, dim 1 of (B, g, T, d), not the',
    '14:expand_group_is_num_heads': 'each KV head serves a group of num_heads // g query',
    '14:expand_unsqueeze_wrong_place': 'neighbouring query heads share a KV head (heads 0 and 1',
    '14:expand_inverted_ratio': 'expand to num_heads heads: each of the g KV heads is',
    '14:expand_batch_axis': 'g, the number of KV heads, is kv.shape[1]; kv.shape[0]',
    '14:expand_cat': 'neighbouring query heads share a KV head (heads 0 and 1',
    '14:expand_hard_coded_two': "the group's size comes from the arguments, num_heads //",
    '14:expand_index_by_g': 'query head j uses KV head j // (num_heads // g), its',
    '14:expand_list_of_heads': 'return a tensor, not Python lists: the model and every',
    '14:swiglu_silu_on_up': 'the gate goes through silu, the up projection does not:',
    '14:swiglu_gelu': "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu);",
    '14:swiglu_sigmoid': "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu), not",
    '14:swiglu_untransposed': "the weights are in nn.Linear's layout, (out_features,",
    '14:swiglu_silu_after_product': 'the silu goes on the gate alone, before the product,',
    '14:swiglu_relu': "SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu);",
    '14:swiglu_sum': 'multiply the gate by the up projection, element by',
    '14:swiglu_no_down': 'end with the down projection, back to d_model: (...) @',
    '14:swiglu_silu_sign': 'silu(z) = z * sigmoid(z) = z / (1 + exp(-z)): the',
    '14:swiglu_gate_is_silu_of_x': "silu goes on the gate projection's output, silu(x @",
    '15:restore_no_optimizer': "the optimizer starts again from zero moments: AdamW's",
    '15:restore_no_torch_rng': "dropout draws its masks from torch's global random",
    '15:restore_no_data_rng': 'the data generator starts again from its seed, so the',
    '15:restore_rngs_swapped': 'the two generator states are swapped:',
    '15:restore_next_step': "return checkpoint['step'] itself, not one more: it",
    '15:restore_reseeds_torch': "dropout draws its masks from torch's global random",
    '15:restore_reseeds_data': 'the data generator starts again from its seed, so the',
    '15:restore_new_optimizer': "the optimizer starts again from zero moments: AdamW's",
    '15:restore_new_generator': 'the data generator starts again from its seed, so the',
    '15:restore_returns_nothing': 'everything is restored, but the function returns',
    '15:restore_checks_with_a_draw': "dropout draws its masks from torch's global random",
    '15:ring_no_two': 'a ring all-reduce has two passes, reduce-scatter then',
    '15:ring_not_divided': 'each chunk is 1/N of the numbers: (N - 1) chunks make',
    '15:ring_asymptote': 'each process sends only its share: (N - 1) chunks of',
    '15:ring_bytes_ignored': 'use bytes_per_number, not 4: a 16-bit number is 2 bytes',
    '15:ring_integer_division': 'integer division rounds the share (world_size - 1) //',
    '15:ring_inverted_share': 'each process sends N - 1 of the N chunks, a share below',
    '15:ring_one_chunk': 'each pass sends N - 1 chunks of 1/N, not one chunk: 2',
    '15:ring_truncated': 'keep the exact number, 2 (N - 1) / N * P * b, a',
    '15:ring_chunks_rounded_up': 'the formula counts P / N numbers a chunk, a fraction',
    '15:ring_bits': 'bytes, not bits: a float32 number is 4 bytes, no factor',
    '15:ring_to_every_other': 'sending the whole gradient to each of the N - 1 others',
    '15:zero_only_its_own_part': 'the stages add up: each one shards its own part and',
    '15:zero_stages_shifted': 'each stage shards from its own number on: stage 1',
    '15:zero_stage2_weights': 'stage 2 shards the gradients, not the weights: each GPU',
    '15:zero_total': 'return the three parts, a tuple (weights, gradients,',
    '15:zero_list': 'return a tuple, not a list, as the exercise does (the',
    '15:zero_float32_weights': 'that is float32 without a master copy (4 + 4 + 8); in',
    '15:zero_no_master_copy': "Adam's state in mixed precision is 12 bytes a",
    '15:zero_integer_division': 'divide with /: the bytes on one GPU are a fraction when',
    '15:zero_reversed_order': 'the parts come in the order weights, gradients,',
    '15:zero_stage0_sharded': 'stage 0 is plain data parallelism: every GPU holds all',
    '15:zero_world_minus_one': 'a sharded part is divided among all world_size GPUs,',
    '15:zero_per_parameter': 'multiply by num_parameters: the answer is the bytes of',
    '16:labels_marker_labelled': "leave the assistant's role marker out (-100): the",
    '16:labels_end_not_labelled': "keep the assistant's end-of-turn token in the labels:",
    '16:labels_every_token': "only the assistant's tokens are labels: the system and",
    '16:labels_shifted': 'do not shift here: label t is token t, as in',
    '16:labels_non_user_labelled': "the system prompt is given, like the user's turns: only",
    '16:labels_last_turn_only': 'label every assistant turn, not only the last one: each',
    '16:labels_marker_forgotten_in_other_turns':
        'one label per token: every turn starts with its role',
    '16:labels_ignore_minus_one': 'the label that the loss leaves out is -100',
    '16:labels_first_content_token_masked': "the assistant's first content token is a label too:",
    '16:labels_hard_coded_ids': "the end-of-turn token's label is end_id, the argument,",
    '16:labels_mutates_turns': 'leave the arguments as they were: an in-place operation',
    '16:labels_role_by_marker_id': 'nothing is labelled in a conversation that has',
    '16:labels_as_tensor': 'these are whole numbers (ids, labels, counts): return',
    '16:labels_end_of_every_turn': 'the end-of-turn tokens of the other turns belong to',
    '16:labels_marker_instead_of_end': "leave the assistant's role marker out (-100), and keep",
    '16:loss_unshifted': 'shift: the logits at position t predict token t + 1, so',
    '16:loss_shift_reversed': 'the shift goes the other way: logits[:, :-1] (every',
    '16:loss_both_truncated': 'shift the labels against the logits: logits[:, :-1]',
    '16:loss_flatten_then_shift': 'shift within each sequence, then flatten: flattened',
    '16:loss_mean_per_sequence': 'take the mean over all the labelled tokens of the batch',
    '16:loss_sum': 'the mean, not the sum: divide by the number of labelled',
    '16:loss_divided_by_all_positions': 'divide by the number of labelled tokens only; the',
    '16:loss_python_float_loop': 'the result does not carry a gradient: .item(), float(),',
    '16:loss_view_on_slice': 'use .reshape, not .view: a slice such as logits[:, :-1]',
    '16:loss_positive_labels_only': '-100 marks the positions left out, and token 0 is a',
    '16:loss_nll_on_raw_logits': 'nll_loss expects log-probabilities, not logits: take',
    '16:loss_mutates_labels': 'leave the arguments as they were: an in-place operation',
    '16:loss_softmax_then_log': 'your answer holds inf or NaN where the expected one is',
    '16:loss_detached': 'the result does not carry a gradient: .item(), float(),',
    '16:forward_alpha_not_divided': 'scale the change by alpha / r, not alpha: r =',
    '16:forward_r_over_alpha': 'scale the change by alpha / r, not r / alpha',
    '16:forward_r_from_wrong_axis': 'r is A.shape[0], the rank (A is (r, in_features)), not',
    '16:forward_r_from_B_rows': 'r is A.shape[0] (or B.shape[1]), the rank; B.shape[0]',
    '16:forward_integer_division': 'alpha / r, not alpha // r: floor division rounds the',
    '16:forward_rslora_scaling': 'alpha / r, not alpha / sqrt(r): dividing by the root is',
    '16:forward_change_only': "add the frozen layer's output, x @ weight.T: LoRA",
    '16:forward_scales_everything': 'scale only the change by alpha / r, not the frozen',
    '16:forward_untransposed_product': 'the shapes do not fit a matrix product (2x4 @ 3x4): the',
    '16:forward_weight_untransposed': 'the shapes do not fit a matrix product (2x4 @ 3x4): the',
    '16:forward_merges_in_place': 'leave the arguments as they were: an in-place operation',
    '16:forward_dropout': 'your function gives different answers to the same',
    '16:forward_hard_coded_scaling': 'compute the scale from the arguments, alpha / r: a',
    '16:forward_detached_input': 'part of the computation is cut from the gradient: a',
    '16:forward_numpy': 'return a torch tensor, not a numpy array: the next step',
    '16:forward_float64': "float64 (double) where the inputs are float32: numpy's",
    '16:merge_no_scaling': 'scale the change by alpha / r: without it the change is',
    '16:merge_alpha_only': 'scale the change by alpha / r, not alpha: r =',
    '16:merge_transposed_change': 'two tensors whose shapes do not line up (4 against 3 at',
    '16:merge_transposed_result': 'your answer is the expected one transposed, shape (4,',
    '16:merge_subtracts': 'merging adds the change, W + (alpha / r) B A;',
    '16:merge_in_place': 'leave the arguments as they were: an in-place operation',
    '16:merge_r_from_in_features': 'r is A.shape[0], the rank (A is (r, in_features)), not',
    '16:merge_integer_division': 'alpha / r, not alpha // r: floor division rounds the',
    '16:merge_rslora': 'alpha / r, not alpha / sqrt(r): dividing by the root is',
    '16:merge_returns_linear': 'return a tensor, not a Linear: the exercise asks for',
    '16:merge_numpy': 'return a torch tensor, not a numpy array: the next step',
    '16:merge_elementwise_outer': 'B @ A is a matrix product, the sum of the r outer',
    '16:merge_change_only': 'add the change to the frozen weight: the merged weight',
    '16:merge_float64': "float64 (double) where the inputs are float32: numpy's",
    '16:merge_scales_weight_too': 'scale only the change by alpha / r, not the frozen',
    '16:init_swapped_zero': 'B starts at zero, not A, as in the LoRA paper and PEFT:',
    '16:init_both_zero': 'start A random: with A = 0 and B = 0 every gradient of',
    '16:init_both_random': 'B starts at zero, torch.zeros(out_features, r), so that',
    '16:init_transposed_shapes': 'A is (r, in_features) and B is (out_features, r), the',
    '16:init_drawn_transposed': 'value 0 of the tuple: the right values, in another',
    '16:init_without_generator': "A's numbers are not the generator's first r *",
    '16:init_precedence_bug': 'value 0 of the tuple: each answer is the expected one',
    '16:init_divided_by_in': 'value 0 of the tuple: every answer is the expected one',
    '16:init_divided_by_sqrt_r': 'value 0 of the tuple: every answer is 1.414 times the',
    '16:init_uniform': "A's numbers are not the generator's first r *",
    '16:init_returns_B_first': 'the right values in another order: return them in the',
    '16:init_B_drawn_first_then_zeroed': "A's numbers are not the generator's first r *",
    '16:init_reseeds': "A's numbers are not the generator's first r *",
    '16:init_float64': "float64 (double) where the inputs are float32: numpy's",
    '16:init_B_tiny_random': 'B starts at zero, torch.zeros(out_features, r), so that',
    '16:init_multiplied_by_sqrt': 'value 0 of the tuple: every answer is the expected one',
    '16:count_full_matrix': "that is the frozen weight's size, in * out; LoRA trains",
    '16:count_r_times_product': 'A is (r, in_features) and B is (out_features, r): r *',
    '16:count_A_only': 'count both A (r * in_features) and B (out_features * r)',
    '16:count_B_only': 'count both B (out_features * r) and A (r * in_features)',
    '16:count_precedence': 'mind the brackets: r * (in + out), not r * in + out',
    '16:count_first_shape_times_layers': 'every layer is counted with its own shape: the layers',
    '16:count_unique_shapes': 'count every layer, those of the same shape too: sum',
    '16:count_with_bias': "count only A and B: the layer's bias is frozen with its",
    '16:count_plus_frozen': 'count only what LoRA trains, r * (in + out) per layer:',
    '16:count_r_squared': 'every answer is the expected one times r: r is counted',
    '16:count_twice_the_larger': 'r * (in + out): in_features for A and out_features for',
    '16:count_rank_plus_one': 'A has r rows and B r columns: r * (in + out), not (r +',
    '16:count_last_shape_only': 'the counts of all the layers add up: sum over shapes',
    '16:count_as_tensor': 'a count is a whole number: return an int. Multiply',
    '16:count_mean': 'the sum over the layers, not their mean',
    '16:count_in_bytes': 'every answer is 4 times the expected one: a constant',
    '17:seq_unshifted': 'shift: the logits at position t - 1 give the',
    '17:seq_mask_of_predicting_position': 'the mask goes with the token it scores: entry t of the',
    '17:seq_shift_reversed': 'the shift goes the other way: logits[:, :-1] (every',
    '17:seq_mean_not_sum': "the sum, not the mean: a sequence's log-probability is",
    '17:seq_no_mask': "count only the response's tokens (where response_mask",
    '17:seq_raw_logits': 'take log_softmax of the logits first: logits are not',
    '17:seq_log_softmax_time_axis': 'log_softmax over the vocabulary, dim=-1 (the last',
    '17:seq_scalar_over_batch': 'one number per sequence, shape (B,): sum over the',
    '17:seq_keepdim': 'your answer has a dimension of size 1 too many, shape',
    '17:seq_negative_log_likelihood': 'a log-probability is negative (log p <= 0):',
    '17:seq_item_loop': 'the result does not carry a gradient: .item(), float(),',
    '17:seq_in_place_normalise': 'leave the arguments as they were: an in-place operation',
    '17:seq_rolled': 'slice, do not roll: torch.roll wraps around, so the',
    '17:seq_log_of_softmax_sum': "a sequence's log-probability is the sum of its tokens'",
    '17:seq_float64': "float64 (double) where the inputs are float32: numpy's",
    '17:seq_first_response_token_dropped': 'the first response token counts too: it is scored by',
    '17:dpo_margin_reversed': 'the sign is the wrong way round: the loss is -log',
    '17:dpo_no_minus': 'the loss is minus the log-sigmoid (a log-likelihood to',
    '17:dpo_beta_outside': 'beta multiplies the margin inside the sigmoid, -log',
    '17:dpo_log_of_sigmoid': 'log(sigmoid(x)) rounds to log(0) = -inf once x is below',
    '17:dpo_sum': 'the mean over the pairs, not the sum',
    '17:dpo_no_reference': 'keep the reference: each log-probability is compared',
    '17:dpo_ratio_of_logs': 'these are log-probabilities: the log of a ratio is a',
    '17:dpo_softplus_wrong_sign': 'the sign is the wrong way round: the loss is -log',
    '17:dpo_divided_by_beta': 'multiply the margin by beta, do not divide by it: -log',
    '17:dpo_mean_inside': 'one loss per pair, then the mean: -log sigmoid(beta *',
    '17:dpo_two_terms': 'one sigmoid of the difference, -log sigmoid(beta *',
    '17:dpo_in_place': 'leave the arguments as they were: an in-place operation',
    '17:dpo_returns_tuple': 'return one result, not a tuple of several: the exercise',
    '17:dpo_per_pair': 'return one number, the mean over the pairs, not one',
    '17:dpo_detached_policy': 'the result does not carry a gradient: .item(), float(),',
    '17:dpo_python_float': 'the result does not carry a gradient: .item() and',
    '17:adv_population_std': "use torch's std, with Bessel's correction (dividing by",
    '17:adv_eps_in_sqrt': 'close to the expected values, but not equal (up to',
    '17:adv_over_batch': 'normalise within each group (the answers to one',
    '17:adv_no_std': "divide by the group's standard deviation (plus 1e-4):",
    '17:adv_no_eps': 'add 1e-4 to the standard deviation: a group whose',
    '17:adv_wrong_view': 'the rewards come group after group (the G answers to',
    '17:adv_mean_over_wrong_dim': 'take the mean and standard deviation along each group,',
    '17:adv_not_flattened': "return one advantage per reward, in the rewards' order",
    '17:adv_precedence': 'close to the expected values, but not equal (up to',
    '17:adv_in_place': 'leave the arguments as they were: an in-place operation',
    '17:adv_hard_coded_four': 'your function answers as if group_size were always 4,',
    '17:adv_no_keepdim': 'two tensors whose shapes do not line up (4 against 3 at',
    '17:adv_chunk': 'the rewards come group after group: rewards.view(-1,',
    '17:adv_numpy': "use torch's std, with Bessel's correction (dividing by",
    '17:adv_python_list': 'return a tensor, not Python lists: the model and every',
    '17:adv_batch_std_group_mean': "subtract each group's own mean and divide by its own",
    '17:clip_no_min': 'keep the unclipped term too, min(rho * A, clip(rho) *',
    '17:clip_max': 'the smaller of the two, torch.min: the clipped',
    '17:clip_ratio_of_logs': 'the ratio of probabilities is exp(log_probs -',
    '17:clip_ratio_inverted': 'the ratio is new over old, exp(log_probs -',
    '17:clip_per_answer_mean': 'average over all the response tokens of the batch at',
    '17:clip_no_mask': "use the mask: the padding's tokens are not part of the",
    '17:clip_no_minus': 'the loss is minus the objective (the objective is',
    '17:clip_log_ratio': 'clip the ratio rho = exp(log_probs - old_log_probs) to',
    '17:clip_the_product': 'clip the ratio, then multiply by the advantage:',
    '17:clip_advantages_wrong_axis': 'advantages is one number per sequence, shape (B,): give',
    '17:clip_detached_ratio': 'the result does not carry a gradient: .item(), float(),',
    '17:clip_upper_only': 'clip on both sides, ratio.clamp(1 - epsilon, 1 +',
    '17:clip_sum_per_answer': 'average over all the response tokens of the batch at',
    '17:clip_hard_coded_epsilon': 'your function answers as if epsilon were always 0.2,',
    '17:clip_in_place': 'leave the arguments as they were: an in-place operation',
    '17:clip_item': 'the result does not carry a gradient: .item() and',
    '18:pad_right': 'pad on the left: the next token is written after the',
    '18:pad_mask_from_ids': 'build the mask from the lengths, not from idx !=',
    '18:pad_positions_from_column': "count the positions from each prompt's first real",
    '18:pad_positions_minus_one': 'give the pads position 0: cumsum(-1) - 1 leaves -1',
    '18:pad_positions_from_one': 'positions start at 0: attention_mask.cumsum(-1) - 1',
    '18:pad_positions_negative': 'give the pads position 0: they are no part of the text,',
    '18:pad_long_mask': 'the attention mask is boolean (dtype torch.bool), True',
    '18:pad_float_ids': 'these are whole numbers (ids, labels, counts): return',
    '18:pad_width_of_first': 'the batch is as wide as its longest prompt, max(len(p)',
    '18:pad_mutates_prompts': 'leave the arguments as they were: an in-place operation',
    '18:pad_sorted_rows': 'values 0 and 1 and 2 of the tuple: the right values, in',
    '18:pad_extra_column': 'values 0 and 1 and 2 of the tuple: one entry too many',
    '18:pad_returns_list': 'return a tuple, not a list, as the exercise does (the',
    '18:pad_numpy': 'return a torch tensor, not a numpy array: the next step',
    '18:pad_positions_not_counting_repeats': 'count the positions from the lengths too',
    '18:grow_floor': 'round the number of blocks up: 10 tokens in blocks of 4',
    '18:grow_plus_one': 'a full block needs no new one: 8 tokens fit in 2 blocks',
    '18:grow_in_place': 'return two new lists and leave block_table and',
    '18:grow_from_the_end': 'take the blocks from the front of the free list, in',
    '18:grow_no_max': 'a table may already hold more blocks than its tokens',
    '18:grow_one_per_call': 'take every block the table lacks at once: a prefill of',
    '18:grow_counts_next_token': 'a full block needs no new one: 8 tokens fit in 2 blocks',
    '18:grow_aliases_inputs': 'return two new lists and leave block_table and',
    '18:grow_smallest_free': 'take the blocks from the front of the free list, in',
    '18:grow_swapped_result': 'the right values in another order: return them in the',
    '18:grow_sorted_table': 'value 0 of the tuple: the right values, in another',
    '18:grow_takes_needed': 'the table already holds len(block_table) blocks: when',
    '18:grow_hard_coded_16': 'your function answers as if block_size were always 16,',
    '18:grow_set_difference': 'value 1 of the tuple: the right values, in another',
    '18:grow_float_ceil': 'round the number of blocks up, not to the nearest: a',
    '18:grow_returns_tuples': 'return a list, not a tuple, as the exercise does (the',
    '18:free_all_of_its_blocks': "a block that another request's table still holds (a",
    '18:free_unsorted': 'return the blocks sorted, as a list',
    '18:free_shared_ones': 'the other way round: the shared blocks stay (another',
    '18:free_counts_itself': "leave the finished request's own table out of the",
    '18:free_deletes_entry': 'leave the arguments as they were: an in-place operation',
    '18:free_reverse_sorted': 'sorted from the smallest id up, sorted(...), not in',
    '18:free_returns_set': 'return a sorted list, not a set: sorted(...) turns a',
    '18:free_one_other_table': "a block that another request's table holds, anywhere in",
    '18:free_identity_compare': 'compare request ids with != (their values), not with',
    '18:free_same_position_only': "a block that another request's table holds, anywhere in",
    '18:free_all_or_nothing': 'free the blocks no other table holds even when some of',
    '18:free_remove_while_iterating': 'your function changed its argument block_tables: leave',
    '18:free_older_requests_only': 'any other request may share a block, whether it started',
    '18:free_prefix_until_first_shared': "every block of the finished request's table that no",
    '18:merge_inverted_scale': 'the factor is exp(m1 - m), at most 1 (m is the larger',
    '18:merge_no_rescale': 'rescale both partials to the common maximum: l1 and o1',
    '18:merge_broadcast_wrong_axis': 'two tensors whose shapes do not line up (2 against 3 at',
    '18:merge_divides_by_l': 'keep o unnormalised (a sum, like l): divide by l only',
    '18:merge_assumes_first_larger': 'the common maximum is the larger of the two,',
    '18:merge_global_max': 'the common maximum is taken query by query,',
    '18:merge_logsumexp': 'the common maximum is the larger of the two,',
    '18:merge_in_place': 'leave the arguments as they were: an in-place operation',
    '18:merge_unshifted_exp': 'the factors are exp(m1 - m) and exp(m2 - m), relative',
    '18:merge_returns_list': 'return a tuple, not a list, as the exercise does (the',
    '18:merge_l_not_rescaled': 'rescale the sums l1 and l2 as you rescale the outputs',
    '18:merge_python_max': 'take the larger maximum query by query with',
    '18:merge_min': 'the common maximum is the larger of the two,',
    '18:merge_float64': "float64 (double) where the inputs are float32: numpy's",
    '18:merge_averaged': 'values 1 and 2 of the tuple: every answer is 0.5 times',
    '18:merge_detached_max': 'the result does not carry a gradient: .item(), float(),',
    '15:average_plain_mean': "with unequal shares the mean of the ranks' means is not",
    '15:average_reduce_op_avg': "with unequal shares the mean of the ranks' means is not",
    '15:average_sum_only': "all_reduce adds the ranks' tensors: divide the sum by",
    '15:average_local_count': 'divide by the number of sequences on all ranks (another',
    '15:average_total_assumed': 'num_sequences * world_size is the total only when every',
    '15:average_no_rescale': 'backward() left each rank the mean over its own',
    '15:average_weights_reduced': 'each rank still holds its own gradient: dist.all_reduce',
    '15:average_first_parameter_only': "only some parameters' gradients were averaged, the",
    '15:average_scaled_after': 'scale before the all_reduce: afterwards every rank',
    '15:average_on_a_copy': 'each rank still holds its own gradient: dist.all_reduce',
}


def _checker(chapter: str, name: str):
    return getattr(importlib.import_module(f"minitransformer.exercises.chapter{chapter}"), name)


def _assert_hinted(chapter, function, message):
    assert not message.startswith("✓"), f"a wrong answer passes: {function.__name__}"
    assert "\n" not in message, message
    assert message.startswith("✗"), message
    assert "Hint: " in message, f"no hint for {function.__name__}: {message}"
    fragment = EXPECTED.get(f"{chapter}:{function.__name__}")
    if fragment is not None:
        hint = message.split("Hint: ", 1)[1]
        assert fragment in hint, (fragment, message)


@pytest.mark.parametrize(
    "chapter, label, checker, mistake, function",
    [entry for entry in ENTRIES if entry[2] != TWO_RANKS],
    ids=[f"{entry[0]}-{entry[4].__name__}" for entry in ENTRIES if entry[2] != TWO_RANKS])
def test_fails_with_a_hint(chapter, label, checker, mistake, function):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # a wrong answer may divide 0 by 0
        verdict = _checker(chapter, checker).run(function)
    assert not verdict, f"{label} {mistake}: a wrong answer passes"
    _assert_hinted(chapter, function, verdict.message)


def test_the_two_rank_answers_fail_with_a_hint():
    """All of them on one launch of the two processes (run_many), as each launch takes
    seconds; each answer makes the same collective calls on both ranks and raises nothing."""
    entries = [entry for entry in ENTRIES if entry[2] == TWO_RANKS]
    assert entries
    checker = _checker(entries[0][0], TWO_RANKS)
    verdicts = checker.run_many([entry[4] for entry in entries])
    for (chapter, label, _, mistake, function), verdict in zip(entries, verdicts):
        assert not verdict, f"{label} {mistake}: a wrong answer passes"
        _assert_hinted(chapter, function, verdict.message)


def test_every_chapter_of_the_catalogue_is_here():
    assert CHAPTERS == ["13", "14", "15", "16", "17", "18"]
    assert len(ENTRIES) >= 300


def test_the_expected_fragments_name_existing_entries():
    names = {f"{entry[0]}:{entry[4].__name__}" for entry in ENTRIES}
    assert len(names) == len(ENTRIES)           # one name per entry
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)
    assert len(EXPECTED) >= 0.9 * len(ENTRIES)
