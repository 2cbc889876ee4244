"""Every path dpeval derives from a stored or registered name stays inside its folder: a store row whose run id
climbs out of ``runs/`` (``../../../outside``) is never read from (report) nor written to or removed from (resume),
and a plug-in cannot register a name that is not a plain folder name (its artefacts would land outside the run's
folder). Each is refused in one line or left out with a note; nothing outside is read, written or removed."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dpeval.attacks import ATTACKS
from dpeval.cli import main, raw_config
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.registry import DATASETS, MODELS
from dpeval.defenses import DEFENSES
from dpeval.store import ResultStore

CLIMB = "../../../outside"


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def plant_row(results: Path, run_id: str, **columns) -> None:
    """A row written straight into the database (as a tampered or foreign store holds it)."""
    row = {"run_id": run_id, "run_key": "0" * 16, "status": "done", "config_json": "{}", "metrics_json": "{}",
           "version": "0", "started_at": "2026-01-01T00:00:00+00:00", **columns}
    with sqlite3.connect(results / "results.sqlite") as conn:
        conn.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))


@pytest.fixture
def layout(tmp_path):
    """``tmp/work/res`` holds a good store; ``tmp/outside`` is where ``res/runs/../../../outside`` leads."""
    results = tmp_path / "work" / "res"
    ResultStore(results).begin("1" * 16, {"seed": 0})  # creates the store with one running row
    outside = tmp_path / "outside"
    outside.mkdir()
    assert (results / "runs" / CLIMB).resolve() == outside.resolve()
    return results, outside


def test_report_never_reads_a_file_a_climbing_run_id_names(layout, tmp_path):
    results, outside = layout
    Image.fromarray(np.full((8, 8), 200, np.uint8)).save(outside / "picture.png")
    secret = base64.b64encode((outside / "picture.png").read_bytes()).decode()
    metrics = {"run_id": CLIMB, "dataset": "digits", "model": "cnn3", "defense": "dpsgd", "attack": "ig", "seed": 0,
               "privacy.epsilon": 3.0, "utility.test_accuracy": 0.9, "leakage.ig.psnr": 20.0,
               "leakage.ig.verdict": "leaks", "artefacts.ig.png": f"runs/{CLIMB}/picture.png"}
    plant_row(results, CLIMB, metrics_json=json.dumps(metrics))
    page = tmp_path / "work" / "report.html"
    result = CliRunner().invoke(main, ["report", "--results", str(results), "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert secret not in page.read_text()
    assert "Traceback" not in result.output and CLIMB in result.stderr  # left out with a note naming it


def test_resuming_a_run_whose_stored_id_climbs_out_writes_and_removes_nothing_there(layout):
    results, outside = layout
    args = ["run", "--defense", "dpsgd", "--attack", "none", "--epochs", "1", "--results", str(results), "--quiet",
            "--threads", "1"]
    spec = build_spec(raw_config(None, {"defense.name": "dpsgd", "train.epochs": 1, "attacks": ["none"]}, ()))
    plant_row(results, CLIMB, run_key=spec.run_key, status="failed", error="interrupted",
              started_at="2099-01-01T00:00:00+00:00")
    (outside / "checkpoint.pt").write_bytes(b"not anybody's checkpoint")
    before = snapshot(outside)
    result = CliRunner().invoke(main, args)
    assert snapshot(outside) == before
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("dpeval: error: --results: ") and "run id" in lines[0], lines[0]


def test_show_and_load_result_of_a_climbing_run_id_touch_no_path(layout):
    import dpeval

    results, _ = layout
    plant_row(results, CLIMB)
    with pytest.raises(ConfigError, match="run id"):
        dpeval.load_result(results, "outside")


@pytest.mark.parametrize("name", [CLIMB, "/tmp/escape", "a/b", "..", ".", "", "x\x00y", "a\\b", "-rf"])
@pytest.mark.parametrize("registry", [ATTACKS, DEFENSES, DATASETS, MODELS], ids=["attack", "defense", "dataset",
                                                                                  "model"])
def test_a_plugin_name_that_is_not_a_plain_name_is_refused_in_one_line(registry, name):
    class Plugin:
        pass

    try:
        with pytest.raises(ConfigError) as info:
            registry.register(name, "a plug-in")(Plugin)
    finally:
        if registry.loaded(name):  # registered after all: leave the registry as it was
            registry.unregister(name)
    assert "\n" not in str(info.value) and "name" in str(info.value)


def test_an_entry_point_whose_name_climbs_out_is_a_broken_plugin(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "escaping").mkdir(parents=True)
    (site / "escaping" / "__init__.py").write_text("")
    info = site / "escaping-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: escaping\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dpeval.attacks]\n{CLIMB} = escaping\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(ATTACKS, "_declared", None)
    if CLIMB in ATTACKS.names():
        with pytest.raises(ConfigError, match="not a plain name"):
            ATTACKS.get(CLIMB)
    result = CliRunner().invoke(main, ["run", "--attack", CLIMB, "--epochs", "1", "--results",
                                       str(tmp_path / "res")])
    assert result.exit_code == 2 and not (tmp_path / "res").exists() and not (tmp_path / "escape").exists()
