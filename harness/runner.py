"""One run end to end: RunSpec → task → model → defense + accounting → training → attacks → results store.

Everything that can be wrong with the user's input (names, ranges, a missing dataset folder, an
unreachable ε) is checked in ``prepare`` before anything is written, so bad input leaves the store
untouched. ``execute`` then records the run as ``running`` and finishes it as ``done`` or ``failed``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from dpeval import __version__, checkpoint
from dpeval.attacking import SHADOWS, attacks_of, check_attacks, play_attacks
from dpeval.core.accounting import ACCOUNTED_SAMPLING
from dpeval.core.datasets import load_task
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.files import write_atomic, write_text_atomic
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.per_sample import check_per_sample, check_trainable
from dpeval.core.runtime import apply_thread_default, resolve_device
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Task
from dpeval.core.states import resolve
from dpeval.core.streams import Streams, seed_globals
from dpeval.defenses.base import Defense, DefenseContext
from dpeval.engine.lean import check_lean
from dpeval.engine.training import BatchSampler, Loop, Observers, TrainingObserver, accuracy, train
from dpeval.logs import LOG_ONLY, open_run_log
from dpeval.results import AttackOutcome, Communication, RunResult, Timing, Utility
from dpeval.store import ResultStore
from dpeval.victims import DefenseTrained, VictimSource
from dpeval.weights import check_weights, read_weights

log = logging.getLogger("dpeval")


@dataclass
class Prepared:
    spec: RunSpec
    task: Task
    model_name: str
    model: nn.Module
    sampler: BatchSampler
    privacy: PrivacyLedger                 # as planned; training's own count of releases replaces it
    make_defense: Callable[..., Defense]   # make_defense(streams, bound_to=None, steps_per_epoch=the victim's)
    build_model: Callable[[], nn.Module]
    streams: Streams                       # the run's root streams
    device: torch.device


def prepare(spec: RunSpec, task: Task | None = None, source: VictimSource | None = None) -> Prepared:
    """Load data (unless ``task`` is given: the one ``spec.data`` names), build or take the victim and plan its
    privacy as ``source`` says (``dpeval.victims``; default: the model ``spec.model`` names, trained by the
    registry's defense); raises ConfigError on any invalid input. Every other step is the same whatever the
    source."""
    device = resolve_device(spec.device)
    task = task if task is not None else load_task(spec.data)
    n = len(task.train)
    if spec.train.batch_size > n:
        raise ConfigError(f"train.batch_size: must be <= the private pool size ({n}), got {spec.train.batch_size}")
    source = source if source is not None else DefenseTrained()
    model_name = source.model_name(spec)
    streams = Streams(spec.seed)
    victim = streams.scope("victim")
    defense_cls = source.defense_class(spec)
    privacy = source.plan(spec, defense_cls, n)
    model, build = source.model(spec, task, privacy, victim)
    check_per_sample(model, source.field)
    check_trainable(model, source.field)
    if spec.model.weights is not None:
        check_weights(spec, model)
    check_attacks(spec, model, task, privacy)
    defense_cls.check_task(spec.defense, task)
    defense_cls.check_model(spec.defense, model)
    if spec.train.engine == "lean":  # fail before training; ``auto`` falls back to func instead
        check_lean(defense_cls, model, spec.train.precision)
    shapes = {name: p.shape for name, p in model.named_parameters() if p.requires_grad}

    sampler = BatchSampler(n, spec.train.batch_size, spec.train.sampling, victim.generator("sampler"))

    def make_defense(defense_streams: Streams, bound_to: nn.Module | None = None,
                     steps_per_epoch: int = sampler.steps_per_epoch) -> Defense:
        """A fresh defense as in training, drawing from ``defense_streams``, bound to ``bound_to`` (the
        victim model by default), for epochs of ``steps_per_epoch`` steps (the victim's by default; a shadow
        model trained on another pool passes its own)."""
        defense = defense_cls(spec.defense, DefenseContext(shapes, privacy.noise_multiplier, defense_streams, device,
                                                           steps_per_epoch))
        defense.bind(bound_to if bound_to is not None else model, task.public, task.num_classes)
        return defense
    return Prepared(spec, task, model_name, model, sampler, privacy, make_defense, build, streams, device)


def check_points(specs: list[RunSpec], describe: Callable[[RunSpec], str]) -> None:
    """Every check ``prepare`` makes before a run (data found, attacks' and the defense's task and model
    rules, ε reachable), for each distinct configuration of a grid (seeds change none of them), each dataset
    loaded once: a ConfigError names the first failing point (``describe``) before anything runs."""
    seen: set[str] = set()
    tasks: dict[str, Task] = {}
    for spec in specs:
        shape = json.dumps({k: v for k, v in spec.canonical().items() if k not in ("seed", "device", "defaults")},
                           sort_keys=True, default=str)
        if shape in seen:
            continue
        seen.add(shape)
        data = json.dumps(dataclasses.asdict(spec.data), sort_keys=True, default=str)
        try:
            if data not in tasks:
                tasks[data] = load_task(spec.data)
            prepare(spec, tasks[data])
        except ConfigError as exc:
            raise ConfigError(f"grid point {describe(spec) or spec.run_key}: {exc}") from None


def base_metrics(prep: Prepared) -> dict[str, Any]:
    """A run's result keys before training: what it is (``identity``), its configuration's columns and its planned
    privacy ledger."""
    spec = prep.spec
    identity = {"dataset": spec.data.name, "model": prep.model_name, "defense": spec.defense_name,
                "attack": "+".join(spec.attacks) if spec.attacks else "none", "seed": spec.seed}
    return {**identity, **config_columns(prep), **prep.privacy.metrics()}


def config_columns(prep: Prepared) -> dict[str, Any]:
    """The run's configuration as result keys: its run key, version, device, the defense's and attacks' parameters
    and the data's sizes (``RunResult.extra``)."""
    spec = prep.spec
    row: dict[str, Any] = {"run_key": spec.run_key, "version": __version__, "device": str(prep.device),
                           "defaults": ", ".join(spec.defaults) or "none"}  # the data set's defaults this run took
    row.update({f"defense.{k}": v for k, v in dataclasses.asdict(spec.defense).items()})
    for name in spec.attacks:  # the attacks' parameters, like the defense's (lists as comma-joined text)
        row.update({f"attack.{name}.{k}": ", ".join(map(str, v)) if isinstance(v, list) else v
                    for k, v in dataclasses.asdict(spec.attack[name]).items()})
    row.update({
        "data.train_size": len(prep.task.train),
        "data.test_size": len(prep.task.test),
        "data.public_size": len(prep.task.public),
    })
    return row


class AttacksFailed(RuntimeError):
    """Some attacks of a run failed after training: ``result`` holds everything that finished (training and
    the other attacks; the failed ones' ``AttackOutcome.error``), so it can be recorded, not lost."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result

    @property
    def metrics(self) -> dict[str, Any]:
        """The result keys to record (``leakage.<attack>.error`` for the failed attacks)."""
        return self.result.flat()

    def __reduce__(self):  # crosses process boundaries (sweep workers) with its result
        return (AttacksFailed, (str(self), self.result))


@dataclass
class Trained:
    """What training (or loading given weights) measured, before the attacks: the typed parts of the result and
    the other keys it reports."""

    utility: Utility
    comm: Communication
    train_s: float
    threads: int
    extra: dict[str, Any]


@dataclass
class Snapshots(TrainingObserver):
    """The weights and the defense's public state at the start of each epoch the attacks asked for (``wanted``),
    and the defense's at epoch 0 as ``init``."""

    wanted: set[str]
    states: dict[str, dict[str, torch.Tensor]]
    defense_states: dict[str, Any]

    def epoch_start(self, epoch: int, model: nn.Module, defense: Defense) -> None:
        if epoch == 0:
            self.defense_states["init"] = copy.deepcopy(defense.state_dict())
        if f"epoch:{epoch}" in self.wanted:
            self.states[f"epoch:{epoch}"] = copy.deepcopy(model.state_dict())
            self.defense_states[f"epoch:{epoch}"] = copy.deepcopy(defense.state_dict())


@dataclass
class Checkpoints(TrainingObserver):
    """``checkpoint.pt`` at the end of every epoch (and within epochs: ``train.checkpoint_every``): the loop and
    the snapshots taken so far."""

    path: Path
    run_key: str
    snapshots: Snapshots
    checkpoints = True

    def epoch_end(self, loop: Loop, epochs_done: int) -> None:
        checkpoint.save(self.path, self.run_key, {"loop": loop.state(epochs_done), "states": self.snapshots.states,
                                                  "defense_states": self.snapshots.defense_states})


def perform(prep: Prepared, run_id: str, run_dir: Path, progress: bool = True, checkpoints: bool = False,
            resume: dict[str, Any] | None = None) -> RunResult:
    """Train, attack and write the artefacts of one run into ``run_dir``; returns its result.

    ``checkpoints``: write ``checkpoint.pt`` at the end of every epoch; ``resume``: such a checkpoint's
    payload, to go on from it exactly as the uninterrupted run would have. Touches no store: the caller
    (a single run, or a sweep driver for its workers) records the result.
    """
    spec = prep.spec
    seed_globals(prep.streams)  # first: nothing below draws from an unseeded global generator
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(spec.canonical(), sort_keys=True))
    close_log = open_run_log(run_dir / "log.txt")
    try:
        log.info("run %s: %s", run_id, json_line({"run_id": run_id, **base_metrics(prep)}))
        warn_sampling(prep.privacy)
        asked = set().union(*(type(a).wanted_states(a.params) for _, a in attacks_of(spec)))
        wanted = set(resolve(asked, spec.train.epochs))
        states = {"init": copy.deepcopy(prep.model.state_dict())}
        defense_states: dict[str, Any] = {}
        if resume is not None:
            states, defense_states = resume["states"], resume["defense_states"]
            log.info("resuming after %s from %s", checkpoint.position(resume["loop"], spec.train.epochs),
                     run_dir / checkpoint.FILE)
        defense = prep.make_defense(prep.streams.scope("victim"))
        if spec.model.weights is not None:  # trained elsewhere: attacked as given, nothing trained here
            trained = given_weights(prep, defense, states, defense_states)
            return finish(prep, trained, states, defense_states, run_dir, run_id, progress)
        snapshots = Snapshots(wanted, states, defense_states)
        saving = Checkpoints(run_dir / checkpoint.FILE, spec.run_key, snapshots)
        observer = Observers(snapshots, saving) if checkpoints else snapshots
        result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train,
                       prep.sampler, prep.device, progress=progress, observer=observer,
                       resume=resume["loop"] if resume is not None else None)
        warn_divergence([h["train_loss"] for h in result.history], spec.train.lr)
        states["final"] = copy.deepcopy(prep.model.state_dict())
        defense_states["final"] = copy.deepcopy(defense.state_dict())
        write_atomic(run_dir / "model.pt", lambda f: torch.save(states["final"], f))
        trained = Trained(
            Utility(result.history[-1]["test_accuracy"], result.train_accuracy,
                    [h["test_accuracy"] for h in result.history], [h["train_loss"] for h in result.history]),
            Communication(result.density, result.bytes_sparse, result.bytes_dense), result.train_s,
            torch.get_num_threads(),
            {"comm.density_by_epoch": [h["density"] for h in result.history], "train.engine_used": result.engine,
             "train.engine_reason": result.engine_reason})
        released = prep.privacy.at(prep.sampler.sample_rate, result.steps)  # the releases training made
        prep = dataclasses.replace(prep, privacy=released)
        return finish(prep, trained, states, defense_states, run_dir, run_id, progress)
    except Exception:
        log.error("run %s failed", run_id, exc_info=True, extra=LOG_ONLY)
        raise
    finally:
        close_log()


def finish(prep: Prepared, trained: Trained, states: dict[str, dict[str, torch.Tensor]],
           defense_states: dict[str, Any], run_dir: Path, run_id: str, progress: bool = True) -> RunResult:
    """Play the attacks on the trained (or given) victim and build its result; ``AttacksFailed`` when some
    attack raised (with everything that finished)."""
    attack_start = time.perf_counter()
    outcomes, seconds = play_attacks(prep, states, defense_states, run_dir, run_id, progress)
    result = run_result(prep, run_id, outcomes, time.perf_counter() - attack_start, trained,
                        {f"time.{name}_s": s for name, s in seconds.items()})
    failed = [name for name, outcome in outcomes.items() if outcome.error is not None]
    if failed:
        errors = "; ".join(f"{a}: {outcomes[a].error}" for a in failed)
        kept = [a for a in prep.spec.attacks if a not in failed]
        raise AttacksFailed(f"attack(s) failed after training ({errors}); recorded with the results that "
                            f"finished{' (' + ', '.join(kept) + ')' if kept else ''}", result)
    return result


def run_result(prep: Prepared, run_id: str, outcomes: dict[str, AttackOutcome], attack_s: float,
               trained: Trained | None = None, extra: dict[str, Any] | None = None, dataset: str | None = None,
               defense: str | None = None) -> RunResult:
    """The typed result of a run (``dpeval.results``), built once: the CLI prints and the store records its
    ``flat()`` view. ``trained`` None: nothing was trained here (the Python API's outside victims and release
    functions: no utility, communication or times but the attacks'); ``dataset`` / ``defense`` name what the
    spec's names do not."""
    spec = prep.spec
    failed = any(outcome.error is not None for outcome in outcomes.values())
    timing = None if trained is None else Timing(trained.train_s, attack_s, trained.threads)
    return RunResult(
        run_id=run_id, status="failed" if failed else "done", dataset=dataset or spec.data.name,
        model=prep.model_name, defense=defense or spec.defense_name, seed=spec.seed,
        utility=None if trained is None else trained.utility, privacy=prep.privacy,
        comm=None if trained is None else trained.comm, time=timing, attacks=outcomes,
        extra={} if trained is None else {**config_columns(prep), **trained.extra, **(extra or {})})


def given_weights(prep: Prepared, defense: Defense, states: dict[str, dict[str, torch.Tensor]],
                  defense_states: dict[str, Any]) -> Trained:
    """A victim trained elsewhere (``model.weights``): its weights become the ``final`` state (``init`` stays the
    run's own initialisation), its utility is measured, and the ledger of the recipe the user says it was trained
    with is reported as planned (nothing was released here: no communication, no training time)."""
    path = Path(str(prep.spec.model.weights))
    prep.model.load_state_dict(read_weights(path))
    defense.begin_epoch(0, prep.spec.train.epochs)
    defense_states["init"] = defense_states["final"] = copy.deepcopy(defense.state_dict())
    states["final"] = copy.deepcopy(prep.model.state_dict())
    test = accuracy(prep.model, prep.task.test, prep.device) if len(prep.task.test) else float("nan")
    train = accuracy(prep.model, prep.task.train, prep.device)
    return Trained(Utility(test, train, None, None), Communication(None, None, None), 0.0, torch.get_num_threads(),
                   {"model.weights_sha256": hashlib.sha256(path.read_bytes()).hexdigest()})


def warn_sampling(plan: PrivacyLedger) -> None:
    """Every DP run whose batches are not Poisson-sampled says that its ε assumes they were."""
    if plan.sampling != ACCOUNTED_SAMPLING and math.isfinite(plan.epsilon):
        log.warning("warning: train.sampling: %s — ε = %.3g is accounted as if batches were Poisson-sampled "
                    "at q = %.4g (the customary figure for fixed-size shuffled batches, not a proven bound); "
                    "recorded as privacy.accounted_sampling = %s", plan.sampling, plan.epsilon,
                    plan.sample_rate, ACCOUNTED_SAMPLING)


DIVERGED = 1.5  # the last epoch's training loss above this multiple of the first's: the run went the wrong way


def warn_divergence(losses: list[float], lr: float) -> None:
    """A run whose training loss ends well above where its first epoch left it (or not finite) says so: its
    utility and the attacks on it measure a diverged model, not the recipe. Training goes on and is recorded
    (the number is real); the warning names the usual cause. The first epoch, not the start, is the reference:
    a loss still falling inside epoch 1 is not divergence."""
    if len(losses) < 2:
        return
    first, last = losses[0], losses[-1]
    if not math.isfinite(last) or (math.isfinite(first) and last > DIVERGED * first):
        log.warning("warning: training diverged: the training loss rose from %.3g after epoch 1 to %.3g after "
                    "epoch %d; the utility and the attacks measure that model (a smaller train.lr than %g usually "
                    "fixes it)", first, last, len(losses), lr)


def execute(spec: RunSpec, store: ResultStore, progress: bool = True) -> RunResult:
    """Run ``spec`` and record it (its ``flat()`` result keys, docs/results.md); returns its result.

    First marks as failed the ``running`` rows of this folder whose process on this host is gone
    (``kill -9``, a crash). Ctrl-C and SIGTERM (raised as KeyboardInterrupt) record the run as failed with
    the reason and re-raise."""
    prep = prepare(spec)
    if prep.device.type == "cpu":
        apply_thread_default()
    stale = store.fail_stale()
    if stale:
        log.warning("marked %d interrupted run(s) in %s as failed (their process is gone)", stale, store.root)
    run_id, resume = resumable(spec, store)
    if resume is not None:
        store.resume(run_id)
        log.warning("resuming run %s after %s (its checkpoint); remove %s to start over", run_id,
                    checkpoint.position(resume["loop"], spec.train.epochs), store.run_dir(run_id) / checkpoint.FILE)
    else:
        run_id = store.begin(spec.run_key, spec.canonical())
    run_dir = store.run_dir(run_id)
    try:
        result = perform(prep, run_id, run_dir, progress, checkpoints=True, resume=resume)
    except KeyboardInterrupt as exc:
        reason = str(exc) or "interrupted"
        exc.args = (f"{reason}; run {run_id} {store.record_failure(run_id, reason) or 'recorded as failed'}",)
        raise
    except AttacksFailed as exc:
        unrecorded = store.record_failure(run_id, str(exc), exc.metrics)
        raise RunFailure(f"run {run_id}: {exc}; {f'{unrecorded}; ' if unrecorded else ''}dpeval show {run_id}"
                         f"{log_hint(run_dir)}") from exc
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        unrecorded = store.record_failure(run_id, error)
        raise RunFailure(f"run {run_id} failed: {error}{f'; {unrecorded}' if unrecorded else ''}"
                         f"{log_hint(run_dir)}") from exc
    store.finish(run_id, result.flat())
    (run_dir / checkpoint.FILE).unlink(missing_ok=True)  # done: nothing left to resume
    shutil.rmtree(run_dir / SHADOWS, ignore_errors=True)
    return dataclasses.replace(result, folder=run_dir)


def resumable(spec: RunSpec, store: ResultStore) -> tuple[str, dict[str, Any] | None]:
    """(run id, checkpoint payload) of the latest run of this run key when it was interrupted after at
    least one epoch; ("", None) otherwise. A damaged checkpoint is a ConfigError saying how to start over."""
    run_id = store.resumable(spec.run_key)
    if run_id is None:
        return "", None
    return run_id, checkpoint.load(store.run_dir(run_id) / checkpoint.FILE, spec.run_key)


def log_hint(run_dir: Path) -> str:
    """`` (log: <run_dir>/log.txt)`` when that file exists, else nothing: a message names only real files."""
    path = run_dir / "log.txt"
    return f" (log: {path})" if path.is_file() else ""


def json_line(data: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in data.items())
