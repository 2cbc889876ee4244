"""Faults in a real process: SIGTERM mid-run records the run as failed (and says so on its own line, not
glued to the progress bar); a ``kill -9``'d run's row is marked failed by the next ``show`` or ``run`` on its
folder (same host, process gone).

The runs would train for far longer than the tests wait: each test waits until the run is recorded and
its training progress bar is on stderr, then signals. The deadlines only turn a hang into a failure.
"""

import errno
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.store import STALE_ERROR, ResultStore

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 300


def start_run(results: Path, stderr_path: Path) -> subprocess.Popen:
    """A long ``dpeval run`` with its progress bar on (stderr to a file, as under Slurm or ``nohup``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(stderr_path, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "dpeval.cli", "run", "--defense", "dpsgd", "--attack", "none",
                                 "--epochs", "2000", "--set", "train.batch_size=64", "--results", str(results)],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)


def wait_for_training(proc: subprocess.Popen, results: Path, stderr_path: Path) -> str:
    """The run id once the run is recorded and its training progress bar is on stderr."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early with exit code {proc.returncode}"
        rows = ResultStore(results).rows()
        if rows and "train:" in stderr_path.read_text():
            return rows[0]["run_id"]
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run did not start training in time")


def stop(proc: subprocess.Popen, sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the run did not exit after signal {sig}") from None


def test_sigterm_marks_the_run_failed_and_says_so_on_its_own_line(tmp_path):
    results, err = tmp_path / "results", tmp_path / "stderr.txt"
    proc = start_run(results, err)
    run_id = wait_for_training(proc, results, err)
    assert stop(proc, signal.SIGTERM) == 128 + signal.SIGTERM
    row = ResultStore(results).get(run_id)
    assert row["status"] == "failed" and "SIGTERM" in row["error"]
    stderr = err.read_text()
    assert "train" in stderr  # the progress bar was on the stream
    # The message starts a line of its own (after the bar's final newline), not the bar's line.
    assert re.search(rf"(^|\n)dpeval: terminated by SIGTERM; run {run_id} recorded as failed\n$", stderr), stderr
    assert "Traceback" not in stderr
    shown = CliRunner().invoke(main, ["show", run_id, "--results", str(results)])
    assert "status: failed" in shown.stdout


def test_kill_9_is_reaped_by_the_next_show_and_the_next_run(tmp_path):
    """Two runs, each in its own folder, are killed with SIGKILL: ``show`` reaps the first folder's row and
    ``run`` the second's."""
    folders = [tmp_path / "a", tmp_path / "b"]
    procs = [start_run(f, tmp_path / f"{f.name}.err") for f in folders]
    ids = [wait_for_training(p, f, tmp_path / f"{f.name}.err") for p, f in zip(procs, folders)]
    for proc in procs:
        assert stop(proc, signal.SIGKILL) == -signal.SIGKILL  # waited for: the process is gone
    for folder, run_id in zip(folders, ids):
        assert ResultStore(folder).get(run_id)["status"] == "running"  # nothing could record it

    shown = CliRunner().invoke(main, ["show", ids[0], "--results", str(folders[0])])
    assert shown.exit_code == 0 and "status: failed" in shown.stdout and STALE_ERROR in shown.stdout
    assert ResultStore(folders[0]).get(ids[0])["status"] == "failed"

    ran = CliRunner().invoke(main, ["run", "--defense", "none", "--attack", "none", "--epochs", "1", "--quiet",
                                    "--results", str(folders[1])])
    assert ran.exit_code == 0, ran.output
    row = ResultStore(folders[1]).get(ids[1])
    assert row["status"] == "failed" and row["error"] == STALE_ERROR


QUICK_RUN = ["run", "--defense", "none", "--attack", "none", "--epochs", "1", "--quiet"]


def test_a_run_that_cannot_save_its_model_keeps_no_half_file(tmp_path, monkeypatch):
    """A full disk while model.pt is written: no truncated model.pt (written then renamed), the row
    failed, one line naming the run and its log."""
    import torch

    real = torch.save

    def disk_full(obj, f):
        if "model.pt" not in str(getattr(f, "name", "")):
            return real(obj, f)  # checkpoints still fit
        f.write(b"half a model")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    result = CliRunner().invoke(main, [*QUICK_RUN, "--results", str(tmp_path)])
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    (row,) = ResultStore(tmp_path).rows()
    run_dir = ResultStore(tmp_path).run_dir(row["run_id"])
    assert row["run_id"] in line and str(run_dir / "log.txt") in line and "No space left" in line
    assert row["status"] == "failed"
    assert not list(run_dir.glob("model.pt*"))


def test_a_run_whose_result_cannot_be_recorded_says_so(tmp_path, monkeypatch):
    """The store is held by a reader for longer than a writer waits, right when the trained run records
    its result: one line with the run id, its metrics and log; model.pt whole."""
    import torch

    from dpeval import runner

    monkeypatch.setattr("dpeval.store.LOCK_WAIT_S", 0.5)
    real = runner.perform
    readers = []

    def perform_then_lock(*args, **kwargs):
        metrics = real(*args, **kwargs)
        reader = sqlite3.connect(tmp_path / "results.sqlite", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM runs").fetchone()  # a shared lock: no writer can commit
        readers.append(reader)
        return metrics

    monkeypatch.setattr(runner, "perform", perform_then_lock)
    try:
        result = CliRunner().invoke(main, [*QUICK_RUN, "--results", str(tmp_path)])
    finally:
        for reader in readers:
            reader.close()
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    (row,) = ResultStore(tmp_path).rows()
    run_dir = ResultStore(tmp_path).run_dir(row["run_id"])
    assert f"run {row['run_id']} finished but its result could not be recorded" in line and "database is locked" in line
    assert str(run_dir / "log.txt") in line and str(run_dir / "metrics.json") in line
    assert "stays `running` until the next dpeval" in line
    assert torch.load(run_dir / "model.pt", weights_only=True)  # whole: written then renamed
    monkeypatch.setattr("dpeval.store.alive", lambda pid: False)  # as the next command sees it: process gone
    assert ResultStore(tmp_path).fail_stale() == 1 and ResultStore(tmp_path).get(row["run_id"])["status"] == "failed"


def sweep_file(tmp_path: Path, epochs: list[int], lr: list[float] | None = None) -> Path:
    path = tmp_path / "sweep.yaml"
    train = {"epochs": epochs, "batch_size": 64, **({"lr": lr} if lr else {})}
    path.write_text(yaml.safe_dump({"defense": {"name": "none"}, "attacks": ["none"], "train": train}))
    return path


def children(pid: int) -> list[int]:
    """The ids of the processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_a_sweeps_workers_and_keeps_what_finished(tmp_path, sig):
    """``sweep --workers 2``: one short point finishes, one long point runs; the signal ends the sweep at
    once (not after the long point), terminates both workers, keeps the finished point `done` and
    records the running one `failed`."""
    results = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "dpeval.cli", "sweep", str(sweep_file(tmp_path, [1, 3000])),
                                 "--workers", "2", "--quiet", "--results", str(results)],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + DEADLINE_S
    while not ResultStore(results).rows(status="done"):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
        time.sleep(0.5)
    workers = [pid for pid in children(proc.pid) if Path(f"/proc/{pid}/cmdline").read_bytes().count(b"spawn")]
    assert workers
    start = time.monotonic()
    code = stop(proc, sig)
    assert code == 128 + sig and time.monotonic() - start < 60
    assert all(gone(pid) for pid in workers)
    statuses = sorted((r["config"]["train"]["epochs"], r["status"]) for r in ResultStore(results).rows())
    assert statuses == [(1, "done"), (3000, "failed")]
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr and stderr.splitlines()[-1] == f"dpeval: terminated by {sig.name}"


@pytest.mark.slow
def test_sweep_workers_log_their_epochs_and_fail_in_one_line(tmp_path):
    """Under ``--workers 2`` each run's log.txt has its per-epoch lines; a failing point (a learning rate
    that diverges) is one line on the terminal, its traceback in its log."""
    results = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "dpeval.cli", "sweep", str(sweep_file(tmp_path, [2], [0.1, 1e30])),
                           "--workers", "2", "--quiet", "--results", str(results)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    store = ResultStore(results)
    rows = {r["config"]["train"]["lr"]: r for r in store.rows()}
    assert rows[0.1]["status"] == "done" and rows[1e30]["status"] == "failed"
    good = (store.run_dir(rows[0.1]["run_id"]) / "log.txt").read_text()
    assert "epoch 1/2 test accuracy" in good and "epoch 2/2 test accuracy" in good
    bad = (store.run_dir(rows[1e30]["run_id"]) / "log.txt").read_text()
    assert "Traceback" in bad and "train.lr" in bad
    failed = [line for line in proc.stderr.splitlines() if rows[1e30]["run_id"] in line]
    assert failed and all("train.lr" in line for line in failed)


def killed_job(canonical, run_id, run_dir, workers):
    """A worker's job that is killed with SIGKILL (as the out-of-memory killer does) when its run is "killed"."""
    if run_id == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"run_id": run_id}


@pytest.mark.timeout(300)
def test_a_sweep_worker_killed_by_sigkill_fails_its_point_and_the_lane_goes_on(tmp_path, monkeypatch):
    """A worker killed outright used to leave the driver with a BrokenProcessPool traceback at the next point
    (recorded running, never run). Now that point fails with one line and the next runs in a fresh worker."""
    from dpeval.config import build_spec
    from dpeval.sweep import executors

    monkeypatch.setattr(executors, "_worker_job", killed_job)  # pickled by name: the worker imports this module
    specs = [build_spec({"seed": seed}) for seed in (0, 1)]
    ids = iter(["killed", "next"])
    outcomes = []
    executors.ProcessExecutor(1).run(specs, lambda spec: (spec, next(ids), tmp_path),
                                     lambda job, metrics, error: outcomes.append((job[1], metrics, error)))
    (first, _, error), second = outcomes
    assert first == "killed" and error.startswith("WorkerKilled: ") and "\n" not in error
    assert second == ("next", {"run_id": "next"}, None)


@pytest.mark.timeout(30)
def test_a_fifo_as_a_runs_log_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO for writing waits for a reader: a run whose folder held one named log.txt used to hang."""
    from dpeval.core.errors import ConfigError
    from dpeval.logs import RunLogHandler

    os.mkfifo(tmp_path / "log.txt")
    with pytest.raises(ConfigError, match="log.txt is a FIFO"):
        RunLogHandler(tmp_path / "log.txt")
    handler = RunLogHandler(tmp_path / "other.txt")  # the control: a new regular file is opened and written
    handler.close()
    assert (tmp_path / "other.txt").is_file()
