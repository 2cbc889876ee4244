"""``dpeval audit --scope run``: a one-run audit of a whole training (Steinke, Nasr & Jagielski 2023).

The configured run is trained once, exactly as ``dpeval run`` trains it (same data, model, sampler, σ
calibration and accountant), with ``m`` white-box gradient canaries added to the private pool. Each canary
is included independently with probability 1/2; an included canary is a pool member like any other: with
Poisson sampling it joins each batch independently with the run's rate q, with shuffled batches it falls
into one uniformly random slot of each epoch's permutation (and, like any example, into the dropped
remainder with probability (N mod B)/N). When a canary is in a batch, its per-sample gradient — norm
``CANARY_NORM`` along its direction u_i, far above any clipping norm — enters the defense's own
``clip_and_accumulate`` beside the batch's real examples, before the step's ``release``.

Canary design: u_i = ±e_j, one coordinate of the flattened trainable parameters per canary (m distinct
coordinates, random signs, drawn from the audit's own stream); orthogonal, so one canary's gradient moves
no other canary's projection, and cheap. The auditor sees every release (the strongest threat model the
harness uses), puts it in noise units with the defense's audit design (``CanaryDesign.noise_units``: the
release over its noise std; AdaCliP's design also removes its public per-coordinate shift and scale), and
scores each canary with three statistics of its projections ⟨u_i, release_t⟩, higher = "in":

- ``sum``: Σ_t w_t ⟨u_i, release_t⟩, the canary's projection summed over all steps, each step weighted
  by 1/ŝ_t², ŝ_t the robust spread (1.4826 · median absolute deviation) of that step's released
  projections over all canaries — the likelihood-ratio statistic of a Gaussian mechanism whose noise may
  change over the run (a step released with little noise weighs more; the weights are measured, not taken
  from the defense's declared noise std);
- ``roughness``: Σ_t (⟨u_i, release_t⟩ − ⟨u_i, release_{t−1}⟩)²: fresh noise makes every canary's
  trajectory equally rough; noise that repeats between steps cancels in the differences, and then the
  steps where the canary is sampled stand out;
- ``mask``: the number of steps whose public mask (``SharedGradient.mask``) releases the canary's
  coordinate (constant, hence uninformative, for defenses without masks): a mask that follows the data
  keeps the coordinates of included canaries.

For each statistic and each guessing rule of ``GUESS_RULES`` (a fixed grid of (k+, k−) as fractions of m),
the auditor guesses "in" for the k+ highest scores and "out" for the k− lowest, abstains on the rest, and
counts the correct guesses; ``dpeval.core.statistics.one_run_epsilon_lower_bound`` turns (guesses,
correct) into an ε lower bound at δ = the run's δ with confidence 1 − β/K (K = statistics × rules,
Bonferroni), so the maximum over the K tests is a (1 − β) lower bound. The run passes when that maximum is
≤ the run's accounted ε. Every score is a function of what the auditor sees, so the bound is sound for any
defense whatever its statistic; the statistics only decide how much a broken one shows.

``kind="input"`` (``--canary-kind input``) is the black-box variant: input-space canaries (noise images with
random labels, :class:`InputCanaryPool`) sampled the same way, whose per-sample gradients at the current
weights enter the sum; the auditor sees only the final model and scores each canary by its negative loss.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from dpeval.audit.driver import check_auditable
from dpeval.core.canaries import CANARY_NORM, Canaries, flatten
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.one_run_bounds import ESTIMATORS, OneRunBound, OneRunBounds, one_run_bounds
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.runtime import resolve_device, single_cpu_thread
from dpeval.core.spec import RunSpec
from dpeval.core.streams import seed_globals
from dpeval.core.verdicts import BoundCheck
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Defense, SharedGradient
from dpeval.engine.training import TrainingObserver, accuracy, train

DEFAULT_RUN_CANARIES = 1000  # m: at δ = 1e-5 the δ term 2mδ stays small against β/K
ALPHA = 0.05                 # 1 − confidence of the reported (headline) bound
STATISTICS = ("sum", "roughness", "mask")
MIN_RELEASED = 8             # a step whose mask releases fewer canary coordinates gets no weight in ``sum``
# The estimators of each kind: the Gaussian pair models the white-box ``sum`` statistic (a sum of Gaussian noise
# projections); a black-box loss has no such model, so its input canaries get the two guessing analyses only.
KIND_ESTIMATORS = {"gradient": ESTIMATORS, "input": ("counting", "f-dp")}


KINDS = ("gradient", "input")  # white-box gradient canaries / black-box input canaries


@dataclass
class RunAuditOptions:
    canaries: int = DEFAULT_RUN_CANARIES
    kind: str = "gradient"
    progress: bool = False
    scores_path: Path | None = None  # where to write every canary's scores and inclusion bit (CSV)

    def validate(self) -> None:
        if self.canaries < 2:
            raise ConfigError(f"--canaries: must be an integer >= 2, got {self.canaries}")
        if self.kind not in KINDS:
            raise ConfigError(f"--canary-kind: must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def check_fits(self, parameters: int, pool: int) -> None:
        """Refuse, before training, m canaries the run cannot hold: gradient canaries take m distinct
        coordinates of the ``parameters`` trainable ones; input canaries join the ``pool`` members' batches,
        at most as many as they are (a batch then grows by at most about half, its per-sample gradients
        with it; far more would exhaust memory in the first step)."""
        m = self.canaries
        if self.kind == "gradient" and m > parameters:
            raise ConfigError(f"--canaries: at most one canary per trainable parameter ({parameters}), got {m}")
        if self.kind == "input" and m > pool:
            raise ConfigError(f"--canaries: at most one input canary per private example ({pool}), got {m}")


class CanaryPool(TrainingObserver):
    """The m canaries of one audited run: directions, inclusion, per-step sampling and what the auditor
    records of every release (the canaries' projections and whether the public mask released them); training
    shows it every step before and after the release."""

    def __init__(self, m: int, d: int, shapes: dict[str, torch.Size], names: list[str], sampling: str,
                 pool_size: int, batch_size: int, steps_per_epoch: int, rng: np.random.Generator,
                 device: torch.device, design: CanaryDesign) -> None:
        self.m, self.shapes, self.names, self.sampling = m, shapes, names, sampling
        self.n, self.batch_size, self.steps_per_epoch = pool_size, batch_size, steps_per_epoch
        self.rng = rng
        coords = torch.from_numpy(rng.choice(d, size=m, replace=False)).view(m, 1)
        signs = torch.from_numpy(rng.choice([-1.0, 1.0], size=m)).float().view(m, 1)
        self.canaries = Canaries(d, coords=coords.to(device), values=signs.to(device))
        self.included = rng.random(m) < 0.5
        self.slots: np.ndarray | None = None  # shuffle: each canary's batch in the current epoch
        self.epoch = -1
        self.sampled_count = np.zeros(m, dtype=np.int64)
        self.projections: list[np.ndarray] = []
        self.released: list[np.ndarray] = []
        self.device = device
        self.defense: Defense | None = None
        self.design = design

    def sampled(self, step: int, epoch: int) -> np.ndarray:
        """Which canaries are in this step's batch (only included ones ever are)."""
        if self.sampling == "poisson":
            return self.included & (self.rng.random(self.m) < self.batch_size / self.n)
        if epoch != self.epoch:  # a permutation of the pool per epoch: a uniformly random position each
            self.epoch = epoch
            self.slots = self.rng.integers(0, self.n, size=self.m) // self.batch_size
        return self.included & (self.slots == step - epoch * self.steps_per_epoch)

    def before_release(self, step: int, epoch: int, defense: Defense) -> None:
        self.defense = defense
        chosen = self.sampled(step, epoch)
        self.sampled_count += chosen
        if chosen.any():
            defense.clip_and_accumulate(self.canaries.gradients(torch.from_numpy(chosen).to(self.device),
                                                                self.shapes))

    def after_release(self, step: int, shared: SharedGradient) -> None:
        flat = self.design.noise_units(self.defense, shared).detach()
        self.projections.append(self.canaries.project(flat).double().cpu().numpy())
        if shared.mask is None:
            self.released.append(np.ones(self.m, dtype=bool))
        else:
            keep = flatten({n: m.detach() for n, m in shared.mask.items()}, self.names)
            self.released.append(keep[self.canaries.coords[:, 0]].bool().cpu().numpy())


class InputCanaryPool(CanaryPool):
    """Black-box variant: canary i is an input example — an image of uniform noise in the task's shape with
    a uniformly random label — included and sampled exactly like a gradient canary, whose per-sample
    gradient at the current weights (the run's per-sample engine) enters the defense's sum. The auditor
    sees only the final model and scores each canary by its negative loss (lower loss = "in")."""

    def __init__(self, m: int, model: torch.nn.Module, shape: tuple[int, ...], classes: int, sampling: str,
                 pool_size: int, batch_size: int, steps_per_epoch: int, rng: np.random.Generator,
                 device: torch.device, precision: str = "fp32") -> None:
        self.m, self.sampling, self.n, self.batch_size = m, sampling, pool_size, batch_size
        self.steps_per_epoch, self.rng, self.device = steps_per_epoch, rng, device
        self.x = torch.from_numpy(rng.random((m, *shape), dtype=np.float32)).to(device)
        self.y = torch.from_numpy(rng.integers(0, classes, size=m)).to(device)
        self.included = rng.random(m) < 0.5
        self.slots, self.epoch = None, -1
        self.sampled_count = np.zeros(m, dtype=np.int64)
        self.model = model
        self.psg = PerSampleGradients(model, precision=precision)  # as the pool's own examples (train.precision)

    def before_release(self, step: int, epoch: int, defense: Defense) -> None:
        chosen = self.sampled(step, epoch)
        self.sampled_count += chosen
        if chosen.any():
            index = torch.from_numpy(np.flatnonzero(chosen)).to(self.device)
            defense.clip_and_accumulate(self.psg(self.x[index], self.y[index]))

    def after_release(self, step: int, shared: SharedGradient) -> None:
        return None  # black box: the releases are not observed

    @torch.no_grad()
    def scores(self) -> dict[str, np.ndarray]:
        logits = self.model(self.x)
        loss = torch.nn.functional.cross_entropy(logits, self.y, reduction="none")
        return {"loss": (-loss).double().cpu().numpy()}


def robust_scale(values: np.ndarray) -> float:
    """1.4826 · median absolute deviation: the std of a Gaussian, unmoved by a minority of shifted values."""
    if len(values) == 0:
        return 0.0
    return 1.4826 * float(np.median(np.abs(values - np.median(values))))


def step_weights(values: np.ndarray, released: np.ndarray) -> np.ndarray:
    """1/ŝ_t² per step, ŝ_t the robust spread of the step's values over the canaries it released (0 for a
    step releasing fewer than ``MIN_RELEASED``; a noise-free step gets a huge but finite weight)."""
    scales = np.array([robust_scale(values[t, released[t]]) if released[t].sum() >= MIN_RELEASED else math.nan
                       for t in range(values.shape[0])])
    positive = scales[np.isfinite(scales) & (scales > 0)]
    floor = 1e-9 * (float(np.median(positive)) if len(positive) else 1.0)
    return np.where(np.isfinite(scales), 1.0 / np.maximum(np.nan_to_num(scales), floor) ** 2, 0.0)


def canary_scores(projections: np.ndarray, released: np.ndarray) -> dict[str, np.ndarray]:
    """The three statistics (module docstring) from the [T, m] projections and released flags."""
    steps, m = projections.shape
    shown = np.where(released, projections, 0.0)
    weighted = (step_weights(shown, released)[:, None] * shown).sum(axis=0)
    if steps > 1:
        both = released[1:] & released[:-1]
        jumps = np.diff(shown, axis=0)
        rough = (step_weights(jumps, both)[:, None] * np.where(both, jumps, 0.0) ** 2).sum(axis=0)
    else:
        rough = np.zeros(m)
    return {"sum": weighted, "roughness": rough, "mask": released.sum(axis=0).astype(float)}


def judge(scores: dict[str, np.ndarray], included: np.ndarray, delta: float, rng: np.random.Generator,
          kind: str = "gradient", alpha: float = ALPHA) -> OneRunBounds:
    """Every estimator of ``kind`` on the same scores (``dpeval.core.one_run_bounds``): the counting and f-DP
    tests over every (statistic, guessing rule), the Gaussian pair on ``sum``; β split over the estimators, so
    the strongest valid bound is a (1 − α) lower bound."""
    for name, values in scores.items():
        if not np.isfinite(values).all():
            raise RunFailure(f"audit: {int((~np.isfinite(values)).sum())} canary score(s) of statistic {name!r} are "
                             f"NaN or infinite (the releases or the model hold non-finite values); no bound can be "
                             f"computed from them")
    estimators = KIND_ESTIMATORS[kind]
    return one_run_bounds(scores, included, delta, confidence=1 - alpha, estimators=estimators,
                          pair_statistics=("sum",) if "gaussian-pair" in estimators else None, rng=rng)


def bound_row(bound: OneRunBound) -> dict[str, Any]:
    """One estimator's bound as stored: ε, μ (GDP estimators), confidence, the test behind it, validity."""
    return {"epsilon_lower_bound": bound.epsilon_lower_bound, "mu_lower_bound": bound.mu_lower_bound,
            "confidence": bound.confidence, "statistic": bound.statistic, "guesses_in": bound.k_in,
            "guesses_out": bound.k_out, "correct": bound.correct, "valid": bound.valid, "refused": bound.refused,
            "assumption": bound.assumption}


def save_scores(path: Path, scores: dict[str, np.ndarray], included: np.ndarray) -> None:
    """Every canary's scores and inclusion bit as CSV (``canary,included,<statistic>...``): what
    ``dpeval.one_run_bounds`` takes, so a saved run can be re-analysed."""
    names = list(scores)
    table = np.column_stack([np.arange(len(included)), included.astype(int)] + [scores[n] for n in names])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, table, delimiter=",", header=",".join(["canary", "included", *names]), comments="",
               fmt=["%d", "%d"] + ["%.17g"] * len(names))


def run_scope_audit(spec: RunSpec, options: RunAuditOptions | None = None, defense_cls: type | None = None,
                    plan: Callable | None = None) -> dict[str, Any]:
    """Train ``spec``'s run once with canaries and audit it; ``defense_cls`` / ``plan`` replace the
    registry's defense class and the privacy planner (the tests plant broken ones)."""
    options = options or RunAuditOptions()
    with single_cpu_thread(resolve_device(spec.device)):
        return _run_scope_audit(spec, options, defense_cls, plan)


def _run_scope_audit(spec: RunSpec, options: RunAuditOptions, defense_cls: type | None,
                     plan: Callable | None) -> dict[str, Any]:
    from dpeval.runner import base_metrics, prepare  # the run exactly as ``dpeval run`` prepares it
    from dpeval.victims import DefenseTrained

    start = time.perf_counter()
    options.validate()
    prep = prepare(spec, source=DefenseTrained(defense_cls, plan))
    privacy = prep.privacy
    if not math.isfinite(privacy.epsilon):
        raise ConfigError(f"defense: {spec.defense_name!r} (with these parameters) is not a DP mechanism "
                          f"(ε = inf): there is no accounted ε to audit")
    audit_streams = prep.streams.scope("audit", "run")
    shapes = {n: p.shape for n, p in prep.model.named_parameters() if p.requires_grad}
    names = list(shapes)
    d = sum(math.prod(s) for s in shapes.values())
    options.check_fits(d, len(prep.task.train))
    seed_globals(prep.streams)
    defense = prep.make_defense(prep.streams.scope("victim"))
    if options.kind != "input":  # gradient canaries go through the defense's canary design
        check_auditable(type(defense), spec.defense_name)
    rng = audit_streams.numpy("canaries")
    if options.kind == "input":
        pool: CanaryPool = InputCanaryPool(options.canaries, prep.model, tuple(prep.task.shape),
                                           prep.task.num_classes, spec.train.sampling, len(prep.task.train),
                                           spec.train.batch_size, prep.sampler.steps_per_epoch, rng, prep.device,
                                           spec.train.precision)
        design = (f"black-box input canaries: {options.canaries} uniform-noise images with random labels, each "
                  f"included with probability 1/2 and sampled like a pool member ({spec.train.sampling}); "
                  f"scored by the final model's loss")
    else:
        pool = CanaryPool(options.canaries, d, shapes, names, spec.train.sampling, len(prep.task.train),
                          spec.train.batch_size, prep.sampler.steps_per_epoch, rng, prep.device,
                          defense.audit_design())
        design = (f"white-box gradient canaries: ±e_j on {options.canaries} distinct random coordinates of the "
                  f"{d} trainable parameters, norm {CANARY_NORM:g} (clipped by the defense), each included with "
                  f"probability 1/2 and sampled like a pool member ({spec.train.sampling}); scored on every release")
    result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler, prep.device,
                   progress=options.progress, observer=pool)
    if options.kind == "input":
        scores = pool.scores()
    else:
        scores = canary_scores(np.stack(pool.projections), np.stack(pool.released))
    bounds = judge(scores, pool.included, privacy.delta, audit_streams.numpy("canaries", 1), options.kind)
    headline = bounds.best
    assert headline is not None  # the counting bound is always valid
    counting = bounds.bounds["counting"]
    passed = headline.epsilon_lower_bound <= privacy.epsilon
    if options.scores_path is not None:
        save_scores(options.scores_path, scores, pool.included)
    metrics = base_metrics(prep)
    keep = ("defense", "dataset", "model", "seed") + tuple(k for k in metrics if k.startswith(("defense.", "privacy.")))
    out = {k: metrics[k] for k in keep if k in metrics}
    out.update({
        "audit.scope": "run",
        "audit.epsilon_lower_bound": headline.epsilon_lower_bound,
        "audit.estimator": headline.estimator,
        "audit.mu_lower_bound": headline.mu_lower_bound,
        "audit.bounds": {name: bound_row(b) for name, b in bounds.bounds.items()},
        # the guesses of the counting bound (the f-DP bound judges the same guesses; the pair uses every score)
        "audit.statistic": counting.statistic,
        "audit.guesses": counting.k_in + counting.k_out,
        "audit.guesses_in": counting.k_in,
        "audit.guesses_out": counting.k_out,
        "audit.correct": counting.correct,
        "audit.passed": passed,
        "audit.verdict": BoundCheck.of(passed).value,
        "audit.canaries": options.canaries,
        "audit.canaries_included": int(pool.included.sum()),
        "audit.canary_kind": options.kind,
        "audit.canary_design": design,
        "audit.canary_norm": CANARY_NORM,
        "audit.mean_samplings_included": (float(pool.sampled_count[pool.included].mean())
                                          if pool.included.any() else 0.0),
        "audit.confidence": 1 - ALPHA,
        "audit.tests": [dataclasses.asdict(t) | {"guesses": t.guesses} for t in bounds.tests],
        "utility.test_accuracy": result.history[-1]["test_accuracy"] if result.history else math.nan,
        "utility.train_accuracy": accuracy(prep.model, prep.task.train, prep.device),
        "time.train_s": result.train_s,
        "time.audit_s": time.perf_counter() - start,
    })
    return out
