"""Adding a metric is one change (docs/architecture.md, "Adding a metric"): a plug-in attack reports a metric no
module of dpeval names, and it reaches ``--json``, the typed result, the leaderboard CSV and the report."""

from __future__ import annotations

import csv
import html
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from dpeval.attacks import ATTACKS
from dpeval.attacks.base import Scores
from dpeval.attacks.loss import losses
from dpeval.attacks.membership_game import VictimMembershipAttack, VictimOutputs
from dpeval.cli import main
from dpeval.store import ResultStore

ATTACK, METRIC = "spread-probe", "loss_spread_x"


@pytest.fixture
def plugin():
    @ATTACKS.register(ATTACK, "test plug-in: LOSS scores, and the spread of the losses as a metric of its own")
    class SpreadProbe(VictimMembershipAttack):
        headline = "auc"

        def guess(self, evidence: VictimOutputs) -> Scores:
            loss = losses(evidence)
            return Scores(-loss, metrics={METRIC: float(np.std(loss))})

    yield ATTACK
    ATTACKS.unregister(ATTACK)


def invoke(*args: str):
    out = CliRunner().invoke(main, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


def test_a_new_metric_reaches_json_the_typed_result_the_csv_and_the_report(plugin, tmp_path):
    results = tmp_path / "results"
    row = json.loads(invoke("run", "--defense", "none", "--attack", plugin, "--epochs", "1",
                            "--set", "data.max_train=200", "--results", results, "--json", "--quiet").stdout)
    key = f"leakage.{plugin}.{METRIC}"
    value = row[key]
    assert isinstance(value, float) and value > 0

    (result,) = ResultStore(results).results()
    assert result.attacks[plugin].metrics[METRIC] == value and result.flat()[key] == value

    board = tmp_path / "board.csv"
    invoke("leaderboard", "--results", results, "--out", board)
    (record,) = csv.DictReader(io.StringIO(board.read_text()))
    assert float(record[key]) == value

    page = tmp_path / "report.html"
    invoke("report", "--results", results, "--out", page)
    text = html.unescape(page.read_text())
    section = text[text.index("<h2>Attack metrics</h2>"):]
    assert f'title="{key}">{METRIC}</th>' in section and f"<h3>{plugin}</h3>" in section
    assert f"{value:.4g}" in section  # the value, as the report writes a number
