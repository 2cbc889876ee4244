"""Adding a defense or an attack is one file: fixtures written from docs/architecture.md's recipe, registered
here and nowhere else, run end to end through run, audit, leaderboard and report with no other edit."""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attacks import ATTACKS
from defenses import DEFENSES
from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugins():
    for module, name, registry in (("plugin_defense", "plugin-dpsgd", DEFENSES),
                                   ("plugin_attack", "plugin-confidence", ATTACKS)):
        module = importlib.import_module(f"tests.fixtures.{module}")
        if name not in registry:
            importlib.reload(module)  # registers again after an earlier test's teardown
    assert "plugin-dpsgd" in DEFENSES and "plugin-confidence" in ATTACKS
    yield
    DEFENSES.unregister("plugin-dpsgd")
    ATTACKS.unregister("plugin-confidence")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


@pytest.mark.parametrize("fixture", ["plugin_defense", "plugin_attack"])
def test_the_documented_recipe_is_the_fixture(fixture):
    """docs/architecture.md shows exactly the defense and attack files this test registers."""
    code = (ROOT / f"tests/fixtures/{fixture}.py").read_text().split('"""', 2)[2].lstrip("\n")
    assert code in (ROOT / "docs/architecture.md").read_text()


def test_plugins_run_everywhere(plugins, tmp_path):
    results = tmp_path / "results"
    for seed in ("0", "1"):
        code, out = invoke("run", "--defense", "plugin-dpsgd", "--attack", "plugin-confidence", "--attack", "ig",
                           "--epochs", "2", "--seed", seed, "--set", "defense.clip=0.8",
                           "--set", "attack.ig.iterations=20", "--set", "attack.temperature=2.0",
                           "--results", str(results), "--json", "--quiet")
        assert code == 0, out
        row = json.loads(out)
        assert row["defense"] == "plugin-dpsgd" and row["defense.clip"] == 0.8
        assert 0 < row["privacy.epsilon"] < 4  # accounted like DP-SGD at the default ε = 3
        assert 0 <= row["leakage.plugin-confidence.auc"] <= 1
        assert row["leakage.ig.psnr"] > 0

    code, out = invoke("audit", "--defense", "plugin-dpsgd", "--trials", "4000", "--canaries", "64", "--json",
                       "--quiet")
    assert code == 0, out
    audit = json.loads(out)
    assert audit["audit.passed"] and audit["audit.epsilon_lower_bound"] <= audit["privacy.epsilon"]
    separation = audit["audit.tests"][0]["separation"]  # the canary is worst case: μ̂ ≈ √T/σ
    assert 0.8 * audit["privacy.mu"] < separation < 1.2 * audit["privacy.mu"]

    board = tmp_path / "board.csv"
    code, out = invoke("leaderboard", "--results", str(results), "--out", str(board), "--group-seeds")
    assert code == 0, out
    rows = list(csv.DictReader(board.open()))
    assert len(rows) == 1 and rows[0]["n"] == "2" and rows[0]["defense"] == "plugin-dpsgd"
    assert "pareto.plugin-confidence" in rows[0]  # the attack's declared headline ranks it

    report = tmp_path / "report.html"
    code, out = invoke("report", "--results", str(results), "--out", str(report))
    assert code == 0, out
    page = report.read_text()
    assert "plugin-dpsgd" in page and "leakage.plugin-confidence.auc" in page
    assert "Utility vs leakage (plugin-confidence)" in page

    code, out = invoke("list", "--params")
    assert "plugin-dpsgd" in out and "attack.temperature" in out


def test_no_project_file_names_the_plugins():
    """The registries are the only place the plug-ins are known: no package module was edited for them."""
    named = [p.relative_to(ROOT) for pkg in ("harness", "defenses", "attacks") for p in (ROOT / pkg).rglob("*.py")
             if "plugin-dpsgd" in p.read_text() or "plugin-confidence" in p.read_text()]
    assert named == []
