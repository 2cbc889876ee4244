"""Small pure statistics functions shared by membership metrics and the canary audit.

ε lower bound (Kairouz et al. 2015; Jagielski et al. 2020): an (ε, δ)-DP mechanism forces every test that
tells two neighbouring inputs apart to satisfy TPR ≤ e^ε·FPR + δ and 1 − FPR ≤ e^ε·(1 − TPR) + δ, so
    ε ≥ max( ln((TPR − δ)/FPR), ln((1 − FPR − δ)/(1 − TPR)) ).
To claim it with confidence 1 − α, TPR is replaced by its Clopper–Pearson lower bound and FPR by its upper
bound (each one-sided at α/2). The threshold is chosen on one half of the scored trials and the bound is
evaluated on the other half, so the threshold is not selected on the data it is judged on. Nothing
provable → 0. Which game the trials come from (and so what the bound means) is the caller's to state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

MAX_THRESHOLDS = 1024  # candidate thresholds (quantiles of the choosing half)


def clopper_pearson(successes: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """Two-sided (1 − α) Clopper–Pearson interval for a binomial proportion."""
    if trials == 0:
        return 0.0, 1.0
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return lo, hi


def epsilon_from_rates(tpr_lo: float, fpr_hi: float, delta: float) -> float:
    """max(ln((TPR−δ)/FPR), ln((1−FPR−δ)/(1−TPR))) with the bounds plugged in; 0 when nothing holds."""
    candidates = [0.0]
    if tpr_lo - delta > 0 and fpr_hi > 0:
        candidates.append(math.log((tpr_lo - delta) / fpr_hi))
    if 1 - fpr_hi - delta > 0 and 1 - tpr_lo > 0:
        candidates.append(math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    return max(candidates)


def bound_at(scores: np.ndarray, labels: np.ndarray, threshold: float, delta: float, alpha: float) -> float:
    """ε lower bound of the test ``score >= threshold`` (and its complement), rates bounded by
    Clopper–Pearson at level ``alpha``; ``labels`` is a boolean membership array."""
    positives, negatives = labels.sum(), (~labels).sum()
    tp = int((scores[labels] >= threshold).sum())
    fp = int((scores[~labels] >= threshold).sum())
    tpr_lo, _ = clopper_pearson(tp, int(positives), alpha)
    _, fpr_hi = clopper_pearson(fp, int(negatives), alpha)
    return epsilon_from_rates(tpr_lo, fpr_hi, delta)


def clopper_pearson_ends(successes: np.ndarray, trials: int, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``clopper_pearson`` for every count in ``successes`` (of the same ``trials``) at once: (lower ends, upper
    ends). One call of the beta quantile per array, not per count: the threshold searches below try up to
    ``MAX_THRESHOLDS`` tests each."""
    k = np.asarray(successes, dtype=float)
    lower, upper = np.zeros_like(k), np.ones_like(k)
    if trials == 0:
        return lower, upper
    some, short = k > 0, k < trials
    lower[some] = stats.beta.ppf(alpha / 2, k[some], trials - k[some] + 1)
    upper[short] = stats.beta.ppf(1 - alpha / 2, k[short] + 1, trials - k[short])
    return lower, upper


def bounds_at(scores: np.ndarray, labels: np.ndarray, thresholds: np.ndarray, delta: float,
              alpha: float) -> np.ndarray:
    """``bound_at`` at every threshold of ``thresholds`` (the same numbers, one pass): the counts of scores at or
    above each threshold come from one sort of each class."""
    positive, negative = np.sort(scores[labels]), np.sort(scores[~labels])
    tp = len(positive) - np.searchsorted(positive, thresholds, side="left")
    fp = len(negative) - np.searchsorted(negative, thresholds, side="left")
    tpr_lo, _ = clopper_pearson_ends(tp, len(positive), alpha)
    _, fpr_hi = clopper_pearson_ends(fp, len(negative), alpha)
    return np.array([epsilon_from_rates(float(t), float(f), delta) for t, f in zip(tpr_lo, fpr_hi)])


def best_threshold(scores: np.ndarray, labels: np.ndarray, candidates: np.ndarray, delta: float,
                   alpha: float) -> float:
    """The first of ``candidates`` whose test gives the largest ``bound_at``."""
    return float(candidates[int(np.argmax(bounds_at(scores, labels, candidates, delta, alpha)))])


def epsilon_lower_bound(scores: np.ndarray, labels: np.ndarray, delta: float, rng: np.random.Generator,
                        alpha: float = 0.05) -> float:
    """Threshold chosen on a random half (drawn from ``rng``, maximising the bound there), bound evaluated
    on the other half."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    order = rng.permutation(len(scores))
    choose, judge = order[: len(order) // 2], order[len(order) // 2:]
    candidates = np.unique(scores[choose])
    if len(candidates) > 512:  # quantiles are enough to find a good threshold
        candidates = np.unique(np.quantile(scores[choose], np.linspace(0, 1, 512)))
    if len(candidates) == 0:
        return 0.0
    best = best_threshold(scores[choose], labels[choose], candidates, delta, alpha)
    return bound_at(scores[judge], labels[judge], best, delta, alpha)


def rates_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    """(true positives, members, false positives, non-members) of the test ``score >= threshold``."""
    hit = scores >= threshold
    return int((hit & labels).sum()), int(labels.sum()), int((hit & ~labels).sum()), int((~labels).sum())


def split_bound(scores: np.ndarray, labels: np.ndarray, delta: float, alpha: float) -> dict[str, Any]:
    """Pick the threshold maximising the bound on the first half of the releases (rows), evaluate it on
    the second half. ``epsilon_from_rates`` covers both directions of the test (score ≥ t and score < t)."""
    half = scores.shape[0] // 2
    choose_s, choose_l = scores[:half].ravel(), labels[:half].ravel()
    judge_s, judge_l = scores[half:].ravel(), labels[half:].ravel()
    candidates = np.unique(np.quantile(choose_s, np.linspace(0, 1, MAX_THRESHOLDS)))
    threshold = best_threshold(choose_s, choose_l, candidates, delta, alpha)
    tp, pos, fp, neg = rates_at(judge_s, judge_l, threshold)
    return {
        "epsilon_lower_bound": bound_at(judge_s, judge_l, threshold, delta, alpha),
        "threshold": threshold,
        "tpr": tp / max(pos, 1), "fpr": fp / max(neg, 1),
        "tpr_ci": clopper_pearson(tp, pos, alpha), "fpr_ci": clopper_pearson(fp, neg, alpha),
    }


def separation(scores: np.ndarray, labels: np.ndarray) -> float:
    """Standardised mean shift μ̂ of the scores: for the projection statistic of a Gaussian mechanism it
    estimates the mechanism's μ (= √T/σ at full sensitivity), so μ̂ ≈ √T/σ shows the canary is worst case."""
    shift = float(scores[labels].mean() - scores[~labels].mean())
    spread = float(scores[~labels].std())
    if spread == 0:
        return 0.0 if shift == 0 else math.copysign(math.inf, shift)
    return shift / spread


def auc_delong(scores: np.ndarray, labels: np.ndarray, alpha: float = 0.05) -> tuple[float, float, float]:
    """AUC of ``scores`` (higher = positive) against boolean ``labels`` with DeLong's (1 − α) interval
    (DeLong, DeLong & Clarke-Pearson 1988; midrank form of Sun & Xu 2014).

    The AUC is the mean placement value V10 of the positives (the fraction of negatives each one outscores,
    ties counting ½); its variance is var(V10)/m + var(V01)/n over the m positives and n negatives, and the
    interval is AUC ± z_{1−α/2}·√variance clipped to [0, 1]. It treats the scored examples as independent
    draws. With fewer than two positives or negatives nothing is estimable: the interval is [0, 1]."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = scores[labels], scores[~labels]
    m, n = len(pos), len(neg)
    if m == 0 or n == 0:
        raise ValueError("an AUC needs both positives and negatives")
    combined = stats.rankdata(np.concatenate([pos, neg]))
    v10 = (combined[:m] - stats.rankdata(pos)) / n        # per positive: share of negatives below it
    v01 = 1 - (combined[m:] - stats.rankdata(neg)) / m    # per negative: share of positives above it
    auc = float(v10.mean())
    if m < 2 or n < 2:
        return auc, 0.0, 1.0
    half = float(stats.norm.ppf(1 - alpha / 2)) * math.sqrt(v10.var(ddof=1) / m + v01.var(ddof=1) / n)
    return auc, max(0.0, auc - half), min(1.0, auc + half)


# ---------------------------------------------------------------------------------------------------
# the one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run")
#
# m canaries are each included independently with probability 1/2; the auditor guesses "in" / "out" for
# r of them and abstains on the rest. Under (ε, δ)-DP with respect to each canary, the number W of correct
# guesses satisfies, for every v (their main theorem, with the δ > 0 term),
#     P[W ≥ v] ≤ P[B ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ B < v] / i,     B ~ Binomial(r, e^ε / (1 + e^ε)).
# The right-hand side is the p-value of "the run is (ε, δ)-DP" after v correct guesses. An (ε, δ)-DP
# mechanism is also (ε', δ)-DP for every ε' ≥ ε, so rejecting at any ε' rejects every smaller ε: the bound
# is the largest ε whose p-value is ≤ β (found on a grid, then refined by bisection, and only ever a point
# where the p-value was evaluated to be ≤ β, so a coarse grid can only make it smaller).

ONE_RUN_EPS_MAX = 30.0   # the grid's end: beyond it the p-value is the δ term alone
ONE_RUN_EPS_STEP = 0.02  # grid spacing before the bisection


def one_run_p_values(guesses: int, correct: int, canaries: int, epsilons: np.ndarray, delta: float) -> np.ndarray:
    """p-value of ``correct`` (or more) correct guesses among ``guesses`` under (ε, δ)-DP, for every ε of
    ``epsilons`` (the theorem above)."""
    r, v, m = int(guesses), int(correct), int(canaries)
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {v}, {r}, {m}")
    eps = np.atleast_1d(np.asarray(epsilons, dtype=float))
    p = 1.0 / (1.0 + np.exp(-eps))  # accuracy of ε-DP randomized response
    tail = stats.binom.sf(v - 1, r, p)  # P[B ≥ v]
    if delta == 0 or v == 0:
        return np.minimum(tail, 1.0)
    # cdf[:, j] = P[B ≤ j − 1] for j = 0..v, so P[v − i ≤ B ≤ v − 1] = cdf[:, v] − cdf[:, v − i]
    cdf = stats.binom.cdf(np.arange(-1, v)[None, :], r, p[:, None])
    i = np.arange(1, v + 1)
    window = cdf[:, [v]] - cdf[:, v - i]
    return np.minimum(tail + 2 * m * delta * (window / i[None, :]).max(axis=1), 1.0)


def one_run_epsilon_lower_bound(guesses: int, correct: int, canaries: int, delta: float, beta: float) -> float:
    """The largest ε the one-run test rejects at level ``beta`` (0 when it rejects none): with probability
    ≥ 1 − β over the canaries' inclusion, an (ε, δ)-DP run gives a bound ≤ ε."""
    if guesses == 0:
        return 0.0
    grid = np.arange(0.0, ONE_RUN_EPS_MAX + ONE_RUN_EPS_STEP / 2, ONE_RUN_EPS_STEP)
    ok = one_run_p_values(guesses, correct, canaries, grid, delta) <= beta
    if not ok.any():
        return 0.0
    last = int(np.flatnonzero(ok)[-1])
    lo = float(grid[last])
    if last == len(grid) - 1:
        return lo
    hi = float(grid[last + 1])
    for _ in range(30):  # invariant: p-value(lo) ≤ β
        mid = (lo + hi) / 2
        if one_run_p_values(guesses, correct, canaries, np.array([mid]), delta)[0] <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def guess_and_count(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int,
                    rng: np.random.Generator) -> int:
    """Guess "in" for the ``k_in`` highest scores and "out" for the ``k_out`` lowest (ties broken by a random
    order drawn from ``rng``, independent of the inclusion), abstain on the rest; the number of correct
    guesses."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    if k_in + k_out > len(scores):
        raise ValueError(f"{k_in} + {k_out} guesses among {len(scores)} canaries")
    tie = rng.permutation(len(scores))
    order = np.lexsort((tie, scores))  # ascending score, ties in random order
    low, high = order[:k_out], order[len(order) - k_in:] if k_in else order[:0]
    return int(included[high].sum() + (~included[low]).sum())
