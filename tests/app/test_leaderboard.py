"""Leaderboard records: Pareto front per attack, sorting, seed grouping, CSV."""

import csv
import io
import math

import pytest

from attacks import ATTACKS
from attacks.base import Attack
from harness import leaderboard as lb
from harness.core.errors import ConfigError


def row(run_id, seed, acc, psnr=None, auc=None, rate=0.0):
    metrics = {"dataset": "digits", "defense": "rs", "seed": seed, "defense.final_rate": rate,
               "utility.test_accuracy": acc, "privacy.epsilon": 3.0, "utility.test_accuracy_by_epoch": [acc]}
    if psnr is not None:
        metrics["leakage.ig.psnr"] = psnr
    if auc is not None:
        metrics["leakage.lira.auc"] = auc
    config = {"defense": {"name": "rs", "final_rate": rate}, "seed": seed}
    return {"run_id": run_id, "run_key": run_id, "status": "done", "metrics": metrics, "config": config}


def test_pareto_front_per_attack():
    rows = [row("a", 0, 0.90, psnr=30), row("b", 0, 0.80, psnr=20), row("c", 0, 0.70, psnr=25),  # c dominated by b
            row("d", 0, 0.90, psnr=31), row("e", 0, 0.95, auc=0.6)]
    records = {r["run_id"]: r for r in lb.leaderboard(rows)}
    assert records["a"]["pareto.ig"] and records["b"]["pareto.ig"]
    assert not records["c"]["pareto.ig"] and not records["d"]["pareto.ig"]  # d: same accuracy, more leakage
    assert "pareto.ig" not in records["e"] and records["e"]["pareto.lira"]


@pytest.fixture
def lower_leaks():
    """A plug-in attack whose declared headline (a reconstruction error) leaks more when lower."""

    @ATTACKS.register("mse-probe", "test plug-in: reconstruction MSE, lower = more leakage")
    class MseProbe(Attack):
        headline, higher_leaks = "mse", False

        def run(self, context):
            raise NotImplementedError

    yield "mse-probe"
    ATTACKS.unregister("mse-probe")


def test_lower_mse_means_more_leakage(lower_leaks):
    rows = [row("a", 0, 0.9), row("b", 0, 0.9)]
    rows[0]["metrics"][f"leakage.{lower_leaks}.mse"] = 0.01
    rows[1]["metrics"][f"leakage.{lower_leaks}.mse"] = 0.2
    records = {r["run_id"]: r for r in lb.leaderboard(rows)}
    assert records["b"][f"pareto.{lower_leaks}"] and not records["a"][f"pareto.{lower_leaks}"]
    assert "lower = more leakage" in lb.headline_label(lower_leaks)


def test_only_the_declared_headline_ranks():
    """ig declares PSNR as its headline: its MSE alone puts no run on a Pareto front."""
    rows = [row("a", 0, 0.9), row("b", 0, 0.9)]
    rows[0]["metrics"]["leakage.ig.mse"] = 0.01
    rows[1]["metrics"]["leakage.ig.mse"] = 0.2
    records = {r["run_id"]: r for r in lb.leaderboard(rows)}
    assert "pareto.ig" not in records["a"] and "pareto.ig" not in records["b"]
    assert lb.headline({"leakage.ig.psnr", "leakage.ig.mse"}, "ig") == ("leakage.ig.psnr", True)


def test_sorting_and_unknown_column():
    rows = [row("a", 0, 0.5), row("b", 0, 0.9), row("c", 0, 0.7)]
    assert [r["run_id"] for r in lb.leaderboard(rows, sort="utility.test_accuracy")] == ["a", "c", "b"]
    assert [r["run_id"] for r in lb.leaderboard(rows, sort="utility.test_accuracy", descending=True)] == ["b", "c", "a"]
    with pytest.raises(ConfigError, match="--sort"):
        lb.leaderboard(rows, sort="nope")


def test_group_seeds_mean_and_sem():
    rows = [row("a", 0, 0.8, rate=0.5), row("b", 1, 0.9, rate=0.5), row("c", 2, 1.0, rate=0.5), row("d", 0, 0.3, rate=0.9)]
    groups = sorted(lb.leaderboard(rows, seeds_grouped=True), key=lambda g: g["defense.final_rate"])
    assert [g["n"] for g in groups] == [3, 1]
    assert groups[0]["utility.test_accuracy"] == pytest.approx(0.9)
    assert groups[0]["utility.test_accuracy.sem"] == pytest.approx(0.1 / math.sqrt(3))
    assert groups[0]["defense.final_rate"] == 0.5 and "defense.final_rate.sem" not in groups[0]
    assert groups[0]["seeds"] == "0 1 2"


def test_csv_has_fixed_leading_columns_and_no_lists():
    handle = io.StringIO()
    lb.write_csv(lb.leaderboard([row("a", 0, 0.5, psnr=12.0)]), handle)
    reader = csv.DictReader(io.StringIO(handle.getvalue()))
    assert reader.fieldnames[:8] == ["run_id", "run_key", "status", "dataset", "model", "defense", "attack", "seed"]
    assert "utility.test_accuracy_by_epoch" not in reader.fieldnames
    assert next(reader)["leakage.ig.psnr"] == "12.0"


def test_failed_runs_are_not_on_the_board():
    failed = row("x", 0, 0.1)
    failed["status"] = "failed"
    assert [r["run_id"] for r in lb.leaderboard([row("a", 0, 0.5), failed])] == ["a"]
