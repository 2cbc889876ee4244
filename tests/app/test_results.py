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


def test_the_result_a_run_returns_is_the_row_it_stores(tmp_path):
    """A run builds its typed result once: the store records its flat view, and that row reads back as the same
    result (a given-weights run's absent curves and communication included)."""
    import torch

    from dpeval.config import build_spec
    from dpeval.runner import execute, prepare
    from dpeval.store import ResultStore

    raw = {"defense": "dpsgd", "attacks": ["loss"], "train": {"epochs": 1}, "data": {"max_train": 200}}
    weights = tmp_path / "w.pt"
    torch.save(prepare(build_spec(raw)).model.state_dict(), weights)
    for settings in (raw, {**raw, "model": {"weights": str(weights)}}):
        store = ResultStore(tmp_path / f"r{len(settings)}")
        result = execute(build_spec(settings), store, progress=False)
        row = store.get(result.run_id)["metrics"]
        assert json.loads(json.dumps(result.flat(), default=str)) == row
        back = RunResult.from_flat(row)
        assert json.loads(json.dumps(back.flat(), default=str)) == row and back.utility == result.utility
        assert result.folder == store.run_dir(result.run_id)
        (typed,) = store.results()  # the store's typed accessor: the same run, read back
        assert json.loads(json.dumps(typed.flat(), default=str)) == row and typed.folder == result.folder
        assert typed.attacks["loss"].verdict == result.attacks["loss"].verdict is not None
        assert store.results("failed") == []
    assert "utility.test_accuracy_by_epoch" not in row and row["comm.density"] is None  # the weights run


def test_a_row_of_an_older_version_reads_back_as_it_was_recorded():
    """A stored ε is the record: read back, the ledger keeps it (an accountant of another version may have computed
    it) and the row flattens to itself, keys it lacks included; the typed fields are still read, and a ledger
    changed from it derives its ε again."""
    import dataclasses

    row = {"run_id": "old", "status": "done", "dataset": "digits", "model": "mlp", "defense": "dpsgd",
           "attack": "loss", "seed": 0, "privacy.epsilon": 2.5, "privacy.delta": 1e-5, "privacy.noise_multiplier": 1.1,
           "privacy.accounted_noise_multiplier": 1.1, "privacy.sample_rate": 0.01, "privacy.steps": 1000,
           "privacy.accountant": "rdp", "privacy.sampling": "poisson", "leakage.loss.auc": 0.51}
    back = RunResult.from_flat(row)
    assert back.epsilon == 2.5 and back.privacy.steps == 1000 and back.attacks["loss"].metrics["auc"] == 0.51
    assert back.flat() == row  # no privacy.accounted_sampling added, the order kept
    derived = dataclasses.replace(back.privacy, steps=1000)
    assert derived.epsilon != 2.5 and 0 < derived.epsilon < 10  # the accountant's, not the recorded one
    assert back.privacy.at(0.01, 2000).epsilon > derived.epsilon


def test_the_attacks_read_back_in_the_order_the_run_named_them():
    row = {"run_id": "r", "status": "done", "attack": "rgap+ig", "leakage.ig.psnr": 20.0, "leakage.rgap.psnr": 30.0}
    back = RunResult.from_flat(row)
    assert list(back.attacks) == ["rgap", "ig"]
    assert built_flat(back)["attack"] == "rgap+ig"


def built_flat(result: RunResult) -> dict:
    """The keys built from the typed fields alone (what a new run's result writes)."""
    import dataclasses

    return dataclasses.replace(result, recorded=None).flat()
