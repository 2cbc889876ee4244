"""The results store: SQLite at ``<results>/results.sqlite`` plus artefacts under ``<results>/runs/<run_id>/``.

One row per run: config JSON, metrics JSON, status (``running`` → ``done`` | ``failed``), timings, dpeval
version. A row becomes ``done`` only in the same transaction that stores its metrics, and only after the
artefacts were written; a run killed mid-way stays ``running`` (or ``failed`` when the process could still
record the error), never a half-written ``done``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from harness import __version__

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    run_key      TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed')),
    config_json  TEXT NOT NULL,
    metrics_json TEXT,
    error        TEXT,
    version      TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    duration_s   REAL,
    host         TEXT,
    pid          INTEGER
);
CREATE INDEX IF NOT EXISTS runs_by_key ON runs (run_key, status);
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temporary file + rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class ResultStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.db_path = self.root / "results.sqlite"
        self._t0: dict[str, float] = {}

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.root.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.db_path, timeout=30)
        try:
            conn.executescript(SCHEMA)
            with conn:  # one transaction: committed on success, rolled back on any exception
                yield conn
        finally:
            conn.close()

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def begin(self, run_key: str, config: dict[str, Any]) -> str:
        """Record a new ``running`` row and create its artefact folder; returns the run id."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-{run_key[:8]}-{secrets.token_hex(2)}"
        self.run_dir(run_id).mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, run_key, status, config_json, version, started_at, host, pid) "
                "VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, run_key, json.dumps(config, sort_keys=True, default=str), __version__, _now(),
                 socket.gethostname(), os.getpid()),
            )
        self._t0[run_id] = time.perf_counter()
        return run_id

    def finish(self, run_id: str, metrics: dict[str, Any]) -> None:
        write_json_atomic(self.run_dir(run_id) / "metrics.json", metrics)
        duration = time.perf_counter() - self._t0.pop(run_id, time.perf_counter())
        with self._connect() as conn:
            conn.execute(
                "UPDATE runs SET status='done', metrics_json=?, finished_at=?, duration_s=? WHERE run_id=?",
                (json.dumps(metrics, sort_keys=True, default=str), _now(), duration, run_id),
            )

    def fail(self, run_id: str, error: str) -> None:
        duration = time.perf_counter() - self._t0.pop(run_id, time.perf_counter())
        with self._connect() as conn:
            conn.execute(
                "UPDATE runs SET status='failed', error=?, finished_at=?, duration_s=? WHERE run_id=?",
                (error, _now(), duration, run_id),
            )

    def status(self, run_id: str) -> str | None:
        with self._connect() as conn:
            row = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return row[0] if row else None

    def done_keys(self) -> set[str]:
        """Run keys that already have a ``done`` row (what a resumed sweep skips)."""
        if not self.db_path.exists():
            return set()
        with self._connect() as conn:
            return {key for (key,) in conn.execute("SELECT DISTINCT run_key FROM runs WHERE status='done'")}

    def fail_stale(self) -> int:
        """Mark ``running`` rows whose recording process on this host is gone (killed, crashed, power loss)
        as ``failed``; returns how many. Rows of live processes and of other hosts are left alone."""
        if not self.db_path.exists():
            return 0
        host = socket.gethostname()
        with self._connect() as conn:
            stale = [run_id for run_id, pid in conn.execute(
                "SELECT run_id, pid FROM runs WHERE status='running' AND host=?", (host,)) if not _alive(pid)]
            conn.executemany("UPDATE runs SET status='failed', error='interrupted: its process is gone', "
                             "finished_at=? WHERE run_id=?", [(_now(), r) for r in stale])
        return len(stale)

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        if not self.db_path.exists():
            return []
        query = "SELECT * FROM runs" + (" WHERE status=?" if status else "") + " ORDER BY started_at, run_id"
        with self._connect() as conn:
            conn.row_factory = sqlite3.Row
            return [self._decode(dict(r)) for r in conn.execute(query, (status,) if status else ())]

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The row whose id is ``run_id`` or starts with it (a unique prefix is enough)."""
        matches = [r for r in self.rows() if r["run_id"].startswith(run_id)]
        exact = [r for r in matches if r["run_id"] == run_id]
        if exact:
            return exact[0]
        return matches[0] if len(matches) == 1 else None

    @staticmethod
    def _decode(row: dict[str, Any]) -> dict[str, Any]:
        row["config"] = json.loads(row.pop("config_json"))
        metrics = row.pop("metrics_json")
        row["metrics"] = json.loads(metrics) if metrics else {}
        return row
