"""How a defense is audited: the canary design and test statistics of ``dpeval audit`` for its release.

The audit driver (``harness/audit``) knows no defense by name: it asks the defense class for its design
(``Defense.audit_design()``) and feeds the design's canaries through the defense's own
``clip_and_accumulate`` / ``release``. A defense whose release is not a plain Gaussian sum (masks,
projections, whitening) returns a subclass of :class:`CanaryDesign` from its own module.

A design says which canary ``variants`` to test (e.g. canaries in kept and in masked coordinates), how
many orthogonal canaries fit (``capacity``), which directions to use at each audited step (``design``)
and how to score a release (``score``: one or more named statistics per canary, higher = "canary in").
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from dpeval.core.canaries import Canaries, axis_canaries, flatten, pick

Defense = SharedGradient = Any  # dpeval.defenses.base imports this module: the types are named, not imported


class CanaryDesign:
    """Axis canaries and the projection statistic: score = ⟨release, u⟩ / noise_std, summed over steps
    (the likelihood-ratio test for a Gaussian mechanism). A defense that clips several parameter groups
    separately (``Defense.clipping()``, e.g. ``groupwise``) gets canaries spread equally over its groups,
    so that every group is clipped at its full bound (the worst case)."""

    statistics: ClassVar[tuple[str, ...]] = ("projection",)
    fixed_directions: ClassVar[bool] = True  # the same directions at every audited step

    def variants(self, defense: Defense) -> tuple[str, ...]:
        return ("released",)

    def _groups(self, defense: Defense) -> list[torch.Tensor]:
        """Flat coordinate ranges of the clipping groups (one group = all coordinates)."""
        names = list(defense.param_shapes)
        starts = np.cumsum([0] + [math.prod(s) for s in defense.param_shapes.values()])
        where = {n: torch.arange(int(starts[i]), int(starts[i + 1])) for i, n in enumerate(names)}
        clipping = defense.clipping()
        if clipping is None:
            return [torch.arange(int(starts[-1]))]
        return [torch.cat([where[n] for n in group]) for group in clipping.groups]

    def capacity(self, defense: Defense, variant: str) -> int:
        return min(len(g) for g in self._groups(defense))

    def design(self, defense: Defense, variant: str, k: int, gen: torch.Generator,
               previous: Canaries | None) -> Canaries:
        if previous is not None and self.fixed_directions:
            return previous
        coords = torch.stack([pick(g, k, gen) for g in self._groups(defense)], dim=1)
        return axis_canaries(coords, sum(math.prod(s) for s in defense.param_shapes.values()), defense.device)

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        released = flatten(shared.grads, list(defense.param_shapes))
        return {"projection": canaries.project(released) / shared.noise_std}

    def noise_units(self, defense: Defense, shared: SharedGradient) -> torch.Tensor:
        """The release as one flat vector in units of its noise std, with any public per-coordinate shift
        removed: what the whole-run audit (``dpeval audit --scope run``) projects its canaries on. The
        default divides by the release's ``noise_std``; a defense that shifts or scales coordinates by
        public statistics undoes them here."""
        released = flatten(shared.grads, list(defense.param_shapes))
        return released / shared.noise_std if shared.noise_std > 0 else released

    def isotropic(self, defense: Defense, shared: SharedGradient) -> torch.Tensor:
        """The release as one flat vector whose noise is i.i.d. N(0, 1) on every coordinate the mechanism noises
        (zero where nothing is released), public shifts and scales undone: the space in which the informed
        reconstruction attack (``attacks/informed_game.py``) scores candidates by a Gaussian likelihood ratio.
        The default is ``noise_units``; a release made of parts with different noise (GEP's embedding and
        residual) stacks each part over its own std."""
        return self.noise_units(defense, shared)
