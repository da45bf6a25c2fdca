"""The training loop and evaluation (minitransformer.training, chapter 9). Saving and loading:
tests/test_pretrained.py."""

import importlib
import math

import pytest
import torch

from minitransformer import Vocabulary
from minitransformer.data import EOS, command_splits, random_batches, token_stream, window_batches
from minitransformer.gpt import GPT, GPTConfig
from minitransformer.training import (
    TrainingHistory,
    evaluate,
    learning_rate,
    train,
)
from helpers import one_thread  # noqa: F401 (a fixture)


def tiny_config(**changes):
    sizes = dict(vocab_size=12, context_length=8, num_layers=1, num_heads=2, d_model=16)
    return GPTConfig(**{**sizes, **changes})


@pytest.fixture(scope="module")
def command_data():
    train_sentences, val_sentences = command_splits(300, 40, seed=0)
    vocab = Vocabulary.from_sentences(train_sentences + val_sentences, specials=(EOS,))
    return vocab, token_stream(train_sentences, vocab), token_stream(val_sentences, vocab)


def seeded_run(command_data, steps=50):
    vocab, stream, val_stream = command_data
    torch.manual_seed(0)
    model = GPT(GPTConfig(len(vocab), 16, 1, 2, 32))
    batches = random_batches(stream, batch_size=16, context_length=16,
                             generator=torch.Generator().manual_seed(0))
    val = window_batches(val_stream, batch_size=16, context_length=16)
    history = train(model, batches, steps=steps, lr=3e-3, val_batches=val, eval_every=10,
                    progress=False)
    return model, history, val


def test_a_seeded_50_step_run_lowers_the_loss(command_data):
    model, history, val = seeded_run(command_data)
    assert isinstance(history, TrainingHistory)
    assert history.steps == [10, 20, 30, 40, 50]
    assert len(history.train_losses) == len(history.val_losses) == 5
    assert len(history.learning_rates) == 50
    first = math.log(len(command_data[0]))
    assert history.val_losses[-1] < first - 1.0
    assert history.train_losses[-1] < history.train_losses[0]
    assert evaluate(model, val) == pytest.approx(history.val_losses[-1])
    assert not model.training


def test_training_twice_with_the_same_seed_gives_the_same_history(command_data):
    _, first, _ = seeded_run(command_data, steps=20)
    _, again, _ = seeded_run(command_data, steps=20)
    assert first == again


def test_a_tiny_fixed_batch_is_memorised():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    idx = torch.randint(12, (4, 8), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(12, (4, 8), generator=torch.Generator().manual_seed(2))
    history = train(model, [(idx, targets)], steps=150, lr=1e-2, eval_every=150,
                    weight_decay=0.0, progress=False)
    assert history.train_losses[-1] < 1.0
    logits, loss = model(idx, targets)
    assert loss.item() < 0.05
    assert torch.equal(logits.argmax(-1), targets)


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    rates = [learning_rate(s, steps=100, lr=1.0, warmup_steps=10) for s in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(rates[:9], rates[1:10]))
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))
    assert rates[-1] == pytest.approx(0.1)


def test_a_list_of_batches_is_reused_and_an_iterator_must_last():
    model = GPT(tiny_config())
    batch = (torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    assert train(model, [batch, batch], steps=5, lr=1e-3, progress=False).steps == [5]
    with pytest.raises(ValueError, match="ran out after 2 batches"):
        train(model, iter([batch, batch]), steps=5, lr=1e-3, progress=False)
    with pytest.raises(ValueError, match="batches is empty"):
        train(model, [], steps=5, lr=1e-3, progress=False)


def test_errors_are_named():
    model = GPT(tiny_config())
    idx = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(TypeError, match="each batch must be a tuple"):
        train(model, [[idx, idx]], steps=1, lr=1e-3, progress=False)
    with pytest.raises(ValueError, match="hold the targets"):
        train(model, [(idx,)], steps=1, lr=1e-3, progress=False)
    with pytest.raises(ValueError, match="lr must be positive"):
        train(model, [(idx, idx)], steps=1, lr=0.0, progress=False)
    with pytest.raises(ValueError, match="steps must be at least 1"):
        train(model, [(idx, idx)], steps=0, lr=1e-3, progress=False)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        train(lambda *b: b, [(idx, idx)], steps=1, lr=1e-3, progress=False)
    with pytest.raises(ValueError, match="the loss became"):
        train(model, [(idx, idx)], steps=3, lr=1e30, warmup_steps=1, max_grad_norm=1e30,
              progress=False)


def test_one_loop_trains_a_model_with_three_inputs():
    """Chapter 10's encoder-decoder passes (src, tgt_in, targets): the loop does not care."""

    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(5, 5)

        def forward(self, src, tgt_in, targets):
            logits = self.table(src) + self.table(tgt_in)
            return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                             targets.flatten())

    torch.manual_seed(0)
    src = torch.tensor([[0, 1, 2], [3, 4, 0]])
    batch = (src, torch.zeros_like(src), src)
    history = train(Echo(), [batch], steps=60, lr=0.1, eval_every=20, progress=False)
    assert history.train_losses[-1] < history.train_losses[0]


def test_progress_bar_can_be_turned_on_and_off(capsys):
    model = GPT(tiny_config())
    batch = (torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    train(model, [batch], steps=3, lr=1e-3, progress=False)
    assert "training" not in capsys.readouterr().err
    train(model, [batch], steps=3, lr=1e-3, progress=True)
    assert "training: 100%" in capsys.readouterr().err


def test_the_gradient_is_clipped_before_each_step(monkeypatch):
    module = importlib.import_module("minitransformer.training")
    norms = []
    original = module.make_optimizer

    def recording_optimizer(model, lr, weight_decay):
        optimizer = original(model, lr, weight_decay)
        step = optimizer.step

        def step_and_record(*args, **kwargs):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(g) for g in grads]))))
            return step(*args, **kwargs)

        optimizer.step = step_and_record
        return optimizer

    monkeypatch.setattr(module, "make_optimizer", recording_optimizer)
    torch.manual_seed(0)
    model = GPT(tiny_config())
    idx = torch.randint(12, (4, 8))
    train(model, [(idx, idx)], steps=3, lr=1e-3, max_grad_norm=1e-3, progress=False)
    assert len(norms) == 3
    assert max(norms) <= 1e-3 * (1 + 1e-4), norms


def test_an_endless_validation_iterator_is_refused_not_read_forever():
    model = GPT(tiny_config())
    ids = torch.randint(12, (200,))
    endless = random_batches(ids, batch_size=2, context_length=8,
                             generator=torch.Generator().manual_seed(0))
    batch = (torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="val_batches is an iterator, which may never end"):
        train(model, [batch], steps=2, lr=1e-3, val_batches=endless, progress=False)


def test_eval_batches_takes_a_fixed_set_from_an_iterator():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    ids = torch.randint(12, (200,))
    endless = random_batches(ids, batch_size=2, context_length=8,
                             generator=torch.Generator().manual_seed(0))
    again = random_batches(ids, batch_size=2, context_length=8,
                           generator=torch.Generator().manual_seed(0))
    first_three = [next(again) for _ in range(3)]
    batch = (torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    history = train(model, [batch], steps=2, lr=1e-3, val_batches=endless, eval_batches=3,
                    eval_every=1, progress=False)
    assert history.val_losses[-1] == pytest.approx(evaluate(model, first_three), abs=1e-6)
    with pytest.raises(ValueError, match="fewer than eval_batches=5"):
        train(model, [batch], steps=2, lr=1e-3, val_batches=[batch] * 4, eval_batches=5,
              progress=False)
    with pytest.raises(ValueError, match="eval_batches needs val_batches"):
        train(model, [batch], steps=2, lr=1e-3, eval_batches=5, progress=False)


def test_a_warm_up_longer_than_the_run_is_refused():
    model = GPT(tiny_config())
    batch = (torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="warmup_steps=50 is more than steps=2"):
        train(model, [batch], steps=2, lr=1e-3, warmup_steps=50, progress=False)
    history = train(model, [batch], steps=2, lr=1e-3, warmup_steps=2, progress=False)
    assert max(history.learning_rates) == pytest.approx(1e-3)


def test_training_ignores_targets_of_minus_100():
    torch.manual_seed(0)
    model = GPT(tiny_config())
    idx = torch.randint(12, (2, 8))
    targets = idx.clone()
    targets[:, :4] = -100
    _, loss = model(idx, targets)
    logits, _ = model(idx)
    expected = torch.nn.functional.cross_entropy(logits[:, 4:].flatten(0, 1),
                                                 idx[:, 4:].flatten())
    torch.testing.assert_close(loss, expected)
    with pytest.raises(ValueError, match="every position of targets is -100"):
        model(idx, torch.full_like(idx, -100))


def test_learning_rate_starts_above_zero_and_stays_at_the_floor_after_the_last_step():
    """Step 0 takes lr / warmup_steps; after the last step the rate stays at lr / 10 (it used
    to follow the cosine back up past ``steps``)."""
    assert learning_rate(0, steps=100, lr=1.0, warmup_steps=10) == pytest.approx(0.1)
    assert learning_rate(99, steps=100, lr=1.0, warmup_steps=10) == pytest.approx(0.1)
    for step in (100, 150, 189, 1000):
        assert learning_rate(step, steps=100, lr=1.0, warmup_steps=10) == pytest.approx(0.1)


def test_wsd_rates_before_the_decay_do_not_depend_on_the_run_s_length():
    """Warm-up, then lr, then a linear decay over the last fifth to lr / 10, then lr / 10. A
    longer run has the same rates until the shorter one's decay; the cosine has not."""
    from minitransformer.training import wsd_decay_start, wsd_learning_rate
    rates = {n: [wsd_learning_rate(s, steps=n, lr=1.0, warmup_steps=4) for s in range(n + 5)]
             for n in (40, 60)}
    assert wsd_decay_start(40, warmup_steps=4) == 32
    assert rates[40][:32] == rates[60][:32] and rates[40][32] < 1.0
    assert rates[40][0] == pytest.approx(0.25) and rates[40][3:32] == [1.0] * 29
    assert rates[40][39] == pytest.approx(0.1) and rates[40][40:] == [pytest.approx(0.1)] * 5
    assert all(a > b for a, b in zip(rates[40][32:40], rates[40][33:40]))
    cosine = {n: [learning_rate(s, steps=n, lr=1.0, warmup_steps=4) for s in range(n)]
              for n in (40, 60)}
    assert cosine[40][4:32] != cosine[60][4:32]
