"""The threat model shared by the gradient-inversion attacks ``ig`` and ``rgap`` (registers nothing).

What the attacker gets (issue 6): the architecture and the weights of the attacked state, all public
defense metadata, and the ``SharedGradient`` that the defense's own ``release`` path produces for a
target batch. Nothing else: the per-sample gradients computed here go straight into the defense and are
never handed to the attack.

Choices where the issue is silent (also in docs/gradient-inversion.md):

* Target: ``attack.batch_size`` distinct examples of the private pool, drawn without replacement by a
  generator seeded from the run seed (stream ``STREAM_TARGET``); ``ig`` and ``rgap`` in one run
  attack the same examples.
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
  the attacked release, ``defense_rate`` when the release carries ``extra["rate"]`` (RS, random freeze),
  and the PSNR of two data-free guesses (``baseline_psnr_noise``, ``baseline_psnr_mean``).
"""

from __future__ import annotations

import contextlib
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
from harness.errors import ConfigError
from harness.per_sample import PerSampleGradients, micro_batches

# Random streams derived from the run seed (the runner uses 1-3 for sampling, noise, attack defense).
STREAM_TARGET = 11
STREAM_ATTACK_INIT = 12
STREAM_BASELINE = 13

AT_PATTERN = re.compile(r"^(init|final|epoch:(\d+))$")
LABEL_MODES = ("known", "recovered")


@dataclass
class GradientThreatParams(AttackParams):
    """Threat-model knobs shared by ``ig`` and ``rgap`` (one ``attack.*`` namespace)."""

    batch_size: int = 1        # target batch size B
    at: str = "init"           # attacked model state: init | final | epoch:N
    labels: str = "known"      # known | recovered (iDLG for B = 1, bias-gradient counting for B > 1)
    mask_aware: bool = True    # match only released coordinates (False: naive, zeros taken as values)

    def validate(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"attack.batch_size: must be an integer >= 1, got {self.batch_size!r}")
        if not isinstance(self.at, str) or not AT_PATTERN.match(self.at):
            raise ConfigError(f"attack.at: must be init, final or epoch:N (N an integer >= 0), got {self.at!r}")
        if self.labels not in LABEL_MODES:
            raise ConfigError(f"attack.labels: must be one of {', '.join(LABEL_MODES)}, got {self.labels!r}")
        if not isinstance(self.mask_aware, bool):
            raise ConfigError(f"attack.mask_aware: must be true or false, got {self.mask_aware!r}")


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


def stream_generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000 + stream)


def select_targets(task: Any, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, pool indices) of the target batch: B distinct private examples drawn with the run seed."""
    n = len(task.train)
    if batch_size > n:
        raise ConfigError(f"attack.batch_size: must be <= the private pool size ({n}), got {batch_size}")
    idx = torch.randperm(n, generator=stream_generator(seed, STREAM_TARGET))[:batch_size]
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
                at: str, stream: int | None = None) -> tuple[SharedGradient, dict[str, Any]]:
    """The SharedGradient the defense releases for batch (x, y) at the attacked state, plus a report
    of the state used. Goes through ``begin_epoch`` / ``clip_and_accumulate`` / ``release`` exactly as
    training does."""
    epochs = int(context.spec.train.epochs)
    epoch = attacked_epoch(at, epochs)
    # Several releases in one attack need independent noise: each passes its own random stream.
    defense = context.make_defense() if stream is None else context.make_defense(stream)
    defense.begin_epoch(epoch, epochs)
    public_state = context.defense_states.get(at)
    loader = getattr(defense, "load_state_dict", None)
    if public_state and callable(loader):
        loader(copy.deepcopy(public_state))
    psg = PerSampleGradients(model)
    device = context.device
    chunk = int(getattr(context.spec.train, "physical_batch_size", x.shape[0]) or x.shape[0])
    for xb, yb in micro_batches(x.to(device), y.to(device), chunk):
        defense.clip_and_accumulate(psg(xb, yb))
    shared = defense.release(x.shape[0])
    report: dict[str, Any] = {"state": at, "epoch": epoch, "density": float(shared.density),
                              "noise_std": float(shared.noise_std)}
    rate = shared.extra.get("rate") if isinstance(shared.extra, dict) else None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        report["defense_rate"] = float(rate)
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


@contextlib.contextmanager
def single_cpu_thread(device: torch.device):
    """Run a block with one intra-op CPU thread (restored afterwards).

    Optimisation attacks issue thousands of tiny ops per second; on CPU, intra-op threads only add
    synchronisation (measured on a loaded 2-core machine: 5 s with one thread vs 36 s with two for the
    default ``ig`` run, 4 s vs 58 s for ``rgap``), and one thread makes CPU results independent of the
    core count."""
    if torch.device(device).type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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
    x, y, idx = select_targets(context.task, params.batch_size, context.seed)
    model = attacked_model(context, params.at)
    shared, report = release_for(context, model, x, y, params.at)
    mask = matching_mask(shared, params.mask_aware)
    labels, label_acc = attack_labels(params, model, shared, mask, y)
    recon, extra_metrics, artefacts = reconstruct(params, context, model, shared, mask, labels)
    recon = recon.detach().cpu().float()
    scores, perm = image_metrics.score(x, recon)
    metrics: dict[str, Any] = {**scores, "label_accuracy": label_acc, **report,
                               "mask_aware": params.mask_aware, "labels": params.labels,
                               "batch_size": params.batch_size, "target_index": ",".join(map(str, idx.tolist()))}
    metrics.update(image_metrics.baselines(x, context.task.mean,
                                           stream_generator(context.seed, STREAM_BASELINE)))
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


def untrained_context(spec: Any, out_dir: Any) -> AttackContext:
    """An AttackContext for ``attack.at: init`` without training (tests, quick experiments).

    Same model initialisation, defense and attack streams as ``dpeval run`` with this spec; the
    ``final`` state is the initial one (nothing was trained). The defense's public state at epoch 0 is
    taken exactly as training would snapshot it (after ``begin_epoch(0)``).
    """
    from pathlib import Path

    from harness.runner import STREAM_ATTACK, prepare  # runtime import: harness.runner imports attacks

    prep = prepare(spec)
    prep.model.to(prep.device).eval()
    init = copy.deepcopy(prep.model.state_dict())
    defense = prep.make_defense()
    defense.begin_epoch(0, spec.train.epochs)
    state = copy.deepcopy(defense.state_dict())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return AttackContext(model=prep.model, states={"init": init, "final": init},
                         defense_states={"init": state, "final": state}, trained_defense=defense,
                         task=prep.task,
                         make_defense=lambda stream=STREAM_ATTACK, bound_to=None: prep.make_defense(stream, bound_to),
                         spec=spec, accounted=prep.privacy, seed=spec.seed, out_dir=out, device=prep.device)
