"""Faults in a real process: SIGTERM mid-run records the run as failed (and says so on its own line, not
glued to the progress bar); a ``kill -9``'d run's row is marked failed by the next ``show`` or ``run`` on its
folder (same host, process gone).

The runs would train for far longer than the tests wait: each test waits until the run is recorded and
its training progress bar is on stderr, then signals. The deadlines only turn a hang into a failure.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from harness.cli import main
from harness.store import STALE_ERROR, ResultStore

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 300


def start_run(results: Path, stderr_path: Path) -> subprocess.Popen:
    """A long ``dpeval run`` with its progress bar on (stderr to a file, as under Slurm or ``nohup``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(stderr_path, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "--defense", "dpsgd", "--attack", "none",
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
