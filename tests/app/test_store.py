"""Results store: transactional status transitions and artefacts."""

import json
import sqlite3

import pytest

from harness.store import ResultStore


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
    """If writing the metrics fails, the row must not become done."""
    store = ResultStore(tmp_path)
    run_id = store.begin("b" * 16, {})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("harness.store.write_json_atomic", broken)
    with pytest.raises(OSError):
        store.finish(run_id, {"x": 1})
    assert store.get(run_id)["status"] == "running"


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
