"""The results store: SQLite at ``<results>/results.sqlite`` plus artefacts under ``<results>/runs/<run_id>/``.

One row per run: config JSON, metrics JSON, status (``running`` → ``done`` | ``failed``), timings, dpeval
version. A row becomes ``done`` only in the same transaction that stores its metrics, and only after the
artefacts were written; a run killed mid-way stays ``running`` (or ``failed`` when the process could still
record the error), never a half-written ``done``. ``running`` rows whose process on this host is gone are
marked ``failed`` by the next ``run``, ``sweep`` or ``show`` on the folder (``fail_stale``).

The store is never repaired or overwritten behind the user's back: ``check`` refuses a results location
that is not a folder, cannot be written (for commands that record runs), or holds a ``results.sqlite``
that is damaged or not a dpeval store, with one message saying what is wrong and how to recover. Commands
that only read (leaderboard, report, show) open the database read-only.
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
from harness.core.errors import ConfigError, RunFailure

STORE_FILE = "results.sqlite"
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
COLUMNS = {"run_id", "run_key", "status", "config_json", "metrics_json", "error", "version", "started_at",
           "finished_at", "duration_s", "host", "pid"}
STALE_ERROR = "interrupted: its process is gone"


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


def _damaged(exc: sqlite3.Error) -> bool:
    """SQLite's own words for a file that is not (or no longer) a sound database."""
    return type(exc) is sqlite3.DatabaseError or "malformed" in str(exc) or "not a database" in str(exc)


class ResultStore:
    def __init__(self, root: str | Path) -> None:
        if not str(root).strip():
            raise ConfigError("--results: empty path; name a results folder (default ./dpeval-results)")
        self.root = Path(root)
        self.db_path = self.root / STORE_FILE
        self._t0: dict[str, float] = {}

    # -- checks -------------------------------------------------------------------------------------------------
    def problem(self, exc: sqlite3.Error) -> str:
        """One line: what is wrong with the database file and how to recover (no repair is attempted)."""
        said = " ".join(str(exc).split())  # SQLite's integrity report spans lines
        if _damaged(exc):
            return (f"{self.db_path} is damaged or not a database ({said}); dpeval leaves it untouched: move it "
                    f"aside (mv {self.db_path} {self.db_path}.broken) to start a new store in {self.root}, or "
                    "restore it from a backup")
        return f"cannot use {self.db_path}: {said}"

    def check(self, create: bool) -> None:
        """Refuse an unusable results location before anything is written (ConfigError naming ``--results``).

        ``create``: the command records runs, so the folder may be missing but must be creatable and
        writable. Otherwise (leaderboard, report, show) the folder must exist and hold a store. In both cases
        an existing ``results.sqlite`` must pass SQLite's integrity check and be a dpeval store."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise ConfigError(f"--results: {root} is a file, not a results folder")
        if not root.exists():
            if not create:
                raise ConfigError(f"--results: no results folder {root}; run `dpeval run` or `dpeval sweep` "
                                  "there first, or name the folder that holds results.sqlite")
            ancestor = next(p for p in root.absolute().parents if p.exists())
            if not ancestor.is_dir():
                raise ConfigError(f"--results: cannot create {root}: {ancestor} is a file, not a folder")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise ConfigError(f"--results: cannot create {root}: {ancestor} is not writable")
            return
        if create and not os.access(root, os.W_OK | os.X_OK):
            raise ConfigError(f"--results: {root} is not writable")
        if not self.db_path.exists():
            if not create:
                raise ConfigError(f"--results: {root} holds no results store ({STORE_FILE}); run `dpeval run` or "
                                  "`dpeval sweep` there first")
            return
        if not self.db_path.is_file():
            raise ConfigError(f"--results: {self.db_path} is not a file; move it aside")
        if create and not os.access(self.db_path, os.W_OK):
            raise ConfigError(f"--results: {self.db_path} is not writable")
        try:
            with self._read() as conn:
                (verdict,) = conn.execute("PRAGMA quick_check(1)").fetchone()
                if verdict != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed: {verdict}")
                tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        except sqlite3.Error as exc:
            raise ConfigError(f"--results: {self.problem(exc)}") from None
        if tables and not COLUMNS <= columns:
            raise ConfigError(f"--results: {self.db_path} is an SQLite database but not a dpeval results store "
                              f"(no runs table with {', '.join(sorted(COLUMNS))}); dpeval leaves it untouched: "
                              "name another --results folder or move the file aside")

    # -- connections --------------------------------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A read-write connection in one transaction (committed on success, rolled back on any exception)."""
        try:
            conn = sqlite3.connect(self.db_path, timeout=30)
        except sqlite3.Error as exc:
            raise RunFailure(self.problem(exc)) from None
        try:
            try:
                conn.executescript(SCHEMA)
            except sqlite3.Error as exc:
                raise RunFailure(self.problem(exc)) from None
            with conn:
                yield conn
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise RunFailure(self.problem(exc)) from None
        finally:
            conn.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read-only connection: reading never creates, migrates or rewrites the database."""
        conn = sqlite3.connect(f"{self.db_path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            yield conn
        finally:
            conn.close()

    def _query(self, sql: str, args: tuple = (), as_dict: bool = False) -> list[Any]:
        """Rows of a read-only query; no database (or an empty one) reads as no rows."""
        if not self.db_path.exists():
            return []
        try:
            with self._read() as conn:
                if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='runs'").fetchone():
                    return []
                if as_dict:
                    conn.row_factory = sqlite3.Row
                return [dict(r) if as_dict else r for r in conn.execute(sql, args)]
        except sqlite3.Error as exc:
            raise RunFailure(self.problem(exc)) from None

    # -- recording ----------------------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def begin(self, run_key: str, config: dict[str, Any]) -> str:
        """Record a new ``running`` row and create its artefact folder; returns the run id. When the row
        cannot be recorded, the folders this call created are removed again."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-{run_key[:8]}-{secrets.token_hex(2)}"
        run_dir = self.run_dir(run_id)
        created = [p for p in (self.root, run_dir.parent, run_dir) if not p.exists()]
        try:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--results: cannot create {exc.filename or run_dir}: "
                                  f"{exc.strerror or exc}") from None
            with self._connect() as conn:
                conn.execute(
                    "INSERT INTO runs (run_id, run_key, status, config_json, version, started_at, host, pid) "
                    "VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                    (run_id, run_key, json.dumps(config, sort_keys=True, default=str), __version__, _now(),
                     socket.gethostname(), os.getpid()),
                )
        except BaseException:
            for path in reversed(created):
                try:
                    path.rmdir()
                except OSError:
                    pass
            raise
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

    def fail_stale(self) -> int:
        """Mark ``running`` rows whose recording process on this host is gone (killed, crashed, power loss)
        as ``failed``; returns how many. Rows of live processes and of other hosts are left alone, and a store
        without such rows is not written at all."""
        host = socket.gethostname()
        stale = [run_id for run_id, pid in self._query(
            "SELECT run_id, pid FROM runs WHERE status='running' AND host=?", (host,)) if not _alive(pid)]
        if stale:
            with self._connect() as conn:
                conn.executemany("UPDATE runs SET status='failed', error=?, finished_at=? "
                                 "WHERE run_id=? AND status='running'", [(STALE_ERROR, _now(), r) for r in stale])
        return len(stale)

    # -- reading ------------------------------------------------------------------------------------------------
    def status(self, run_id: str) -> str | None:
        rows = self._query("SELECT status FROM runs WHERE run_id=?", (run_id,))
        return rows[0][0] if rows else None

    def done_keys(self) -> set[str]:
        """Run keys that already have a ``done`` row (what a resumed sweep skips)."""
        return {key for (key,) in self._query("SELECT DISTINCT run_key FROM runs WHERE status='done'")}

    def rows(self, status: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT * FROM runs" + (" WHERE status=?" if status else "") + " ORDER BY started_at, run_id"
        return [self._decode(r) for r in self._query(query, (status,) if status else (), as_dict=True)]

    def matching(self, run_id: str) -> list[dict[str, Any]]:
        """The row whose id is ``run_id``, else every row whose id contains it (none for an empty string)."""
        if not run_id:
            return []
        matches = [r for r in self.rows() if run_id in r["run_id"]]
        exact = [r for r in matches if r["run_id"] == run_id]
        return exact or matches

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The row whose id is ``run_id`` or contains it (a unique part is enough)."""
        matches = self.matching(run_id)
        return matches[0] if len(matches) == 1 else None

    @staticmethod
    def _decode(row: dict[str, Any]) -> dict[str, Any]:
        row["config"] = json.loads(row.pop("config_json"))
        metrics = row.pop("metrics_json")
        row["metrics"] = json.loads(metrics) if metrics else {}
        return row
