"""Metrics of a membership test from scores (higher = "member"): ROC, AUC, balanced accuracy,
TPR at fixed FPR, and an empirical ε lower bound.

The ε lower bound is ``harness.core.statistics.epsilon_lower_bound`` (95% confidence, threshold chosen
on one half of the scored examples, judged on the other) at the run's δ.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve

from harness.core.statistics import epsilon_lower_bound

FPR_POINTS = {"tpr_at_0.1pct_fpr": 0.001, "tpr_at_1pct_fpr": 0.01, "tpr_at_10pct_fpr": 0.1}


def membership_metrics(scores: np.ndarray, labels: np.ndarray, delta: float,
                       rng: np.random.Generator) -> dict[str, float]:
    """ROC metrics of ``scores`` (higher = member) against boolean ``labels``; ``rng`` draws the half on
    which the ε lower bound's threshold is chosen."""
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
    metrics["epsilon_lower_bound"] = epsilon_lower_bound(scores, labels, delta, rng)
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
