"""Sweeps: grid expansion, validation before any run, resumption, failures, workers, the lock, Ray, kill -9."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.store import ResultStore
from dpeval.sweep import driver, executors
from dpeval.sweep import grid as sw

ROOT = Path(__file__).resolve().parents[2]  # the repository root
QUICK_TRAIN = {"epochs": 1, "batch_size": 256}


def write(tmp_path, data, name="sweep.yaml"):
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_expand_lists_and_seeds():
    points = sw.expand({"defense": {"name": "rs", "final_rate": [0.0, 0.5, 0.9]}, "seeds": [1, 2],
                        "attacks": ["none"], "train": QUICK_TRAIN})
    assert len(points) == 6
    assert ({(p["defense"]["final_rate"], p["seed"]) for p in points}
            == {(r, s) for r in (0.0, 0.5, 0.9) for s in (1, 2)})
    assert all(p["attacks"] == ["none"] for p in points)  # a natural list is one value, not an axis


def test_list_of_lists_sweeps_a_list_field():
    points = sw.expand({"data": {"name": "synthetic", "synthetic": {"shape": [[1, 8, 8], [1, 6, 6]]}}})
    assert [p["data"]["synthetic"]["shape"] for p in points] == [[1, 8, 8], [1, 6, 6]]
    single = sw.expand({"data": {"name": "synthetic", "synthetic": {"shape": [1, 8, 8]}}})
    assert len(single) == 1


def test_sweeping_defenses_with_shared_settings(tmp_path):
    specs = sw.load_sweep(write(tmp_path, {"defense": {"name": ["dpsgd", "rs"]}, "train": QUICK_TRAIN}))
    assert sorted(s.defense_name for s in specs) == ["dpsgd", "rs"]


@pytest.mark.parametrize("data,field", [
    ({"train": {"epochz": [1, 2]}}, "train.epochz"),
    ({"defense": {"name": "rs", "final_rate": []}}, "defense.final_rate"),
    ({"train": {"epochs": [[1, 2]]}}, "train.epochs"),
    ({"defense": {"name": "rs", "final_rate": [0.5, 1.5]}}, "defense.final_rate"),
    ({"seeds": []}, "seeds"),
    ({"seed": 1, "seeds": [1, 2]}, "seeds"),
    ({"defense": {"name": ["dpsgd", "nope"]}}, "defense"),
])
def test_bad_sweep_files_exit_2_before_any_run(tmp_path, data, field):
    path = write(tmp_path, data)
    results = tmp_path / "results"
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(results)])
    assert result.exit_code == 2, result.output
    assert field in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not results.exists()


def test_canonical_round_trip_keeps_the_run_key(tmp_path):
    for spec in sw.load_sweep(write(tmp_path, {"defense": {"name": "rs", "final_rate": [0.3, 0.7]}, "seeds": [0, 3]})):
        assert build_spec(spec.canonical()).run_key == spec.run_key


@pytest.mark.slow
def test_sweep_runs_resumes_and_reruns(tmp_path):
    path = write(tmp_path, {"defense": {"name": "rs", "final_rate": [0.0, 0.5]}, "train": QUICK_TRAIN})
    results = str(tmp_path / "r")
    first = CliRunner().invoke(main, ["sweep", str(path), "--results", results, "--json", "--quiet"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"planned": 2, "skipped": 0, "done": 2, "failed": 0, "failures": []}
    again = json.loads(CliRunner().invoke(main, ["sweep", str(path), "--results", results, "--json", "--quiet"]).stdout)
    assert again["skipped"] == 2 and again["done"] == 0
    forced = json.loads(CliRunner().invoke(main, ["sweep", str(path), "--results", results, "--json", "--quiet",
                                                  "--rerun"]).stdout)
    assert forced["done"] == 2
    rows = ResultStore(results).rows()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"done"}
    dry = CliRunner().invoke(main, ["sweep", str(path), "--results", results, "--dry-run", "--json"])
    assert all(p["done"] for p in json.loads(dry.stdout))


def test_failures_are_recorded_and_do_not_stop_the_sweep(tmp_path, monkeypatch):
    real = executors.run_job

    def flaky(canonical, run_id, run_dir, threads=0):
        if canonical["seed"] == 1:
            raise RuntimeError("simulated failure")
        return real(canonical, run_id, run_dir, threads)

    monkeypatch.setattr(executors, "run_job", flaky)
    specs = sw.load_sweep(write(tmp_path, {"train": QUICK_TRAIN, "seeds": [0, 1, 2]}))
    store = ResultStore(tmp_path / "r")
    summary = driver.run_sweep(specs, store, executors.SequentialExecutor(), progress=False)
    assert (summary.done, summary.failed) == (2, 1)
    statuses = sorted((r["config"]["seed"], r["status"]) for r in store.rows())
    assert statuses == [(0, "done"), (1, "failed"), (2, "done")]
    assert "simulated failure" in store.rows(status="failed")[0]["error"]

    store2 = ResultStore(tmp_path / "r2")
    summary = driver.run_sweep(specs, store2, executors.SequentialExecutor(), progress=False, fail_fast=True)
    assert summary.failed == 1 and summary.done == 1  # seed 0 done, seed 1 failed, seed 2 never started
    assert len(store2.rows()) == 2 and not store2.rows(status="running")


def test_cli_exit_code_1_when_runs_failed(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(executors, "run_job", broken)
    path = write(tmp_path, {"train": QUICK_TRAIN})
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(tmp_path / "r"), "--quiet"])
    assert result.exit_code == 1 and "boom" in result.stderr


def test_second_sweep_on_the_same_results_refuses(tmp_path):
    path = write(tmp_path, {"train": QUICK_TRAIN})
    results = tmp_path / "r"
    with driver.sweep_lock(results, wait_for_lock=False):
        result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(results), "--quiet"])
    assert result.exit_code == 1
    assert "another dpeval sweep is running" in result.stderr
    assert ResultStore(results).rows() == []


def test_local_workers_keep_the_store_consistent(tmp_path):
    path = write(tmp_path, {"train": QUICK_TRAIN, "seeds": [0, 1, 2]})
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(tmp_path / "r"), "--workers", "2",
                                       "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    rows = ResultStore(tmp_path / "r").rows()
    assert sorted(r["config"]["seed"] for r in rows) == [0, 1, 2]
    assert {r["status"] for r in rows} == {"done"}
    for row in rows:
        assert (tmp_path / "r" / "runs" / row["run_id"] / "metrics.json").is_file()


def test_shadow_games_name_what_determines_the_shadows():
    """Online and offline twins (and LiRA beside RMIA) play one game; another seed, K or target is another game;
    a run without a shadow attack plays none."""
    from dpeval import configure
    from dpeval.attacks.membership_game import shadow_games

    def games(attack=None, **dotted):
        return shadow_games(configure({"attacks": ["lira", "rmia", "ig"], "attack": {"shadows": 8, **(attack or {})}},
                                      **dotted))

    online = games()
    assert len(online) == 1
    assert games(attack__online=False, attack__targets=2) == online
    for other in ({"seed": 1}, {"attack__shadows": 16}, {"attack__mia_target": "shadows"}, {"privacy__epsilon": 8.0}):
        assert games(**other) != online, other
    assert games({"rmia": {"shadows": 16}}) > online  # two games: LiRA's and RMIA's
    assert shadow_games(configure({"attacks": ["ig", "grad-mia"]})) == frozenset()


def test_a_free_lane_keeps_its_game_and_leaves_the_others_games():
    a, b, c = frozenset({"a"}), frozenset({"b"}), frozenset({"c"})
    none = frozenset()
    assert executors.next_point([a, b, a], mine=a, others=none) == 0
    assert executors.next_point([b, a], mine=a, others=none) == 1  # its own game first
    assert executors.next_point([a, a, b], mine=none, others=a) == 2  # not the game another lane holds
    assert executors.next_point([a, none], mine=b, others=a) == 1  # a point with no game goes anywhere
    assert executors.next_point([a, a], mine=c, others=a) is None  # the other lane takes them after its point
    assert executors.next_point([a | b], mine=a, others=b) is None  # never beside a lane playing one of its games


@pytest.mark.slow
def test_local_workers_run_an_offline_twin_in_the_process_that_trained_its_shadows(tmp_path):
    """Two ε × online/offline on two workers, listed twin after twin (the order a first-free-worker schedule
    would run side by side): each game's shadows train once, in one worker, and its twin reuses them there
    (the two games run side by side)."""
    path = tmp_path / "sweep.yaml"  # the grid follows the file's order: online varies fastest
    path.write_text("train: {epochs: 1, batch_size: 256}\nattacks: [lira]\nprivacy: {epsilon: [1.0, 8.0]}\n"
                    "attack: {shadows: 4, mia_target: shadows, online: [true, false]}\n")
    assert [s.attack["lira"].online for s in sw.load_sweep(path)] == [True, False, True, False]
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(tmp_path / "r"), "--workers", "2",
                                       "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    store = ResultStore(tmp_path / "r")
    rows = store.rows()
    assert len(rows) == 4 and {r["status"] for r in rows} == {"done"}
    for epsilon in (1.0, 8.0):
        twins = [r for r in rows if r["config"]["privacy"]["epsilon"] == epsilon]
        assert len({r["pid"] for r in twins}) == 1, twins  # one worker played the game
        reused = ["reused from this process's memory" in (store.run_dir(r["run_id"]) / "log.txt").read_text()
                  for r in twins]
        assert sorted(reused) == [False, True]  # trained by the first point, reused by the second
    assert len({r["pid"] for r in rows}) == 2  # the two games in two workers


@pytest.mark.slow
def test_ray_executor_runs_a_small_sweep(tmp_path):
    pytest.importorskip("ray", reason="the distributed extra (ray) is installed by `make test`")
    path = write(tmp_path, {"defense": {"name": "rs", "final_rate": [0.0, 0.5]}, "train": QUICK_TRAIN})
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(tmp_path / "r"), "--executor", "ray",
                                       "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["done"] == 2
    rows = ResultStore(tmp_path / "r").rows()
    assert {r["status"] for r in rows} == {"done"}
    for row in rows:  # artefacts written by the driver from what the Ray task sent back
        assert (tmp_path / "r" / "runs" / row["run_id"] / "model.pt").is_file()


def _done_rows(db):
    if not db.exists():
        return {}
    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT run_key, metrics_json FROM runs WHERE status='done'").fetchall())
    conn.close()
    return rows


@pytest.mark.slow
def test_kill_minus_9_then_resume(tmp_path):
    """Kill the sweep process while runs are in flight; restarting finishes the grid with exactly one done
    row per point, and runs completed before the kill keep their metrics."""
    path = write(tmp_path, {"train": {"epochs": 3, "batch_size": 128}, "seeds": [0, 1, 2, 3]})
    results = tmp_path / "r"
    cmd = [sys.executable, "-m", "dpeval.cli", "sweep", str(path), "--results", str(results), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(_done_rows(results / "results.sqlite")) < 1:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _done_rows(results / "results.sqlite")
    assert 1 <= len(before) < 4, "the kill must land mid-sweep"
    finished = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    after = _done_rows(results / "results.sqlite")
    keys = {s.run_key for s in sw.load_sweep(path)}
    assert set(after) == keys  # one done row per grid point...
    conn = sqlite3.connect(results / "results.sqlite")
    per_key = dict(conn.execute("SELECT run_key, COUNT(*) FROM runs WHERE status='done' GROUP BY run_key").fetchall())
    running = conn.execute("SELECT COUNT(*) FROM runs WHERE status='running'").fetchone()[0]
    conn.close()
    assert set(per_key.values()) == {1}  # ...and only one
    assert running == 0  # the killed run's row was marked failed
    for key, metrics in before.items():
        assert after[key] == metrics


def test_expand_rejects_lock_free_misuse():
    with pytest.raises(ConfigError, match="seeds"):
        sw.expand({"seeds": "0"})


def test_attacked_states_follow_the_union_field_convention():
    """``attack.at`` (a state or a list of states) is swept like ``defense.groups``: a list is an axis,
    an element that is itself a list is one value (one run attacking every state in it)."""
    axis = sw.expand({"attacks": ["ig"], "attack": {"at": ["init", "final"]}})
    assert [p["attack"]["at"] for p in axis] == ["init", "final"]
    one = sw.expand({"attacks": ["ig"], "attack": {"at": [["init", "trajectory:2"]]}})
    assert [p["attack"]["at"] for p in one] == [["init", "trajectory:2"]]


def test_status_lines_name_headline_leakage_and_verdict(tmp_path):
    path = write(tmp_path, {"defense": {"name": "rs", "final_rate": 0.5}, "attacks": ["ig"], "train": QUICK_TRAIN,
                            "attack": {"ig_iterations": 5, "targets": 2}})
    result = CliRunner().invoke(main, ["sweep", str(path), "--results", str(tmp_path / "r"), "--quiet"])
    assert result.exit_code == 0, result.output
    (line,) = [entry for entry in result.stderr.splitlines() if entry.startswith("done")]
    (row,) = ResultStore(tmp_path / "r").rows()
    m = row["metrics"]
    assert f"ig {m['leakage.ig.psnr']:.4g} {m['leakage.ig.verdict']} @{m['leakage.ig.state']}" in line


def test_status_lines_name_only_the_settings_that_apply_to_a_point():
    """A sweep over defenses lists each point's own swept settings: not another defense's parameters, not
    the ε of the non-private run, not SGD's momentum under Adam."""
    from dpeval.config import build_spec
    from dpeval.sweep.grid import describe, swept_fields

    specs = [build_spec({"defense": {"name": "rs", "final_rate": rate}, "privacy": {"epsilon": eps}})
             for rate in (0.5, 0.9) for eps in (1.0, 3.0)]
    specs += [build_spec({"defense": "none", "train": {"optimizer": "sgd", "momentum": 0.9}}),
              build_spec({"defense": "gep"})]
    swept = swept_fields(specs)
    lines = {describe(s, swept) for s in specs}
    assert lines == {"defense=rs final_rate=0.5 epsilon=1.0 optimizer=adam",
                     "defense=rs final_rate=0.5 epsilon=3.0 optimizer=adam",
                     "defense=rs final_rate=0.9 epsilon=1.0 optimizer=adam",
                     "defense=rs final_rate=0.9 epsilon=3.0 optimizer=adam",
                     "defense=none optimizer=sgd",  # no ε; momentum is set by one point only: not swept
                     "defense=gep epsilon=3.0 optimizer=adam"}


def test_a_setting_shared_by_two_attacks_is_named_once():
    from dpeval.config import build_spec
    from dpeval.sweep.grid import describe, swept_fields

    specs = [build_spec({"defense": "rs", "attacks": ["ig", "rgap"], "attack": {"mask_aware": aware}})
             for aware in (True, False)]
    swept = swept_fields(specs)
    assert {describe(s, swept) for s in specs} == {"mask_aware=True", "mask_aware=False"}


def test_dry_run_applies_the_checks_of_run_in_one_line(tmp_path):
    """A grid every point of which `run` would refuse (too few shadow models for the victim game) is refused
    by --dry-run before listing anything, in one line naming the point, and writes nothing."""
    path = tmp_path / "sweep.yaml"
    path.write_text("defense: {name: rs, final_rate: [0.5, 0.9]}\nattacks: [lira]\nattack: {shadows: 4}\n"
                    "train: {epochs: 1}\nseeds: [0, 1]\n")
    result = CliRunner().invoke(main, ["sweep", str(path), "--dry-run", "--results", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "grid point final_rate=0.5 seed=0: attack.shadows" in result.stderr
    assert "needs at least 5 shadow models" in result.stderr
    assert not (tmp_path / "r").exists()


def test_a_failure_names_a_log_only_when_it_exists(tmp_path):
    from dpeval.runner import log_hint

    assert log_hint(tmp_path) == ""
    (tmp_path / "log.txt").write_text("x")
    assert log_hint(tmp_path) == f" (log: {tmp_path / 'log.txt'})"
