"""Which records leak: every membership run exports its per-example scores (split, source index, label, member,
score), readable from the store's artefact path, and they are the scores its metrics were computed from."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.metrics import roc_auc_score

from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.datasets import load_task
from dpeval.store import ResultStore


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    results = tmp_path_factory.mktemp("r")
    out = CliRunner().invoke(main, ["run", "--defense", "none", "--attack", "lira", "--attack", "loss", "--epochs", "2",
                                    "--set", "attack.shadows=6", "--set", "data.max_train=400", "--results",
                                    str(results), "--json", "--quiet"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout), results


@pytest.mark.parametrize("attack", ["lira", "loss"])
def test_the_scores_file_holds_every_candidate_once_with_its_identity(run, attack):
    row, results = run
    path = results / row[f"artefacts.{attack}.scores"]  # stored relative to the results folder
    assert path.is_file()
    lines = list(csv.DictReader(path.open()))
    assert list(lines[0]) == ["target", "split", "index", "label", "member", "score"]
    task = load_task(build_spec(ResultStore(results).rows()[-1]["config"]).data)
    members = {(int(r["index"]), int(r["label"])) for r in lines if r["member"] == "1"}
    pool = set(zip(task.train.source_index.tolist(), task.train.y.tolist()))
    assert members == pool  # every member is a pool example with its label, and every pool example is scored
    assert all(r["split"] == ("train" if r["member"] == "1" else "test") for r in lines)
    assert {r["target"] for r in lines} == {"-1"}  # the victim game
    labels = np.array([r["member"] == "1" for r in lines])
    scores = np.array([float(r["score"]) for r in lines])
    assert roc_auc_score(labels, scores) == pytest.approx(row[f"leakage.{attack}.auc"], abs=1e-9)


def test_the_leave_one_model_out_game_names_each_target(tmp_path):
    out = CliRunner().invoke(main, ["run", "--defense", "none", "--attack", "lira", "--epochs", "1",
                                    "--set", "attack.shadows=4", "--set", "attack.mia_target=shadows",
                                    "--set", "data.max_train=300", "--results", str(tmp_path), "--json", "--quiet"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)
    lines = list(csv.DictReader((tmp_path / row["artefacts.lira.scores"]).open()))
    per_target = {t: sum(r["target"] == t for r in lines) for t in {r["target"] for r in lines}}
    assert sorted(per_target) == ["0", "1", "2", "3"] and len(set(per_target.values())) == 1
    for t in per_target:  # each target: half of the population members
        mine = [r for r in lines if r["target"] == t]
        assert sum(r["member"] == "1" for r in mine) == len(mine) // 2
