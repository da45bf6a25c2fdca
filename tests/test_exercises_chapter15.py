"""The checkers of chapter 15: they accept correct answers and explain plausible wrong ones.

Each wrong answer below is written the way a learner would write it, and each asserts the one
hint it should get.
"""

import copy

import pytest
import torch

from minitransformer.exercises import chapter15
from minitransformer.exercises.chapter15 import (
    check_average_gradients,
    check_restore,
    check_ring_bytes,
    check_zero_bytes,
)

# --- correct solutions, written the way the book's solutions are ---------------------------


def my_restore(model, optimizer, generator, checkpoint):
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    torch.set_rng_state(checkpoint["torch_rng"])
    generator.set_state(checkpoint["data_rng"])
    return checkpoint["step"]


def my_restore_in_another_order(model, optimizer, generator, checkpoint):
    step = checkpoint["step"]
    generator.set_state(checkpoint["data_rng"].clone())
    torch.random.set_rng_state(checkpoint["torch_rng"])
    optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(checkpoint["model"][name])
    return int(step)


def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
    share = (world_size - 1) / world_size
    return 2 * share * num_parameters * bytes_per_number


def my_ring_allreduce_bytes_by_rounds(num_parameters, world_size, bytes_per_number):
    chunk = num_parameters / world_size * bytes_per_number
    reduce_scatter = (world_size - 1) * chunk
    all_gather = (world_size - 1) * chunk
    return reduce_scatter + all_gather


def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
    sharded = {"optimizer": stage >= 1, "gradients": stage >= 2, "weights": stage >= 3}
    size = {"weights": 2, "gradients": 2, "optimizer": 12}
    return sum(num_parameters * size[kind] / (world_size if split else 1)
               for kind, split in sharded.items())


def my_zero_bytes_by_cases(num_parameters, world_size, stage):
    p, n = num_parameters, world_size
    if stage == 0:
        return 16 * p
    if stage == 1:
        return 4 * p + 12 * p / n
    if stage == 2:
        return 2 * p + 14 * p / n
    return 16 * p / n


CORRECT = {
    "restore": (check_restore, my_restore),
    "restore_other_order": (check_restore, my_restore_in_another_order),
    "ring": (check_ring_bytes, my_ring_allreduce_bytes),
    "ring_by_rounds": (check_ring_bytes, my_ring_allreduce_bytes_by_rounds),
    "zero": (check_zero_bytes, my_zero_bytes_per_gpu),
    "zero_by_cases": (check_zero_bytes, my_zero_bytes_by_cases),
}


def test_module_exports_every_checker():
    assert sorted(chapter15.__all__) == ["check_average_gradients", "check_restore",
                                         "check_ring_bytes", "check_zero_bytes"]


@pytest.mark.parametrize("name", CORRECT)
def test_accepts_correct_answers(name, capsys):
    checker, solution = CORRECT[name]
    assert checker(solution)
    assert capsys.readouterr().out == f"✓ all {len(checker.cases)} checks passed\n"


def _out(capsys):
    return capsys.readouterr().out


def _hint(out):
    assert "Hint: " in out, out
    return out.rstrip("\n").split("Hint: ", 1)[1]


# --- restore ------------------------------------------------------------------------------------

def test_the_restore_checker_leaves_the_global_random_state_alone():
    _ = torch.manual_seed(0)
    expected = torch.rand(3)
    _ = torch.manual_seed(0)
    check_restore.run(my_restore)
    torch.testing.assert_close(torch.rand(3), expected)


def test_the_restore_reference_equals_the_run_that_never_stopped():
    """Not just the learner's function against the reference: the reference against a run
    of steps_before + steps_after steps in one go."""
    for seed, before, after in check_restore.cases:
        with torch.random.fork_rng():
            data = chapter15._data(seed)
            model, optimizer, generator = chapter15._program(seed)
            model.train()
            for step in range(before + after):
                chapter15._train_step(model, optimizer, generator, data, step)
            straight = torch.cat([p.detach().flatten() for p in model.parameters()])
        resumed = chapter15._resumed_weights(chapter15._restore)(seed, before, after)
        assert torch.equal(resumed, straight)


def test_restore_that_only_loads_the_weights(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    out = _out(capsys)
    assert out.startswith("✗ case 1: for input (0, 3, 4)")
    assert _hint(out).startswith("the optimizer starts again from zero moments")


def test_restore_without_the_optimizer(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.set_state(checkpoint["data_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("the optimizer starts again from zero moments")


def test_restore_that_forgets_dropouts_generator(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        generator.set_state(checkpoint["data_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("dropout draws its masks from torch's global")


def test_restore_that_gives_the_data_state_to_torchs_generator(capsys):
    """The data generator's state put into the global generator: dropout and the batches
    both go wrong, which no single listed mistake explains; the answer is still refused."""
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["data_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _out(capsys).startswith("✗ case 1: for input (0, 3, 4) expected float32 tensor")


def test_restore_that_returns_the_next_step(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.set_state(checkpoint["data_rng"])
        return checkpoint["step"] + 1

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("return checkpoint['step'] itself, not one more")


def test_restore_that_swaps_the_generator_states(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        generator.set_state(checkpoint["torch_rng"])
        torch.set_rng_state(checkpoint["data_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("the two generator states are swapped")


def test_restore_that_forgets_the_data_position(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("the data generator starts again from its seed")


def test_restore_that_reseeds_the_data_generator(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.manual_seed(0)
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("the data generator starts again from its seed")


def test_restore_that_starts_the_schedule_again(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.set_state(checkpoint["data_rng"])
        return 0

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("return the step the checkpoint was taken at")


def test_restore_that_returns_nothing(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.set_state(checkpoint["data_rng"])

    assert not check_restore(my_restore)
    out = _out(capsys)
    assert "did you forget to return" in out
    assert _hint(out).startswith("everything is restored, but the function returns nothing")


def test_restore_that_forgets_the_weights(capsys):
    def my_restore(model, optimizer, generator, checkpoint):
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["torch_rng"])
        generator.set_state(checkpoint["data_rng"])
        return checkpoint["step"]

    assert not check_restore(my_restore)
    assert _hint(_out(capsys)).startswith("the weights are not put back")


# --- ring all-reduce bytes ----------------------------------------------------------------------

def test_ring_bytes_without_the_two_passes(capsys):
    assert not check_ring_bytes(lambda p, n, b: (n - 1) / n * p * b)
    out = _out(capsys)
    assert out.startswith("✗ case 1: for input (1000, 4, 4) expected 6000 but got 3000")
    assert _hint(out).startswith("a ring all-reduce has two passes")


def test_ring_bytes_of_the_whole_gradient_twice(capsys):
    def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
        return 2 * num_parameters * bytes_per_number

    assert not check_ring_bytes(my_ring_allreduce_bytes)
    assert _hint(_out(capsys)).startswith("each process sends only its share")


def test_ring_bytes_counting_numbers(capsys):
    def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
        return 2 * (world_size - 1) / world_size * num_parameters

    assert not check_ring_bytes(my_ring_allreduce_bytes)
    assert _hint(_out(capsys)).startswith("the answer is in bytes")


def test_ring_bytes_with_n_minus_one_whole_copies(capsys):
    assert not check_ring_bytes(lambda p, n, b: 2 * (n - 1) * p * b)
    assert _hint(_out(capsys)).startswith("each chunk is 1/N of the numbers")


def test_ring_bytes_without_brackets(capsys):
    def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
        return 2 * (world_size - 1 / world_size) * num_parameters * bytes_per_number

    assert not check_ring_bytes(my_ring_allreduce_bytes)
    assert _hint(_out(capsys)).startswith("mind the brackets")


def test_ring_bytes_in_bits(capsys):
    def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
        bits = bytes_per_number * 8
        return 2 * (world_size - 1) / world_size * num_parameters * bits

    assert not check_ring_bytes(my_ring_allreduce_bytes)
    assert _hint(_out(capsys)).startswith("bytes, not bits")


def test_ring_bytes_with_integer_division(capsys):
    def my_ring_allreduce_bytes(num_parameters, world_size, bytes_per_number):
        return 2 * (world_size - 1) // world_size * num_parameters * bytes_per_number

    assert not check_ring_bytes(my_ring_allreduce_bytes)
    assert _hint(_out(capsys)).startswith("(n - 1) // n is integer division")


def test_ring_bytes_of_one_process_is_zero():
    assert check_ring_bytes.reference(5000, 1, 4) == 0


# --- ZeRO bytes per GPU -------------------------------------------------------------------------

def _zero(weights=2, gradients=2, optimizer=12, shards=None):
    shards = shards or {0: "", 1: "o", 2: "og", 3: "ogw"}

    def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
        split = shards[stage]
        return num_parameters * (weights / (world_size if "w" in split else 1)
                                 + gradients / (world_size if "g" in split else 1)
                                 + optimizer / (world_size if "o" in split else 1))
    return my_zero_bytes_per_gpu


def test_zero_helper_is_right_by_default():
    assert check_zero_bytes.run(_zero())


def test_zero_with_adams_two_moments_only(capsys):
    assert not check_zero_bytes(_zero(optimizer=8))
    out = _out(capsys)
    assert out.startswith("✗ case 1: for input (1000, 4, 1)")
    assert _hint(out).startswith("Adam's state in mixed precision is 12 bytes")


def test_zero_with_float32_weights_and_gradients(capsys):
    assert not check_zero_bytes(_zero(weights=4, gradients=4))
    assert _hint(_out(capsys)).startswith("the weights and gradients are float16")


def test_zero_stage_one_that_shards_the_gradients(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "og", 2: "og", 3: "ogw"}))
    assert _hint(_out(capsys)).startswith("stage 1 shards the optimizer state only")


def test_zero_stage_one_that_shards_nothing(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "", 2: "og", 3: "ogw"}))
    assert _hint(_out(capsys)).startswith("stage 1 shards the optimizer state: 12 bytes")


def test_zero_stage_two_that_keeps_the_gradients(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "o", 2: "o", 3: "ogw"}))
    assert _hint(_out(capsys)).startswith("stage 2 shards the gradients as well")


def test_zero_stage_three_that_keeps_the_weights(capsys):
    def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
        if stage == 0:
            return 16 * num_parameters
        if stage == 1:
            return 4 * num_parameters + 12 * num_parameters / world_size
        return 2 * num_parameters + 14 * num_parameters / world_size

    assert not check_zero_bytes(my_zero_bytes_per_gpu)
    assert _hint(_out(capsys)).startswith("stage 3 shards everything")


def test_zero_in_float32_without_a_master_copy(capsys):
    assert not check_zero_bytes(_zero(weights=4, gradients=4, optimizer=8))
    assert _hint(_out(capsys)).startswith("that is float32 without a master copy")


def test_zero_that_shards_all_16_bytes_from_stage_one(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "ogw", 2: "ogw", 3: "ogw"}))
    assert _hint(_out(capsys)).startswith("the stages differ in what they shard")


def test_zero_stage_three_that_shards_only_the_weights(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "o", 2: "og", 3: "w"}))
    assert _hint(_out(capsys)).startswith("the stages add up: stage 3 shards the weights")


def test_zero_stages_that_do_not_add_up(capsys):
    assert not check_zero_bytes(_zero(shards={0: "", 1: "o", 2: "g", 3: "w"}))
    assert _hint(_out(capsys)).startswith("the stages add up: each one shards its own part")


def test_zero_in_gigabytes(capsys):
    def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
        return _zero()(num_parameters, world_size, stage) / 1e9

    assert not check_zero_bytes(my_zero_bytes_per_gpu)
    assert _hint(_out(capsys)).startswith("the answer is in bytes, not gigabytes")


def test_zero_stage_zero_that_shards_the_optimizer(capsys):
    def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
        weights, gradients, optimizer = 2, 2, 12 / world_size
        if stage >= 2:
            gradients /= world_size
        if stage >= 3:
            weights /= world_size
        return num_parameters * (weights + gradients + optimizer)

    assert not check_zero_bytes(my_zero_bytes_per_gpu)
    assert _hint(_out(capsys)).startswith("stage 0 is plain data parallelism")


def test_zero_reference_at_llama3_8b_on_8_gpus():
    """The chapter's table: 128.5, 44.2, 30.1 and 16.1 GB."""
    found = [round(check_zero_bytes.reference(8_030_261_248, 8, s) / 1e9, 1) for s in range(4)]
    assert found == [128.5, 44.2, 30.1, 16.1]


# --- my_average_gradients: run on a two-process gloo group the checker starts --------------------
# The reference and every listed mistake are run by tests/test_checker_contract.py; these are
# other ways a learner writes it. Each check launches two processes (a few seconds).


def test_averaging_written_another_way_passes(capsys):
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        count = torch.tensor([num_sequences])                # an integer tensor
        dist.all_reduce(count)
        for p in model.parameters():
            p.grad.mul_(num_sequences / count.item())         # scale first, then add
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    assert check_average_gradients(my_average_gradients)
    assert capsys.readouterr().out == "✓ all 3 checks passed\n"


def test_a_count_of_the_default_dtype_passes(capsys):
    """torch.tensor(float(n), dtype=float32) makes the scale factor float32: a right answer."""
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        total = torch.tensor(float(num_sequences), dtype=torch.float32)
        dist.all_reduce(total)
        world = dist.get_world_size()
        for p in model.parameters():
            p.grad *= num_sequences * world / total
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

    assert check_average_gradients(my_average_gradients)


# Found by a learner's review of the checker (2026-11-25): each crashed the checker, hid the
# real error, or passed a wrong answer.
def test_assigning_the_result_of_all_reduce_is_named(capsys):
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        for p in model.parameters():
            p.grad = dist.all_reduce(p.grad)

    assert not check_average_gradients(my_average_gradients)
    assert capsys.readouterr().out == (
        "✗ case 1: for input (model, num_sequences) with shares (4, 4) on ranks 0 and 1: after "
        "your function, p.grad of 0.weight is None on rank 0. Hint: dist.all_reduce works in "
        "place and returns None: do not assign its result to p.grad (and do not zero the "
        "gradients afterwards)\n")


def test_an_error_on_one_rank_is_shown_not_the_other_rank_s_wait(capsys):
    def my_average_gradients(model, num_sequences):
        if num_sequences == 5:
            raise IndexError("list index out of range")
        chapter15._average_gradients(model, num_sequences)   # right, on the other shares

    assert not check_average_gradients(my_average_gradients)
    assert capsys.readouterr().out == (
        "✗ case 2: for input (model, num_sequences) with shares (3, 5) on ranks 0 and 1: on "
        "rank 1, your function raised IndexError: list index out of range\n")


def test_a_total_written_in_fails_on_the_batch_of_five(capsys):
    import torch.distributed as dist

    BATCH = 8                                          # noqa: N806 (a notebook's global)

    def my_average_gradients(model, num_sequences):
        for p in model.parameters():
            p.grad *= num_sequences / BATCH
            dist.all_reduce(p.grad)

    assert not check_average_gradients(my_average_gradients)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 3: for input (model, num_sequences) with shares (1, 4)")
    assert "Hint: the number of sequences changes from batch to batch" in out


def test_a_function_that_cannot_travel_is_one_line(tmp_path, capsys):
    log = open(tmp_path / "log.txt", "w")                 # a debugging aid, left in

    def my_average_gradients(model, num_sequences):
        print(num_sequences, file=log)

    try:
        assert not check_average_gradients(my_average_gradients)
    finally:
        log.close()
    assert capsys.readouterr().out.startswith(
        "✗ your function cannot be sent to the two processes (")


def test_an_all_reduce_only_rank_0_makes_is_reported_not_left_hanging(capsys):
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        if dist.get_rank() == 0:
            for p in model.parameters():
                dist.all_reduce(p.grad)

    assert not check_average_gradients(my_average_gradients)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1:")
    assert out.endswith("(no `if dist.get_rank() == 0:` around it)\n")


def test_averaging_leaves_the_global_random_state_alone():
    """The checker's own side builds the model and the ranks' gradients without touching the
    global generator (the ranks are other processes)."""
    _ = torch.manual_seed(0)
    expected = torch.rand(3)
    _ = torch.manual_seed(0)
    check_average_gradients._locals()
    chapter15._problem()
    torch.testing.assert_close(torch.rand(3), expected)
