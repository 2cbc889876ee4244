"""Releases between the defense and the model: applying one to the model, and observing one for chosen
examples (the victim side of a gradient attack: ``ReleaseOracle``).

Both go through the defense's own stages, so what an optimizer steps on and what an attacker observes is
exactly what the defense releases.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpeval.core.per_sample import PerSampleGradients, micro_batches
from dpeval.core.states import AttackState
from dpeval.core.streams import Streams
from dpeval.defenses.base import Defense, SharedGradient


def apply_release(params: dict[str, nn.Parameter], shared: SharedGradient) -> None:
    """Make the released gradient the ``.grad`` of each parameter (the optimizer steps on it alone)."""
    for name, value in shared.grads.items():
        params[name].grad = value.to(params[name].dtype)


def step_on_release(model: nn.Module, optimizer: torch.optim.Optimizer, shared: SharedGradient) -> None:
    """One optimizer step of ``model`` on a release (post-processing of the release)."""
    apply_release(dict(model.named_parameters()), shared)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def observe_release(defense: Defense, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    physical_batch_size: int, precision: str = "fp32") -> SharedGradient:
    """The release of one logical step whose batch is exactly (x, y), through the defense's
    ``clip_and_accumulate`` (materialised per-sample gradients, the reference engine, at training's
    ``precision``) and ``release``. The caller has put the defense in the state to observe (``begin_epoch``,
    ``load_state_dict``)."""
    psg = PerSampleGradients(model, precision=precision)
    device = next(model.parameters()).device
    for xb, yb in micro_batches(x.to(device), y.to(device), max(int(physical_batch_size), 1)):
        defense.clip_and_accumulate(psg(xb, yb))
    return defense.release(x.shape[0])


def defense_name(defense: Defense) -> str:
    """The registered name of ``defense``'s class (its class name when it has none)."""
    return type(defense).name or type(defense).__name__


@dataclass(frozen=True)
class ReleaseOracle:
    """What the defense releases for a chosen batch at a recorded state, as training would have released it.

    ``oracle(model, x, y, at, streams)``: a fresh defense drawing from ``streams`` (several releases in one
    attack pass independent streams), bound to ``model`` (the weights of state ``at``: a defense that reads
    the model, GEP's anchors, sees what training saw then), put in the state of ``at`` — ``begin_epoch`` and
    then the public state training recorded then — observes the batch through its own stages. Returns the
    release and a report of the state used (state, epoch, density, noise_std, defense_rate). A release that is NaN or
    infinite anywhere raises ``NonFiniteRelease``: an attack never scores one."""

    make_defense: Callable[..., Defense]       # make_defense(streams, bound_to): as configured in training
    defense_states: Mapping[str, dict[str, Any]]
    epochs: int
    physical_batch_size: int
    precision: str = "fp32"                    # train.precision: the release is computed as training computed it
    module_mode: str = "eval"                  # train.module_mode: likewise (a victim model's own dropout)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, at: str,
                 streams: Streams) -> tuple[SharedGradient, dict[str, Any]]:
        defense = self.defense_at(model, at, streams)
        # The victim computes in its training mode: with dropout, each example draws a fresh mask, from the
        # release's own stream (reproducible); the attacker is not told the masks (docs/api.md, "Dropout").
        was = model.training
        model.train(self.module_mode == "train")
        try:
            with streams.torch_global("dropout"):
                shared = observe_release(defense, model, x, y, self.physical_batch_size, self.precision)
        finally:
            model.train(was)
        return shared.require_finite(defense_name(defense)), self.report(at, shared)

    def defense_at(self, model: nn.Module, at: str, streams: Streams) -> Defense:
        """A fresh defense drawing from ``streams``, bound to ``model``, in the state training recorded at ``at``."""
        defense = self.make_defense(streams, bound_to=model)
        defense.begin_epoch(AttackState(at).defense_epoch(self.epochs), self.epochs)
        public_state = self.defense_states.get(at)
        if public_state:
            defense.load_state_dict(copy.deepcopy(public_state))
        return defense

    def release_gradients(self, model: nn.Module, grads: dict[str, torch.Tensor], at: str, streams: Streams,
                          batch_size: int) -> tuple[SharedGradient, dict[str, Any]]:
        """The release of a logical step of B = ``batch_size`` whose examples' per-sample gradients (computed by the
        caller with ``PerSampleGradients`` at the weights of ``at``, as ``observe_release`` computes them) are
        ``grads`` (``{name: [b, *shape]}``; b = 0: a step that holds none of them releases noise alone), through
        the same defense stages as ``__call__``: for a game that releases the same examples many times."""
        defense = self.defense_at(model, at, streams)
        if next(iter(grads.values())).shape[0]:
            defense.clip_and_accumulate(grads)
        shared = defense.release(batch_size).require_finite(defense_name(defense))
        return shared, self.report(at, shared)

    def report(self, at: str, shared: SharedGradient) -> dict[str, Any]:
        report: dict[str, Any] = {"state": at, "epoch": AttackState(at).defense_epoch(self.epochs),
                                  "density": float(shared.density), "noise_std": float(shared.noise_std)}
        if shared.rate is not None:
            report["defense_rate"] = float(shared.rate)
        return report
