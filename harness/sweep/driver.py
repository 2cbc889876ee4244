"""The sweep driver: which grid points still need a run, the store bookkeeping, one sweep per folder.

Resumption: each grid point's run key is looked up in the store; points with a ``done`` row are skipped
(``rerun`` forces them), and an interrupted point's checkpoint is checked before any point runs (a damaged
one is refused, exit 2, as ``dpeval run`` refuses it). The driver alone records results: it records a point as
``running`` when it dispatches it and ``done``/``failed`` when its result comes back, so a sweep killed at any
moment leaves no half-written ``done`` row, and the next start re-runs exactly the points without one.
``running`` rows whose process is gone are marked ``failed`` when a sweep starts, after a short wait for those
whose process is alive (a local worker takes its point's row over: executors.py), so that an orphaned worker's
point is resumed once it stopped, never beside it. One sweep per results folder at a time (a lock file); a
second one waits (``wait``) or refuses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tqdm import tqdm

from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.spec import RunSpec
from dpeval.headlines import attacks_in, read
from dpeval.runner import log_hint, resumable
from dpeval.store import CHECKPOINT_FILE, LOCK_FILE, ResultStore
from dpeval.sweep.executors import Executor
from dpeval.sweep.grid import describe, swept_fields

log = logging.getLogger("dpeval")
LIVE_RUN_GRACE_S = 30.0  # how long a starting sweep waits for a point that a live process runs
LIVE_RUN_POLL_S = 0.5


@dataclass
class SweepSummary:
    planned: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


def open_lock_file(path: Path) -> int:
    """The lock file's descriptor. Never through a symlink (``O_NOFOLLOW``: a link planted there would
    have the sweep write into the file it points to) and only a regular file (a FIFO would block)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"--results: {path} is a symlink; dpeval does not follow it: remove it "
                              f"(rm {path}) and start the sweep again") from None
        raise ConfigError(f"--results: cannot open {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"--results: {path} is not a regular file; remove it and start the sweep again")
    return fd


@contextlib.contextmanager
def sweep_lock(results: Path, wait_for_lock: bool) -> Iterator[None]:
    """One sweep per results folder: a second one waits or refuses (never interleaves its bookkeeping)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / LOCK_FILE
    fd = open_lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait_for_lock else fcntl.LOCK_NB))
        except BlockingIOError:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise RunFailure(f"another dpeval sweep is running on {results} ({owner}); "
                             "wait for it, pass --wait, or use another --results") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def reap_running(store: ResultStore, keys: set[str]) -> int:
    """Mark the folder's ``running`` rows whose process is gone ``failed`` (returns how many), after waiting,
    up to ``LIVE_RUN_GRACE_S``, until no live process on this host runs a point of ``keys``. The workers of
    a sweep killed with ``kill -9`` stop within seconds and record their points interrupted, which this sweep
    then resumes from their checkpoints. A point still run after that (by another ``dpeval run``, say) is
    run anew under a new id, as beside any single run: only an interrupted run is resumed, so no two
    processes ever write one run's folder."""
    deadline = time.monotonic() + LIVE_RUN_GRACE_S
    reaped, said = 0, False
    while True:
        reaped += store.fail_stale()
        live = {key: pid for key, pid in store.live_runs().items() if key in keys}
        if not live:
            return reaped
        pids = ", ".join(map(str, sorted(set(live.values()))))
        if time.monotonic() > deadline:
            log.warning("%d point(s) still being run by process %s: run anew beside it", len(live), pids)
            return reaped
        if not said:
            log.warning("waiting for %d point(s) still being run by process %s", len(live), pids)
            said = True
        time.sleep(LIVE_RUN_POLL_S)


def run_sweep(specs: list[RunSpec], store: ResultStore, executor: Executor, *, rerun: bool = False,
              fail_fast: bool = False, progress: bool = True, wait_for_lock: bool = False,
              annotations: dict[str, Any] | None = None) -> SweepSummary:
    """Run the pending points; ``annotations`` (a recipe's ``paper.*`` columns) join every finished result."""
    summary = SweepSummary(planned=len(specs))
    swept = swept_fields(specs)
    with sweep_lock(store.root, wait_for_lock):
        stale = reap_running(store, {s.run_key for s in specs})
        if stale:
            log.warning("marked %d interrupted run(s) as failed", stale)
        done = set() if rerun else store.done_keys()
        todo = [s for s in specs if s.run_key not in done]
        summary.skipped = len(specs) - len(todo)
        for spec in todo:  # as `run` does: an unusable checkpoint (or run folder) is refused before any point runs
            resumable(spec, store)
        if summary.skipped:
            log.warning("resuming: %d of %d runs already done", summary.skipped, len(specs))
        bar = tqdm(total=len(todo), desc="sweep", unit="run", disable=not progress)
        started: list[str] = []

        def dispatch(spec: RunSpec) -> tuple[RunSpec, str, Path]:
            run_id = store.resumable(spec.run_key)
            if run_id is not None:  # interrupted after an epoch: its worker goes on from the checkpoint
                store.resume(run_id)
                bar.write(f"resume  {run_id}  {describe(spec, swept)}  (from its checkpoint)", file=sys.stderr)
            else:
                run_id = store.begin(spec.run_key, spec.canonical())
            started.append(run_id)
            return spec, run_id, store.run_dir(run_id)

        def on_result(job: tuple, metrics: dict[str, Any] | None, error: str | None) -> bool:
            spec, run_id, run_dir = job
            label = describe(spec, swept)
            if error is None:
                metrics = {**metrics, **(annotations or {})}
                store.finish(run_id, metrics)
                (run_dir / CHECKPOINT_FILE).unlink(missing_ok=True)  # done: nothing left to resume
                summary.done += 1
                acc, eps = metrics["utility.test_accuracy"], metrics["privacy.epsilon"]
                leakage = "  ".join(h.short() for a in attacks_in(metrics) if (h := read(metrics, a)))
                bar.write(f"done    {run_id}  {label}  acc={acc:.3f} ε={eps:.3g}  {leakage}".rstrip(), file=sys.stderr)
            else:
                # metrics: what finished before an attack failed; a store that cannot take it hides no error
                unrecorded = store.record_failure(run_id, error, metrics)
                error += f"; {unrecorded}" if unrecorded else ""
                summary.failed += 1
                summary.failures.append(f"{run_id} ({label}): {error}")
                bar.write(f"failed  {run_id}  {label}  {error}{log_hint(run_dir)}", file=sys.stderr)
            bar.update(1)
            return fail_fast and error is not None

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
