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
    weights = 2 * num_parameters / (world_size if stage >= 3 else 1)
    gradients = 2 * num_parameters / (world_size if stage >= 2 else 1)
    optimizer_state = 12 * num_parameters / (world_size if stage >= 1 else 1)
    return weights, gradients, optimizer_state


def my_zero_bytes_by_cases(num_parameters, world_size, stage):
    p, n = num_parameters, world_size
    if stage == 0:
        return 2 * p, 2 * p, 12 * p                         # ints are right too
    if stage == 1:
        return 2 * p, 2 * p, 12 * p / n
    if stage == 2:
        return 2 * p, 2 * p / n, 12 * p / n
    return 2 * p / n, 2 * p / n, 12 * p / n


def test_zero_bytes_as_a_list_or_by_floor_division_is_refused(capsys):
    """The exercise asks for a tuple, and the bytes on one GPU are a fraction when world_size
    does not divide them (case 2 has 7 GPUs): a list, or //, fails with its hint."""
    def as_a_list(num_parameters, world_size, stage):
        return list(my_zero_bytes_per_gpu(num_parameters, world_size, stage))

    def by_floor_division(num_parameters, world_size, stage):
        p, n = num_parameters, world_size
        return 2 * p // (n if stage >= 3 else 1), 2 * p // (n if stage >= 2 else 1), \
            12 * p // (n if stage >= 1 else 1)

    assert not check_zero_bytes(as_a_list)
    assert "return a tuple, not a list" in _hint(_out(capsys))
    assert not check_zero_bytes(by_floor_division)
    assert "divide with /" in _hint(_out(capsys))


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
    assert out.startswith("✗ case 1: for input (1000, 3, 4) expected 5333 but got 2667")
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


# --- ZeRO bytes per GPU: (weights, gradients, optimizer_state) --------------------------------

def _zero(weights=2, gradients=2, optimizer=12, shards=None):
    shards = shards or {0: "", 1: "o", 2: "og", 3: "ogw"}

    def my_zero_bytes_per_gpu(num_parameters, world_size, stage):
        split = shards[stage]
        return (num_parameters * weights / (world_size if "w" in split else 1),
                num_parameters * gradients / (world_size if "g" in split else 1),
                num_parameters * optimizer / (world_size if "o" in split else 1))
    return my_zero_bytes_per_gpu


def test_zero_helper_is_right_by_default():
    assert check_zero_bytes.run(_zero())


def test_zero_stage_two_that_shards_the_weights_instead_of_the_gradients(capsys):
    """Issue 29: the same total as the right answer at every stage, told apart by the parts."""
    wrong = _zero(shards={0: "", 1: "o", 2: "ow", 3: "ogw"})
    assert all(sum(wrong(*case)) == sum(check_zero_bytes.reference(*case))
               for case in check_zero_bytes.cases)
    assert not check_zero_bytes(wrong)
    out = _out(capsys)
    assert out.startswith("✗ case 2: for input (1000, 7, 2) expected (2000, 285.7, 1714) "
                          "but got (285.7, 2000, 1714)")
    assert _hint(out).startswith("stage 2 shards the gradients, not the weights")


def test_zero_that_returns_the_total(capsys):
    assert not check_zero_bytes(lambda p, n, s: sum(_zero()(p, n, s)))
    assert _hint(_out(capsys)).startswith("return the three parts")


def test_zero_reference_at_llama3_8b_on_8_gpus():
    """The chapter's table: 128.5, 44.2, 30.1 and 16.1 GB."""
    found = [round(sum(check_zero_bytes.reference(8_030_261_248, 8, s)) / 1e9, 1)
             for s in range(4)]
    assert found == [128.5, 44.2, 30.1, 16.1]


# --- my_average_gradients: run on a two-process gloo group the checker starts --------------------
# The reference and every listed mistake are run by tests/test_checker_contract.py; these are
# other ways a learner writes it. Each check launches two processes (a few seconds).


@pytest.fixture(scope="module")
def verdicts() -> dict:
    """The verdicts on four more answers, from one launch of two processes (run_many: each
    makes the same collective calls on both ranks and raises nothing) instead of one launch
    each; run and run_many judge alike, and how a verdict is printed is the contract's test.
    (Defined in here: a function sent to the processes travels by value, not by module.)"""
    import torch.distributed as dist

    def scaling_first(model, num_sequences):
        count = torch.tensor([num_sequences])                # an integer tensor
        dist.all_reduce(count)
        for p in model.parameters():
            p.grad.mul_(num_sequences / count.item())         # scale first, then add
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def float32_count(model, num_sequences):
        total = torch.tensor(float(num_sequences), dtype=torch.float32)
        dist.all_reduce(total)
        world = dist.get_world_size()
        for p in model.parameters():
            p.grad *= num_sequences * world / total
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

    def assigning_all_reduce(model, num_sequences):
        for p in model.parameters():
            p.grad = dist.all_reduce(p.grad)

    BATCH = 8                                          # noqa: N806 (a notebook's global)

    def total_written_in(model, num_sequences):
        for p in model.parameters():
            p.grad *= num_sequences / BATCH
            dist.all_reduce(p.grad)

    answers = {"another way": scaling_first, "float32 count": float32_count,
               "assigned all_reduce": assigning_all_reduce, "total written in": total_written_in}
    return dict(zip(answers, check_average_gradients.run_many(list(answers.values()))))


def test_averaging_written_another_way_passes(verdicts):
    verdict = verdicts["another way"]
    assert verdict and verdict.message == "✓ all 3 checks passed"


def test_a_count_of_the_default_dtype_passes(verdicts):
    """torch.tensor(float(n), dtype=float32) makes the scale factor float32: a right answer."""
    assert verdicts["float32 count"]


# Found by a learner's review of the checker (2026-11-25): each crashed the checker, hid the
# real error, or passed a wrong answer.
def test_assigning_the_result_of_all_reduce_is_named(verdicts):
    verdict = verdicts["assigned all_reduce"]
    assert not verdict
    assert verdict.message == (
        "✗ case 1: for input (model, num_sequences) with shares (4, 4) on ranks 0 and 1: after "
        "your function, p.grad of 0.weight is None on rank 0. Hint: dist.all_reduce works in "
        "place and returns None: do not assign its result to p.grad (and do not zero the "
        "gradients afterwards)")


def test_a_total_written_in_fails_on_the_batch_of_five(verdicts):
    verdict = verdicts["total written in"]
    assert not verdict
    assert verdict.message.startswith(
        "✗ case 3: for input (model, num_sequences) with shares (1, 4)")
    assert "Hint: the number of sequences changes from batch to batch" in verdict.message


def test_an_error_on_one_rank_is_shown_not_the_other_rank_s_wait(capsys):
    def my_average_gradients(model, num_sequences):
        if num_sequences == 5:
            raise IndexError("list index out of range")
        chapter15._average_gradients(model, num_sequences)   # right, on the other shares

    assert not check_average_gradients(my_average_gradients)
    assert capsys.readouterr().out == (
        "✗ case 2: for input (model, num_sequences) with shares (3, 5) on ranks 0 and 1: on "
        "rank 1, your function raised IndexError: list index out of range\n")


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


# Issue 29.
def test_the_untouched_stub_is_recognised_without_starting_processes(monkeypatch, capsys):
    def my_average_gradients(model, num_sequences):
        # your code here
        raise NotImplementedError

    def no_launch(functions):
        raise AssertionError("two processes were started for the stub")

    monkeypatch.setattr(chapter15, "_run_on_two_ranks", no_launch)
    assert not check_average_gradients(my_average_gradients)
    assert capsys.readouterr().out == "✗ not implemented yet\n"
    assert not chapter15._is_stub(chapter15._average_gradients)
    assert not chapter15._is_stub(lambda model, n: model.zero_grad())


def test_a_size_mismatch_on_rank_0_alone_gets_the_collective_hint(capsys):
    """The count reduced by rank 0 alone meets rank 1's first gradient: gloo aborts rank 0's
    process (no Python error to catch), and the hint says what went wrong."""
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        total = torch.tensor(float(num_sequences))
        if dist.get_rank() == 0:
            dist.all_reduce(total)
        for p in model.parameters():
            p.grad *= num_sequences
            dist.all_reduce(p.grad)
            p.grad /= total

    assert not check_average_gradients(my_average_gradients)
    out = capsys.readouterr().out
    assert out.startswith("✗ case 1: for input (model, num_sequences) with shares (4, 4) on "
                          "ranks 0 and 1, rank 0 was stopped inside a collective call that "
                          "the other rank did not match. Hint: every rank must make")
    assert out.endswith("(no `if dist.get_rank() == 0:` around it)\n")
    assert "gloo" not in out and out.count("\n") == 1


# --- a catalogue of typical wrong answers, each with the hint it must get --------------------
# Written as a learner writes them. ``None``: a mistake no hint names; it must still fail, and
# get no hint at all rather than another mistake's. The share named is measured below. The
# averaging entries run on one launch of two processes (run_many), as they make matching
# collectives; those that break the group are the separate tests above.

def _restore(*, model="model", optimizer="optimizer", torch_rng="torch_rng",
             data_rng="data_rng", step=lambda c: c["step"]):
    def my_restore(mod, opt, gen, checkpoint):
        if model:
            mod.load_state_dict(checkpoint[model] if model != "all" else checkpoint)
        if optimizer:
            opt.load_state_dict(checkpoint[optimizer] if optimizer != "all" else checkpoint)
        if torch_rng == "seed":
            torch.manual_seed(checkpoint["step"])
        elif torch_rng:
            torch.set_rng_state(checkpoint[torch_rng])
        if data_rng == "seed":
            gen.manual_seed(1234)
        elif data_rng:
            gen.set_state(checkpoint[data_rng])
        return step(checkpoint)
    return my_restore


def _averaging(scale_before=True, divide="total", reduce="all_reduce", weights=False):
    import torch.distributed as dist

    def my_average_gradients(model, num_sequences):
        total = torch.tensor(float(num_sequences))
        dist.all_reduce(total)
        for p in model.parameters():
            if scale_before:
                p.grad *= num_sequences
            if reduce == "all_reduce":
                dist.all_reduce(p.grad)
            elif reduce == "broadcast":
                dist.broadcast(p.grad, src=0)
            elif reduce == "reduce":
                dist.reduce(p.grad, dst=0)
            elif reduce == "a copy":
                dist.all_reduce(p.grad.clone())
            elif reduce == "avg":
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            if weights:
                dist.all_reduce(p.data)
            if not scale_before and divide == "total":
                p.grad *= num_sequences / total
            elif divide == "total":
                p.grad /= total
            elif divide == "world":
                p.grad /= dist.get_world_size()
            elif divide == "own":
                p.grad /= num_sequences
            elif divide == "own x world":
                p.grad /= num_sequences * dist.get_world_size()
            elif divide == "8":
                p.grad /= 8
    return my_average_gradients


def _parts(*names):
    """The hint for a restore that leaves these parts out."""
    return "; and ".join(chapter15._PART_HINTS[name] for name in names)


CATALOGUE = [
    # my_restore
    ("restore weights only", check_restore, _restore(optimizer=None, torch_rng=None,
                                                      data_rng=None),
     _parts("optimizer", "torch_rng", "data_rng")),
    ("restore no optimizer", check_restore, _restore(optimizer=None), _parts("optimizer")),
    ("restore no dropout rng", check_restore, _restore(torch_rng=None), _parts("torch_rng")),
    ("restore reseeds torch", check_restore, _restore(torch_rng="seed"), _parts("torch_rng")),
    ("restore no data rng", check_restore, _restore(data_rng=None), _parts("data_rng")),
    ("restore reseeds data", check_restore, _restore(data_rng="seed"), _parts("data_rng")),
    ("restore swapped", check_restore, _restore(torch_rng="data_rng", data_rng="torch_rng"),
     "the two generator states are swapped"),
    ("restore step + 1", check_restore, _restore(step=lambda c: c["step"] + 1),
     "not one more"),
    ("restore returns 0", check_restore, _restore(step=lambda c: 0),
     "return the step the checkpoint was taken at"),
    ("restore returns nothing", check_restore, _restore(step=lambda c: None),
     "the function returns nothing"),
    ("restore no weights", check_restore, _restore(model=None), _parts("model")),
    ("restore whole into model", check_restore, _restore(model="all"),
     "give model.load_state_dict"),
    ("restore whole into optimizer", check_restore, _restore(optimizer="all"),
     "give optimizer.load_state_dict"),
    # my_ring_allreduce_bytes
    ("ring one pass", check_ring_bytes, lambda p, n, b: (n - 1) / n * p * b,
     "a ring all-reduce has two passes"),
    ("ring whole twice", check_ring_bytes, lambda p, n, b: 2 * p * b, "only its share"),
    ("ring numbers", check_ring_bytes, lambda p, n, b: 2 * (n - 1) / n * p,
     "multiply the count of numbers"),
    ("ring N - 1 copies", check_ring_bytes, lambda p, n, b: 2 * (n - 1) * p * b,
     "each chunk is 1/N"),
    ("ring brackets", check_ring_bytes, lambda p, n, b: 2 * (n - 1 / n) * p * b,
     "mind the brackets"),
    ("ring bits", check_ring_bytes, lambda p, n, b: 2 * (n - 1) / n * p * b * 8, "not bits"),
    ("ring //", check_ring_bytes, lambda p, n, b: 2 * (n - 1) // n * p * b, "// n is"),
    ("ring divided twice", check_ring_bytes, lambda p, n, b: 2 * (1 - 1 / n) / n * p * b,
     "do not divide by N again"),
    ("ring inverted", check_ring_bytes, lambda p, n, b: 2 * n / (n - 1) * p * b,
     "not N/(N - 1)"),
    ("ring sent and received", check_ring_bytes, lambda p, n, b: 4 * (n - 1) / n * p * b,
     "what it receives"),
    ("ring naive", check_ring_bytes, lambda p, n, b: (n - 1) * p * b, "naive all-reduce"),
    ("ring 4 bytes", check_ring_bytes, lambda p, n, b: 2 * (n - 1) / n * p * 4, "not 4"),
    ("ring MB", check_ring_bytes, lambda p, n, b: 2 * (n - 1) / n * p * b / 1e6,
     "not megabytes"),
    ("ring MiB", check_ring_bytes, lambda p, n, b: 2 * (n - 1) / n * p * b / 1024 / 1024,
     "not MiB"),
    # my_zero_bytes_per_gpu
    ("zero total", check_zero_bytes, lambda p, n, s: sum(_zero()(p, n, s)),
     "return the three parts"),
    ("zero order", check_zero_bytes, lambda p, n, s: tuple(reversed(_zero()(p, n, s))),
     "in the order weights"),
    ("zero per parameter", check_zero_bytes, lambda p, n, s: _zero()(1, n, s),
     "multiply by num_parameters"),
    ("zero 8 bytes of Adam", check_zero_bytes, _zero(optimizer=8), "12 bytes a parameter: a"),
    ("zero master as weights", check_zero_bytes,
     _zero(weights=6, optimizer=8),
     "the float32 master copy of the weights is optimizer state"),
    ("zero float32", check_zero_bytes, _zero(weights=4, gradients=4), "float16 (2 bytes"),
    ("zero stage 1 gradients", check_zero_bytes, _zero(shards={0: "", 1: "og", 2: "og",
                                                               3: "ogw"}),
     "optimizer state only; the gradients"),
    ("zero stage 1 nothing", check_zero_bytes, _zero(shards={0: "", 1: "", 2: "og",
                                                             3: "ogw"}), "kept whole"),
    ("zero stage 2 keeps gradients", check_zero_bytes,
     _zero(shards={0: "", 1: "o", 2: "o", 3: "ogw"}), "only the weights stay whole"),
    ("zero stage 2 weights", check_zero_bytes,
     _zero(shards={0: "", 1: "o", 2: "ow", 3: "ogw"}), "the gradients, not the weights"),
    ("zero stage 3 keeps weights", check_zero_bytes,
     _zero(shards={0: "", 1: "o", 2: "og", 3: "og"}), "stage 3 shards everything"),
    ("zero float32 no master", check_zero_bytes, _zero(weights=4, gradients=4, optimizer=8),
     "without a master copy"),
    ("zero all from stage 1", check_zero_bytes,
     _zero(shards={0: "", 1: "ogw", 2: "ogw", 3: "ogw"}), "differ in what they shard"),
    ("zero stage 3 weights only", check_zero_bytes,
     _zero(shards={0: "", 1: "o", 2: "og", 3: "w"}), "stage 3 shards the weights as well"),
    ("zero stages alone", check_zero_bytes, _zero(shards={0: "", 1: "o", 2: "g", 3: "w"}),
     "each one shards its own part"),
    ("zero GB", check_zero_bytes, lambda p, n, s: tuple(v / 1e9 for v in _zero()(p, n, s)),
     "not gigabytes"),
    ("zero stage 0 shards", check_zero_bytes,
     _zero(shards={0: "o", 1: "o", 2: "og", 3: "ogw"}), "plain data parallelism"),
    ("zero 8 bytes of Adam, float32", check_zero_bytes,
     _zero(weights=4, gradients=2, optimizer=8), None),
]

AVERAGING = [
    ("mean of means", _averaging(scale_before=False, divide="world"),
     "the mean of the ranks' means"),
    ("ReduceOp.AVG", _averaging(scale_before=False, reduce="avg", divide=None),
     "the mean of the ranks' means"),
    ("sum only", _averaging(scale_before=False, divide=None), "divide the sum by"),
    ("a copy", _averaging(reduce="a copy"), "give it p.grad itself, not a copy"),
    ("weights reduced", _averaging(reduce=None, weights=True), "(p.data holds the weights)"),
    ("right, plus the weights", _averaging(weights=True), "so every weight doubled"),
    ("scaled after", _averaging(scale_before=False), "scale before the all_reduce"),
    ("broadcast", _averaging(scale_before=False, reduce="broadcast", divide=None),
     "dist.broadcast copies"),
    ("reduce", _averaging(reduce="reduce"), "dist.reduce leaves the sum on one rank"),
    ("weighted / world", _averaging(divide="world"), "not by the world size"),
    ("weighted / own", _averaging(divide="own"), "not by this rank's own num_sequences"),
    ("weighted, not divided", _averaging(divide=None), "still needs dividing"),
    ("own x world", _averaging(divide="own x world"), "num_sequences * world_size"),
    ("8 written in", _averaging(divide="8"), "changes from batch to batch"),
]


def _check(checker, wrong, fragment, message):
    assert "\n" not in message
    if fragment is None:
        assert "Hint: " not in message, message
        return
    assert "Hint: " in message, message
    hint = message.split("Hint: ", 1)[1]
    listed = [h for h in checker.mistakes if fragment in h]
    if fragment in checker.mistakes:
        assert hint == fragment, message
    elif listed:
        assert len(listed) == 1 and hint == listed[0], (fragment, listed, message)
    assert fragment in hint, (fragment, message)


@pytest.mark.parametrize("name, checker, wrong, fragment", CATALOGUE,
                         ids=[entry[0] for entry in CATALOGUE])
def test_catalogue(name, checker, wrong, fragment):
    verdict = checker.run(wrong)
    assert not verdict, "a wrong answer passed"
    _check(checker, wrong, fragment, verdict.message)


def test_catalogue_of_averaging_mistakes():
    verdicts = check_average_gradients.run_many([wrong for _, wrong, _ in AVERAGING])
    for (name, wrong, fragment), verdict in zip(AVERAGING, verdicts):
        assert not verdict, f"{name}: a wrong answer passed"
        _check(check_average_gradients, wrong, fragment, verdict.message)


def test_catalogue_coverage():
    """At least 90% of the catalogue's wrong answers get a hint that names them (the
    averaging ones, and the separate tests above of a crash, a None gradient, a Python
    number, an all_reduce on one rank and a size mismatch, which all get one); every exercise
    has at least eight."""
    separate = 5
    entries = [fragment for *_, fragment in CATALOGUE] + [f for *_, f in AVERAGING]
    named = sum(fragment is not None for fragment in entries) + separate
    share = named / (len(entries) + separate)
    print(f"chapter 15: {named} of {len(entries) + separate} typical mistakes named "
          f"({share:.0%})")
    assert share >= 0.9
    for checker in (check_restore, check_ring_bytes, check_zero_bytes):
        assert sum(entry[1] is checker for entry in CATALOGUE) >= 8
    assert len(AVERAGING) >= 8
