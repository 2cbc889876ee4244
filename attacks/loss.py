"""``loss``: the LOSS / threshold attack (Yeom et al. 2018) on the trained victim — no shadow models.

Score = −cross-entropy of the victim on each example (members tend to have lower loss). Members: the
victim's private pool; non-members: the held-out test set (the ``victim`` game of docs/membership.md,
played by ``dpeval.attacks.membership_game.VictimMembershipAttack``). Besides the threshold-free metrics,
reports ``yeom_accuracy``: balanced accuracy of Yeom's rule "member iff loss < the mean training loss".
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from dpeval.attacks.base import Scores
from dpeval.attacks.membership_game import VictimMembershipAttack, VictimOutputs
from dpeval.attacks.registry import ATTACKS


def losses(outputs: VictimOutputs) -> np.ndarray:
    """Per-example cross-entropy in float64: in float32 confident examples' losses round to exactly 0,
    and the resulting ties between members and non-members would blunt the attack at low FPR."""
    return F.cross_entropy(outputs.logits.double(), outputs.labels, reduction="none").numpy()


@ATTACKS.register("loss", "LOSS: threshold on the victim's per-example loss (Yeom et al.), no shadows")
class LossAttack(VictimMembershipAttack):
    """Membership by low loss on the trained victim (Yeom et al. 2018)."""

    headline, higher_leaks, headline_label = "auc", True, "LOSS AUC"
    yeom_rule = True

    def guess(self, evidence: VictimOutputs) -> Scores:
        return Scores(-losses(evidence))

    def title(self) -> str:
        return "LOSS attack"
