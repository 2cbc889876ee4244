"""Membership inference: signals, membership designs, cache, LiRA and RMIA scoring.

Metrics and the ε bound: test_membership_metrics.py; the games (who trains on what), parameter checks and
end-to-end runs: test_membership_game.py. Shadow training itself (vectorised vs sequential) is tested in
tests/engine/test_shadow_training.py."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpeval.attacks import shadow_signals as sh
from dpeval.attacks.lira import LiraParams, _fit, lira_scores
from dpeval.attacks.membership_game import Signals
from dpeval.attacks.membership_metrics import membership_metrics
from dpeval.attacks.rmia import RMIA, RmiaParams, fit_offline_a, rmia_scores
from dpeval.core.models import build_model
from dpeval.core.per_sample import fixed_front, front_features


def threshold_rng(seed=0):
    """The generator of the random half on which the ε bound's threshold is chosen."""
    return np.random.default_rng(seed)


def test_phi_matches_a_float64_reference():
    logits = torch.randn(200, 10) * 3
    labels = torch.randint(0, 10, (200,))
    p = torch.softmax(logits.double(), dim=1).numpy()
    py = p[np.arange(200), labels.numpy()]
    reference = np.log(py) - np.log(1 - py)
    np.testing.assert_allclose(sh.phi_from_logits(logits, labels), reference, rtol=1e-9, atol=1e-9)


def test_phi_is_finite_for_extremely_confident_logits():
    logits = torch.tensor([[80.0, 0.0, -5.0], [0.0, 80.0, 1.0]])
    phi = sh.phi_from_logits(logits, torch.tensor([0, 0]))
    assert phi[0] == pytest.approx(80 - math.log(math.exp(0) + math.exp(-5)))  # p_y/(1-p_y) overflows naively
    assert phi[1] == pytest.approx(-math.log(math.exp(80) + math.exp(1)), rel=1e-12)


def test_membership_matrix_is_balanced_and_complementary():
    m = sh.membership_matrix(16, 101, torch.Generator().manual_seed(3))
    assert m.shape == (16, 101)
    assert torch.all(m.sum(0) == 8)  # every example IN for exactly half the models
    for j in range(0, 16, 2):
        assert torch.equal(m[j], ~m[j + 1])
    assert not torch.equal(m[0], m[2])
    assert torch.equal(m, sh.membership_matrix(16, 101, torch.Generator().manual_seed(3)))  # the generator decides
    assert not torch.equal(m, sh.membership_matrix(16, 101, torch.Generator().manual_seed(4)))
    with pytest.raises(ValueError):
        sh.membership_matrix(3, 10, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("k,n,size", [(16, 1617, 1258), (5, 718, 359), (3, 559, 200), (7, 10, 9)])
def test_fixed_size_membership_has_the_victim_pool_size_and_even_out_slots(k, n, size):
    """Every model trains on exactly ``size`` examples; every example is OUT for ⌊K(N−size)/N⌋ or one more
    models; rows are distinct even when N = 2·size (where cyclic windows would repeat)."""
    m = sh.fixed_size_membership(k, n, size, torch.Generator().manual_seed(1))
    assert m.shape == (k, n)
    assert torch.all(m.sum(1) == size)
    low = k * (n - size) // n
    out = (~m).sum(0)
    assert out.min() >= low and out.max() <= low + 1 and int(out.sum()) == k * (n - size)
    assert len({tuple(row.tolist()) for row in m}) == k
    assert torch.equal(m, sh.fixed_size_membership(k, n, size, torch.Generator().manual_seed(1)))
    with pytest.raises(ValueError):
        sh.fixed_size_membership(k, n, n + 1, torch.Generator())


def test_signal_cache_is_keyed_by_weights_and_indices(tmp_path, monkeypatch):
    model = build_model("mlp", (1, 8, 8), 10, (0.5,), (0.5,))
    x, y, idx = torch.rand(20, 1, 8, 8), torch.randint(0, 10, (20,)), torch.arange(20)
    x = front_features(fixed_front(model).front, x)
    calls = []
    real = sh.model_outputs
    monkeypatch.setattr(sh, "model_outputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    state = {n: t.clone() for n, t in model.state_dict().items()}
    first = sh.cached_outputs(model, state, x, y, idx, tmp_path, torch.device("cpu"))
    again = sh.cached_outputs(model, state, x, y, idx, tmp_path, torch.device("cpu"))
    assert len(calls) == 1 and np.array_equal(first[0], again[0])  # second call read the cache
    changed = {n: t.clone() for n, t in state.items()}
    changed["1.1.weight"] += 0.5
    third = sh.cached_outputs(model, changed, x, y, idx, tmp_path, torch.device("cpu"))
    assert len(calls) == 2 and not np.allclose(first[0], third[0])  # new weights: recomputed
    sh.cached_outputs(model, state, x, y, idx + 1, tmp_path, torch.device("cpu"))
    assert len(calls) == 3  # other data indices: recomputed


def synthetic_view(n=400, refs=16, gap=2.0, seed=0):
    rng = np.random.default_rng(seed)
    ref_in = np.zeros((refs, n), bool)
    for r in range(0, refs, 2):
        half = rng.permutation(n) < n // 2
        ref_in[r], ref_in[r + 1] = half, ~half
    ref_phi = rng.normal(0, 1, (refs, n)) + gap * ref_in
    labels = rng.random(n) < 0.5
    target_phi = rng.normal(0, 1, n) + gap * labels
    prob = 1 / (1 + np.exp(-ref_phi))
    target_prob = 1 / (1 + np.exp(-target_phi))
    return Signals(target_phi, target_prob, ref_phi, prob, ref_in), labels


@pytest.mark.parametrize("params", [LiraParams(), LiraParams(online=False), LiraParams(variance="per-example"),
                                    LiraParams(online=False, offline_test="two-sided")])
def test_lira_separates_a_synthetic_signal(params):
    view, labels = synthetic_view()
    scores = lira_scores(view, params)
    auc = membership_metrics(scores, labels, 1e-5, threshold_rng())["auc"]
    assert auc > (0.75 if params.offline_test == "one-sided" else 0.6)


def test_lira_scores_equal_the_formulas():
    """Independent per-example loop: means over IN/OUT references, pooled within-example variance
    Σ(φ − μ)² / Σ(n − 1) (global) or each example's sample variance (per-example)."""
    view, _ = synthetic_view(n=60)
    view.ref_in[:, :20] = np.arange(16)[:, None] < 12  # unequal IN/OUT counts (12/4), as in the victim game
    mu_in, mu_out, ss_in, ss_out, dof_in, dof_out, var_out = [], [], 0.0, 0.0, 0, 0, []
    for j in range(60):
        ins, outs = view.ref_phi[view.ref_in[:, j], j], view.ref_phi[~view.ref_in[:, j], j]
        mu_in.append(ins.mean())
        mu_out.append(outs.mean())
        ss_in += ((ins - ins.mean()) ** 2).sum()
        ss_out += ((outs - outs.mean()) ** 2).sum()
        dof_in, dof_out = dof_in + len(ins) - 1, dof_out + len(outs) - 1
        var_out.append(np.var(outs, ddof=1))
    s_in, s_out, t = math.sqrt(ss_in / dof_in), math.sqrt(ss_out / dof_out), view.target_phi
    online = stats.norm.logpdf(t, mu_in, s_in) - stats.norm.logpdf(t, mu_out, s_out)
    np.testing.assert_allclose(lira_scores(view, LiraParams()), online)
    np.testing.assert_allclose(lira_scores(view, LiraParams(online=False)), stats.norm.logcdf(t, mu_out, s_out))
    np.testing.assert_allclose(lira_scores(view, LiraParams(online=False, offline_test="two-sided")),
                               -stats.norm.logpdf(t, mu_out, s_out))
    np.testing.assert_allclose(lira_scores(view, LiraParams(online=False, variance="per-example")),
                               stats.norm.logcdf(t, mu_out, np.sqrt(var_out)))


def test_lira_global_variance_is_unbiased_with_few_references():
    """With 3 OUT references per example the pooled variance still estimates the true σ² = 4 (residuals
    about each example's 3-sample median divided by 3 would give about 0.79 of it)."""
    rng = np.random.default_rng(0)
    phi = rng.normal(0, 2, (16, 5000)) + rng.normal(0, 5, 5000)
    member = np.broadcast_to(np.arange(16)[:, None] >= 3, phi.shape)
    _, std_out = _fit(phi, ~member, "global")
    _, std_in = _fit(phi, member, "global")
    assert std_out[0] ** 2 == pytest.approx(4, rel=0.03) and std_in[0] ** 2 == pytest.approx(4, rel=0.03)


def test_rmia_scores_are_fractions_and_follow_the_signal():
    view, labels = synthetic_view()
    for params in (RmiaParams(), RmiaParams(online=False, offline_a=0.5, gamma=2.0)):
        scores = rmia_scores(view, params)
        assert scores.min() >= 0 and scores.max() <= 1 + 1e-12
        assert membership_metrics(scores, labels, 1e-5, threshold_rng())["auc"] > 0.7


def reference_rmia(view, online, a, gamma):
    """Per-example loop over the population z (the view's own examples): Pr(x) and Pr(z) by the same rule,
    the fraction of z with LR(x, z) > γ, ties broken by r/(1 + r) of x's ratio r."""
    n = len(view.target_phi)
    marg = []
    for j in range(n):
        refs = view.ref_prob[:, j] if online else view.ref_prob[~view.ref_in[:, j], j]
        marg.append(refs.mean() if online else 0.5 * ((1 + a) * refs.mean() + 1 - a))
    ratio = view.target_prob / np.array(marg)
    return np.array([(np.sum(ratio[j] / ratio > gamma) + ratio[j] / (1 + ratio[j])) / n for j in range(n)])


def test_rmia_scores_equal_the_formula():
    view, _ = synthetic_view(n=30)
    for online, a, gamma in ((True, None, 1.0), (True, None, 1.5), (False, 0.4, 1.0), (False, 0.0, 2.0)):
        got = rmia_scores(view, RmiaParams(online=online, offline_a=a, gamma=gamma))
        np.testing.assert_allclose(got, reference_rmia(view, online, a, gamma), rtol=1e-12)


def test_rmia_online_population_mixes_in_and_out_references():
    """Pr(z) for the population uses IN references too: changing only the IN references of z changes the
    online scores (it would not if z's marginal came from OUT references only)."""
    view, _ = synthetic_view(n=50)
    before = rmia_scores(view, RmiaParams())
    view = dataclasses.replace(view, ref_prob=np.where(view.ref_in, view.ref_prob * 0.5, view.ref_prob))
    assert not np.allclose(before, rmia_scores(view, RmiaParams()))


def test_rmia_gamma_one_keeps_the_signal_resolved():
    """γ = 1 with ties broken by the ratio: (almost) every example gets its own score, and the ranking of one
    target's examples is that of the ratio Pr(x|θ)/Pr(x)."""
    view, _ = synthetic_view(n=400)
    scores = rmia_scores(view, RmiaParams())
    assert len(np.unique(scores)) == 400
    ratio = view.target_prob / view.ref_prob.mean(0)
    assert stats.spearmanr(scores, ratio).statistic == pytest.approx(1.0)


def test_fit_offline_a_maximises_the_mean_reference_auc():
    """The fitted a is the grid value whose offline attack, each reference model against the others, has
    the best mean AUC (independent loop over the grid)."""
    rng = np.random.default_rng(3)
    view, _ = synthetic_view(n=300, refs=8, gap=1.0)
    p_out = rng.uniform(0.05, 0.9, 300)
    view = dataclasses.replace(view, ref_prob=np.where(view.ref_in, 0.7 * p_out + 0.3, p_out)
                               * rng.uniform(0.9, 1.0, (8, 300)))
    fitted = fit_offline_a(view.ref_prob, view.ref_in, 1.0)
    means = {}
    for a in np.linspace(0, 1, 11):
        aucs = []
        for r in range(8):
            others = np.arange(8) != r
            sub = Signals(view.target_phi, view.ref_prob[r], view.ref_phi[others], view.ref_prob[others],
                       view.ref_in[others])
            scores = rmia_scores(sub, RmiaParams(online=False, offline_a=float(a)))
            aucs.append(membership_metrics(scores, view.ref_in[r], 1e-5, threshold_rng())["auc"])
        means[round(float(a), 1)] = np.mean(aucs)
    assert fitted in means and means[fitted] == pytest.approx(max(means.values()))
    assert means[fitted] > min(means.values())  # the choice matters on this data


def test_offline_rmia_fits_a_by_default():
    view, _ = synthetic_view(n=200)
    attack = RMIA(RmiaParams(online=False))
    guessed = attack.guess(view)
    fitted = guessed.metrics["offline_a"]
    assert fitted in np.round(np.linspace(0, 1, 11), 10)
    np.testing.assert_allclose(guessed.values, rmia_scores(view, attack.params, fitted))
    np.testing.assert_array_equal(attack.guess(view).values, guessed.values)  # a pure function of the signals
    with pytest.raises(ValueError, match="offline RMIA needs a"):
        rmia_scores(view, RmiaParams(online=False))
