"""``rs``: DP-SGD with random sparsification (Zhu & Blaschko, RS paper, Algorithm 1 and Appendix I).

Schedules (``defense.schedule``), with E epochs and final rate r*:
- ``linear`` (the paper's gradual cooling, default): r_e = r*·e/(E−1) — epoch 0 dense, the last epoch r*.
  With E = 1 the single epoch is epoch 0 and dense.
- ``constant``: r = r* throughout (the reconstruction experiment, Section 6.3).
- ``refresh``: the reference code's per-mask ramp with k = ``defense.refresh`` masks per epoch:
  r = min(r*, r*·(e·k + j)/(k·E − 1)) for mask j of epoch e. With k = 1 it equals ``linear``.
``defense.refresh`` draws k masks per epoch under every schedule; only ``refresh`` ramps within an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpeval.core.params import param
from dpeval.defenses.masking import MaskedClipParams, MaskedDPSGD
from dpeval.defenses.registry import DEFENSES

SCHEDULES = ("linear", "constant", "refresh")
MASKS = ("random", "ranked")


@dataclass
class RSParams(MaskedClipParams):
    schedule: str = param("linear", "`linear`: r*·e/(E−1) (gradual cooling); `constant`: r*; `refresh`: the "
                                    "per-mask ramp", choices=SCHEDULES)
    mask: str = param("random", "`random`; `ranked`: the paper's Appendix Algorithm 4", choices=MASKS)


@DEFENSES.register("rs", "random sparsification: DP-SGD on a public random mask, gradual cooling to final_rate")
class RandomSparsification(MaskedDPSGD):
    Params = RSParams

    def ranked(self) -> bool:
        return self.params.mask == "ranked"

    def scheduled_rate(self, epoch: int, epochs: int, period: int, periods: int) -> float:
        r = self.params.final_rate
        if self.params.schedule == "constant":
            return r
        if self.params.schedule == "refresh":
            total = periods * epochs - 1
            return min(r, r * (epoch * periods + period) / total) if total > 0 else 0.0
        return r * epoch / (epochs - 1) if epochs > 1 else 0.0
