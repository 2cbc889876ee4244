"""``adaclip``: AdaCliP (Pichapati, Suresh, Yu, Reddi, Kumar 2019), Algorithm 1 with the §4.1 transform.

One logical step with public statistics a = m (mean estimate) and b (scale), flattened over all d params:

1. per example: w_k = (g_k − a)/b (element-wise), clipped to ‖w_k‖ ≤ C (C = ``clip``, 1 in the paper);
2. sum, add Gaussian noise N(0, σ²C²·I) ONCE to the sum in w-space, divide by the logical batch size B;
3. map back: g̃ = b ⊙ w̄ + a. Sensitivity in w-space is C whatever a and b are (they depend only on
   earlier releases), so the step is DP-SGD's sampled Gaussian mechanism with multiplier σ: same
   accounting as ``dpsgd``. a = 0, b = 1 is DP-SGD with clip C bit for bit (and a = 0, b = C·1 with
   C = 1 is DP-SGD with clip C up to float rounding).
4. statistics from the noisy release only (post-processing, no privacy cost), with a^t = m^t and b^t the
   values used in this step:
       v     = clamp(B·[(g̃ − m)² − b²σ²C²/B²], h1, h2)          (per-example variance estimate)
       m    ← β1·m + (1 − β1)·g̃                                    (eq. 4)
       s²   ← β2·s² + (1 − β2)·v                                   (eq. 5)
       b_i   = √s_i · √(Σ_j s_j),  s = √(s²)                        (Theorem 1 with γ = 1, Algorithm 1 l.6)

Why noise once on the sum: Algorithm 1 adds N(0, σ²I) to every example and averages, which puts σb/√B
of noise on the mean — √B times the σb/B of noise on the sum that the accountant's σ pays for (the paper
calls the two "essentially equivalent"; they are not for B > 1). The correction term: g̃_i − m_i =
(ḡ_i − m_i) + b_i·N_i/B without clipping, so E(g̃_i − m_i)² = s_i²/B + (μ_i − m_i)² + b_i²σ²C²/B²; the
paper's eq. (5) subtracts b_i²σ² (its per-example noise with B = 1). We subtract the noise on the mean,
b_i²σ²C²/B², and multiply by B to estimate the per-example variance s_i² that Theorem 1's b is built
from (``variance: batch_mean`` skips the ×B). Derivations and the saturation caveat (when noise dominates
the estimate sits at h2 on ≈32% of steps and b becomes nearly uniform) are in docs/gep-adaclip.md.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from dpeval.core.canaries import Canaries, flatten
from dpeval.core.errors import ConfigError
from dpeval.core.params import check_float32, param
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, DefenseParams, SharedGradient
from dpeval.defenses.clipping import clip_factors, per_sample_norms
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan
from dpeval.defenses.registry import DEFENSES

log = logging.getLogger("dpeval")

VARIANCE_CHOICES = ("per_example", "batch_mean")


@dataclass
class AdaCliPParams(DefenseParams):
    clip: float = param(1.0, "C: clipping norm in the transformed space w = (g − a)/b (paper: 1)",
                        low=0, low_open=True, noise_scale=True)
    beta1: float = param(0.99, "EMA decay of the mean estimate m (paper: 0.99)", low=0, high=1, high_open=True)
    beta2: float = param(0.9, "EMA decay of the variance estimate s² (paper: 0.9)", low=0, high=1,
                         high_open=True)
    h1: float = param(1e-12, "lower clamp of the per-step variance estimate v (paper: 1e-12)", low=0,
                      low_open=True)
    h2: float = param(1e-4, "upper clamp of v (> h1): the paper's only tuned knob; sets the scale of b",
                      low=0, low_open=True)
    variance: str = param("per_example", "`per_example`: v estimates Var(g_k) (×B); `batch_mean`: the "
                                         "variance of the batch mean", choices=VARIANCE_CHOICES)

    def validate(self) -> None:
        if not self.h1 < self.h2:
            raise ConfigError(f"defense.h2: must be > defense.h1 ({self.h1}), got {self.h2}")
        check_float32("defense.h2", self.h1 * self.h2, "h1·h2, the variance state's start,")


def optimal_scale(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Theorem 1 (γ = 1): b_i = √s_i·√(Σ_j s_j) over ALL coordinates, s a per-coordinate std.

    It minimises the noise energy σ²‖b‖² subject to E‖w‖² = Σ s_i²/b_i² ≤ 1 (with a = E g); the minimum
    is σ²(Σ s_i)², against σ²·d·Σ s_i² for whitening (b_i = √d·s_i)."""
    total = torch.stack([v.sum(dtype=torch.float64) for v in s.values()]).sum()  # on the device: no host sync
    return dict(zip(s, torch._foreach_sqrt(torch._foreach_mul(list(s.values()), total))))


@DEFENSES.register("adaclip", "AdaCliP: per-coordinate shift/scale (public noisy statistics), clip, noise in w-space")
class AdaCliP(Defense):
    Params = AdaCliPParams
    capabilities = Capabilities(lean_capable=True, stateful=True)  # the running moments m, s² and the scale b

    def __init__(self, params: AdaCliPParams, context: DefenseContext) -> None:
        super().__init__(params, context)
        self.d = sum(math.prod(s) for s in self.param_shapes.values())
        # Algorithm 1, line 2: m⁰ = 0, s⁰ = √(h1·h2) (a std, so the state s² starts at h1·h2).
        self.m = {n: torch.zeros(s, device=self.device) for n, s in self.param_shapes.items()}
        self.s2 = {n: torch.full(s, params.h1 * params.h2, device=self.device) for n, s in self.param_shapes.items()}
        self.b = optimal_scale(self.std())
        self.steps = 0
        self.at_h1 = 0   # coordinates whose last v hit the lower clamp h1
        self.at_h2 = 0   # ... the upper clamp h2

    def std(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.s2, torch._foreach_sqrt(list(self.s2.values()))))

    # -- the three stages ----------------------------------------------------------------------------
    def begin_epoch(self, epoch: int, epochs: int) -> None:
        if self.steps:
            log.info("adaclip: %d of %d coordinates at h1, %d at h2 (last update); ‖b‖ = %.4g",
                     self.at_h1, self.d, self.at_h2, self.scale_norm())

    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        w = {n: (g - self.m[n]) / self.b[n] for n, g in grads.items()}
        factors = clip_factors(per_sample_norms(w), self.params.clip)
        for name, wn in w.items():
            self._sum[name] += torch.einsum("b,b...->...", factors, wn)
        self.samples_seen += factors.shape[0]

    def lean_plan(self) -> LeanPlan:
        """Norms of w_i = (g_i − a)/b per sample; the engine's Σ c_i g_i becomes Σ c_i w_i in
        ``accumulate_lean`` (an affine map)."""
        scale = dict(zip(self.b, torch._foreach_reciprocal(list(self.b.values()))))
        return LeanPlan((tuple(self.param_shapes),),
                        lambda group, squares, probes: clip_factors(squares.sqrt(), self.params.clip),
                        shift=self.m, scale=scale)

    def accumulate_lean(self, batch: LeanBatch) -> None:
        total = batch.factors[0].sum()  # Σ_i (c_i g_i − c_i a)/b = (Σ c_i g_i − a·Σ c_i)/b, all parameters at once
        names = list(batch.sums)
        w = torch._foreach_sub([batch.sums[n] for n in names], torch._foreach_mul([self.m[n] for n in names], total))
        torch._foreach_div_(w, [self.b[n] for n in names])
        self.add_to_sum(dict(zip(names, w)))
        self.samples_seen += batch.count

    # -- the release: noise N(0, σ²C²) on the sum in w-space, divided by B, then mapped back ---------------
    def transform(self, average: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        names = list(average)  # g̃ = b ⊙ w̄ + a
        g = torch._foreach_mul([self.b[n] for n in names], [average[n] for n in names])
        torch._foreach_add_(g, [self.m[n] for n in names])
        return dict(zip(names, g))

    def on_release(self, shared: SharedGradient, unreleased_noise: dict[str, torch.Tensor] | None) -> None:
        batch_size = shared.batch_size
        std = self.sum_noise_std(batch_size)  # in w-space
        a, b = self.m, self.b
        self.update_statistics(shared.grads, batch_size)
        shared.extra = {
            "adaclip.a": a,                      # the shift and scale this release used (public)
            "adaclip.b": b,
            "adaclip.noise_std": dict(zip(shared.grads, torch._foreach_mul([b[n] for n in shared.grads],
                                                                            std / batch_size))),  # per coordinate
            "adaclip.at_h1": self.at_h1,
            "adaclip.at_h2": self.at_h2,
            "adaclip.frac_at_h2": self.at_h2 / self.d,
        }
        shared.noise_std = std * self.scale_norm(b) / (batch_size * math.sqrt(self.d))  # RMS in gradient space

    def update_statistics(self, released: dict[str, torch.Tensor], batch_size: int) -> None:
        """Eqs. (4)–(5) from the released g̃ only. The m and b used for this release are replaced by new
        tensors (never modified in place), so the release's ``extra`` keeps the values it used."""
        p = self.params
        names = list(released)  # every parameter at once (``foreach`` operators: the same roundings as one by one)
        raw = self.raw_variance(released, batch_size)
        flat = torch.cat([raw[n].reshape(-1) for n in names])
        clamped = torch.stack([(flat <= p.h1).sum(), (flat >= p.h2).sum()])
        v = torch._foreach_clamp_max(torch._foreach_clamp_min([raw[n] for n in names], p.h1), p.h2)
        m = torch._foreach_mul([self.m[n] for n in names], p.beta1)
        torch._foreach_add_(m, torch._foreach_mul([released[n] for n in names], 1 - p.beta1))
        s2 = torch._foreach_mul([self.s2[n] for n in names], p.beta2)
        torch._foreach_add_(s2, torch._foreach_mul(v, 1 - p.beta2))
        self.m, self.s2 = dict(zip(names, m)), dict(zip(names, s2))
        self.b = optimal_scale(self.std())
        self.at_h1, self.at_h2 = clamped.tolist()  # one host sync for both counts
        self.steps += 1

    def raw_variance(self, released: dict[str, torch.Tensor], batch_size: int) -> dict[str, torch.Tensor]:
        """The unclamped per-step variance estimate from a release made with the current m and b:
        B·[(g̃ − m)² − b²σ²C²/B²] (``per_example``, unbiased for Var(g_k) without clipping when m = E g)
        or without the factor B (``batch_mean``, unbiased for the variance of the batch mean)."""
        noise_var = (self.noise_multiplier * self.params.clip / batch_size) ** 2
        scale = batch_size if self.params.variance == "per_example" else 1
        names = list(released)
        centred = torch._foreach_sub([released[n] for n in names], [self.m[n] for n in names])
        torch._foreach_mul_(centred, centred)
        noise = torch._foreach_mul([self.b[n] for n in names], [self.b[n] for n in names])
        torch._foreach_mul_(noise, noise_var)
        torch._foreach_sub_(centred, noise)
        torch._foreach_mul_(centred, scale)
        return dict(zip(names, centred))

    def scale_norm(self, b: dict[str, torch.Tensor] | None = None) -> float:
        b = self.b if b is None else b
        return float(torch.stack([v.sum(dtype=torch.float64) for v in torch._foreach_pow(list(b.values()), 2)])
                     .sum().sqrt())

    @classmethod
    def audit_design(cls) -> CanaryDesign:
        return AdaCliPDesign()

    # -- public state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """m, s², b (all computed from noisy releases only) and the clamp counts: public."""
        return {
            "m": {n: v.clone() for n, v in self.m.items()},
            "s2": {n: v.clone() for n, v in self.s2.items()},
            "b": {n: v.clone() for n, v in self.b.items()},
            "steps": self.steps,
            "at_h1": self.at_h1,
            "at_h2": self.at_h2,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore statistics. ``b`` given explicitly overrides Theorem 1's b(s) until the next update
        (lets attacks replay a saved step, and tests pin a = 0, b = 1 to compare with DP-SGD)."""
        if "m" in state:
            self.m = {n: state["m"][n].to(self.device).clone() for n in self.param_shapes}
        if "s2" in state:
            self.s2 = {n: state["s2"][n].to(self.device).clone() for n in self.param_shapes}
        self.b = optimal_scale(self.std())
        if "b" in state:
            self.b = {n: state["b"][n].to(self.device).clone() for n in self.param_shapes}
        self.steps = int(state.get("steps", self.steps))
        self.at_h1 = int(state.get("at_h1", self.at_h1))
        self.at_h2 = int(state.get("at_h2", self.at_h2))


class AdaCliPDesign(CanaryDesign):
    """AdaCliP: axis canaries (in w = (g − a)/b space an axis gradient stays on its axis); projection of
    the whitened release (g̃ − a)/noise_std per coordinate, with a and the per-coordinate noise std from
    the release's public metadata; ``state``: the same projection of the statistics m the defense
    updated from this release (public; noise-free if the update ever sees the clean gradient)."""

    statistics = ("projection", "state")

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        names = list(defense.param_shapes)
        std = flatten(shared.extra["adaclip.noise_std"], names)
        whitened = (flatten(shared.grads, names) - flatten(shared.extra["adaclip.a"], names)) / std
        state = flatten(defense.state_dict()["m"], names) / std
        return {"projection": canaries.project(whitened), "state": canaries.project(state)}

    def noise_units(self, defense: Defense, shared: SharedGradient) -> torch.Tensor:
        """(g̃ − a)/noise_std per coordinate: the release with its public shift and scale undone."""
        names = list(defense.param_shapes)
        return ((flatten(shared.grads, names) - flatten(shared.extra["adaclip.a"], names))
                / flatten(shared.extra["adaclip.noise_std"], names))
