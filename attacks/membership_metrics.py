"""Metrics of a membership test from scores (higher = "member"): ROC, AUC, balanced accuracy,
TPR at fixed FPR, and an empirical ε lower bound.

ε lower bound (Kairouz et al. 2015; Jagielski et al. 2020): an (ε, δ)-DP training forces every test to
satisfy TPR ≤ e^ε·FPR + δ and 1 − FPR ≤ e^ε·(1 − TPR) + δ, so
    ε ≥ max( ln((TPR − δ)/FPR), ln((1 − FPR − δ)/(1 − TPR)) ).
To claim it with 95% confidence, TPR is replaced by its Clopper–Pearson lower bound and FPR by its upper
bound (each one-sided at α/2 = 2.5%, i.e. the two ends of the 95% two-sided interval). The threshold is
chosen on one half of the scored examples and the bound is evaluated on the other half, so the threshold
is not selected on the data it is judged on. Nothing provable → 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

FPR_POINTS = {"tpr_at_0.1pct_fpr": 0.001, "tpr_at_1pct_fpr": 0.01, "tpr_at_10pct_fpr": 0.1}


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


def epsilon_lower_bound(scores: np.ndarray, labels: np.ndarray, delta: float, seed: int = 0,
                        alpha: float = 0.05) -> float:
    """Threshold chosen on a random half (maximising the bound there), bound evaluated on the other half."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    order = np.random.default_rng(seed).permutation(len(scores))
    choose, judge = order[: len(order) // 2], order[len(order) // 2:]
    candidates = np.unique(scores[choose])
    if len(candidates) > 512:  # quantiles are enough to find a good threshold
        candidates = np.unique(np.quantile(scores[choose], np.linspace(0, 1, 512)))
    best = max(candidates, key=lambda t: bound_at(scores[choose], labels[choose], t, delta, alpha), default=None)
    if best is None:
        return 0.0
    return bound_at(scores[judge], labels[judge], best, delta, alpha)


def membership_metrics(scores: np.ndarray, labels: np.ndarray, delta: float, seed: int = 0) -> dict[str, float]:
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        raise ValueError("membership metrics need both members and non-members")
    fpr, tpr, _ = roc_curve(labels, scores)
    metrics = {
        "auc": float(roc_auc_score(labels, scores)),
        "balanced_accuracy": float(np.max(1 - (fpr + (1 - tpr)) / 2)),
    }
    for name, target in FPR_POINTS.items():
        metrics[name] = float(tpr[fpr <= target].max()) if (fpr <= target).any() else 0.0
    metrics["epsilon_lower_bound"] = epsilon_lower_bound(scores, labels, delta, seed)
    metrics["n_members"] = int(labels.sum())
    metrics["n_nonmembers"] = int((~labels).sum())
    return metrics


def save_roc(scores: np.ndarray, labels: np.ndarray, out_dir: Path, title: str) -> dict[str, str]:
    """ROC points as JSON (for the report) and a log-log PNG; returns the artefact paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fpr, tpr, _ = roc_curve(np.asarray(labels, dtype=bool), np.asarray(scores, dtype=float))
    out_dir.mkdir(parents=True, exist_ok=True)
    roc_json = out_dir / "roc.json"
    roc_json.write_text(json.dumps({"fpr": fpr.tolist(), "tpr": tpr.tolist()}))
    fig, ax = plt.subplots(figsize=(4.5, 4.2))
    ax.loglog(np.maximum(fpr, 1e-5), np.maximum(tpr, 1e-5), label="attack")
    ax.plot([1e-5, 1], [1e-5, 1], "k:", lw=1, label="chance")
    ax.set_xlim(1e-5, 1)
    ax.set_ylim(1e-5, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title)
    ax.legend(fontsize=8)
    roc_png = out_dir / "roc.png"
    fig.savefig(roc_png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"roc": str(roc_json), "roc_png": str(roc_png)}
