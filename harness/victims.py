"""Where a run's victim comes from: the defense class that trains it, its privacy plan and its model.

``runner.prepare`` takes one victim source and asks it, in this order:

- ``model_name(spec)``: the name the run's results give the victim's model;
- ``defense_class(spec)``: the ``Defense`` class training (and the attacks' release path) uses, with
  ``spec.defense``'s parameters; by default the registry's class for ``spec.defense_name``;
- ``plan(spec, defense_cls, n_private)``: the privacy ledger of the releases training will make; by default
  :func:`plan_privacy`;
- ``model(spec, task, privacy, streams)``: the victim model and the builder of fresh models of its architecture
  (shadow models), ``streams`` being the victim's.

``field`` names what a refused model is reported against. Everything else a run does is the same whatever the
source. The sources:

- ``DefenseTrained(defense_cls=None, planner=None)``: the model ``spec.model`` names, built in the victim's init
  stream (after the DP-PCA of its inputs, when it has one), trained by the registry's defense; or by a given class
  (``attack_release``'s function defense, the audits' planted broken defenses) and planned by a given planner (the
  final-model audit's full-batch ledger, the whole-run audit's planted broken ones). The default source.
- ``OutsideModel(model, build)``: a model trained elsewhere and the builder of fresh models of its architecture
  (``score_membership``), planned by the recipe's defense.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpeval.core.accounting import default_delta, noise_for
from dpeval.core.errors import ConfigError
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.models import build_model
from dpeval.core.params import check_noise_scales
from dpeval.core.registry import default_model
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Task
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.base import Defense

Planner = Callable[[RunSpec, type[Defense], int], PrivacyLedger]


def plan_privacy(spec: RunSpec, defense_cls: type[Defense], n_private: int) -> PrivacyLedger:
    """The ledger of the releases training will make: σ given, or calibrated for ``privacy.epsilon`` — after the
    DP-PCA of the inputs, when the model has one (``model.pca``: its σ_p given, or set by its ε share); ConfigError
    when the noise of that σ would overflow float32 (``check_noise_scales``)."""
    p, t, pca = spec.privacy, spec.train, spec.model.pca
    sample_rate = t.batch_size / n_private
    steps = t.epochs * (n_private // t.batch_size)
    delta = p.delta if p.delta is not None else default_delta(n_private)
    if not defense_cls.is_dp(spec.defense):
        return PrivacyLedger(0.0, 0.0, sample_rate, steps, delta, p.accountant, t.sampling)  # an exact PCA, if any
    pca_sigma = 0.0
    if pca.dims > 0:
        if pca.noise_multiplier is not None:
            pca_sigma = pca.noise_multiplier
        elif p.noise_multiplier is not None:
            raise ConfigError("model.pca.noise_multiplier: give the PCA's σ_p too when privacy.noise_multiplier "
                              "gives training's (an ε share needs a target ε)")
        else:
            pca_sigma = noise_for(pca.epsilon_share * p.epsilon, delta, 1.0, 1, p.accountant)
    before = ((pca_sigma, 1.0, 1),) if pca_sigma > 0 else ()
    if p.noise_multiplier is not None:
        sigma = p.noise_multiplier
        accounted = sigma / defense_cls.noise_for_accounted(1.0)
    else:
        accounted = noise_for(p.epsilon, delta, sample_rate, steps, p.accountant, before=before)
        sigma = defense_cls.noise_for_accounted(accounted)
    check_noise_scales(spec.defense, "defense", sigma)
    return PrivacyLedger(sigma, accounted, sample_rate, steps, delta, p.accountant, t.sampling, pca_sigma)


def input_pca(spec: RunSpec, task: Task, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """The DP-PCA projection of the private pool's inputs as the model sees them (normalised), σ_p from the ledger
    (0 for a non-private run: the exact PCA)."""
    from dpeval.core.models import Normalize
    from dpeval.core.pca import dp_pca

    dims, d = spec.model.pca.dims, math.prod(task.shape)
    if task.vocab is not None or dims > d:
        raise ConfigError(f"model.pca.dims: must be at most the {d} input values of image data, got {dims}"
                          if task.vocab is None else "model.pca.dims: token data has no PCA; leave it 0")
    with torch.no_grad():
        inputs = Normalize(task.mean, task.std)(task.train.x)
    return dp_pca(inputs, dims, noise_multiplier, generator)


class VictimSource:
    """Where the victim comes from (module docstring); the defaults are the registry's defense and its plan."""

    field = "model.name"

    def model_name(self, spec: RunSpec) -> str:
        raise NotImplementedError

    def defense_class(self, spec: RunSpec) -> type[Defense]:
        return DEFENSES.get(spec.defense_name, field="defense")

    def plan(self, spec: RunSpec, defense_cls: type[Defense], n_private: int) -> PrivacyLedger:
        return plan_privacy(spec, defense_cls, n_private)

    def model(self, spec: RunSpec, task: Task, privacy: PrivacyLedger,
              streams: Streams) -> tuple[nn.Module, Callable[[], nn.Module]]:
        raise NotImplementedError


@dataclass(frozen=True)
class DefenseTrained(VictimSource):
    """``spec.model``'s model trained by ``defense_cls`` (None: the registry's) under ``planner``'s ledger (None:
    :func:`plan_privacy`)."""

    defense_cls: type[Defense] | None = None
    planner: Planner | None = None

    def model_name(self, spec: RunSpec) -> str:
        return spec.model.name or default_model(spec.data.name)

    def defense_class(self, spec: RunSpec) -> type[Defense]:
        return self.defense_cls or super().defense_class(spec)

    def plan(self, spec: RunSpec, defense_cls: type[Defense], n_private: int) -> PrivacyLedger:
        return (self.planner or plan_privacy)(spec, defense_cls, n_private)

    def model(self, spec: RunSpec, task: Task, privacy: PrivacyLedger,
              streams: Streams) -> tuple[nn.Module, Callable[[], nn.Module]]:
        projection = None
        if spec.model.pca.dims > 0:  # released before training: the attacker (and shadows) have it
            projection = input_pca(spec, task, privacy.pca_noise_multiplier, streams.generator("pca"))
        name = self.model_name(spec)

        def build() -> nn.Module:
            return build_model(name, task.shape, task.num_classes, task.mean, task.std, spec.model, task.vocab,
                               projection)

        with streams.torch_global("init"):
            return build(), build


@dataclass(frozen=True)
class OutsideModel(VictimSource):
    """A victim trained elsewhere and the builder of fresh models of its architecture (``score_membership``)."""

    victim: nn.Module
    build: Callable[[], nn.Module]
    field = "model"

    def model_name(self, spec: RunSpec) -> str:
        return type(self.victim).__name__

    def model(self, spec: RunSpec, task: Task, privacy: PrivacyLedger,
              streams: Streams) -> tuple[nn.Module, Callable[[], nn.Module]]:
        return self.victim, self.build
