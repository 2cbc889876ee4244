"""Metrics of a membership test from scores (higher = "member"): ROC, AUC with its confidence interval,
balanced accuracy, TPR at fixed FPR, an empirical ε lower bound; and the verdict on them.

- **AUC interval** (``auc_ci_low``, ``auc_ci_high``): DeLong's 95% interval
  (``dpeval.core.statistics.auc_delong``), which treats the scored examples as independent.
- **TPR at a fixed FPR** X is reported only when there are at least ⌈1/X⌉ non-members: with fewer, the
  smallest non-zero FPR the data can show is above X, and "TPR at X" would be TPR at zero false positives.
  Otherwise the value is null and ``<key>_note`` says why.
- **ε lower bound**: ``dpeval.core.statistics.epsilon_lower_bound`` (95% confidence, threshold chosen on
  one random half of the scored examples, judged on the other) at the run's δ. What it bounds depends on
  the game the scores come from (docs/membership.md).
- **Verdict**: ``leaks`` when the ε lower bound is > 0 or the AUC interval lies entirely above 0.5 (both
  tests only claim on the leaking side: members scoring higher); otherwise ``no-leak-detected``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_curve

from dpeval.attacks.base import Artefact, TextFile
from dpeval.attacks.game import Scored
from dpeval.core.files import save_figure
from dpeval.core.statistics import auc_delong, epsilon_lower_bound
from dpeval.core.verdicts import Verdict

FPR_POINTS = {"tpr_at_0.1pct_fpr": 0.001, "tpr_at_1pct_fpr": 0.01, "tpr_at_10pct_fpr": 0.1}


def nonmembers_needed(fpr: float) -> int:
    """The fewest non-members at which an FPR of ``fpr`` is resolvable: one false positive is ≤ ``fpr``."""
    return math.ceil(1 / fpr - 1e-9)


def tpr_at(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    """The best TPR of the ROC among thresholds whose FPR is at most ``target``."""
    return float(tpr[fpr <= target].max()) if (fpr <= target).any() else 0.0


def membership_verdict(metrics: dict[str, Any]) -> Verdict:
    """The verdict of ``membership_metrics``' result (the rule above)."""
    return Verdict.of(metrics["epsilon_lower_bound"] > 0 or metrics["auc_ci_low"] > 0.5)


def membership_metrics(scores: np.ndarray, labels: np.ndarray, delta: float,
                       rng: np.random.Generator) -> dict[str, Any]:
    """ROC metrics of ``scores`` (higher = member) against boolean ``labels``; ``rng`` draws the half on
    which the ε lower bound's threshold is chosen."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        raise ValueError("membership metrics need both members and non-members")
    fpr, tpr, _ = roc_curve(labels, scores)
    auc, low, high = auc_delong(scores, labels)
    n_nonmembers = int((~labels).sum())
    metrics: dict[str, Any] = {
        "auc": auc, "auc_ci_low": low, "auc_ci_high": high,
        "balanced_accuracy": float(np.max(1 - (fpr + (1 - tpr)) / 2)),
    }
    for name, target in FPR_POINTS.items():
        need = nonmembers_needed(target)
        if n_nonmembers >= need:
            metrics[name] = tpr_at(fpr, tpr, target)
        else:
            metrics[name] = None
            metrics[f"{name}_note"] = (f"not resolvable: {n_nonmembers} non-members, an FPR of {target:g} "
                                       f"needs at least {need}")
    metrics["epsilon_lower_bound"] = epsilon_lower_bound(scores, labels, delta, rng)
    metrics["n_members"] = int(labels.sum())
    metrics["n_nonmembers"] = n_nonmembers
    return metrics


@dataclass(kw_only=True)
class MembershipScores(Scored):
    """A membership game's metrics and the scores they come from (the ROC's points)."""

    scores: np.ndarray   # one per scored candidate (higher: more likely a member), in the game's order
    labels: np.ndarray   # bool: a member


def mean_metrics(per_target: list[dict[str, float]]) -> dict[str, float]:
    """The metrics an attack's ``Scores`` report beside the scores, averaged over the game's targets (or releases)."""
    keys = sorted({k for m in per_target for k in m})
    return {k: float(np.mean([m[k] for m in per_target if k in m])) for k in keys}


def roc_artefacts(scores: np.ndarray, labels: np.ndarray, title: str) -> dict[str, Artefact]:
    """The ROC points as JSON (``roc``, for the report) and its log-log picture (``roc_png``)."""
    labels = np.asarray(labels, dtype=bool)
    fpr, tpr, _ = roc_curve(labels, np.asarray(scores, dtype=float))
    nonmembers = int((~labels).sum())
    points = json.dumps({"fpr": fpr.tolist(), "tpr": tpr.tolist(), "fpr_floor": 1 / nonmembers})
    return {"roc": TextFile("roc.json", points), "roc_png": RocPicture("roc.png", fpr, tpr, nonmembers, title)}


@dataclass(frozen=True)
class RocPicture(Artefact):
    """A log-log ROC curve whose axes stop at 1/(number of non-members), the smallest non-zero FPR the data can
    show."""

    file: str
    fpr: np.ndarray
    tpr: np.ndarray
    nonmembers: int
    title: str

    def write(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        floor = 1 / self.nonmembers
        fig, ax = plt.subplots(figsize=(4.5, 4.2))
        ax.loglog(np.maximum(self.fpr, floor), np.maximum(self.tpr, floor), label="attack")
        ax.plot([floor, 1], [floor, 1], "k:", lw=1, label="chance")
        ax.set_xlim(floor, 1)
        ax.set_ylim(floor, 1)
        ax.set_xlabel(f"false positive rate (≥ 1/{self.nonmembers} non-members)")
        ax.set_ylabel("true positive rate")
        ax.set_title(self.title)
        ax.legend(fontsize=8)
        try:
            save_figure(fig, path, dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
