"""``loss``: the LOSS / threshold attack (Yeom et al. 2018) on the trained victim — no shadow models.

Score = −cross-entropy of the victim on each example (members tend to have lower loss). Members: the
victim's private pool; non-members: the held-out test set (the ``victim`` game of docs/membership.md).
Besides the threshold-free metrics, reports ``yeom_accuracy``: balanced accuracy of Yeom's rule "member
iff loss < the mean training loss".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from attacks.base import Attack, AttackContext, AttackResult
from attacks.membership_common import out_dir
from attacks.membership_metrics import membership_metrics, save_roc
from attacks.registry import ATTACKS
from harness.core.errors import ConfigError


@torch.no_grad()
def losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> np.ndarray:
    """Per-example cross-entropy in float64: in float32 confident examples' losses round to exactly 0,
    and the resulting ties between members and non-members would blunt the attack at low FPR."""
    model.to(device).eval()
    logits = torch.cat([model(x[i:i + 1024].to(device)).cpu() for i in range(0, len(y), 1024)])
    return F.cross_entropy(logits.double(), y, reduction="none").numpy()


@ATTACKS.register("loss", "LOSS: threshold on the victim's per-example loss (Yeom et al.), no shadows")
class LossAttack(Attack):
    headline, higher_leaks, headline_label = "auc", True, "LOSS AUC"
    description = "Membership by low loss on the trained victim (Yeom et al. 2018)."

    @classmethod
    def check_task(cls, params: Any, task: Any) -> None:
        if len(task.test) == 0:
            raise ConfigError("data.test_fraction: the loss attack needs held-out examples (non-members); set "
                              "data.test_fraction > 0")

    def run(self, context: AttackContext) -> AttackResult:
        task = context.task
        self.check_task(self.params, task)
        context.model.load_state_dict(context.states["final"])
        member_loss = losses(context.model, task.train.x, task.train.y, context.device)
        other_loss = losses(context.model, task.test.x, task.test.y, context.device)
        scores = -np.concatenate([member_loss, other_loss])
        labels = np.concatenate([np.ones(len(member_loss), bool), np.zeros(len(other_loss), bool)])
        metrics = membership_metrics(scores, labels, context.accounted.delta,
                                     context.streams.scope("attack", self.name).numpy("threshold"))
        threshold = member_loss.mean()
        metrics["yeom_accuracy"] = float(((member_loss < threshold).mean() + (other_loss >= threshold).mean()) / 2)
        return AttackResult(metrics, save_roc(scores, labels, out_dir(context), "LOSS attack"))
