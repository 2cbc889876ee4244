"""One table of random streams: independent owners, independent streams, bit-for-bit reproduction."""

from __future__ import annotations

import json

import pytest
import torch

from dpeval.config import build_spec
from dpeval.core.streams import STREAMS, Streams, stream_seed
from dpeval.engine.shadow_training import fresh_models
from dpeval.engine.training import BatchSampler, train
from dpeval.runner import execute, prepare
from dpeval.store import ResultStore


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_seeds_are_a_function_of_seed_and_path():
    assert stream_seed(0, "victim:noise") == stream_seed(0, "victim:noise")
    seeds = {stream_seed(s, f"{owner}:{name}") for s in (0, 1) for owner in ("victim", "shadow/0", "shadow/1")
             for name in STREAMS}
    assert len(seeds) == 2 * 3 * len(STREAMS)  # no two streams share a seed
    assert all(0 <= s < 2**63 for s in seeds)


def test_unknown_stream_names_are_refused():
    with pytest.raises(KeyError, match="unknown random stream"):
        Streams(0).generator("noize")


def test_torch_global_restores_the_outer_state():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with Streams(0).scope("victim").torch_global("init"):
        torch.rand(10)
    assert torch.equal(torch.rand(3), expected)


def test_shadows_start_apart_from_the_victim_and_each_other():
    """At seed 0 (where hand-made seeds used to collide) every shadow has its own weights and batches."""
    prep = prepare(build_spec({"seed": 0}))
    scopes = [prep.streams.scope("shadow", i) for i in range(4)]
    shadows = fresh_models(prep.build_model, scopes)
    weights = [flat(prep.model)] + [flat(m) for m in shadows]
    for i in range(len(weights)):
        for j in range(i):
            assert not torch.equal(weights[i], weights[j])
    n = len(prep.task.train)
    batches = [prep.sampler.epoch()[0]] + [BatchSampler(n, 128, "poisson", s.generator("sampler")).epoch()[0]
                                           for s in scopes]
    for i in range(len(batches)):
        for j in range(i):
            assert not torch.equal(batches[i], batches[j])


def test_the_noise_stream_changes_no_batch():
    spec = build_spec({"train": {"epochs": 2}})
    seen, finals = [], []
    for noise_owner in ("victim", "elsewhere"):
        prep = prepare(spec)
        drawn = []
        epoch = prep.sampler.epoch

        def recording_epoch(epoch=epoch, drawn=drawn):
            batches = epoch()
            drawn.extend(batches)
            return batches

        prep.sampler.epoch = recording_epoch
        defense = prep.make_defense(prep.streams.scope(noise_owner))
        train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
              progress=False)
        seen.append(drawn)
        finals.append(flat(prep.model))
    assert len(seen[0]) == len(seen[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*seen))
    assert not torch.equal(finals[0], finals[1])  # the noise did change


def test_same_seed_reproduces_every_metric(tmp_path):
    raw = {"defense": {"name": "rs"}, "attacks": ["ig", "loss"], "train": {"epochs": 2},
           "attack": {"ig_iterations": 25}}
    runs = [execute(build_spec(raw), ResultStore(tmp_path / f"r{i}"), progress=False).flat() for i in range(2)]

    def comparable(metrics):
        return json.dumps({k: v for k, v in metrics.items()
                           if not k.startswith(("time.", "artefacts.")) and k not in ("run_id",)
                           and not k.endswith("time_s")}, sort_keys=True, default=str)

    assert comparable(runs[0]) == comparable(runs[1])
    other = execute(build_spec({**raw, "seed": 1}), ResultStore(tmp_path / "r2"), progress=False).flat()
    assert other["utility.test_accuracy_by_epoch"] != runs[0]["utility.test_accuracy_by_epoch"]
