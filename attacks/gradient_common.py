"""The threat model shared by the gradient-inversion attacks ``ig`` and ``rgap`` (registers nothing).

What the attacker gets: the architecture and the weights of the attacked state, all public
defense metadata, and the ``SharedGradient`` that the defense's own ``release`` path produces for a
target batch. Nothing else: the per-sample gradients computed here go straight into the defense and are
never handed to the attack.

Choices where the papers are silent (also in docs/gradient-inversion.md):

* Target: ``attack.batch_size`` distinct examples of the private pool, drawn without replacement from
  the run's ``attack/gradient`` ``targets`` stream; ``ig`` and ``rgap`` in one run attack the same
  examples. The observed release draws its noise from the attack's own ``release`` stream.
* ``attack.at``: ``init`` = weights before training with the defense as at epoch 0; ``epoch:N`` =
  weights at the start of epoch N with the defense as then; ``final`` = weights after training with the
  defense as in the last epoch (``begin_epoch(epochs - 1)``) and its final public state.
  ``begin_epoch`` runs first, then the snapshot of the defense's public state from training (if the
  defense has ``load_state_dict``) overrides whatever the schedule re-drew (e.g. the RS mask).
* The release is ``release(attack.batch_size)``: the attacker observes one logical step whose batch is
  the target batch (the usual federated / gradient-sharing threat model), so DP-SGD noise has std
  σ·C/B on it.
* Recovered labels: for one example, the row of the last layer's ``[∂W | ∂b]`` whose (released)
  coordinates disagree in sign with all other rows (iDLG; with a bias this reduces to ``argmin ∂b``);
  for a batch, a bias-gradient count (classes with a negative bias gradient first, then repeated
  argmins after adding back each pick's estimated impact). Label accuracy is the multiset overlap of
  recovered and true labels divided by B (order-free).
* On CPU the whole attack runs with one intra-op thread (``single_cpu_thread``): faster for these
  small per-example problems and independent of the core count.
* Beside the issue's metrics each attack reports ``state``, ``epoch``, ``density`` and ``noise_std`` of
  the attacked release, ``defense_rate`` when the release declares a ``rate`` (RS, random freeze),
  and the PSNR of two data-free guesses (``baseline_psnr_noise``, ``baseline_psnr_mean``).
"""

from __future__ import annotations

import copy
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from attacks import image_metrics
from attacks.base import AttackContext, AttackParams, AttackResult
from defenses.base import SharedGradient
from harness.core.errors import ConfigError
from harness.core.params import param
from harness.core.runtime import single_cpu_thread
from harness.core.streams import Streams
from harness.engine.release import observe_release

AT_PATTERN = re.compile(r"^(init|final|epoch:(\d+))$")
LABEL_MODES = ("known", "recovered")


@dataclass
class GradientThreatParams(AttackParams):
    """Threat-model knobs shared by ``ig``, ``rgap`` and ``grad-mia`` (one ``attack.*`` namespace)."""

    batch_size: int = param(1, "target batch size B of the observed release", low=1)
    at: str = param("init", "attacked model state: `init`, `final` or `epoch:N`")
    labels: str = param("known", "`known`; `recovered`: iDLG for B = 1, bias-gradient counting for B > 1",
                        choices=LABEL_MODES)
    mask_aware: bool = param(True, "match only released coordinates (false: the naive attacker takes the "
                                   "zeros at unreleased coordinates as values)")

    def validate(self) -> None:
        if not AT_PATTERN.match(self.at):
            raise ConfigError(f"attack.at: must be init, final or epoch:N (N an integer >= 0), got {self.at!r}")


def wanted_states(params: GradientThreatParams) -> set[str]:
    return {params.at} if params.at.startswith("epoch:") else set()


def attacked_epoch(at: str, epochs: int) -> int:
    """The epoch whose defense configuration the attacked release uses."""
    if at == "init":
        return 0
    if at == "final":
        return max(epochs - 1, 0)
    n = int(at.split(":", 1)[1])
    if n >= epochs:
        raise ConfigError(f"attack.at: epoch:{n} does not exist in a run of {epochs} epoch(s); "
                          f"use epoch:0 .. epoch:{epochs - 1}, init or final")
    return n


def target_streams(context: AttackContext) -> Streams:
    """The streams every gradient attack of a run shares (so ``ig`` and ``rgap`` attack the same targets)."""
    return context.streams.scope("attack", "gradient")


def select_targets(task: Any, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, pool indices) of the target batch: B distinct private examples drawn from ``gen``."""
    n = len(task.train)
    if batch_size > n:
        raise ConfigError(f"attack.batch_size: must be <= the private pool size ({n}), got {batch_size}")
    idx = torch.randperm(n, generator=gen)[:batch_size]
    return task.train.x[idx].clone(), task.train.y[idx].clone(), idx


def attacked_model(context: AttackContext, at: str) -> nn.Module:
    """A private copy of the architecture with the attacked weights, on the context's device, eval mode."""
    if at not in context.states:
        raise ConfigError(f"attack.at: no model state {at!r} was recorded (have: {', '.join(sorted(context.states))})")
    model = copy.deepcopy(context.model)
    model.load_state_dict(context.states[at])
    model.to(context.device).eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def release_for(context: AttackContext, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                at: str, streams: Streams) -> tuple[SharedGradient, dict[str, Any]]:
    """The SharedGradient the defense releases for batch (x, y) at the attacked state, plus a report
    of the state used. A fresh defense drawing from ``streams`` (several releases in one attack pass
    independent streams) is put in the state of ``at`` — ``begin_epoch`` and then the public state
    training recorded then — and observes the batch through its own stages, exactly as training does."""
    epochs = int(context.spec.train.epochs)
    epoch = attacked_epoch(at, epochs)
    defense = context.make_defense(streams)
    defense.begin_epoch(epoch, epochs)
    public_state = context.defense_states.get(at)
    if public_state:
        defense.load_state_dict(copy.deepcopy(public_state))
    shared = observe_release(defense, model, x, y, context.spec.train.physical_batch_size)
    report: dict[str, Any] = {"state": at, "epoch": epoch, "density": float(shared.density),
                              "noise_std": float(shared.noise_std)}
    if shared.rate is not None:
        report["defense_rate"] = float(shared.rate)
    return shared, report


def matching_mask(shared: SharedGradient, mask_aware: bool) -> dict[str, torch.Tensor] | None:
    """Float masks of the coordinates the attacker matches on (None = all of them).

    The naive attacker (``mask_aware=False``) ignores the public mask and matches every coordinate,
    taking the zeros at unreleased coordinates as gradient values."""
    if not mask_aware or shared.mask is None:
        return None
    out = {}
    for name, g in shared.grads.items():
        m = shared.mask.get(name)
        out[name] = torch.ones_like(g) if m is None else m.to(device=g.device, dtype=g.dtype)
    return out


# --------------------------------------------------------------------------------------------------
# Labels


def last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """Name prefix and module of the last nn.Linear (the classification head)."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found = (name, module)
    if found is None:
        raise ConfigError("attack.labels: recovering labels needs a model whose last layer is nn.Linear")
    return found


def recover_labels(model: nn.Module, shared: SharedGradient, mask: dict[str, torch.Tensor] | None,
                   batch_size: int) -> torch.Tensor:
    """Labels read off the released last-layer gradient (see the module docstring)."""
    prefix, head = last_linear(model)
    gw = shared.grads[f"{prefix}.weight"].detach().double()
    mw = mask[f"{prefix}.weight"].double() if mask is not None else torch.ones_like(gw)
    has_bias = head.bias is not None and f"{prefix}.bias" in shared.grads
    if has_bias:
        gb = shared.grads[f"{prefix}.bias"].detach().double()
        mb = mask[f"{prefix}.bias"].double() if mask is not None else torch.ones_like(gb)
    if batch_size == 1:
        # Rows r_c = (p_c - y_c)·[h, 1]: the true row is the one anti-aligned with all others.
        rows, rmask = gw * mw, mw
        if has_bias:
            rows = torch.cat([rows, (gb * mb)[:, None]], dim=1)
            rmask = torch.cat([rmask, mb[:, None]], dim=1)
        gram = rows @ rows.T
        gram.fill_diagonal_(0.0)
        if not bool(rmask.any()):
            return torch.zeros(1, dtype=torch.long)
        return gram.sum(dim=1).argmin().reshape(1).cpu()
    if not has_bias:
        raise ConfigError("attack.labels: recovering the labels of a batch needs a last Linear layer with bias")
    # Bias-gradient counting; unreleased bias coordinates carry no evidence (taken as 0).
    b = (gb * mb).cpu()
    negative = b[b < 0]
    impact = float(negative.sum()) / batch_size if negative.numel() else -1.0 / batch_size
    labels: list[int] = []
    remaining = b.clone()
    for c in torch.argsort(b).tolist():
        if len(labels) < batch_size and b[c] < 0:
            labels.append(c)
            remaining[c] -= impact
    while len(labels) < batch_size:
        c = int(remaining.argmin())
        labels.append(c)
        remaining[c] -= impact
    return torch.tensor(sorted(labels), dtype=torch.long)


def label_accuracy(recovered: torch.Tensor, true: torch.Tensor) -> float:
    """Multiset overlap / B: order-free, so it does not depend on how images are matched."""
    a, b = Counter(recovered.tolist()), Counter(true.tolist())
    return sum((a & b).values()) / max(len(true), 1)


def attack_labels(params: GradientThreatParams, model: nn.Module, shared: SharedGradient,
                  mask: dict[str, torch.Tensor] | None, y_true: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(labels the attack uses, label accuracy)."""
    if params.labels == "known":
        return y_true.clone(), 1.0
    # Label recovery reads the released coordinates only when mask-aware (the naive attacker reads zeros).
    labels = recover_labels(model, shared, mask, params.batch_size)
    return labels, label_accuracy(labels, y_true)


# --------------------------------------------------------------------------------------------------
# The shared attack flow


def run_gradient_attack(name: str, params: GradientThreatParams, context: AttackContext,
                        reconstruct: Callable[..., tuple[torch.Tensor, dict[str, Any], dict[str, str]]]) -> AttackResult:
    """The part ``ig`` and ``rgap`` share: target, release, labels, reconstruction, scores, picture."""
    with single_cpu_thread(context.device):
        return _run_gradient_attack(name, params, context, reconstruct)


def _run_gradient_attack(name: str, params: GradientThreatParams, context: AttackContext,
                         reconstruct: Callable[..., tuple[torch.Tensor, dict[str, Any], dict[str, str]]]) -> AttackResult:
    start = time.perf_counter()
    own = context.streams.scope("attack", name)
    x, y, idx = select_targets(context.task, params.batch_size, target_streams(context).generator("targets"))
    model = attacked_model(context, params.at)
    shared, report = release_for(context, model, x, y, params.at, own)
    mask = matching_mask(shared, params.mask_aware)
    labels, label_acc = attack_labels(params, model, shared, mask, y)
    recon, extra_metrics, artefacts = reconstruct(params, context, model, shared, mask, labels)
    recon = recon.detach().cpu().float()
    scores, perm = image_metrics.score(x, recon)
    metrics: dict[str, Any] = {**scores, "label_accuracy": label_acc, **report,
                               "mask_aware": params.mask_aware, "labels": params.labels,
                               "batch_size": params.batch_size, "target_index": ",".join(map(str, idx.tolist()))}
    metrics.update(image_metrics.baselines(x, context.task.mean, own.generator("baseline")))
    metrics.update(extra_metrics)
    metrics["time_s"] = time.perf_counter() - start
    rate = f", rate {report['defense_rate']:.2f}" if "defense_rate" in report else ""
    title = (f"{name} vs {context.spec.defense_name} at {params.at}{rate}\nPSNR {scores['psnr']:.1f} dB, "
             f"SSIM {scores['ssim']:.2f}, MSE {scores['mse']:.4f}")
    per = image_metrics.per_image(x, recon[torch.as_tensor(perm)])
    captions = [f"{p:.1f} dB" for p in per["psnr"]]
    png = image_metrics.save_grid(x, recon[torch.as_tensor(perm)], context.out_dir / f"{name}-reconstruction.png",
                                  title, captions)
    return AttackResult(metrics=metrics, artefacts={"png": str(png), **artefacts})
