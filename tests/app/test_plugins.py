"""Adding a defense, an attack, a dataset or a model is one file: fixtures written from docs/architecture.md's
recipes, registered here and nowhere else, run end to end (a defense and an attack through run, audit, leaderboard
and report; a dataset and a model through list and run) with no other edit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from tests.fixtures import PLUGINS, registered

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugins():
    with registered(*PLUGINS):
        yield


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


@pytest.mark.parametrize("fixture", list(PLUGINS))
def test_the_documented_recipe_is_the_fixture(fixture):
    """docs/architecture.md shows exactly the plug-in files this test registers."""
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


def test_a_dataset_and_a_model_plugin_run(plugins, tmp_path):
    """The dataset runs with the default model it declares and with the plug-in model, both through the CLI."""
    code, out = invoke("list")
    assert code == 0, out
    assert "plugin-stripes" in out and "[default model: mlp]" in out.split("plugin-stripes", 1)[1].split("\n")[0]
    assert "plugin-linear" in out
    for model_flags, model in (([], "mlp"), (["--model", "plugin-linear"], "plugin-linear")):
        code, out = invoke("run", "--dataset", "plugin-stripes", *model_flags, "--epochs", "1", "--attack", "none",
                           "--results", str(tmp_path / "results"), "--json", "--quiet")
        assert code == 0, out
        row = json.loads(out)
        assert row["dataset"] == "plugin-stripes" and row["model"] == model
        assert row["data.train_size"] == 280  # the plug-in's 400 examples less 20% test and 10% public
        assert 0 <= row["utility.test_accuracy"] <= 1


def test_no_project_file_names_the_plugins():
    """The registries are the only place the plug-ins are known: no package module was edited for them."""
    names = [name for name, _ in PLUGINS.values()]
    named = [p.relative_to(ROOT) for pkg in ("harness", "defenses", "attacks") for p in (ROOT / pkg).rglob("*.py")
             if any(name in p.read_text() for name in names)]
    assert named == []
