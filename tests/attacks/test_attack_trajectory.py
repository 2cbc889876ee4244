"""Reconstruction attacks over the training trajectory: state names, the states a run snapshots, per-state
keys with each state's defense rate, the worst-case headline, the verdict, the run's printout and portable
artefact paths."""

import json
import shutil

import pytest
from click.testing import CliRunner

from dpeval.attacks import verdict
from dpeval.cli import main
from dpeval.core.states import resolve as resolve_states
from dpeval.core.states import trajectory_epochs
from dpeval.core.verdicts import Verdict

# ------------------------------------------------------------------------------------------------------------
# state names


def test_trajectory_is_evenly_spaced_and_ends_at_final():
    assert resolve_states(["trajectory"], 20) == ["epoch:7", "epoch:13", "final"]  # after 1/3, 2/3, 3/3
    assert resolve_states(["trajectory:2"], 20) == ["epoch:10", "final"]
    assert resolve_states(["trajectory:4"], 20) == ["epoch:5", "epoch:10", "epoch:15", "final"]
    assert resolve_states(["trajectory:1"], 20) == ["final"]
    assert resolve_states(["trajectory"], 1) == ["final"]  # a one-epoch run has no state in between
    assert trajectory_epochs(5, 3) == [1, 2]  # more states than epochs: each epoch once


def test_states_come_in_training_order_without_duplicates():
    assert resolve_states(["final", "epoch:12", "init", "trajectory:2", "epoch:3"], 20) == \
        ["init", "epoch:3", "epoch:10", "epoch:12", "final"]
    with pytest.raises(ValueError):
        resolve_states(["middle"], 20)


def test_sign_test_and_bonferroni():
    assert verdict.sign_test([5.0, 0.5, 2.0, 1.0]).wins == 2  # > 1 dB; a tie at the margin does not count
    assert verdict.SignTest(6, 6).p_value == pytest.approx(1 / 64)
    assert verdict.SignTest(5, 6).p_value == pytest.approx(7 / 64)
    assert verdict.decide([verdict.SignTest(6, 6)] * 3) == (Verdict.LEAKS, pytest.approx(3 / 64))
    assert verdict.decide([verdict.SignTest(6, 6)] * 4)[0] is Verdict.NO_LEAK  # 4/64 > 0.05 after Bonferroni
    assert verdict.min_targets(3) == 6 and verdict.min_targets(1) == 5
    assert verdict.decide([verdict.SignTest(5, 5)] * 1)[0] is Verdict.LEAKS  # 1/32 <= 0.05


# ------------------------------------------------------------------------------------------------------------
# a run over the trajectory (RS's gradual cooling: rate r*·e/(E−1))

QUICK = ["--defense", "rs", "--attack", "ig", "--epochs", "4", "--set", "attack.ig_iterations=20",
         "--set", "attack.targets=2", "--quiet"]


@pytest.fixture(scope="module")
def trajectory_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    out = CliRunner().invoke(main, ["run", *QUICK, "--results", str(results), "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return results, json.loads(out.stdout)


def test_every_state_is_reported_with_the_rate_of_its_time(trajectory_run):
    _, m = trajectory_run
    states = ["epoch:1", "epoch:3", "final"]  # trajectory:3 of a 4-epoch run
    for state in states:
        for metric in ("psnr", "ssim", "mse", "label_accuracy", "defense_rate", "density", "wins", "p_value"):
            assert f"leakage.ig.{state}.{metric}" in m, (state, metric)
    rates = [m[f"leakage.ig.{s}.defense_rate"] for s in states]
    assert rates == pytest.approx([0.9 * 1 / 3, 0.9 * 3 / 3, 0.9])  # linear schedule, epochs 1, 3 and the last
    assert all(m[f"leakage.ig.{s}.density"] == pytest.approx(1 - r, abs=1e-3) for s, r in zip(states, rates))


def test_headline_is_the_worst_state(trajectory_run):
    _, m = trajectory_run
    states = ["epoch:1", "epoch:3", "final"]
    worst = max(states, key=lambda s: m[f"leakage.ig.{s}.psnr"])
    assert m["leakage.ig.state"] == worst
    for metric in ("psnr", "ssim", "mse", "defense_rate"):
        assert m[f"leakage.ig.{metric}"] == m[f"leakage.ig.{worst}.{metric}"]
    assert Verdict.parse(m["leakage.ig.verdict"]) in Verdict and 0 < m["leakage.ig.p_value"] <= 1
    assert m["leakage.ig.baseline_psnr"] >= max(m["leakage.ig.baseline_psnr_mean"], m["leakage.ig.baseline_psnr_noise"])


def test_configuration_echoes_are_settings_not_leakage(trajectory_run):
    _, m = trajectory_run
    assert m["attack.ig.at"] == "trajectory" and m["attack.ig.targets"] == 2 and m["attack.ig.mask_aware"] is True
    for echo in ("mask_aware", "labels", "batch_size", "iterations", "restarts", "objective", "optimizer",
                 "target_index"):
        assert f"leakage.ig.{echo}" not in m
    assert m["time.ig_s"] > 0


def test_artefacts_are_relative_to_the_results_folder(trajectory_run, tmp_path):
    results, m = trajectory_run
    for key in ("png", "scores", "images"):
        path = m[f"artefacts.ig.{key}"]
        assert path.startswith(f"runs/{m['run_id']}/ig/") and (results / path).is_file(), path
    scores = json.loads((results / m["artefacts.ig.scores"]).read_text())
    assert scores["rule"]["worst_state"] == m["leakage.ig.state"] and len(scores["states"]) == 3
    assert len(scores["target_index"]) == 2  # two targets of one example each
    moved = tmp_path / "moved"
    shutil.copytree(results, moved)
    out = CliRunner().invoke(main, ["report", "--results", str(moved), "--out", str(tmp_path / "r.html"), "--json"])
    assert out.exit_code == 0, out.output
    written = json.loads(out.stdout)
    assert written["missing"] == [] and written["pictures"] == 1


def test_the_printout_names_verdict_state_rate_and_picture(trajectory_run):
    results, m = trajectory_run
    from dpeval.run_summary import format_run

    text = format_run(m, results)
    (line,) = [entry for entry in text.splitlines() if entry.strip().startswith("ig ")]
    assert m["leakage.ig.verdict"] in line and f"at {m['leakage.ig.state']}" in line
    assert "rate" in line and "best data-free guess" in line
    assert f"picture: {results / m['artefacts.ig.png']}" in text
    assert "epoch:1" in text and "epoch:3" in text  # the per-state table
    assert "mask_aware" not in text and "target_index" not in text  # no configuration echoes


@pytest.mark.slow
def test_make_run_attacks_rs_while_it_sparsifies(tmp_path):
    """`make run` (the default `dpeval run --defense rs --attack ig`): RS attacked at non-zero rates, a
    verdict, the picture's path. IG optimises for 50 steps instead of 1,000: what is checked is the
    trajectory of the default 20-epoch run (its states and their rates) and the printout, not how well IG
    reconstructs (tests/attacks/test_attack_ig.py measures that at its default budget)."""
    out = CliRunner().invoke(main, ["run", "--defense", "rs", "--attack", "ig", "--set", "attack.ig_iterations=50",
                                    "--results", str(tmp_path), "--quiet"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    (line,) = [entry for entry in out.stdout.splitlines() if entry.strip().startswith("ig ")]
    assert any(v in line for v in Verdict) and "(rate 0." in line
    assert "picture: " in out.stdout and "ig-reconstruction.png" in out.stdout
