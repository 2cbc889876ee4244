"""Whether a process recorded by pid still runs (the store's ``running`` rows, a sweep's workers), and the cores
this process may use (torch-free: the CLI bounds ``--threads`` and ``--workers`` before torch is imported)."""

import os
from pathlib import Path

from dpeval.core.errors import ConfigError, brief

THREADS_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # a user's explicit choice, never overridden
WORKERS_PER_CORE = 4  # a sweep's worker processes: at most this many per core (a GPU packs several runs per core)


def cores_available() -> int:
    """CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_count(value: object, field: str, most: int, what: str) -> int:
    """``value`` as a whole number from 1 to ``most``; ConfigError naming ``field`` otherwise (``what`` says where
    the limit comes from). Absurd counts never reach the OS or the allocator."""
    text = str(value).strip()
    if not text.isdigit() or len(text) > 19 or not 1 <= int(text) <= most:
        raise ConfigError(f"{field}: must be a whole number from 1 to {most} ({what}), got {brief(value, 40)}")
    return int(text)


def check_threads(value: object, field: str) -> int:
    """A thread count: at most the cores this process may use (more only oversubscribes them)."""
    cores = cores_available()
    return check_count(value, field, cores, f"the {cores} CPU cores this process may use")


def check_workers(value: object, field: str) -> int:
    """A sweep's local worker processes: at most ``WORKERS_PER_CORE`` per core this process may use."""
    most = WORKERS_PER_CORE * cores_available()
    return check_count(value, field, most, f"{WORKERS_PER_CORE} per CPU core this process may use")


def alive(pid: int | None) -> bool:
    """Whether ``pid`` names a live process on this host (a zombie is not alive)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not zombie(pid)


def zombie(pid: int) -> bool:
    """Whether ``pid`` has exited but was not yet waited for (Linux; False where /proc cannot tell): an
    orphan whose new parent (a container's init) does not reap it still answers ``kill(pid, 0)``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False
