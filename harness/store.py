"""The results store: SQLite at ``<results>/results.sqlite`` plus artefacts under ``<results>/runs/<run_id>/``.

One row per run: config JSON, metrics JSON, status (``running`` → ``done`` | ``failed``), timings, dpeval
version. A row becomes ``done`` only in the same transaction that stores its metrics, and only after the
artefacts were written; a run killed mid-way stays ``running`` (or ``failed`` when the process could still
record the error), never a half-written ``done``. A row's ``pid`` is the process running it: the one that
recorded it, or the sweep worker that took it over (``claim``). ``running`` rows whose process on this host
is gone are marked ``failed`` by the next ``run``, ``sweep`` or ``show`` on the folder (``fail_stale``). Every
update of a run's row checks that it changed that row: resuming claims an interrupted row (one of two processes
wins), a failure is recorded on a ``running`` row only, and a store moved or deleted while a command runs is
never created again by it (the run fails loudly instead of being recorded nowhere).

The store is never repaired or overwritten behind the user's back: ``check`` refuses a results location
that is not a folder, cannot be written (for commands that record runs), or holds a ``results.sqlite``
that is damaged or not a dpeval store, with one message saying what is wrong and how to recover. Commands
that only read (leaderboard, report, show) open the database read-only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from dpeval import __version__
from dpeval.core import files
from dpeval.core.errors import ConfigError, RunFailure, brief, printable
from dpeval.core.processes import alive
from dpeval.core.result_keys import VERDICT, AttackKey
from dpeval.core.verdicts import Verdict
from dpeval.results import RunResult

STORE_FILE = "results.sqlite"
LOCK_FILE = ".sweep.lock"
CHECKPOINT_FILE = "checkpoint.pt"  # in a run's folder (harness/checkpoint.py)
JOURNAL_FILE = STORE_FILE + "-journal"
# The store's own files: no output option may name one (nor anything under runs/).
STORE_FILES = (STORE_FILE, JOURNAL_FILE, STORE_FILE + "-wal", STORE_FILE + "-shm", LOCK_FILE)
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
# Columns added since the first store: a store that lacks only these is migrated in place (ALTER TABLE ADD).
ADDED_COLUMNS = {"host": "TEXT", "pid": "INTEGER"}
STALE_ERROR = "interrupted: its process is gone"
# How the errors of interrupted runs begin (Ctrl-C, SIGTERM / SIGHUP, a process found gone): such a run
# resumes from its checkpoint.
INTERRUPTED = ("interrupted", "terminated by ")
_ID_ATTEMPTS = 64  # fresh suffixes drawn before begin() gives up (65,536 exist per key prefix and second)
LOCK_WAIT_S = 30.0  # how long a command waits for another process's lock on the database
log = logging.getLogger("dpeval")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: Any) -> None:
    files.write_json_atomic(path, data, indent=2, sort_keys=True)


class NotRunning(RunFailure):
    """A run's row is not ``running`` any more (another process finished or failed it) or is gone."""


class StoreGone(RunFailure):
    """The database a command has used is gone (moved aside or deleted while the command ran)."""


def _reason(exc: BaseException) -> str:
    """An error in a few words: an OSError's own (``No space left on device``), else its message."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


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
        self._seen = False  # this object has used the database: it never creates another one in its place

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
        try:
            self._check(create)
        except OSError as exc:  # a path the system refuses to look up (too long, a loop of links)
            raise ConfigError(f"--results: cannot use {printable(self.root, 200)}: {exc.strerror or exc}") from None

    def _check(self, create: bool) -> None:
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
        if create:
            self._refuse_linked_parts()
        if not self.db_path.exists():
            if not create:
                raise ConfigError(f"--results: {root} holds no results store ({STORE_FILE}); run `dpeval run` or "
                                  "`dpeval sweep` there first")
            return
        if not self.db_path.is_file():
            raise ConfigError(f"--results: {self.db_path} is not a file; move it aside")
        if create and not os.access(self.db_path, os.W_OK):
            raise ConfigError(f"--results: {self.db_path} is not writable")
        self._seen = True
        self._recover_journal()
        try:
            with self._read() as conn:
                (verdict,) = conn.execute("PRAGMA quick_check(1)").fetchone()
                if verdict != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed: {verdict}")
                tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        except sqlite3.Error as exc:
            raise ConfigError(f"--results: {self.problem(exc)}") from None
        missing = COLUMNS - columns if tables else set()
        if missing and not missing <= set(ADDED_COLUMNS):
            raise ConfigError(f"--results: {self.db_path} is an SQLite database but not a dpeval results store "
                              f"(no runs table with {', '.join(sorted(COLUMNS))}); dpeval leaves it untouched: "
                              "name another --results folder or move the file aside")
        if missing and create:
            self._migrate(sorted(missing))

    def _refuse_linked_parts(self) -> None:
        """A command that records runs never writes through a link at the store's database (or its journal) or at
        ``runs/``: the rows or the run folders would land wherever it points, outside this results folder; nor
        into a FIFO, a device or a folder where the database's files go, or a file where ``runs/`` goes."""
        for name in (*STORE_FILES, "runs"):
            path = self.root / name
            if name != LOCK_FILE and path.is_symlink():
                raise ConfigError(f"--results: {printable(path, 200)} is a symbolic link; dpeval never records runs "
                                  f"through one: replace it with the real {'folder' if name == 'runs' else 'file'} "
                                  f"or name another --results folder")
            kind = files.special_kind(path)
            if (name not in (LOCK_FILE, "runs") and kind is not None) or (name == "runs" and path.is_file()):
                raise ConfigError(f"--results: {printable(path, 200)} is {kind or 'a file'}, where the store keeps "
                                  f"its {'run folders' if name == 'runs' else 'database'}: move it aside")

    def _recover_journal(self) -> None:
        """A ``-journal`` left by a writer that crashed mid-transaction: SQLite rolls it back the first time
        the store is opened for writing. A read-only open cannot, so open it once read-write here; where
        the folder is not writable, say so in one line."""
        journal = self.root / JOURNAL_FILE
        if not journal.is_file() or journal.stat().st_size == 0:
            return
        if not os.access(self.root, os.W_OK | os.X_OK) or not os.access(self.db_path, os.W_OK):
            raise ConfigError(f"--results: {self.db_path} has a leftover journal ({journal}) from a write that "
                              f"was interrupted; it needs write access to {self.root} once to roll it back "
                              "(any dpeval command there does it)")
        try:
            with contextlib.closing(sqlite3.connect(self.db_path, timeout=LOCK_WAIT_S)) as conn:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reading rolls a hot journal back
        except sqlite3.Error as exc:
            raise ConfigError(f"--results: {self.problem(exc)}") from None
        if not journal.exists() or journal.stat().st_size == 0:
            log.warning("%s: rolled back a write that was interrupted (its leftover journal)", self.db_path)

    def _migrate(self, missing: list[str]) -> None:
        """Add the columns a store written by an earlier dpeval lacks, after a backup copy beside it."""
        backup = self.db_path.with_name(f"{STORE_FILE}.before-migration")
        n = 1
        while backup.exists():
            n += 1
            backup = self.db_path.with_name(f"{STORE_FILE}.before-migration.{n}")
        try:
            with contextlib.closing(sqlite3.connect(self.db_path, timeout=LOCK_WAIT_S)) as conn, \
                    contextlib.closing(sqlite3.connect(backup)) as copy:
                conn.backup(copy)
                with conn:
                    for column in missing:
                        conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {ADDED_COLUMNS[column]}")
        except sqlite3.Error as exc:
            raise ConfigError(f"--results: cannot migrate {self.db_path} (adding {', '.join(missing)}): "
                              f"{' '.join(str(exc).split())}; the store is unchanged") from None
        log.warning("%s: written by an earlier dpeval; added the column(s) %s (backup: %s)", self.db_path,
                    ", ".join(missing), backup)

    def refuse_output(self, out: str | Path, option: str, ours: Callable[[Path], bool] | None = None) -> None:
        """Refuse (ConfigError naming ``option``) to write an output file — ``--out`` or a file a command writes
        beside it — that is one of the store's own files (the database, its journal, the sweep lock, also
        through a link) or lies inside a run's folder: writing there would destroy results; that is a symbolic
        link: dpeval never writes through one; that is a device, a FIFO, a socket or a folder (never replaced);
        or, given ``ours``, that exists but is not a file ``ours`` recognises as the command's own earlier output."""
        path = Path(out)
        try:
            target = path.resolve()
            root = self.root.resolve()
            own = any(target == root / name or (target.exists() and (root / name).exists()
                                               and os.path.samefile(target, root / name)) for name in STORE_FILES)
            link = path.is_symlink()
            foreign = ours is not None and path.exists() and not ours(path)
        except OSError as exc:  # a path the system refuses to look up (too long, a loop of links)
            raise ConfigError(f"{option}: cannot write {printable(out, 200)}: {exc.strerror or exc}") from None
        if own or target.is_relative_to(root / "runs"):
            raise ConfigError(f"{option}: {out} is part of the results store in {self.root}; dpeval never "
                              f"writes over it: name a file elsewhere (e.g. {self.root / 'report.html'})")
        if link:
            raise ConfigError(f"{option}: {out} is a symbolic link; dpeval never writes through one: remove it "
                              f"or name another file")
        files.refuse_special(path, option)  # a device or a FIFO is never replaced by a file
        if foreign:
            raise ConfigError(f"{option}: {out} exists and is not an earlier output of this command; dpeval "
                              f"leaves it as it is: move it aside or name another file")

    def write_outputs(self, outputs: dict[Path, bytes], option: str,
                      ours: Callable[[Path], bool] | None = None) -> None:
        """Write a command's output files (``--out`` and what it writes beside it): every one checked first
        (``refuse_output``), so that a refused one leaves nothing written; each through a new temporary file
        renamed over its path, so a link that appears there meanwhile is replaced, never written through, and a
        reader never sees half a file."""
        for path in outputs:
            self.refuse_output(path, option, ours)
        for path, data in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(path, lambda f, data=data: f.write(data))

    # -- connections --------------------------------------------------------------------------------------------
    @contextmanager
    def _connect(self, create: bool = False) -> Iterator[sqlite3.Connection]:
        """A read-write connection in one transaction (committed on success, rolled back on any exception).

        Only ``create`` (recording a new run) may create the database, and only where this object has not used
        one yet: a store moved aside or deleted while a command runs is never replaced by an empty one, in
        which that command's runs would be recorded nowhere anyone looks (StoreGone)."""
        if not self.db_path.is_file() and (self._seen or not create):
            raise StoreGone(f"{self.db_path} is gone: moved or deleted while this command ran; dpeval does not "
                            f"start a new store in its place (the runs' files are under {self.root / 'runs'})")
        try:
            if create:
                conn = sqlite3.connect(self.db_path, timeout=LOCK_WAIT_S)
            else:  # mode=rw: the file must exist, also if it disappears right now
                conn = sqlite3.connect(f"{self.db_path.absolute().as_uri()}?mode=rw", uri=True, timeout=LOCK_WAIT_S)
        except sqlite3.Error as exc:
            raise RunFailure(self.problem(exc)) from None
        self._seen = True
        try:
            try:
                if create:
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
        conn = sqlite3.connect(f"{self.db_path.absolute().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
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
        """``runs/<run_id>`` of this store; ConfigError naming the store when the (stored) id is not a plain name:
        a tampered row's ``../../x`` never leads outside ``runs/``."""
        return files.inside(self.root / "runs", run_id, f"--results: {self.db_path}: the stored run id")

    @classmethod
    def of_run(cls, run_dir: str | Path) -> ResultStore:
        """The store that ``run_dir`` (``run_dir(run_id)`` of it) belongs to."""
        return cls(Path(run_dir).parent.parent)

    def begin(self, run_key: str, config: dict[str, Any]) -> str:
        """Record a new ``running`` row and create its artefact folder; returns the run id. When the row
        cannot be recorded, the folders this call created are removed again.

        The id is ``<UTC second>-<run key prefix>-<4 random hex>``. Runs whose keys share that prefix, begun in
        one second, can draw the same suffix (a sweep of hundreds does, now and then), so an id already taken,
        as a row or as a folder, is drawn again rather than failing the run."""
        for _ in range(_ID_ATTEMPTS):
            run_id = self._fresh_id(run_key)
            if self._insert_running(run_id, run_key, config):
                break
        else:
            raise RunFailure(f"--results: no free run id for key {run_key[:8]} after {_ID_ATTEMPTS} draws; "
                             f"the store under {self.root} holds an implausible number of runs this second")
        self._t0[run_id] = time.perf_counter()
        return run_id

    def _fresh_id(self, run_key: str) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{run_key[:8]}-{secrets.token_hex(2)}"

    def _insert_running(self, run_id: str, run_key: str, config: dict[str, Any]) -> bool:
        """Create the run's folder and its ``running`` row; False (and nothing left behind) when the id is
        taken. Other failures remove the folders this call created and raise."""
        run_dir = self.run_dir(run_id)
        if run_dir.exists():
            return False
        created = [p for p in (self.root, run_dir.parent, run_dir) if not p.exists()]
        try:
            try:
                run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--results: cannot create {exc.filename or run_dir}: "
                                  f"{exc.strerror or exc}") from None
            with self._connect(create=True) as conn:
                conn.execute(
                    "INSERT INTO runs (run_id, run_key, status, config_json, version, started_at, host, pid) "
                    "VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                    (run_id, run_key, json.dumps(config, sort_keys=True, default=str), __version__, _now(),
                     socket.gethostname(), os.getpid()),
                )
            return True
        except BaseException as exc:
            for path in reversed(created):
                try:
                    path.rmdir()
                except OSError:
                    pass
            if isinstance(exc, sqlite3.IntegrityError) and "run_id" in str(exc):
                return False
            raise

    def finish(self, run_id: str, metrics: dict[str, Any]) -> None:
        """``metrics.json``, then the row ``done`` with its metrics. When either cannot be written (a full
        disk, a lock held past ``LOCK_WAIT_S``), RunFailure naming the run, its log and what was kept."""
        metrics_file = self.run_dir(run_id) / "metrics.json"
        duration = time.perf_counter() - self._t0.get(run_id, time.perf_counter())
        try:
            write_json_atomic(metrics_file, metrics)
            if not self._update_row("UPDATE runs SET status='done', metrics_json=?, finished_at=?, duration_s=? "
                                    "WHERE run_id=? AND status='running'",
                                    (json.dumps(metrics, sort_keys=True, default=str), _now(), duration, run_id)):
                raise NotRunning(self._whereabouts(run_id))
        except (OSError, RunFailure) as exc:
            if isinstance(exc, NotRunning):  # gone or another process's: nothing to mark failed
                said = f": {exc}"
            else:
                reason = _reason(exc)
                unrecorded = self.record_failure(run_id, f"finished but not recorded: {reason}")
                said = f" ({reason}); {unrecorded or 'recorded as failed'}"
            raise RunFailure(f"run {run_id} finished but its result could not be recorded{said}; "
                             f"{f'metrics: {metrics_file}; ' if metrics_file.is_file() else ''}"
                             f"log: {self.run_dir(run_id) / 'log.txt'}") from None
        self._t0.pop(run_id, None)

    def record_failure(self, run_id: str, error: str, metrics: dict[str, Any] | None = None) -> str | None:
        """``fail`` for a run that is failing already, never raising: a second error (the same full disk, a
        locked store) must not hide the run's own. None when recorded, else a clause saying what became of
        its row, for the caller's one line."""
        try:
            self.fail(run_id, error, metrics)
        except NotRunning as exc:
            return f"not recorded as failed: {exc}"
        except (OSError, RunFailure) as exc:
            return (f"not recorded as failed ({_reason(exc)}): its row stays `running` until the next dpeval "
                    "run, sweep or show on the folder marks it failed")
        return None

    def fail(self, run_id: str, error: str, metrics: dict[str, Any] | None = None) -> None:
        """The ``running`` row ``failed`` with ``error``; with ``metrics`` (what finished, e.g. training and the
        attacks that did not fail) also ``metrics.json`` and the row's metrics, so nothing finished is lost.
        NotRunning when the row is not ``running`` (any more): a row another process finished stays as it is."""
        duration = time.perf_counter() - self._t0.pop(run_id, time.perf_counter())
        if metrics is not None:
            write_json_atomic(self.run_dir(run_id) / "metrics.json", metrics)
        if not self._update_row("UPDATE runs SET status='failed', error=?, metrics_json=?, finished_at=?, "
                                "duration_s=? WHERE run_id=? AND status='running'",
                                (error, None if metrics is None else json.dumps(metrics, sort_keys=True, default=str),
                                 _now(), duration, run_id)):
            raise NotRunning(self._whereabouts(run_id))

    def _update_row(self, sql: str, args: tuple) -> bool:
        """Whether the UPDATE ``sql`` changed its one row; False too when the store is gone (never created
        again for an update)."""
        try:
            with self._connect() as conn:
                return conn.execute(sql, args).rowcount == 1
        except StoreGone:
            return False

    def _whereabouts(self, run_id: str) -> str:
        """Why a run's row is not this process's to update (any more), in one clause."""
        rows = self._query("SELECT status, host, pid FROM runs WHERE run_id=?", (run_id,))
        if not rows:
            return (f"{self.db_path} no longer holds run {run_id} (the store was moved or deleted while the run "
                    f"was going on); its files are in {self.run_dir(run_id)}")
        status, host, pid = rows[0]
        if status == "running":
            return f"run {run_id} is already being resumed by process {pid} on {host}"
        if status == "done":
            return f"run {run_id} was resumed and finished by another process (dpeval show {run_id})"
        return f"run {run_id} was recorded failed by another process (dpeval show {run_id})"

    def interrupted(self, run_key: str) -> str | None:
        """The id of the latest run of ``run_key`` when that run was interrupted (not failed by an error,
        not done); else None."""
        rows = self._query("SELECT run_id, status, error FROM runs WHERE run_key=? ORDER BY started_at DESC, "
                           "rowid DESC LIMIT 1", (run_key,))
        if rows and rows[0][1] == "failed" and str(rows[0][2] or "").startswith(INTERRUPTED):
            return rows[0][0]
        return None

    def resumable(self, run_key: str) -> str | None:
        """The id of the latest run of ``run_key`` when it was interrupted and left a checkpoint. Its folder is
        written into again, so a link anywhere in it is refused (ConfigError): writes would land elsewhere."""
        run_id = self.interrupted(run_key)
        if not run_id or not (self.run_dir(run_id) / CHECKPOINT_FILE).is_file():
            return None
        files.refuse_links(self.run_dir(run_id))
        return run_id

    def resume(self, run_id: str) -> None:
        """Claim an interrupted run as ``running`` again, by this process. Two processes may both have read it
        as interrupted: only the one whose update still finds it ``failed`` goes on; the other is refused
        (ConfigError) before it writes anything."""
        if not self._update_row("UPDATE runs SET status='running', error=NULL, finished_at=NULL, duration_s=NULL, "
                                "host=?, pid=? WHERE run_id=? AND status='failed'",
                                (socket.gethostname(), os.getpid(), run_id)):
            raise ConfigError(f"{self._whereabouts(run_id)}; nothing was done")
        self._t0[run_id] = time.perf_counter()

    def claim(self, run_id: str, recorder: int) -> bool:
        """Record this process as the one running ``run_id`` in place of ``recorder``, the sweep driver that
        recorded it (a worker starting the point), so that the row stays alive while this process runs it,
        whatever becomes of the driver. False when the row is no longer that driver's ``running`` row (the
        driver is gone and a later command reaped or resumed it): the run is then not this process's."""
        with self._connect() as conn:
            claimed = conn.execute("UPDATE runs SET pid=? WHERE run_id=? AND status='running' AND pid=?",
                                   (os.getpid(), run_id, recorder)).rowcount
        return claimed == 1

    def abandon(self, run_id: str, error: str) -> None:
        """Mark ``run_id`` ``failed`` with ``error`` if it is still this process's ``running`` row (a sweep
        worker whose driver is gone, stopping)."""
        with self._connect() as conn:
            conn.execute("UPDATE runs SET status='failed', error=?, finished_at=? "
                         "WHERE run_id=? AND status='running' AND pid=?", (error, _now(), run_id, os.getpid()))

    def _running_here(self) -> list[tuple[str, str, int | None]]:
        """(run id, run key, pid) of the ``running`` rows recorded on this host."""
        return self._query("SELECT run_id, run_key, pid FROM runs WHERE status='running' AND host=?",
                           (socket.gethostname(),))

    def live_runs(self) -> dict[str, int]:
        """Run key → pid of the ``running`` rows whose process on this host is alive."""
        return {run_key: pid for _, run_key, pid in self._running_here() if alive(pid)}

    def fail_stale(self) -> int:
        """Mark ``running`` rows whose process on this host is gone (killed, crashed, power loss) as ``failed``;
        returns how many. Rows of live processes and of other hosts are left alone, and a store without such
        rows is not written at all."""
        stale = [run_id for run_id, _, pid in self._running_here() if not alive(pid)]
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
        """The rows in the order their runs began: by start time, then (runs begun within the same second) by the
        order they were recorded in — not by run id, whose part after the time is the run key's hash."""
        query = "SELECT * FROM runs" + (" WHERE status=?" if status else "") + " ORDER BY started_at, rowid"
        return [self._decode(r) for r in self._query(query, (status,) if status else (), as_dict=True)]

    def results(self, status: str | None = None) -> list[RunResult]:
        """The runs of ``rows`` (same order, same ``status`` filter) as typed results: each row's stored metrics
        read back (``RunResult.from_flat``), its id and status the row's own, ``folder`` its run folder. A damaged
        row (``rows``' ``damaged``) is left out: its stored record does not read."""
        return [self.result(row) for row in self.rows(status) if not row.get("damaged")]

    def result(self, row: dict[str, Any]) -> RunResult:
        """One row of ``rows`` as a typed result (``results``), with its run key and stored configuration."""
        flat = {**row["metrics"], "run_id": row["run_id"], "status": row["status"]}
        return RunResult.from_flat(flat, folder=self.run_dir(row["run_id"]), run_key=row["run_key"],
                                   config=row["config"])

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
        """The row with ``config`` and ``metrics`` parsed; a column that is not a JSON object (a damaged
        row) reads as empty and ``damaged`` says which."""
        damaged = []
        for column, key in (("config_json", "config"), ("metrics_json", "metrics")):
            text = row.pop(column)
            try:
                value = json.loads(text) if text else {}
            except (TypeError, ValueError):
                value = None
            if not isinstance(value, dict):
                damaged.append(column)
                value = {}
            row[key] = value
        if not files.plain_name(row.get("run_id")):  # a path would lead outside runs/: nothing is read for it
            row["damaged"] = "run_id not a plain name"
        elif damaged:
            row["damaged"] = f"{' and '.join(damaged)} not a JSON object"
        elif unreadable := _unreadable_verdict(row["metrics"]):
            row["damaged"] = unreadable
        return row


def _unreadable_verdict(metrics: dict[str, Any]) -> str | None:
    """What is wrong with the first stored verdict that is not one (``dpeval.core.verdicts``), else None: every
    command that reads verdicts would fail on it, so its run is a damaged record."""
    for key in [k for k in metrics if k.endswith(VERDICT)]:  # a store holds millions of other keys
        owner = AttackKey.parse(key)
        if owner is not None and owner.is_verdict:
            try:
                Verdict.parse(metrics[key])
            except (ValueError, TypeError):  # TypeError: a list or object is not even hashable
                return f"{key} = {brief(metrics[key])} not a verdict"
    return None
