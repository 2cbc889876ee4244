"""`dpeval run --weights FILE`: a model trained elsewhere is attacked instead of trained; bad weights are refused
before anything is written."""

from __future__ import annotations

import hashlib
import json

from click.testing import CliRunner

from dpeval.cli import main
from dpeval.store import ResultStore


def invoke(*args: str):
    return CliRunner().invoke(main, [*args, "--json", "--quiet"])


def test_given_weights_are_attacked_not_trained(tmp_path):
    trained = invoke("run", "--defense", "dpsgd", "--epochs", "2", "--results", str(tmp_path / "a"))
    assert trained.exit_code == 0, trained.output
    first = json.loads(trained.stdout)
    weights = tmp_path / "a" / "runs" / first["run_id"] / "model.pt"
    attacked = invoke("run", "--defense", "dpsgd", "--epochs", "2", "--weights", str(weights), "--attack", "loss",
                      "--results", str(tmp_path / "b"))
    assert attacked.exit_code == 0, attacked.output
    row = json.loads(attacked.stdout)
    assert row["utility.test_accuracy"] == first["utility.test_accuracy"]  # the same weights, evaluated again
    assert row["time.train_s"] == 0.0 and row["comm.density"] is None
    assert row["model.weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert row["privacy.epsilon"] == first["privacy.epsilon"]  # the recipe's ledger, as given
    assert 0 <= row["leakage.loss.auc"] <= 1


def test_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path):
    import torch

    wrong = tmp_path / "wrong.pt"
    torch.save({"w": torch.zeros(3)}, wrong)
    for weights, message in ((wrong, "is not a state dict of"), (tmp_path / "missing.pt", "is not a file")):
        out = invoke("run", "--defense", "dpsgd", "--weights", str(weights), "--results", str(tmp_path / "r"))
        assert out.exit_code == 2 and message in out.output and out.output.count("\n") == 1, out.output
    assert not (tmp_path / "r").exists() or ResultStore(tmp_path / "r").rows() == []


def test_new_contents_at_the_same_weights_path_are_a_new_point(tmp_path):
    """A sweep over ``model.weights`` used to skip a point as already done after the file's contents changed (its
    run key held the path only). The key now holds the content's SHA-256; a run without weights keeps its key."""
    import os

    from dpeval.config import build_spec

    weights = tmp_path / "model.pt"
    weights.write_bytes(b"first weights")
    spec = build_spec({"model": {"weights": str(weights)}})
    store = ResultStore(tmp_path / "results")
    store.finish(store.begin(spec.run_key, spec.canonical()), {"status": "done"})
    assert build_spec({"model": {"weights": str(weights)}}).run_key in store.done_keys()  # unchanged: done
    weights.write_bytes(b"other weights")
    os.utime(weights, ns=(1, 1))  # even with an old modification time
    assert build_spec({"model": {"weights": str(weights)}}).run_key not in store.done_keys()
