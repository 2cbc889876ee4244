"""Membership metrics: DeLong AUC interval, TPR at resolvable FPRs only, Clopper–Pearson and the ε lower
bound, the verdict, the ROC artefacts."""

import json
import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from dpeval.attacking import write_artefacts
from dpeval.attacks.membership_metrics import membership_metrics, membership_verdict, nonmembers_needed, roc_artefacts
from dpeval.core.statistics import (
    auc_delong,
    bound_at,
    bounds_at,
    clopper_pearson,
    clopper_pearson_ends,
    epsilon_from_rates,
    epsilon_lower_bound,
)
from dpeval.core.verdicts import Verdict


def gaussian_scores(n, shift, seed, members=0.5):
    rng = np.random.default_rng(seed)
    labels = rng.random(n) < members
    return rng.normal(0, 1, n) + shift * labels, labels


def test_delong_auc_and_variance_equal_the_placement_definition():
    """AUC = mean over (member, non-member) pairs of [s_m > s_n] + ½[s_m = s_n]; DeLong variance from the
    per-example placement values, computed here by an O(mn) loop (ties included)."""
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(0, 1, 300), 1)  # rounding makes ties
    labels = rng.random(300) < 0.4
    scores[labels] += 0.5
    pos, neg = scores[labels], scores[~labels]
    kernel = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = kernel.mean(1), kernel.mean(0)
    se = math.sqrt(v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg))
    auc, low, high = auc_delong(scores, labels)
    assert auc == pytest.approx(kernel.mean()) and auc == pytest.approx(roc_auc_score(labels, scores))
    assert (low, high) == pytest.approx((auc - 1.959964 * se, auc + 1.959964 * se), rel=1e-6)


def test_delong_interval_covers_the_true_auc():
    true_auc = stats.norm.cdf(0.5 / math.sqrt(2))
    covered = [low <= true_auc <= high for low, high in
               (auc_delong(*gaussian_scores(400, 0.5, seed))[1:] for seed in range(300))]
    assert 0.92 <= np.mean(covered) <= 0.98


def test_delong_edge_cases():
    assert auc_delong(np.array([1.0, 0.0, 0.5]), np.array([True, False, False])) == (1.0, 0.0, 1.0)
    auc, low, high = auc_delong(np.r_[np.ones(50), np.zeros(50)], np.r_[np.ones(50, bool), np.zeros(50, bool)])
    assert (auc, low, high) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        auc_delong(np.ones(3), np.ones(3, bool))


def test_clopper_pearson_matches_scipy():
    for k, n in [(0, 10), (3, 10), (10, 10), (57, 200)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)


def test_the_threshold_search_gives_each_thresholds_bound_exactly():
    """The one-pass search (sorted counts, one beta quantile call per array) equals the per-threshold bound, ties
    and both ends of the score range included."""
    rng = np.random.default_rng(3)
    scores, labels = np.round(rng.normal(0, 1, 400), 1), rng.random(400) < 0.4
    scores[labels] += 0.8
    thresholds = np.concatenate([np.unique(scores), [scores.min() - 1, scores.max() + 1]])
    each = [bound_at(scores, labels, t, 1e-5, 0.05) for t in thresholds]
    assert bounds_at(scores, labels, thresholds, 1e-5, 0.05).tolist() == each
    assert max(each) > 0.5  # a shift the search can find
    counts = np.array([0, 1, 17, 39, 40])
    low, high = clopper_pearson_ends(counts, 40, 0.01)
    assert list(zip(low.tolist(), high.tolist())) == [clopper_pearson(int(k), 40, 0.01) for k in counts]


def test_epsilon_from_rates_known_cases():
    assert epsilon_from_rates(0.5, 0.5, 0.0) == 0.0
    assert epsilon_from_rates(0.9, 0.1, 0.0) == pytest.approx(math.log(9))
    assert epsilon_from_rates(0.1, 0.9, 0.0) == 0.0  # a worse-than-chance test claims nothing
    assert epsilon_from_rates(0.3, 0.01, 0.2) == pytest.approx(math.log(10))  # δ is subtracted


def test_perfect_separation_gives_the_clopper_pearson_limit():
    n = 60
    scores = np.concatenate([np.ones(n), np.zeros(n)])
    labels = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    judge = np.random.default_rng(7).permutation(2 * n)[n:]
    members, others = int(labels[judge].sum()), int((~labels[judge]).sum())
    tpr_lo = 0.025 ** (1 / members)      # CP lower bound for members/members
    fpr_hi = 1 - 0.025 ** (1 / others)   # CP upper bound for 0/others
    expected = max(math.log(tpr_lo / fpr_hi), math.log((1 - fpr_hi) / (1 - tpr_lo)))
    assert epsilon_lower_bound(scores, labels, 0.0, np.random.default_rng(7)) == pytest.approx(expected)


def test_no_signal_claims_almost_nothing():
    rng = np.random.default_rng(0)
    bounds = [epsilon_lower_bound(rng.random(2000), rng.random(2000) < 0.5, 1e-5, np.random.default_rng(s))
              for s in range(10)]
    assert sum(b > 0 for b in bounds) <= 2 and max(bounds) < 0.3


def test_metrics_keys_and_fpr_points():
    scores, labels = gaussian_scores(5000, 1.5, 1)
    m = membership_metrics(scores, labels, 1e-5, np.random.default_rng(2))
    assert set(m) >= {"auc", "auc_ci_low", "auc_ci_high", "balanced_accuracy", "tpr_at_0.1pct_fpr",
                      "tpr_at_1pct_fpr", "tpr_at_10pct_fpr", "epsilon_lower_bound", "n_members", "n_nonmembers"}
    assert "verdict" not in m  # typed: membership_verdict(m), reported as AttackResult.verdict
    assert not any(k.endswith("_note") for k in m)  # ≥ 1000 non-members resolve every FPR point
    assert m["tpr_at_0.1pct_fpr"] <= m["tpr_at_1pct_fpr"] <= m["tpr_at_10pct_fpr"]
    expected_auc = stats.norm.cdf(1.5 / math.sqrt(2))
    assert m["auc"] == pytest.approx(expected_auc, abs=0.02)
    assert m["auc_ci_low"] < m["auc"] < m["auc_ci_high"] and m["auc_ci_high"] - m["auc_ci_low"] < 0.05
    with pytest.raises(ValueError):
        membership_metrics(scores, np.ones(5000, bool), 1e-5, np.random.default_rng(2))


def test_tpr_at_an_unresolvable_fpr_is_null_with_the_reason():
    """359 non-members (the digits test split) cannot show an FPR of 0.1%: that TPR is null (JSON null) and a
    note says why; 1% and 10% are resolvable. Exactly 1000 non-members resolve 0.1%."""
    assert [nonmembers_needed(f) for f in (0.001, 0.01, 0.1)] == [1000, 100, 10]
    labels = np.r_[np.ones(1258, bool), np.zeros(359, bool)]
    scores = np.random.default_rng(0).normal(0, 1, len(labels)) + labels
    m = membership_metrics(scores, labels, 1e-5, np.random.default_rng(1))
    assert m["tpr_at_0.1pct_fpr"] is None and "359 non-members" in m["tpr_at_0.1pct_fpr_note"]
    assert json.loads(json.dumps(m))["tpr_at_0.1pct_fpr"] is None
    assert isinstance(m["tpr_at_1pct_fpr"], float) and "tpr_at_1pct_fpr_note" not in m
    labels = np.r_[np.zeros(1000, bool), np.ones(10, bool)]  # the members score highest
    m = membership_metrics(np.arange(1010.0), labels, 1e-5, np.random.default_rng(1))
    assert m["tpr_at_0.1pct_fpr"] == 1.0 and "tpr_at_0.1pct_fpr_note" not in m


@pytest.mark.slow
def test_verdict_random_scores_do_not_leak():
    """Scores independent of membership: no-leak-detected at a fixed seed, and false alarms are rare over
    many draws (each of the two tests is at the 95% level on the leaking side)."""
    scores, labels = gaussian_scores(1617, 0.0, 11, members=0.78)
    assert membership_verdict(membership_metrics(scores, labels, 1e-5, np.random.default_rng(0))) is Verdict.NO_LEAK
    alarms = [membership_verdict(membership_metrics(*gaussian_scores(1617, 0.0, s, members=0.78), 1e-5,
                                                    np.random.default_rng(s))) is Verdict.LEAKS for s in range(100)]
    assert sum(alarms) <= 10


def test_verdict_separated_scores_leak():
    for shift, members in ((0.4, 0.5), (0.3, 0.78)):
        m = membership_metrics(*gaussian_scores(1617, shift, 3, members), 1e-5, np.random.default_rng(0))
        assert membership_verdict(m) is Verdict.LEAKS and m["auc_ci_low"] > 0.5
    # the ε bound alone suffices: a few members far out, AUC interval still containing 0.5
    labels = np.r_[np.ones(500, bool), np.zeros(500, bool)]
    scores = np.random.default_rng(4).normal(0, 1, 1000)
    scores[:60] += 10
    m = membership_metrics(scores, labels, 1e-5, np.random.default_rng(0))
    assert m["epsilon_lower_bound"] > 0 and membership_verdict(m) is Verdict.LEAKS


def test_inverted_scores_do_not_count_as_leaking():
    """Both tests claim only on the leaking side: members scoring lower is not a leak by this rule."""
    scores, labels = gaussian_scores(2000, -1.0, 5)
    m = membership_metrics(scores, labels, 1e-5, np.random.default_rng(0))
    assert m["auc"] < 0.3 and m["epsilon_lower_bound"] == 0 and membership_verdict(m) is Verdict.NO_LEAK


def test_roc_axes_stop_at_one_over_the_non_members(tmp_path):
    labels = np.r_[np.ones(100, bool), np.zeros(359, bool)]
    scores = np.random.default_rng(0).normal(0, 1, 459) + labels
    paths = write_artefacts(roc_artefacts(scores, labels, "test"), tmp_path)
    data = json.loads((tmp_path / "roc.json").read_text())
    assert data["fpr_floor"] == pytest.approx(1 / 359)
    assert min(f for f in data["fpr"] if f > 0) >= data["fpr_floor"] - 1e-12
    assert paths["roc_png"].name == "roc.png" and (tmp_path / "roc.png").stat().st_size > 0
