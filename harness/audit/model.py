"""``dpeval audit --scope model``: a worst-case audit of the final model (after Annamalai & De Cristofaro,
"Nearly Tight Black-Box Auditing of Differentially Private Machine Learning", NeurIPS 2024).

The game. DP-SGD's guarantee holds for any initial parameters, so the auditor picks them: K models start from
ONE fixed θ₀ and train on the same private pool D through the defense's own training path (per-sample
gradients → ``clip_and_accumulate`` → ``release`` → optimizer step, ``dpeval.engine.shadow_training``); exactly
half of them also train on a target record (balanced within each half of the models, the halves below). The
auditor then sees only each final model θ_T (never a release) and scores it, higher = "the target was in":

- ``loss`` (black box): −ℓ(target; θ_T);
- ``projection`` (white box, final model only): ⟨θ_T − θ₀, −∇ℓ(target; θ₀)⟩ over the trainable parameters.

Both are functions of θ_T and of things fixed before training (θ₀, the target), so any bound computed from them
is a bound on the release of the final model.

Sampling. ``full`` (the anchor's setting): every step sees every record (q = 1), one step per epoch, T =
``train.epochs``; the defense's release divides by the pool size N (``release(N)``, what its mechanism expects
of a batch of N), and with SGD the learning rate is multiplied by N so that the step is lr × the SUM of clipped
gradients and noise (Adam does not depend on the gradient's scale: its lr is kept). ``run``: the run's own
Poisson sampler at q = B/N (N the pool without the target, for the models with and without it alike) and its
steps. The accounted ε is the run's accountant at that q and T, with σ calibrated for ``privacy.epsilon`` at
them (or ``privacy.noise_multiplier`` as given).

Estimators (each statistic × each estimator is one test, at level α/4, Bonferroni, so the headline — the
largest bound — is a (1 − α) lower bound). The threshold of every test is chosen on the first half of the
models and judged on the second half (models are independent given their membership, so the judged rates are
binomial):

- ``clopper-pearson``: ``dpeval.core.statistics.split_bound``: ε ≥ ln((TPR_lo − δ)/FPR_hi) (and the complement
  test); valid for any (ε, δ)-DP mechanism;
- ``gdp``: at the threshold maximising μ_LB (below) on the first half, Clopper–Pearson upper bounds on FPR and
  FNR on the second half give μ_LB = Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi) (clipped at 0: a μ-GDP mechanism has
  FNR ≥ Φ(Φ⁻¹(1 − FPR) − μ) for every test), read as ε = ε_μ(δ) (Nasr et al. 2023, eq. 6 style). The μ bound
  holds for any μ-GDP mechanism; the ε reading assumes a Gaussian privacy curve (docs/audit.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy import special
from torch import nn
from tqdm import tqdm

from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.one_run_bounds import gdp_epsilon
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Split, Task
from dpeval.core.statistics import (
    MAX_THRESHOLDS,
    clopper_pearson,
    clopper_pearson_ends,
    rates_at,
    separation,
    split_bound,
)
from dpeval.core.streams import Streams, seed_globals
from dpeval.core.verdicts import BoundCheck
from dpeval.engine.shadow_training import train_shadows, train_shadows_sequential
from dpeval.engine.training import BatchSampler, FixedRateSampler

DEFAULT_MODELS = 200
MIN_MODELS, MAX_MODELS = 20, 10_000
ALPHA = 0.05                                  # 1 − confidence of the headline
STATISTICS = ("loss", "projection")
ESTIMATORS = ("clopper-pearson", "gdp")
SAMPLINGS = ("full", "run")
TRAININGS = ("auto", "sequential", "together")
CRAFT = {"epochs": 5, "lr": 0.01, "batch_size": 32, "optimizer": "sgd", "momentum": 0.0}  # the anchor's recipe
CLIPBKD_ROWS = 10_000                         # the principal components of at most this many pool records
GROUP_BYTES = 1 << 30                         # per-sample gradients of one group of models trained together


@dataclass
class ModelAuditOptions:
    models: int = DEFAULT_MODELS
    init: str = "random"      # random | crafted | a state-dict file
    target: str = "blank"     # blank | clipbkd | an index into the private pool | a .pt / .npz file with x, y
    sampling: str = "full"    # full | run
    progress: bool = False
    training: str = "auto"    # sequential | together | auto (sequential on the CPU, together on CUDA)
    group: int = 0            # together: models per group (0: as many as GROUP_BYTES of per-sample gradients hold)
    keep: Path | None = None  # keep each finished model here; a later audit of the same settings loads them

    def validate(self) -> None:
        """Everything that can be checked without the data (ConfigError in one line)."""
        if not MIN_MODELS <= self.models <= MAX_MODELS:
            raise ConfigError(f"--models: must be an integer from {MIN_MODELS} to {MAX_MODELS:,} (half of them judge "
                              f"the other half's threshold), got {self.models}")
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"--sampling: must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        if self.init not in ("random", "crafted") and not Path(self.init).is_file():
            raise ConfigError(f"--init: must be random, crafted or a state-dict file; {self.init!r} is no file")
        if self.target not in ("blank", "clipbkd") and not _is_index(self.target) and not Path(self.target).is_file():
            raise ConfigError(f"--target: must be blank, clipbkd, an index into the private pool or a .pt / .npz "
                              f"file with x and y; {self.target!r} is none of them")
        if self.training not in TRAININGS:
            raise ConfigError(f"--training: must be one of {', '.join(TRAININGS)}, got {self.training!r}")
        if self.group < 0:
            raise ConfigError(f"group: must be >= 0, got {self.group}")
        if self.keep is not None and self.keep.exists() and not self.keep.is_dir():
            raise ConfigError(f"--keep-models: {self.keep} exists and is not a folder")


def _is_index(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()


# ---------------------------------------------------------------------------------------------------
# the target record and the initial parameters


@dataclass
class Target:
    x: torch.Tensor            # the record's input, the task's shape, pixel scale
    y: int | None              # its label (clipbkd: chosen under θ₀, later)
    description: dict[str, Any]


def without(split: Split, index: int) -> Split:
    keep = torch.ones(len(split), dtype=torch.bool)
    keep[index] = False
    return Split(split.x[keep], split.y[keep], split.source_index[keep])


def choose_target(kind: str, task: Task) -> tuple[Target, Task]:
    """The target and the task whose private pool D the models share (an INDEX target leaves it)."""
    shape = tuple(task.shape)
    if kind == "blank":
        return Target(torch.zeros(shape), task.num_classes - 1,
                      {"kind": "blank", "description": "all-zero input, label = the last class"}), task
    if kind == "clipbkd":
        if task.vocab is not None:
            raise ConfigError("--target: clipbkd needs image data (token data has no principal components); use "
                              "blank, an index or a file")
        return Target(clipbkd_input(task.train.x), None, {"kind": "clipbkd"}), task
    if _is_index(kind):
        index = int(kind)
        if not 0 <= index < len(task.train):
            raise ConfigError(f"--target: an index into the private pool must be from 0 to {len(task.train) - 1}, "
                              f"got {index}")
        record = Target(task.train.x[index].clone(), int(task.train.y[index]),
                        {"kind": "index", "index": index, "source_index": int(task.train.source_index[index]),
                         "description": "a record of the private pool, removed from the pool every model shares"})
        return record, dataclasses.replace(task, train=without(task.train, index))
    return read_target(Path(kind), task), task


def read_target(path: Path, task: Task) -> Target:
    """A record from a file: ``.npz`` (read without pickles) or a tensors-only ``.pt``, keys ``x`` and ``y``."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                x, y = torch.as_tensor(data["x"]), torch.as_tensor(data["y"])
        else:
            data = torch.load(path, weights_only=True, map_location="cpu")
            x, y = torch.as_tensor(data["x"]), torch.as_tensor(data["y"])
    except Exception as exc:  # a missing key, a foreign format, a pickle refused
        raise ConfigError(f"--target: {path} is not a .npz or tensors-only .pt file with keys x and y "
                          f"({type(exc).__name__})") from None
    shape = tuple(task.shape)
    if tuple(x.shape) not in (shape, (1, *shape)) or y.numel() != 1:
        raise ConfigError(f"--target: {path} must hold x of shape {shape} and one label y, got x {tuple(x.shape)} and "
                          f"{y.numel()} label(s)")
    x = x.reshape(shape).float()
    label = y.reshape(()).item()
    if not torch.isfinite(x).all() or float(label) != int(label) or not 0 <= int(label) < task.num_classes:
        raise ConfigError(f"--target: {path} must hold finite x and an integer label from 0 to {task.num_classes - 1}")
    return Target(x, int(label), {"kind": "file", "path": str(path)})


def clipbkd_input(pool_x: torch.Tensor) -> torch.Tensor:
    """ClipBKD's input (Jagielski et al. 2020): the pool's last principal component (least variance, so the
    other records' gradients hardly move the model along it), scaled to the pool's mean input norm. Computed
    from the first ``CLIPBKD_ROWS`` records: a fixed function of D, the same in both worlds."""
    flat = pool_x[:CLIPBKD_ROWS].reshape(min(len(pool_x), CLIPBKD_ROWS), -1).double()
    centred = flat - flat.mean(dim=0)
    _, vectors = torch.linalg.eigh(centred.T @ centred)
    last = vectors[:, 0]
    last = last * torch.sign(last[last.abs().argmax()])  # eigh's sign is arbitrary: fix it
    scale = pool_x.reshape(len(pool_x), -1).double().norm(dim=1).mean()
    return (last * scale).float().reshape(pool_x.shape[1:])


def initial_parameters(how: str, model: nn.Module, task: Task, streams: Streams,
                       device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """θ₀ and how it was made: the run's own initialisation (``random``), that one pre-trained non-privately on
    the task's public split (``crafted``), or a state dict from a file."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if how == "random":
        return state, {"kind": "random", "description": "the run's own initialisation (stream victim/init)"}
    if how == "crafted":
        if len(task.public) == 0:
            raise ConfigError("--init: crafted pre-trains on the task's public split, which is empty; set "
                              "data.public_fraction > 0 (or give a state-dict file)")
        return craft(model, task, streams.scope("craft").generator("order"), device)
    from dpeval.weights import read_weights  # application layer: the same reader as model.weights

    try:
        given = read_weights(Path(how))
    except ConfigError as exc:
        raise ConfigError(f"--init: {str(exc).partition(': ')[2]}") from None
    expected = {n: tuple(t.shape) for n, t in state.items()}
    if {n: tuple(t.shape) for n, t in given.items()} != expected:
        raise ConfigError(f"--init: {how} does not hold this model's state dict (names and shapes of "
                          f"{', '.join(list(expected)[:4])}…)")
    if not all(torch.isfinite(t).all() for t in given.values() if t.is_floating_point()):
        raise ConfigError(f"--init: {how} holds NaN or infinite values")
    return {n: t.to(state[n].dtype) for n, t in given.items()}, {"kind": "file", "path": how}


def craft(model: nn.Module, task: Task, generator: torch.Generator,
          device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Non-private pre-training on the public split (disjoint from the private pool and the test split) by the
    anchor's recipe ``CRAFT``; the batches' order from the stream ``audit/model/craft`` → ``order``."""
    crafted = _copy(model).to(device).train()
    params = [p for p in crafted.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=CRAFT["lr"], momentum=CRAFT["momentum"])
    x, y = task.public.x.to(device), task.public.y.to(device)
    for _ in range(int(CRAFT["epochs"])):
        order = torch.randperm(len(y), generator=generator).to(device)
        for start in range(0, len(y), int(CRAFT["batch_size"])):
            rows = order[start:start + int(CRAFT["batch_size"])]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(crafted(x[rows]), y[rows]).backward()
            optimizer.step()
    crafted.eval()
    with torch.no_grad():
        public_acc = float((crafted(x).argmax(1) == y).float().mean())
        test_acc = float((crafted(task.test.x.to(device)).argmax(1) == task.test.y.to(device)).float().mean())
    state = {k: v.detach().to("cpu").clone() for k, v in crafted.state_dict().items()}
    if not all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
        raise RunFailure("--init crafted: pre-training made the weights NaN or infinite")
    indices = task.public.source_index.numpy().astype(np.int64)
    return state, {
        "kind": "crafted", **CRAFT, "loss": "cross-entropy", "from": "the run's own initialisation",
        "split": "public", "records": len(indices),
        "split_rule": "data.split_seed's permutation of the training source, public = perm[n_test:n_test + n_public] "
                      "(dpeval.core.splits); disjoint from the private pool and the test split",
        "source_indices_sha256": hashlib.sha256(indices.tobytes()).hexdigest(),
        "public_accuracy": public_acc, "test_accuracy": test_acc,
    }


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model)


# ---------------------------------------------------------------------------------------------------
# sampling


# ---------------------------------------------------------------------------------------------------
# the estimators


def mu_of_rates(fpr: float, fnr: float) -> float:
    """Φ⁻¹(1 − FPR) − Φ⁻¹(FNR), clipped at 0: the least μ of a Gaussian trade-off curve through (FPR, FNR)."""
    with np.errstate(invalid="ignore"):  # ∞ − ∞ (both rates at an end) is no evidence: 0
        value = float(special.ndtri(1 - fpr) - special.ndtri(fnr))
    return max(value, 0.0) if not math.isnan(value) else 0.0


def mu_bounds(scores: np.ndarray, labels: np.ndarray, thresholds: np.ndarray, alpha: float) -> np.ndarray:
    """At each threshold (score ≥ threshold = "in"), Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi) with the upper ends of two-sided
    (1 − α) Clopper–Pearson intervals; −∞ where both rates sit at an end (no evidence)."""
    hits = scores[None, :] >= thresholds[:, None]
    fp, fn = (hits & ~labels).sum(axis=1), (~hits & labels).sum(axis=1)
    fpr_hi = clopper_pearson_ends(fp, int((~labels).sum()), alpha)[1]
    fnr_hi = clopper_pearson_ends(fn, int(labels.sum()), alpha)[1]
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(special.ndtri(1 - fpr_hi) - special.ndtri(fnr_hi), nan=-np.inf)


def gdp_split_test(scores: np.ndarray, labels: np.ndarray, delta: float, alpha: float) -> dict[str, Any]:
    """The GDP estimator: the threshold maximising μ_LB on the first half of the models (rows), judged on the
    second half: μ_LB = Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi) with two-sided (1 − α) Clopper–Pearson ends (so both hold
    together with probability ≥ 1 − α), ε_LB = ε_μ(δ); the plug-in μ̂ at the judged rates and its interval."""
    scores, labels = np.asarray(scores, dtype=float).ravel(), np.asarray(labels, dtype=bool).ravel()
    half = len(scores) // 2
    cs, cl = scores[:half], labels[:half]
    candidates = np.unique(np.quantile(cs, np.linspace(0, 1, MAX_THRESHOLDS)))
    mus = mu_bounds(cs, cl, candidates, alpha)
    threshold = float(candidates[int(np.argmax(mus))])
    tp, pos, fpos, neg = rates_at(scores[half:], labels[half:], threshold)
    tpr_ci, fpr_ci = clopper_pearson(tp, pos, alpha), clopper_pearson(fpos, neg, alpha)
    fnr_hi_judged = 1 - tpr_ci[0]
    mu_lb = mu_of_rates(fpr_ci[1], fnr_hi_judged)
    tpr, fpr = tp / max(pos, 1), fpos / max(neg, 1)
    return {
        "epsilon_lower_bound": gdp_epsilon(mu_lb, delta), "mu_lower_bound": mu_lb,
        "threshold": threshold, "tpr": tpr, "fpr": fpr, "tpr_ci": tpr_ci, "fpr_ci": fpr_ci,
        "mu_hat": mu_of_rates(fpr, 1 - tpr), "mu_ci": (mu_lb, mu_of_rates(fpr_ci[0], 1 - tpr_ci[1])),
    }


def anchor_reading(scores: np.ndarray, labels: np.ndarray, delta: float, alpha: float = ALPHA) -> dict[str, float]:
    """The anchor's own GDP reading (Annamalai & De Cristofaro's ``compute_eps_lower_gdp``), for comparison with
    their numbers only: over EVERY model, at every threshold, two-sided (1 − 2α) Clopper–Pearson upper ends of FPR
    and FNR give μ = Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi), and the largest ε_μ(δ) over the thresholds is reported. The
    threshold is chosen on the scores it is judged on, so this is not a (1 − α) bound (it is optimistic); the
    audit's verdict never uses it."""
    scores, labels = np.asarray(scores, dtype=float).ravel(), np.asarray(labels, dtype=bool).ravel()
    thresholds = np.unique(scores)
    mus = mu_bounds(scores, labels, thresholds, 2 * alpha)
    mu = max(float(mus.max()), 0.0)
    return {"epsilon": gdp_epsilon(mu, delta), "mu": mu, "threshold": float(thresholds[int(np.argmax(mus))])}


def judge(scores: dict[str, np.ndarray], labels: np.ndarray, delta: float,
          alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Every statistic × estimator test at level α / (their number) (Bonferroni): the largest bound is a (1 − α)
    lower bound."""
    level = alpha / (len(scores) * len(ESTIMATORS))
    tests = []
    for statistic, values in scores.items():
        if not np.isfinite(values).all():
            raise RunFailure(f"audit: {int((~np.isfinite(values)).sum())} final model(s) give a NaN or infinite "
                             f"{statistic} score; no bound can be computed from them")
        common = {"statistic": statistic, "confidence": 1 - level, "separation": separation(values, labels)}
        cp = split_bound(values, labels, delta, level)
        tests.append({"estimator": "clopper-pearson", **common, **cp, "mu_lower_bound": None})
        tests.append({"estimator": "gdp", **common, **gdp_split_test(values, labels, delta, level)})
    return tests


def balanced_labels(k: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly half of each half of the K models (rounded down) train with the target, at random positions."""
    half = k // 2
    labels = np.zeros(k, dtype=bool)
    for start, size in ((0, half), (half, k - half)):
        labels[start + rng.choice(size, size=size // 2, replace=False)] = True
    return labels


# ---------------------------------------------------------------------------------------------------
# the game


@dataclass
class _Finished:
    """``ShadowProgress`` for the bar: counts models as their group ends, and keeps them in ``store`` (a
    ``dpeval.checkpoint.ShadowStore``) when given, so that an interrupted audit goes on with the rest."""

    bar: Any
    store: Any = None
    resumed: int = 0  # models loaded from the store, not trained by this process

    def finished(self, k: int) -> dict[int, dict[str, torch.Tensor]]:
        done = self.store.finished(k) if self.store is not None else {}
        self.resumed = len(done)
        self.bar.update(len(done))
        return done

    def save(self, i: int, state: dict[str, torch.Tensor]) -> None:
        if self.store is not None:
            self.store.save(i, state)
        self.bar.update(1)


def settings_key(spec: RunSpec, options: ModelAuditOptions, defense_cls: type | None) -> str:
    """What determines every model of an audit: the run's key (data, model, defense, privacy, training, seed), the
    audit's knobs (with the contents of any file they name), the defense class (a planted subclass is another
    defense) and dpeval's version. Kept models are loaded only under the same key."""
    def content(value: str) -> str:
        path = Path(value)
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else value

    from dpeval import __version__

    cls = defense_cls or type(None)
    parts = [__version__, spec.run_key, str(options.models), content(options.init), content(options.target),
             options.sampling, f"{cls.__module__}.{cls.__qualname__}"]
    return "final-model audit " + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def auto_group(models: int, rows: int, parameters: int) -> int:
    """Models trained together so that one micro-batch's per-sample gradients stay within ``GROUP_BYTES``."""
    return max(1, min(models, GROUP_BYTES // max(1, rows * parameters * 4)))


def final_model_scores(build: Any, states: list[dict[str, torch.Tensor]], theta0: dict[str, torch.Tensor],
                       target: Target, device: torch.device) -> dict[str, np.ndarray]:
    """The two statistics of every final model (module docstring); only θ_T, θ₀ and the target are read."""
    model = build().to(device).eval()
    model.load_state_dict(theta0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    x = target.x.unsqueeze(0).to(device)
    y = torch.tensor([target.y], device=device)
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    params = dict(model.named_parameters())
    direction = torch.cat([-params[n].grad.detach().flatten() for n in names]).double()  # type: ignore[union-attr]
    start = torch.cat([theta0[n].to(device).flatten() for n in names]).double()
    loss, projection = [], []
    with torch.no_grad():
        for state in states:
            model.load_state_dict(state)
            loss.append(-float(F.cross_entropy(model(x), y)))
            final = torch.cat([state[n].to(device).flatten() for n in names]).double()
            projection.append(float((final - start) @ direction))
    return {"loss": np.array(loss), "projection": np.array(projection)}


def run_model_audit(spec: RunSpec, options: ModelAuditOptions | None = None,
                    defense_cls: type | None = None) -> dict[str, Any]:
    """Train K models from one θ₀, half with the target, and audit their final models (module docstring);
    ``defense_cls`` replaces the registry's class (the tests plant broken ones). Returns the flat result."""
    from dpeval.core.datasets import load_task
    from dpeval.runner import base_metrics, prepare  # the run as ``dpeval run`` prepares it
    from dpeval.victims import DefenseTrained, plan_privacy

    start = time.perf_counter()
    options = options or ModelAuditOptions()
    options.validate()
    train = spec.train
    if spec.model.weights is not None:
        raise ConfigError("model.weights: the final-model audit trains its own models from θ₀; give trained weights "
                          "as the initial parameters with --init FILE")
    if options.sampling == "run" and train.sampling != "poisson":
        raise ConfigError(f"--sampling: run uses the run's Poisson sampler; train.sampling is {train.sampling!r} "
                          f"(set train.sampling=poisson, or use --sampling full)")
    task = load_task(spec.data)
    target, task = choose_target(options.target, task)
    n = len(task.train)
    if options.sampling == "full":  # every record in every step: q = 1, one step per epoch
        audited = dataclasses.replace(spec, train=dataclasses.replace(train, batch_size=n, sampling="poisson"))
    else:
        audited = spec

    def plan(_spec: RunSpec, cls: type, pool: int) -> Any:
        ledger = plan_privacy(audited, cls, pool)
        return dataclasses.replace(ledger, sampling="full") if options.sampling == "full" else ledger

    prep = prepare(spec, task=task, source=DefenseTrained(defense_cls, plan))
    privacy = prep.privacy
    if not math.isfinite(privacy.epsilon):
        raise ConfigError(f"defense: {spec.defense_name!r} (with these parameters) is not a DP mechanism "
                          f"(ε = inf): there is no accounted ε to audit")
    streams = prep.streams.scope("audit", "model")
    theta0, init = initial_parameters(options.init, prep.model, task, streams, prep.device)
    if target.y is None:  # clipbkd: the class θ₀ finds least likely
        with torch.no_grad():
            probe = prep.build_model().to(prep.device).eval()
            probe.load_state_dict(theta0)
            target.y = int(probe(target.x.unsqueeze(0).to(prep.device)).argmin())
        target.description.update({"description": "the pool's last principal component scaled to its mean input "
                                                  "norm, labelled with the class of lowest logit under θ₀",
                                   "rows": min(n, CLIPBKD_ROWS)})
    target.description["label"] = target.y

    k = options.models
    labels = balanced_labels(k, streams.numpy("membership"))
    x = torch.cat([task.train.x, target.x.unsqueeze(0)])
    y = torch.cat([task.train.y, torch.tensor([target.y])])
    pools = [torch.arange(n + 1 if labels[i] else n) for i in range(k)]
    scopes = [streams.scope("models", i) for i in range(k)]
    steps = privacy.steps // train.epochs
    # what the release divides by, and the step: full → lr × the summed release with SGD (Adam ignores the scale)
    # (weight decay divided by N: SGD adds it to the gradient before the lr, so the decay per step stays lr × wd)
    summed = options.sampling == "full" and train.optimizer == "sgd"
    divide = n if options.sampling == "full" else train.batch_size
    lr = train.lr * n if summed else train.lr
    cfg = dataclasses.replace(train, batch_size=divide, lr=lr,
                              weight_decay=train.weight_decay / n if summed else train.weight_decay)

    def build() -> nn.Module:
        model = prep.build_model()
        model.load_state_dict(theta0)
        return model

    def make_sampler(i: int, size: int, generator: torch.Generator) -> BatchSampler:
        return FixedRateSampler(size, divide, "poisson", generator, rate=privacy.sample_rate, steps=steps)

    d = sum(p.numel() for p in prep.model.parameters() if p.requires_grad)
    training = options.training
    if training == "auto":  # measured: one model at a time with the run's engine is faster on the CPU (docs/audit.md)
        training = "together" if prep.device.type == "cuda" else "sequential"
    group = (options.group or auto_group(k, min(cfg.physical_batch_size, n + 1), d)) if training == "together" else 1
    seed_globals(prep.streams)
    trained = time.perf_counter()
    kept = None
    if options.keep is not None:
        from dpeval.checkpoint import ShadowStore  # application layer: the membership game's store of shadows

        kept = ShadowStore(options.keep, settings_key(spec, options, defense_cls))
    with tqdm(total=k, desc=f"final-model audit of {spec.defense_name}", unit="model",
              disable=not options.progress, leave=False) as bar:
        def defense_of(i: int, model: nn.Module, steps_per_epoch: int) -> Any:
            return prep.make_defense(scopes[i], model, steps_per_epoch)

        finished = _Finished(bar, kept)
        if training == "together":
            states = train_shadows(build, x, y, pools, defense_of, cfg, scopes, prep.device,
                                   progress=options.progress, store=finished, group=group, make_sampler=make_sampler)
        else:
            states = train_shadows_sequential(build, x, y, pools, defense_of, cfg, scopes, prep.device,
                                              progress=False, store=finished, make_sampler=make_sampler)
    train_s = time.perf_counter() - trained
    scores = final_model_scores(prep.build_model, states, theta0, target, prep.device)
    tests = judge(scores, labels, privacy.delta)
    best = max(tests, key=lambda t: t["epsilon_lower_bound"])
    gdp_best = max((t for t in tests if t["estimator"] == "gdp"), key=lambda t: t["mu_lower_bound"])
    passed = best["epsilon_lower_bound"] <= privacy.epsilon
    metrics = base_metrics(prep)
    keep = ("defense", "dataset", "model", "seed") + tuple(m for m in metrics if m.startswith(("defense.", "privacy.")))
    out = {key: metrics[key] for key in keep if key in metrics}
    out.update({
        "audit.scope": "model",
        "audit.epsilon_lower_bound": best["epsilon_lower_bound"],
        "audit.estimator": best["estimator"],
        "audit.statistic": best["statistic"],
        "audit.mu_lower_bound": gdp_best["mu_lower_bound"],
        "audit.mu_hat": gdp_best["mu_hat"],
        "audit.mu_hat_ci": list(gdp_best["mu_ci"]),
        "audit.mu_statistic": gdp_best["statistic"],
        "audit.passed": passed,
        "audit.verdict": BoundCheck.of(passed).value,
        "audit.confidence": 1 - ALPHA,
        "audit.models": k,
        "audit.models_with_target": int(labels.sum()),
        "audit.models_per_group": group,
        "audit.models_resumed": finished.resumed,  # time.train_s is the training of the other models only
        "audit.training": training,
        "audit.init": init,
        "audit.target": target.description,
        "audit.sampling": {
            "mode": options.sampling, "sample_rate": privacy.sample_rate, "steps": privacy.steps,
            "steps_per_epoch": steps, "epochs": train.epochs, "pool": n, "release_divides_by": divide,
            "optimizer": train.optimizer, "lr": train.lr, "effective_lr": lr, "weight_decay": cfg.weight_decay,
            "gradient": ("sum: lr × (Σ clipped + noise)" if summed else
                         "sum or mean: Adam's step ignores the scale" if options.sampling == "full" else
                         f"the run's: the release over the expected batch {divide}")},
        "audit.anchor_reading": {statistic: anchor_reading(values, labels, privacy.delta)
                                 for statistic, values in scores.items()},
        "audit.tests": [{**t, "tpr_ci": list(t["tpr_ci"]), "fpr_ci": list(t["fpr_ci"]),
                         **({"mu_ci": list(t["mu_ci"])} if "mu_ci" in t else {})} for t in tests],
        "time.train_s": train_s,
        "time.audit_s": time.perf_counter() - start,
        "time.threads": torch.get_num_threads(),
    })
    return out
