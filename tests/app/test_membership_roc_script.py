"""bench/membership_roc.py: the gridded ROC is the run's ROC, and collect reads real runs."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from sklearn.metrics import roc_curve

from dpeval.cli import main

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("membership_roc", ROOT / "bench/membership_roc.py")
membership_roc = importlib.util.module_from_spec(spec)
sys.modules["membership_roc"] = membership_roc
spec.loader.exec_module(membership_roc)


def test_the_grid_reads_the_full_roc_from_sklearns_thinned_one():
    """sklearn drops collinear ROC points; interpolating the thinned curve equals interpolating the full one,
    and at an FPR where the TPR jumps the grid takes the top of the step."""
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(400), np.zeros(1000)]
    scores = np.round(rng.normal(labels * 0.8, 1.0), 1)  # rounded: ties make vertical and diagonal segments
    thin_f, thin_t, _ = roc_curve(labels, scores)
    full_f, full_t, _ = roc_curve(labels, scores, drop_intermediate=False)
    assert len(thin_f) < len(full_f)
    grid, tpr = membership_roc.curve_on_grid(thin_f.tolist(), thin_t.tolist(), 1e-3)
    _, full = membership_roc.curve_on_grid(full_f.tolist(), full_t.tolist(), 1e-3)
    assert grid[0] == 1e-3 and grid[-1] == 1.0 and len(grid) == membership_roc.GRID_POINTS
    np.testing.assert_allclose(tpr, full, atol=1e-12)
    assert tpr[-1] == 1.0 and np.all(np.diff(tpr) >= 0)
    step = membership_roc.curve_on_grid([0.0, 0.5, 0.5, 1.0], [0.0, 0.2, 0.9, 1.0], 0.5)[1]
    assert step[0] == 0.9


def test_collect_writes_a_gridded_curve_per_attack_of_a_real_run(tmp_path):
    results = tmp_path / "runs"
    args = ["run", "--defense", "none", "--attack", "lira", "--attack", "loss", "--epochs", "1", "--results",
            str(results), "--quiet", "--set", "attack.lira.shadows=5"]
    assert CliRunner().invoke(main, args).exit_code == 0
    out = tmp_path / "roc.csv"
    assert membership_roc.collect([results], out) == 2
    with out.open() as f:
        rows = list(csv.DictReader(f))
    for attack in ("lira", "loss"):
        curve = [r for r in rows if r["attack"] == attack]
        assert len(curve) == membership_roc.GRID_POINTS
        assert abs(float(curve[0]["fpr"]) - 1 / 359) < 1e-7  # digits: 359 non-members
        assert float(curve[-1]["tpr"]) == 1.0
    assert {r["online"] for r in rows if r["attack"] == "lira"} == {"True"} and rows[0]["epsilon"] == "inf"
    membership_roc.figure(out, tmp_path / "roc.svg")
    assert (tmp_path / "roc.svg").read_text().startswith("<?xml")
