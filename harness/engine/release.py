"""Releases between the defense and the model: applying one to the model, and observing one for chosen
examples (the victim side of a gradient attack).

Both go through the defense's own stages, so what an optimizer steps on and what an attacker observes is
exactly what the defense releases.
"""

from __future__ import annotations

import torch
from torch import nn

from defenses.base import Defense, SharedGradient
from harness.core.per_sample import PerSampleGradients, micro_batches


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
                    physical_batch_size: int) -> SharedGradient:
    """The release of one logical step whose batch is exactly (x, y), through the defense's
    ``clip_and_accumulate`` (materialised per-sample gradients, the reference engine) and ``release``.
    The caller has put the defense in the state to observe (``begin_epoch``, ``load_state_dict``)."""
    psg = PerSampleGradients(model)
    device = next(model.parameters()).device
    for xb, yb in micro_batches(x.to(device), y.to(device), max(int(physical_batch_size), 1)):
        defense.clip_and_accumulate(psg(xb, yb))
    return defense.release(x.shape[0])
