"""What used to end in a traceback or a wrong exit: a plug-in defense whose release raises under `dpeval audit`
(either scope) and a divergence inside the whole-run audit are one line and exit 1; a plug-in model that is frozen,
on the meta device or float64 is refused before training (exit 2); `score_membership` refuses a model it cannot use
(meta device, an attribute that cannot be copied) naming `model`; `attack_release` takes the documented
`SharedGradient` return; `report` stopped by SIGTERM / SIGHUP exits 143 / 129."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import dpeval
from dpeval.cli import main
from dpeval.core.errors import ConfigError
from dpeval.core.registry import MODELS
from dpeval.defenses import DEFENSES
from dpeval.defenses.dpsgd import DPSGD

ROOT = Path(__file__).resolve().parents[2]


class RaisingRelease(DPSGD):
    def release(self, batch_size):
        raise ZeroDivisionError("the plug-in's own bug")


@pytest.fixture
def raising_defense():
    DEFENSES.register("raising-release", "test: a release that raises")(RaisingRelease)
    yield
    DEFENSES.unregister("raising-release")


def one_line(result, code, *names):
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("dpeval: "), result.stderr
    assert all(n in lines[0] for n in names), lines[0]


@pytest.mark.parametrize("scope", ["release", "run"])
def test_an_audited_release_that_raises_is_one_line(raising_defense, scope):
    args = ["audit", "--defense", "raising-release", "--scope", scope, "--quiet", "--set", "train.epochs=2"]
    args += ["--trials", "100"] if scope == "release" else ["--canaries", "100"]
    result = CliRunner().invoke(main, args)
    one_line(result, 1, "audit of raising-release failed", "ZeroDivisionError", "the plug-in's own bug")


def test_a_divergence_inside_the_run_audit_is_one_line():
    result = CliRunner().invoke(main, ["audit", "--defense", "dpsgd", "--scope", "run", "--quiet", "--canaries", "100",
                                       "--set", "train.epochs=2", "--set", "train.lr=1e30"])
    one_line(result, 1, "audit of dpsgd failed", "Diverged", "train.lr")


def frozen(in_shape, num_classes):
    c, h, w = in_shape
    net = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))
    net.requires_grad_(False)
    return net


def on_meta(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes, device="meta"))


def float64(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes, dtype=torch.float64))


@pytest.mark.parametrize("factory,said", [(frozen, "no trainable parameter"), (on_meta, "meta device"),
                                          (float64, "float64")], ids=["frozen", "meta", "float64"])
def test_a_plugin_model_that_cannot_train_is_refused_before_training(factory, said, tmp_path):
    name = f"test-{factory.__name__}"
    MODELS.register(name, "test: a model dpeval cannot train")(factory)
    try:
        result = CliRunner().invoke(main, ["run", "--model", name, "--epochs", "1", "--attack", "none", "--threads",
                                           "1", "--results", str(tmp_path / "res")])
    finally:
        MODELS.unregister(name)
    one_line(result, 2, "model.name", said)
    assert not (tmp_path / "res").exists()


class Locked(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        self.lock = threading.Lock()  # cannot be copied or pickled

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("model,said", [
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 10, device="meta")), "meta device"),
    (Locked, "cannot be copied"),
], ids=["meta", "lock"])
def test_score_membership_refuses_a_model_it_cannot_use(model, said):
    task = dpeval.load_data(data__name="digits")
    with pytest.raises(ConfigError, match=f"^model: .*{said}"):
        dpeval.score_membership(model(), task.train, task.test, {"train": {"epochs": 1}}, ["loss"])


def test_attack_release_takes_a_shared_gradient_as_documented():
    from dpeval.defenses.base import SharedGradient

    def masked(grads, generator):
        values = {n: g.mean(0) for n, g in grads.items()}
        mask = {n: torch.ones_like(v, dtype=torch.bool) for n, v in values.items()}
        return SharedGradient(values, batch_size=len(next(iter(grads.values()))), noise_std=0.0, mask=mask)

    result = dpeval.attack_release(masked, {"attack": {"rgap": {"targets": 6}}}, ["rgap"])
    assert result.attacks["rgap"].error is None and result.attacks["rgap"].leaks


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_report_stopped_by_a_signal_exits_with_its_code(signum, code, tmp_path, monkeypatch):
    """The signal arrives while a library runs code that swallows exceptions (a callback, a finaliser: Python only
    prints what those raise), so the report goes on and finishes: it must still end with the signal's code."""
    import dpeval.report
    from tests.app.test_bad_input import record_runs

    record_runs(tmp_path / "store", 2)
    real = dpeval.report.write_report

    def interrupted(*args, **kwargs):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(1)  # the handler runs here and raises
        except BaseException:  # noqa: BLE001 - what a library's callback does with it
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(dpeval.report, "write_report", interrupted)
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "store"), "--out",
                                       str(tmp_path / "r.html")])
    assert result.exit_code == code, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("dpeval: terminated by"), result.stderr
