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


def run_model_state(tmp_path):
    import dpeval

    return dpeval.build_model({"data": {"name": "digits"}}).state_dict()


def test_a_checkpoint_dict_holding_the_state_dict_is_read(tmp_path):
    """The common layouts: ``{"model": state_dict, "epoch": 20}`` and ``{"state_dict": …}`` (never unpickled)."""
    import torch

    state = run_model_state(tmp_path)
    for i, layout in enumerate(({"model": state, "epoch": 20}, {"state_dict": state, "optimizer": {}})):
        path = tmp_path / f"checkpoint{i}.pt"
        torch.save(layout, path)
        out = invoke("run", "--weights", str(path), "--results", str(tmp_path / "r"))
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["model.weights_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_other_layouts_are_refused_in_one_line_saying_what_to_pass(tmp_path):
    import torch

    state = run_model_state(tmp_path)
    bare = {k[2:]: v for k, v in state.items() if k.startswith("1.")}  # the network without the Normalize wrapper
    cases = {"dict.pt": ({"weights": state, "epoch": 3}, "pass the file of torch.save(model.state_dict())"),
             "list.pt": ([1, 2], "holds list, not a state dict"),
             "bare.pt": (bare, "without dpeval's input normalisation")}
    for name, (content, message) in cases.items():
        torch.save(content, tmp_path / name)
        out = invoke("run", "--weights", str(tmp_path / name), "--results", str(tmp_path / "r"))
        assert out.exit_code == 2 and message in out.output and out.output.count("\n") == 1, out.output
    assert "dpeval.build_model" in out.output  # the hint says how to build what a run loads


def test_gradient_attacks_on_given_weights_attack_the_state_that_exists(tmp_path):
    from dpeval.config import build_spec

    weights = {"model": {"weights": str(tmp_path / "w.pt")}}
    spec = build_spec({**weights, "attacks": ["ig", "loss"]})
    assert spec.attack["ig"].at == "final" and spec.defaults == ["attack.ig.at=final"]
    assert build_spec({**weights, "attacks": ["ig"], "attack": {"ig": {"at": "init"}}}).attack["ig"].at == "init"
    assert build_spec({"attacks": ["ig"]}).attack["ig"].at == "trajectory"  # a trained run keeps its default

    import torch

    torch.save(run_model_state(tmp_path), tmp_path / "w.pt")
    out = invoke("run", "--weights", str(tmp_path / "w.pt"), "--attack", "ig", "--set", "attack.ig.at=epoch:1",
                 "--results", str(tmp_path / "r"))
    assert out.exit_code == 2 and "set attack.ig.at=final" in out.output and out.output.count("\n") == 1, out.output


def test_a_torchscript_file_is_refused_in_one_line_without_torch_warnings(tmp_path):
    """torch.load of a TorchScript archive warns (twice) that it dispatches to torch.jit.load: the refusal is the
    only line, saying what the file is and what to pass."""
    import warnings

    import torch

    import dpeval

    model = dpeval.build_model({"train": {"epochs": 1}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(model), tmp_path / "scripted.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every warning torch gives reaches stderr, as in a fresh process
        out = invoke("run", "--weights", str(tmp_path / "scripted.pt"), "--results", str(tmp_path / "r"))
    (line,) = out.stderr.splitlines()
    assert out.exit_code == 2 and "TorchScript" in line and "state_dict" in line, out.stderr
    assert not (tmp_path / "r").exists()
