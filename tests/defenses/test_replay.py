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

from dpeval import runner
from dpeval.config import build_spec
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses import DEFENSES
from dpeval.engine.training import train
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


def record_training(name: str):
    """Train a small digits run, recording at each epoch's first step: weights, public state, batch, noise
    generator state and the release training made."""
    spec = build_spec({"defense": {"name": name}, "data": {"max_train": 256},
                       "train": {"epochs": EPOCHS, "batch_size": 64, "physical_batch_size": 64, "engine": "func",
                                 "sampling": "shuffle", "optimizer": "sgd", "lr": 0.5},
                       "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    seed_globals(prep.streams)
    defense = prep.make_defense(prep.streams.scope("victim"))
    records: dict[str, dict] = {}
    current: dict = {}

    def snapshot(epoch, model, d):
        name = "init" if epoch == 0 else f"epoch:{epoch}"
        current.clear()
        current.update(name=name, weights=copy.deepcopy(model.state_dict()), public=copy.deepcopy(d.state_dict()),
                       noise=d.generator.get_state())
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
          progress=False, on_epoch_start=snapshot)
    return prep, defense, records


def attacker_view(prep, records, noise_state):
    """An AttackerView as the runner builds it; its defenses start from the recorded noise-generator state."""
    def make_defense(streams, bound_to=None):
        d = prep.make_defense(streams, bound_to)
        d.generator.set_state(noise_state)
        return d

    states = {n: r["weights"] for n, r in records.items()} | {"final": copy.deepcopy(prep.model.state_dict())}
    public = {n: r["public"] for n, r in records.items()}
    view = runner.attacker_view(prep, states, public, None)
    return dataclasses.replace(view, release=dataclasses.replace(view.release, make_defense=make_defense))


@pytest.mark.parametrize("name", [*DEFENSES.names(), PLUGIN])
def test_attack_replay_is_the_release_training_made(name, request):
    if name == PLUGIN:
        request.getfixturevalue("plugin")
    prep, trained, records = record_training(name)
    assert set(records) == {"init", *(f"epoch:{e}" for e in range(1, EPOCHS))}
    for at, record in records.items():
        view = attacker_view(prep, records, record["noise"])
        x, y = prep.task.train.x[record["batch"]], prep.task.train.y[record["batch"]]
        replay, _ = view.release(view.model_at(at), x, y, at, Streams(99).scope("replay"))
        made = record["release"]
        assert set(replay.grads) == set(made.grads)
        for n in made.grads:
            assert torch.equal(replay.grads[n], made.grads[n]), f"{name} at {at}: {n} differs"
        assert (replay.mask is None) == (made.mask is None)
        if made.mask is not None:
            assert all(torch.equal(replay.mask[n], made.mask[n]) for n in made.mask)


def test_replay_check_catches_a_state_that_is_not_restored(monkeypatch):
    """Positive control: a defense whose load_state_dict restores nothing (RS's masks) fails the check."""
    prep, trained, records = record_training("rs")
    monkeypatch.setattr(type(trained), "load_state_dict", lambda self, state: None)
    at = "epoch:2"
    view = attacker_view(prep, records, records[at]["noise"])
    x, y = prep.task.train.x[records[at]["batch"]], prep.task.train.y[records[at]["batch"]]
    replay, _ = view.release(view.model_at(at), x, y, at, Streams(99).scope("replay"))
    assert any(not torch.equal(replay.grads[n], records[at]["release"].grads[n]) for n in replay.grads)
