"""Sweeps: a base run plus a grid, resumable, run locally (sequential or worker processes) or on Ray.

Sweep file = a run configuration in which any field given as a list is swept (cartesian product), plus
``seeds: [..]``. Fields that are lists by nature (``attacks``, ``data.synthetic.shape``, list-typed
defense or attack parameters) are swept only when given as a list of lists: ``attacks: [ig, rgap]`` is
one run with both attacks, ``attacks: [[ig], [rgap]]`` two runs. Every grid point is validated before
any run starts.

Resumption: each grid point's run key is looked up in the store; points with a ``done`` row are skipped
(``rerun`` forces them). The driver alone writes the store: it records a point as ``running`` when it
dispatches it and ``done``/``failed`` when its result comes back, so a sweep killed at any moment leaves
no half-written ``done`` row, and the next start re-runs exactly the points without one. ``running`` rows
whose process is gone are marked ``failed`` when a sweep starts. One sweep per results folder at a time
(a lock file); a second one waits (``wait``) or refuses.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import itertools
import logging
import os
import shutil
import sys
import tempfile
import typing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator

from tqdm import tqdm

from harness.config import RunSpec, build_spec, load_yaml
from harness.errors import ConfigError, RunFailure
from harness.store import ResultStore

log = logging.getLogger("dpeval")

NATURAL_LISTS = {"attacks", "data.synthetic.shape"}


# ---------------------------------------------------------------------------------------------------
# Expansion


def _flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{path}.")
        else:
            yield path, value


def _is_list_typed(path: str, raw: dict[str, Any]) -> bool:
    """Whether ``path`` is a field whose single value is itself a list."""
    if path in NATURAL_LISTS:
        return True
    section, _, name = path.partition(".")
    if section not in ("defense", "attack") or not name or "." in name:
        return False
    from attacks import ATTACKS
    from defenses import DEFENSES

    if section == "defense":
        names = raw.get("defense", {}).get("name", "dpsgd")
        classes = [DEFENSES.get(n, field="defense") for n in (names if isinstance(names, list) else [names])]
    else:
        names = raw.get("attacks", [])
        names = [n for group in names for n in (group if isinstance(group, list) else [group])]
        classes = [ATTACKS.get(n, field="attack") for n in names if n != "none"]
    for cls in classes:
        hints = typing.get_type_hints(cls.Params)
        tp = hints.get(name)
        if tp is not None and (typing.get_origin(tp) is list or list in typing.get_args(tp)):
            return True
    return False


def expand(raw: dict[str, Any], where: str = "sweep") -> list[dict[str, Any]]:
    """All grid points of a sweep file, as raw run configurations (one per point and seed)."""
    raw = copy.deepcopy(raw)
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    seeds = raw.pop("seeds", None)
    if seeds is not None:
        if "seed" in raw:
            raise ConfigError(f"{where}: seeds: give either seed or seeds, not both")
        if not isinstance(seeds, list) or not seeds:
            raise ConfigError(f"{where}: seeds: must be a non-empty list of integers, got {seeds!r}")
        raw["seed"] = seeds
    axes: list[tuple[str, list[Any]]] = []
    for path, value in _flatten(raw):
        if not isinstance(value, list):
            continue
        if _is_list_typed(path, raw) and not (value and all(isinstance(v, list) for v in value)):
            continue  # a single list value, not an axis
        if not value:
            raise ConfigError(f"{where}: {path}: empty list; a swept field needs at least one value")
        axes.append((path, value))
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        point = copy.deepcopy(raw)
        for (path, _), value in zip(axes, combo):
            node = point
            *parents, leaf = path.split(".")
            for part in parents:
                node = node[part]
            node[leaf] = value
        points.append(point)
    return points


def load_sweep(path: str | Path) -> list[RunSpec]:
    """Read, expand and validate a sweep file; duplicate grid points (same run key) are merged."""
    raw = load_yaml(path)
    if not raw:
        raise ConfigError(f"{path}: empty sweep file")
    specs: dict[str, RunSpec] = {}
    for point in expand(raw, where=str(path)):
        try:
            spec = build_spec(point)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        specs.setdefault(spec.run_key, spec)
    return list(specs.values())


def describe(spec: RunSpec, swept: list[str]) -> str:
    canonical = spec.canonical()
    parts = []
    for path in swept:
        node: Any = canonical
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        parts.append(f"{path.split('.')[-1]}={node}")
    return " ".join(parts)


def swept_fields(specs: list[RunSpec]) -> list[str]:
    flat = [dict(_flatten(s.canonical())) for s in specs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


# ---------------------------------------------------------------------------------------------------
# Execution: a job is (run_id, canonical config, run_dir); workers return the flat result.


def run_job(canonical: dict[str, Any], run_id: str, run_dir: str, threads: int = 0) -> dict[str, Any]:
    """Execute one grid point in this process (also the body of worker processes)."""
    import torch

    from harness.runner import perform, prepare

    if threads:
        torch.set_num_threads(threads)
    spec = build_spec(canonical)
    return perform(prepare(spec), run_id, Path(run_dir), progress=False)


def _ray_job(canonical: dict[str, Any], run_id: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Ray task: run in a scratch folder, send the result and the artefact files back to the driver."""
    scratch = Path(tempfile.mkdtemp(prefix="dpeval-ray-"))
    try:
        metrics = run_job(canonical, run_id, str(scratch))
        files = {str(p.relative_to(scratch)): p.read_bytes() for p in scratch.rglob("*") if p.is_file()}
        return metrics, files
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class SweepSummary:
    planned: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


class Executor:
    """Runs grid points. ``dispatch(spec) -> job`` records a point as running right before it starts;
    ``on_result(job, metrics | None, error | None)`` records its outcome and returns True to stop."""

    def run(self, specs: list[RunSpec], dispatch: Callable, on_result: Callable) -> None:
        raise NotImplementedError

    def close(self) -> None:
        return None


class SequentialExecutor(Executor):
    def run(self, specs, dispatch, on_result):
        for spec in specs:
            job = dispatch(spec)
            _, run_id, run_dir = job
            try:
                metrics = run_job(spec.canonical(), run_id, str(run_dir))
            except Exception as exc:  # recorded; the sweep goes on unless fail-fast
                stop = on_result(job, None, f"{type(exc).__name__}: {exc}")
            else:
                stop = on_result(job, metrics, None)
            if stop:
                return


class ProcessExecutor(Executor):
    """``workers`` processes (spawned: fork and torch threads do not mix), torch threads split evenly."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.threads = max(1, (os.cpu_count() or 1) // workers)

    def run(self, specs, dispatch, on_result):
        queue = list(specs)
        pending: dict[Future, tuple] = {}
        stop = False
        with ProcessPoolExecutor(self.workers, mp_context=get_context("spawn")) as pool:
            while (queue and not stop) or pending:
                while queue and not stop and len(pending) < self.workers:
                    job = dispatch(queue.pop(0))
                    spec, run_id, run_dir = job
                    pending[pool.submit(run_job, spec.canonical(), run_id, str(run_dir), self.threads)] = job
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    job = pending.pop(future)
                    try:
                        metrics = future.result()
                    except Exception as exc:
                        stop = on_result(job, None, f"{type(exc).__name__}: {exc}") or stop
                    else:
                        stop = on_result(job, metrics, None) or stop


class RayExecutor(Executor):
    """One Ray task per run; results (and artefact files) come back to the driver, which alone writes."""

    def __init__(self, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor: ray is not installed; pip install 'dpeval[distributed]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.remote = ray.remote(_ray_job)

    def run(self, specs, dispatch, on_result):
        refs = {}
        for spec in specs:
            job = dispatch(spec)
            refs[self.remote.remote(spec.canonical(), job[1])] = job
        while refs:
            ready, _ = self.ray.wait(list(refs), num_returns=1)
            job = refs.pop(ready[0])
            try:
                metrics, files = self.ray.get(ready[0])
            except Exception as exc:
                stop = on_result(job, None, f"{type(exc).__name__}: {exc}")
            else:
                for rel, data in files.items():
                    target = job[2] / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                stop = on_result(job, metrics, None)
            if stop:
                for ref in refs:
                    self.ray.cancel(ref)
                return

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


@contextlib.contextmanager
def sweep_lock(results: Path, wait_for_lock: bool) -> Iterator[None]:
    """One sweep per results folder: a second one waits or refuses (never interleaves its bookkeeping)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / ".sweep.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait_for_lock else fcntl.LOCK_NB))
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            raise RunFailure(f"another dpeval sweep is running on {results} ({owner}); "
                             "wait for it, pass --wait, or use another --results") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_sweep(specs: list[RunSpec], store: ResultStore, executor: Executor, *, rerun: bool = False,
              fail_fast: bool = False, progress: bool = True, wait_for_lock: bool = False) -> SweepSummary:
    summary = SweepSummary(planned=len(specs))
    swept = swept_fields(specs)
    with sweep_lock(store.root, wait_for_lock):
        stale = store.fail_stale()
        if stale:
            log.warning("marked %d interrupted run(s) as failed", stale)
        done = set() if rerun else store.done_keys()
        todo = [s for s in specs if s.run_key not in done]
        summary.skipped = len(specs) - len(todo)
        if summary.skipped:
            log.warning("resuming: %d of %d runs already done", summary.skipped, len(specs))
        bar = tqdm(total=len(todo), desc="sweep", unit="run", disable=not progress)
        started: list[str] = []

        def dispatch(spec: RunSpec) -> tuple[RunSpec, str, Path]:
            run_id = store.begin(spec.run_key, spec.canonical())
            started.append(run_id)
            return spec, run_id, store.run_dir(run_id)

        def on_result(job: tuple, metrics: dict[str, Any] | None, error: str | None) -> bool:
            spec, run_id, run_dir = job
            label = describe(spec, swept)
            if metrics is not None:
                store.finish(run_id, metrics)
                summary.done += 1
                acc, eps = metrics["utility.test_accuracy"], metrics["privacy.epsilon"]
                bar.write(f"done    {run_id}  {label}  acc={acc:.3f} ε={eps:.3g}", file=sys.stderr)
            else:
                store.fail(run_id, error or "unknown error")
                summary.failed += 1
                summary.failures.append(f"{run_id} ({label}): {error}")
                bar.write(f"failed  {run_id}  {label}  {error} (log: {run_dir / 'log.txt'})", file=sys.stderr)
            bar.update(1)
            return fail_fast and metrics is None

        interrupted = False
        try:
            executor.run(todo, dispatch, on_result)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            bar.close()
            executor.close()
            reason = "interrupted" if interrupted else "not finished: the sweep stopped before it"
            for run_id in started:
                if store.status(run_id) == "running":
                    store.fail(run_id, reason)
    return summary
