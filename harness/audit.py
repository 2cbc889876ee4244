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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from attacks.gradient_common import single_cpu_thread
from attacks.membership_metrics import bound_at, clopper_pearson
from defenses import DEFENSES, Defense, SharedGradient
from defenses.adaclip import AdaCliP
from defenses.gep import GEP
from defenses.masking import MaskedDPSGD
from harness.accounting import default_delta, epsilon_for
from harness.config import RunSpec
from harness.data import Task, load_task
from harness.errors import ConfigError, RunFailure
from harness.models import build_model
from harness.runner import resolve_device, seed_everything
from harness.training import make_optimizer

DEFAULT_NOISE_MULTIPLIER = 2.0   # accounted σ of each audited step: μ = 0.5 per step
DEFAULT_TRIALS = 100_000         # trials per neighbour (with / without the canary)
DEFAULT_STEPS = 2                # audited consecutive steps (stateful defenses need >= 2)
DEFAULT_CANARIES = 512           # canaries per release (orthogonal directions), capped by the defense
CANARY_NORM = 1e6                # ‖canary gradient‖: far above any clipping norm
ALPHA = 0.05                     # 1 − confidence of the reported bound
WARMUP_STEPS = 1                 # steps with no private data before the audited ones
MAX_THRESHOLDS = 1024            # candidate thresholds (quantiles of the choosing half)


# ---------------------------------------------------------------------------------------------------
# flattening: canaries live in the flattened parameter vector (``param_shapes`` order)


def flatten(tensors: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].reshape(-1) for n in names])


def unflatten_rows(rows: torch.Tensor, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """[b, d] → {name: [b, *shape]} (per-sample gradients as the defense receives them)."""
    out, start = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = rows[:, start:start + n].reshape(rows.shape[0], *shape)
        start += n
    return out


@dataclass
class Canaries:
    """``k`` orthonormal canary directions for one step: dense [k, d] rows, or sparse rows given by flat
    ``coords`` [k, m] and ``values`` [k, m] (axis canaries: cheap for large models). ``parts`` are named
    dense unit components a statistic projects on (GEP: the in-subspace and residual parts); ``carried``
    is a per-canary score about the previous step's canaries seen in this step's public state."""

    d: int
    dense: torch.Tensor | None = None
    coords: torch.Tensor | None = None
    values: torch.Tensor | None = None
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    carried: torch.Tensor | None = None  # a per-canary score carried over from the previous step

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """⟨u_i, x⟩ for every canary: [k]."""
        if self.dense is not None:
            return self.dense @ x
        return (x[self.coords] * self.values).sum(dim=1)

    def energy_in(self, lo: int, hi: int, basis: torch.Tensor) -> torch.Tensor:
        """‖basisᵀ u_i[lo:hi]‖² for every canary (dense canaries only)."""
        return (self.dense[:, lo:hi] @ basis).pow(2).sum(dim=1)

    def gradients(self, included: torch.Tensor, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
        """Per-sample gradients CANARY_NORM·u_i of the included canaries, as the defense receives them."""
        if self.dense is not None:
            rows = CANARY_NORM * self.dense[included]
        else:
            coords, values = self.coords[included], self.values[included]
            rows = torch.zeros(coords.shape[0], self.d, device=values.device)
            rows.scatter_(1, coords, CANARY_NORM * values)
        return unflatten_rows(rows, shapes)


def axis_canaries(coords: torch.Tensor, d: int, device: torch.device) -> Canaries:
    """Canary i = Σ_j e_{coords[i, j]} / √m (m coordinates each; all coordinates distinct)."""
    coords = coords.reshape(coords.shape[0], -1).to(device)
    values = torch.full(coords.shape, 1 / math.sqrt(coords.shape[1]), device=device)
    return Canaries(d, coords=coords, values=values)


def pick(pool: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """``k`` distinct entries of ``pool`` uniformly at random."""
    order = torch.randperm(len(pool), generator=gen)[:k]
    return pool[order.to(pool.device)]


# ---------------------------------------------------------------------------------------------------
# canary designs and statistics, one per defense family (chosen by class, so subclasses inherit them)


class CanaryDesign:
    """Axis canaries and the projection statistic: score = ⟨release, u⟩ / noise_std, summed over steps
    (the likelihood-ratio test for a Gaussian mechanism). A defense that clips several parameter groups
    separately (``Defense.clipping()``, e.g. ``groupwise``) gets canaries spread equally over its groups,
    so that every group is clipped at its full bound (the worst case)."""

    statistics: ClassVar[tuple[str, ...]] = ("projection",)
    fixed_directions: ClassVar[bool] = True  # the same directions at every audited step

    def variants(self, defense: Defense) -> tuple[str, ...]:
        return ("released",)

    def _groups(self, defense: Defense) -> list[torch.Tensor]:
        """Flat coordinate ranges of the clipping groups (one group = all coordinates)."""
        names = list(defense.param_shapes)
        starts = np.cumsum([0] + [math.prod(s) for s in defense.param_shapes.values()])
        where = {n: torch.arange(int(starts[i]), int(starts[i + 1])) for i, n in enumerate(names)}
        clipping = defense.clipping()
        if clipping is None:
            return [torch.arange(int(starts[-1]))]
        return [torch.cat([where[n] for n in group]) for group in clipping.groups]

    def capacity(self, defense: Defense, variant: str) -> int:
        return min(len(g) for g in self._groups(defense))

    def design(self, defense: Defense, variant: str, k: int, gen: torch.Generator,
               previous: Canaries | None) -> Canaries:
        if previous is not None and self.fixed_directions:
            return previous
        coords = torch.stack([pick(g, k, gen) for g in self._groups(defense)], dim=1)
        return axis_canaries(coords, sum(math.prod(s) for s in defense.param_shapes.values()), defense.device)

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        released = flatten(shared.grads, list(defense.param_shapes))
        return {"projection": canaries.project(released) / shared.noise_std}


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


class GEPDesign(CanaryDesign):
    """GEP: the canary is (v + w)/√2 with v a column of the step's public anchor basis V and w a unit
    vector orthogonal to V, so both the embedding (clipped to C0) and the residual (clipped to C1) carry a
    full-norm contribution — the worst case of the joint release. ``projection``: ⟨V·θ̃, v⟩/std_emb +
    ⟨r̃, w⟩/std_res, with θ̃, V and the stds from the release; ``anchors``: the energy ‖P_V' u‖² of the
    canary in the subspace of the *released* bases V' (constant when V' is public, as it must be)."""

    statistics = ("projection", "anchors")
    fixed_directions = False

    def _bases(self, defense: GEP) -> list[torch.Tensor]:
        defense._ensure_bases()  # the defense's own schedule: the bases this step will use (public data)
        return defense.bases

    def capacity(self, defense: Defense, variant: str) -> int:
        bases = self._bases(defense)
        return sum(min(v.shape[1], (hi - lo) - v.shape[1]) for (lo, hi), v in zip(defense.bounds, bases))

    def design(self, defense: Defense, variant: str, k: int, gen: torch.Generator,
               previous: Canaries | None) -> Canaries:
        bases = self._bases(defense)
        room = [min(v.shape[1], (hi - lo) - v.shape[1]) for (lo, hi), v in zip(defense.bounds, bases)]
        slot_group = torch.repeat_interleave(torch.arange(len(room)), torch.tensor(room))
        slot_col = torch.cat([torch.arange(r) for r in room])
        chosen = torch.randperm(len(slot_group), generator=gen)[:k]
        span = torch.zeros(k, defense.d, device=defense.device)
        resid = torch.zeros(k, defense.d, device=defense.device)
        for g, ((lo, hi), v) in enumerate(zip(defense.bounds, bases)):
            rows = torch.nonzero(slot_group[chosen] == g).flatten()
            if len(rows) == 0:
                continue
            w = torch.randn(hi - lo, len(rows), generator=gen).to(v.device)
            w = torch.linalg.qr(w - v @ (v.T @ w)).Q  # orthonormal columns orthogonal to span(V_g)
            span[rows.to(v.device), lo:hi] = v[:, slot_col[chosen[rows]].to(v.device)].T
            resid[rows.to(v.device), lo:hi] = w.T
        return Canaries(defense.d, dense=(span + resid) / math.sqrt(2.0),
                        parts={"embedding": span, "residual": resid})

    def score(self, defense: Defense, shared: SharedGradient, canaries: Canaries) -> dict[str, torch.Tensor]:
        extra = shared.extra
        bases, groups, emb = extra["gep.bases"], extra["gep.groups"], extra["gep.embedding"]
        flat = flatten(shared.grads, extra["gep.param_order"])
        lifted = torch.zeros_like(flat)
        anchors = torch.zeros(canaries.dense.shape[0], device=flat.device)
        start = 0
        for (lo, hi), v in zip(groups, bases):
            lifted[lo:hi] = v @ emb[start:start + v.shape[1]]
            anchors += canaries.energy_in(lo, hi, v)
            start += v.shape[1]
        score = canaries.parts["embedding"] @ lifted / extra["gep.noise_std_embedding"]
        if extra["gep.noise_std_residual"] > 0:  # B-GEP releases no residual
            score = score + canaries.parts["residual"] @ (flat - lifted) / extra["gep.noise_std_residual"]
        return {"projection": score, "anchors": anchors}


DESIGNS: list[tuple[type, CanaryDesign]] = [
    (GEP, GEPDesign()),
    (AdaCliP, AdaCliPDesign()),
    (MaskedDPSGD, MaskedDesign()),
    (Defense, CanaryDesign()),
]


def design_for(defense_cls: type) -> CanaryDesign:
    return next(design for cls, design in DESIGNS if issubclass(defense_cls, cls))


# ---------------------------------------------------------------------------------------------------
# the audited release sequences

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

    def make_defense(self, seed: int) -> Defense:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        defense = self.defense_cls(self.spec.defense, self.shapes, self.sigma, gen, self.device)
        defense.steps_per_epoch = 1  # each step is the first of its epoch
        self.model.load_state_dict(self.init_state)
        defense.bind(self.model, self.task)
        return defense


def model_step(model: nn.Module, optimizer: torch.optim.Optimizer, shared: SharedGradient) -> None:
    """The training loop's update: the release becomes the gradient (post-processing)."""
    params = dict(model.named_parameters())
    for name, value in shared.grads.items():
        params[name].grad = value.to(params[name].dtype)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run_sequence(ctx: AuditContext, design: CanaryDesign, variant: str, included: torch.Tensor, seed: int,
                 gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One fresh defense: warm-up, then the audited steps with the ``included`` canaries in every batch.
    Returns each statistic's score per canary, summed over the audited steps."""
    defense = ctx.make_defense(seed)
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
        shared = defense.release(ctx.spec.train.batch_size)
        if audited:
            for name, score in design.score(defense, shared, canaries).items():
                totals[name] = totals.get(name, 0) + score.detach().double().cpu()
        if step < len(ctx.epochs) - 1:
            model_step(ctx.model, optimizer, shared)
    return totals


def capacity(ctx: AuditContext, design: CanaryDesign, variant: str, seed: int) -> int:
    """How many orthogonal canaries fit at every audited step (a dry sequence without private data)."""
    defense = ctx.make_defense(seed)
    optimizer = make_optimizer(ctx.model, ctx.spec.train)
    room = []
    for step, epoch in enumerate(ctx.epochs):
        defense.begin_epoch(epoch, ctx.spec.train.epochs)
        if step >= ctx.warmup:
            room.append(design.capacity(defense, variant))
        shared = defense.release(ctx.spec.train.batch_size)
        if step < len(ctx.epochs) - 1:
            model_step(ctx.model, optimizer, shared)
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


def rates_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[int, int, int, int]:
    """(true positives, members, false positives, non-members) of the test ``score >= threshold``."""
    hit = scores >= threshold
    return int((hit & labels).sum()), int(labels.sum()), int((hit & ~labels).sum()), int((~labels).sum())


def split_bound(scores: np.ndarray, labels: np.ndarray, delta: float, alpha: float) -> dict[str, Any]:
    """Pick the threshold maximising the bound on the first half of the releases (rows), evaluate it on
    the second half. ``epsilon_from_rates`` covers both directions of the test (score ≥ t and score < t)."""
    half = scores.shape[0] // 2
    choose_s, choose_l = scores[:half].ravel(), labels[:half].ravel()
    judge_s, judge_l = scores[half:].ravel(), labels[half:].ravel()
    candidates = np.unique(np.quantile(choose_s, np.linspace(0, 1, MAX_THRESHOLDS)))
    threshold = float(max(candidates, key=lambda t: bound_at(choose_s, choose_l, t, delta, alpha)))
    tp, pos, fp, neg = rates_at(judge_s, judge_l, threshold)
    return {
        "epsilon_lower_bound": bound_at(judge_s, judge_l, threshold, delta, alpha),
        "threshold": threshold,
        "tpr": tp / max(pos, 1), "fpr": fp / max(neg, 1),
        "tpr_ci": clopper_pearson(tp, pos, alpha), "fpr_ci": clopper_pearson(fp, neg, alpha),
    }


def separation(scores: np.ndarray, labels: np.ndarray) -> float:
    """Standardised mean shift μ̂ of the scores: for the projection statistic of a Gaussian mechanism it
    estimates the mechanism's μ (= √T/σ at full sensitivity), so μ̂ ≈ √T/σ shows the canary is worst case."""
    shift = float(scores[labels].mean() - scores[~labels].mean())
    spread = float(scores[~labels].std())
    if spread == 0:
        return 0.0 if shift == 0 else math.copysign(math.inf, shift)
    return shift / spread


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
        if self.trials < 2:
            raise ConfigError(f"--trials: must be an integer >= 2, got {self.trials}")
        if self.steps < 1:
            raise ConfigError(f"--steps: must be an integer >= 1, got {self.steps}")
        if self.canaries < 1:
            raise ConfigError(f"--canaries: must be an integer >= 1, got {self.canaries}")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ConfigError(f"--noise-multiplier: must be a number > 0, got {self.noise_multiplier}")


def dp_defense_names() -> list[str]:
    return [n for n in DEFENSES.names() if DEFENSES.get(n).is_dp(DEFENSES.get(n).Params())]


def prepare_audit(spec: RunSpec, options: AuditOptions, defense_cls: type | None = None) -> AuditContext:
    """Check the input (ConfigError on anything wrong) and build the probe: the task and the probe model
    (``model.name`` when given). ``defense_cls`` overrides the registry's class for ``spec.defense_name``
    (e.g. a subclass under test); it takes the same parameters."""
    options.validate()
    defense_cls = defense_cls or DEFENSES.get(spec.defense_name, field="defense")
    if not defense_cls.is_dp(spec.defense):
        raise ConfigError(f"defense: {spec.defense_name!r} (with these parameters) is not a DP mechanism "
                          f"(ε = inf): there is no accounted ε to audit; choose one of {', '.join(dp_defense_names())}")
    if options.steps > spec.train.epochs:
        raise ConfigError(f"--steps: the audited steps are the first steps of the last epochs, so at most "
                          f"train.epochs ({spec.train.epochs}); got {options.steps}")
    device = resolve_device(spec.device)
    task = load_task(spec.data)
    defense_cls.check_task(spec.defense, task)
    seed_everything(spec.seed)
    if spec.model.name is None:
        model = probe_model(task).to(device)
    else:
        model = build_model(spec.model.name, task.shape, task.num_classes, task.mean, task.std).to(device)
    defense_cls.check_model(spec.defense, model)
    epochs = spec.train.epochs
    warmup = min(WARMUP_STEPS, epochs - options.steps)
    schedule = list(range(epochs - options.steps - warmup, epochs))
    sigma = defense_cls.noise_for_accounted(options.noise_multiplier)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return AuditContext(spec, defense_cls, task, model, init, sigma, schedule, warmup, device)


def audit_variant(ctx: AuditContext, design: CanaryDesign, variant: str, options: AuditOptions,
                  rng: np.random.Generator, gen: torch.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Scores [releases, k] per statistic and membership labels [releases, k] of one canary variant
    (no releases when no canary fits, e.g. masked coordinates of a dense mask)."""
    k = min(options.canaries, capacity(ctx, design, variant, int(rng.integers(2**62))))
    releases = math.ceil(2 * options.trials / k) if k else 0
    releases += releases % 2  # even: the two halves have the same size
    labels = np.zeros((releases, k), dtype=bool)
    scores: dict[str, list[np.ndarray]] = {s: [] for s in design.statistics}
    for r in tqdm(range(releases), desc=f"audit {variant}", unit="release", disable=not options.progress,
                  leave=False):
        n_in = k // 2 if r % 2 == 0 else k - k // 2  # half in, half out (alternating for odd k)
        labels[r, rng.choice(k, size=n_in, replace=False)] = True
        totals = run_sequence(ctx, design, variant, torch.from_numpy(labels[r]), int(rng.integers(2**62)), gen)
        for name in design.statistics:
            scores[name].append(totals[name].numpy())
    return {name: np.stack(rows) for name, rows in scores.items() if rows}, labels


def run_tests(ctx: AuditContext, options: AuditOptions, delta: float) -> tuple[list[TestResult], list[str]]:
    """Every (variant, statistic) test of the defense's design, Bonferroni-corrected; and the variants
    skipped because no canary fits."""
    design = design_for(ctx.defense_cls)
    rng = np.random.default_rng(ctx.spec.seed)
    gen = torch.Generator().manual_seed(ctx.spec.seed)
    variants = design.variants(ctx.make_defense(0))
    alpha = ALPHA / (len(variants) * len(design.statistics))
    tests, skipped = [], []
    for variant in variants:
        scores, labels = audit_variant(ctx, design, variant, options, rng, gen)
        if not scores:
            skipped.append(variant)
        for statistic, values in scores.items():
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
    accounted = ctx.make_defense(0).accounted_noise_multiplier()
    epsilon = epsilon_for(accounted, 1.0, options.steps, delta, spec.privacy.accountant)
    tests, skipped = run_tests(ctx, options, delta)
    if not tests:
        raise RunFailure(f"audit: no canary fits any released coordinate of {spec.defense_name}")
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
        "audit.verdict": "PASS" if passed else "FAIL",
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


def format_audit(result: dict[str, Any]) -> str:
    """The terminal view: both numbers, the verdict, and one line per test."""
    r = result
    head = (f"audit of {r['defense']} ({r['dataset']} / {r['model']}, seed {r['seed']}): "
            f"{r['privacy.steps']} step(s) at sample rate 1, accounted σ = {r['privacy.accounted_noise_multiplier']:.4g} "
            f"(the defense adds σ = {r['privacy.noise_multiplier']:.4g})")
    numbers = (f"  ε_LB = {r['audit.epsilon_lower_bound']:.3f}   ε = {r['privacy.epsilon']:.3f}   "
               f"δ = {r['privacy.delta']:.3g}   ({r['privacy.accountant']} accountant, "
               f"{r['audit.confidence']:.0%} confidence)")
    trials = (f"  statistic {r['audit.statistic']}; accountant's Gaussian μ = √T/σ = {r['privacy.mu']:.3f}; "
              f"{r['audit.trials']} trials per neighbour "
              f"(up to {r['audit.canaries']} canaries per release); {r['time.audit_s']:.1f} s")
    lines = [head, numbers, trials]
    for t in r["audit.tests"]:
        lines.append(f"    {t['name']:<22} ε_LB {t['epsilon_lower_bound']:.3f}  TPR {t['tpr']:.4f} "
                     f"[{t['tpr_ci'][0]:.4f}, {t['tpr_ci'][1]:.4f}]  FPR {t['fpr']:.4f} "
                     f"[{t['fpr_ci'][0]:.4f}, {t['fpr_ci'][1]:.4f}]  μ̂ {t['separation']:.3f}  ({t['canaries']} canaries × "
                     f"{t['releases']} releases)")
    for variant in r["audit.skipped"]:
        lines.append(f"    {variant + '/*':<22} skipped: no such coordinates at an audited step")
    if r["audit.passed"]:
        lines.append("  PASS: ε_LB ≤ ε")
    else:
        lines.append("  FAIL: ε_LB > ε: the release leaks more than the accountant's ε allows")
    return "\n".join(lines)
