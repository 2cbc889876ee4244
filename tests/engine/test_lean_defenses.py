"""Every registered defense on the lean engine: the release equals the materialised (torch.func) path's to
float rounding, on models covering every supported layer kind, for every defense's distinct transforms."""

from __future__ import annotations

import pytest
import torch

from dpeval.config import build_spec
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.engine.lean import LeanEngine
from dpeval.engine.training import train
from dpeval.runner import prepare

MODELS = {
    "cnn3": {},  # strided convs without bias, a Linear head
    "mlp": {},   # Linear layers (the one-token mask shortcut)
    "dpcnn-small": {"name": "synthetic", "synthetic": {"shape": [1, 16, 16], "size": 200}},
    "resnet20-gn": {"name": "synthetic", "synthetic": {"shape": [3, 8, 8], "size": 200}},  # GroupNorm
}
VARIANTS = {  # parameters beyond the defaults that change the lean plan
    "rs": [{"final_rate": 0.7, "schedule": "constant"}, {"clip": None, "noise_std": 0.0, "final_rate": 0.5,
                                                         "schedule": "constant"}],
    "random-freeze": [{"final_rate": 0.6, "ramp_epochs": 1}],
    "gep": [{"num_bases": 20}, {"num_bases": 20, "biased": True}],
    "groupwise": [{"groups": "layer"}, {"groups": "uniform:2", "clip_fn": "abadi"}],
    "adaclip": [{"clip": 0.1}],
}
CASES = [(name, params) for name in DEFENSES.names() for params in VARIANTS.get(name, [{}])]


def releases(prep, name: str, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The noise-free release of one logical batch of 3 micro-batches, by each engine."""
    out = []
    for engine in ("func", "lean"):
        defense = prep.make_defense(Streams(1).scope("victim"))
        defense.noise_multiplier = 0.0  # compare the signal alone
        defense.begin_epoch(1, prep.spec.train.epochs)
        if name == "adaclip":  # non-trivial public statistics: a ≠ 0, b ≠ 1
            gen = torch.Generator().manual_seed(0)
            defense.load_state_dict({"m": {n: 1e-2 * torch.randn(s, generator=gen)
                                           for n, s in defense.param_shapes.items()},
                                     "b": {n: torch.rand(s, generator=gen) + 0.5
                                           for n, s in defense.param_shapes.items()}})
        psg, bk = PerSampleGradients(prep.model), LeanEngine(prep.model)
        for lo in range(0, len(y), 8):
            xb, yb = x[lo:lo + 8], y[lo:lo + 8]
            if engine == "func":
                defense.clip_and_accumulate(psg(xb, yb))
            else:
                defense.accumulate_lean(bk(xb, yb, defense.lean_plan()))
        assert defense.samples_seen == len(y)
        out.append(torch.cat([g.reshape(-1) for g in defense.release(32).grads.values()]))
    return out


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("name,params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_lean_release_equals_the_materialised_one(name, params, model):
    spec = build_spec({"defense": {"name": name, **params}, "model": {"name": model}, "data": MODELS[model],
                       "train": {"epochs": 2, "batch_size": 32}, "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    x, y = prep.task.train.x[:20], prep.task.train.y[:20]
    func, lean = releases(prep, name, x, y)
    assert func.abs().max() > 0
    assert float((func - lean).abs().max() / func.abs().max()) < 2e-5


def test_lean_training_reports_the_engine_and_matches_func():
    """A short RS run trains to the same weights with either engine (same batches, masks and noise)."""
    finals = {}
    for engine in ("func", "lean"):
        spec = build_spec({"defense": {"name": "rs", "final_rate": 0.5}, "train": {"epochs": 2, "engine": engine,
                                                                                 "lr": 0.001}})
        prep = prepare(spec)
        out = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                    spec.train, prep.sampler, prep.device, progress=False)
        assert out.engine == engine
        finals[engine] = torch.cat([p.detach().reshape(-1) for p in prep.model.parameters()])
    torch.testing.assert_close(finals["func"], finals["lean"], rtol=1e-4, atol=1e-5)
