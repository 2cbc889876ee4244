"""``random-freeze``: DP-SGD with random freeze (the random-freeze paper, Algorithm 1).

Same mechanics as ``rs`` (mask → clip → noise on unfrozen coordinates, no rescaling, public mask, DP-SGD
accounting); the difference is the schedule: r_e = r*·min(e/e*, 1), with e* = ``defense.ramp_epochs``
(default: the number of training epochs, as in the paper's experiments, so r* itself is approached but
reached only if e* < E), and a new random mask every epoch (``defense.refresh`` for more).
"""

from __future__ import annotations

from dataclasses import dataclass

from defenses.masking import MaskedClipParams, MaskedDPSGD
from defenses.registry import DEFENSES
from harness.core.params import param


@dataclass
class RandomFreezeParams(MaskedClipParams):
    ramp_epochs: int | None = param(None, "e* in r*·min(e/e*, 1): epochs to reach the final rate; null = the "
                                          "training epochs", low=1)


@DEFENSES.register("random-freeze", "random freeze: DP-SGD on a public random mask, rate r*·min(e/e*, 1)")
class RandomFreeze(MaskedDPSGD):
    Params = RandomFreezeParams

    def scheduled_rate(self, epoch: int, epochs: int, period: int, periods: int) -> float:
        ramp = self.params.ramp_epochs or epochs
        return self.params.final_rate * min(epoch / ramp, 1.0)
