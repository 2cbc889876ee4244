"""AdaCliP: the w-space transform and its reduction to DP-SGD, clipping, noise, Theorem 1's scale, and
statistics that are a function of the noisy release only."""

import math

import pytest
import torch
from opacus.accountants import RDPAccountant
from scipy import stats

from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.models import build_model
from dpeval.core.params import from_dict
from dpeval.core.per_sample import PerSampleGradients, micro_batches
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.adaclip import AdaCliP, AdaCliPParams, optimal_scale
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.dpsgd import DPSGD, ClipParams
from dpeval.victims import plan_privacy


def make(shapes, sigma=0.0, seed=0, **kw):
    params = from_dict(AdaCliPParams, kw, "defense")  # declared ranges and validate(), as for user input
    return AdaCliP(params, DefenseContext(shapes, sigma, Streams(seed)))


def flat(grads):
    return torch.cat([g.reshape(-1) for g in grads.values()])


def small_model():
    torch.manual_seed(1)
    return build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,))


def pin(defense, a, b):
    """Fix the transform: a (shift) and b (scale) given as flat tensors or scalars."""
    def as_dict(v):
        if isinstance(v, dict):
            return v
        return {n: torch.full(s, float(v)) for n, s in defense.param_shapes.items()}
    defense.load_state_dict({"m": as_dict(a), "b": as_dict(b)})


def test_registered_and_params_validated():
    assert "adaclip" in DEFENSES.names()
    for field, value in [("clip", 0.0), ("beta1", 1.0), ("beta2", -0.1), ("h1", 0.0), ("variance", "both")]:
        with pytest.raises(ConfigError, match=f"defense.{field}: must"):
            from_dict(AdaCliPParams, {field: value}, "defense")
    with pytest.raises(ConfigError, match="defense.h2"):
        from_dict(AdaCliPParams, {"h1": 1e-3, "h2": 1e-4}, "defense")
    assert from_dict(AdaCliPParams, {"h1": 1e-5, "h2": 1e-4}, "defense").h1 == 1e-5


def test_initial_state_is_algorithm_1_line_2():
    d = make({"w": torch.Size([10])}, h1=1e-12, h2=1e-2)
    assert torch.equal(d.m["w"], torch.zeros(10))
    torch.testing.assert_close(d.s2["w"], torch.full((10,), 1e-14))  # s⁰ = √(h1·h2), state s² = h1·h2
    torch.testing.assert_close(d.b["w"], torch.full((10,), math.sqrt(1e-7 * 10 * 1e-7)))


def test_a0_b1_is_dpsgd_bit_for_bit_and_b_equal_c_matches_dpsgd_with_clip_c():
    """a = 0, b = 1, clip C: the identical computation as DP-SGD with clip C (same noise draw): bit-exact.
    a = 0, b = C·1, clip 1 (the paper's reduction): DP-SGD with clip C up to float rounding."""
    model = small_model()
    shapes = {n: p.shape for n, p in model.named_parameters()}
    x, y = torch.rand(24, 1, 8, 8), torch.randint(0, 10, (24,))
    psg = PerSampleGradients(model)
    sigma, clip = 1.3, 0.3

    def run(defense):
        for xb, yb in micro_batches(x, y, 10):
            defense.clip_and_accumulate(psg(xb, yb))
        return flat(defense.release(24).grads)

    dpsgd = run(DPSGD(ClipParams(clip=clip), DefenseContext(shapes, sigma, Streams(5))))
    ada = make(shapes, sigma, seed=5, clip=clip)
    pin(ada, 0.0, 1.0)
    assert torch.equal(run(ada), dpsgd)
    ada_c = make(shapes, sigma, seed=5, clip=1.0)
    pin(ada_c, 0.0, clip)
    torch.testing.assert_close(run(ada_c), dpsgd, rtol=1e-4, atol=1e-6)
    # and a non-trivial transform does change the release (the test above can fail)
    ada_m = make(shapes, sigma, seed=5, clip=clip)
    pin(ada_m, 0.01, 1.0)
    assert not torch.allclose(run(ada_m), dpsgd)


def test_clipped_w_norms_are_at_most_clip():
    """One example per release, σ = 0, B = 1: (g̃ − a)/b is that example's clipped w, norm ≤ C; examples
    inside the ball pass unchanged."""
    shapes = {"u": torch.Size([40]), "v": torch.Size([3, 5])}
    gen = torch.Generator().manual_seed(0)
    a = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    b = {n: torch.rand(s, generator=gen) + 0.1 for n, s in shapes.items()}
    for clip in (1.0, 0.4):
        defense = make(shapes, clip=clip)
        for scale in (1e-3, 0.01, 1.0, 100.0):
            pin(defense, a, b)
            g = {n: (a[n] + scale * torch.randn(s, generator=gen))[None] for n, s in shapes.items()}
            defense.clip_and_accumulate(g)
            shared = defense.release(1)
            w = flat({n: (shared.grads[n] - a[n]) / b[n] for n in shapes})
            w_true = flat({n: (g[n][0] - a[n]) / b[n] for n in shapes})
            assert w.norm() <= clip * (1 + 1e-6)
            if w_true.norm() < clip:
                torch.testing.assert_close(w, w_true, rtol=1e-4, atol=1e-6)
            else:
                assert w.norm() == pytest.approx(clip, rel=1e-5)


def test_noise_is_added_once_to_the_sum_in_w_space():
    """Pure noise (no examples): (g̃ − a)/b ~ N(0, (σC/B)²) per coordinate whatever b is — the noise on the
    mean is σC/B, not the √B-times-larger σC/√B of per-example noise (chi-square on 200k coordinates)."""
    sigma, clip, batch, d = 1.1, 0.8, 64, 200_000
    shapes = {"w": torch.Size([d])}
    defense = make(shapes, sigma, clip=clip)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(d, generator=gen), torch.rand(d, generator=gen) * 3 + 0.01
    pin(defense, {"w": a}, {"w": b})
    shared = defense.release(batch)
    z = ((shared.grads["w"] - a) / b).double()
    expected = sigma * clip / batch
    chi2 = float((z**2).sum() / expected**2)
    assert 2 * min(stats.chi2.cdf(chi2, d), stats.chi2.sf(chi2, d)) > 1e-4, chi2 / d
    assert stats.kstest((z / expected).numpy(), "norm").pvalue > 1e-4
    torch.testing.assert_close(shared.extra["adaclip.noise_std"]["w"], b * expected)
    # noise_std is the RMS of the noise over the released coordinates: measured on the release itself
    assert shared.noise_std == pytest.approx(float((shared.grads["w"] - a).double().pow(2).mean().sqrt()), rel=0.02)


def test_theorem1_scale_minimises_noise_under_the_variance_budget():
    """b_i = √s_i·√Σs_j meets E‖w‖² = Σ s_i²/b_i² = 1 with equality and has the least noise energy Σb_i² =
    (Σs_i)² of every feasible scale: whitening (b = √d·s) and random feasible scales all have more."""
    gen = torch.Generator().manual_seed(0)
    s = torch.rand(500, generator=gen).double() ** 3 + 1e-4
    b = optimal_scale({"w": s})["w"]
    assert float((s**2 / b**2).sum()) == pytest.approx(1.0, rel=1e-9)
    assert float((b**2).sum()) == pytest.approx(float(s.sum()) ** 2, rel=1e-9)
    whitening = math.sqrt(500) * s
    assert float((s**2 / whitening**2).sum()) == pytest.approx(1.0)
    assert float((whitening**2).sum()) > 1.5 * float((b**2).sum())
    for _ in range(200):
        other = torch.rand(500, generator=gen).double() + 0.01
        other = other * float((s**2 / other**2).sum()).__pow__(0.5)  # rescale onto the constraint
        assert float((s**2 / other**2).sum()) == pytest.approx(1.0)
        assert float((other**2).sum()) >= float((b**2).sum()) * (1 - 1e-12)
    # The paper's §3 example: one informative coordinate of std μ, d − 1 near-constant ones: the noise
    # energy is ≈ σ²μ², d times less than DP-SGD's dσ²μ² with C = μ.
    d, mu = 1000, 2.0
    s = torch.full((d,), 1e-9).double()
    s[0] = mu
    assert float((optimal_scale({"w": s})["w"] ** 2).sum()) == pytest.approx(mu**2, rel=1e-3)


def test_variance_estimate_is_unbiased_for_the_per_example_variance():
    """No clipping, a = true mean: B·[(g̃ − m)² − b²σ²C²/B²] averages to the per-example variance s² (the
    correction for noise on the sum; without it the mean would be ≈ 7× too large here), and
    ``variance: batch_mean`` estimates s²/B. Averaged over 20k coordinates, checked to 5 standard errors."""
    d, batch, s_true, sigma = 20_000, 32, 0.5, 0.05
    gen = torch.Generator().manual_seed(1)
    mu = torch.randn(d, generator=gen)
    g = mu + s_true * torch.randn(batch, d, generator=gen)
    beta = 2 * s_true * math.sqrt(d)  # ‖w_k‖ ≈ 0.5 < C = 1: no example is clipped
    for mode, target in (("per_example", s_true**2), ("batch_mean", s_true**2 / batch)):
        defense = make({"w": torch.Size([d])}, sigma, clip=1.0, variance=mode)
        pin(defense, {"w": mu}, {"w": torch.full((d,), beta)})
        defense.clip_and_accumulate({"w": g})
        shared = defense.release(batch)
        pin(defense, {"w": mu}, {"w": torch.full((d,), beta)})  # the m, b the release used
        estimate = defense.raw_variance(shared.grads, batch)["w"].double()
        noise_term = (beta * sigma / batch) ** 2 * (batch if mode == "per_example" else 1)
        assert noise_term > 5 * target  # the correction matters
        se = float(estimate.std()) / math.sqrt(d)
        assert abs(float(estimate.mean()) - target) < 5 * se, (mode, float(estimate.mean()), target, se)


def test_statistics_are_a_function_of_the_release_only():
    """Two private batches with the same w-sum (exact in float) but different per-example gradients, the
    same noise: identical releases and identical m, s², b. A batch with another sum changes the release and
    so the statistics (the test can fail). And m, s² follow eqs. (4)–(5) applied to the release itself."""
    shapes = {"w": torch.Size([6])}
    batch_a = torch.tensor([[1.0, 2.0, 0.0, 0.0, 4.0, 1.0], [3.0, 0.0, 4.0, 2.0, 0.0, 1.0]])
    batch_b = torch.tensor([[2.0, 1.0, 2.0, 1.0, 2.0, 1.0], [2.0, 1.0, 2.0, 1.0, 2.0, 1.0]])
    assert torch.equal(batch_a.sum(0), batch_b.sum(0)) and not torch.equal((batch_a**2).sum(0), (batch_b**2).sum(0))
    batch_c = batch_b * 0.5
    states, releases = [], []
    # s² moves only where a coordinate's clamped estimate v changes side of the clamps (v is at h1 or h2
    # for almost every noise draw), so the seed is one whose noise lets batch_c move every statistic.
    for batch in (batch_a, batch_b, batch_c):
        defense = make(shapes, sigma=0.5, seed=8, clip=100.0, h2=10.0)
        pin(defense, 0.0, 1.0)
        defense.clip_and_accumulate({"w": batch})
        releases.append(defense.release(2))
        states.append(defense.state_dict())
    assert torch.equal(releases[0].grads["w"], releases[1].grads["w"])
    for key in ("m", "s2", "b"):
        assert torch.equal(states[0][key]["w"], states[1][key]["w"]), key
        assert not torch.equal(states[0][key]["w"], states[2][key]["w"]), key
    # eqs. (4)–(5) from the release: m = 0.99·0 + 0.01·g̃; v = clamp(2·(g̃² − 1²·0.5²·100²/2²), h1, h2).
    g = releases[0].grads["w"]
    p = AdaCliPParams(clip=100.0, h2=10.0)
    v = (2 * (g**2 - (0.5 * 100.0 / 2) ** 2)).clamp(p.h1, p.h2)
    s2_before = p.h1 * p.h2
    torch.testing.assert_close(states[0]["m"]["w"], 0.01 * g)
    torch.testing.assert_close(states[0]["s2"]["w"], 0.9 * s2_before + 0.1 * v)
    assert states[0]["at_h1"] + states[0]["at_h2"] <= 6
    assert releases[0].extra["adaclip.at_h2"] == states[0]["at_h2"] == int((2 * (g**2 - 625)).ge(10.0).sum())


def test_release_extra_holds_the_transform_it_used_and_state_round_trips():
    shapes = {"w": torch.Size([50])}
    defense = make(shapes, sigma=1.0, seed=2, h2=1.0)
    for _ in range(3):
        defense.clip_and_accumulate({"w": torch.randn(8, 50)})
        before = defense.state_dict()
        shared = defense.release(8)
        assert torch.equal(shared.extra["adaclip.a"]["w"], before["m"]["w"])
        assert torch.equal(shared.extra["adaclip.b"]["w"], before["b"]["w"])
        assert 0 <= shared.extra["adaclip.frac_at_h2"] <= 1
    state = defense.state_dict()
    twin = make(shapes, sigma=1.0, seed=9, h2=1.0)
    twin.load_state_dict(state)
    for key in ("m", "s2", "b"):
        assert torch.equal(twin.state_dict()[key]["w"], state[key]["w"])
    assert twin.state_dict()["steps"] == 3


def test_saturation_when_noise_dominates():
    """With noise ≫ signal, the clamped estimate hits h2 on ≈ P(|Z| > 1) ≈ 31.7% of coordinates per step
    and s² settles near 0.317·h2 for every coordinate (docs/gep-adaclip.md): b becomes nearly uniform."""
    d, batch, h2 = 20_000, 16, 1e-4
    defense = make({"w": torch.Size([d])}, sigma=2.0, seed=0, h2=h2)
    fracs = []
    for _ in range(60):
        defense.clip_and_accumulate({"w": 1e-3 * torch.randn(batch, d)})
        fracs.append(defense.release(batch).extra["adaclip.frac_at_h2"])
    assert sum(fracs[-20:]) / 20 == pytest.approx(0.317, abs=0.02)
    assert float(defense.s2["w"].mean()) == pytest.approx(0.317 * h2, rel=0.1)


def test_accounting_is_dpsgd_accounting():
    spec = build_spec({"defense": {"name": "adaclip"}, "privacy": {"epsilon": 3.0}})
    plan = plan_privacy(spec, AdaCliP, 1258)
    ref = plan_privacy(build_spec({"defense": {"name": "dpsgd"}, "privacy": {"epsilon": 3.0}}), DPSGD, 1258)
    assert plan.noise_multiplier == plan.accounted_noise_multiplier == ref.noise_multiplier
    acc = RDPAccountant()
    acc.history = [(plan.noise_multiplier, plan.sample_rate, plan.steps)]
    assert plan.epsilon == pytest.approx(acc.get_epsilon(delta=plan.delta), rel=1e-9)
    defense = AdaCliP(AdaCliPParams(), DefenseContext({"w": torch.Size([3])}, 1.7, Streams(0)))
    assert defense.accounted_noise_multiplier() == 1.7


def test_adaclip_trains_end_to_end_through_the_runner():
    from dpeval.engine.training import train
    from dpeval.runner import prepare

    spec = build_spec({"data": {"name": "synthetic", "synthetic": {"size": 300}}, "defense": {"name": "adaclip"},
                       "train": {"epochs": 2, "batch_size": 50}, "privacy": {"epsilon": 8.0}, "device": "cpu"})
    prep = prepare(spec)
    defense = prep.make_defense(prep.streams.scope("victim"))
    result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
                   progress=False)
    assert defense.steps == result.steps > 0
    assert math.isfinite(result.history[-1]["test_accuracy"])
    assert all(torch.isfinite(v).all() for v in defense.b.values())
