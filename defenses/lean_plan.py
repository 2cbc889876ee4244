"""What a defense asks of the lean per-sample engine (``harness/engine/lean.py``).

The engine never materialises the per-sample gradients of the whole model. During one backward pass it
computes, per sample i and per parameter group, the statistics a defense's clipping needs, asks the defense
for each group's per-sample factors c_i, and forms Σ_i c_i·g_i per parameter from what each layer kept (a
weighted weight-gradient product: no second backward pass). Every built-in transform fits this form:

- group-wise clipping (``dpsgd``, ``groupwise``): c_i from ‖g_i^(m)‖ per group;
- a public coordinate mask (``rs``, ``random-freeze``): the norm of m ⊙ g_i (``scale`` = m), and the
  defense masks the sum afterwards: Σ c_i (m ⊙ g_i) = m ⊙ Σ c_i g_i;
- coordinate-wise whitening (``adaclip``): the norm of (g_i − a) ⊙ s (``shift`` = a, ``scale`` = 1/b), and
  Σ c_i (g_i − a)/b = (Σ c_i g_i − a·Σ c_i)/b;
- a public subspace (``gep``): per-sample embeddings θ_i = V^T g_i (``probes``), ‖r_i‖² = ‖g_i‖² − ‖θ_i‖²,
  and Σ c_i r_i = Σ c_i g_i − V·Σ c_i θ_i;
- no transform at all (``none``): ``per_sample=False``, the engine only sums.

A plan is built per micro-batch (``Defense.lean_plan()``), so masks, statistics and bases of the current
step are the ones used; the engine hands back a :class:`LeanBatch` to ``Defense.accumulate_lean``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# One probe block: coordinates [lo, hi) of a parameter's flattened gradient, times V [hi - lo, k], added to
# probe columns [col, col + k).
ProbeBlock = tuple[int, int, int, torch.Tensor]


@dataclass
class LeanPlan:
    """The per-sample statistics and factors of one micro-batch (see the module docstring).

    ``groups`` partition the trainable parameters (names as ``model.named_parameters()``); sample i's
    statistic of group m is s_im = ‖(g_i − shift) ⊙ scale‖² over the group's coordinates (``shift`` and
    ``scale`` per parameter, absent = 0 and 1). ``factors(m, s[b], probes[b, k] | None)`` returns c_i of
    group m. ``probes`` (one group only) are linear statistics θ_i = Σ_blocks g_i[lo:hi] @ V.
    ``per_sample=False``: no statistic at all, c_i = 1 (the plain gradient sum); ``sums=False``: only the
    probes are wanted (no Σ c_i g_i)."""

    groups: tuple[tuple[str, ...], ...]
    factors: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor]
    shift: dict[str, torch.Tensor] = field(default_factory=dict)
    scale: dict[str, torch.Tensor] = field(default_factory=dict)
    probes: dict[str, list[ProbeBlock]] = field(default_factory=dict)
    probe_dim: int = 0
    per_sample: bool = True
    sums: bool = True

    def __post_init__(self) -> None:
        names = [n for g in self.groups for n in g]
        if not self.groups or any(not g for g in self.groups) or len(names) != len(set(names)):
            raise ValueError("lean plan: groups must be a partition into non-empty groups")
        if self.probes and len(self.groups) != 1:
            raise ValueError("lean plan: probes need a single group (they span all its parameters)")

    @property
    def names(self) -> list[str]:
        return [n for g in self.groups for n in g]

    def transformed(self, name: str) -> bool:
        """Whether the statistic of ``name`` needs its per-sample gradient (shift, scale or probes)."""
        return name in self.shift or name in self.scale or name in self.probes


@dataclass
class LeanBatch:
    """What the engine returns for one micro-batch of ``count`` samples: ``sums[name]`` = Σ_i c_i g_i with
    each parameter's group factors, ``factors[m]`` = c of group m [b], ``probes`` [b, k] (or None);
    ``loss_sum``: the summed training loss of the micro-batch, as the forward pass computed it."""

    sums: dict[str, torch.Tensor]
    factors: list[torch.Tensor]
    probes: torch.Tensor | None
    count: int
    loss_sum: torch.Tensor | None = None
