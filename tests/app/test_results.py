"""The typed result and its flat view: the keys a stored run holds are RunResult.flat() of RunResult.from_flat() of
themselves, per-state metrics and verdicts included, and the typed fields are the run's numbers."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from dpeval.cli import main
from dpeval.core.verdicts import Verdict
from dpeval.results import AttackOutcome, RunResult


def test_a_stored_row_reads_back_and_flattens_to_itself(tmp_path):
    out = CliRunner().invoke(main, ["run", "--defense", "rs", "--attack", "ig", "--attack", "loss", "--epochs", "2",
                                    "--set", "attack.ig.iterations=2", "--set", "attack.ig.targets=1",
                                    "--set", "attack.ig.at=[init, final]", "--set", "data.max_train=200",
                                    "--results", str(tmp_path), "--json", "--quiet"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)
    result = RunResult.from_flat(row)
    flat = json.loads(json.dumps(result.flat(), default=str))
    assert flat == row
    assert result.utility.test_accuracy == row["utility.test_accuracy"]
    assert math.isclose(result.privacy.epsilon, row["privacy.epsilon"]) and result.comm.density < 1.0
    ig = result.attacks["ig"]
    assert set(ig.states) == {"init", "final"} and ig.states["final"]["psnr"] == row["leakage.ig.final.psnr"]
    assert ig.metrics["psnr"] == row["leakage.ig.psnr"] and isinstance(ig.verdict, Verdict)
    assert result.attacks["loss"].artefacts["scores"] == row["artefacts.loss.scores"]


def test_a_failed_attack_is_its_error_alone():
    outcome = AttackOutcome("ig", error="RuntimeError: boom")
    assert outcome.flat() == {"leakage.ig.error": "RuntimeError: boom"}
    back = RunResult.from_flat({"run_id": "x", "status": "failed", "leakage.ig.error": "RuntimeError: boom"})
    assert back.attacks["ig"].error == "RuntimeError: boom" and back.attacks["ig"].verdict is None
