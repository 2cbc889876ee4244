"""The HTML report: sections, labelled figures with baselines, the reconstruction grid, vector files beside the
page, portable (moved) results folders, missing pictures, and a real headless browser rendering it."""

import base64
import io
import json
import re
import shutil
import sqlite3
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dpeval.cli import main
from dpeval.core.verdicts import Verdict
from dpeval.store import ResultStore
from tests.helpers import typed

STATES = ["epoch:7", "epoch:13", "final"]


def fake_results(root, defenses=("rs", "random-freeze"), rates=(0.0, 0.5, 0.9), seeds=(0, 1)):
    """A store like a sweep's, written through the store's own API: a gradient attack over three states
    (per-state keys, verdict, baseline, image arrays and a picture) and a membership attack (auc + ROC
    file), artefact paths relative to the results folder as the runner stores them."""
    store = ResultStore(root)
    rng = np.random.default_rng(0)
    for defense in defenses:
        for rate in rates:
            for seed in seeds:
                config = {"defense": {"name": defense, "final_rate": rate}, "seed": seed}
                run_id = store.begin(f"{defense}{rate}{seed}".ljust(16, "x"), config)
                folder = store.run_dir(run_id)
                (folder / "ig").mkdir(parents=True)
                (folder / "lira").mkdir()
                originals = rng.integers(0, 256, (6, 1, 1, 8, 8), dtype=np.uint8)
                recon = rng.integers(0, 256, (3, 6, 1, 1, 8, 8), dtype=np.uint8)
                psnr = 30 - 10 * rate + seed
                np.savez_compressed(folder / "ig" / "ig-images.npz", originals=originals, reconstructions=recon,
                                    states=np.array(STATES), psnr=np.full((3, 6, 1), psnr),
                                    best_guess_psnr=np.full((6, 1), 12.0))
                Image.fromarray(originals[0, 0, 0]).save(folder / "ig" / "ig-reconstruction.png")
                (folder / "lira" / "roc.json").write_text(json.dumps({"fpr": [0.0, 0.001, 0.01, 0.1, 1.0],
                                                                      "tpr": [0.0, 0.01, 0.05, 0.3, 1.0]}))
                leaks = rate < 0.7
                metrics = {
                    "dataset": "digits", "model": "cnn3", "defense": defense, "attack": "ig+lira", "seed": seed,
                    "defense.final_rate": rate, "privacy.epsilon": 3.0,
                    "utility.test_accuracy": 0.9 - 0.1 * rate + 0.01 * seed,
                    "leakage.ig.psnr": psnr, "leakage.ig.baseline_psnr": 12.0, "leakage.ig.state": "final",
                    "leakage.ig.verdict": Verdict.of(leaks),
                    "leakage.ig.p_value": 0.047 if leaks else 1.0, "leakage.ig.defense_rate": rate,
                    "leakage.lira.auc": 0.6 - 0.05 * rate,
                    "artefacts.ig.png": f"runs/{run_id}/ig/ig-reconstruction.png",
                    "artefacts.ig.images": f"runs/{run_id}/ig/ig-images.npz",
                    "artefacts.lira.roc": f"runs/{run_id}/lira/roc.json",
                }
                for i, state in enumerate(STATES):
                    metrics[f"leakage.ig.{state}.psnr"] = psnr - 2 + i
                    metrics[f"leakage.ig.{state}.defense_rate"] = rate * (i + 1) / 3
                store.finish(run_id, metrics)
    return store


def rewrite_metrics(root, run_id, metrics):
    """A finished run's stored metrics replaced in place, as an older version or another tool wrote them (the
    store's own API records a run's result once)."""
    with sqlite3.connect(root / "results.sqlite") as db:
        assert db.execute("UPDATE runs SET metrics_json=? WHERE run_id=? AND status='done'",
                          (json.dumps(metrics), run_id)).rowcount == 1


def report(results, out, *extra):
    result = CliRunner().invoke(main, ["report", "--results", str(results), "--out", str(out), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_report_sections_and_files(tmp_path):
    fake_results(tmp_path / "r")
    out = tmp_path / "out" / "report.html"
    written = report(tmp_path / "r", out)
    assert written["runs"] == 12 and written["configurations"] == 6 and written["missing"] == []
    page = out.read_text()
    for heading in ("Leaderboard", "Utility vs leakage (ig)", "Utility vs leakage (lira)",
                    "Leakage over training (ig)", "Accuracy and leakage vs defense.final_rate", "ROC curves (lira)",
                    "Reconstructions (ig)"):
        assert heading in page, heading
    names = ("matched_epsilon", "utility_vs_ig", "utility_vs_lira", "trajectory_ig", "trend_final_rate", "roc_lira",
             "reconstructions_ig")
    for name in names:
        assert (out.parent / f"report_{name}.png").is_file(), name
        assert (out.parent / f"report_{name}.svg").is_file(), name  # every figure also as a vector file
    # Self-contained: every image is embedded and decodes; the 12 runs' pictures are one grid, not 12 images.
    sources = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(sources) == len(names)
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()
    assert "± " in page and "✓" in page  # seed SEMs and Pareto marks in the table
    assert 'title="leakage.ig.psnr"' in page and "IG PSNR (dB)" in page  # human headers, raw keys on hover
    assert "All runs: dataset digits, model cnn3" in page  # constant columns leave the table


def test_figures_label_points_name_axes_and_draw_baselines(tmp_path):
    fake_results(tmp_path / "r")
    out = tmp_path / "report.html"
    report(tmp_path / "r", out)
    utility = (tmp_path / "report_utility_vs_ig.svg").read_text()
    for rate in ("0", "0.5", "0.9"):  # every point carries its swept value
        assert f"final_rate={rate}</text>" in utility, rate
    assert "IG PSNR (dB), higher = more leakage" in utility and "test accuracy, higher = better" in utility
    assert "best data-free guess (12 dB)" in utility  # the baseline line
    assert "worst state final" in utility  # the attacked state in the legend
    assert "rs: leaks" in utility and "rs: no leak detected" in utility
    assert "chance (0.5)" in (tmp_path / "report_utility_vs_lira.svg").read_text()
    trajectory = (tmp_path / "report_trajectory_ig.svg").read_text()
    assert all(f"{state}</text>" in trajectory for state in STATES)
    trend = (tmp_path / "report_trend_final_rate.svg").read_text()
    assert "defense.final_rate" in trend and "fraction of coordinates zeroed" in trend  # the setting's meaning
    grid = (tmp_path / "report_reconstructions_ig.svg").read_text()
    assert "seed 0: 30.0 dB @final" in grid and "seed 1: 22.0 dB @final" in grid
    assert "random-freeze," in grid and "final_rate=0.5" in grid  # rows: swept values (wrapped)


def test_pareto_marks_only_for_configurations_that_leak(tmp_path):
    fake_results(tmp_path / "r")
    board = CliRunner().invoke(main, ["leaderboard", "--results", str(tmp_path / "r"), "--group-seeds", "--json"])
    groups = json.loads(board.stdout)
    for g in groups:
        if Verdict.parse(g["leakage.ig.verdict"]) is Verdict.NO_LEAK:
            assert g["pareto.ig"] is False
    assert any(g["pareto.ig"] for g in groups)


def test_a_moved_results_folder_still_reports_its_pictures(tmp_path):
    fake_results(tmp_path / "r")
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tmp_path / "r", moved)
    shutil.rmtree(tmp_path / "r")
    written = report(moved, tmp_path / "report.html")
    assert written["missing"] == [] and "Reconstructions (ig)" in (tmp_path / "report.html").read_text()


def test_absolute_paths_of_older_runs_are_found_after_a_move(tmp_path):
    store = fake_results(tmp_path / "r", defenses=("rs",), rates=(0.5,), seeds=(0,))
    (row,) = store.rows()
    absolute = {k: str(tmp_path / "r" / v) if k.startswith("artefacts.") else v for k, v in row["metrics"].items()}
    rewrite_metrics(tmp_path / "r", row["run_id"], absolute)  # as versions that stored absolute paths wrote them
    shutil.move(tmp_path / "r", tmp_path / "moved")
    assert report(tmp_path / "moved", tmp_path / "report.html")["missing"] == []


def test_a_report_that_cannot_find_a_picture_says_so(tmp_path):
    store = fake_results(tmp_path / "r", defenses=("rs",), rates=(0.5,), seeds=(0, 1))
    gone = store.rows()[0]
    (tmp_path / "r" / gone["metrics"]["artefacts.ig.images"]).unlink()
    written = report(tmp_path / "r", tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert len(written["missing"]) == 1 and gone["run_id"] in written["missing"][0]
    assert "Missing pictures" in page and "artefacts.ig.images" in page
    assert "Reconstructions (ig)" in page  # the other run is still shown


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
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0", "--window-size=1280,2400"]
    proc = subprocess.run([*flags, f"--screenshot={shot}", out.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.std() > 10  # not a blank page: text, tables and plots were drawn
    assert "Uncaught" not in proc.stderr and "Failed to load resource" not in proc.stderr
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<img") == 7 and "Reconstructions (ig)" in dom and "<table>" in dom


def test_roc_axes_stop_at_one_over_the_non_members(tmp_path, monkeypatch):
    """No ROC curve resolves a rate below 1/n_nonmembers, so the report's axes stop there."""
    from dpeval.report import artefact_figures

    run = tmp_path / "runs" / "r1" / "lira"
    run.mkdir(parents=True)
    (run / "roc.json").write_text(json.dumps({"fpr": [0.0, 0.01, 1.0], "tpr": [0.0, 0.2, 1.0], "fpr_floor": 1 / 250}))
    row = {"run_id": "r1", "run_key": "k", "status": "done",
           "metrics": {"artefacts.lira.roc": "runs/r1/lira/roc.json", "leakage.lira.auc": 0.6,
                       "leakage.lira.n_nonmembers": 250, "seed": 0, "defense": "none"}, "config": {}}
    axes = []
    real = artefact_figures.plt.subplots

    def recording(*args, **kwargs):
        fig, ax = real(*args, **kwargs)
        axes.append(ax)
        return fig, ax

    monkeypatch.setattr(artefact_figures.plt, "subplots", recording)
    (title, path), = artefact_figures.roc_curves(typed([row]), tmp_path, [], tmp_path, "report")
    assert path.is_file() and title == "ROC curves (lira)"
    assert axes[0].get_xlim()[0] == pytest.approx(1 / 250) and axes[0].get_ylim()[0] == pytest.approx(1 / 250)


def test_report_prices_the_selection_of_a_configuration(tmp_path):
    fake_results(tmp_path / "r")  # 6 configurations × 2 seeds, each at ε = 3
    out = tmp_path / "report.html"
    report(tmp_path / "r", out)
    page = out.read_text()
    assert "best of 6 DP configurations (12 runs)" in page and "(36, 0)-DP by composition" in page
    assert "ε of the selection (composition)" in page


def test_leaderboard_command_prints_the_selection_sentence(tmp_path):
    fake_results(tmp_path / "r")
    result = CliRunner().invoke(main, ["leaderboard", "--results", str(tmp_path / "r"), "--group-seeds"])
    assert result.exit_code == 0, result.output
    assert "privacy.selection_epsilon" in result.stdout.splitlines()[0]
    assert "digits: best of 6 DP configurations (12 runs) at ε ≤ 3" in result.stdout


def test_damaged_artefacts_are_one_line_each_and_the_rest_is_shown(tmp_path):
    store = fake_results(tmp_path / "r", defenses=("rs",), rates=(0.0, 0.5), seeds=(0, 1))
    rows = store.rows()
    folder = [tmp_path / "r" / "runs" / r["run_id"] for r in rows]
    (folder[0] / "lira" / "roc.json").write_text('{"fpr": [0.0, 0.5')  # cut short
    (folder[1] / "lira" / "roc.json").write_text('{"fpr": ["a"], "tpr": [1.0]}')
    npz = folder[2] / "ig" / "ig-images.npz"
    npz.write_bytes(npz.read_bytes()[:200])  # truncated
    np.savez(folder[3] / "ig" / "ig-images.npz", originals=np.array([object()], dtype=object),
             states=np.array(STATES), psnr=np.zeros((3, 6, 1)), reconstructions=np.zeros(1))  # needs pickle
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "--results", str(tmp_path / "r"), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (note,) = result.stderr.splitlines()
    assert note.startswith("dpeval: note: 4 artefact(s) could not be read") and "Traceback" not in result.output
    written = json.loads(result.stdout)
    assert len(written["damaged"]) == 4
    assert {line.split(":")[0] for line in written["damaged"]} == {f"run {r['run_id']}" for r in rows}
    page = out.read_text()
    assert "Damaged artefacts" in page and "ROC curves (lira)" in page and "Reconstructions (ig)" in page


def test_artefacts_resolve_only_inside_their_run_folder(tmp_path):
    store = fake_results(tmp_path / "r", defenses=("rs",), rates=(0.5,), seeds=(0,))
    (row,) = store.rows()
    secret = tmp_path / "secret.png"
    Image.fromarray(np.full((8, 8), 7, np.uint8)).save(secret)
    run_dir = tmp_path / "r" / "runs" / row["run_id"]
    (run_dir / "ig" / "link.png").symlink_to(secret)
    for value in (str(secret), f"runs/{row['run_id']}/../../../secret.png", f"runs/{row['run_id']}/ig/link.png",
                  f"runs/{row['run_id']}/../{row['run_id']}/ig/ig-reconstruction.png"):
        metrics = {k: v for k, v in row["metrics"].items() if k != "artefacts.ig.images"}
        rewrite_metrics(tmp_path / "r", row["run_id"], {**metrics, "artefacts.ig.png": value})
        written = report(tmp_path / "r", tmp_path / "report.html")
        page = (tmp_path / "report.html").read_text()
        embedded = base64.b64encode(secret.read_bytes()).decode()
        assert embedded not in page, value
        inside = value.endswith("ig-reconstruction.png")
        assert (written["missing"] == []) == inside, (value, written["missing"])


def scored_store(root, exposed_in_none=5):
    """Runs of `none` and `dpsgd` on digits (two seeds each) whose LiRA games saved per-example scores: the
    undefended model names its first ``exposed_in_none`` training records far ahead of every non-member, the
    defended one names none of them."""
    from dpeval.config import build_spec
    from dpeval.core.datasets import load_task

    pool = load_task(build_spec({"data": {"name": "digits"}}).data).train.source_index.tolist()
    rng = np.random.default_rng(0)
    store = ResultStore(root)
    for defense, eps in (("none", float("inf")), ("dpsgd", 3.0)):
        for seed in (0, 1):
            run_id = store.begin(f"{defense}-{seed}".ljust(16, "x"), {"data": {"name": "digits"},
                                                                        "defense": {"name": defense}, "seed": seed})
            folder = store.run_dir(run_id) / "lira"
            folder.mkdir(parents=True)
            members = rng.normal(0, 1, 400)
            if defense == "none":
                members[:exposed_in_none] = 50.0
            lines = ["target,split,index,label,member,score"]
            lines += [f"-1,train,{pool[i]},{i % 10},1,{float(s)!r}" for i, s in enumerate(members)]
            lines += [f"-1,test,{i},{i % 10},0,{float(s)!r}" for i, s in enumerate(rng.normal(0, 1, 300))]
            (folder / "scores.csv").write_text("\n".join(lines) + "\n")
            store.finish(run_id, {"dataset": "digits", "model": "cnn3", "defense": defense, "attack": "lira",
                                  "seed": seed, "privacy.epsilon": eps, "utility.test_accuracy": 0.9,
                                  "leakage.lira.auc": 0.6, "artefacts.lira.scores": f"runs/{run_id}/lira/scores.csv"})
    return pool


def test_the_report_shows_which_records_leak_and_what_a_defense_does_to_them(tmp_path):
    pool = scored_store(tmp_path / "r")
    written = report(tmp_path / "r", tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Which records leak</h2>" in page and "<h3>Exposure under lira</h3>" in page
    table = page.split("<h3>Exposure under lira</h3>", 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in table.split("<tr>")[2:]]
    by_defense = {r[0]: r[1:] for r in rows}
    assert set(by_defense) == {"none", "dpsgd"}
    # seeds, members, named at 0.1 % and 1 % FPR, of none's top 50 still named at 1 %, their median FPR
    assert by_defense["none"][:2] == ["2", "400"] and float(by_defense["none"][2]) >= 5
    assert float(by_defense["dpsgd"][4]) < float(by_defense["none"][2]) and by_defense["none"][4] == "–"
    assert any(p.endswith("report_exposed_lira.png") for p in written["plots"])
    assert "Most exposed training records (lira)" in page
    assert f"#{pool[0]} FPR 0" in (tmp_path / "report_exposed_lira.svg").read_text()  # none's first: FPR 0


def test_a_positive_control_none_leaks_more_records_than_a_defense_that_names_none(tmp_path):
    """The table is not a constant: without planted records, the undefended model's count at 0.1 % FPR drops."""
    scored_store(tmp_path / "a", exposed_in_none=40)
    scored_store(tmp_path / "b", exposed_in_none=0)
    counts = []
    for name in ("a", "b"):
        report(tmp_path / name, tmp_path / f"{name}.html")
        table = (tmp_path / f"{name}.html").read_text().split("<h3>Exposure under lira</h3>", 1)[1]
        row = next(r for r in table.split("<tr>")[2:] if r.startswith("<td>none</td>"))
        counts.append(float(re.findall(r"<td[^>]*>([^<]*)</td>", row)[3]))
    assert counts[0] >= 40 > counts[1]


@pytest.mark.timeout(120)
def test_a_huge_scores_file_is_listed_as_damaged_without_reading_it(tmp_path):
    """A terabyte (sparse) scores.csv used to be read whole; it is now left out by its size, in one note."""
    scored_store(tmp_path / "r")
    victim = next((tmp_path / "r" / "runs").glob("*/lira/scores.csv"))
    with open(victim, "r+b") as f:
        f.truncate(10**12)
    written = report(tmp_path / "r", tmp_path / "report.html")
    assert len(written["damaged"]) == 1 and "1000000000000 bytes" in written["damaged"][0]
    assert "<h3>Exposure under lira</h3>" in (tmp_path / "report.html").read_text()  # the other runs still shown
