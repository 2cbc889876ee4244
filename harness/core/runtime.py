"""Where computations run: the device a run asks for, and the CPU thread count of small-op workloads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness.core.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when present, else CPU; ``cuda`` without a device is a ConfigError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available; use auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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
