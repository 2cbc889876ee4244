"""Where computations run: the device a run asks for, and the CPU thread count of small-op workloads."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

from dpeval.core.errors import ConfigError
from dpeval.core.processes import THREADS_ENV, check_threads, cores_available


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a device is a ConfigError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available; use auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


log = logging.getLogger("dpeval")


def default_threads(workers: int = 1) -> int:
    """Intra-op CPU threads for each of ``workers`` concurrent run processes: the cores this process may run on,
    shared evenly, at least one. The machine's load is deliberately not consulted: float reductions differ
    between thread counts, so a count that followed the load would give the same seed another number on a busy
    machine. A fixed count keeps a configuration's metrics identical on one machine whatever else runs there.

    The price could be speed on a busy machine: threads that spin while they wait trained 7-26× slower there than
    one thread; every command therefore makes them sleep (``OMP_WAIT_POLICY=PASSIVE``), which brings two threads
    level with one (docs/performance.md, "CPU threads"); ``--threads N`` or ``OMP_NUM_THREADS=N`` chooses another
    count."""
    return max(1, cores_available() // max(workers, 1))


def user_threads() -> int | None:
    """The thread count the user chose through ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``), if a positive integer;
    one above the cores this process may use is a ConfigError naming the variable (``check_threads``), never handed
    to the thread pool."""
    for name in THREADS_ENV:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value[:20] or 0) > 0:
            return check_threads(value, name)
    return None


def apply_thread_default(workers: int = 1) -> int:
    """Set torch's intra-op threads to the user's choice (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``, which
    ``--threads`` sets) or else ``default_threads(workers)``; returns the count in force (a run records it as
    ``time.threads``). A single run that takes the default on a machine whose other load leaves it fewer idle
    cores than threads says so once, with the flag that avoids the oversubscription: the count itself never
    follows the load (``default_threads``)."""
    chosen = user_threads()
    threads = chosen or default_threads(workers)
    torch.set_num_threads(threads)
    if chosen is None and workers == 1 and threads > 1 and not passive_wait():
        idle = idle_cores()
        if idle < threads:
            log.warning("the machine is busy (about %d of %d cores idle): %d CPU threads that spin while they wait "
                        "can train tens of times slower here than --threads 1 or OMP_WAIT_POLICY=PASSIVE set before "
                        "torch is imported (7-26x measured, docs/performance.md); the thread count does not follow "
                        "the load, so the metrics stay those of %d threads", idle, cores_available(), threads, threads)
    return torch.get_num_threads()


def passive_wait() -> bool:
    """Whether OpenMP's threads sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, which every dpeval command sets
    unless the user chose): then a busy machine costs a thread count little (docs/performance.md, "CPU threads")."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def idle_cores() -> int:
    """The cores the 1-minute load average leaves idle (all of them where the load is unknown), at least one."""
    try:
        return max(1, round(cores_available() - os.getloadavg()[0]))
    except OSError:
        return cores_available()


@contextlib.contextmanager
def single_cpu_thread(device: torch.device | str) -> Iterator[None]:
    """Run a block with one intra-op CPU thread (restored afterwards).

    Optimisation attacks and the canary audit issue thousands of tiny ops per second; on CPU, intra-op
    threads only add synchronisation (measured on a loaded 2-core machine: 5 s with one thread vs 36 s
    with two for the default ``ig`` run, 4 s vs 58 s for ``rgap``), and one thread makes CPU results
    independent of the core count."""
    if torch.device(device).type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def known_torch_state(generators: bool = True) -> Iterator[None]:
    """Run a block in dpeval's known global torch state — default dtype float32, autograd on (also inside a
    caller's ``no_grad`` or ``inference_mode``), torch's default algorithm selection and float32 matmul precision —
    and give the caller's state back afterwards, also when the block raises: those settings, the intra-op thread
    count (a run sets its own) and the global random generators of torch, NumPy and Python (a run seeds them).
    So a call neither depends on nor changes what its caller set. ``generators`` False leaves the random generators
    as the block leaves them (a user's function called during a run draws from them as it always did)."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    strict = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    precision = torch.get_float32_matmul_precision()
    python_rng, numpy_rng = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices, enabled=generators), torch.inference_mode(False), \
                torch.enable_grad():
            torch.set_default_dtype(torch.float32)
            torch.use_deterministic_algorithms(False)
            torch.set_float32_matmul_precision("highest")
            yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict, warn_only=warn_only)
        torch.set_float32_matmul_precision(precision)
        if generators:
            random.setstate(python_rng)
            np.random.set_state(numpy_rng)


def in_known_torch_state(func: F) -> F:
    """``func`` run under :func:`known_torch_state` (the public API's entry points)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with known_torch_state():
            return func(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
