"""``lira``: the likelihood-ratio attack (Carlini et al., S&P 2022) on the target of the game
(``attack.mia_target``, ``attacks/membership_game.py``).

Per example x, fit Gaussians to the references' logit-scaled confidences φ: IN references (trained on x)
and OUT references, with μ the mean over the example's references (the paper's Algorithm 1; the
reference code's median is less efficient with the 2–4 OUT references per example of the ``victim`` game,
measured in docs/membership.md).
- online (``attack.online: true``, default): score = log N(φ_t; μ_in, σ_in²) − log N(φ_t; μ_out, σ_out²).
- offline: OUT references only. ``attack.offline_test: one-sided`` (default, the paper's test):
  score = log Pr[Z ≤ φ_t], Z ~ N(μ_out, σ_out²). ``two-sided`` is the reference code's variant:
  score = −log N(φ_t; μ_out, σ_out²) (large for φ far from μ_out on either side).
- ``attack.variance: global`` (default; the reference code's advice below ~64 models): one σ for IN and
  one for OUT, the pooled within-example variance Σ_x Σ_r (φ_rx − μ_x)² / Σ_x (n_x − 1), unbiased
  whatever the number n_x of references per example (residuals about a 3-reference median or mean
  divided by n_x would underestimate σ_OUT when OUT references are few, as in the ``victim`` game, and
  skew the online ratio); ``per-example``: each example's own sample std (n_x − 1 denominator), the
  global σ where an example has fewer than two references.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpeval.attacks.base import Scores
from dpeval.attacks.membership_game import ShadowAttack, ShadowParams, Signals
from dpeval.attacks.registry import ATTACKS
from dpeval.core.params import param

VARIANCES = ("global", "per-example")
OFFLINE_TESTS = ("one-sided", "two-sided")
MIN_STD = 1e-6


@dataclass
class LiraParams(ShadowParams):
    variance: str = param("global", "`global`: one σ for IN and one for OUT; `per-example`: each example's "
                                    "own σ", choices=VARIANCES)
    offline_test: str = param("one-sided", "offline score: `one-sided` log Pr[Z ≤ φ] (the paper) or "
                                           "`two-sided` (the reference code)", choices=OFFLINE_TESTS)


def _fit(phi: np.ndarray, member: np.ndarray, variance: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of φ over the references selected by ``member`` ([R, N] bool), per example."""
    count = member.sum(axis=0)
    mu = np.divide(np.where(member, phi, 0.0).sum(axis=0), count, out=np.zeros(phi.shape[1]), where=count > 0)
    squares = np.where(member, (phi - mu) ** 2, 0.0).sum(axis=0)
    dof = np.maximum(count - 1, 0)
    pooled = math.sqrt(squares.sum() / dof.sum()) if dof.sum() else 1.0
    std = np.full_like(mu, pooled)
    if variance == "per-example":
        std = np.sqrt(np.divide(squares, dof, out=std ** 2, where=dof > 0))
    return mu, np.maximum(std, MIN_STD)


def lira_scores(signals: Signals, params: LiraParams) -> np.ndarray:
    mu_out, std_out = _fit(signals.ref_phi, ~signals.ref_in, params.variance)
    phi = signals.target_phi
    if params.online:
        mu_in, std_in = _fit(signals.ref_phi, signals.ref_in, params.variance)
        return stats.norm.logpdf(phi, mu_in, std_in) - stats.norm.logpdf(phi, mu_out, std_out)
    if params.offline_test == "one-sided":
        return stats.norm.logcdf(phi, mu_out, std_out)
    return -stats.norm.logpdf(phi, mu_out, std_out)


@ATTACKS.register("lira", "LiRA: likelihood ratio of the target's confidence under IN/OUT shadow models")
class LiRA(ShadowAttack):
    """Likelihood-ratio membership inference (Carlini et al. 2022) with shadow models trained by the same defense;
    online/offline, global/per-example variance."""

    Params = LiraParams
    headline, higher_leaks, headline_label = "auc", True, "LiRA AUC"

    def guess(self, evidence: Signals) -> Scores:
        return Scores(lira_scores(evidence, self.params))

    def title(self) -> str:
        p = self.params
        return f"LiRA ({'online' if p.online else f'offline {p.offline_test}'}, {p.variance} variance)"
