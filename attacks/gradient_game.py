"""The threat model shared by the gradient attacks: ``ig`` and ``rgap`` (reconstruction) and ``grad-mia``
(membership); registers nothing.

What the attacker gets: the ``AttackerView`` (``attacks/view.py``: the architecture and the weights of the
attacked state, all public defense metadata, the public split) and the ``SharedGradient`` that the release
oracle — the defense's own ``release`` path — produces for a target batch. The games live here, as the hooks
of the template ``attacks/game.py``: ``ReconstructionAttack`` (``ig``, ``rgap``) and ``GradientMembershipAttack``
(``grad-mia``) draw the targets from the private pool, have the oracle release them, hand the attack's ``guess``
the evidence —
``Releases`` (the releases of one attacked state and the labels where the threat model grants them) or
``ReleaseSignals`` (one release and the gradients of unlabelled shuffled candidates) — and score what it returns against
the truth they keep. The per-sample gradients of the targets go straight into the defense
and are never handed to the attack.

Choices where the papers are silent (also in docs/gradient-inversion.md):

* Targets: ``attack.targets`` (T) independent target batches of ``attack.batch_size`` (B) examples, T·B
  distinct examples of the private pool drawn without replacement from the run's ``attack/gradient``
  ``targets`` stream; ``ig`` and ``rgap`` in one run attack the same examples, and every attacked state
  sees the same examples. Each batch is released on its own (one observed step per batch), its noise
  drawn from the attack's stream ``attack/<name>/<state>/release/<t>``.
* ``attack.at``: ``init`` = weights before training with the defense as at epoch 0; ``epoch:N`` =
  weights at the start of epoch N with the defense as then; ``final`` = weights after training with the
  defense as in the last epoch (``begin_epoch(epochs - 1)``) and its final public state;
  ``trajectory[:k]`` (reconstruction attacks; the default) = k states evenly spaced over training and
  ending at ``final`` (``dpeval.core.states.resolve``), the stretch where schedules such as RS's
  gradual cooling are active. ``begin_epoch`` runs first, then the snapshot of the defense's public
  state from training (if the defense has ``load_state_dict``) overrides whatever the schedule re-drew.
* The release is ``release(attack.batch_size)``: the attacker observes one logical step whose batch is
  the target batch (the usual federated / gradient-sharing threat model), so DP-SGD noise has std
  σ·C/B on it.
* Several states: every state's scores are reported under ``leakage.<attack>.<state>.<metric>``; the
  plain ``leakage.<attack>.<metric>`` keys are those of the worst state — the one with the highest mean
  PSNR — named by ``leakage.<attack>.state`` (all of them from that one state, not a per-metric max).
* Verdict: ``attacks/verdict.py`` (sign test of per-target PSNR gains over the best data-free guess,
  Bonferroni over the states).
* Recovered labels: for one example, the row of the last layer's ``[∂W | ∂b]`` whose (released)
  coordinates disagree in sign with all other rows (iDLG; with a bias this reduces to ``argmin ∂b``);
  for a batch, a bias-gradient count (classes with a negative bias gradient first, then repeated
  argmins after adding back each pick's estimated impact). Label accuracy is the multiset overlap of
  recovered and true labels divided by B (order-free).
* On CPU the whole attack runs with one intra-op thread (``single_cpu_thread``): faster for these
  small per-example problems and independent of the core count.
* Beside the scores each reconstruction attack reports ``state``, ``epoch``, ``density`` and
  ``noise_std`` of the worst state's release, ``defense_rate`` when the release declares a ``rate`` (RS,
  random freeze), the PSNR of the data-free guesses (``baseline_psnr_noise``, ``baseline_psnr_mean``,
  ``baseline_psnr_public``) and of the best of them per image (``baseline_psnr``), ``verdict`` and its
  ``p_value``. Per target and state numbers go to ``<attack>-scores.json``, the pictures' pixels to
  ``<attack>-images.npz`` (the report's grid), the picture to ``<attack>-reconstruction.png``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from dpeval.attacks import image_metrics, verdict
from dpeval.attacks.base import ArraysFile, Artefact, AttackParams, TextFile
from dpeval.attacks.game import Game, Played, Round, Scored
from dpeval.attacks.membership_metrics import (
    MembershipScores,
    mean_metrics,
    membership_metrics,
    membership_verdict,
    roc_artefacts,
)
from dpeval.attacks.view import AttackerView
from dpeval.core.errors import ConfigError
from dpeval.core.params import param
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.splits import Task
from dpeval.core.states import AttackState, resolve
from dpeval.core.streams import Streams
from dpeval.core.verdicts import Verdict
from dpeval.defenses.base import SharedGradient

log = logging.getLogger("dpeval")
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
        AttackState.parse(self.at, recorded_only=True)


@dataclass
class ReconstructionParams(GradientThreatParams):
    """``ig`` and ``rgap``: several attacked states and several independent targets."""

    at: str | list[str] = param("trajectory", "attacked model state(s): `init`, `final`, `epoch:N`, "
                                              "`trajectory[:k]` (k states evenly spaced over training, "
                                              "ending at `final`; k = 3 when omitted), or a list of them")
    targets: int = param(6, "independent target batches, each released on its own and attacked at every "
                            "state: the sample of the verdict's sign test", low=1)

    @property
    def states(self) -> list[str]:
        return [self.at] if isinstance(self.at, str) else list(self.at)

    def validate(self) -> None:
        if not self.states:
            raise ConfigError("attack.at: must name at least one model state")
        for state in self.states:
            AttackState.parse(state)


def wanted_states(params: GradientThreatParams) -> set[str]:
    names = [params.at] if isinstance(params.at, str) else params.at
    return {n for n in names if n not in ("init", "final")}


def target_streams(view: AttackerView) -> Streams:
    """The streams every gradient attack of a run shares (so ``ig`` and ``rgap`` attack the same targets)."""
    return view.streams.scope("attack", "gradient")


def select_targets(task: Any, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, pool indices) of the target batch: B distinct private examples drawn from ``gen``."""
    n = len(task.train)
    if batch_size > n:
        raise ConfigError(f"attack.batch_size: must be <= the private pool size ({n}), got {batch_size}")
    idx = torch.randperm(n, generator=gen)[:batch_size]
    return task.train.x[idx].clone(), task.train.y[idx].clone(), idx


def check_targets(params: ReconstructionParams, task: Any) -> None:
    """The T·B targets must be distinct private examples: refused before training when the pool is smaller."""
    need, pool = params.targets * params.batch_size, len(task.train)
    if need > pool:
        raise ConfigError(f"attack.targets: {params.targets} targets of attack.batch_size {params.batch_size} "
                          f"need {need} distinct private examples; the pool has {pool}")


def draw_targets(view: AttackerView, task: Task,
                 params: ReconstructionParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, indices) of the T target batches, shaped ``[T, B, ...]``: T·B distinct private examples (the
    first batch is what a single-target attack with the same seed attacks)."""
    check_targets(params, task)
    need = params.targets * params.batch_size
    x, y, idx = select_targets(task, need, target_streams(view).generator("targets"))
    shape = (params.targets, params.batch_size)
    return x.view(*shape, *x.shape[1:]), y.view(shape), idx.view(shape)


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


@dataclass
class Reconstruction:
    """What ``reconstruct`` returns for the T target batches of one state."""

    pixels: torch.Tensor                                      # [T, B, C, H, W] in [0, 1]
    details: dict[str, list] = field(default_factory=dict)    # per-target diagnostics (scores JSON)
    metrics: dict[str, Any] = field(default_factory=dict)     # flat diagnostics, reported for the worst state
    artefacts: dict[str, Artefact] = field(default_factory=dict)  # files beside the game's (written for it)


@dataclass(frozen=True)
class Releases:
    """What a reconstruction attack sees at one attacked state: the T releases (one per target batch), the
    coordinates it matches on, the labels its threat model grants, and the public view."""

    view: AttackerView                               # the public side of the run (architecture, shape, mean…)
    model: nn.Module                                 # the victim's architecture with the attacked state's weights
    releases: list[SharedGradient]                   # T releases, one per target batch
    masks: list[dict[str, torch.Tensor] | None]      # per release: the coordinates to match (None: all)
    labels: torch.Tensor                             # [T, B]: known or recovered (``attack.labels``)
    streams: Streams                                 # the attack's own streams at this state


@dataclass(frozen=True)
class StateTruth:
    """What the game keeps of one attacked state's round: the state, its releases' report and the labels' accuracy."""

    state: str
    report: dict[str, Any]         # epoch, density, noise_std, defense_rate of the state's releases
    label_accuracy: np.ndarray     # [T]


@dataclass
class StateOutcome:
    state: str
    report: dict[str, Any]         # epoch, density, noise_std, defense_rate of the state's releases
    pixels: torch.Tensor           # [T, B, C, H, W], matched: pixels[t, i] is the guess of original (t, i)
    scores: dict[str, np.ndarray]  # psnr / mse / ssim, [T, B]
    label_accuracy: np.ndarray     # [T]
    gains: np.ndarray              # [T]: mean PSNR gain over the best data-free guess, per target batch
    test: verdict.SignTest
    rec: Reconstruction

    def mean(self, metric: str) -> float:
        return float(np.mean(self.scores[metric]))


@dataclass
class Targets:
    """What the reconstruction game draws: the T target batches, the data-free guesses' PSNRs, the states."""

    view: AttackerView
    own: Streams                       # the attack's streams
    x: torch.Tensor                    # [T, B, C, H, W]
    y: torch.Tensor                    # [T, B]
    index: torch.Tensor                # [T, B] rows of the private pool
    base: dict[str, np.ndarray]        # data-free guess -> PSNR [T, B]
    best_guess: np.ndarray             # [T, B]: the better guess per image
    states: list[str]                  # the attacked states, resolved


@dataclass(kw_only=True)
class ReconstructionScores(Scored):
    outcomes: list[StateOutcome]
    worst: StateOutcome  # the state with the highest mean PSNR, whose metrics are the flat ones


class ReconstructionAttack(Game[Releases, Targets, ReconstructionScores]):
    """``ig`` and ``rgap``: a subclass implements ``guess(Releases) -> Reconstruction`` (images for the T
    releases of one state); the game: targets, releases at every state, labels, images matched to the targets
    and scored, the verdict, the pictures."""

    Params = ReconstructionParams
    one_thread = True

    @classmethod
    def wanted_states(cls, params: Any) -> set[str]:
        return wanted_states(params)

    @classmethod
    def check_task(cls, params: Any, task: Task) -> None:
        check_targets(params, task)

    def deal(self, view: AttackerView, task: Task) -> Targets:
        params = self.params
        own = view.streams.scope("attack", self.name)
        x, y, idx = draw_targets(view, task, params)
        flat = x.reshape(-1, *x.shape[2:])
        public = view.public.x if len(view.public) else None
        guesses = image_metrics.guesses(flat, view.mean, own.generator("baseline"), public)
        base = {g: np.array([image_metrics.matched_psnr(x[t], pixels.view_as(x)[t]) for t in range(len(x))])
                for g, pixels in guesses.items()}
        best_guess = np.max(np.stack(list(base.values())), axis=0)
        states = resolve(params.states, int(view.spec.train.epochs))
        if params.targets < verdict.min_targets(len(states)):
            log.warning("%s: %d target(s) over %d state(s) can never give the verdict `leaks` (the sign test needs "
                        "at least %d); set attack.targets", self.name, params.targets, len(states),
                        verdict.min_targets(len(states)))
        return Targets(view, own, x, y, idx, base, best_guess, states)

    def rounds(self, dealt: Targets) -> Iterator[Round[Releases, StateTruth]]:
        """One round per attacked state: the T target batches released there, labels known or recovered."""
        view, own, x, y = dealt.view, dealt.own, dealt.x, dealt.y
        for state in dealt.states:
            model = view.model_at(state)
            releases, masks, labels, label_acc, reports = [], [], [], [], []
            for t in range(len(x)):
                shared, report = view.release(model, x[t], y[t], state, own.scope(state, "release", t))
                mask = matching_mask(shared, self.params.mask_aware)
                used, acc = attack_labels(self.params, model, shared, mask, y[t])
                releases.append(shared)
                masks.append(mask)
                labels.append(used)
                label_acc.append(acc)
                reports.append(report)
            report = dict(reports[0], density=float(np.mean([r["density"] for r in reports])))
            yield Round(Releases(view, model, releases, masks, torch.stack(labels), own.scope(state)),
                        StateTruth(state, report, np.array(label_acc)))

    def score(self, dealt: Targets, played: list[Played[StateTruth]]) -> ReconstructionScores:
        outcomes = [state_outcome(dealt, p.truth, p.answer) for p in played]
        worst = max(outcomes, key=lambda o: o.mean("psnr"))
        per_state = {o.state: {k: v for k, v in _state_metrics(o).items() if k not in ("state", "epoch")}
                     | {"wins": o.test.wins, "p_value": o.test.p_value} for o in outcomes}
        metrics: dict[str, Any] = _state_metrics(worst)
        metrics.update(worst.rec.metrics)
        metrics.update({f"baseline_psnr_{g}": float(v.mean()) for g, v in dealt.base.items()})
        metrics["baseline_psnr"] = float(dealt.best_guess.mean())
        metrics["p_value"] = verdict.decide([o.test for o in outcomes])[1]
        return ReconstructionScores(metrics, per_state, outcomes=outcomes, worst=worst)

    def decide(self, scored: ReconstructionScores) -> Verdict:
        return verdict.decide([o.test for o in scored.outcomes])[0]

    def artefacts(self, dealt: Targets, scored: ReconstructionScores, decision: Verdict) -> dict[str, Artefact]:
        """``<attack>-scores.json`` (per target and state numbers), ``<attack>-images.npz`` (the pictures' pixels,
        the report's grid), ``<attack>-reconstruction.png``, and those of the reconstructions."""
        name, outcomes, worst = self.name, scored.outcomes, scored.worst
        x, best_guess = dealt.x, dealt.best_guess
        scores = {
            "rule": {"margin_db": verdict.MARGIN_DB, "alpha": verdict.ALPHA, "states": len(outcomes),
                     "targets": self.params.targets, "min_targets": verdict.min_targets(len(outcomes)),
                     "p_value": scored.metrics["p_value"], "verdict": decision, "worst_state": worst.state},
            "target_index": dealt.index.tolist(), "labels": dealt.y.tolist(),
            "baseline_psnr": {g: v.tolist() for g, v in dealt.base.items()}, "best_guess_psnr": best_guess.tolist(),
            "states": [{**o.report, **{k: v.tolist() for k, v in o.scores.items()}, "gain_db": o.gains.tolist(),
                        "wins": o.test.wins, "p_value": o.test.p_value, "label_accuracy": o.label_accuracy.tolist(),
                        **o.rec.details} for o in outcomes],
        }
        artefacts: dict[str, Artefact] = {
            "png": _picture(name, dealt.view, x, outcomes, worst, decision, scored.metrics["baseline_psnr"]),
            "scores": TextFile(f"{name}-scores.json", json.dumps(scores, indent=1, default=float)),
            "images": ArraysFile(f"{name}-images.npz", {
                "originals": _bytes(x), "states": np.array(dealt.states),
                "reconstructions": np.stack([_bytes(o.pixels) for o in outcomes]),
                "psnr": np.stack([o.scores["psnr"] for o in outcomes]), "best_guess_psnr": best_guess})}
        for o in outcomes:
            artefacts.update(o.rec.artefacts)
        return artefacts


def state_outcome(dealt: Targets, truth: StateTruth, rec: Reconstruction) -> StateOutcome:
    """One state's reconstruction matched to the targets (image by image) and scored against them."""
    x = dealt.x
    pixels = rec.pixels.detach().cpu().float().view_as(x)
    matched = torch.stack([pixels[t][torch.as_tensor(image_metrics.match(x[t], pixels[t]))] for t in range(len(x))])
    per = [image_metrics.per_image(x[t], matched[t]) for t in range(len(x))]
    scores = {k: np.array([p[k] for p in per]) for k in ("psnr", "mse", "ssim")}
    gains = (scores["psnr"] - dealt.best_guess).mean(axis=1)
    return StateOutcome(truth.state, truth.report, matched, scores, truth.label_accuracy, gains,
                        verdict.sign_test(gains), rec)


def _state_metrics(o: StateOutcome) -> dict[str, Any]:
    return {"psnr": o.mean("psnr"), "mse": o.mean("mse"), "ssim": o.mean("ssim"),
            "label_accuracy": float(o.label_accuracy.mean()), **o.report}


def _bytes(images: torch.Tensor) -> np.ndarray:
    """Pixels in [0, 1] as uint8 (what a picture shows; keeps the arrays small)."""
    return (images.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def _picture(name: str, view: AttackerView, x: torch.Tensor, outcomes: list[StateOutcome],
             worst: StateOutcome, decision: Verdict, baseline: float) -> image_metrics.Grid:
    """Originals over one row of reconstructions per attacked state, per-image PSNR captions."""
    flat = x.reshape(-1, *x.shape[2:])
    rows, captions, labels = [], [], []
    for o in outcomes:
        rows.append(o.pixels.reshape(-1, *x.shape[2:]))
        captions.append([f"{p:.1f} dB" for p in o.scores["psnr"].reshape(-1)])
        rate = o.report.get("defense_rate")
        labels.append(o.state + (f"\nrate {rate:.2f}" if rate is not None else ""))
    rate = worst.report.get("defense_rate")
    title = (f"{name} vs {view.spec.defense_name}: {decision} (worst state {worst.state}"
             f"{f', rate {rate:.2f}' if rate is not None else ''})\nPSNR {worst.mean('psnr'):.1f} dB vs best "
             f"data-free guess {baseline:.1f} dB; SSIM {worst.mean('ssim'):.2f}")
    return image_metrics.Grid(f"{name}-reconstruction.png", flat, rows, title, captions, labels)


# --------------------------------------------------------------------------------------------------
# The membership game on releases (``grad-mia``)


@dataclass
class GradientMembershipParams(GradientThreatParams):
    batch_size: int = param(8, "members per observed release", low=1)
    batches: int = param(8, "observed releases (each of different members)", low=1)


@dataclass(frozen=True)
class ReleaseSignals:
    """What a membership attack on releases scores for one release, computed by the game from what the threat
    model grants (the release, the attacked state's weights, the candidates' inputs and labels, the public split),
    so that ``guess`` is a pure function of it. Rows are flattened over the trainable parameters and, under
    ``attack.mask_aware``, restricted to the released coordinates (unreleased ones are zero)."""

    release: torch.Tensor              # [1, P] the released gradient
    candidates: torch.Tensor           # [m, P] each candidate's own gradient at the attacked state (shuffled
                                       # members and non-members; which is which is not given)
    public_mean: torch.Tensor | None   # [1, P] mean gradient of the public split (None: no public split)


PUBLIC_MEAN_LIMIT = 256  # public examples averaged into ReleaseSignals.public_mean


def flat_rows(grads: dict[str, torch.Tensor], mask: dict[str, torch.Tensor] | None,
              names: list[str]) -> torch.Tensor:
    """[b, P] rows from per-parameter tensors with a leading batch dimension, masked when given."""
    flat = torch.cat([grads[n].reshape(grads[n].shape[0], -1) for n in names], dim=1)
    if mask is not None:
        flat = flat * torch.cat([mask[n].reshape(1, -1) for n in names], dim=1)
    return flat


@dataclass(frozen=True)
class BatchTruth:
    """What the game keeps of one release's round: how many of its candidates (listed first) are members, and the
    release's noise and density."""

    members: int
    noise_std: float
    density: float


@dataclass
class ReleasedBatches:
    """What the membership game on releases draws: the members of each release, the non-members, and what every
    round reads at the attacked state."""

    view: AttackerView
    task: Task
    own: Streams
    members: torch.Tensor              # [batches, batch_size] rows of the private pool
    others: torch.Tensor               # rows of the held-out split
    model: nn.Module
    psg: PerSampleGradients
    names: list[str]                   # the trainable parameters
    public_grads: dict[str, torch.Tensor] | None


class GradientMembershipAttack(Game[ReleaseSignals, ReleasedBatches, MembershipScores]):
    """Membership on releases: the game releases ``attack.batches`` batches of ``attack.batch_size`` private
    members at ``attack.at``; for each release the subclass's ``guess(ReleaseSignals) -> Scores`` sees the
    release and the gradients of a candidate set — the batch's members and as many held-out non-members, shuffled
    by the game's ``order`` stream and unlabelled — and scores every candidate (higher: more likely in the
    release). The game scores the candidates against who was released and reports the ledger's ε of one release
    and the release's noise and density."""

    Params = GradientMembershipParams

    @classmethod
    def wanted_states(cls, params: Any) -> set[str]:
        return wanted_states(params)

    @classmethod
    def check_task(cls, params: Any, task: Task) -> None:
        """Every release needs ``batch_size`` members and as many held-out non-members, none reused."""
        need = params.batches * params.batch_size
        for role, have in (("private pool", len(task.train)), ("held-out test split", len(task.test))):
            if need > have:
                raise ConfigError(f"attack.batches: {params.batches} batches × attack.batch_size {params.batch_size} "
                                  f"need {need} examples of the {role}, which has {have}")

    def title(self) -> str:
        return self.name

    def deal(self, view: AttackerView, task: Task) -> ReleasedBatches:
        p = self.params
        need = p.batches * p.batch_size
        own = view.streams.scope("attack", self.name)
        gen = own.generator("candidates")
        members = torch.randperm(len(task.train), generator=gen)[:need].view(p.batches, p.batch_size)
        others = torch.randperm(len(task.test), generator=gen)[:need]
        model = view.model_at(p.at)
        psg = PerSampleGradients(model)
        names = [n for n, q in model.named_parameters() if q.requires_grad]
        public = view.public
        public_grads = (psg(public.x[:PUBLIC_MEAN_LIMIT].to(view.device), public.y[:PUBLIC_MEAN_LIMIT].to(view.device))
                        if len(public) else None)
        return ReleasedBatches(view, task, own, members, others, model, psg, names, public_grads)

    def rounds(self, dealt: ReleasedBatches) -> Iterator[Round[ReleaseSignals, BatchTruth]]:
        """One round per release: its members and their share of the non-members, shuffled."""
        p, view, task, own, names = self.params, dealt.view, dealt.task, dealt.own, dealt.names
        for b in range(p.batches):
            x, y = task.train.x[dealt.members[b]], task.train.y[dealt.members[b]]
            shared, _ = view.release(dealt.model, x, y, p.at, own.scope("release", b))
            mine = dealt.others[b::p.batches]
            xs, ys = torch.cat([x, task.test.x[mine]]), torch.cat([y, task.test.y[mine]])
            order = torch.randperm(len(ys), generator=own.generator("order", b))
            mask = matching_mask(shared, p.mask_aware)
            public_mean = (None if dealt.public_grads is None
                           else flat_rows(dealt.public_grads, mask, names).mean(0, keepdim=True))
            signals = ReleaseSignals(
                release=flat_rows({n: shared.grads[n].unsqueeze(0).to(view.device) for n in names}, mask, names),
                candidates=flat_rows(dealt.psg(xs[order].to(view.device), ys[order].to(view.device)), mask, names),
                public_mean=public_mean)
            yield Round(signals, BatchTruth(len(x), shared.noise_std, shared.density), order.numpy())

    def score(self, dealt: ReleasedBatches, played: list[Played[BatchTruth]]) -> MembershipScores:
        members = [r.answer.values[: r.truth.members] for r in played]
        others = [r.answer.values[r.truth.members:] for r in played]
        scores = np.concatenate(members + others)
        labels = np.concatenate([np.ones(sum(map(len, members)), bool), np.zeros(sum(map(len, others)), bool)])
        metrics = membership_metrics(scores, labels, dealt.view.privacy.delta, dealt.own.numpy("threshold"))
        metrics["accounted_epsilon"] = dealt.view.privacy.at(1.0, 1).epsilon
        metrics["release_noise_std"] = played[-1].truth.noise_std  # the last release's
        metrics["release_density"] = played[-1].truth.density
        metrics.update(mean_metrics([r.answer.metrics for r in played]))
        return MembershipScores(metrics, scores=scores, labels=labels)

    def decide(self, scored: MembershipScores) -> Verdict:
        return membership_verdict(scored.metrics)

    def artefacts(self, dealt: ReleasedBatches, scored: MembershipScores, decision: Verdict) -> dict[str, Artefact]:
        return roc_artefacts(scored.scores, scored.labels, self.title())
