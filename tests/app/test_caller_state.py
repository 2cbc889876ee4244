"""The Python API neither depends on nor changes its caller's global torch state: a run from a caller whose default
dtype is float64, or inside ``torch.no_grad()`` / ``torch.inference_mode()``, trains in dpeval's known state and gives
the plain caller's numbers; afterwards (also when the call raises) the caller's dtype, grad mode, thread count,
algorithm settings and random generators are what they were. And configuring from several threads at once finds
every name (the registries load their modules under a lock)."""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import dpeval
from dpeval import runner


def spec():
    return dpeval.configure(defense="dpsgd", train__epochs=1, train__batch_size=256)


def numbers(result):
    weights = torch.load(result.folder / "model.pt", weights_only=True)
    return (result.utility.test_accuracy, result.utility.train_accuracy, result.privacy.epsilon,
            {k: v.dtype for k, v in weights.items()}, torch.cat([v.flatten().double() for v in weights.values()]))


@pytest.fixture(scope="module")
def plain():
    return numbers(dpeval.run(spec()))


@contextmanager
def float64_default():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("caller", [float64_default, torch.no_grad, torch.inference_mode],
                         ids=["float64", "no_grad", "inference_mode"])
def test_a_run_gives_the_plain_callers_numbers_whatever_the_callers_torch_state(plain, caller):
    with caller():
        got = numbers(dpeval.run(spec()))
    assert got[:4] == plain[:4]
    assert torch.equal(got[4], plain[4])


def caller_state():
    return {"dtype": torch.get_default_dtype(), "grad": torch.is_grad_enabled(), "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "matmul": torch.get_float32_matmul_precision(), "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state()[1].copy(), "python_rng": random.getstate()}


def same(a, b):
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else np.array_equal(a[k], b[k])
               if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


@contextmanager
def unusual_caller_state():
    """A caller in float64, without autograd, at 3 threads, with strict algorithms, medium matmul precision and
    its own seeds; restored to the suite's state afterwards."""
    threads = torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(3)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("medium")
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
        torch.set_float32_matmul_precision("highest")


def test_the_callers_state_is_restored_after_a_run(tmp_path):
    with unusual_caller_state():
        before = caller_state()
        dpeval.run(spec(), out=tmp_path)
        after = caller_state()
    assert same(before, after), {k for k in before if not same({k: before[k]}, {k: after[k]})}


def test_the_callers_state_is_restored_when_a_run_raises(monkeypatch, tmp_path):
    def perform(*args, **kwargs):  # the run changes global state, then fails
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        torch.manual_seed(7)
        np.random.seed(7)
        raise RuntimeError("planted failure")

    monkeypatch.setattr(runner, "perform", perform)
    with unusual_caller_state():
        before = caller_state()
        with pytest.raises(RuntimeError, match="planted failure"):
            dpeval.run(spec(), out=tmp_path)
        after = caller_state()
    assert same(before, after)


def test_a_shadow_function_that_changes_the_default_dtype_changes_nothing_for_the_caller():
    task = dpeval.load_data(data__name="digits")
    model = dpeval.build_model({"defense": "none", "train": {"epochs": 1}})

    def float64_shadow(model, x, y, seed):
        torch.set_default_dtype(torch.float64)  # a user's function with a global side effect

    recipe = {"defense": {"name": "none"}, "train": {"epochs": 1}, "attack": {"shadows": 6}}
    dpeval.score_membership(model, task.train, task.test, recipe, ["lira"], train_shadow=float64_shadow)
    assert torch.get_default_dtype() == torch.float32


def test_the_model_built_for_a_float64_caller_is_the_run_model(plain):
    reference = dpeval.build_model({"train": {"epochs": 1}})
    with float64_default():
        built = dpeval.build_model({"train": {"epochs": 1}})
    dtypes = {k: v.dtype for k, v in reference.state_dict().items()}
    assert {k: v.dtype for k, v in built.state_dict().items()} == dtypes
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), reference.state_dict().values()))


def test_configure_from_threads_at_once_finds_every_name(monkeypatch):
    """Four threads configure at once while the registries still have to read their declarations (slowed down
    here, as a busy disk would): each finds `dpsgd`, none sees a half-read registry."""
    from dpeval.attacks import ATTACKS
    from dpeval.core import registry
    from dpeval.core.registry import DATASETS, MODELS
    from dpeval.defenses import DEFENSES

    read = registry._declarations

    def slow_declarations(path, var):
        found = read(path, var)
        time.sleep(0.005)
        return found

    monkeypatch.setattr(registry, "_declarations", slow_declarations)
    for reg in (DEFENSES, ATTACKS, DATASETS, MODELS):
        monkeypatch.setattr(reg, "_builtin", None)
        monkeypatch.setattr(reg, "_declared", None)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def configure():
        barrier.wait()
        try:
            dpeval.configure(defense="dpsgd", attacks=["loss"], data__name="digits")
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever a thread raised
            errors.append(exc)

    threads = [threading.Thread(target=configure) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
