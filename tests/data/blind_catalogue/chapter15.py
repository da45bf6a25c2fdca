"""Wrong answers to the exercises of chapter 15 (training for real), written blind.

The catalogue was written from the chapter's text only (the prose, each exercise's
statement, its stub and its worked solution), without reading the checkers in
minitransformer/exercises/ or their tests, and without running the checkers on these
answers. Each function is a plausible mistake of a learner who read the chapter, with the
signature of the book's stub; each differs from the correct behaviour on some valid input.
The functions of exercise 15.3 call torch.distributed, so they run only inside a process
group, as the checker runs them.
"""

import math

import torch
import torch.distributed as dist

# ---------------------------------------------------------------------------
# 15.1  my_restore(model, optimizer, generator, checkpoint)
# ---------------------------------------------------------------------------


def restore_no_optimizer(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])   # Adam's moments start again
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def restore_no_torch_rng(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])   # other dropout masks
    optimizer.load_state_dict(checkpoint["optimizer"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def restore_no_data_rng(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])   # the batches start again
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    return checkpoint["step"]


def restore_rngs_swapped(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["data_rng"])
    generator.set_state(checkpoint["torch_rng"])
    return checkpoint["step"]


def restore_next_step(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"] + 1            # "continue from the next one"


def restore_reseeds_torch(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.manual_seed(checkpoint["step"])    # a seed, not the saved state
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def restore_reseeds_data(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.manual_seed(checkpoint["step"])   # a seed, not the saved state
    return checkpoint["step"]


def restore_new_optimizer(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.AdamW(model.parameters())   # a local name only
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def restore_new_generator(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator = torch.Generator()            # a local name only
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def restore_returns_nothing(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])   # the step forgotten


def restore_checks_with_a_draw(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    assert torch.rand(1).item() >= 0         # a "sanity check" that draws a number
    return checkpoint["step"]


# ---------------------------------------------------------------------------
# 15.2  my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number)
# ---------------------------------------------------------------------------


def ring_no_two(num_parameters, world_size, bytes_per_number):
    return (world_size - 1) / world_size * num_parameters * bytes_per_number


def ring_not_divided(num_parameters, world_size, bytes_per_number):
    return 2 * (world_size - 1) * num_parameters * bytes_per_number


def ring_asymptote(num_parameters, world_size, bytes_per_number):
    return 2 * num_parameters * bytes_per_number   # the large-N limit


def ring_bytes_ignored(num_parameters, world_size, bytes_per_number):
    return 2 * (world_size - 1) / world_size * num_parameters * 4   # float32 assumed


def ring_integer_division(num_parameters, world_size, bytes_per_number):
    return 2 * ((world_size - 1) // world_size) * num_parameters * bytes_per_number


def ring_inverted_share(num_parameters, world_size, bytes_per_number):
    return 2 * world_size / (world_size - 1) * num_parameters * bytes_per_number \
        if world_size > 1 else 0.0


def ring_one_chunk(num_parameters, world_size, bytes_per_number):
    return 2 * num_parameters * bytes_per_number / world_size   # a chunk per pass


def ring_truncated(num_parameters, world_size, bytes_per_number):
    return int(2 * (world_size - 1) / world_size * num_parameters * bytes_per_number)


def ring_chunks_rounded_up(num_parameters, world_size, bytes_per_number):
    chunk = math.ceil(num_parameters / world_size)
    return 2 * (world_size - 1) * chunk * bytes_per_number


def ring_bits(num_parameters, world_size, bytes_per_number):
    return 2 * (world_size - 1) / world_size * num_parameters * bytes_per_number * 8


def ring_to_every_other(num_parameters, world_size, bytes_per_number):
    # every process sends its whole gradient to every other one
    return (world_size - 1) * num_parameters * bytes_per_number


# ---------------------------------------------------------------------------
# 15.3  my_average_gradients(model, num_sequences)
# ---------------------------------------------------------------------------


def average_plain_mean(model, num_sequences):
    for p in model.parameters():             # right only for equal shares
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def average_reduce_op_avg(model, num_sequences):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def average_sum_only(model, num_sequences):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def average_local_count(model, num_sequences):
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.grad)
        p.grad /= num_sequences              # this rank's count, not the total


def average_total_assumed(model, num_sequences):
    total = num_sequences * dist.get_world_size()   # as if every rank had as many
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.grad)
        p.grad /= total


def average_no_rescale(model, num_sequences):
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():             # the means summed, divided by the count
        dist.all_reduce(p.grad)
        p.grad /= total


def average_weights_reduced(model, num_sequences):
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():             # p.data, not p.grad
        p.data *= num_sequences
        dist.all_reduce(p.data)
        p.data /= total


def average_first_parameter_only(model, num_sequences):
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        p.grad *= num_sequences
        dist.all_reduce(p.grad)
        p.grad /= total
        return                               # indented one level too deep


def average_scaled_after(model, num_sequences):
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad *= num_sequences              # after the sum: the wrong rank's weight
        p.grad /= total


def average_on_a_copy(model, num_sequences):
    total = torch.tensor(float(num_sequences))
    dist.all_reduce(total)
    for p in model.parameters():
        grad = p.grad.clone() * num_sequences
        dist.all_reduce(grad)
        grad /= total                        # never written back to p.grad


# ---------------------------------------------------------------------------
# 15.4  my_zero_bytes_per_gpu(num_parameters, world_size, stage)
# ---------------------------------------------------------------------------


def zero_only_its_own_part(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage == 3 else 1)
    gradients = num_parameters * 2 / (world_size if stage == 2 else 1)
    optimizer = num_parameters * 12 / (world_size if stage == 1 else 1)
    return weights, gradients, optimizer     # the stages are not cumulative here


def zero_stages_shifted(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage > 3 else 1)
    gradients = num_parameters * 2 / (world_size if stage > 2 else 1)
    optimizer = num_parameters * 12 / (world_size if stage > 1 else 1)
    return weights, gradients, optimizer


def zero_stage2_weights(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage >= 2 else 1)
    gradients = num_parameters * 2 / (world_size if stage >= 3 else 1)
    optimizer = num_parameters * 12 / (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer


def zero_total(num_parameters, world_size, stage):
    per = {0: 16, 1: 4 + 12 / world_size, 2: 2 + 14 / world_size, 3: 16 / world_size}
    return num_parameters * per[stage]       # one number, not the three parts


def zero_list(num_parameters, world_size, stage):
    return [num_parameters * 2 / (world_size if stage >= 3 else 1),
            num_parameters * 2 / (world_size if stage >= 2 else 1),
            num_parameters * 12 / (world_size if stage >= 1 else 1)]


def zero_float32_weights(num_parameters, world_size, stage):
    weights = num_parameters * 4 / (world_size if stage >= 3 else 1)
    gradients = num_parameters * 4 / (world_size if stage >= 2 else 1)
    optimizer = num_parameters * 8 / (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer     # 4 + 4 + 8: the master copy forgotten


def zero_no_master_copy(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage >= 3 else 1)
    gradients = num_parameters * 2 / (world_size if stage >= 2 else 1)
    optimizer = num_parameters * 8 / (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer


def zero_integer_division(num_parameters, world_size, stage):
    weights = num_parameters * 2 // (world_size if stage >= 3 else 1)
    gradients = num_parameters * 2 // (world_size if stage >= 2 else 1)
    optimizer = num_parameters * 12 // (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer


def zero_reversed_order(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage >= 3 else 1)
    gradients = num_parameters * 2 / (world_size if stage >= 2 else 1)
    optimizer = num_parameters * 12 / (world_size if stage >= 1 else 1)
    return optimizer, gradients, weights


def zero_stage0_sharded(num_parameters, world_size, stage):
    weights = num_parameters * 2 / (world_size if stage >= 3 else 1)
    gradients = num_parameters * 2 / (world_size if stage >= 2 else 1)
    optimizer = num_parameters * 12 / world_size   # even in plain data parallelism
    return weights, gradients, optimizer


def zero_world_minus_one(num_parameters, world_size, stage):
    share = max(world_size - 1, 1)           # "the others hold the rest"
    weights = num_parameters * 2 / (share if stage >= 3 else 1)
    gradients = num_parameters * 2 / (share if stage >= 2 else 1)
    optimizer = num_parameters * 12 / (share if stage >= 1 else 1)
    return weights, gradients, optimizer


def zero_per_parameter(num_parameters, world_size, stage):
    weights = 2 / (world_size if stage >= 3 else 1)   # bytes a parameter
    gradients = 2 / (world_size if stage >= 2 else 1)
    optimizer = 12 / (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer


WRONG_ANSWERS = [
    ("15.1", "check_restore", "optimizer state not restored", restore_no_optimizer),
    ("15.1", "check_restore", "torch's global RNG (dropout) not restored",
     restore_no_torch_rng),
    ("15.1", "check_restore", "data generator not restored", restore_no_data_rng),
    ("15.1", "check_restore", "the two RNG states swapped", restore_rngs_swapped),
    ("15.1", "check_restore", "returns step + 1", restore_next_step),
    ("15.1", "check_restore", "torch.manual_seed(step) instead of the saved state",
     restore_reseeds_torch),
    ("15.1", "check_restore", "generator.manual_seed(step) instead of the saved state",
     restore_reseeds_data),
    ("15.1", "check_restore", "new optimizer bound to a local name", restore_new_optimizer),
    ("15.1", "check_restore", "new generator bound to a local name", restore_new_generator),
    ("15.1", "check_restore", "returns None", restore_returns_nothing),
    ("15.1", "check_restore", "draws a random number after restoring the RNG",
     restore_checks_with_a_draw),

    ("15.2", "check_ring_bytes", "factor 2 forgotten (reduce-scatter only)", ring_no_two),
    ("15.2", "check_ring_bytes", "not divided by N", ring_not_divided),
    ("15.2", "check_ring_bytes", "the large-N limit 2 P b", ring_asymptote),
    ("15.2", "check_ring_bytes", "4 bytes a number hard-coded", ring_bytes_ignored),
    ("15.2", "check_ring_bytes", "integer division (N - 1) // N", ring_integer_division),
    ("15.2", "check_ring_bytes", "N / (N - 1)", ring_inverted_share),
    ("15.2", "check_ring_bytes", "one chunk per pass", ring_one_chunk),
    ("15.2", "check_ring_bytes", "truncated to an int", ring_truncated),
    ("15.2", "check_ring_bytes", "chunks rounded up to whole numbers",
     ring_chunks_rounded_up),
    ("15.2", "check_ring_bytes", "bits, not bytes", ring_bits),
    ("15.2", "check_ring_bytes", "whole gradient to each other process",
     ring_to_every_other),

    ("15.3", "check_average_gradients", "plain mean over ranks (equal shares assumed)",
     average_plain_mean),
    ("15.3", "check_average_gradients", "ReduceOp.AVG", average_reduce_op_avg),
    ("15.3", "check_average_gradients", "sum, no division", average_sum_only),
    ("15.3", "check_average_gradients", "divided by this rank's count", average_local_count),
    ("15.3", "check_average_gradients", "total assumed n * world_size",
     average_total_assumed),
    ("15.3", "check_average_gradients", "means not weighted by their counts",
     average_no_rescale),
    ("15.3", "check_average_gradients", "reduces p.data (the weights), not p.grad",
     average_weights_reduced),
    ("15.3", "check_average_gradients", "return inside the loop: first parameter only",
     average_first_parameter_only),
    ("15.3", "check_average_gradients", "multiplied by n after the all-reduce",
     average_scaled_after),
    ("15.3", "check_average_gradients", "reduces a copy, never written back",
     average_on_a_copy),

    ("15.4", "check_zero_bytes", "only the stage's own part sharded (== not >=)",
     zero_only_its_own_part),
    ("15.4", "check_zero_bytes", "stages shifted by one (> not >=)", zero_stages_shifted),
    ("15.4", "check_zero_bytes", "stage 2 shards the weights instead of the gradients",
     zero_stage2_weights),
    ("15.4", "check_zero_bytes", "returns the total, not the three parts", zero_total),
    ("15.4", "check_zero_bytes", "returns a list, not a tuple", zero_list),
    ("15.4", "check_zero_bytes", "float32 weights and gradients (4 + 4 + 8)",
     zero_float32_weights),
    ("15.4", "check_zero_bytes", "optimizer state 8 bytes: master copy forgotten",
     zero_no_master_copy),
    ("15.4", "check_zero_bytes", "integer division", zero_integer_division),
    ("15.4", "check_zero_bytes", "(optimizer, gradients, weights) order",
     zero_reversed_order),
    ("15.4", "check_zero_bytes", "optimizer sharded at stage 0 too", zero_stage0_sharded),
    ("15.4", "check_zero_bytes", "divided by world_size - 1", zero_world_minus_one),
    ("15.4", "check_zero_bytes", "bytes per parameter, not multiplied by the count",
     zero_per_parameter),
]
