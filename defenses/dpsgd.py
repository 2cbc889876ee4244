"""``dpsgd``: DP-SGD (Abadi et al. 2016) with flat clipping.

Release = (Σ_i g_i·min(1, C/‖g_i‖) + N(0, σ²C²·I)) / B, with ‖·‖ over all parameters and B the logical
(expected, under Poisson sampling) batch size. Dividing by the expected rather than the realised batch
size keeps the batch size itself private (Opacus does the same).

Flat clipping is group-wise clipping with one group (``defenses/clipping.py``); ``groupwise`` extends
this class with other groupings and clipping functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpeval.core.params import param
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, DefenseParams
from dpeval.defenses.clipping import GroupClipping
from dpeval.defenses.lean_plan import LeanPlan
from dpeval.defenses.registry import DEFENSES


@dataclass
class ClipParams(DefenseParams):
    clip: float = param(1.0, "per-sample L2 clipping norm C", low=0, low_open=True, noise_scale=True)


@DEFENSES.register("dpsgd", "DP-SGD: flat per-sample clipping to C, Gaussian noise N(0, σ²C²) on the sum")
class DPSGD(Defense):
    Params = ClipParams
    capabilities = Capabilities(lean_capable=True)

    def __init__(self, params: ClipParams, context: DefenseContext) -> None:
        super().__init__(params, context)
        self._clipping = self.make_clipping()
        self._plan = self._clipping.plan()

    def make_clipping(self) -> GroupClipping:
        """Flat clipping: one group of all parameters, ``abadi`` (subclasses choose other groupings)."""
        return GroupClipping.of([list(self.param_shapes)], self.params.clip, "abadi")

    def clipping(self) -> GroupClipping:
        return self._clipping

    def lean_plan(self) -> LeanPlan:
        return self._plan

    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        self.add_to_sum(self._clipping.clip_sum(grads))
        self.samples_seen += next(iter(grads.values())).shape[0]
