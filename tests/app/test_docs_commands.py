"""The shipped commands of the README and docs run as written, in small form: every ``dpeval`` line of a
fenced shell block, with one epoch, a small private pool and tiny attacks appended (later ``--set`` wins);
a sweep as ``--dry-run`` (which applies every check of ``run``); ``RUN_ID`` as the id of a run made
before. Lines that are synopses (``NAME``, ``FILE``, ``[--option]``), shell loops, recipes whose data
must be downloaded first (``configs/papers/``), the commands reading what those would write, and ``dpeval data
install`` (it fetches from the npm registry: tests/core/test_packaged_data.py runs it on local tarballs) are left
out."""

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.store import ResultStore
from tests.helpers import FASHIONMNIST_INSTALLED

ROOT = Path(__file__).resolve().parents[2]
SMALL_RUN = ["--set", "data.max_train=256", "--quiet"]  # and the fewest epochs the command's states allow
SMALL_ATTACK = {"ig": ["attack.ig.iterations=2", "attack.ig.targets=1"], "rgap": ["attack.rgap.targets=1"],
                "lira": ["attack.lira.shadows=4"], "rmia": ["attack.rmia.shadows=4"],
                "informed-recon": ["attack.informed-recon.targets=2"]}
PLACEHOLDER = re.compile(r"\b(NAME|FILE|DIR|COLUMN|E|D|N|S)\b|\s\[--|\$|\\$")


def shell_lines(doc: Path) -> list[str]:
    """``dpeval`` command lines inside fenced shell blocks (``.venv/bin/`` and trailing comments dropped); a
    ```` ```text ```` block is a picture or an output, not commands."""
    lines, fenced = [], False
    for line in doc.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced and line.strip() != "```text"
            continue
        text = line.strip().removeprefix(".venv/bin/")
        if fenced and text.startswith("dpeval "):
            lines.append(re.sub(r"\s+#.*$", "", text))
    return lines


def commands(doc: Path) -> list[str]:
    """The runnable lines: not synopses, no downloads, and nothing reading a folder only those would fill —
    nor a folder of its own that only a sweep fills (a sweep runs as ``--dry-run`` here, which writes
    nothing)."""
    kept, unfilled = [], set()
    for line in shell_lines(doc):
        folder = re.search(r"--results\s+(\S+)", line)
        if line.startswith("dpeval data install "):
            continue
        if PLACEHOLDER.search(line.replace("RUN_ID", "")) or "configs/papers/" in line:
            unfilled |= {folder.group(1)} if folder else set()
        elif not (folder and folder.group(1) in unfilled):
            kept.append(line)
            if line.startswith("dpeval sweep ") and folder and folder.group(1) != "dpeval-results":
                unfilled.add(folder.group(1))
    return kept


def small(args: list[str]) -> list[str]:
    """The command in small form."""
    if args[0] == "run":
        attacks = [args[i + 1] for i, a in enumerate(args) if a == "--attack"]
        extra = [s for a in attacks for item in SMALL_ATTACK.get(a, []) for s in ("--set", item)]
        epochs = max([int(e) + 1 for e in re.findall(r"epoch:(\d+)", " ".join(args))], default=1)
        return args + SMALL_RUN + ["--set", f"train.epochs={epochs}"] + extra
    if args[0] == "sweep":
        return args + ["--dry-run"]
    return args


def real_data_missing(line: str) -> bool:
    """A Fashion-MNIST command on a machine without Debian's files (as the real-data tests, it then waits)."""
    return "fashionmnist" in line and not FASHIONMNIST_INSTALLED


def run_all(lines: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for line in [line for line in lines if not real_data_missing(line)]:
        args = shlex.split(line)[1:]
        if "RUN_ID" in args:
            args[args.index("RUN_ID")] = ResultStore(tmp_path / "dpeval-results").rows()[-1]["run_id"]
        result = CliRunner().invoke(main, small(args))
        assert result.exit_code == 0, f"{line}\n{result.output}"


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path, monkeypatch):
    lines = commands(ROOT / "README.md")
    assert len(lines) >= 15 and any(line.startswith("dpeval sweep") for line in lines)
    run_all(lines, tmp_path, monkeypatch)
    assert (tmp_path / "report.html").is_file() and (tmp_path / "board.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md") if commands(p)))
def test_the_docs_commands_run_as_written(doc, tmp_path, monkeypatch):
    run_all(commands(ROOT / "docs" / doc), tmp_path, monkeypatch)


def test_synopses_and_downloads_are_what_is_left_out():
    left = {c for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] for c in shell_lines(p)}
    left -= {c for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] for c in commands(p)}
    for line in left:
        assert PLACEHOLDER.search(line.replace("RUN_ID", "")) or "configs/papers/" in line \
            or "--results runs/" in line or line.startswith("dpeval data install "), line

