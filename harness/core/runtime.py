"""Where computations run: the device a run asks for, and the CPU thread count of small-op workloads."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch

from dpeval.core.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a device is a ConfigError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available; use auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


log = logging.getLogger("dpeval")
THREADS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # a user's explicit choice, never overridden


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(workers: int = 1) -> int:
    """Intra-op CPU threads for each of ``workers`` concurrent run processes: the cores this process may run on,
    shared evenly, at least one. The machine's load is deliberately not consulted: float reductions differ
    between thread counts, so a count that followed the load would give the same seed another number on a busy
    machine. A fixed count keeps a configuration's metrics identical on one machine whatever else runs there.

    The price is speed on a busy machine (docs/performance.md, "CPU threads": oversubscribed threads trained
    3.6× slower there than one thread); ``--threads N`` or ``OMP_NUM_THREADS=N`` chooses another count."""
    return max(1, cores_available() // max(workers, 1))


def user_threads() -> int | None:
    """The thread count the user chose through ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``), if a positive integer."""
    for name in THREADS_ENV:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
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
    if chosen is None and workers == 1 and threads > 1:
        idle = idle_cores()
        if idle < threads:
            log.warning("the machine is busy (about %d of %d cores idle): %d CPU threads may train several times "
                        "slower than --threads 1 here; the thread count does not follow the load, so the metrics "
                        "stay those of %d threads", idle, cores_available(), threads, threads)
    return torch.get_num_threads()


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
