"""The victim training loop: batch sampling from the victim's streams, and ``train`` stepping only on releases."""

import pytest
import torch

from dpeval.config import build_spec
from dpeval.core.streams import Streams
from dpeval.engine.training import BatchSampler, Observers, TrainingObserver, train
from dpeval.runner import prepare


def test_poisson_batches_draw_each_example_with_probability_q():
    n, batch = 1000, 50
    sampler = BatchSampler(n, batch, "poisson", torch.Generator().manual_seed(0))
    epochs = [sampler.epoch() for _ in range(20)]
    assert all(len(e) == n // batch == sampler.steps_per_epoch for e in epochs)
    sizes = torch.tensor([len(b) for e in epochs for b in e], dtype=torch.float64)
    # Binomial(n, q): mean B, variance B(1 − q); 400 batches put the mean within ~0.35 of B (1 sd)
    assert abs(float(sizes.mean()) - batch) < 2.0
    assert float(sizes.var()) == pytest.approx(batch * (1 - batch / n), rel=0.25)
    for b in epochs[0]:
        assert len(set(b.tolist())) == len(b) and (b >= 0).all() and (b < n).all()
    again = BatchSampler(n, batch, "poisson", torch.Generator().manual_seed(0)).epoch()
    assert all(torch.equal(a, b) for a, b in zip(epochs[0], again))  # the generator decides


def test_shuffle_batches_partition_a_permutation():
    n, batch = 103, 10
    sampler = BatchSampler(n, batch, "shuffle", torch.Generator().manual_seed(1))
    first, second = sampler.epoch(), sampler.epoch()
    assert [len(b) for b in first] == [batch] * (n // batch)
    seen = torch.cat(first)
    assert len(set(seen.tolist())) == len(seen) == batch * (n // batch)  # disjoint; the remainder is dropped
    assert not torch.equal(torch.cat(first), torch.cat(second))  # a fresh permutation per epoch


def test_the_victim_samples_from_its_own_stream():
    """prepare's sampler is the victim's ``sampler`` stream of the run seed, whatever torch's global state."""
    spec = build_spec({"data": {"name": "synthetic", "synthetic": {"size": 300}}, "train": {"batch_size": 30},
                       "seed": 5})
    torch.manual_seed(1)
    a = prepare(spec)
    torch.manual_seed(2)
    b = prepare(spec)
    expected = BatchSampler(len(a.task.train), 30, spec.train.sampling,
                            Streams(5).scope("victim").generator("sampler")).epoch()
    for batches in (a.sampler.epoch(), b.sampler.epoch()):
        assert all(torch.equal(x, y) for x, y in zip(batches, expected))
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):  # init from the victim's stream
        assert torch.equal(p, q), name
    other = BatchSampler(len(a.task.train), 30, spec.train.sampling,
                         Streams(6).scope("victim").generator("sampler")).epoch()
    assert not all(torch.equal(x, y) for x, y in zip(other, expected))


def test_train_steps_only_on_releases_and_calls_back_each_epoch():
    """Every optimizer step is one release; a defense that releases zeros leaves the weights unchanged."""
    spec = build_spec({"data": {"name": "synthetic", "synthetic": {"size": 300}}, "defense": "none",
                       "train": {"epochs": 2, "batch_size": 50, "sampling": "shuffle"}, "device": "cpu"})
    prep = prepare(spec)
    defense = prep.make_defense(prep.streams.scope("victim"))
    releases, callbacks = [], []
    real_release = defense.release

    def zero_release(batch_size):
        shared = real_release(batch_size)
        releases.append(shared)
        shared.grads = {n: torch.zeros_like(g) for n, g in shared.grads.items()}
        return shared

    defense.release = zero_release
    before = [p.detach().clone() for p in prep.model.parameters()]

    class Starts(TrainingObserver):
        def epoch_start(self, epoch, model, d):
            callbacks.append((epoch, d is defense))

    result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
                   progress=False, observer=Starts())
    assert result.steps == len(releases) == 2 * (len(prep.task.train) // 50)
    assert callbacks == [(0, True), (1, True)]
    assert len(result.history) == 2
    for p, q in zip(before, prep.model.parameters()):
        assert torch.equal(p, q)  # Adam (the default optimizer) on zero releases: nothing moves
    # and with the real releases the same loop does train
    fresh = prepare(spec)
    trained = train(fresh.model, fresh.task.train, fresh.task.test, fresh.make_defense(fresh.streams.scope("victim")),
                    spec.train, fresh.sampler, fresh.device, progress=False)
    assert not all(torch.equal(p, q) for p, q in zip(before, fresh.model.parameters()))
    assert trained.history[-1]["test_accuracy"] > 0.5


def test_release_hooks_see_every_step_and_can_add_to_its_sum():
    """An observer's ``before_release`` runs once per step after the batch and before the release (what it
    accumulates is released), ``after_release`` sees that release: the whole-run audit's canaries go in this way.
    Combined observers each see every moment."""
    spec = build_spec({"data": {"name": "synthetic", "synthetic": {"size": 200}}, "defense": {"name": "dpsgd"},
                       "train": {"batch_size": 50, "epochs": 2}, "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    defense = prep.make_defense(prep.streams.scope("victim"))
    calls, released = [], []
    name = next(iter(defense.param_shapes))

    class Before(TrainingObserver):
        def before_release(self, step, epoch, d):
            calls.append((step, epoch))
            assert d is defense and d.samples_seen > 0  # the step's batch is already in the sum
            grad = {n: torch.zeros(1, *s) for n, s in d.param_shapes.items()}
            grad[name].view(1, -1)[0, 0] = 1e6  # one huge per-sample gradient: clipped to C on one coordinate
            seen = d.samples_seen
            d.clip_and_accumulate(grad)
            assert d.samples_seen == seen + 1

    class After(TrainingObserver):
        def after_release(self, step, shared):
            released.append((step, shared))

    train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
          progress=False, observer=Observers(Before(), After()))
    steps = 2 * prep.sampler.steps_per_epoch
    assert calls == [(s, s // prep.sampler.steps_per_epoch) for s in range(steps)]
    assert [s for s, _ in released] == list(range(steps))


@pytest.mark.parametrize("engine", ["func", "lean"])
def test_history_records_the_mean_training_loss_and_density_of_each_epoch(engine):
    """With one step per epoch over the whole pool, the epoch's training loss is the mean cross-entropy of
    the pool at the weights that step started from (computed by the engine's own forward pass); the density
    is the epoch's released fraction (RS withholds nothing in its first epoch)."""
    spec = build_spec({"data": {"name": "synthetic", "synthetic": {"size": 300}}, "defense": {"name": "rs"},
                       "train": {"epochs": 2, "batch_size": 210, "sampling": "shuffle", "engine": engine},
                       "device": "cpu"})
    prep = prepare(spec)
    x, y = prep.task.train.x, prep.task.train.y
    assert len(y) == 210  # one step is the whole pool
    with torch.no_grad():
        initial_loss = float(torch.nn.functional.cross_entropy(prep.model(x), y))
    result = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                   spec.train, prep.sampler, torch.device("cpu"), progress=False)
    losses = [h["train_loss"] for h in result.history]
    densities = [h["density"] for h in result.history]
    assert losses[0] == pytest.approx(initial_loss, rel=1e-5)
    assert len(losses) == 2 and losses[1] != losses[0]
    assert densities[0] == pytest.approx(1.0) and densities[1] < 0.5
    assert sum(densities) / 2 == pytest.approx(result.density)


@pytest.mark.parametrize("schedule,factors", [("constant", [1, 1, 1, 1]), ("step", [1, 1, 0.1, 0.01]),
                                              ("half", [1, 1, 0.1, 0.1])])
def test_the_step_schedules_divide_the_learning_rate_where_they_say(schedule, factors):
    """Over 100 steps, the lr in effect at steps 0, 49, 50 and 99 (`step`: ÷10 at 50% and 75%; `half`: at 50%)."""
    import dataclasses

    from dpeval.config import build_spec
    from dpeval.engine.training import make_optimizer, make_schedule

    cfg = dataclasses.replace(build_spec({}).train, optimizer="sgd", lr=0.1, lr_schedule=schedule)
    optimizer = make_optimizer(torch.nn.Linear(1, 1), cfg)
    scheduler = make_schedule(optimizer, cfg, 100)
    seen = []
    for step in range(100):
        if step in (0, 49, 50, 99):
            seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    assert seen == pytest.approx([0.1 * f for f in factors])
