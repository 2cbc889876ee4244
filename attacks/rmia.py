"""``rmia``: robust membership inference (Zarifzadeh, Liu & Shokri, ICML 2024).

Signal Pr(x|θ): the probability of the true label. Pr(x) is the average over reference models:
online, over all references; offline (OUT references only), Pr(x) = ½[(1 + a)·Pr_OUT(x) + (1 − a)], with
``attack.offline_a`` = a. Population z: the public split (no model trained on it, so every reference is
OUT for z and the same formulas apply). Score(x) = the fraction of z with
[Pr(x|θ)/Pr(x)] / [Pr(z|θ)/Pr(z)] > γ (``attack.gamma``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks.membership_common import ShadowAttack, ShadowParams, View
from attacks.registry import ATTACKS
from harness.core.errors import ConfigError
from harness.core.params import param

EPS = 1e-30


@dataclass
class RmiaParams(ShadowParams):
    offline_a: float = param(0.3, "offline: Pr(x) = ½[(1 + a)·Pr_OUT(x) + (1 − a)]", low=0, high=1)
    gamma: float = param(2.0, "γ: a population sample z is dominated when the ratio exceeds γ", low=0,
                         low_open=True)


def _marginal(prob: np.ndarray, ref_in: np.ndarray | None, online: bool, a: float) -> np.ndarray:
    """Pr(x) from references' probabilities [R, N]; ref_in None means all references are OUT."""
    if online:
        return prob.mean(axis=0)
    out = prob if ref_in is None else np.where(~ref_in, prob, np.nan)
    return 0.5 * ((1 + a) * np.nanmean(out, axis=0) + (1 - a))


def rmia_scores(view: View, params: RmiaParams) -> np.ndarray:
    if view.ref_public_prob.shape[1] == 0:
        raise ConfigError("attack: rmia needs a public split for its population z; set data.public_fraction > 0")
    px = _marginal(view.ref_prob, view.ref_in, params.online, params.offline_a)
    pz = _marginal(view.ref_public_prob, None, params.online, params.offline_a)
    ratio_x = view.target_prob / np.maximum(px, EPS)
    ratio_z = np.sort(view.target_public_prob / np.maximum(pz, EPS))
    # fraction of z with ratio_x / ratio_z > γ  ⇔  ratio_z < ratio_x / γ
    return np.searchsorted(ratio_z, ratio_x / params.gamma, side="left") / len(ratio_z)


@ATTACKS.register("rmia", "RMIA: pairwise likelihood ratios against population samples, shadow references")
class RMIA(ShadowAttack):
    Params = RmiaParams
    headline, higher_leaks, headline_label = "auc", True, "RMIA AUC"
    description = ("Robust membership inference (Zarifzadeh et al. 2024) with shadow references trained by "
                   "the same defense and the public split as population z.")

    def score(self, view: View) -> np.ndarray:
        return rmia_scores(view, self.params)

    def title(self) -> str:
        p = self.params
        return f"RMIA ({'online' if p.online else f'offline, a={p.offline_a}'}, γ={p.gamma})"
