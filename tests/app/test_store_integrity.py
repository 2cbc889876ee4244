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
import torch
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


TWO_EPOCHS = ["run", "--defense", "none", "--attack", "none", "--epochs", "2", "--quiet", "--json"]


def during_training(monkeypatch, step: int, action) -> None:
    """``action()`` at the ``step``-th release of training, once."""
    from dpeval.engine import training

    real, calls = training.apply_release, []

    def release(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            action()
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "apply_release", release)


def interrupted_run(results: Path, monkeypatch, args=TWO_EPOCHS) -> tuple[dict, Path]:
    """``args`` run on ``results`` and stopped (Ctrl-C) in its second epoch (9 steps each), after its first
    checkpoint: the row and the run's folder."""
    from dpeval.engine import training

    def ctrl_c():
        raise KeyboardInterrupt

    real = training.apply_release
    during_training(monkeypatch, 12, ctrl_c)
    assert CliRunner().invoke(main, [*args, "--results", str(results)]).exit_code == 130
    monkeypatch.setattr(training, "apply_release", real)
    (row,) = ResultStore(results).rows()
    run_dir = ResultStore(results).run_dir(row["run_id"])
    assert (run_dir / "checkpoint.pt").is_file()
    return row, run_dir


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
    assert CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    if where == "write":
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, target, **kw: half_then_full(target))
    else:
        disk_full_on_flush(monkeypatch, ".png")
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert "--out" in line and "No space left on device" in line
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before  # the earlier report, whole


# -- two processes resuming one run ------------------------------------------------------------------------------


def interrupted_row(root: Path, key: str = "e" * 16) -> str:
    """A store with one run interrupted after a checkpoint (the row and the file, no training)."""
    store = ResultStore(root)
    run_id = store.begin(key, {"seed": 0})
    store.fail(run_id, "interrupted")
    (store.run_dir(run_id) / "checkpoint.pt").write_bytes(b"a checkpoint")
    return run_id


def claim_after_barrier(root: str, key: str, barrier, answers) -> None:
    """One process: read which run to resume, wait for the other one to have read it too, then claim it."""
    from dpeval.core.errors import ConfigError

    store = ResultStore(root)
    run_id = store.resumable(key)
    barrier.wait(timeout=60)
    try:
        store.resume(run_id)
    except ConfigError as exc:
        answers.put(("refused", str(exc)))
    else:
        answers.put(("resumed", os.getpid()))


@pytest.mark.parametrize("attempt", range(20))
def test_two_processes_resuming_one_run_only_one_claims_it(tmp_path, attempt):
    """Both processes have read the interrupted row before either updates it (a barrier between the two): one
    claims the run, the other is refused in one line and touches nothing."""
    import multiprocessing

    run_id = interrupted_row(tmp_path)
    context = multiprocessing.get_context("fork")
    barrier, answers = context.Barrier(2), context.Queue()
    procs = [context.Process(target=claim_after_barrier, args=(str(tmp_path), "e" * 16, barrier, answers))
             for _ in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    got = sorted(answers.get(timeout=5) for _ in procs)
    assert [kind for kind, _ in got] == ["refused", "resumed"], got
    winner, refusal = got[1][1], got[0][1]
    assert f"run {run_id} is already being resumed by process {winner}" in refusal and "\n" not in refusal
    row = ResultStore(tmp_path).get(run_id)
    assert row["status"] == "running" and row["pid"] == winner and row["error"] is None


def test_a_run_resumed_by_another_process_meanwhile_is_refused_and_its_result_kept(tmp_path, monkeypatch):
    """Another process resumes the run and finishes it between this one's reading the row and claiming it (the
    race forced by running the winner right there): this one exits 2 in one line, writes nothing, and the done
    row keeps its metrics, also when this process is then stopped."""
    import signal
    import subprocess
    import sys

    args = [*TWO_EPOCHS, "--results", str(tmp_path)]
    row, run_dir = interrupted_run(tmp_path, monkeypatch)
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}

    real_resume = ResultStore.resume
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}

    def the_other_process_wins(self, run_id):
        winner = subprocess.run([sys.executable, "-m", "dpeval.cli", *args], cwd=root, env=env, capture_output=True,
                                text=True, timeout=300)
        assert winner.returncode == 0 and f"resuming run {run_id}" in winner.stderr, winner.stderr
        before.clear()
        before.update({p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()})
        return real_resume(self, run_id)

    monkeypatch.setattr(ResultStore, "resume", the_other_process_wins)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"run {row['run_id']} was resumed and finished by another process" in line
    done = ResultStore(tmp_path).get(row["run_id"])
    assert done["status"] == "done" and done["metrics"]["utility.test_accuracy"] > 0
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before  # nothing written by the loser
    # Even a late stop of the loser cannot turn the done row failed: a failure is recorded on running rows only.
    assert ResultStore(tmp_path).record_failure(row["run_id"], f"terminated by {signal.SIGTERM.name}")
    assert ResultStore(tmp_path).get(row["run_id"]) == done


# -- the store moved or deleted while a run trains -----------------------------------------------------------------


@pytest.mark.parametrize("what", ["moved aside", "deleted", "replaced by a new store"])
def test_a_run_whose_store_disappears_fails_loudly_and_creates_no_store(tmp_path, monkeypatch, what):
    """The store is moved aside (dpeval's own advice for a damaged one), deleted, or moved aside with another
    store started in its place while a run trains: the run ends with exit 1 and one line saying its result is
    recorded nowhere and where its files are; no empty store is created for it."""
    db = tmp_path / "results.sqlite"

    def disappear():
        if what == "deleted":
            db.unlink()
        else:
            db.rename(tmp_path / "results.sqlite.broken")
        if what == "replaced by a new store":
            record_runs(tmp_path, 1)

    during_training(monkeypatch, 3, disappear)
    result = CliRunner().invoke(main, [*QUICK_RUN, "--results", str(tmp_path)])
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "model.pt").exists()]
    assert f"no longer holds run {run_dir.name}" in line and f"its files are in {run_dir}" in line
    assert (run_dir / "metrics.json").is_file() and (run_dir / "model.pt").is_file()
    if what == "replaced by a new store":
        assert run_dir.name not in {r["run_id"] for r in ResultStore(tmp_path).rows()}
    else:
        assert not db.exists()


def test_a_store_that_disappears_is_not_created_again_by_the_same_command(tmp_path):
    """A command that has used a store never starts a new one in its place (a sweep's next point)."""
    from dpeval.core.errors import RunFailure

    store = ResultStore(tmp_path)
    first = store.begin("a" * 16, {})
    (tmp_path / "results.sqlite").rename(tmp_path / "results.sqlite.broken")
    with pytest.raises(RunFailure, match="moved or deleted while this command ran"):
        store.begin("b" * 16, {})
    with pytest.raises(RunFailure, match=f"no longer holds run {first}"):
        store.fail(first, "boom")
    assert not (tmp_path / "results.sqlite").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [first]


# -- links in a run's folder ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["config.yaml", "log.txt", "checkpoint.pt", "checkpoint.pt.tmp", "model.pt.tmp",
                                  "metrics.json.tmp", "shadows"])
def test_resume_refuses_a_run_folder_holding_a_link_and_writes_nothing_through_it(tmp_path, monkeypatch, name):
    """A link planted in an interrupted run's folder (to a file or, for ``shadows``, a folder outside the
    results): resuming is refused in one line naming it (exit 2, the row untouched), nothing is written where
    it points; with the link removed, the same command resumes."""
    row, run_dir = interrupted_run(tmp_path / "r", monkeypatch)
    outside = tmp_path / "outside"
    if name == "shadows":
        outside.mkdir()
    else:
        outside.write_bytes((run_dir / "checkpoint.pt").read_bytes() if name == "checkpoint.pt" else b"not dpeval's\n")
    link = run_dir / name
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    before = outside.read_bytes() if outside.is_file() else sorted(outside.iterdir())

    result = CliRunner().invoke(main, [*TWO_EPOCHS, "--results", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"{link} is a symbolic link" in line and f"rm {link}" in line
    assert ResultStore(tmp_path / "r").get(row["run_id"]) == row
    assert (outside.read_bytes() if outside.is_file() else sorted(outside.iterdir())) == before

    link.unlink()
    if name == "checkpoint.pt":
        outside.rename(link)
    resumed = CliRunner().invoke(main, [*TWO_EPOCHS, "--results", str(tmp_path / "r")])
    assert resumed.exit_code == 0 and f"resuming run {row['run_id']}" in resumed.stderr, resumed.output
    assert not outside.exists() or (outside.read_bytes() if outside.is_file() else sorted(outside.iterdir())) == before


def test_write_atomic_replaces_a_link_at_the_target_without_writing_through_it(tmp_path):
    from dpeval.core.files import write_text_atomic

    outside = tmp_path / "outside.txt"
    outside.write_text("not dpeval's\n")
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "config.yaml"
    target.symlink_to(outside)
    write_text_atomic(target, "seed: 0\n")
    assert not target.is_symlink() and target.read_text() == "seed: 0\n" and outside.read_text() == "not dpeval's\n"


def test_a_run_log_is_never_opened_through_a_link(tmp_path):
    from dpeval.logs import RunLogHandler

    outside = tmp_path / "outside.txt"
    outside.write_text("not dpeval's\n")
    (tmp_path / "log.txt").symlink_to(outside)
    with pytest.raises(OSError) as refused:
        RunLogHandler(tmp_path / "log.txt")
    assert refused.value.errno == errno.ELOOP and outside.read_text() == "not dpeval's\n"
    handler = RunLogHandler(tmp_path / "fresh.txt")
    handler.close()


# -- a checkpoint's content --------------------------------------------------------------------------------------


def rewrite_checkpoint(path: Path, run_key: str, change) -> None:
    """The checkpoint at ``path`` with ``change(payload)`` applied, written as dpeval writes one (format, key and
    hash all right: only the content is off)."""
    import io

    from dpeval import checkpoint

    record = torch.load(path, weights_only=True)
    payload = torch.load(io.BytesIO(record["payload"].numpy().tobytes()), weights_only=True)
    change(payload)
    checkpoint.save(path, run_key, payload)


def drop(*keys):
    def change(payload):
        *outer, last = keys
        target = payload
        for key in outer:
            target = target[key]
        del target[last]
    return change


CONTENT_DAMAGE = {
    "no loop state": drop("loop"),
    "loop state without its optimizer": drop("loop", "optimizer"),
    "an older version's learning curve": lambda p: [entry.pop("density") for entry in p["loop"]["history"]],
    "steps as text": lambda p: p["loop"].update(steps="9"),
    "no initial model state": drop("states", "init"),
    "a model state that is not tensors": lambda p: p["states"].update(init={"w": "x"}),
}


@pytest.mark.parametrize("damage", CONTENT_DAMAGE)
def test_a_checkpoint_whose_content_is_off_is_refused_in_one_line(tmp_path, monkeypatch, damage):
    """Format, run key and hash are right but the payload is not what this version writes (missing or mistyped
    parts, an older version's layout): refused in one line before anything is written (exit 2), the row left
    as it was, not `running`."""
    row, run_dir = interrupted_run(tmp_path, monkeypatch)
    path = run_dir / "checkpoint.pt"
    rewrite_checkpoint(path, row["run_key"], CONTENT_DAMAGE[damage])
    result = CliRunner().invoke(main, [*TWO_EPOCHS, "--results", str(tmp_path)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"checkpoint {path} cannot be used" in line and f"rm {path}" in line
    assert ResultStore(tmp_path).get(row["run_id"]) == row


def test_a_checkpoint_of_the_previous_format_is_refused(tmp_path, monkeypatch):
    from dpeval import checkpoint

    row, run_dir = interrupted_run(tmp_path, monkeypatch)
    path = run_dir / "checkpoint.pt"
    monkeypatch.setattr(checkpoint, "FORMAT", checkpoint.FORMAT - 1)
    rewrite_checkpoint(path, row["run_key"], lambda payload: None)
    monkeypatch.undo()
    result = CliRunner().invoke(main, [*TWO_EPOCHS, "--results", str(tmp_path)])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert f"format {checkpoint.FORMAT - 1}, expected {checkpoint.FORMAT}" in line
    assert ResultStore(tmp_path).get(row["run_id"]) == row


def test_the_checkpoint_format_changes_with_its_payload():
    """A reminder that fails when the payload changes: bump dpeval.checkpoint.FORMAT, then update this test."""
    from dpeval import checkpoint
    from dpeval.checkpoint import LOOP_STATE

    assert checkpoint.FORMAT == 3
    assert sorted(checkpoint.PAYLOAD) == ["defense_states", "loop", "states"]
    assert sorted(LOOP_STATE) == ["bytes_dense", "defense", "densities", "epochs_done", "globals", "history", "model",
                                  "optimizer", "sampler", "schedule", "sparse_bytes", "steps", "train_s"]


# -- saved shadow models --------------------------------------------------------------------------------------------


def saved_shadows(folder: Path, key: str = "run-1:game", k: int = 3):
    from dpeval.checkpoint import ShadowStore

    store = ShadowStore(folder, key)
    for i in range(k):
        store.save(i, {"w": torch.full((100,), float(i))})
    return store


@pytest.mark.parametrize("damage", ["truncated", "another run's", "swapped"])
def test_a_bad_saved_shadow_is_discarded_and_the_good_ones_kept(tmp_path, caplog, damage):
    """A truncated file, one saved by another run (or game), or two files swapped (each records its index): the
    bad ones are removed with a warning, to be trained again; the others load."""
    store = saved_shadows(tmp_path)
    if damage == "truncated":
        store.path(1).write_bytes(store.path(1).read_bytes()[:200])
        bad = [1]
    elif damage == "another run's":
        saved_shadows(tmp_path / "other", key="run-2:game").path(1).replace(store.path(1))
        bad = [1]
    else:
        store.path(0).rename(tmp_path / "swap")
        store.path(1).rename(store.path(0))
        (tmp_path / "swap").rename(store.path(1))
        bad = [0, 1]
    with caplog.at_level("WARNING", logger="dpeval"):
        finished = store.finished(3)
    assert sorted(finished) == [i for i in range(3) if i not in bad]
    assert all(torch.equal(finished[i]["w"], torch.full((100,), float(i))) for i in finished)
    assert all(not store.path(i).exists() for i in bad) and all(store.path(i).exists() for i in finished)
    assert all(str(store.path(i)) in caplog.text for i in bad)


LIRA = ["run", "--defense", "dpsgd", "--attack", "lira", "--epochs", "2", "--set", "train.batch_size=256", "--set",
        "attack.shadows=4", "--set", "attack.mia_target=shadows", "--quiet", "--json"]


@pytest.fixture(scope="module")
def lira_reference(tmp_path_factory):
    """The metrics of the LiRA run never interrupted."""
    import json

    from dpeval.attacks import membership_game

    result = CliRunner().invoke(main, [*LIRA, "--results", str(tmp_path_factory.mktemp("ref"))])
    assert result.exit_code == 0, result.output
    membership_game._POOLS.clear()  # its shadows, kept in memory for this process
    return json.loads(result.stdout)


@pytest.mark.parametrize("damage", ["truncated", "another run's", "swapped"])
def test_a_run_resumed_with_a_bad_saved_shadow_trains_it_again_and_keeps_its_result(tmp_path, monkeypatch,
                                                                                     lira_reference, damage):
    """Interrupted after its first group of two shadows, whose files are then damaged: the same command resumes
    (training is not redone), trains the bad shadows again and ends with the uninterrupted run's metrics."""
    import json

    from dpeval import checkpoint
    from dpeval.attacks import membership_game

    monkeypatch.setattr(membership_game, "SHADOW_GROUP", 2)
    monkeypatch.setattr(membership_game, "_POOLS", {})  # no shadows kept in memory from another test's run
    real, trained = checkpoint.ShadowStore.save, []

    def save(self, i, state):
        trained.append(i)
        if len(trained) == 3:
            raise KeyboardInterrupt
        real(self, i, state)

    monkeypatch.setattr(checkpoint.ShadowStore, "save", save)
    assert CliRunner().invoke(main, [*LIRA, "--results", str(tmp_path)]).exit_code == 130
    (row,) = ResultStore(tmp_path).rows()
    (folder,) = (ResultStore(tmp_path).run_dir(row["run_id"]) / "shadows").iterdir()
    first, second = folder / "shadow-0.pt", folder / "shadow-1.pt"
    if damage == "truncated":
        second.write_bytes(second.read_bytes()[:300])
    elif damage == "another run's":  # the same file saved by another run of this configuration
        record = torch.load(second, weights_only=True)
        record["run_key"] = record["run_key"].replace(row["run_id"], "20990101-000000-00000000-0000")
        torch.save(record, second)
    else:
        first.rename(folder / "swap")
        second.rename(first)
        (folder / "swap").rename(second)

    def counting(self, i, state):
        trained.append(i)
        real(self, i, state)

    trained.clear()
    monkeypatch.setattr(checkpoint.ShadowStore, "save", counting)
    resumed = CliRunner().invoke(main, [*LIRA, "--results", str(tmp_path)])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming run {row['run_id']}" in resumed.stderr and "cannot be used" in resumed.stderr
    assert sorted(trained) == ([1, 2, 3] if damage != "swapped" else [0, 1, 2, 3])
    got = json.loads(resumed.stdout)
    assert got["leakage.lira.auc"] == lira_reference["leakage.lira.auc"]
    assert got["utility.test_accuracy"] == lira_reference["utility.test_accuracy"]


def test_a_sweep_refuses_a_damaged_checkpoint_as_a_run_does(tmp_path, monkeypatch):
    """The sweep's point was interrupted and its checkpoint then damaged: the sweep refuses in one line before any
    point runs (exit 2), the row left as it was; with the checkpoint removed, as the line says, it starts over."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"defense": {"name": "none"}, "attacks": ["none"], "train": {"epochs": 2},
                                     "seeds": [0, 1]}))
    command = ["sweep", str(sweep), "--quiet", "--results", str(tmp_path / "r")]

    def ctrl_c():
        raise KeyboardInterrupt

    during_training(monkeypatch, 12, ctrl_c)
    assert CliRunner().invoke(main, command).exit_code == 130
    monkeypatch.undo()
    (row,) = ResultStore(tmp_path / "r").rows()
    path = ResultStore(tmp_path / "r").run_dir(row["run_id"]) / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:1000])

    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"checkpoint {path} cannot be used" in line and f"rm {path}" in line
    assert ResultStore(tmp_path / "r").rows() == [row]

    path.unlink()
    again = CliRunner().invoke(main, command)
    assert again.exit_code == 0, again.output
    assert sorted(r["status"] for r in ResultStore(tmp_path / "r").rows()) == ["done", "done", "failed"]
