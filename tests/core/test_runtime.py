"""The CPU thread default: the cores this process may use, shared among concurrent run processes, never the
machine's load (so a seed gives one number on a busy machine too); an explicit OMP_NUM_THREADS /
MKL_NUM_THREADS (which ``--threads`` sets) always wins."""

import os

import pytest
import torch

from dpeval.core import runtime


@pytest.mark.parametrize("cores,workers,expected", [
    (2, 1, 2),    # one run: every core
    (2, 2, 1),    # two sweep workers: one each
    (16, 3, 5),   # shared evenly, rounded down
    (16, 32, 1),  # more workers than cores: still one
])
def test_default_threads_shares_the_cores_among_workers(monkeypatch, cores, workers, expected):
    monkeypatch.setattr(runtime, "cores_available", lambda: cores)
    assert runtime.default_threads(workers) == expected


@pytest.mark.parametrize("load", [0.0, 1.3, 7.5])
def test_default_threads_does_not_follow_the_load(monkeypatch, load):
    monkeypatch.setattr(runtime, "cores_available", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert runtime.default_threads() == 2


def test_an_explicit_environment_choice_wins(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(runtime, "default_threads", lambda workers=1: 1)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(1)
        assert runtime.apply_thread_default() == 2  # the user's 2 is applied even though torch had 1
        monkeypatch.setenv("OMP_NUM_THREADS", "zero")  # not a count: ignored
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        assert runtime.apply_thread_default() == 1
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert runtime.apply_thread_default() == 1  # no choice made: the default applies
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("load,policy,warned", [(0.2, None, False), (1.8, None, True), (1.8, "ACTIVE", True),
                                                (1.8, "PASSIVE", False)])
def test_a_busy_machine_is_named_but_the_count_stays(monkeypatch, caplog, load, policy, warned):
    """Threads that spin while they wait are what a busy machine punishes: named unless they sleep (PASSIVE)."""
    before = torch.get_num_threads()
    try:
        for name in runtime.THREADS_ENV:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        if policy is not None:
            monkeypatch.setenv("OMP_WAIT_POLICY", policy)
        monkeypatch.setattr(runtime, "cores_available", lambda: 2)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        with caplog.at_level("WARNING", logger="dpeval"):
            assert runtime.apply_thread_default() == 2
        assert ("--threads 1" in caplog.text) is warned
        assert ("OMP_WAIT_POLICY=PASSIVE" in caplog.text and "tens of times" in caplog.text) is warned
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("given,expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE"), ("passive", "passive")])
def test_the_cli_makes_openmp_threads_sleep_before_torch_starts_them(given, expected):
    """Every command sets OMP_WAIT_POLICY=PASSIVE (unless the user chose a policy) before anything imports torch,
    whose thread pool reads it once: spinning threads made a run 18× slower beside one busy process."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = ("import os, sys\nfrom dpeval.cli import main\nmain(['list'], standalone_mode=False)\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[-1] == f"{expected} False", out.stderr
