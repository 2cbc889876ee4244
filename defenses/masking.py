"""Shared mechanics of random sparsification (RS) and random freeze: DP-SGD on a random coordinate mask.

Per step (RS paper, Algorithm 1; random freeze, Algorithm 1):
  mask each per-sample gradient → clip the masked vector to C (norm over kept coordinates) → sum
  → add N(0, σ²C²) noise on kept coordinates only → divide by the logical batch size B.
Masked coordinates of the release are exactly zero; there is no 1/(1−r) rescaling.

The mask is one global mask over the flattened parameter vector (in ``named_parameters`` order) with
exactly ⌊r·d⌋ zeroed coordinates, drawn uniformly without replacement. It is data-independent and public
(it travels in ``SharedGradient.mask``), so σ and the accounting are those of plain DP-SGD (RS paper,
Theorem 3.1). Subclasses only say what rate applies when (``scheduled_rate``).

Choices where the papers are silent (tested, documented in docs/sparsification.md):
- Masks come from their own random stream (``mask``), independent of the noise stream, and the noise is drawn
  over all d coordinates and then masked (as the reference code does). Hence r = 0 reproduces ``dpsgd``
  bit for bit, and changing r never changes which noise a kept coordinate gets.
- ``refresh: k`` draws k masks per epoch, at steps ⌊j·S/k⌋ (S = steps per epoch, j = 0..k−1).
- ``mask: ranked`` (RS paper, Appendix Algorithm 4): from the second mask on, zero the ⌊r·d⌋ coordinates
  with the smallest |z|, where z accumulates the released gradients since the previous mask plus, on
  masked coordinates, the unreleased part of the same full-size noise draw divided by B (so they can
  re-enter the ranking). The first mask of training is all ones (Alg. 4), also under the constant
  schedule, and reports rate 0: ``rate`` is always the fraction the mask in force actually zeroes.
  Ranking uses only released values and data-independent noise: post-processing, no privacy cost.
- Non-DP modes (``noise_std`` given; reported with ε = inf): Gaussian noise of the fixed std ``noise_std`` on
  each kept coordinate of the released *average* instead of σ·C/B. With ``clip: null`` there is no clipping:
  the RS paper's reconstruction setting (Section 6.3, Fig. 5) and its noisy SGD with RS (Appendix E,
  Algorithm 2, whose N(0, σ²I) on the sum is ``noise_std = σ/B``). With a clip C and ``noise_std: 0``: its
  clipped SGD with RS (Algorithm 3). The two ablations of Section 6.1 (Fig. 3) that show RS's trade-off is
  particular to DP-SGD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dpeval.core.canaries import Canaries, axis_canaries, pick
from dpeval.core.errors import ConfigError
from dpeval.core.params import param
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, DefenseParams, SharedGradient
from dpeval.defenses.clipping import clip_factors, per_sample_norms
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan


@dataclass
class MaskedClipParams(DefenseParams):
    clip: float | None = param(1.0, "per-sample clipping norm C of the masked gradient; null = no clipping "
                                    "(the non-DP attack setting, ε = inf)", low=0, low_open=True,
                                noise_scale=True)
    final_rate: float = param(0.9, "r*: the fraction of coordinates zeroed at the end of the schedule",
                              low=0, high=1, high_open=True)
    refresh: int = param(1, "masks drawn per epoch", low=1)
    noise_std: float | None = param(None, "non-DP (ε = inf): fixed noise std on each kept coordinate of the "
                                          "released average instead of σ·C/B; with `clip: null` noisy SGD, with "
                                          "a clip and 0 clipped SGD (the RS paper's Algorithms 2 and 3)", low=0)

    def validate(self) -> None:
        if self.clip is None and self.noise_std is None:
            raise ConfigError("defense.noise_std: required when defense.clip is null (the non-DP settings: "
                              "fixed-std noise, no clipping); use 0 for no noise")


class MaskedDPSGD(Defense):
    """DP-SGD on a public random mask; subclasses define the rate schedule."""

    Params = MaskedClipParams
    capabilities = Capabilities(lean_capable=True, stateful=True)  # a mask (and a ranking sum) per period

    @classmethod
    def is_dp(cls, params: Any) -> bool:
        return params.clip is not None and params.noise_std is None

    def __init__(self, params: MaskedClipParams, context: DefenseContext) -> None:
        super().__init__(params, context)
        self.d = sum(math.prod(s) for s in self.param_shapes.values())
        self.mask_generator = self.streams.generator("mask")
        self.keep = torch.ones(self.d, dtype=torch.bool)  # flat; True = released
        self.rate = 0.0
        self.epoch, self.epochs, self.period = 0, 1, 0
        self.step_in_epoch = 0
        self.mask_is_new = True
        self.ranking_sum: torch.Tensor | None = None  # z of Algorithm 4 (ranked masks only)
        self.masks_drawn = 0

    # -- schedule -------------------------------------------------------------------------------------------
    def scheduled_rate(self, epoch: int, epochs: int, period: int, periods: int) -> float:
        """The sparsification rate of mask ``period`` (of ``periods`` per epoch) in ``epoch`` of ``epochs``."""
        raise NotImplementedError

    def ranked(self) -> bool:
        return False

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        self.epoch, self.epochs, self.step_in_epoch = epoch, epochs, 0
        self._new_mask(period=0)

    def _new_mask(self, period: int) -> None:
        self.period = period
        self.rate = self.rate_now()
        zeroed = math.floor(self.rate * self.d)
        keep = torch.ones(self.d, dtype=torch.bool)
        if self.ranked() and self.ranking_sum is not None:
            order = torch.argsort(self.ranking_sum.abs().cpu(), stable=True)  # ascending |z|
            keep[order[:zeroed]] = False
        elif self.ranked() and self.masks_drawn == 0:
            self.rate = 0.0  # Algorithm 4: the first mask is all ones, whatever the schedule says
        else:
            keep[torch.randperm(self.d, generator=self.mask_generator)[:zeroed]] = False
        if self.ranked():
            self.ranking_sum = torch.zeros(self.d, device=self.device)
        self.keep = keep
        self.mask_is_new = True
        self.masks_drawn += 1

    @property
    def keep(self) -> torch.Tensor:
        """The mask in force: flat bool over the parameter vector, True = released."""
        return self._keep

    @keep.setter
    def keep(self, keep: torch.Tensor) -> None:
        """Setting the mask also makes its per-parameter views, once per mask rather than once per step: what
        ``release_mask`` hands out (from a private copy, never changed in place, so every release under this mask
        shares the same tensors and the release's 0/1 weights, ``_keep_weights``, are converted once per mask)."""
        self._keep = keep.to(self.device, copy=True)
        self._keep_views = self._views(self._keep)

    def _keep_weights(self) -> dict[str, torch.Tensor]:
        """The mask in force as 0/1 float weights per parameter: the release's own, made once per mask
        (``Defense._mask_weights``), also serve the lean engine's ``scale`` and the masking of its sums."""
        return dict(zip(self._sum, self._mask_weights(self._keep_views)))

    def rate_now(self) -> float:
        return self.scheduled_rate(self.epoch, self.epochs, self.period, self.params.refresh)

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for name, shape in self.param_shapes.items():
            n = math.prod(shape)
            out[name] = flat[start:start + n].view(shape)
            start += n
        return out

    # -- the lean engine: norms of m ⊙ g_i, and Σ c_i (m ⊙ g_i) = m ⊙ Σ c_i g_i ----------------------------
    def lean_plan(self) -> LeanPlan:
        names = (tuple(self.param_shapes),)
        if self.params.clip is None:  # no clipping: the plain sum, masked afterwards
            return LeanPlan(names, lambda *_: None, per_sample=False)
        return LeanPlan(names, lambda group, squares, probes: clip_factors(squares.sqrt(), self.params.clip),
                        scale=self._keep_weights())

    def accumulate_lean(self, batch: LeanBatch) -> None:
        names = list(batch.sums)  # m ⊙ Σ c_i g_i for every parameter at once (two operators)
        weights = self._keep_weights()
        masked = torch._foreach_mul([batch.sums[n] for n in names], [weights[n] for n in names])
        self.add_to_sum(dict(zip(names, masked)))
        self.samples_seen += batch.count

    # -- the release ----------------------------------------------------------------------------------------
    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        keep = self._keep_views
        masked = {n: g * keep[n] for n, g in grads.items()}  # 1) mask first
        batch = next(iter(grads.values())).shape[0]
        if self.params.clip is None:
            factors = torch.ones(batch, device=self.device)
        else:
            factors = clip_factors(per_sample_norms(masked), self.params.clip)  # 2) clip the masked vector
        for name, g in masked.items():
            self._sum[name] += torch.einsum("b,b...->...", factors, g)
        self.samples_seen += batch

    def sum_noise_std(self, batch_size: int) -> float:
        if self.params.noise_std is not None:
            return self.params.noise_std * batch_size  # noise_std is meant on the released average
        return super().sum_noise_std(batch_size)

    def release_mask(self) -> dict[str, torch.Tensor]:
        return dict(self._keep_views)  # 3) noise on kept coordinates only (the mask's own copy: read-only)

    def on_release(self, shared: SharedGradient, unreleased_noise: dict[str, torch.Tensor]) -> None:
        shared.extra = {"epoch": self.epoch, "period": self.period}
        shared.rate, shared.mask_is_new = self.rate, self.mask_is_new
        if self.ranking_sum is not None:
            # z += released gradient + (1/B)(1−m)⊙noise: masked coordinates get data-independent noise.
            flat_release = torch.cat([shared.grads[n].reshape(-1) for n in self.param_shapes])
            flat_noise = torch.cat([unreleased_noise[n].reshape(-1) for n in self.param_shapes])
            self.ranking_sum += flat_release + flat_noise
        self.mask_is_new = False
        self._advance_step()

    def _advance_step(self) -> None:
        self.step_in_epoch += 1
        k, steps = self.params.refresh, max(self.steps_per_epoch, 1)
        period = min(k - 1, self.step_in_epoch * k // steps)
        if period != self.period and self.step_in_epoch < steps:
            self._new_mask(period)

    @classmethod
    def audit_design(cls) -> CanaryDesign:
        return MaskedDesign()

    # -- public state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"keep": self.keep.cpu().clone(), "rate": self.rate, "epoch": self.epoch, "period": self.period,
                 "masks_drawn": self.masks_drawn, "mask_generator": self.mask_generator.get_state()}
        if self.ranking_sum is not None:
            state["ranking_sum"] = self.ranking_sum.cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.keep = state["keep"]
        self.rate, self.epoch, self.period = state["rate"], state["epoch"], state["period"]
        self.masks_drawn = state["masks_drawn"]
        self.mask_generator.set_state(state["mask_generator"])
        self.ranking_sum = state["ranking_sum"].to(self.device) if "ranking_sum" in state else None
        self.mask_is_new = True


class MaskedDesign(CanaryDesign):
    """RS / random freeze: at each step, axis canaries on coordinates the step's public mask keeps
    (``kept``) or zeroes (``masked``). ``projection`` as for DP-SGD; ``mask``: how many of a canary's
    coordinates of earlier steps the next step's public mask keeps (a data-dependent mask shows the canary
    there; a ranked mask from noisy releases is post-processing, a random one carries nothing)."""

    statistics = ("projection", "mask")
    fixed_directions = False

    def variants(self, defense: Defense) -> tuple[str, ...]:
        return ("kept", "masked")

    def _pool(self, defense: Defense, variant: str) -> torch.Tensor:
        keep = defense.state_dict()["keep"]  # public, data-independent (or from noisy releases: ranked)
        return torch.nonzero(keep if variant == "kept" else ~keep).flatten()

    def capacity(self, defense: Defense, variant: str) -> int:
        return len(self._pool(defense, variant))

    def design(self, defense: Defense, variant: str, k: int, gen: torch.Generator,
               previous: Canaries | None) -> Canaries:
        canaries = axis_canaries(pick(self._pool(defense, variant), k, gen), defense.d, defense.device)
        if previous is not None:
            keep = defense.state_dict()["keep"].to(previous.coords.device)
            canaries.carried = keep[previous.coords].float().sum(dim=1)
        return canaries

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        scores = super().score(defense, shared, canaries)
        carried = canaries.carried
        scores["mask"] = carried if carried is not None else torch.zeros_like(scores["projection"])
        return scores
