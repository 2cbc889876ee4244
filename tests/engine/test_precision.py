"""``train.precision: bf16``: the per-sample passes run under bfloat16 autocast, while the gradients the defense is
given, its clipping, sums and noise stay float32 — so the clip bound and the accounting are exact — and every
path that recomputes a training release (the attack's oracle, shadow models, the run audit) computes it the same
way."""

import pytest
import torch

from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.models import build_model
from dpeval.core.per_sample import PerSampleGradients, compute_precision
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.dpsgd import DPSGD, ClipParams
from dpeval.engine.lean import engine_choice
from dpeval.engine.shadow_training import train_shadows, train_shadows_sequential
from dpeval.engine.training import train
from dpeval.runner import prepare


def dpcnn_batch(n: int = 12):
    torch.manual_seed(0)
    model = build_model("dpcnn-small", (1, 28, 28), 10, (0.5,), (0.25,))
    return model, torch.rand(n, 1, 28, 28), torch.randint(0, 10, (n,))


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten(1) for g in grads.values()], dim=1)


def test_bf16_gradients_are_float32_computed_in_bfloat16():
    model, x, y = dpcnn_batch()
    g32 = PerSampleGradients(model)(x, y)
    g16 = PerSampleGradients(model, precision="bf16")(x, y)
    assert all(g16[n].dtype == torch.float32 and g16[n].shape == g32[n].shape for n in g32)
    error = ((flat(g16) - flat(g32)).norm(dim=1) / flat(g32).norm(dim=1)).max()
    assert 1e-4 < error < 0.2  # autocast was on (not float32's result), and the gradients are still the gradients


def test_bf16_each_sample_contributes_at_most_clip_and_noise_is_unchanged():
    model, x, y = dpcnn_batch()
    shapes = {n: p.shape for n, p in model.named_parameters()}
    grads = PerSampleGradients(model, precision="bf16")(x, y)
    clip = 0.01 * float(flat(grads).norm(dim=1).min())  # every sample clipped
    for i in range(len(y)):
        defense = DPSGD(ClipParams(clip=clip), DefenseContext(shapes, 0.0, Streams(0)))
        defense.clip_and_accumulate({n: g[i:i + 1] for n, g in grads.items()})
        norm = float(flat({n: g[None] for n, g in defense.release(1).grads.items()}).norm())
        assert clip * (1 - 1e-5) <= norm <= clip * (1 + 1e-6)
    released = {}
    for precision in ("fp32", "bf16"):
        defense = DPSGD(ClipParams(clip=0.1), DefenseContext(shapes, 1.3, Streams(0)))
        defense.clip_and_accumulate(PerSampleGradients(model, precision=precision)(x, y))
        released[precision] = defense.release(len(y))
    assert released["bf16"].noise_std == released["fp32"].noise_std == pytest.approx(1.3 * 0.1 / len(y))


def test_precision_names_are_checked():
    with pytest.raises(ValueError, match="fp16"):
        compute_precision("fp16", "cpu")
    with pytest.raises(ConfigError, match="train.precision"):
        build_spec({"train": {"precision": "fp16"}})


def test_bf16_runs_on_the_func_engine():
    model, _, _ = dpcnn_batch()
    dp = DPSGD(ClipParams(), DefenseContext({n: p.shape for n, p in model.named_parameters()}, 1.0, Streams(0)))
    assert engine_choice("auto", model, dp)[0] == "lean"
    assert engine_choice("auto", model, dp, "cpu", 0, "bf16")[0] == "func"
    with pytest.raises(ConfigError, match="train.precision bf16 needs the func engine"):
        engine_choice("lean", model, dp, "cpu", 0, "bf16")
    with pytest.raises(ConfigError, match="train.precision bf16 needs the func engine"):
        prepare(build_spec({"train": {"engine": "lean", "precision": "bf16"}}))


def digits_spec(precision: str, max_train: int = 256, **train):
    return build_spec({"data": {"max_train": max_train}, "privacy": {"noise_multiplier": 1.0},
                       "train": {"epochs": 2, "batch_size": 64, "precision": precision, **train}})


def test_bf16_training_is_keyed_apart_and_learns_as_float32_does():
    fp32, bf16 = digits_spec("fp32", 1000, epochs=5), digits_spec("bf16", 1000, epochs=5)
    # the default leaves the run keys of earlier results as they were
    assert fp32.run_key == build_spec({"data": {"max_train": 1000}, "privacy": {"noise_multiplier": 1.0},
                                       "train": {"epochs": 5, "batch_size": 64}}).run_key
    assert bf16.run_key != fp32.run_key
    accuracy, weights = {}, {}
    for spec in (fp32, bf16):
        prep = prepare(spec)
        seed_globals(prep.streams)
        defense = prep.make_defense(prep.streams.scope("victim"))
        result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
                       progress=False)
        assert result.engine == ("func" if spec is bf16 else "lean")  # auto
        accuracy[spec.train.precision] = result.history[-1]["test_accuracy"]
        weights[spec.train.precision] = torch.cat([p.detach().flatten() for p in prep.model.parameters()])
    assert not torch.equal(weights["fp32"], weights["bf16"])
    assert accuracy["fp32"] > 0.5  # it learns (10 classes: chance is 0.1) ...
    assert accuracy["bf16"] > accuracy["fp32"] - 0.1  # ... and so does bf16, about as well


def test_vectorised_shadows_train_in_the_victims_precision():
    """Shadows trained together (their own vmap) equal the normal training loop's in bf16, and differ from
    float32 shadows: the precision reached both paths."""
    trained = {}
    for precision in ("fp32", "bf16"):
        spec = digits_spec(precision, engine="func")
        prep = prepare(spec)
        x, y = prep.task.train.x[:256], prep.task.train.y[:256]
        pools = [torch.arange(0, 256, 2), torch.arange(1, 256, 2)]
        scopes = [prep.streams.scope("shadow", i) for i in range(2)]

        def make(i, m, s, prep=prep, scopes=scopes):
            return prep.make_defense(scopes[i], m, s)

        cpu = torch.device("cpu")
        vec = train_shadows(prep.build_model, x, y, pools, make, spec.train, scopes, cpu, progress=False)
        seq = train_shadows_sequential(prep.build_model, x, y, pools, make, spec.train, scopes, cpu, progress=False)
        for a, b in zip(vec, seq):
            for name in a:
                torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-4)
        trained[precision] = vec
    weight = next(n for n in trained["fp32"][0] if n.endswith("weight"))
    assert not torch.equal(trained["fp32"][0][weight], trained["bf16"][0][weight])
