"""Replay equals training: the release a gradient attack observes at a recorded state is the release training
produced at that state, bit for bit, for every registered defense (and the one-file fixture plug-in).

Training runs with the materialised per-sample engine (the attack path's reference engine) and shuffled
batches of exactly B. At the first step of every epoch the test records what the runner's snapshot records
(the weights and the defense's public state), plus what only training knows: the batch it drew, the defense's
noise-generator state, and the release it produced. The attack path (the release oracle of an ``AttackerView``
built by the runner's ``attacker_view``) must reproduce that release from the recorded state when
given the same batch and noise stream — so a defense whose replay reads anything but the recorded state (GEP
rebuilding its anchors from the victim's final weights, a ``load_state_dict`` that restores nothing) fails.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib

import pytest
import torch

from dpeval import attacking
from dpeval.config import build_spec
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses import DEFENSES
from dpeval.engine.training import TrainingObserver, train
from dpeval.runner import prepare

EPOCHS = 3
PLUGIN = "plugin-dpsgd"


@pytest.fixture(scope="module")
def plugin():
    module = importlib.import_module("tests.fixtures.plugin_defense")
    if PLUGIN not in DEFENSES:
        importlib.reload(module)
    yield
    DEFENSES.unregister(PLUGIN)


def record_training(name: str, precision: str = "fp32"):
    """Train a small digits run, recording at each epoch's first step: weights, public state, batch, noise
    generator state and the release training made."""
    spec = build_spec({"defense": {"name": name}, "data": {"max_train": 256},
                       "train": {"epochs": EPOCHS, "batch_size": 64, "physical_batch_size": 64, "engine": "func",
                                 "sampling": "shuffle", "optimizer": "sgd", "lr": 0.5, "precision": precision},
                       "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    seed_globals(prep.streams)
    defense = prep.make_defense(prep.streams.scope("victim"))
    records: dict[str, dict] = {}
    current: dict = {}

    class Snapshot(TrainingObserver):
        def epoch_start(self, epoch, model, d):
            name = "init" if epoch == 0 else f"epoch:{epoch}"
            current.clear()
            current.update(name=name, weights=copy.deepcopy(model.state_dict()),
                           public=copy.deepcopy(d.state_dict()), noise=d.generator.get_state())
            records[name] = current.copy()

    draw = prep.sampler.epoch

    def epoch_batches():
        batches = draw()
        records[current["name"]]["batch"] = batches[0]
        return batches

    prep.sampler.epoch = epoch_batches
    release = defense.release

    def recording_release(batch_size):
        out = release(batch_size)
        records[current["name"]].setdefault("release", out)
        return out

    defense.release = recording_release
    train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
          progress=False, observer=Snapshot())
    return prep, defense, records


def attacker_view(prep, records, noise_state):
    """An AttackerView as the runner builds it; its defenses start from the recorded noise-generator state."""
    def make_defense(streams, bound_to=None):
        d = prep.make_defense(streams, bound_to)
        d.generator.set_state(noise_state)
        return d

    states = {n: r["weights"] for n, r in records.items()} | {"final": copy.deepcopy(prep.model.state_dict())}
    public = {n: r["public"] for n, r in records.items()}
    view = attacking.attacker_view(prep, states, public, None)
    return dataclasses.replace(view, release=dataclasses.replace(view.release, make_defense=make_defense))


def replay(prep, records, at):
    """The release the attack path computes for the batch training drew at ``at``."""
    view = attacker_view(prep, records, records[at]["noise"])
    x, y = prep.task.train.x[records[at]["batch"]], prep.task.train.y[records[at]["batch"]]
    return view.release(view.model_at(at), x, y, at, Streams(99).scope("replay"))[0]


@pytest.mark.parametrize("name", [*DEFENSES.names(), PLUGIN])
def test_attack_replayedis_the_release_training_made(name, request):
    if name == PLUGIN:
        request.getfixturevalue("plugin")
    prep, trained, records = record_training(name)
    assert set(records) == {"init", *(f"epoch:{e}" for e in range(1, EPOCHS))}
    for at, record in records.items():
        replayed = replay(prep, records, at)
        made = record["release"]
        assert set(replayed.grads) == set(made.grads)
        for n in made.grads:
            assert torch.equal(replayed.grads[n], made.grads[n]), f"{name} at {at}: {n} differs"
        assert (replayed.mask is None) == (made.mask is None)
        if made.mask is not None:
            assert all(torch.equal(replayed.mask[n], made.mask[n]) for n in made.mask)


@pytest.mark.parametrize("name", ["dpsgd", "rs", "gep"])
def test_attack_replayedcomputes_in_the_precision_training_used(name):
    """train.precision bf16: the attack's replay is again the release training made, bit for bit — and it is
    not the float32 release of the same state (the precision reached the replay, not only training)."""
    prep, _, records = record_training(name, "bf16")
    for at, record in records.items():
        replayed, made = replay(prep, records, at), record["release"]
        assert all(torch.equal(replayed.grads[n], made.grads[n]) for n in made.grads), f"{name} at {at}"
    at = "epoch:1"
    prep.spec.train.precision = "fp32"  # the same recorded state, replayed in float32
    in_fp32 = replay(prep, records, at)
    assert any(not torch.equal(in_fp32.grads[n], records[at]["release"].grads[n]) for n in in_fp32.grads)


def test_replayedcheck_catches_a_state_that_is_not_restored(monkeypatch):
    """Positive control: a defense whose load_state_dict restores nothing (RS's masks) fails the check."""
    prep, trained, records = record_training("rs")
    monkeypatch.setattr(type(trained), "load_state_dict", lambda self, state: None)
    at = "epoch:2"
    replayed = replay(prep, records, at)
    assert any(not torch.equal(replayed.grads[n], records[at]["release"].grads[n]) for n in replayed.grads)
