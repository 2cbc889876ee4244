"""Where computations run: the device a run asks for, and the CPU thread count of small-op workloads."""

from __future__ import annotations

import contextlib
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


THREADS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # a user's explicit choice, never overridden


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_threads(workers: int = 1) -> int:
    """Intra-op CPU threads for each of ``workers`` concurrent run processes: the cores that are idle now
    (available cores minus the 1-minute load average), shared evenly, at least one.

    Measured on the 2-core development machine (docs/performance.md): under load, two threads made
    ``dpeval run --defense rs --attack ig`` train 3.6× slower than one (84.2 s vs 23.1 s; busy cores make the
    threads wait for each other); idle, two threads trained a Fashion-MNIST epoch of DP-CNN/S 1.6× faster than
    one (11.5 s vs 18.2 s). Oversubscription costs more than an idle core, so only idle cores are used."""
    cores = cores_available()
    try:
        idle = round(cores - os.getloadavg()[0])
    except OSError:  # load average unavailable
        idle = cores
    return max(1, min(cores, idle) // max(workers, 1))


def apply_thread_default(workers: int = 1) -> int:
    """Set torch's intra-op threads to ``default_threads(workers)`` unless the user chose a count through the
    environment (``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``); returns the count in force."""
    if not any(os.environ.get(name) for name in THREADS_ENV):
        torch.set_num_threads(default_threads(workers))
    return torch.get_num_threads()


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
