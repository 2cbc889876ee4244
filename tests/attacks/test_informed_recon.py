"""``informed-recon``: the informed, prior-aware reconstruction game and its controls.

- the whitening of every DP defense's release is unit noise, and a clipped example's whitened contribution stays
  within the accounted sensitivity 1/σ (the space where the likelihood ratio and the bound are stated);
- the gradient-canary control: candidates whose clipped gradients are orthogonal and at full norm, released
  through DP-SGD's own stages, are named at the Bayes-optimal rate (computed here independently, in the
  n-dimensional projection), which stays below the bound;
- end to end on digits: a non-private run is reconstructed almost always; a planted under-noising (σ ten times
  smaller than the accounted one) exceeds the bound and fails the bound check, where the correct run passes it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpeval.attacks.informed_game import InformedParams, TargetGame, draw_pool, draw_sampling, segments, whitener
from dpeval.attacks.informed_recon import likelihood_scores, linear_scores
from dpeval.config import build_spec
from dpeval.core import rero
from dpeval.core.errors import ConfigError
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.states import resolve
from dpeval.core.statistics import clopper_pearson
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.dpsgd import DPSGD
from dpeval.runner import perform, prepare
from dpeval.victims import DefenseTrained

DP_NAMES = [n for n in DEFENSES.names() if DEFENSES.get(n).capabilities.accounted]


# --------------------------------------------------------------------------------------------------
# scoring: pure functions of the signals


def test_likelihood_and_linear_scores_on_known_signals():
    from dpeval.attacks.informed_game import ResidualSignals

    inner = np.array([[2.0, 0.0], [0.0, 0.1]])
    norms2 = np.ones((2, 2))
    s = ResidualSignals(inner, norms2, np.array([4.0, 1.0]), 0.5, False)
    expected = [sum(math.log(0.5 + 0.5 * math.exp(inner[t, i] - 0.5)) for t in range(2)) for i in range(2)]
    assert likelihood_scores(s) == pytest.approx(expected)
    assert linear_scores(s) == pytest.approx([2.0, 0.1])
    # q = 1: every step holds the target, the plain Gaussian likelihood ratio
    full = ResidualSignals(inner, norms2, np.array([4.0, 1.0]), 1.0, False)
    assert likelihood_scores(full) == pytest.approx((inner - 0.5).sum(axis=0))
    # no noise: the candidate whose contribution reproduces the sampled step exactly wins
    exact = ResidualSignals(np.array([[1.0, 0.2], [0.0, 0.0]]), np.array([[1.0, 1.0], [1.0, 1.0]]),
                            np.array([1.0, 0.0]), 0.1, True)
    assert int(np.argmax(likelihood_scores(exact))) == 0


def test_segments_cover_every_step_once_at_the_latest_state():
    states = resolve(["trajectory:3"], 20)  # epoch:7, epoch:13, final
    plan = segments(states, 180, 20)
    assert [s for s, _ in plan] == ["init", "epoch:7", "epoch:13"]
    assert [list(r)[0] for _, r in plan] == [0, 63, 117]
    assert sum(len(r) for _, r in plan) == 180 and plan[-1][1].stop == 180


def test_sampling_rates_and_pools():
    rng = np.random.default_rng(0)
    held = np.stack([draw_sampling("poisson", 0.1, 10, 200, 20, rng) for _ in range(200)])
    assert held.mean() == pytest.approx(0.1, abs=0.01)
    shuffled = np.stack([draw_sampling("shuffle", 0.1, 10, 200, 20, rng) for _ in range(200)])
    assert shuffled.reshape(200, 20, 10).sum(axis=2).max() == 1  # at most once an epoch
    assert shuffled.mean() == pytest.approx(0.1, abs=0.01)
    task = prepare(build_spec({})).task
    pool = draw_pool(task.test, 10, rng)
    assert len(set(pool.tolist())) == 10 and len(set(task.test.y[pool].tolist())) == 10  # one per class
    with pytest.raises(ConfigError, match="attack.candidates"):
        from dpeval.attacks.informed_game import check_pool
        check_pool(InformedParams(candidates=len(task.test) + 1), task.test)


# --------------------------------------------------------------------------------------------------
# whitening: unit noise, contributions within the accounted sensitivity, for every DP defense


@pytest.mark.parametrize("name", DP_NAMES)
def test_whitened_release_has_unit_noise_and_bounded_contributions(name):
    spec = build_spec({"defense": {"name": name}, "train": {"epochs": 2, "batch_size": 64},
                       "privacy": {"noise_multiplier": 2.0}})
    prep = prepare(spec)
    model = prep.model
    whiten = whitener(prep.make_defense(Streams(0).scope("design")))
    grads = PerSampleGradients(model)(prep.task.train.x[:4] * 50, prep.task.train.y[:4])  # large: clipped

    def release(g, streams):
        defense = prep.make_defense(streams)
        defense.begin_epoch(1, spec.train.epochs)
        if next(iter(g.values())).shape[0]:
            defense.clip_and_accumulate(g)
        return defense.release(spec.train.batch_size)

    noise = whiten(release({k: v[:0] for k, v in grads.items()}, Streams(1).scope("victim")))
    noised = noise[noise != 0]
    assert len(noised) > 1000
    assert float(noised.std()) == pytest.approx(1.0, abs=0.05)
    sensitivity = 1.0 / prep.privacy.accounted_noise_multiplier
    from dpeval.attacks.informed_game import contributions
    contrib, noiseless = contributions(release, whiten, grads, Streams(2).scope("victim"))
    assert not noiseless
    norms = contrib.norm(dim=1)
    assert float(norms.max()) <= sensitivity * 1.001, (name, norms, sensitivity)
    assert float(norms.min()) > 0.3 * sensitivity  # the examples do reach the release


# --------------------------------------------------------------------------------------------------
# the gradient-canary control


def bayes_optimal_success(sigma, q, steps, n, trials, rng):
    """Orthogonal full-norm candidates: the n projections of each whitened step are independent N(0, 1), the
    secret's shifted by 1/σ when the step holds it; the Bayes-optimal guess is the likelihood ratio's argmax."""
    mu = 1.0 / sigma
    held = rng.random((trials, steps)) < q
    z = rng.normal(size=(trials, steps, n))
    z[:, :, 0] += mu * held
    lr = np.logaddexp(np.log1p(-q), np.log(q) + mu * z - mu**2 / 2).sum(axis=1)
    return float((lr.argmax(axis=1) == 0).mean())


@pytest.mark.slow
def test_gradient_canaries_reach_the_bayes_optimal_success():
    sigma, q, steps, n, games, d, batch = 0.7, 0.1, 40, 10, 300, 32, 16
    params = DPSGD.Params()
    shapes = {"w": torch.Size([d])}
    streams = Streams(0).scope("attack", "canaries")

    def release(grads, st):
        defense = DPSGD(params, DefenseContext(shapes, sigma, st))
        if grads["w"].shape[0]:
            defense.clip_and_accumulate(grads)
        return defense.release(batch)

    whiten = whitener(DPSGD(params, DefenseContext(shapes, sigma, streams.scope("design"))))
    rng = np.random.default_rng(0)
    wins = {"likelihood": 0, "linear": 0}
    for g in range(games):
        grads = torch.zeros(n, d)
        grads[torch.arange(n), torch.from_numpy(rng.choice(d, n, replace=False))] = 1e6  # clipped to C: full norm
        secret, held = int(rng.integers(n)), rng.random(steps) < q
        game = TargetGame(steps, n)
        game.replay(release, whiten, {"w": grads}, secret, range(steps), held, streams.scope("game", g))
        signals = game.signals(q)
        wins["likelihood"] += int(np.argmax(likelihood_scores(signals)) == secret)
        wins["linear"] += int(np.argmax(linear_scores(signals)) == secret)
        assert np.allclose(signals.norms2, 1 / sigma**2)  # full norm C in units of σC
    optimal = bayes_optimal_success(sigma, q, steps, n, 40_000, np.random.default_rng(1))
    lo, hi = clopper_pearson(wins["likelihood"], games)
    assert lo <= optimal <= hi, (wins, optimal)
    assert optimal < rero.tradeoff_bound([(sigma, q, steps)], n)  # the bound holds, and is not far off
    assert wins["linear"] < wins["likelihood"]  # the linear score is the weaker statistic here


# --------------------------------------------------------------------------------------------------
# end to end on digits


class UnderNoisedDPSGD(DPSGD):
    """A planted bug: the release adds σ/10 while the ledger accounts (and reports ε for) σ."""

    def sum_noise_std(self, batch_size: int) -> float:
        return super().sum_noise_std(batch_size) / 10


def informed_run(tmp_path, defense, epsilon=None, defense_cls=None, targets=30, epochs=2):
    raw = {"defense": {"name": defense}, "attacks": ["informed-recon"], "train": {"epochs": epochs},
           "attack": {"informed-recon": {"targets": targets, "at": "init"}}}
    if epsilon is not None:
        raw["privacy"] = {"epsilon": epsilon}
    spec = build_spec(raw)
    prep = prepare(spec, source=DefenseTrained(defense_cls))
    return perform(prep, "test", tmp_path / defense, progress=False).flat()


def key(metric):
    return f"leakage.informed-recon.{metric}"


@pytest.mark.slow
def test_non_private_run_is_reconstructed(tmp_path):
    row = informed_run(tmp_path, "none", epochs=6)  # 54 steps at q ≈ 0.1: the target is sampled at least once
    assert row[key("success")] >= 0.9, row
    assert row[key("bound")] == 1.0 and row[key("verdict")] == "leaks"
    assert row[key("candidates")] == 10 and row[key("chance")] == pytest.approx(0.1)


@pytest.mark.slow
def test_planted_under_noising_exceeds_the_bound_and_fails(tmp_path):
    correct = informed_run(tmp_path / "ok", "dpsgd", epsilon=1.0)
    broken = informed_run(tmp_path / "bug", "dpsgd", epsilon=1.0, defense_cls=UnderNoisedDPSGD)
    assert broken["privacy.epsilon"] == pytest.approx(correct["privacy.epsilon"])  # the same claim
    assert broken[key("success_ci_low")] > broken[key("bound")], broken
    assert broken[key("bound_check")] == "FAIL" and broken[key("verdict")] == "leaks"
    assert correct[key("bound_check")] == "PASS", correct
    assert correct[key("success_ci_low")] <= correct[key("bound")]
    assert correct[key("bound")] < correct[key("bound_rdp")] <= correct[key("bound_dp")]


# --------------------------------------------------------------------------------------------------
# where it shows: the headline, and `dpeval run` failing like an audit when the bound is exceeded


def test_headline_names_chance_and_the_bound():
    from dpeval.headlines import read

    record = {key("success"): 0.365, key("success_ci_low"): 0.298, key("success_ci_high"): 0.436,
              key("chance"): 0.1, key("p_value"): 1e-23, key("bound"): 0.521, key("bound_check"): "PASS",
              key("verdict"): "leaks"}
    text = read(record, "informed-recon").sentence()
    assert text.startswith("leaks: informed reconstruction success 0.365")
    assert "vs chance 0.1" in text and "DP bound 0.521 (PASS)" in text


def test_run_exits_1_when_the_bound_check_fails(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from click.testing import CliRunner

    import dpeval.runner
    from dpeval.cli import main

    def planted(spec, store, progress=True):  # a finished run whose attack exceeded its bound
        return SimpleNamespace(flat=lambda: row)

    row = {"run_id": "r1", "defense": "dpsgd", "attack": "informed-recon", "status": "done", "dataset": "digits",
           "model": "cnn", "seed": 0, "privacy.accountant": "rdp", "privacy.delta": 1e-5, "privacy.epsilon": 1.0,
           "privacy.noise_multiplier": 4.0, "privacy.sample_rate": 0.1, "privacy.sampling": "poisson",
           "privacy.steps": 18, "comm.bytes_dense": 1, "comm.bytes_sparse": 1, "comm.density": 1.0,
           "time.attack_s": 1.0, "time.train_s": 1.0, "utility.test_accuracy": 0.5, "utility.train_accuracy": 0.5,
           key("success"): 0.9, key("bound"): 0.2, key("bound_check"): "FAIL", key("verdict"): "leaks"}
    monkeypatch.setattr(dpeval.runner, "execute", planted)
    result = CliRunner().invoke(main, ["run", "--defense", "dpsgd", "--attack", "informed-recon", "--json",
                                       "--results", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "FAIL: informed-recon" in result.stderr
