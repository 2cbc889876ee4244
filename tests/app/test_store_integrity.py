"""What a run, the store and the files beside it do when the ground moves under them: a full disk while a file
is written, two processes resuming one run, a store moved or deleted while a run trains, links planted in a run's
folder, damaged or stale checkpoints and shadow models.

The contract is the one of tests/app/test_bad_input.py and tests/app/test_faults.py: a refusal is exit 2 and one
line, nothing written; a runtime failure is exit 1 and one line naming the run, its log and the original error;
no file is ever left half-written, and an existing one is replaced whole or not at all.
"""

import errno
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.store import ResultStore
from tests.app.test_bad_input import record_runs

QUICK_RUN = ["run", "--defense", "none", "--attack", "none", "--epochs", "1", "--quiet"]
ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def disk_full_on_flush(monkeypatch, name: str) -> None:
    """The disk fills up while a file whose name contains ``name`` is written: flushing it to the disk
    (``os.fsync``) fails with ENOSPC, as it does where space is allocated late."""
    real = os.fsync

    def fsync(fd):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(ENOSPC.errno, ENOSPC.strerror)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def half_then_full(target, data: bytes = b"half a file") -> None:
    """What a writer does when the disk fills up mid-way: part of the bytes land, then ENOSPC."""
    if hasattr(target, "write"):
        target.write(data)
    else:
        Path(target).write_bytes(data)
    raise OSError(ENOSPC.errno, ENOSPC.strerror)


def open_files_under(folder: Path) -> list[str]:
    """The files under ``folder`` this process still holds open."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(folder.resolve())):
            found.append(target)
    return found


# -- a full disk ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["write", "flush"])
def test_write_atomic_on_a_full_disk_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, where):
    from dpeval.core.files import write_atomic

    path = tmp_path / "board.csv"
    path.write_text("the old board\n")
    handed = []

    def write(f):
        handed.append(f)
        if where == "write":
            half_then_full(f)
        f.write(b"the new board\n")

    if where == "flush":
        disk_full_on_flush(monkeypatch, "board.csv")
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(path, write)
    assert path.read_text() == "the old board\n"
    assert [p.name for p in tmp_path.iterdir()] == ["board.csv"]
    assert handed[0].closed and not open_files_under(tmp_path)


def test_write_atomic_replaces_the_file_whole(tmp_path):
    from dpeval.core.files import write_atomic, write_text_atomic

    path = tmp_path / "a.txt"
    write_text_atomic(path, "one\n")
    write_atomic(path, lambda f: f.write(b"two\n"))
    assert path.read_text() == "two\n" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


@pytest.mark.parametrize("name", ["checkpoint.pt", "model.pt"])
def test_a_full_disk_while_a_run_saves_marks_it_failed_and_names_the_error(tmp_path, monkeypatch, name):
    """The checkpoint (after the first epoch) or model.pt cannot be flushed: the row is failed, the one line
    names the run, its log and the disk's own error; no temporary file is left, none held open."""
    disk_full_on_flush(monkeypatch, name)
    result = CliRunner().invoke(main, [*QUICK_RUN, "--results", str(tmp_path)])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    (row,) = ResultStore(tmp_path).rows()
    run_dir = ResultStore(tmp_path).run_dir(row["run_id"])
    assert row["status"] == "failed" and "No space left on device" in row["error"]
    assert row["run_id"] in line and str(run_dir / "log.txt") in line and "No space left on device" in line
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / name).exists()
    assert not open_files_under(tmp_path)


def test_a_full_disk_that_also_stops_the_store_still_names_the_error_run_and_log(tmp_path, monkeypatch):
    """The disk is so full that the failure cannot be recorded either: the line still says what went wrong
    first, which run, where its log is, and what became of its row."""
    from dpeval.core.errors import RunFailure

    disk_full_on_flush(monkeypatch, "checkpoint.pt")

    def store_full(self, run_id, error, metrics=None):
        raise RunFailure(f"cannot use {self.db_path}: database or disk is full")

    monkeypatch.setattr(ResultStore, "fail", store_full)
    result = CliRunner().invoke(main, [*QUICK_RUN, "--results", str(tmp_path)])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    (row,) = ResultStore(tmp_path).rows()
    run_dir = ResultStore(tmp_path).run_dir(row["run_id"])
    assert "No space left on device" in line and row["run_id"] in line and str(run_dir / "log.txt") in line
    assert "database or disk is full" in line and "stays `running`" in line


@pytest.mark.parametrize("where", ["write", "flush"])
def test_leaderboard_out_on_a_full_disk_keeps_the_old_csv(tmp_path, monkeypatch, where):
    from dpeval import leaderboard

    record_runs(tmp_path / "r", 2)
    out = tmp_path / "board.csv"
    assert CliRunner().invoke(main, ["leaderboard", "--results", str(tmp_path / "r"), "--out", str(out)]).exit_code == 0
    before = out.read_bytes()
    if where == "write":
        monkeypatch.setattr(leaderboard, "write_csv", lambda records, handle: half_then_full(handle, "run_id,"))
    else:
        disk_full_on_flush(monkeypatch, "board.csv")
    result = CliRunner().invoke(main, ["leaderboard", "--results", str(tmp_path / "r"), "--out", str(out)])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert f"--out: cannot write {out}" in line and "No space left on device" in line
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board.csv", "r"]


@pytest.mark.parametrize("where", ["write", "flush"])
def test_report_on_a_full_disk_leaves_no_empty_figure_and_keeps_the_old_page(tmp_path, monkeypatch, where):
    import matplotlib.figure

    store = ResultStore(tmp_path / "r")
    run_id = store.begin("a" * 16, {"seed": 0})
    store.finish(run_id, {"run_id": run_id, "run_key": "a" * 16, "dataset": "digits", "model": "cnn3",
                          "defense": "none", "attack": "none", "seed": 0, "privacy.epsilon": 3.0,
                          "utility.test_accuracy": 0.9, "utility.test_accuracy_by_epoch": [0.5, 0.9]})
    out = tmp_path / "page" / "report.html"
    out.parent.mkdir()
    out.write_text("<p>the old report</p>")
    if where == "write":
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, target, **kw: half_then_full(target))
    else:
        disk_full_on_flush(monkeypatch, ".png")
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert "--out" in line and "No space left on device" in line
    assert out.read_text() == "<p>the old report</p>"
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]
