"""``grad-mia``: membership inference on the shared gradient itself (federated / gradient-sharing threat
model). No shadow models.

The defense releases the gradients of ``attack.batches`` batches of ``attack.batch_size`` private
examples at the attacked state (``attack.at``), each through its own release path. For a release r and a
candidate set (whose inputs and labels the attacker holds, shuffled, not which are members): the batch's
members plus as many held-out test examples (non-members, assigned round robin; ``check_task`` refuses a
run whose test split has fewer than ``batches × batch_size``, so every release gets exactly ``batch_size``
of each). The game is ``dpeval.attacks.gradient_game.GradientMembershipAttack``: it computes each candidate's
gradient at the attacked state, restricted to the released coordinates when ``attack.mask_aware`` (the default),
and hands them to this module's pure score (``ReleaseSignals``). Statistics
(``attack.statistic``):
- ``nnls`` (default): explain r jointly as Σ_c w_c·g_c with w ≥ 0 (non-negative least squares over the
  candidate set); score = ‖w_c·g_c‖, the size of c's fitted contribution (≈ C/B for a clipped member,
  ≈ 0 for a non-member; exact recovery for an undefended release).
- ``cosine``: cosine similarity of g_c and r after projecting out of both the mean gradient of the
  public split (the component all examples share). Per candidate, so it needs no candidate set, but
  similar examples (same class, untrained model) look alike under it.

Reported next to the metrics: ``accounted_epsilon``, the ε of one released step for one example (each
example is in exactly one batch, and the attacker sees the whole batch: the run's ledger at sample rate 1,
one step, with the run's accountant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import optimize

from dpeval.attacks.base import Scores
from dpeval.attacks.gradient_game import (
    GradientMembershipAttack,
    GradientMembershipParams,
    ReleaseSignals,
)
from dpeval.attacks.registry import ATTACKS
from dpeval.core.params import param

STATISTICS = ("nnls", "cosine")


@dataclass
class GradMiaParams(GradientMembershipParams):
    statistic: str = param("nnls", "`nnls`: fitted contribution of each candidate; `cosine`: cosine with the "
                                   "release after projecting out the public mean gradient", choices=STATISTICS)


def nnls_scores(g: torch.Tensor, release: torch.Tensor) -> np.ndarray:
    """Explain the release jointly: release ≈ Σ_c w_c g_c with w ≥ 0 (non-negative least squares over the
    candidates scored against it). Score = ‖w_c g_c‖, the size of c's fitted contribution: ≈ C/B for a
    clipped member, ≈ 0 for a non-member."""
    a = g.detach().double().cpu().numpy().T  # [P, candidates]
    weights, _ = optimize.nnls(a, release.detach().double().cpu().numpy().ravel(), maxiter=50 * a.shape[1])
    return weights * np.linalg.norm(a, axis=0)


def project_out(v: torch.Tensor, direction: torch.Tensor | None) -> torch.Tensor:
    if direction is None:
        return v
    unit = direction / direction.norm().clamp_min(1e-12)
    return v - (v @ unit.T) * unit


def cosine_scores(g: torch.Tensor, release: torch.Tensor, common: torch.Tensor | None) -> np.ndarray:
    """Cosine similarity of each candidate's gradient with the release after projecting ``common`` — the public
    split's mean gradient, the component every example's gradient shares (large for an untrained model) — out
    of both, keeping what is specific to each example."""
    g, r = project_out(g, common), project_out(release, common)
    return torch.nn.functional.cosine_similarity(g, r.expand_as(g), dim=1).detach().cpu().double().numpy()


@ATTACKS.register("grad-mia", "gradient membership inference: does a candidate's gradient explain the release "
                              "(NNLS fit)")
class GradientMIA(GradientMembershipAttack):
    """Membership inference on released gradients: does a candidate's own gradient explain the shared (clipped,
    noised, sparsified) batch gradient?"""

    Params = GradMiaParams
    headline, higher_leaks, headline_label = "auc", True, "gradient-MIA AUC"

    def guess(self, evidence: ReleaseSignals) -> Scores:
        if self.params.statistic == "nnls":
            return Scores(nnls_scores(evidence.candidates, evidence.release))
        return Scores(cosine_scores(evidence.candidates, evidence.release, evidence.public_mean))

    def title(self) -> str:
        return f"gradient MIA (batch {self.params.batch_size}, at {self.params.at})"
