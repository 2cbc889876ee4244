"""Contracts of the commands under hostile input: what is refused is refused before any work (exit 2, nothing
written), and what is accepted runs to the end.

- ``audit --scope run``: every accepted ``--canaries`` is split into guesses that fit (k+ + k− ≤ m, = m for the
  rule that guesses on every canary); an unusable one is refused before training.
- ``run``: exit 2 means nothing was written, also for what only the reference run (``--reference``) or an attack
  on given weights (``--weights``) needs: it is checked before the main run trains.
- ``sweep --workers N`` killed with ``kill -9``: its workers stop on their own within seconds, their points recorded
  as interrupted (resumable), and no later sweep resumes a point beside a live process still running it.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dpeval.audit import run as run_audit
from dpeval.cli import main
from dpeval.core.one_run_bounds import GUESS_RULES, guess_counts
from dpeval.store import INTERRUPTED, STALE_ERROR, ResultStore
from dpeval.sweep import driver, executors
from tests.app.test_faults import children, gone

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------
# audit --scope run: the canaries' guessing rules


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 10, 11, 15, 19, 99, 101, 1001, 1003])
def test_every_guessing_rule_fits_the_canaries(m):
    """Each rule guesses on at least one and at most m canaries, close to its fractions of m; the rule that
    guesses on every canary (half in, half out) makes exactly m guesses, also for m ≡ 3 (mod 4) where rounding
    each half on its own made m + 1."""
    for (f_in, f_out), (k_in, k_out) in zip(GUESS_RULES, guess_counts(m)):
        assert 1 <= k_in + k_out <= m and k_in >= 0 and k_out >= 0, (m, f_in, f_out, k_in, k_out)
        assert abs(k_in - f_in * m) <= 1 and abs(k_out - f_out * m) <= 1, (m, f_in, f_out, k_in, k_out)
        if f_in + f_out == 1:
            assert k_in + k_out == m


def test_every_canary_count_up_to_a_thousand_splits():
    for m in range(2, 1001):
        assert all(k_in + k_out <= m for k_in, k_out in guess_counts(m)), m


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.timeout(300)
def test_a_run_audit_with_three_canaries_finishes():
    """End to end at the smallest settings: m = 3 trained to the end and then crashed on 2 + 2 guesses."""
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--canaries", "3", "--quiet", "--json",
                    "--set", "train.epochs=1")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["audit.canaries"] == 3 and data["audit.guesses"] <= 3
    assert all(t["guesses"] <= 3 for t in data["audit.tests"])


@pytest.mark.parametrize("args", [["--canaries", "1"], ["--canaries", "0"], ["--canaries", "-4"],
                                  ["--canaries", "100000"], ["--canaries", "1", "--canary-kind", "input"],
                                  ["--canaries", "100000000", "--canary-kind", "input"]])
def test_unusable_canaries_are_refused_before_training(args, monkeypatch):
    """Fewer than two, more gradient canaries than trainable parameters, more input canaries than private
    examples (10⁸ noise images: a memory error with a traceback before)."""
    def no_training(*a, **k):
        raise AssertionError("trained before refusing --canaries")

    monkeypatch.setattr(run_audit, "train", no_training)
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--quiet", *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: --canaries: ") and "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------------
# run: exit 2, nothing written


def refused(results: Path, *args: str) -> str:
    """``dpeval run ARGS`` exits 2 with one line on stderr, which it returns, and writes nothing in ``results``."""
    result = invoke("run", *args, "--quiet", "--results", str(results))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: ") and "Traceback" not in result.output
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))
    return line


def test_a_reference_that_cannot_reach_its_epsilon_is_refused_before_the_main_run(tmp_path):
    """The non-private main run has no ε to reach; the DP-SGD reference does. It used to be trained and recorded
    first, then exit 2 without a word about it."""
    line = refused(tmp_path / "r", "--defense", "none", "--reference", "dpsgd", "--epsilon", "1e9", "--epochs", "1",
                   "--attack", "none")
    assert "--reference dpsgd: privacy.epsilon" in line


def test_an_interrupted_reference_with_a_damaged_checkpoint_is_refused_before_the_main_run(tmp_path):
    """The reference would resume from its checkpoint, which cannot be loaded: refused before the main run, the
    folder left as it was."""
    from dpeval.config import build_spec
    from dpeval.reference import reference_spec

    store = ResultStore(tmp_path)
    wanted = reference_spec(build_spec({"defense": {"name": "none"}, "train": {"epochs": 1}}), "dpsgd")
    run_id = store.begin(wanted.run_key, wanted.canonical())
    store.fail(run_id, "interrupted")
    (store.run_dir(run_id) / "checkpoint.pt").write_bytes(b"half a checkpoint")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = invoke("run", "--defense", "none", "--reference", "dpsgd", "--epochs", "1", "--quiet",
                    "--results", str(tmp_path))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: --reference dpsgd: checkpoint ") and "cannot be used" in line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_reference_that_can_run_still_runs_after_the_main_run(tmp_path):
    result = invoke("run", "--defense", "none", "--reference", "dpsgd", "--epochs", "1", "--attack", "none", "--quiet",
                    "--set", "data.name=synthetic", "--set", "data.synthetic.size=200", "--set", "train.batch_size=64",
                    "--results", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert "dpsgd" in json.loads(result.stdout)["reference"]
    rows = ResultStore(tmp_path).rows("done")
    assert [r["metrics"]["defense"] for r in rows] == ["none", "dpsgd"]  # the main run first


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A state dict of the default digits model (untrained: only its names and shapes matter here)."""
    import torch

    from dpeval.config import build_spec
    from dpeval.runner import prepare

    path = tmp_path_factory.mktemp("weights") / "model.pt"
    torch.save(prepare(build_spec({"defense": {"name": "none"}})).model.state_dict(), path)
    return path


@pytest.mark.parametrize("args,field", [
    (["--attack", "loss", "--set", "data.test_fraction=0"], "data.test_fraction"),
    (["--attack", "ig", "--set", "attack.at=final", "--set", "attack.targets=1000000"], "attack.targets"),
], ids=["game-without-held-out-data", "more-targets-than-examples"])
def test_an_attack_on_given_weights_is_checked_before_anything_is_written(tmp_path, weights, args, field):
    """With --weights the attacks' data and model checks were skipped: the run was recorded and its attack failed
    (exit 1) instead of being refused."""
    line = refused(tmp_path / "r", "--defense", "none", "--weights", str(weights), *args)
    assert f"error: {field}" in line


# ---------------------------------------------------------------------------------------------------
# sweep: kill -9 of the driver


def sweep_file(tmp_path: Path, epochs: int, seeds: list[int]) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"defense": {"name": "none"}, "attacks": ["none"], "seeds": seeds,
                                    "train": {"epochs": epochs, "batch_size": 64}}))
    return path


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_of_a_sweep_stops_its_workers_and_the_next_sweep_runs_each_point_once(tmp_path):
    """Both points of a two-worker sweep are training when the driver gets SIGKILL: the orphaned workers (which
    used to finish their point, then wait forever for the next) stop within seconds and record their points as
    interrupted; the next sweep resumes each from its checkpoint and finishes it, once."""
    results = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "dpeval.cli", "sweep", str(sweep_file(tmp_path, 40, [0, 1])), "--workers", "2",
           "--quiet", "--results", str(results)]
    store = ResultStore(results)

    def training() -> bool:  # both points running, each past its first epoch's checkpoint
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
        rows = store.rows() if store.db_path.exists() else []
        return len(rows) == 2 and all(r["status"] == "running" for r in rows) and all(
            (store.run_dir(r["run_id"]) / "checkpoint.pt").is_file() for r in rows)

    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    workers = []
    try:
        wait_until(training, 300, "the sweep's points did not start training in time")
        workers = [pid for pid in children(proc.pid) if b"spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 2
        proc.kill()
        proc.wait()
        wait_until(lambda: all(gone(pid) for pid in workers), 30, "the orphaned workers did not stop")
    finally:
        proc.kill()
        for pid in workers:  # on failure: leave no orphan behind
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    interrupted = {r["run_id"]: r for r in store.rows()}  # recorded by the workers themselves: nothing reaped them
    assert all(r["status"] == "failed" and r["error"] == executors.DRIVER_GONE for r in interrupted.values())
    assert executors.DRIVER_GONE.startswith(INTERRUPTED)  # resumable
    for run_id in interrupted:
        assert "the sweep driver (pid" in (store.run_dir(run_id) / "log.txt").read_text()

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    rows = store.rows()
    assert {r["run_id"] for r in rows} == set(interrupted)  # each point resumed under its id, none started over
    assert all(r["status"] == "done" for r in rows)
    assert all(len(r["metrics"]["utility.test_accuracy_by_epoch"]) == 40 for r in rows)


def live_row(results: Path, seconds: int, reap: bool = True) -> tuple[subprocess.Popen, str]:
    """A one-point sweep file's point recorded `running` by a live process (a stand-in for a killed sweep's
    orphaned worker) that exits after ``seconds``; waited for when it does, unless not ``reap``."""
    from dpeval.sweep.grid import load_sweep

    (spec,) = load_sweep(sweep_file(results.parent, 1, [0]))
    store = ResultStore(results)
    run_id = store.begin(spec.run_key, spec.canonical())
    holder = subprocess.Popen(["sleep", str(seconds)])
    if reap:
        threading.Thread(target=holder.wait, daemon=True).start()
    with sqlite3.connect(store.db_path) as conn:
        conn.execute("UPDATE runs SET pid=? WHERE run_id=?", (holder.pid, run_id))
    return holder, run_id


def sweep_beside(tmp_path: Path, holder: subprocess.Popen, monkeypatch) -> list[bool]:
    """Run the one-point sweep of ``live_row`` in this process; whether ``holder`` had ended when its point started."""
    real = executors.run_job
    holder_ended = []

    def run_job(*args, **kwargs):
        holder_ended.append(holder.poll() is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(executors, "run_job", run_job)
    result = invoke("sweep", str(tmp_path / "sweep.yaml"), "--quiet", "--results", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    return holder_ended


@pytest.mark.timeout(300)
def test_a_sweep_waits_for_a_point_that_a_live_process_still_runs(tmp_path, monkeypatch):
    """The point is run only once the process running it has ended (as an orphaned worker does within seconds),
    never beside it: a killed sweep's point is resumed in its own folder, which two processes must not write."""
    holder, run_id = live_row(tmp_path / "r", 3)
    assert sweep_beside(tmp_path, holder, monkeypatch) == [True]
    rows = {r["run_id"]: r for r in ResultStore(tmp_path / "r").rows()}
    assert rows.pop(run_id)["error"] == STALE_ERROR and [r["status"] for r in rows.values()] == ["done"]


@pytest.mark.timeout(120)
def test_a_point_that_a_live_process_keeps_running_is_run_anew_beside_it(tmp_path, monkeypatch):
    """Past the grace period (not an orphan that stops: another dpeval run, say) the point runs under a new id
    and in its own folder, as beside any single run; the live process's row is left to it."""
    monkeypatch.setattr(driver, "LIVE_RUN_GRACE_S", 0.5)
    holder, run_id = live_row(tmp_path / "r", 60)
    try:
        assert sweep_beside(tmp_path, holder, monkeypatch) == [False]
    finally:
        holder.kill()
    rows = {r["run_id"]: r for r in ResultStore(tmp_path / "r").rows()}
    assert rows.pop(run_id)["status"] == "running" and [r["status"] for r in rows.values()] == ["done"]


def test_a_process_that_exited_but_was_not_waited_for_is_not_alive(tmp_path):
    """An orphaned worker that exits under an init that does not reap it stays a zombie: its row is reaped all
    the same (before, a zombie answered kill(pid, 0) and its point stayed `running`, waited for forever)."""
    holder, run_id = live_row(tmp_path / "r", 0, reap=False)
    try:
        wait_until(lambda: gone(holder.pid), 30, "sleep 0 did not exit")
        assert Path(f"/proc/{holder.pid}").exists()  # a zombie
        store = ResultStore(tmp_path / "r")
        assert store.live_runs() == {} and store.fail_stale() == 1
    finally:
        holder.wait()
    assert store.get(run_id)["error"] == STALE_ERROR
