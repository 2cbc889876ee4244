"""Random sparsification and random freeze: mask, clip-after-mask, noise, schedules, accounting, comm."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.params import from_dict
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.random_freeze import RandomFreezeParams
from dpeval.defenses.rs import RSParams
from dpeval.engine.training import TrainingObserver, train
from dpeval.runner import prepare
from dpeval.victims import plan_privacy
from tests.helpers import spec_for

SHAPES = {"w": torch.Size([40, 25]), "b": torch.Size([37])}
D = 40 * 25 + 37


def make(name="rs", sigma=0.0, seed=0, steps_per_epoch=1, **params):
    cls = DEFENSES.get(name)
    return cls(cls.Params(**params), DefenseContext(SHAPES, sigma, Streams(seed), steps_per_epoch=steps_per_epoch))


def flat(grads):
    return torch.cat([grads[n].reshape(-1) for n in SHAPES])


def random_grads(batch, scale=1.0):
    return {n: torch.randn(batch, *s) * scale for n, s in SHAPES.items()}


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(min_value=0.0, max_value=0.999), seed=st.integers(0, 10_000))
def test_release_has_exactly_floor_rd_zeros_at_the_mask(rate, seed):
    defense = make(schedule="constant", final_rate=rate, seed=seed, sigma=1.0)
    defense.begin_epoch(0, 5)
    defense.clip_and_accumulate(random_grads(3))
    shared = defense.release(3)
    released = flat(shared.grads)
    keep = flat(shared.mask)
    assert int((~keep).sum()) == math.floor(rate * D)
    assert torch.all(released[~keep] == 0)          # masked coordinates are exactly zero
    assert torch.all(released[keep] != 0)           # kept ones carry signal + noise
    assert shared.density == pytest.approx(1 - math.floor(rate * D) / D)


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.0, 0.95), clip=st.floats(0.01, 10.0), log_scale=st.floats(-3, 4), seed=st.integers(0, 999))
def test_clip_after_mask_bounds_each_contribution(rate, clip, log_scale, seed):
    """One sample per release, σ = 0: the release is that sample's contribution. Its norm over kept
    coordinates is ≤ C, and when the *masked* gradient is already within C it is passed unchanged —
    i.e. the clip norm is computed after masking, not on the full gradient."""
    torch.manual_seed(seed)
    defense = make(schedule="constant", final_rate=rate, clip=clip, seed=seed)
    defense.begin_epoch(0, 1)
    g = random_grads(1, scale=10**log_scale)
    defense.clip_and_accumulate(g)
    shared = defense.release(1)
    released, keep = flat(shared.grads), flat(shared.mask)
    masked = flat({n: v[0] for n, v in g.items()}) * keep
    assert released.norm() <= clip * (1 + 1e-6)
    if masked.norm() > clip:
        assert released.norm() == pytest.approx(clip, rel=1e-4)
    else:
        torch.testing.assert_close(released, masked, rtol=1e-5, atol=1e-7)


def test_clip_norm_is_over_kept_coordinates_not_the_full_gradient():
    defense = make(schedule="constant", final_rate=0.5, clip=1.0)
    defense.begin_epoch(0, 1)
    keep = flat(defense._views(defense.keep))
    g_flat = torch.where(keep, torch.full((D,), 0.01), torch.full((D,), 100.0))  # huge only where masked
    g = {n: v.unsqueeze(0) for n, v in defense._views(g_flat).items()}
    defense.clip_and_accumulate(g)
    released = flat(defense.release(1).grads)
    torch.testing.assert_close(released, g_flat * keep)  # masked norm < C: no clipping at all


def test_noise_std_on_kept_and_zero_on_masked():
    sigma, clip, batch = 1.7, 0.8, 32
    shapes = {"w": torch.Size([200_000])}
    cls = DEFENSES.get("rs")
    defense = cls(RSParams(clip=clip, final_rate=0.6, schedule="constant"), DefenseContext(shapes, sigma, Streams(1)))
    defense.begin_epoch(0, 1)
    grads = {"w": torch.randn(batch, 200_000) * 0.001}
    defense.clip_and_accumulate(grads)
    keep = defense.keep
    clipped_mean = (grads["w"] * keep).sum(0) / batch  # all norms < C: no clipping
    shared = defense.release(batch)
    noise = (shared.grads["w"] - clipped_mean).double()
    assert torch.all(noise[~keep] == 0)
    kept = noise[keep]
    expected = sigma * clip / batch
    assert shared.noise_std == pytest.approx(expected)
    chi2 = float((kept**2).sum() / expected**2)
    p_value = 2 * min(stats.chi2.cdf(chi2, kept.numel()), stats.chi2.sf(chi2, kept.numel()))
    assert p_value > 1e-4


def test_release_is_the_masked_noisy_mean_bit_for_bit_and_hands_over_the_withheld_noise():
    """The release against an independent computation from the same noise stream (one N(0, 1) draw per
    parameter, in order, times σC): (Σ_i c_i·(m ⊙ g_i) + m ⊙ z) / B exactly, masked coordinates exactly 0, and
    what ``on_release`` receives is (1 − m) ⊙ z / B. Two releases under one mask: the second uses the next draws."""
    sigma, clip, batch = 1.3, 0.5, 5
    seen = []

    class Watched(DEFENSES.get("rs")):
        def on_release(self, shared, unreleased_noise):
            seen.append(unreleased_noise)
            super().on_release(shared, unreleased_noise)

    defense = Watched(RSParams(clip=clip, final_rate=0.7, schedule="constant"),
                      DefenseContext(SHAPES, sigma, Streams(3)))
    defense.begin_epoch(0, 1)
    reference = Streams(3).generator("noise")
    keep = defense._views(defense.keep)
    for _ in range(2):
        grads = random_grads(batch)
        masked = {n: g * keep[n] for n, g in grads.items()}
        norms = torch.stack([masked[n].reshape(batch, -1).pow(2).sum(1) for n in SHAPES], 1).sum(1).sqrt()
        c = (clip / (norms + 1e-6)).clamp(max=1.0)
        defense.clip_and_accumulate(grads)
        shared = defense.release(batch)
        for n, shape in SHAPES.items():
            z = torch.randn(shape, generator=reference) * (sigma * clip)
            total = torch.einsum("b,b...->...", c, masked[n])
            assert torch.equal(shared.grads[n], (total + z * keep[n]) / batch), n
            assert torch.equal(seen[-1][n], (~keep[n]) * z / batch), n
            assert torch.equal(shared.mask[n], keep[n])


def test_a_new_mask_reaches_the_release_and_the_lean_plan():
    """The per-mask caches (the released views, the float weights, the release's 0/1 weights) follow every
    new mask, also one set from outside (``keep =``, as a subclass or a replay does)."""
    defense = make(schedule="constant", final_rate=0.5, sigma=1.0)
    defense.begin_epoch(0, 1)
    for keep in (defense.keep, ~defense.keep, torch.ones(D, dtype=torch.bool)):
        defense.keep = keep
        defense.clip_and_accumulate(random_grads(2))
        shared = defense.release(2)
        assert torch.equal(flat(shared.mask), keep)
        assert torch.all(flat(shared.grads)[~keep] == 0) and torch.all(flat(shared.grads)[keep] != 0)
        scale = defense.lean_plan().scale
        assert torch.equal(flat(scale), keep.float())


# The paper's gradual cooling at r* = 0.9, worked out by hand: epoch 0 dense, the last epoch at r*, equal steps
# in between (a single epoch is epoch 0, so dense).
@pytest.mark.parametrize("epochs,expected", [(1, [0.0]), (2, [0.0, 0.9]), (5, [0.0, 0.225, 0.45, 0.675, 0.9]),
                                             (10, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])])
def test_linear_schedule(epochs, expected):
    defense = make(final_rate=0.9)
    rates = []
    for e in range(epochs):
        defense.begin_epoch(e, epochs)
        rates.append(defense.rate)
    assert rates == pytest.approx(expected)
    assert rates[0] == 0.0


def test_constant_schedule():
    defense = make(final_rate=0.7, schedule="constant")
    for e in range(4):
        defense.begin_epoch(e, 4)
        assert defense.rate == 0.7


def test_refresh_schedule_redraws_k_masks_per_epoch_and_ramps():
    k, epochs, steps = 3, 2, 6
    defense = make(final_rate=0.5, schedule="refresh", refresh=k, steps_per_epoch=steps, sigma=0.0)
    seen = []
    for e in range(epochs):
        defense.begin_epoch(e, epochs)
        for _ in range(steps):
            defense.clip_and_accumulate(random_grads(2))
            shared = defense.release(2)
            seen.append((shared.extra["period"], shared.rate, shared.mask_is_new, flat(shared.mask)))
    periods = [p for p, *_ in seen]
    assert periods == [0, 0, 1, 1, 2, 2] * epochs
    # six masks (3 per epoch, 2 epochs) ramping from dense to r* = 0.5 in equal steps, worked out by hand
    assert [seen[i][1] for i in range(0, len(seen), 2)] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert [new for *_, new, _ in seen] == [True, False] * (k * epochs)
    masks = [m for *_, m in seen]
    assert not torch.equal(masks[2], masks[4])  # a redraw is a different mask


def test_refresh_k1_equals_linear():
    a, b = make(final_rate=0.8, schedule="refresh"), make(final_rate=0.8)
    for e in range(6):
        a.begin_epoch(e, 6)
        b.begin_epoch(e, 6)
        assert a.rate == pytest.approx(b.rate)
        assert torch.equal(a.keep, b.keep)


# Random freeze's ramp at r* = 0.9, worked out by hand: dense in epoch 0, r* from epoch e* − 1 on (e* = E by
# default), equal steps in between; e* = 1 is no ramp.
@pytest.mark.parametrize("ramp,expected", [
    (None, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]),
    (4, [0.0, 0.3, 0.6, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]),
    (1, [0.9, 0.9, 0.9]),
    (None, [0.9]),
])
def test_random_freeze_schedule(ramp, expected):
    epochs = len(expected)
    defense = make("random-freeze", final_rate=0.9, ramp_epochs=ramp)
    for e in range(epochs):
        defense.begin_epoch(e, epochs)
        assert defense.rate == pytest.approx(expected[e])
        assert int((~defense.keep).sum()) == math.floor(defense.rate * D)
    assert defense.rate == pytest.approx(0.9)  # the default e* = E reaches r* in the last epoch


def total_density(epochs, ramp, final_rate, dense_epochs=None):
    """The random-freeze paper's "total density": non-zero gradient entries over those of the dense
    baseline run of ``dense_epochs`` (its Table 9 runs extend training by 20 epochs)."""
    defense = make("random-freeze", final_rate=final_rate, ramp_epochs=ramp)
    zeroed = 0.0
    for e in range(epochs):
        defense.begin_epoch(e, epochs)
        zeroed += defense.rate
    return (epochs - zeroed) / (dense_epochs or epochs)


@pytest.mark.parametrize("epochs,ramp,rate,dense,paper", [
    (40, 40, 0.7, None, 0.65),   # Table 2, end-to-end CNN (ε = 3)
    (80, 80, 0.6, None, 0.70),   # Table 2, handcrafted CNN
    (200, 200, 0.4, None, 0.80),  # Table 2, GEP
    (50, 50, 0.7, None, 0.65),   # Table 2, DP transfer learning
    (60, 40, 0.9, 40, 0.60),     # Table 9, adjusted end-to-end CNN, ε = 3
    (100, 80, 0.9, 80, 0.58),    # Table 9, ε = 7.53 (0.575)
])
def test_random_freeze_ramp_reproduces_the_papers_total_densities(epochs, ramp, rate, dense, paper):
    assert total_density(epochs, ramp, rate, dense) == pytest.approx(paper, abs=0.0051)


def test_ranked_constant_schedule_reports_the_rate_it_releases():
    """Algorithm 4's first mask is all ones even under the constant schedule: it reports rate 0 and
    density 1, and the ranked masks after it rate r*."""
    defense = make(final_rate=0.6, schedule="constant", mask="ranked", sigma=0.1, steps_per_epoch=2)
    defense.begin_epoch(0, 2)
    shared = None
    for _ in range(2):
        defense.clip_and_accumulate(random_grads(3))
        shared = defense.release(3)
    assert defense.rate == 0.0 and shared.rate == 0.0 and shared.density == 1.0
    defense.begin_epoch(1, 2)
    defense.clip_and_accumulate(random_grads(3))
    shared = defense.release(3)
    assert shared.rate == pytest.approx(0.6)
    assert shared.density == pytest.approx(1 - math.floor(0.6 * D) / D)


def test_mask_is_redrawn_each_epoch():
    defense = make(final_rate=0.5, schedule="constant")
    defense.begin_epoch(0, 3)
    first = defense.keep.clone()
    defense.begin_epoch(1, 3)
    assert not torch.equal(first, defense.keep)


def test_ranked_masks_follow_the_noisy_accumulator():
    defense = make(final_rate=0.5, schedule="linear", mask="ranked", sigma=0.05, steps_per_epoch=3)
    defense.begin_epoch(0, 3)
    assert bool(defense.keep.all())  # Algorithm 4: first mask all ones (and r_0 = 0)
    big = torch.zeros(D)
    big[:100] = 5.0  # a consistent large gradient on the first 100 coordinates
    for _ in range(3):
        defense.clip_and_accumulate({n: v.unsqueeze(0).repeat(4, *[1] * v.dim())
                                     for n, v in defense._views(big).items()})
        defense.release(4)
    z = defense.ranking_sum.clone()
    defense.begin_epoch(1, 3)
    zeroed = ~defense.keep
    assert int(zeroed.sum()) == math.floor(0.25 * D)
    # The zeroed coordinates are exactly those with the smallest |z|.
    threshold = z.abs()[defense.keep].min()
    assert float(z.abs()[zeroed].max()) <= float(threshold)
    assert bool(defense.keep[:100].all())  # the strong coordinates survive
    # Masked coordinates keep accumulating noise so they can come back.
    for _ in range(3):
        defense.clip_and_accumulate({n: torch.zeros(2, *s) for n, s in SHAPES.items()})
        defense.release(2)
    assert bool((defense.ranking_sum[zeroed] != 0).all())


def test_noise_mode_is_not_dp_and_uses_fixed_std():
    defense = make(clip=None, noise_std=0.01, final_rate=0.3, schedule="constant", sigma=123.0)
    defense.begin_epoch(0, 1)
    g = random_grads(4, scale=50.0)  # large: would be clipped under DP
    defense.clip_and_accumulate(g)
    shared = defense.release(4)
    keep = flat(shared.mask)
    mean = flat({n: v.mean(0) for n, v in g.items()}) * keep
    noise = flat(shared.grads) - mean
    assert shared.noise_std == pytest.approx(0.01)
    assert float(noise[keep].std()) == pytest.approx(0.01, rel=0.1)  # σ is ignored in this mode
    assert DEFENSES.get("rs").is_dp(RSParams(clip=None, noise_std=0.01)) is False
    spec = spec_for("rs", defense__clip=None, defense__noise_std=0.01)
    assert plan_privacy(spec, DEFENSES.get("rs"), 1000).epsilon == math.inf


def test_clipped_sgd_ablation_clips_the_masked_gradients_and_adds_no_noise():
    """The RS paper's Algorithm 3 (`noise_std: 0` with a clip): ĝ = (1/B) Σ_i (m ⊙ g_i)·min(1, C/‖m ⊙ g_i‖),
    computed here from the algorithm's lines, not the defense's code; not DP, so ε = inf."""
    clip, batch = 0.5, 6
    defense = make(clip=clip, noise_std=0.0, final_rate=0.4, schedule="constant", sigma=5.0)
    defense.begin_epoch(0, 1)
    g = random_grads(batch, scale=0.2)
    defense.clip_and_accumulate(g)
    shared = defense.release(batch)
    keep = flat(shared.mask)
    expected = torch.zeros(D)
    for i in range(batch):
        masked = flat({n: v[i] for n, v in g.items()}) * keep
        expected += masked * min(1.0, clip / float(masked.norm()))
    torch.testing.assert_close(flat(shared.grads), expected / batch)
    assert shared.noise_std == 0.0 and float(keep.float().mean()) == pytest.approx(0.6, abs=1e-3)
    assert DEFENSES.get("rs").is_dp(RSParams(clip=clip, noise_std=0.0)) is False
    spec = spec_for("rs", defense__clip=clip, defense__noise_std=0.0)
    assert plan_privacy(spec, DEFENSES.get("rs"), 1000).epsilon == math.inf


def test_noisy_sgd_ablation_is_the_unclipped_masked_mean_plus_sigma_over_b():
    """The RS paper's Algorithm 2: ĝ = (1/B)(m ⊙ Σ g_i + m ⊙ N(0, σ²I)) is `clip: null, noise_std: σ/B`."""
    sigma, batch = 0.3, 8
    defense = make(clip=None, noise_std=sigma / batch, final_rate=0.5, schedule="constant")
    defense.begin_epoch(0, 1)
    g = random_grads(batch, scale=30.0)  # far above any clip: none applies
    defense.clip_and_accumulate(g)
    shared = defense.release(batch)
    keep = flat(shared.mask)
    noise = (flat(shared.grads) - flat({n: v.sum(0) for n, v in g.items()}) * keep / batch) * batch
    assert torch.all(noise[~keep] == 0)
    assert float(noise[keep].std()) == pytest.approx(sigma, rel=0.1)


@pytest.mark.parametrize("params,field", [
    (dict(final_rate=1.0), "defense.final_rate"), (dict(final_rate=-0.1), "defense.final_rate"),
    (dict(refresh=0), "defense.refresh"), (dict(schedule="cosine"), "defense.schedule"),
    (dict(mask="topk"), "defense.mask"), (dict(clip=None), "defense.noise_std"),
    (dict(noise_std=-0.1), "defense.noise_std"), (dict(clip=-1.0), "defense.clip"),
])
def test_validation(params, field):
    with pytest.raises(ConfigError, match=f"{field}: "):
        from_dict(RSParams, params, "defense")


def test_random_freeze_validation():
    with pytest.raises(ConfigError, match="defense.ramp_epochs"):
        from_dict(RandomFreezeParams, {"ramp_epochs": 0}, "defense")
    assert from_dict(RandomFreezeParams, {"ramp_epochs": 1}, "defense").ramp_epochs == 1
    with pytest.raises(ConfigError, match="defense.schedule"):
        build_spec({"defense": {"name": "random-freeze", "schedule": "linear"}})


def test_bytes_count_the_mask_once():
    defense = make(final_rate=0.5, schedule="constant", steps_per_epoch=4)
    defense.begin_epoch(0, 1)
    kept = D - math.floor(0.5 * D)
    sizes = []
    for _ in range(3):
        defense.clip_and_accumulate(random_grads(2))
        sizes.append(defense.release(2).bytes_sparse())
    index_cost = min(4 * kept, math.ceil(D / 8))
    assert sizes == [4 * kept + index_cost, 4 * kept, 4 * kept]


def train_run(spec):
    prep = prepare(spec)
    seed_globals(prep.streams)  # as the runner does before training
    result = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                   spec.train, prep.sampler, prep.device, progress=False)
    return prep, result


def test_accounting_is_dpsgd_accounting():
    rs = prepare(spec_for("rs", privacy__epsilon=2.0)).privacy
    dp = prepare(spec_for("dpsgd", privacy__epsilon=2.0)).privacy
    assert rs == dp
    rf = prepare(spec_for("random-freeze", privacy__noise_multiplier=1.3)).privacy
    dpn = prepare(spec_for("dpsgd", privacy__noise_multiplier=1.3)).privacy
    assert rf.epsilon == dpn.epsilon and rf.noise_multiplier == 1.3


@pytest.mark.parametrize("defense,extra", [("rs", {}), ("rs", {"defense__schedule": "constant"}),
                                           ("random-freeze", {})])
def test_rate_zero_equals_dpsgd_bit_for_bit(defense, extra):
    # RS always uses materialised per-sample gradients; pin dpsgd to the same engine for bit equality
    common = dict(train__epochs=2, train__batch_size=64, seed=4, train__engine="func")
    prep_a, res_a = train_run(spec_for(defense, defense__final_rate=0.0, **extra, **common))
    prep_b, res_b = train_run(spec_for("dpsgd", **common))
    for (na, pa), (_nb, pb) in zip(prep_a.model.named_parameters(), prep_b.model.named_parameters()):
        assert torch.equal(pa, pb), na
    assert res_a.history == res_b.history


def test_rs_run_reports_density_and_trains():
    prep, result = train_run(spec_for("rs", train__epochs=3, defense__final_rate=0.8))
    assert result.density == pytest.approx(1 - (0 + 0.4 + 0.8) / 3, abs=1e-3)
    assert result.history[-1]["test_accuracy"] > 0.5


def last_epoch_motion(optimizer, lr):
    """Over the second of two epochs (one fixed mask): |Δw| of the coordinates that mask zeroes, and of the
    ones it keeps."""
    spec = spec_for("rs", train__epochs=2, train__batch_size=256, train__optimizer=optimizer, train__lr=lr,
                    defense__schedule="constant", defense__final_rate=0.5)
    prep = prepare(spec)
    seed_globals(prep.streams)
    start = {}

    class Snapshot(TrainingObserver):
        def epoch_start(self, epoch, model, defense):
            if epoch == 1:
                start["w"] = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
                start["keep"] = defense.keep.clone()

    train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")), spec.train,
          prep.sampler, prep.device, progress=False, observer=Snapshot())
    moved = (torch.cat([p.detach().reshape(-1) for p in prep.model.parameters()]) - start["w"]).abs()
    return moved[~start["keep"]], moved[start["keep"]]


def test_masked_coordinates_stay_put_only_under_plain_sgd():
    """docs/sparsification.md: the release is sparse under every optimizer, the update only under SGD
    without momentum. Adam moves coordinates the current mask zeroes (on moments from earlier releases)."""
    masked, kept = last_epoch_motion("sgd", 1.0)
    assert bool((masked == 0).all()) and bool((kept > 0).any())
    masked, kept = last_epoch_motion("adam", 0.01)
    assert float((masked > 0).float().mean()) > 0.4  # those kept in the epoch before (about half) move
