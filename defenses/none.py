"""``none``: the non-private baseline — the plain mean of the per-sample gradients (ε = inf)."""

from __future__ import annotations

import torch

from dpeval.defenses.base import Capabilities, Defense, SharedGradient
from dpeval.defenses.lean_plan import LeanPlan
from dpeval.defenses.registry import DEFENSES


@DEFENSES.register("none", "no defense: plain mean gradient, not private (ε = inf)")
class NoDefense(Defense):
    capabilities = Capabilities(accounted=False, lean_capable=True, auditable=False)  # no noise: nothing to audit

    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        for name, g in grads.items():
            self._sum[name] += g.sum(dim=0)
        self.samples_seen += next(iter(grads.values())).shape[0]

    def lean_plan(self) -> LeanPlan:
        """No per-sample statistic: the engine takes the plain gradient of the summed loss."""
        return LeanPlan((tuple(self.param_shapes),), lambda *_: None, per_sample=False)

    # Its own release, not the template's: no noise draw, and the mean over the samples actually seen.
    def release(self, batch_size: int) -> SharedGradient:
        count = max(self.samples_seen, 1)
        shared = SharedGradient({n: s / count for n, s in self._sum.items()}, batch_size=count, noise_std=0.0)
        self.reset()
        return shared
