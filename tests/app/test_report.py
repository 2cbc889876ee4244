"""The HTML report: sections, embedded images, PNGs beside it, and a real headless browser rendering it."""

import base64
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from harness.cli import main
from harness.store import ResultStore


def fake_results(root):
    """A store with two defenses × rates × seeds, a gradient attack (psnr + picture) and a membership
    attack (auc + ROC file), written through the store's own API."""
    store = ResultStore(root)
    root.mkdir(parents=True)
    picture = root / "grid.png"
    Image.fromarray((np.random.default_rng(0).random((16, 32)) * 255).astype("uint8")).save(picture)
    roc = root / "roc.json"
    roc.write_text(json.dumps({"fpr": [0.0, 0.001, 0.01, 0.1, 1.0], "tpr": [0.0, 0.01, 0.05, 0.3, 1.0]}))
    for defense in ("rs", "random-freeze"):
        for rate in (0.0, 0.5, 0.9):
            for seed in (0, 1):
                config = {"defense": {"name": defense, "final_rate": rate}, "seed": seed}
                run_id = store.begin(f"{defense}{rate}{seed}".ljust(16, "x"), config)
                store.finish(run_id, {
                    "dataset": "digits", "model": "cnn3", "defense": defense, "attack": "ig+lira", "seed": seed,
                    "defense.final_rate": rate, "privacy.epsilon": 3.0, "utility.test_accuracy": 0.9 - 0.1 * rate + 0.01 * seed,
                    "leakage.ig.psnr": 30 - 10 * rate + seed, "leakage.lira.auc": 0.6 - 0.05 * rate,
                    "artefacts.ig.grid": str(picture), "artefacts.lira.roc": str(roc),
                })
    return store


def test_report_sections_and_files(tmp_path):
    fake_results(tmp_path / "r")
    out = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    assert written["runs"] == 12 and written["configurations"] == 6 and written["pictures"] == 12
    page = out.read_text()
    for heading in ("Leaderboard", "Utility vs leakage (ig)", "Utility vs leakage (lira)",
                    "Accuracy and leakage vs defense.final_rate", "ROC curves (lira)", "Reconstructions"):
        assert heading in page, heading
    for name in ("utility_vs_ig", "utility_vs_lira", "trend_final_rate", "roc_lira"):
        assert (out.parent / f"report_{name}.png").is_file(), name
    # Self-contained: every image is embedded and decodes.
    sources = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(sources) == 4 + 12
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()
    assert "± " in page and "✓" in page  # seed SEMs and Pareto marks in the table


def test_report_on_a_store_without_finished_runs(tmp_path):
    store = ResultStore(tmp_path / "results")
    store.fail(store.begin("f" * 16, {}), "boom")
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--results", str(store.root), "--out", str(out)])
    assert result.exit_code == 0 and "No finished runs" in out.read_text()


def test_report_on_a_missing_results_folder_is_bad_input(tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "none"), "--out", str(out)])
    assert result.exit_code == 2 and str(tmp_path / "none") in result.stderr and not out.exists()


def test_report_needs_html_name(tmp_path):
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path), "--out", str(tmp_path / "r.pdf")])
    assert result.exit_code == 2 and "--out" in result.stderr


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (make test installs Debian's chromium when it can)")
def test_report_renders_in_a_headless_browser(tmp_path):
    fake_results(tmp_path / "r")
    out = tmp_path / "report.html"
    CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out)])
    shot = tmp_path / "shot.png"
    flags = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0", "--window-size=1280,2400"]
    proc = subprocess.run([*flags, f"--screenshot={shot}", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.std() > 10  # not a blank page: text, tables and plots were drawn
    assert "Uncaught" not in proc.stderr and "Failed to load resource" not in proc.stderr
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<img") == 16 and "Reconstructions" in dom and "<table>" in dom
