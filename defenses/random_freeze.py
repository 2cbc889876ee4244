"""``random-freeze``: DP-SGD with random freeze (the random-freeze paper, Algorithm 1).

Same mechanics as ``rs`` (mask → clip → noise on unfrozen coordinates, no rescaling, public mask, DP-SGD
accounting); the difference is the schedule ("gradual cooling"), a linear ramp from r = 0 in epoch 0 to r*
in epoch e*−1 (the e*-th epoch), then r* to the end:

    r_e = r*·min(e/(e*−1), 1),   e* = ``defense.ramp_epochs`` (default: the training epochs E)

so with the default e* = E the last epoch runs at r*. With e* = 1 there is no ramp: r* from epoch 0. A new
random mask is drawn every epoch (``defense.refresh`` for more).

Why e/(e*−1) and not r*·min(e/e*, 1): the paper's formula is garbled in the text, and its total-density
tables decide between the two (docs/sparsification.md): e/(e*−1) reproduces every tabulated density
(0.65, 0.70, 0.80, 0.65; 0.60 and 0.58 with the extended runs), e/e* misses three of them and never
reaches r* with e* = E (0.8775 for r* = 0.9, E = 40).
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeval.core.params import param
from dpeval.defenses.masking import MaskedClipParams, MaskedDPSGD
from dpeval.defenses.registry import DEFENSES


@dataclass
class RandomFreezeParams(MaskedClipParams):
    ramp_epochs: int | None = param(None, "e* in r*·min(e/(e*−1), 1): epoch e*−1 (the e*-th) is the first at the "
                                          "final rate; null = the training epochs (r* in the last epoch)", low=1)


@DEFENSES.register("random-freeze", "random freeze: DP-SGD on a public random mask, rate r*·min(e/(e*−1), 1)")
class RandomFreeze(MaskedDPSGD):
    Params = RandomFreezeParams

    def scheduled_rate(self, epoch: int, epochs: int, period: int, periods: int) -> float:
        ramp = self.params.ramp_epochs or epochs
        if ramp <= 1:
            return self.params.final_rate
        return self.params.final_rate * min(epoch / (ramp - 1), 1.0)
