"""Results store: transactional status transitions and artefacts."""

import errno
import json
import multiprocessing
import secrets
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.core.errors import ConfigError, RunFailure
from dpeval.store import ResultStore


def test_lifecycle(tmp_path):
    store = ResultStore(tmp_path)
    run_id = store.begin("k" * 16, {"seed": 1})
    assert store.get(run_id)["status"] == "running"
    assert store.run_dir(run_id).is_dir()
    store.finish(run_id, {"utility.test_accuracy": 0.9, "privacy.epsilon": float("inf")})
    row = store.get(run_id)
    assert row["status"] == "done"
    assert row["metrics"]["privacy.epsilon"] == float("inf")
    assert row["duration_s"] >= 0 and row["version"]
    assert json.loads((store.run_dir(run_id) / "metrics.json").read_text())["utility.test_accuracy"] == 0.9
    assert store.get(run_id[:20])["run_id"] == run_id  # unique prefix


def test_failure_is_recorded(tmp_path):
    store = ResultStore(tmp_path)
    run_id = store.begin("a" * 16, {})
    store.fail(run_id, "boom")
    row = store.get(run_id)
    assert row["status"] == "failed" and row["error"] == "boom" and row["metrics"] == {}
    assert store.rows(status="done") == []


def test_done_needs_its_metrics_in_the_same_transaction(tmp_path, monkeypatch):
    """If writing the metrics fails, the row must not become done: it is recorded failed, and the error
    names the run and its log."""
    store = ResultStore(tmp_path)
    run_id = store.begin("b" * 16, {})

    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("dpeval.store.write_json_atomic", broken)
    with pytest.raises(RunFailure) as failure:
        store.finish(run_id, {"x": 1})
    message = str(failure.value)
    assert run_id in message and "No space left on device" in message and "recorded as failed" in message
    assert str(store.run_dir(run_id) / "log.txt") in message
    row = store.get(run_id)
    assert row["status"] == "failed" and "not recorded" in row["error"]


def test_status_constraint(tmp_path):
    store = ResultStore(tmp_path)
    run_id = store.begin("c" * 16, {})
    conn = sqlite3.connect(store.db_path)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE runs SET status='half' WHERE run_id=?", (run_id,))
    conn.close()


def test_empty_store_has_no_rows(tmp_path):
    assert ResultStore(tmp_path / "none").rows() == []
    assert not (tmp_path / "none").exists()


def old_store(root: Path) -> str:
    """A store as an earlier dpeval wrote it: the runs table without the host and pid columns, one done run."""
    root.mkdir(parents=True)
    conn = sqlite3.connect(root / "results.sqlite")
    conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, run_key TEXT NOT NULL, status TEXT NOT NULL CHECK "
                 "(status IN ('running', 'done', 'failed')), config_json TEXT NOT NULL, metrics_json TEXT, "
                 "error TEXT, version TEXT NOT NULL, started_at TEXT NOT NULL, finished_at TEXT, duration_s REAL)")
    metrics = {"run_id": "old-1", "run_key": "k" * 16, "status": "done", "dataset": "digits", "defense": "dpsgd",
               "attack": "none", "seed": 0, "utility.test_accuracy": 0.5, "privacy.epsilon": 3.0}
    conn.execute("INSERT INTO runs VALUES ('old-1', ?, 'done', '{}', ?, NULL, '0.1', '2025-01-01', NULL, 1.0)",
                 ("k" * 16, json.dumps(metrics)))
    conn.commit()
    conn.close()
    return "old-1"


def test_an_older_store_is_read_as_is_and_migrated_by_a_writer(tmp_path):
    results = tmp_path / "r"
    old_store(results)
    before = (results / "results.sqlite").read_bytes()
    board = CliRunner().invoke(main, ["leaderboard", "--results", str(results), "--json"])
    assert board.exit_code == 0 and json.loads(board.stdout)[0]["run_id"] == "old-1"
    assert (results / "results.sqlite").read_bytes() == before  # reading never migrates

    store = ResultStore(results)
    store.check(create=True)  # what run and sweep do first
    backup = sqlite3.connect(results / "results.sqlite.before-migration")
    assert {row[1] for row in backup.execute("PRAGMA table_info(runs)")} == {
        "run_id", "run_key", "status", "config_json", "metrics_json", "error", "version", "started_at",
        "finished_at", "duration_s"}  # the store as it was
    assert backup.execute("SELECT run_id FROM runs").fetchall() == [("old-1",)]
    backup.close()
    columns = {row[1] for row in sqlite3.connect(results / "results.sqlite").execute("PRAGMA table_info(runs)")}
    assert {"host", "pid"} <= columns
    run_id = store.begin("n" * 16, {})
    store.finish(run_id, {"x": 1})
    assert [r["status"] for r in store.rows()] == ["done", "done"] and store.get("old-1")["metrics"]["seed"] == 0


def test_a_store_of_another_shape_is_still_refused(tmp_path):
    results = tmp_path / "r"
    old_store(results)
    conn = sqlite3.connect(results / "results.sqlite")
    conn.execute("ALTER TABLE runs RENAME COLUMN error TO problem")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match="not a dpeval results store"):
        ResultStore(results).check(create=True)
    assert not (results / "results.sqlite.before-migration").exists()


def leave_hot_journal(results: Path) -> None:
    """A writer killed mid-transaction (``os._exit`` after changing every row, its pages spilled to the
    file): a hot journal stays beside the store."""
    code = ("import os, sqlite3, sys\n"
            "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "conn.execute('PRAGMA cache_size=1')\n"
            "conn.execute('BEGIN')\n"
            "conn.execute(\"UPDATE runs SET status='failed', error='half-written'\")\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(results / "results.sqlite")], check=True)
    assert (results / "results.sqlite-journal").stat().st_size > 0


def test_a_leftover_journal_is_rolled_back(tmp_path):
    results = tmp_path / "r"
    store = ResultStore(results)
    for i in range(40):  # enough pages that the interrupted write spills into the database file
        store.finish(store.begin(f"{i:016x}", {"pad": "x" * 2000}), {"pad": "y" * 2000})
    leave_hot_journal(results)
    result = CliRunner().invoke(main, ["leaderboard", "--results", str(results)])
    assert result.exit_code == 0, result.output
    assert "rolled back a write that was interrupted" in result.stderr and len(result.stderr.splitlines()) == 1
    assert {r["status"] for r in ResultStore(results).rows()} == {"done"}  # the last committed state


def test_a_leftover_journal_on_a_read_only_folder_is_explained(tmp_path, monkeypatch):
    results = tmp_path / "r"
    store = ResultStore(results)
    for i in range(40):
        store.finish(store.begin(f"{i:016x}", {"pad": "x" * 2000}), {"pad": "y" * 2000})
    leave_hot_journal(results)
    monkeypatch.setattr("dpeval.store.os.access", lambda path, mode: False)  # as for a read-only mount
    result = CliRunner().invoke(main, ["leaderboard", "--results", str(results)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "leftover journal" in result.stderr and "results.sqlite-journal" in result.stderr


def test_damaged_rows_are_left_out_with_one_note(tmp_path):
    store = ResultStore(tmp_path)
    ids = []
    for i in range(3):
        run_id = store.begin(f"{i:016x}", {"seed": i})
        store.finish(run_id, {"run_id": run_id, "run_key": f"{i:016x}", "status": "done", "seed": i,
                              "utility.test_accuracy": 0.9, "privacy.epsilon": 3.0})
        ids.append(run_id)
    conn = sqlite3.connect(store.db_path)
    conn.execute("UPDATE runs SET metrics_json='{\"cut\": ' WHERE run_id=?", (ids[0],))
    conn.execute("UPDATE runs SET metrics_json='[1, 2]' WHERE run_id=?", (ids[1],))
    conn.commit()
    conn.close()
    board = CliRunner().invoke(main, ["leaderboard", "--results", str(tmp_path), "--json"])
    assert board.exit_code == 0, board.output
    assert [r["run_id"] for r in json.loads(board.stdout)] == [ids[2]]
    (note,) = board.stderr.splitlines()
    assert "left out 2 run(s)" in note and ids[0] in note and ids[1] in note
    shown = CliRunner().invoke(main, ["show", ids[0], "--results", str(tmp_path)])
    assert shown.exit_code == 0 and "damaged: metrics_json not a JSON object" in shown.stdout
    assert "Traceback" not in shown.output


def test_a_taken_run_id_is_drawn_again(tmp_path, monkeypatch):
    """Runs whose keys share their 8-character prefix, begun in one second, may draw the same random suffix:
    the second draw of a taken id (as a row, or as a folder left by a crash) is replaced, not an error."""
    draws = iter(["abcd", "abcd", "abcd", "ef01", "2345", "2345", "6789"])
    monkeypatch.setattr("dpeval.store.secrets.token_hex", lambda n: next(draws))
    monkeypatch.setattr("dpeval.store.datetime", _FrozenClock)
    store = ResultStore(tmp_path)
    first = store.begin("0" * 16, {"i": 0})
    second = store.begin("0" * 16, {"i": 1})  # draws abcd twice (taken), then ef01
    (tmp_path / "runs" / f"{_FrozenClock.STAMP}-00000000-2345").mkdir()  # a folder with no row
    third = store.begin("0" * 16, {"i": 2})  # 2345 twice (folder exists), then 6789
    assert [first, second, third] == [f"{_FrozenClock.STAMP}-00000000-{s}" for s in ("abcd", "ef01", "6789")]
    rows = {r["run_id"]: r["status"] for r in store.rows()}
    assert rows == {first: "running", second: "running", third: "running"}


def test_many_runs_of_one_key_prefix_in_one_second_all_record(tmp_path):
    """The case that failed in CI: 300 runs with keys sharing the prefix, begun as fast as the store allows."""
    store = ResultStore(tmp_path)
    ids = [store.begin(f"{i:016x}", {"i": i}) for i in range(300)]
    assert len(set(ids)) == 300 and len(store.rows()) == 300


class _FrozenClock:
    STAMP = "20261125-000000"

    @staticmethod
    def now(tz):  # the store's only use of datetime in begin()
        from datetime import datetime
        return datetime(2026, 11, 25, tzinfo=tz)


def _writer(root: str, n: int) -> None:
    store = ResultStore(root)
    for i in range(n):
        store.finish(store.begin(secrets.token_hex(8), {"i": i}), {"i": i})


def test_writers_wait_for_a_long_held_reader(tmp_path):
    """N writer processes while a reader holds a read transaction for several seconds (shorter than the
    lock wait): every writer's rows end up done, none is lost or left running."""
    ResultStore(tmp_path).begin("0" * 16, {})  # the database exists
    reader = sqlite3.connect(tmp_path / "results.sqlite", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM runs").fetchone()  # holds a shared lock until COMMIT
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(str(tmp_path), 5)) for _ in range(4)]
    for w in writers:
        w.start()
    time.sleep(4)
    assert ResultStore(tmp_path).rows(status="done") == []  # nothing could commit past the reader
    reader.execute("COMMIT")
    reader.close()
    for w in writers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert len(ResultStore(tmp_path).rows(status="done")) == 20


def test_a_verdict_round_trips_through_the_store(tmp_path):
    """The stored text is the verdict's value; read back (SQLite row and metrics.json), it parses to the same
    Verdict."""
    from dpeval.core.verdicts import Verdict

    store = ResultStore(tmp_path)
    for verdict in Verdict:
        run_id = store.begin(verdict.name.lower().ljust(16, "k"), {})
        store.finish(run_id, {"leakage.ig.verdict": verdict, "leakage.lira.verdict": verdict.value})
        stored = store.get(run_id)["metrics"]
        on_disk = json.loads((store.run_dir(run_id) / "metrics.json").read_text())
        for metrics in (stored, on_disk):
            assert metrics["leakage.ig.verdict"] == metrics["leakage.lira.verdict"] == verdict.value
            stored_text = metrics["leakage.ig.verdict"]
            assert type(stored_text) is str and Verdict.parse(stored_text) is verdict
