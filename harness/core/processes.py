"""Whether a process recorded by pid still runs (the store's ``running`` rows, a sweep's workers)."""

import os
from pathlib import Path


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
