"""The sweep driver: which grid points still need a run, the store bookkeeping, one sweep per folder.

Resumption: each grid point's run key is looked up in the store; points with a ``done`` row are skipped
(``rerun`` forces them). The driver alone writes the store: it records a point as ``running`` when it
dispatches it and ``done``/``failed`` when its result comes back, so a sweep killed at any moment leaves
no half-written ``done`` row, and the next start re-runs exactly the points without one. ``running`` rows
whose process is gone are marked ``failed`` when a sweep starts. One sweep per results folder at a time
(a lock file); a second one waits (``wait``) or refuses.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tqdm import tqdm

from harness.config import RunSpec
from harness.core.errors import RunFailure
from harness.headlines import attacks_in, read
from harness.runner import log_hint
from harness.store import ResultStore
from harness.sweep.executors import Executor
from harness.sweep.grid import describe, swept_fields

log = logging.getLogger("dpeval")


@dataclass
class SweepSummary:
    planned: int = 0
    skipped: int = 0
    done: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


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
              fail_fast: bool = False, progress: bool = True, wait_for_lock: bool = False,
              annotations: dict[str, Any] | None = None) -> SweepSummary:
    """Run the pending points; ``annotations`` (a recipe's ``paper.*`` columns) join every finished result."""
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
                metrics = {**metrics, **(annotations or {})}
                store.finish(run_id, metrics)
                summary.done += 1
                acc, eps = metrics["utility.test_accuracy"], metrics["privacy.epsilon"]
                leakage = "  ".join(h.short() for a in attacks_in(metrics) if (h := read(metrics, a)))
                bar.write(f"done    {run_id}  {label}  acc={acc:.3f} ε={eps:.3g}  {leakage}".rstrip(), file=sys.stderr)
            else:
                store.fail(run_id, error or "unknown error")
                summary.failed += 1
                summary.failures.append(f"{run_id} ({label}): {error}")
                bar.write(f"failed  {run_id}  {label}  {error}{log_hint(run_dir)}", file=sys.stderr)
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
