"""``informed-recon``: the informed, prior-aware reconstruction attack (Hayes, Mahloujifar & Balle, NeurIPS 2023)
beside the bound the run's mechanism puts on it.

The game (``attacks/informed_game.py``) replays the run's T steps for a target drawn from n candidates and hands
this module, per game, the inner products of every whitened residual release o_t with every candidate's whitened
contribution c_i (and the norms). Two statistics, both pure functions of those signals:

- ``likelihood`` (the guess): the log-likelihood ratio of "the target is i" under the Poisson mixture,
  Σ_t log(1 − q + q·exp(⟨o_t, c_i⟩ − ‖c_i‖²/2)): the Bayes-optimal guess against a uniform prior when the noise
  is N(0, I) in the whitened space, as the mechanism promises. Without noise (a non-DP defense) its limit: each
  step explained by candidate i or by nothing, whichever is nearer, −Σ_t min(‖o_t − c_i‖², ‖o_t‖²).
- ``linear``: Hayes et al.'s linear score Σ_t ⟨o_t, c_i⟩, reported beside it as ``success_linear``.
"""

from __future__ import annotations

import numpy as np

from dpeval.attacks.informed_game import InformedReconstructionAttack, ResidualSignals
from dpeval.attacks.registry import ATTACKS


def likelihood_scores(s: ResidualSignals) -> np.ndarray:
    """[n] log-likelihood ratios of the candidates over the T steps (module docstring)."""
    if s.noiseless:
        to_candidate = s.obs2[:, None] - 2 * s.inner + s.norms2
        return -np.minimum(to_candidate, s.obs2[:, None]).sum(axis=0)
    with np.errstate(divide="ignore"):  # q = 1: log(1 − q) = −inf, the step always holds the target
        empty = np.log1p(-s.sample_rate)
    return np.logaddexp(empty, np.log(s.sample_rate) + s.inner - s.norms2 / 2).sum(axis=0)


def linear_scores(s: ResidualSignals) -> np.ndarray:
    """[n] Σ_t ⟨o_t, c_i⟩."""
    return s.inner.sum(axis=0)


@ATTACKS.register("informed-recon", "informed adversary names the target among n candidates from every release; "
                                    "success vs the run's DP bound")
class InformedReconstruction(InformedReconstructionAttack):
    """The adversary DP-SGD's guarantee is stated against: it knows every other example, every model state and every
    release, and names the target among n candidates; its success beside the bound 1 − f(1/n) of the run's accounted
    mechanism."""

    headline, higher_leaks, headline_label = "success", True, "informed reconstruction success"
    baseline = "chance"

    def guess(self, evidence: ResidualSignals) -> dict[str, np.ndarray]:
        return {"likelihood": likelihood_scores(evidence), "linear": linear_scores(evidence)}
