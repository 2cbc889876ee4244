"""Bad input across every command keeps the contract: exit 2 (1 for a runtime refusal), exactly one line on
stderr naming the field or path, no traceback, and nothing written — the working folder, with its results
store, is byte-for-byte what it was (hashed before and after).

Cases run in-process through click's CliRunner. Those that used to hang run under a watchdog (SIGALRM
raises after a minute), and one of them in a real process with a timeout, so a regression fails instead of
blocking the suite.
"""

import fcntl
import hashlib
import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
UNWRITABLE = "/sys/dpeval-unwritable"  # mkdir / open for writing fail there, for root too (Linux sysfs)


def _unwritable_available() -> bool:
    try:
        os.mkdir(UNWRITABLE)
    except OSError:
        return Path("/sys").is_dir()
    os.rmdir(UNWRITABLE)
    return False


NEEDS_UNWRITABLE = pytest.mark.skipif(not _unwritable_available(), reason=f"needs a read-only {UNWRITABLE}")


def _mknod_available() -> bool:
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"dpeval-mknod-{os.getpid()}"
    try:
        os.mknod(probe, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        return False
    probe.unlink()
    return True


NEEDS_MKNOD = pytest.mark.skipif(not _mknod_available(), reason="needs permission to make a device node")


def special_outputs(work: Path) -> None:
    """Output paths that are not regular files, made in the case's own folder (copying them would block or fail):
    FIFOs, a unix socket and, where allowed, a character device with /dev/null's numbers (a stand-in for
    ``/dev/full``: a writer that replaced it would harm nothing outside the test)."""
    for name in ("fifo.yaml", "out.fifo", "fifo.html"):
        os.mkfifo(work / name)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(work / "out.sock"))
    server.close()
    shutil.copytree(work / "store", work / "fifostore", ignore=shutil.ignore_patterns(".sweep.lock"))
    os.mkfifo(work / "fifostore" / "results.sqlite-journal")  # where SQLite writes its journal
    if _mknod_available():
        os.mknod(work / "full.csv", stat.S_IFCHR | 0o666, os.makedev(1, 3))


def record_runs(root: Path, n: int, pad: int = 0) -> list[str]:
    """A store with ``n`` done runs (no training: rows and metrics written through the store's API)."""
    store = ResultStore(root)
    ids = []
    for i in range(n):
        run_id = store.begin(f"{i:016x}", {"seed": i, "defense": {"name": "dpsgd"}, "pad": "x" * pad})
        store.finish(run_id, {"run_id": run_id, "run_key": f"{i:016x}", "status": "done", "dataset": "digits",
                              "model": "cnn3", "defense": "dpsgd", "attack": "none", "seed": i,
                              "privacy.epsilon": 3.0, "utility.test_accuracy": 0.9})
        ids.append(run_id)
    return ids


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The working folder every case starts from: a good store, damaged and foreign stores, odd files."""
    base = tmp_path_factory.mktemp("template")
    ids = record_runs(base / "store", 2)
    record_runs(base / "malformed", 120, pad=3000)  # many pages; then damage one in the middle
    db = base / "malformed" / "results.sqlite"
    data = bytearray(db.read_bytes())
    data[len(data) // 2: len(data) // 2 + 8192] = bytes(range(256)) * 32
    db.write_bytes(bytes(data))
    (base / "broken").mkdir()
    (base / "broken" / "results.sqlite").write_bytes(bytes(range(256)) * 20)
    (base / "foreign").mkdir()
    conn = sqlite3.connect(base / "foreign" / "results.sqlite")
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.commit()
    conn.close()
    (base / "emptydir").mkdir()
    (base / "afile").write_text("not a folder\n")
    (base / "bin.yaml").write_bytes(bytes(range(128, 256)) * 4)
    (base / "dup.yaml").write_text("train: {epochs: 1}\nseed: 1\ntrain: {epochs: 2}\n")
    (base / "empty.yaml").write_text("# only a comment\n")
    (base / "ok.yaml").write_text(yaml.safe_dump({"defense": {"name": "dpsgd"}, "attacks": ["none"],
                                                  "train": {"epochs": 1, "batch_size": 256}}))
    (base / "badgrid.yaml").write_text(yaml.safe_dump({"train": {"epochz": [1, 2]}}))
    (base / "store" / ".sweep.lock").write_text("pid 1")
    (base / "bomb.yaml").write_text(BOMB)
    (base / "targets.yaml").write_text(yaml.safe_dump({"attacks": ["ig"], "train": {"epochs": 1},
                                                      "attack": {"targets": [6, 10**12]}}))
    (base / "outside.txt").write_text("a file outside the results folder\n")
    (base / "defaults.yaml").write_text("defaults: [train.lr=99]\ntrain: {epochs: 1}\n")  # dpeval's record, not input
    (base / "huge_grid.yaml").write_text(yaml.safe_dump({"train": {"epochs": list(range(1, 101)),
                                                              "lr": [0.001 * i for i in range(1, 101)]},
                                                    "seeds": list(range(100))}))  # 10**6 points
    (base / "longint.yaml").write_text(f"train:\n  epochs: {LONG_INT}\n")  # past Python's int-str limit
    (base / "longgrid.yaml").write_text(f"train:\n  epochs: [1, {LONG_INT}]\n")
    shutil.copytree(base / "store", base / "symlock")
    (base / "symlock" / ".sweep.lock").unlink()
    (base / "symlock" / ".sweep.lock").symlink_to("../outside.txt")
    (base / "store.csv").symlink_to("store/results.sqlite")
    (base / "linkeddb").mkdir()  # a store whose database is elsewhere: a run would record its row there
    (base / "linkeddb" / "results.sqlite").symlink_to("../store/results.sqlite")
    shutil.copytree(base / "store", base / "linkedruns", ignore=shutil.ignore_patterns("runs", ".sweep.lock"))
    (base / "linkedruns" / "runs").symlink_to("../store/runs")  # and one whose run folders would land elsewhere
    (base / "store.html").symlink_to("store/results.sqlite")
    return base, os.path.commonprefix(ids)


LONG_INT = "7" * 5000  # int() refuses more than 4300 digits with a ValueError (not a YAML error)
# "Billion laughs": nine levels of nine aliases, 9**9 strings once expanded.
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
SET_BOMB = "train.epochs=[&a [1,1,1,1,1,1,1,1,1,1]" + "".join(
    f",&{b} [{','.join([f'*{a}'] * 10)}]" for a, b in zip("abcde", "bcdef")) + ",*f]"


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with the hash of its bytes (through links), or what else it is."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
            else "dir" if p.is_dir() else "other" for p in sorted(root.rglob("*"))}


PRIVACY = ["--delta", "1e-5", "--sample-rate", "0.01", "--epochs", "2"]


def case(args, names, *, id, code=2, hang=False, process=False, hold_lock=False, marks=()):
    """One bad input: ``names`` must appear in the one stderr line; ``hang`` runs it under the watchdog,
    ``process`` in a real process with a timeout; ``hold_lock`` holds the store's sweep lock meanwhile."""
    options = {"hang": hang, "process": process, "hold_lock": hold_lock}
    return pytest.param(args, names, code, options, id=id, marks=marks)


CASES = [
    # run
    case(["run", "--config", "bin.yaml"], "--config", id="run-binary-config"),
    case(["run", "--config", "dup.yaml"], "duplicate key 'train'", id="run-duplicate-yaml-key"),
    case(["run", "--config", "empty.yaml"], "--config", id="run-empty-config"),
    case(["run", "--config", "missing.yaml"], "missing.yaml", id="run-missing-config"),
    case(["run", "--config", "store"], "--config", id="run-config-is-a-folder"),
    case(["run", "--results", "afile"], "afile", id="run-results-is-a-file"),
    case(["run", "--results", "afile/sub"], "afile", id="run-results-under-a-file"),
    case(["run", "--results", ""], "--results", id="run-results-empty"),
    case(["run", "--results", "broken"], "broken/results.sqlite", id="run-garbage-store"),
    case(["run", "--results", "malformed"], "malformed/results.sqlite", id="run-corrupted-store"),
    case(["run", "--results", "foreign"], "not a dpeval results store", id="run-foreign-sqlite"),
    case(["run", "--results", UNWRITABLE], UNWRITABLE, id="run-results-unwritable",
                 marks=NEEDS_UNWRITABLE),
    case(["run", "--results", "linkeddb", "--epochs", "1"], "--results: linkeddb/results.sqlite is a symbolic link",
         id="run-store-database-is-a-link"),
    case(["run", "--results", "linkedruns", "--epochs", "1"], "--results: linkedruns/runs is a symbolic link",
         id="run-store-runs-folder-is-a-link"),
    case(["run", "--config", "longint.yaml"], "--config: malformed YAML in longint.yaml at line 2, column 11: an "
         "integer of 5000 characters", id="run-yaml-integer-past-the-digit-limit"),
    case(["run", "--set", f"train.epochs={LONG_INT}"], "train.epochs: must be an integer",
         id="run-set-integer-past-the-digit-limit"),
    case(["run", "--results", "fifostore", "--epochs", "1"], "--results: fifostore/results.sqlite-journal is a FIFO",
         process=True, id="run-store-journal-is-a-fifo"),  # SQLite would block in C, past the watchdog
    case(["run", "--defense", "none", "--set", "defense.clip=0.5"], "defense.clip: unknown setting; "
                 "valid keys here: none", id="run-param-of-parameterless-defense"),
    case(["run", "--epsilon", "inf"], "privacy.epsilon", id="run-epsilon-inf"),
    case(["run", "--epsilon", "nan"], "privacy.epsilon", id="run-epsilon-nan"),
    case(["run", "--epsilon", "1e9", "--epochs", "1"], "privacy.epsilon", id="run-epsilon-unreachable-large"),
    case(["run", "--set", "privacy.noise_multiplier=1e-300", "--epochs", "1"], "privacy.noise_multiplier",
                 id="run-sigma-out-of-numeric-range"),
    case(["run", "--epochs", "abc"], "--epochs", id="run-epochs-not-integer"),
    case(["run", "--bogus-flag"], "--bogus-flag", id="run-unknown-option"),
    case(["run", "--set", "train.epochs=0"], "train.epochs", id="run-epochs-zero"),
    case(["run", "--attack", "nope"], "attack", id="run-unknown-attack"),
    case(["run", "--set", "novalue"], "--set", id="run-set-without-value"),
    case(["run", "--config", "bomb.yaml"], "--config: bomb.yaml holds more than", hang=True, id="run-yaml-alias-bomb"),
    case(["run", "--set", SET_BOMB], "--set 'train.epochs': the value holds more than", hang=True,
         id="run-set-alias-bomb"),
    case(["run", "--config", "fifo.yaml"], "--config: fifo.yaml is not a regular file", hang=True,
         id="run-config-is-a-fifo"),
    case(["run", "--set", "attack.targets=1000000000000", "--attack", "ig", "--epochs", "1"], "attack.targets",
         id="run-attack-targets-beyond-the-data"),
    case(["run", "--threads", "1000000000"], "--threads: must be a whole number from 1 to", id="run-threads-1e9"),
    case(["run", "--threads", "100000000000000000000"], "--threads: must be a whole number from 1 to",
         id="run-threads-1e20"),
    case(["run", "--attack", "informed-recon", "--set", "attack.informed-recon.targets=1000000000000"],
         "attack.informed-recon.targets", id="run-informed-targets-1e12"),
    case(["run", "--attack", "informed-recon", "--set", "privacy.noise_multiplier=1e-30", "--epochs", "1"],
         "attack.informed-recon: the run's accounted σ = 1e-30", hang=True, id="run-informed-sigma-1e-30"),
    case(["run", "--epochs", "100000000000000000000"], "train.epochs", id="run-epochs-1e20"),
    case(["run", "--config", "defaults.yaml"], "defaults: recorded by dpeval", id="run-config-carries-defaults"),
    case(["run", "--set", "defaults=[train.lr=99]"], "defaults: recorded by dpeval", id="run-set-defaults"),
    # sweep
    case(["sweep", "defaults.yaml"], "defaults: recorded by dpeval", id="sweep-file-carries-defaults"),
    case(["sweep", "missing.yaml"], "SWEEP_FILE: cannot read missing.yaml", id="sweep-missing-file"),
    case(["sweep", "bin.yaml"], "SWEEP_FILE", id="sweep-binary-file"),
    case(["sweep", "dup.yaml"], "duplicate key 'train'", id="sweep-duplicate-yaml-key"),
    case(["sweep", "empty.yaml"], "SWEEP_FILE", id="sweep-empty-file"),
    case(["sweep", "badgrid.yaml"], "train.epochz", id="sweep-unknown-grid-key"),
    case(["sweep", "ok.yaml", "--results", "broken"], "broken/results.sqlite", id="sweep-garbage-store"),
    case(["sweep", "ok.yaml", "--results", "malformed", "--dry-run"], "malformed/results.sqlite",
                 id="sweep-dry-run-corrupted-store"),
    case(["sweep", "ok.yaml", "--results", "afile"], "afile", id="sweep-results-is-a-file"),
    case(["sweep", "ok.yaml", "--results", ""], "--results", id="sweep-results-empty"),
    case(["sweep", "ok.yaml", "--results", "linkedruns"], "--results: linkedruns/runs is a symbolic link",
         id="sweep-store-runs-folder-is-a-link"),
    case(["sweep", "longgrid.yaml", "--dry-run"], "SWEEP_FILE: malformed YAML in longgrid.yaml",
         id="sweep-integer-past-the-digit-limit"),
    case(["sweep", "huge_grid.yaml", "--dry-run"], "huge_grid.yaml: the grid has 1000000 points", hang=True,
         id="sweep-dry-run-million-point-grid"),
    case(["sweep", "ok.yaml", "--workers", "0"], "--workers", id="sweep-zero-workers"),
    case(["sweep", "ok.yaml", "--workers", "100000", "--results", "store"], "--workers: must be a whole number",
         id="sweep-100000-workers"),
    case(["sweep", "ok.yaml", "--threads", "1000000000"], "--threads: must be a whole number", id="sweep-threads-1e9"),
    case(["sweep", "ok.yaml", "--executor", "nope"], "--executor", id="sweep-unknown-executor"),
    case(["sweep", "bomb.yaml"], "SWEEP_FILE: bomb.yaml holds more than", hang=True, id="sweep-yaml-alias-bomb"),
    case(["sweep", "fifo.yaml"], "SWEEP_FILE: fifo.yaml is not a regular file", hang=True, id="sweep-file-is-a-fifo"),
    case(["sweep", "targets.yaml"], "targets.yaml: grid point targets=1000000000000: attack.targets", hang=True,
         id="sweep-attack-targets-beyond-the-data"),
    case(["sweep", "ok.yaml", "--results", "symlock"], "symlock/.sweep.lock is a symlink",
         id="sweep-lock-is-a-symlink"),
    case(["sweep", "ok.yaml", "--results", "store"], "another dpeval sweep is running on store", code=1,
         hold_lock=True, id="sweep-folder-locked-exit-1"),
    # leaderboard
    case(["leaderboard", "--results", "nowhere"], "nowhere", id="leaderboard-no-folder"),
    case(["leaderboard", "--results", "afile"], "afile", id="leaderboard-results-is-a-file"),
    case(["leaderboard", "--results", "emptydir"], "emptydir", id="leaderboard-folder-without-store"),
    case(["leaderboard", "--results", ""], "--results", id="leaderboard-results-empty"),
    case(["leaderboard", "--results", "broken"], "broken/results.sqlite", id="leaderboard-garbage-store"),
    case(["leaderboard", "--results", "malformed"], "malformed/results.sqlite",
                 id="leaderboard-corrupted-store"),
    case(["leaderboard", "--results", "foreign"], "foreign/results.sqlite", id="leaderboard-foreign-sqlite"),
    case(["leaderboard", "--results", "store", "--out", f"{UNWRITABLE}/board.csv"], "--out",
                 id="leaderboard-out-unwritable", marks=NEEDS_UNWRITABLE),
    case(["leaderboard", "--results", "store", "--out", "afile/board.csv"], "--out: cannot write afile/board.csv",
                 id="leaderboard-out-under-a-file"),
    case(["leaderboard", "--results", "store", "--out", "store/results.sqlite"],
         "--out: store/results.sqlite is part of the results store", id="leaderboard-out-is-the-store"),
    case(["leaderboard", "--results", "store", "--out", "store/.sweep.lock"], "--out: store/.sweep.lock",
         id="leaderboard-out-is-the-sweep-lock"),
    case(["leaderboard", "--results", "store", "--out", "store/results.sqlite-journal"], "--out",
         id="leaderboard-out-is-the-journal"),
    case(["leaderboard", "--results", "store", "--out", "store.csv"], "--out: store.csv is part of the results",
         id="leaderboard-out-links-to-the-store"),
    case(["leaderboard", "--results", "store", "--out", "store/runs/{first}/board.csv"], "--out: store/runs/",
         id="leaderboard-out-inside-a-run"),
    case(["leaderboard", "--results", "store", "--out", "store"], "--out", id="leaderboard-out-is-a-folder"),
    case(["leaderboard", "--results", "store", "--out", "out.fifo"], "--out: out.fifo is a FIFO (named pipe), not a "
         "regular file", hang=True, id="leaderboard-out-is-a-fifo"),
    case(["leaderboard", "--results", "store", "--out", "out.sock"], "--out: out.sock is a socket",
         id="leaderboard-out-is-a-socket"),
    case(["leaderboard", "--results", "store", "--out", "full.csv"], "--out: full.csv is a character device",
         id="leaderboard-out-is-a-device", marks=NEEDS_MKNOD),
    case(["leaderboard", "--results", "store", "--sort", "nope"], "--sort", id="leaderboard-unknown-column"),
    # report
    case(["report", "--results", "nowhere", "--out", "r.html"], "nowhere", id="report-no-folder"),
    case(["report", "--results", "afile", "--out", "r.html"], "afile", id="report-results-is-a-file"),
    case(["report", "--results", "broken", "--out", "r.html"], "broken/results.sqlite",
                 id="report-garbage-store"),
    case(["report", "--results", "malformed", "--out", "r.html"], "malformed/results.sqlite",
                 id="report-corrupted-store"),
    case(["report", "--results", "store", "--out", "r.txt"], "--out", id="report-out-not-html"),
    case(["report", "--results", "store", "--out", f"{UNWRITABLE}/r.html"], "--out",
                 id="report-out-unwritable", marks=NEEDS_UNWRITABLE),
    case(["report", "--results", "store"], "--out", id="report-out-missing"),
    case(["report", "--results", "store", "--out", "store.html"], "--out: store.html is part of the results store",
         id="report-out-links-to-the-store"),
    case(["report", "--results", "store", "--out", "fifo.html"], "--out: fifo.html", hang=True,
         id="report-out-is-a-fifo"),
    case(["report", "--results", "store", "--out", "store/runs/{first}/r.html"], "--out: store/runs/",
         id="report-out-inside-a-run"),
    # show
    case(["show", "2", "--results", "nowhere"], "nowhere", id="show-no-folder"),
    case(["show", "2", "--results", "afile"], "afile", id="show-results-is-a-file"),
    case(["show", "2", "--results", "broken"], "broken/results.sqlite", id="show-garbage-store"),
    case(["show", "2", "--results", "malformed"], "malformed/results.sqlite", id="show-corrupted-store"),
    case(["show", "nope", "--results", "store"], "RUN_ID: no run id contains 'nope'",
                 id="show-unknown-id"),
    case(["show", "{common}", "--results", "store"], "is ambiguous: it is part of 2 run ids",
                 id="show-ambiguous-prefix"),
    case(["show", "--results", "store"], "RUN_ID", id="show-missing-id"),
    case(["show", "", "--results", "store"], "RUN_ID: empty", id="show-empty-id"),
    # privacy (nan / inf / huge targets used to spin forever)
    case(["privacy", "--noise-multiplier", "nan", *PRIVACY], "--noise-multiplier", process=True,
         id="privacy-sigma-nan"),
    case(["privacy", "--noise-multiplier", "inf", *PRIVACY], "--noise-multiplier", hang=True,
         id="privacy-sigma-inf"),
    case(["privacy", "--epsilon", "inf", *PRIVACY], "--epsilon", hang=True,
                 id="privacy-epsilon-inf"),
    case(["privacy", "--epsilon", "nan", *PRIVACY], "--epsilon", hang=True,
                 id="privacy-epsilon-nan"),
    case(["privacy", "--epsilon", "1e300", *PRIVACY], "privacy.epsilon", hang=True,
                 id="privacy-epsilon-huge"),
    case(["privacy", "--noise-multiplier", "1e-300", *PRIVACY], "privacy.noise_multiplier",
                 id="privacy-sigma-tiny"),
    case(["privacy", "--noise-multiplier", "1", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "0"],
                 "--steps", id="privacy-zero-steps"),
    case(["privacy", "--epsilon", "3", "--sample-rate", "0.01", "--epochs", "2"], "--delta",
                 id="privacy-missing-delta"),
    case(["privacy", "--epsilon", "3", "--delta", "1e-5", "--sample-rate", "0", "--epochs", "2"],
                 "--sample-rate", id="privacy-zero-sample-rate"),
    case(["privacy", "--epsilon", "3", "--delta", "nan", "--sample-rate", "0.01", "--epochs", "2"],
                 "--delta", id="privacy-delta-nan"),
    case(["privacy", "--epsilon", "3", *PRIVACY, "--steps", "3"], "--epochs/--steps",
                 id="privacy-epochs-and-steps"),
    case(["privacy", "--epsilon", "3", "--delta", "1e-5", "--sample-rate", "0.02", "--epochs",
          "100000000000000000000"], "--epochs: must be from 1 to", hang=True, id="privacy-epochs-1e20"),
    case(["privacy", "--noise-multiplier", "1", "--delta", "1e-5", "--sample-rate", "0.02", "--steps",
          "100000000000000000000"], "--steps: must be from 1 to", hang=True, id="privacy-steps-1e20"),
    # audit
    case(["audit", "--defense", "nope"], "defense", id="audit-unknown-defense"),
    case(["audit", "--defense", "none"], "not a DP mechanism", id="audit-non-dp-defense"),
    case(["audit", "--defense", "dpsgd", "--noise-multiplier", "nan"], "--noise-multiplier",
                 id="audit-sigma-nan"),
    case(["audit", "--defense", "dpsgd", "--trials", "0"], "--trials", id="audit-zero-trials"),
    case(["audit", "--defense", "dpsgd", "--trials", "1000000000000000"], "--trials: must be an integer from 2",
         hang=True, id="audit-trials-1e15"),
    case(["audit", "--defense", "dpsgd", "--trials", "100000000000000000000000"], "--trials", hang=True,
         id="audit-trials-1e23"),
    case(["audit", "--defense", "dpsgd", "--config", "bin.yaml"], "--config", id="audit-binary-config"),
    case(["audit", "--defense", "dpsgd", "--config", "fifo.yaml"], "not a regular file", hang=True,
         id="audit-config-is-a-fifo"),
    case(["audit", "--defense", "dpsgd", "--set", "privacy.epsilon=3"], "privacy.epsilon",
                 id="audit-epsilon-given"),
    case(["audit", "--defense", "dpsgd", "--config", "defaults.yaml"], "defaults: recorded by dpeval",
         id="audit-config-carries-defaults"),
    case(["audit"], "--defense", id="audit-missing-defense"),
    # list
    case(["list", "--bogus"], "--bogus", id="list-unknown-option"),
    case(["list", "extra"], "extra", id="list-extra-argument"),
]


class Hung(Exception):
    pass


@contextmanager
def watchdog(seconds: int):
    """Raise Hung in this (main) thread if the block runs longer than ``seconds``."""
    def on_alarm(signum, frame):
        raise Hung(f"hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def invoke(args, cwd, options):
    if options["hang"]:
        with watchdog(60):
            result = CliRunner().invoke(main, args)
        return result.exit_code, result.stderr, result.exception
    if options["process"]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.run([sys.executable, "-m", "dpeval.cli", *args], cwd=cwd, env=env, text=True,
                                  capture_output=True, timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"dpeval {' '.join(args)} hung")
        return proc.returncode, proc.stderr, None
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stderr, result.exception


@pytest.mark.parametrize("args,names,code,options", CASES)
def test_bad_input_keeps_the_contract(args, names, code, options, template, tmp_path, monkeypatch):
    base, common = template
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    special_outputs(work)  # made here: copying a FIFO would block
    first = ResultStore(work / "store").rows()[0]["run_id"]
    args = [a.replace("{common}", common).replace("{first}", first) for a in args]
    monkeypatch.chdir(work)
    before = snapshot(work)
    lock = None
    if options["hold_lock"]:
        lock = open(work / "store" / ".sweep.lock", "a+")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        exit_code, stderr, exception = invoke(args, work, options)
    finally:
        if lock is not None:
            lock.close()
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("dpeval: "), lines[0]
    assert names in lines[0], lines[0]
    assert exit_code == code, stderr
    assert snapshot(work) == before


def test_the_matrix_covers_every_command():
    commands = {case.values[0][0] for case in CASES}
    assert commands == {"run", "sweep", "leaderboard", "report", "show", "privacy", "audit", "list"}
    assert len(CASES) >= 40


def test_a_damaged_store_says_how_to_recover(template, tmp_path):
    base, _ = template
    result = CliRunner().invoke(main, ["leaderboard", "--results", str(base / "malformed")])
    line = result.stderr.strip()
    assert "malformed" in line and "move it aside" in line and f"mv {base / 'malformed' / 'results.sqlite'}" in line


def test_the_ambiguous_prefix_lists_the_candidates(template, tmp_path):
    base, common = template
    rows = ResultStore(base / "store").rows()
    result = CliRunner().invoke(main, ["show", common, "--results", str(base / "store")])
    assert result.exit_code == 2
    assert all(r["run_id"] in result.stderr for r in rows)


def test_reading_a_store_never_writes_it(template, tmp_path):
    """leaderboard, report and show open the database read-only: a store on a read-only location still
    reads, and the bytes do not change."""
    base, common = template
    work = tmp_path / "w"
    shutil.copytree(base / "store", work)
    before = snapshot(work)
    runner = CliRunner()
    assert runner.invoke(main, ["leaderboard", "--results", str(work)]).exit_code == 0
    shown = runner.invoke(main, ["show", ResultStore(work).rows()[0]["run_id"], "--results", str(work)])
    assert shown.exit_code == 0 and "status: done" in shown.stdout
    assert snapshot(work) == before


@pytest.mark.parametrize("value", [f"{'9' * 20_000}x", "[" + "1, " * 20_000 + "2]", "{" + "a: 1, " * 2000 + "b: 2}"])
def test_an_error_never_repeats_a_huge_value(value):
    """The message about a bad value quotes at most a short prefix of it."""
    with watchdog(60):
        result = CliRunner().invoke(main, ["run", "--set", f"train.epochs={value}"])
    (line,) = result.stderr.splitlines()
    assert result.exit_code == 2 and line.startswith("dpeval: error: train.epochs: must be an integer, got ")
    assert len(line) < 200, len(line)


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
@pytest.mark.parametrize("command", [["run", "--epochs", "1"], ["sweep", "ok.yaml"]])
def test_an_absurd_thread_count_in_the_environment_is_one_line(variable, command, template, tmp_path, monkeypatch):
    """OMP_NUM_THREADS=1000000000 would reach the thread pool (libgomp aborts, the run stays `running`): refused
    before anything starts, naming the variable."""
    base, _ = template
    work = tmp_path / "work"
    shutil.copytree(base, work, symlinks=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(variable, "1000000000")
    before = snapshot(work)
    result = CliRunner().invoke(main, [*command, "--results", "fresh"])
    (line,) = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and line.startswith(f"dpeval: error: {variable}: must be a whole number"), line
    assert snapshot(work) == before
