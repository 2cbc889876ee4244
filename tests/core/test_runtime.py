"""The CPU thread default: only idle cores, shared among concurrent run processes; an explicit
OMP_NUM_THREADS / MKL_NUM_THREADS is never overridden."""

import os

import pytest
import torch

from dpeval.core import runtime


@pytest.mark.parametrize("cores,load,workers,expected", [
    (2, 0.1, 1, 2),   # idle 2-core machine, one run: both cores
    (2, 0.1, 2, 1),   # two sweep workers: one each
    (2, 1.3, 1, 1),   # one core busy elsewhere: one thread (oversubscription is the costly mistake)
    (2, 5.9, 1, 1),   # loaded machine: still at least one
    (16, 3.2, 2, 6),  # 12 idle cores for 2 workers
    (16, 0.0, 32, 1),  # more workers than cores
])
def test_default_threads_uses_idle_cores_shared_among_workers(monkeypatch, cores, load, workers, expected):
    monkeypatch.setattr(runtime, "cores_available", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert runtime.default_threads(workers) == expected


def test_an_explicit_environment_choice_is_kept(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(runtime, "default_threads", lambda workers=1: 1)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert runtime.apply_thread_default() == 2  # the user's 2 stays
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        assert runtime.apply_thread_default() == 1  # no choice made: the default applies
    finally:
        torch.set_num_threads(before)
