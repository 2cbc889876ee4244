"""NaN and infinity are never a verdict: a defense (a plug-in) whose release is not finite, and an attack whose
headline or statistic comes out NaN, are errors — `dpeval audit` exits 1 in one line, a run records the attack as
failed (exit 1), the Python API raises — never `PASS`, `no-leak-detected` or `psnr nan`."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

import dpeval
from dpeval.cli import main
from dpeval.defenses import DEFENSES
from dpeval.defenses.dpsgd import DPSGD
from dpeval.store import ResultStore


class NanRelease(DPSGD):
    """A DP defense whose every release is NaN (a plug-in with a bug)."""

    def release(self, batch_size):
        shared = super().release(batch_size)
        for value in shared.grads.values():
            value.fill_(math.nan)
        return shared


class InfNoise(DPSGD):
    """One whose noise std says infinity (a release scaled by it overflows)."""

    def release(self, batch_size):
        shared = super().release(batch_size)
        for value in shared.grads.values():
            value.fill_(math.inf)
        return shared


@pytest.fixture
def broken_defenses():
    for name, cls in (("nan-release", NanRelease), ("inf-release", InfNoise)):
        DEFENSES.register(name, "test: a release that is not finite")(cls)
    yield
    for name in ("nan-release", "inf-release"):
        DEFENSES.unregister(name)


def one_line(result, code, *names, warnings=False):
    """The command's one error line (after the run's warnings, with ``warnings``), naming ``names``."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output, result.output
    assert (warnings or len(lines) == 1) and lines[-1].startswith("dpeval: "), result.stderr
    assert all(n in lines[-1] for n in names), lines[-1]
    return lines[-1]


@pytest.mark.parametrize("name", ["nan-release", "inf-release"])
def test_the_release_audit_of_a_nonfinite_release_is_an_error_not_a_pass(broken_defenses, name):
    result = CliRunner().invoke(main, ["audit", "--defense", name, "--trials", "200", "--quiet"])
    one_line(result, 1, "audit", "NaN or infinite", name)
    assert "PASS" not in result.stdout


def test_the_run_audit_of_a_nonfinite_release_is_an_error_not_a_pass(broken_defenses):
    result = CliRunner().invoke(main, ["audit", "--defense", "nan-release", "--scope", "run", "--quiet",
                                       "--set", "train.epochs=1", "--canaries", "100"])
    one_line(result, 1, "audit")
    assert "PASS" not in result.stdout


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(dpeval.build_model({"defense": "dpsgd", "train": {"epochs": 1}}).state_dict(), path)
    return path


@pytest.mark.parametrize("attack,sets", [
    ("informed-recon", ["attack.informed-recon.targets=4", "attack.informed-recon.candidates=3"]),
    ("rgap", ["attack.rgap.targets=2"]),
    ("ig", ["attack.ig.targets=1", "attack.ig.iterations=2", "attack.ig.restarts=1"]),
    ("grad-mia", ["attack.grad-mia.batches=2"]),
], ids=["informed-recon", "rgap", "ig", "grad-mia"])
def test_an_attack_on_nonfinite_releases_fails_the_run(broken_defenses, weights, tmp_path, attack, sets):
    results = tmp_path / "res"
    args = ["run", "--defense", "nan-release", "--epochs", "1", "--weights", str(weights), "--attack", attack,
            "--results", str(results), "--quiet"]
    result = CliRunner().invoke(main, args + [a for s in sets for a in ("--set", s)])
    line = one_line(result, 1, "NaN or infinite", warnings=True)
    (row,) = ResultStore(results).rows()
    assert row["status"] == "failed" and row["run_id"] in line
    assert f"leakage.{attack}.verdict" not in row["metrics"]
    assert "nan-release" in row["metrics"][f"leakage.{attack}.error"]


def test_a_nan_headline_is_an_attack_error_not_a_verdict(monkeypatch, tmp_path):
    """Whatever the cause (here the loss attack's AUC made NaN), an attack whose headline is not finite fails."""
    from dpeval.attacks import membership_game

    real = membership_game.membership_metrics

    def nan_auc(*args, **kwargs):
        return {**real(*args, **kwargs), "auc": math.nan}

    monkeypatch.setattr(membership_game, "membership_metrics", nan_auc)
    result = dpeval.run(dpeval.configure(defense="none", attacks=["loss"], train__epochs=1), out=tmp_path)
    outcome = result.attacks["loss"]
    assert outcome.verdict is None and outcome.error is not None and "auc" in outcome.error
    assert result.status == "failed"


def test_attack_release_raises_on_a_shared_gradient_holding_nan():
    from dpeval.core.errors import ConfigError
    from dpeval.defenses.base import SharedGradient

    def nan_shared(grads, generator):
        return SharedGradient({n: torch.full(g.shape[1:], math.nan) for n, g in grads.items()}, batch_size=1,
                              noise_std=0.0)

    with pytest.raises(ConfigError, match="release: .*NaN or infinite"):
        dpeval.attack_release(nan_shared, {"attack": {"rgap": {"targets": 2}}}, ["rgap"])
