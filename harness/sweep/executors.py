"""Sweep executors: run grid points in this process, in local worker processes, or on Ray.

A job is (run configuration, run id, run folder); workers return the flat result and the driver records it. A local
worker writes only its claim on the point it starts (the row then names the worker's pid, so the point reads
as alive while it runs) and, should the driver die, that point's interruption before it exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from dpeval.config import RunSpec, build_spec
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.files import write_atomic
from dpeval.store import CHECKPOINT_FILE, ResultStore

log = logging.getLogger("dpeval")
DRIVER_POLL_S = 1.0  # how often a worker checks that its driver is still there
DRIVER_GONE = "interrupted: the sweep driver running it is gone"  # resumable, like every "interrupted"
_driver = 0  # in a worker: the pid of the sweep driver that started it
_current: tuple[ResultStore, str] | None = None  # in a worker: the store and id of the run it executes now


def run_job(canonical: dict[str, Any], run_id: str, run_dir: str, workers: int = 1) -> dict[str, Any]:
    """Execute one grid point in this process (also the body of worker processes), with the thread default
    for one of ``workers`` concurrent processes (``dpeval.core.runtime.default_threads``) and a checkpoint
    after every epoch; a run folder that holds one (an interrupted point the driver resumes) goes on from it."""
    from dpeval import checkpoint
    from dpeval.core.runtime import apply_thread_default
    from dpeval.runner import perform, prepare

    apply_thread_default(workers)
    spec = build_spec(canonical)
    saved = Path(run_dir) / checkpoint.FILE
    resume = checkpoint.load(saved, spec.run_key) if saved.is_file() else None
    result = perform(prepare(spec), run_id, Path(run_dir), progress=False, checkpoints=True, resume=resume)
    return result.flat()  # the driver records it as it comes back


def _ray_job(canonical: dict[str, Any], run_id: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Ray task: run in a scratch folder, send the result and the artefact files back to the driver."""
    scratch = Path(tempfile.mkdtemp(prefix="dpeval-ray-"))
    try:
        metrics = run_job(canonical, run_id, str(scratch))
        files = {str(p.relative_to(scratch)): p.read_bytes() for p in scratch.rglob("*")
                 if p.is_file() and p.name != CHECKPOINT_FILE}  # a Ray point starts over when resumed
        return metrics, files
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class Executor:
    """Runs grid points. ``dispatch(spec) -> job`` records a point as running right before it starts;
    ``on_result(job, metrics | None, error | None)`` records its outcome and returns True to stop; metrics
    with an error are what finished before it (training and the attacks that did not fail)."""

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
            except Exception as exc:  # recorded (with what finished, if any); the sweep goes on unless fail-fast
                stop = on_result(job, getattr(exc, "metrics", None), f"{type(exc).__name__}: {exc}")
            else:
                stop = on_result(job, metrics, None)
            if stop:
                return


def _start_worker(debug: bool, driver: int) -> None:
    """A worker's log records go to each run's log.txt (per-epoch lines included); its terminal gets
    nothing but, with ``--debug``, warnings and tracebacks. Its (disabled) progress bars lock with a
    thread lock: tqdm's default multiprocessing lock would outlive a terminated worker as a leaked
    semaphore, which Python's resource tracker reports at exit. A thread watches the ``driver``."""
    from tqdm import tqdm

    from dpeval.logs import setup_logging

    global _driver
    setup_logging(debug, terminal=debug)
    tqdm.set_lock(threading.RLock())
    _driver = driver
    threading.Thread(target=_exit_without_driver, name="dpeval-driver-watch", daemon=True).start()


def _exit_without_driver() -> None:
    """End this worker within ``DRIVER_POLL_S`` of its driver's death (``kill -9``, a crash), which orphans
    it (a new parent): ProcessPoolExecutor's workers would finish their point and then wait forever for the
    next, while a new sweep on the folder could run the same point. Its point is first recorded ``failed``
    as interrupted, so that the next sweep resumes it from its last checkpoint."""
    while os.getppid() == _driver:
        time.sleep(DRIVER_POLL_S)
    try:
        job = _current
        if job is not None:
            store, run_id = job
            log.warning("the sweep driver (pid %d) is gone: run %s stops here, to be resumed by the next sweep",
                        _driver, run_id)
            store.abandon(run_id, DRIVER_GONE)
    finally:
        os._exit(1)  # also when the store cannot be written: the next command then reaps the row


def _worker_job(canonical: dict[str, Any], run_id: str, run_dir: str, workers: int) -> dict[str, Any]:
    """``run_job`` in a worker process, which first takes the point's row over from the driver
    (``ResultStore.claim``)."""
    global _current
    store = ResultStore.of_run(run_dir)
    _current = (store, run_id)
    try:
        if not store.claim(run_id, _driver):
            raise RunFailure(f"run {run_id} is no longer this sweep's: its driver is gone")
        return run_job(canonical, run_id, run_dir, workers)
    finally:
        _current = None


class ProcessExecutor(Executor):
    """``workers`` processes (spawned: fork and torch threads do not mix), the idle cores' threads split
    among them, each a lane that runs one point at a time.

    Points that play the same membership game (an online point and its offline twin: the same victim, K and
    target; ``shadow_games``) run in one lane, one after the other and never side by side: the game's shadow
    models stay in the memory of the process that trained them, so the second point reuses them where a second
    worker would train them all again. Other points go to whichever lane is free.

    Interrupted (Ctrl-C, SIGTERM, SIGHUP raised in the driver), it records the points that finished and
    terminates the workers at once, instead of waiting for the running points. Killed outright, it leaves
    workers that stop on their own (``_exit_without_driver``). A worker killed on its own (``kill -9``, the OOM
    killer) fails the point it ran, said in one line, and its lane goes on in a fresh process."""

    def __init__(self, workers: int, debug: bool = False) -> None:
        self.workers = workers
        self.debug = debug

    def run(self, specs, dispatch, on_result):
        from dpeval.attacks.membership_game import shadow_games

        queue = [(spec, shadow_games(spec)) for spec in specs]
        lanes = [self._lane() for _ in range(self.workers)]
        games: list[frozenset[str]] = [frozenset()] * self.workers  # the games of each lane's last point
        pending: dict[Future, tuple[int, tuple]] = {}
        stop = False
        try:
            while (queue and not stop) or pending:
                busy = {lane for lane, _ in pending.values()}
                for lane in range(self.workers):
                    if lane in busy or stop or not queue:
                        continue
                    others = frozenset().union(*(games[other] for other in range(self.workers) if other != lane))
                    index = next_point([g for _, g in queue], games[lane], others)
                    if index is None and not pending and lane == self.workers - 1:
                        index = 0  # every lane idle, each point left shares a game with two of them: one goes on
                    if index is None:
                        continue
                    spec, games[lane] = queue.pop(index)
                    job = dispatch(spec)
                    future = lanes[lane].submit(_worker_job, spec.canonical(), job[1], str(job[2]), self.workers)
                    pending[future] = (lane, job)
                    busy.add(lane)
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    lane, job = pending.pop(future)
                    stop = _report(future, job, on_result) or stop
                    if isinstance(future.exception(), BrokenProcessPool):  # its worker died: a new one takes over
                        lanes[lane].shutdown(wait=False)
                        lanes[lane] = self._lane()
                        games[lane] = frozenset()  # the new process holds no shadows
        except BaseException:
            for future in [f for f in pending if f.done()]:  # finished before the interruption: keep them
                _report(future, pending.pop(future)[1], on_result)
            for pool in lanes:
                _terminate(pool)
            raise
        for pool in lanes:
            pool.shutdown()

    def _lane(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_start_worker,
                                   initargs=(self.debug, os.getpid()))


def next_point(queue: list[frozenset[str]], mine: frozenset[str], others: frozenset[str]) -> int | None:
    """The index in ``queue`` (each point's membership games) of the point a free lane runs next, given the games
    of its own last point (``mine``: their shadows are in its memory) and of the other lanes' current or last
    points (``others``: each lane keeps the games it played): the first point that plays one of its games, else
    the first that plays none of the others'; None when every point left belongs to another lane."""
    free = [index for index, point in enumerate(queue) if not point & others]
    return next((index for index in free if queue[index] & mine), free[0] if free else None)


def _report(future: Future, job: tuple, on_result: Callable) -> bool:
    try:
        metrics = future.result()
    except BrokenProcessPool:
        return on_result(job, None, "WorkerKilled: the worker process running it ended abruptly (killed by a "
                                    "signal, e.g. SIGKILL from the out-of-memory killer); nothing of it was kept")
    except Exception as exc:
        return on_result(job, getattr(exc, "metrics", None), f"{type(exc).__name__}: {exc}")
    return on_result(job, metrics, None)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now, running points included (Python 3.14 has ``terminate_workers`` for this)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


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
                    write_atomic(target, lambda f, data=data: f.write(data))
                stop = on_result(job, metrics, None)
            if stop:
                for ref in refs:
                    self.ray.cancel(ref)
                return

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
