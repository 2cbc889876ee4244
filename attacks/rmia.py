"""``rmia``: robust membership inference (Zarifzadeh, Liu & Shokri, ICML 2024).

Signal Pr(x|θ): the probability of the true label. Pr(x), the marginal over models trained like the
target, from the references:
- online (default): the mean of Pr(x|θ') over all references, IN and OUT for x alike;
- offline (OUT references only): Pr(x) = ½[(1 + a)·Pr_OUT(x) + (1 − a)], from assuming
  Pr_IN(x) ≈ a·Pr_OUT(x) + (1 − a). ``attack.offline_a``: a fixed a, or null (default) to fit it as the
  paper does: each reference model in turn is the target of the offline attack against the other
  references, and the a of the grid 0, 0.1, …, 1 with the best mean AUC is kept (ties: the smaller a).

Population z: the game's population itself (the examples the models train on), so Pr(z) is computed
exactly like Pr(x): in the online attack from a mixture of IN and OUT references for z, matching a target
that trained on part of the population. Score(x) = the fraction of z with
[Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)] > γ (``attack.gamma``, default 1). Comparing x with itself adds the same
[1 > γ] to every score. Ties (the fraction takes at most |Z| + 1 values) are broken by the ratio
r = Pr(x|θ)/Pr(x) itself: score = (count + r/(1 + r)) / |Z|, which orders examples by (count, r).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

from dpeval.attacks.base import Scores
from dpeval.attacks.membership_game import ShadowAttack, ShadowParams, Signals
from dpeval.attacks.registry import ATTACKS
from dpeval.core.params import param

EPS = 1e-30
A_GRID = np.round(np.linspace(0, 1, 11), 10)
BELOW_ONE = np.nextafter(1.0, 0.0)


@dataclass
class RmiaParams(ShadowParams):
    offline_a: float | None = param(None, "offline: a in Pr(x) = ½[(1 + a)·Pr_OUT(x) + (1 − a)]; null = fitted "
                                          "on the shadow models (grid 0, 0.1, …, 1)", low=0, high=1)
    gamma: float = param(1.0, "γ: a population sample z is dominated when the ratio exceeds γ", low=0,
                         low_open=True)


def marginal(prob: np.ndarray, ref_in: np.ndarray, online: bool, a: float) -> np.ndarray:
    """Pr(x) per example from references' probabilities [R, N] (NaN offline where no reference is OUT)."""
    if online:
        return prob.mean(axis=0)
    out = np.where(~ref_in, prob, np.nan)
    counts = (~ref_in).sum(axis=0)
    mean_out = np.divide(np.nansum(out, axis=0), counts, out=np.full(prob.shape[1], np.nan), where=counts > 0)
    return 0.5 * ((1 + a) * mean_out + (1 - a))


def pairwise_scores(target_prob: np.ndarray, px: np.ndarray, gamma: float) -> np.ndarray:
    """Score(x) against the population z (every example with a defined Pr): NaN where Pr(x) is undefined."""
    ratio = target_prob / np.maximum(px, EPS)
    known = np.isfinite(ratio)
    population = np.sort(ratio[known])
    # fraction of z with ratio_x / ratio_z > γ  ⇔  ratio_z < ratio_x / γ; ties broken by ratio_x
    count = np.searchsorted(population, ratio[known] / gamma, side="left")
    tie_break = np.minimum(ratio[known] / (1 + ratio[known]), BELOW_ONE)
    scores = np.full(len(ratio), np.nan)
    scores[known] = (count + tie_break) / len(population)
    return scores


def fit_offline_a(ref_prob: np.ndarray, ref_in: np.ndarray, gamma: float) -> float:
    """The a of ``A_GRID`` maximising the mean AUC of the offline attack on each reference model against
    the others (examples without an OUT reference among the others are left out of that model's AUC)."""
    best_a, best_auc = 0.0, -1.0
    for a in A_GRID:
        aucs = []
        for r in range(ref_prob.shape[0]):
            others = np.arange(ref_prob.shape[0]) != r
            scores = pairwise_scores(ref_prob[r], marginal(ref_prob[others], ref_in[others], False, a), gamma)
            known = np.isfinite(scores)
            labels = ref_in[r, known]
            if labels.all() or not labels.any():
                continue
            aucs.append(roc_auc_score(labels, scores[known]))
        if aucs and np.mean(aucs) > best_auc:
            best_a, best_auc = float(a), float(np.mean(aucs))
    return best_a


def rmia_scores(signals: Signals, params: RmiaParams, a: float | None = None) -> np.ndarray:
    """RMIA scores of the signals' target; offline, ``a`` (default: ``params.offline_a``) must be set."""
    a = params.offline_a if a is None else a
    if not params.online and a is None:
        raise ValueError("offline RMIA needs a (fit it with fit_offline_a)")
    px = marginal(signals.ref_prob, signals.ref_in, params.online, 0.0 if a is None else a)
    return pairwise_scores(signals.target_prob, px, params.gamma)


@ATTACKS.register("rmia", "RMIA: pairwise likelihood ratios against population samples, shadow references")
class RMIA(ShadowAttack):
    """Robust membership inference (Zarifzadeh et al. 2024) with shadow references trained by the same defense and
    the game's population as z."""

    Params = RmiaParams
    headline, higher_leaks, headline_label = "auc", True, "RMIA AUC"

    def guess(self, evidence: Signals) -> Scores:
        """Offline with ``attack.offline_a`` null, ``a`` is fitted on the references and reported as
        ``offline_a`` (the game averages it over the targets of the leave-one-model-out game)."""
        p = self.params
        if p.online or p.offline_a is not None:
            return Scores(rmia_scores(evidence, p))
        a = fit_offline_a(evidence.ref_prob, evidence.ref_in, p.gamma)
        return Scores(rmia_scores(evidence, p, a), {"offline_a": a})

    def title(self) -> str:
        p = self.params
        a = "fitted" if p.offline_a is None else f"{p.offline_a}"
        return f"RMIA ({'online' if p.online else f'offline, a={a}'}, γ={p.gamma})"
