"""Canary geometry for white-box audits: orthonormal canary directions in the flattened parameter vector.

A canary is a per-sample gradient of norm ``CANARY_NORM`` (far above any clipping norm) along a unit
direction. ``Canaries`` holds ``k`` orthonormal directions of one audited step, dense or as sparse axis
combinations; defenses' audit designs (``dpeval.defenses.auditing``) choose them, the audit driver feeds them
through the defense's real release path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

CANARY_NORM = 1e6  # ‖canary gradient‖: far above any clipping norm


def flatten(tensors: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].reshape(-1) for n in names])


def unflatten_rows(rows: torch.Tensor, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """[b, d] → {name: [b, *shape]} (per-sample gradients as the defense receives them)."""
    out, start = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = rows[:, start:start + n].reshape(rows.shape[0], *shape)
        start += n
    return out


@dataclass
class Canaries:
    """``k`` orthonormal canary directions for one step: dense [k, d] rows, or sparse rows given by flat
    ``coords`` [k, m] and ``values`` [k, m] (axis canaries: cheap for large models). ``parts`` are named
    dense unit components a statistic projects on (GEP: the in-subspace and residual parts); ``carried``
    is a per-canary score about the previous step's canaries seen in this step's public state."""

    d: int
    dense: torch.Tensor | None = None
    coords: torch.Tensor | None = None
    values: torch.Tensor | None = None
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    carried: torch.Tensor | None = None  # a per-canary score carried over from the previous step

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """⟨u_i, x⟩ for every canary: [k]."""
        if self.dense is not None:
            return self.dense @ x
        return (x[self.coords] * self.values).sum(dim=1)

    def energy_in(self, lo: int, hi: int, basis: torch.Tensor) -> torch.Tensor:
        """‖basisᵀ u_i[lo:hi]‖² for every canary (dense canaries only)."""
        return (self.dense[:, lo:hi] @ basis).pow(2).sum(dim=1)

    def gradients(self, included: torch.Tensor, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
        """Per-sample gradients CANARY_NORM·u_i of the included canaries, as the defense receives them."""
        if self.dense is not None:
            rows = CANARY_NORM * self.dense[included]
        else:
            coords, values = self.coords[included], self.values[included]
            rows = torch.zeros(coords.shape[0], self.d, device=values.device)
            rows.scatter_(1, coords, CANARY_NORM * values)
        return unflatten_rows(rows, shapes)


def axis_canaries(coords: torch.Tensor, d: int, device: torch.device) -> Canaries:
    """Canary i = Σ_j e_{coords[i, j]} / √m (m coordinates each; all coordinates distinct)."""
    coords = coords.reshape(coords.shape[0], -1).to(device)
    values = torch.full(coords.shape, 1 / math.sqrt(coords.shape[1]), device=device)
    return Canaries(d, coords=coords, values=values)


def pick(pool: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """``k`` distinct entries of ``pool`` uniformly at random."""
    order = torch.randperm(len(pool), generator=gen)[:k]
    return pool[order.to(pool.device)]
