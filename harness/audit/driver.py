"""``dpeval audit``: a white-box statistical canary audit of a defense's real release path.

The auditor controls the per-sample gradients fed to the defense's own ``clip_and_accumulate`` /
``release`` (never a re-implementation of its mechanics). Two neighbouring inputs differ in one example
(add/remove, as the accountant assumes) whose per-sample gradient is a canary: norm ``CANARY_NORM`` (far
above any clipping norm) along a unit direction inside the released coordinates. The canary is in every
batch of the audited steps (sample rate 1); the releases are scored with the best test statistic we know
for the defense, a threshold is picked on one half of the trials, and on the other half Clopper–Pearson
bounds on TPR / FPR give an empirical ε lower bound (ε_LB) at δ. A correct defense must have
ε_LB ≤ ε, the accountant's ε for the audited steps at sample rate 1.

Design choices (docs/audit.md explains them):

- Trials are vectorised through the real code path: one release carries ``k`` canaries on orthogonal
  directions, each in or out of the batch at random (half in, half out); each canary is one trial. For a
  Gaussian mechanism with isotropic noise the projections of the noise on orthogonal directions are
  independent, so ``k`` canaries per release are ``k`` independent trials at the cost of one release.
  ``canaries=1`` is the textbook one-trial-per-release audit.
- Stateful defenses: every audit sequence is a fresh defense that runs one warm-up step with no private
  data (so the audited steps do not start from the initial state, e.g. a ranked RS mask) and then
  ``steps`` audited steps, the first steps of the last ``steps`` epochs (rate schedules at their end).
  Between steps the model takes an optimizer step on the release, as in training, so state that follows
  the weights (GEP anchors) or the releases (AdaCliP statistics, ranked masks) evolves as in training and
  can depend on the canary. Scores combine all audited steps.
- The audited σ is fixed (``DEFAULT_NOISE_MULTIPLIER``, the accounted σ) rather than the run's, so that
  an under-noising is detectable with the trial count: μ = 1/σ = 0.5 per step, ε ≈ 3.2 at δ = 1e-5 over
  two steps; noise std halved (μ = 1 per step) gives ε_LB ≈ 3.7 with the default trials.
- Several statistics (and, for RS / random freeze, canaries in kept and in masked coordinates) are
  tested; each bound is at confidence 1 − α/m (Bonferroni over the m tests), so the reported maximum is
  still a (1 − α) lower bound.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dpeval.core.accounting import ACCOUNTED_SAMPLING, default_delta
from dpeval.core.canaries import CANARY_NORM, Canaries
from dpeval.core.datasets import load_task
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.models import build_model
from dpeval.core.params import check_noise_scales
from dpeval.core.runtime import resolve_device, single_cpu_thread
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Task
from dpeval.core.statistics import separation, split_bound
from dpeval.core.streams import Streams, seed_globals
from dpeval.core.verdicts import BoundCheck
from dpeval.defenses import DEFENSES
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Defense, DefenseContext
from dpeval.engine.release import step_on_release
from dpeval.engine.training import make_optimizer

DEFAULT_NOISE_MULTIPLIER = 2.0   # accounted σ of each audited step: μ = 0.5 per step
DEFAULT_TRIALS = 100_000         # trials per neighbour (with / without the canary)
MAX_TRIALS = 10_000_000          # 100× the default: each trial keeps a few floats per statistic (≈ 1 GB at most)
MAX_STEPS = 1_000                # audited steps of one sequence (each a release of the whole model)
MAX_CANARIES = 1_000_000         # canaries per release (capped again by the released coordinates)
DEFAULT_STEPS = 2                # audited consecutive steps (stateful defenses need >= 2)
DEFAULT_CANARIES = 512           # canaries per release (orthogonal directions), capped by the defense
ALPHA = 0.05                     # 1 − confidence of the reported bound
WARMUP_STEPS = 1                 # steps with no private data before the audited ones


PROBE_POOL = 4      # the probe model average-pools images to PROBE_POOL × PROBE_POOL
PROBE_HIDDEN = 128  # hidden units of the probe model


def probe_model(task: Task) -> nn.Module:
    """The default probe: a small real model (pool → Linear → Tanh → Linear; 3,466 parameters on digits).
    A canary audit's outcome does not depend on the model (the canary gradients are the auditor's), but its
    cost grows with the parameter count, and GEP anchors need real per-sample gradients of public data."""
    channels = task.shape[0]
    return nn.Sequential(nn.AdaptiveAvgPool2d(PROBE_POOL), nn.Flatten(),
                         nn.Linear(channels * PROBE_POOL**2, PROBE_HIDDEN), nn.Tanh(),
                         nn.Linear(PROBE_HIDDEN, task.num_classes))



@dataclass
class AuditContext:
    """Everything a release sequence needs: the defense class and parameters, the probe model (the run's
    model) and its initial weights, the public task, and the schedule of the sequence."""

    spec: RunSpec
    defense_cls: type
    task: Task
    model: nn.Module
    init_state: dict[str, torch.Tensor]
    sigma: float                 # the noise multiplier the defense adds
    epochs: list[int]            # epoch of each step of a sequence (warm-up first)
    warmup: int
    device: torch.device

    @property
    def shapes(self) -> dict[str, torch.Size]:
        return {n: p.shape for n, p in self.model.named_parameters() if p.requires_grad}

    def make_defense(self, streams: Streams) -> Defense:
        # steps_per_epoch 1: each step is the first of its epoch
        defense = self.defense_cls(self.spec.defense, DefenseContext(self.shapes, self.sigma, streams, self.device))
        self.model.load_state_dict(self.init_state)
        defense.bind(self.model, self.task.public, self.task.num_classes)
        return defense


def run_sequence(ctx: AuditContext, design: CanaryDesign, variant: str, included: torch.Tensor,
                 streams: Streams, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One fresh defense: warm-up, then the audited steps with the ``included`` canaries in every batch.
    Returns each statistic's score per canary, summed over the audited steps."""
    defense = ctx.make_defense(streams)
    optimizer = make_optimizer(ctx.model, ctx.spec.train)
    epochs_total = ctx.spec.train.epochs
    totals: dict[str, torch.Tensor] = {}
    canaries: Canaries | None = None
    for step, epoch in enumerate(ctx.epochs):
        defense.begin_epoch(epoch, epochs_total)
        audited = step >= ctx.warmup
        if audited:
            canaries = design.design(defense, variant, len(included), gen, canaries)
            if included.any():
                defense.clip_and_accumulate(canaries.gradients(included.to(ctx.device), ctx.shapes))
        shared = defense.release(ctx.spec.train.batch_size).require_finite(ctx.spec.defense_name)
        if audited:
            for name, score in design.score(defense, shared, canaries).items():
                totals[name] = totals.get(name, 0) + score.detach().double().cpu()
        if step < len(ctx.epochs) - 1:
            step_on_release(ctx.model, optimizer, shared)
    return totals


def capacity(ctx: AuditContext, design: CanaryDesign, variant: str, streams: Streams) -> int:
    """How many orthogonal canaries fit at every audited step (a dry sequence without private data)."""
    defense = ctx.make_defense(streams)
    optimizer = make_optimizer(ctx.model, ctx.spec.train)
    room = []
    for step, epoch in enumerate(ctx.epochs):
        defense.begin_epoch(epoch, ctx.spec.train.epochs)
        if step >= ctx.warmup:
            room.append(design.capacity(defense, variant))
        shared = defense.release(ctx.spec.train.batch_size)
        if step < len(ctx.epochs) - 1:
            step_on_release(ctx.model, optimizer, shared)
    return min(room)


# ---------------------------------------------------------------------------------------------------
# the bound


@dataclass
class TestResult:
    """One (canary variant, statistic) test: threshold from the choosing half, rates on the judging half."""

    variant: str
    statistic: str
    epsilon_lower_bound: float
    threshold: float = math.nan
    tpr: float = math.nan
    fpr: float = math.nan
    tpr_ci: tuple[float, float] = (0.0, 1.0)
    fpr_ci: tuple[float, float] = (0.0, 1.0)
    separation: float = math.nan  # μ̂ = (mean score in − mean score out) / std of scores out
    trials_per_neighbour: int = 0
    canaries: int = 0
    releases: int = 0

    @property
    def name(self) -> str:
        return f"{self.variant}/{self.statistic}"


# ---------------------------------------------------------------------------------------------------
# the audit


@dataclass
class AuditOptions:
    trials: int = DEFAULT_TRIALS
    steps: int = DEFAULT_STEPS
    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER  # accounted σ of each audited step
    canaries: int = DEFAULT_CANARIES
    progress: bool = False  # a progress bar over releases on stderr (the CLI turns it on)

    def validate(self) -> None:
        if not 2 <= self.trials <= MAX_TRIALS:
            raise ConfigError(f"--trials: must be an integer from 2 to {MAX_TRIALS:,}, got {self.trials}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"--steps: must be an integer from 1 to {MAX_STEPS:,}, got {self.steps}")
        if not 1 <= self.canaries <= MAX_CANARIES:
            raise ConfigError(f"--canaries: must be an integer from 1 to {MAX_CANARIES:,}, got {self.canaries}")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ConfigError(f"--noise-multiplier: must be a number > 0, got {self.noise_multiplier}")


def dp_defense_names() -> list[str]:
    """The registered defenses the canary audits serve: DP with their default parameters and ``auditable``."""
    classes = {n: DEFENSES.get(n) for n in DEFENSES.names()}
    return [n for n, cls in classes.items() if cls.is_dp(cls.Params()) and cls.capabilities.auditable]


def check_auditable(defense_cls: type[Defense], name: str) -> None:
    """ConfigError when the defense declares no canary design (``capabilities.auditable`` is False)."""
    if not defense_cls.capabilities.auditable:
        raise ConfigError(f"defense: {name!r} declares that dpeval audit cannot place canaries in its release "
                          f"(capabilities.auditable); choose one of {', '.join(dp_defense_names())}")


def prepare_audit(spec: RunSpec, options: AuditOptions, defense_cls: type | None = None) -> AuditContext:
    """Check the input (ConfigError on anything wrong) and build the probe: the task and the probe model
    (``model.name`` when given). ``defense_cls`` overrides the registry's class for ``spec.defense_name``
    (e.g. a subclass under test); it takes the same parameters."""
    options.validate()
    defense_cls = defense_cls or DEFENSES.get(spec.defense_name, field="defense")
    if not defense_cls.is_dp(spec.defense):
        raise ConfigError(f"defense: {spec.defense_name!r} (with these parameters) is not a DP mechanism "
                          f"(ε = inf): there is no accounted ε to audit; choose one of {', '.join(dp_defense_names())}")
    check_auditable(defense_cls, spec.defense_name)
    if options.steps > spec.train.epochs:
        raise ConfigError(f"--steps: the audited steps are the first steps of the last epochs, so at most "
                          f"train.epochs ({spec.train.epochs}); got {options.steps}")
    device = resolve_device(spec.device)
    task = load_task(spec.data)
    defense_cls.check_task(spec.defense, task)
    seed_globals(Streams(spec.seed).scope("audit"))
    if spec.model.name is None:
        model = probe_model(task).to(device)
    else:
        model = build_model(spec.model.name, task.shape, task.num_classes, task.mean, task.std, spec.model,
                            task.vocab).to(device)
    defense_cls.check_model(spec.defense, model)
    epochs = spec.train.epochs
    warmup = min(WARMUP_STEPS, epochs - options.steps)
    schedule = list(range(epochs - options.steps - warmup, epochs))
    sigma = defense_cls.noise_for_accounted(options.noise_multiplier)
    check_noise_scales(spec.defense, "defense", sigma)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return AuditContext(spec, defense_cls, task, model, init, sigma, schedule, warmup, device)


def audit_variant(ctx: AuditContext, design: CanaryDesign, variant: str, options: AuditOptions,
                  streams: Streams) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Scores [releases, k] per statistic and membership labels [releases, k] of one canary variant
    (no releases when no canary fits, e.g. masked coordinates of a dense mask)."""
    rng, gen = streams.numpy("canaries"), streams.generator("canaries")
    k = min(options.canaries, capacity(ctx, design, variant, streams.scope("capacity")))
    releases = math.ceil(2 * options.trials / k) if k else 0
    releases += releases % 2  # even: the two halves have the same size
    labels = np.zeros((releases, k), dtype=bool)
    scores: dict[str, list[np.ndarray]] = {s: [] for s in design.statistics}
    for r in tqdm(range(releases), desc=f"audit {variant}", unit="release", disable=not options.progress,
                  leave=False):
        n_in = k // 2 if r % 2 == 0 else k - k // 2  # half in, half out (alternating for odd k)
        labels[r, rng.choice(k, size=n_in, replace=False)] = True
        totals = run_sequence(ctx, design, variant, torch.from_numpy(labels[r]), streams.scope("release", r), gen)
        for name in design.statistics:
            scores[name].append(totals[name].numpy())
    return {name: np.stack(rows) for name, rows in scores.items() if rows}, labels


def require_finite(values: np.ndarray, what: str) -> None:
    """RunFailure when ``values`` hold NaN or infinity: a statistic of NaN is an error, never a PASS."""
    if not np.isfinite(values).all():
        raise RunFailure(f"audit: {what} hold NaN or infinite values; no bound can be read from them")


def run_tests(ctx: AuditContext, options: AuditOptions, delta: float) -> tuple[list[TestResult], list[str]]:
    """Every (variant, statistic) test of the defense's design, Bonferroni-corrected; and the variants
    skipped because no canary fits."""
    design = ctx.defense_cls.audit_design()
    streams = Streams(ctx.spec.seed).scope("audit")
    variants = design.variants(ctx.make_defense(streams.scope("probe")))
    alpha = ALPHA / (len(variants) * len(design.statistics))
    tests, skipped = [], []
    for variant in variants:
        scores, labels = audit_variant(ctx, design, variant, options, streams.scope(variant))
        if not scores:
            skipped.append(variant)
        for statistic, values in scores.items():
            require_finite(values, f"the audit's {variant}/{statistic} scores of {ctx.spec.defense_name}")
            tests.append(TestResult(variant, statistic, separation=separation(values, labels),
                                    trials_per_neighbour=int(labels.sum()),
                                    canaries=labels.shape[1], releases=labels.shape[0],
                                    **split_bound(values, labels, delta, alpha)))
    return tests, skipped


def run_audit(spec: RunSpec, options: AuditOptions | None = None, defense_cls: type | None = None) -> dict[str, Any]:
    """Audit ``spec``'s defense (or ``defense_cls`` with its parameters); returns the flat result
    (``audit.passed`` is the verdict)."""
    # the audit's tensors are small: one intra-op thread is fastest (and immune to oversubscription)
    with single_cpu_thread(resolve_device(spec.device)):
        return _run_audit(spec, options or AuditOptions(), defense_cls)


def _run_audit(spec: RunSpec, options: AuditOptions, defense_cls: type | None) -> dict[str, Any]:
    start = time.perf_counter()
    ctx = prepare_audit(spec, options, defense_cls)
    delta = spec.privacy.delta if spec.privacy.delta is not None else default_delta(len(ctx.task.train))
    accounted = ctx.make_defense(Streams(spec.seed).scope("audit", "probe")).accounted_noise_multiplier()
    # the audited releases: each a whole batch (q = 1), ``options.steps`` of them
    epsilon = PrivacyLedger(ctx.sigma, accounted, 1.0, options.steps, delta, spec.privacy.accountant,
                            ACCOUNTED_SAMPLING).epsilon
    tests, skipped = run_tests(ctx, options, delta)
    if not tests:
        raise RunFailure(f"audit: no canary fits any released coordinate of {spec.defense_name}")
    nan = [t.name for t in tests if math.isnan(t.epsilon_lower_bound) or math.isnan(t.separation)]
    if nan:  # an infinite μ̂ is a noise-free release, perfectly separated: a result; NaN never is
        raise RunFailure(f"audit: the {nan[0]} statistic of {spec.defense_name} is NaN; no bound can be read from it")
    best = max(tests, key=lambda t: t.epsilon_lower_bound)
    passed = best.epsilon_lower_bound <= epsilon
    return {
        "defense": spec.defense_name,
        **{f"defense.{k}": v for k, v in dataclasses.asdict(spec.defense).items()},
        "dataset": spec.data.name,
        "model": spec.model.name or "probe",
        "seed": spec.seed,
        "privacy.epsilon": epsilon,
        "privacy.delta": delta,
        "privacy.noise_multiplier": ctx.sigma,
        "privacy.accounted_noise_multiplier": accounted,
        "privacy.sample_rate": 1.0,
        "privacy.steps": options.steps,
        "privacy.accountant": spec.privacy.accountant,
        "privacy.mu": math.sqrt(options.steps) / accounted,
        "audit.epsilon_lower_bound": best.epsilon_lower_bound,
        "audit.statistic": best.name,
        "audit.passed": passed,
        "audit.verdict": BoundCheck.of(passed).value,
        "audit.trials": min(t.trials_per_neighbour for t in tests),
        "audit.canaries": options.canaries,
        "audit.canary_norm": CANARY_NORM,
        "audit.confidence": 1 - ALPHA,
        "audit.warmup_steps": ctx.warmup,
        "audit.epochs": ctx.epochs[ctx.warmup:],
        "audit.tests": [dataclasses.asdict(t) | {"name": t.name} for t in tests],
        "audit.skipped": skipped,
        "time.audit_s": time.perf_counter() - start,
    }
