"""What dpeval writes from hostile input stays inert, and a large store stays quick: strings from a store or the
command line reach the terminal escaped and short; CSV cells cannot start a spreadsheet formula; the report's page
and figures never replace a file that is not theirs; the page shows every stored string as text (a stored verdict
that is not one marks its run damaged); a run without a test set reads "no test set" / n/a instead of dividing by
zero; the cached accountant curves, the Pareto sweep and the figures not drawn change no result."""

import csv
import hashlib
import html.parser
import json
import math
import os
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dpeval.cli import main
from dpeval.store import ResultStore

ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"  # set the terminal's title, clear the screen, turn text red
HUGE = "A" * 100_000


def record(store, key, metrics, config=None):
    """One finished run written through the store's API."""
    run_id = store.begin(key.ljust(16, "x"), config or {"seed": metrics.get("seed", 0)})
    store.finish(run_id, {"run_id": run_id, "dataset": "digits", "model": "cnn3", "defense": "dpsgd",
                          "attack": "none", "seed": 0, "privacy.epsilon": 3.0, "utility.test_accuracy": 0.9,
                          **metrics})
    return run_id


def invoke(*args):
    """The command in-process, escape sequences kept as a terminal would get them (click strips them otherwise)."""
    return CliRunner().invoke(main, [str(a) for a in args], color=True)


# ---------------------------------------------------------------------------------------------------
# the terminal: stored and given strings are escaped and capped


def test_printable_escapes_controls_and_caps_the_length():
    from dpeval.core.errors import printable

    assert printable(f"a{ESC}b\r\nc\u202ed") == "a\\x1b]0;owned\\x07\\x1b[2J\\x1b[31mb\\r\\nc\\u202ed"
    assert printable("é ε ✓ 日本") == "é ε ✓ 日本"  # what a terminal shows as it is stays
    assert printable(HUGE, 50) == "A" * 50 + "…"
    assert len(printable("\x1b" * 1000, 50)) == 51


def test_show_prints_stored_escape_sequences_as_text(tmp_path):
    store = ResultStore(tmp_path)
    run_id = record(store, "k", {"defense": f"dpsgd{ESC}", "leakage.ig.state": f"final\r{ESC}"},
                    config={"seed": 0, "defense": {"name": ESC}})
    shown = invoke("show", run_id, "--results", tmp_path)
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.stdout and "\r" not in shown.stdout and "\x07" not in shown.stdout
    assert "defense: dpsgd\\x1b]0;owned\\x07" in shown.stdout


def test_show_caps_a_huge_stored_value_and_json_keeps_it(tmp_path):
    store = ResultStore(tmp_path)
    run_id = record(store, "k", {"leakage.ig.note": HUGE})
    shown = invoke("show", run_id, "--results", tmp_path)
    assert shown.exit_code == 0 and max(map(len, shown.stdout.splitlines())) <= 1020
    assert "  leakage.ig.note: AAAA" in shown.stdout and "A…" in shown.stdout
    whole = invoke("show", run_id, "--results", tmp_path, "--json")
    assert json.loads(whole.stdout)["metrics"]["leakage.ig.note"] == HUGE


def test_the_leaderboard_table_prints_stored_strings_as_text(tmp_path):
    store = ResultStore(tmp_path)
    record(store, "a", {"defense": f"rs{ESC}", "paper.table": ESC, "privacy.delta": 1e-5, "privacy.steps": 10,
                        "privacy.noise_multiplier": 1.0, "privacy.sample_rate": 0.1}, {"seed": 0, "c": 1})
    record(store, "b", {"defense": "rs", "model": HUGE, "paper.table": ESC}, {"seed": 0, "c": 2})
    board = invoke("leaderboard", "--results", tmp_path)
    assert board.exit_code == 0, board.output
    assert "\x1b" not in board.stdout and "rs\\x1b]0;owned" in board.stdout
    assert max(map(len, board.stdout.splitlines())) < 2000  # a 100 KB cell is cut


@pytest.mark.parametrize("args", [
    ["show", HUGE, "--results", "{store}"],
    ["show", "x", "--results", HUGE],
    ["leaderboard", "--results", "{store}", "--sort", HUGE],
    ["leaderboard", "--results", "{store}", "--out", HUGE + ".csv"],
    ["leaderboard", "--results", f"nowhere{ESC}"],
    ["report", "--results", "{store}", "--out", HUGE],
    ["report", "--results", "{store}", "--out", HUGE + ".html"],
    ["run", "--config", HUGE],
    ["run", "--epochs", HUGE],
    ["sweep", HUGE],
], ids=["show-id", "show-results", "leaderboard-sort", "leaderboard-out", "leaderboard-results-escape",
        "report-out-not-html", "report-out-too-long", "run-config", "run-epochs", "sweep-file"])
def test_a_message_quotes_a_huge_or_hostile_input_in_one_short_line(args, tmp_path):
    record(ResultStore(tmp_path / "store"), "k", {})
    result = invoke(*[a.replace("{store}", str(tmp_path / "store")) for a in args])
    (line,) = result.stderr.splitlines()
    assert result.exit_code == 2 and line.startswith("dpeval: error: ") and "Traceback" not in result.output
    assert len(line) <= 1100 and "\x1b" not in line, line[:400]  # at most a line's worth of the input


def test_a_shadow_of_another_game_is_discarded_in_one_short_line(tmp_path, caplog):
    """A shadow's key is the whole game's settings as JSON (about 1.2 KB): the warning that discards a shadow of
    another game quotes both keys short."""
    import torch

    from dpeval.checkpoint import ShadowStore

    game = json.dumps({"spec": {f"setting_{i}": "value" * 5 for i in range(40)}, "k": 16})
    ShadowStore(tmp_path, f"run:{game}").save(0, {"w": torch.zeros(3)})
    with caplog.at_level("WARNING", logger="dpeval"):
        assert ShadowStore(tmp_path, f"run:{game.replace('value', 'other')}").finished(1) == {}
    (warning,) = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
    assert "trains again" in warning and len(warning) < 600


# ---------------------------------------------------------------------------------------------------
# the leaderboard's CSV: no cell starts a spreadsheet formula


FORMULAS = {"paper.source": "=HYPERLINK(\"http://evil\",\"x\")", "paper.table": "+cmd|' /C calc'!A0",
            "paper.row": "-2+3+cmd|' /C calc'!A0", "paper.accuracy_is": "@SUM(1+1)*cmd", "leakage.ig.state": "\t=1+1",
            "defense.mask": "\r=1+1"}


@pytest.mark.parametrize("grouped", [False, True], ids=["runs", "seeds-grouped"])
def test_csv_cells_from_strings_cannot_start_a_formula_and_numbers_stay_numbers(grouped, tmp_path):
    store = ResultStore(tmp_path / "r")
    for seed in (0, 1):
        record(store, f"s{seed}", {**FORMULAS, "seed": seed, "leakage.ig.psnr": -0.5, "leakage.ig.delta": -3,
                                   "leakage.ig.text_number": "-0.5", "privacy.epsilon": -math.inf if seed else 3.0},
               config={"seed": seed, "defense": {"name": "dpsgd", "mask": "\r=1+1"}})
    out = tmp_path / "board.csv"
    result = invoke("leaderboard", "--results", tmp_path / "r", "--out", out, *(["--group-seeds"] if grouped else []))
    assert result.exit_code == 0, result.output
    with out.open(newline="") as handle:
        records = list(csv.DictReader(handle))
    assert records
    for row in records:
        for column, value in FORMULAS.items():
            assert row[column] == "'" + value, (column, row[column])
        assert row["leakage.ig.psnr"] == "-0.5" and row["leakage.ig.delta"] in ("-3", "-3.0")  # a mean when grouped
        assert row["leakage.ig.text_number"] == "-0.5"  # a number stored as text is a number too
    starts = [c for row in records for c in row.values() if c and c[0] in "=+-@\t\r"]
    assert all(is_number_text(c) for c in starts), starts  # only numbers (-0.5, -3, -inf) start so


def is_number_text(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------
# the files report and leaderboard write: never through a link, never over the store or a file not theirs


def small_store(root):
    """Two defenses at two requested ε, two seeds: enough for the ε and matched-ε figures."""
    store = ResultStore(root)
    for defense in ("dpsgd", "rs"):
        for eps in (1.0, 3.0):
            for seed in (0, 1):
                record(store, f"{defense}{eps}{seed}", {"defense": defense, "seed": seed, "privacy.epsilon": eps,
                                                         "utility.test_accuracy": 0.8 + eps / 100 + seed / 1000},
                       config={"seed": seed, "defense": {"name": defense}, "privacy": {"epsilon": eps}})
    return store


def snapshot(root):
    """Every path under ``root``: the hash of a file's bytes (not following links), a link's target."""
    return {p.relative_to(root).as_posix(): f"-> {os.readlink(p)}" if p.is_symlink()
            else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("figure", ["report_matched_epsilon.png", "report_versus_epsilon.svg"])
@pytest.mark.parametrize("kind", ["symlink-to-store", "hardlink-to-store", "symlink-elsewhere", "someone-elses-file"])
def test_report_writes_no_figure_over_a_file_that_is_not_its_own(kind, figure, tmp_path):
    small_store(tmp_path / "r")
    (tmp_path / "notes.txt").write_text("mine\n")
    planted = tmp_path / figure
    if kind == "symlink-to-store":
        planted.symlink_to(tmp_path / "r" / "results.sqlite")
    elif kind == "hardlink-to-store":
        os.link(tmp_path / "r" / "results.sqlite", planted)
    elif kind == "symlink-elsewhere":
        planted.symlink_to(tmp_path / "notes.txt")
    else:
        planted.write_bytes(b"\x89PNG\r\n\x1a\n a picture of mine, not a report's")
    before = snapshot(tmp_path)
    result = invoke("report", "--results", tmp_path / "r", "--out", tmp_path / "report.html")
    (line,) = result.stderr.splitlines()
    assert result.exit_code == 2 and line.startswith("dpeval: error: --out: ") and figure in line, result.output
    assert snapshot(tmp_path) == before  # nothing written: not the store, not the page, no other figure
    assert ResultStore(tmp_path / "r").rows()  # the store still reads


def test_report_replaces_its_own_earlier_files(tmp_path):
    small_store(tmp_path / "r")
    out = tmp_path / "report.html"
    for _ in range(2):
        result = invoke("report", "--results", tmp_path / "r", "--out", out, "--json")
        assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    assert {Path(p).name for p in written["plots"]} == {"report_versus_epsilon.png", "report_matched_epsilon.png"}
    assert all(Path(p).is_file() for p in written["plots"] + written["vector"]) and out.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("command", ["report", "leaderboard"])
def test_out_itself_is_never_written_through_a_link(command, tmp_path):
    small_store(tmp_path / "r")
    (tmp_path / "notes.txt").write_text("mine\n")
    out = tmp_path / ("report.html" if command == "report" else "board.csv")
    out.symlink_to(tmp_path / "notes.txt")
    before = snapshot(tmp_path)
    result = invoke(command, "--results", tmp_path / "r", "--out", out)
    (line,) = result.stderr.splitlines()
    assert result.exit_code == 2 and f"--out: {out} is a symbolic link" in line, result.output
    assert snapshot(tmp_path) == before


def test_report_does_not_overwrite_a_page_it_did_not_write(tmp_path):
    small_store(tmp_path / "r")
    out = tmp_path / "index.html"
    out.write_text("<html>my own page</html>")
    result = invoke("report", "--results", tmp_path / "r", "--out", out)
    assert result.exit_code == 2 and "index.html" in result.stderr and out.read_text() == "<html>my own page</html>"


def test_figure_names_made_of_stored_names_stay_beside_the_page(tmp_path):
    """A swept setting or an attack named with / and .. names a figure: its file is still a file beside the page."""
    store = small_store(tmp_path / "r")
    for value in (1, 2):
        record(store, f"odd{value}", {"defense": "rs", "defense.../../x": value, "defense.a/b": value,
                                      "defense.a_b": value, "utility.test_accuracy": 0.5 + value / 10},
               {"seed": 0, "defense": {"name": "rs", "x": value}})
    out = tmp_path / "out" / "report.html"
    result = invoke("report", "--results", tmp_path / "r", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    plots = json.loads(result.stdout)["plots"]
    assert all(Path(p).parent == out.parent.resolve() and Path(p).is_file() for p in plots)
    assert len(set(plots)) == len(plots) and len([p for p in plots if "trend" in p]) == 3, plots
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r"]


# ---------------------------------------------------------------------------------------------------
# the report's page: every string from a store is text


XSS = "<script>alert(1)</script>\"onerror=alert(2) x='<img src=x onerror=alert(3)>"
FILE_XSS = "<svg onload=alert(4)>'\"onerror=alert(5)"  # a file name can hold this
ATTACK_XSS = "<i onmouseover=alert(6)>a</i>"  # an attack name (no dot) from a stored key
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "div", "p", "ul", "li", "b", "table",
             "thead", "tbody", "tr", "th", "td", "img", "figure", "figcaption"}
PAGE_ATTRIBUTES = {"lang", "charset", "class", "title", "alt", "src"}


class Markup(html.parser.HTMLParser):
    """The elements and attributes of a page, and its text."""

    def __init__(self):
        super().__init__()
        self.tags, self.attributes, self.text = set(), [], []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes += attrs

    def handle_data(self, data):
        self.text.append(data)


def hostile_store(root):
    """Two configurations × two seeds whose every string the page shows carries markup: names, settings (a
    common one and a swept one, and a setting whose name is markup), the worst state, recipe references, an
    attack named by a stored key, artefact paths that are missing or damaged, a picture's seed."""
    store = ResultStore(root)
    for value in (1, 2):
        for seed in (0, 1):
            run_id = store.begin(f"x{value}{seed}".ljust(16, "x"), {
                "seed": seed, "defense": {"name": XSS, "mask": f"{XSS}{value}"}, "train": {"optimizer": XSS}})
            folder = store.run_dir(run_id)
            (folder / f"{FILE_XSS}.json").write_text("{not json")
            Image.fromarray(np.full((8, 8), 9 * value + seed, np.uint8)).save(folder / "picture.png")
            store.finish(run_id, {
                "run_id": run_id, "dataset": XSS, "model": XSS, "defense": XSS, "attack": "ig", "seed": seed,
                "defense.mask": f"{XSS}{value}", f"defense.{XSS}": value, "privacy.epsilon": 3.0,
                "privacy.delta": 1e-5, "utility.test_accuracy": 0.8 + value / 100 + seed / 1000,
                "leakage.ig.psnr": 20.0 + value, "leakage.ig.baseline_psnr": 12.0, "leakage.ig.verdict": "leaks",
                "leakage.ig.state": XSS, "leakage.ig.p_value": 0.01, f"leakage.{ATTACK_XSS}.verdict": "leaks",
                f"leakage.{ATTACK_XSS}.auc": 0.6, "paper.source": XSS, "paper.table": XSS, "paper.row": XSS,
                "paper.test_accuracy": 0.8, "paper.accuracy_is": XSS, "artefacts.ig.png": f"runs/{run_id}/picture.png",
                f"artefacts.{ATTACK_XSS}.roc": f"runs/{run_id}/{FILE_XSS}.json",
                "artefacts.ig.missing": f"runs/{run_id}/{XSS}.png"})


def test_the_page_shows_every_stored_string_as_text(tmp_path):
    hostile_store(tmp_path / "r")
    out = tmp_path / "report.html"
    result = invoke("report", "--results", tmp_path / "r", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    page = out.read_text()
    markup = Markup()
    markup.feed(page)
    assert markup.tags <= PAGE_TAGS, markup.tags - PAGE_TAGS
    assert {name for name, _ in markup.attributes} <= PAGE_ATTRIBUTES, markup.attributes
    assert all(value.startswith("data:image/png;base64,") for name, value in markup.attributes if name == "src")
    assert "<script" not in page.lower() and "<svg" not in page.lower() and "<i " not in page
    shown = "".join(markup.text)
    for where in (f"All runs: dataset {XSS}, model {XSS}, defense {XSS}", f"{XSS}1", f"{FILE_XSS}.json",
                  f"{ATTACK_XSS} verdict", f"artefacts.{ATTACK_XSS}.roc = ", f"/{XSS}.png",
                  f"{XSS} ({XSS}, {XSS}): best of 2 DP", f"ig — {XSS}=1, mask={XSS}1, seed 0",
                  f"Accuracy and leakage vs defense.{XSS}"):
        assert where in shown, where
    assert XSS in "".join(value for name, value in markup.attributes if name == "title")  # a header's raw key
    for svg in tmp_path.glob("report_*.svg"):  # a figure opened on its own is inert too
        tree = ElementTree.parse(svg)
        assert not [e for e in tree.iter() if e.tag.endswith("script")
                    or any(a.lower().startswith("on") for a in e.attrib)], svg



def test_a_stored_verdict_that_is_not_one_marks_its_run_damaged(tmp_path):
    """A verdict field holding anything but a verdict (markup, a number) made leaderboard and report fail with a
    traceback; the run is now a damaged record: left out with one note, shown by show with what is wrong."""
    store = ResultStore(tmp_path / "r")
    record(store, "good", {"leakage.ig.psnr": 20.0, "leakage.ig.verdict": "leaks"})
    bad = record(store, "bad", {"leakage.ig.psnr": 21.0, "leakage.ig.verdict": XSS}, {"seed": 1})
    for args in (["leaderboard"], ["leaderboard", "--group-seeds"], ["report", "--out", tmp_path / "r.html"]):
        result = invoke(*args, "--results", tmp_path / "r")
        assert result.exit_code == 0, (args, result.output)
        (note,) = result.stderr.splitlines()
        assert note.startswith("dpeval: note: left out 1 run(s) whose stored record is damaged") and bad in note
    shown = invoke("show", bad, "--results", tmp_path / "r")
    assert shown.exit_code == 0 and "damaged: leakage.ig.verdict = '<script>" in shown.stdout


# ---------------------------------------------------------------------------------------------------
# a run without a test set (data.test_fraction = 0): accuracy is n/a, never a division by zero


def no_test_set_store(root, with_test_set=False):
    """dpsgd at two ε and a non-private baseline, two seeds, each run without a test set (test accuracy NaN, as
    training records it, and per-epoch accuracy NaN); ``with_test_set`` adds an rs configuration that has one."""
    store = ResultStore(root)
    defenses = [("dpsgd", 1.0), ("dpsgd", 3.0), ("none", None)] + ([("rs", 3.0)] if with_test_set else [])
    for defense, eps in defenses:
        for seed in (0, 1):
            measured = defense == "rs"
            acc = 0.8 + seed / 100 if measured else math.nan
            record(store, f"{defense}{eps}{seed}", {
                "defense": defense, "seed": seed, "privacy.epsilon": eps or math.inf, "privacy.delta": 1e-5,
                "privacy.noise_multiplier": 1.0, "privacy.sample_rate": 0.1, "privacy.steps": 10,
                "data.test_size": 100 if measured else 0, "utility.test_accuracy": acc,
                "utility.test_accuracy_by_epoch": [acc, acc], "utility.train_loss_by_epoch": [2.0, 1.0],
                "leakage.lira.auc": 0.6 + seed / 100, "leakage.lira.verdict": "leaks"},
                   config={"seed": seed, "defense": {"name": defense}, "privacy": {"epsilon": eps},
                           "data": {"name": "digits", "test_fraction": 0.2 if measured else 0}})


@pytest.mark.parametrize("mixed", [False, True], ids=["no-run-has-one", "some-runs-have-one"])
def test_report_on_runs_without_a_test_set_says_so(mixed, tmp_path):
    no_test_set_store(tmp_path / "r", with_test_set=mixed)
    out = tmp_path / "report.html"
    result = invoke("report", "--results", tmp_path / "r", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    page = out.read_text()
    summary = page.split("<h2>Summary</h2>", 1)[1].split("<h2>", 1)[0]
    assert "no test set" in summary.lower() and "nan" not in summary.lower()
    table = page.split("<table>", 1)[1].split("</table>", 1)[0]
    assert "n/a" in table and ">nan<" not in table
    if mixed:
        assert "1/100 = 0.01" in summary and "most accurate rs" in summary


def test_leaderboard_on_runs_without_a_test_set(tmp_path):
    no_test_set_store(tmp_path / "r", with_test_set=True)
    for grouped in ([], ["--group-seeds"]):
        board = invoke("leaderboard", "--results", tmp_path / "r", "--json", *grouped)
        assert board.exit_code == 0, board.output
        records = json.loads(board.stdout.replace("NaN", "null"))
        # without an accuracy a configuration is on no utility–leakage front (it used to be on every one)
        assert {r["defense"] for r in records if r.get("pareto.lira")} <= {"rs"}
        assert all(r.get("utility.best_test_accuracy") is None for r in records if r["defense"] != "rs")
    table = invoke("leaderboard", "--results", tmp_path / "r", "--group-seeds")
    assert table.exit_code == 0 and "n/a" in table.stdout and "nan" not in table.stdout


# ---------------------------------------------------------------------------------------------------
# a large store lists fast: the cached accountant curves give exactly what computing every run's gives


def test_the_cached_accountant_curve_is_the_accountants_own():
    from opacus.accountants.analysis.rdp import compute_rdp

    from dpeval.core.accounting import RDP_ORDERS, gaussian_rdp

    for sigma, q, steps in [(2.275, 0.1017, 180), (2.275, 0.1017, 181), (0.7, 0.01, 3000), (1.0, 1.0, 5),
                            (4.0, 0.0, 10), (2.275, 0.1017, 180)]:
        expected = [float(v) for v in compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(RDP_ORDERS))]
        assert gaussian_rdp(sigma, q, steps) == expected  # bit for bit, also from the cache


def uncached_rdp(noise_multiplier, sample_rate, steps):
    from opacus.accountants.analysis.rdp import compute_rdp

    from dpeval.core.accounting import RDP_ORDERS

    return [float(v) for v in compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps,
                                          orders=list(RDP_ORDERS))]


def selection_store(root):
    """Two recipe cells and a plain grid, DP runs with σ, q, T (so random stopping is priced), seeds, a baseline."""
    store = ResultStore(root)
    for cell, clips in (("A", (0.5, 1.0)), ("B", (0.5, 1.0, 2.0)), (None, (1.0, 3.0))):
        for clip in clips:
            for seed in (0, 1):
                paper = {"paper.table": "Table 1", "paper.row": cell} if cell else {}
                record(store, f"{cell}{clip}{seed}", {
                    "defense": "dpsgd", "seed": seed, "defense.clip": clip, "privacy.epsilon": 2.0 + clip,
                    "privacy.delta": 1e-5, "privacy.noise_multiplier": 1.0 + clip / 3, "privacy.sample_rate": 0.02,
                    "privacy.steps": 500 + 100 * seed, "utility.test_accuracy": 0.7 + clip / 10 + seed / 100,
                    "leakage.lira.auc": 0.55 + clip / 100, **paper},
                       {"seed": seed, "defense": {"name": "dpsgd", "clip": clip}, "paper": cell})
    record(store, "none", {"defense": "none", "privacy.epsilon": math.inf}, {"seed": 0, "defense": "none"})


def test_leaderboard_and_report_read_the_same_with_and_without_the_cache(tmp_path, monkeypatch):
    selection_store(tmp_path / "r")

    def outputs(tag):
        board = invoke("leaderboard", "--results", tmp_path / "r", "--group-seeds")
        csv_out = tmp_path / f"{tag}.csv"
        assert invoke("leaderboard", "--results", tmp_path / "r", "--out", csv_out).exit_code == 0
        page = tmp_path / tag / "report.html"
        assert invoke("report", "--results", tmp_path / "r", "--out", page).exit_code == 0
        return board.stdout, csv_out.read_text(), page.read_text()

    cached = outputs("cached")
    assert "random number of trials" in cached[0] and cached[0].count("best of") == 3
    monkeypatch.setattr("dpeval.leaderboard.gaussian_rdp", uncached_rdp)
    assert outputs("uncached") == cached


def test_the_pareto_sweep_marks_what_comparing_every_pair_marks():
    import random

    from dpeval.leaderboard import dominated_points

    rng = random.Random(0)
    for _ in range(300):
        values = [0.5, 0.6, 0.7, -math.inf, math.inf, math.nan, 0.65]
        points = [(rng.choice([0.8, 0.85, 0.9, 0.95]), rng.choice(values)) for _ in range(rng.randint(0, 12))]
        pairwise = [any(a2 >= a and l2 <= leak and (a2 > a or l2 < leak) for a2, l2 in points) for a, leak in points]
        assert dominated_points(points) == pairwise, points


def test_a_figure_of_more_configurations_than_it_tells_apart_is_named_not_drawn(tmp_path, monkeypatch):
    for drawing in ("labels", "figures", "artefact_figures", "leaking_records"):  # each module reads the limit
        monkeypatch.setattr(f"dpeval.report.{drawing}.MAX_DRAWN", 1)
    small_store(tmp_path / "r")
    out = tmp_path / "report.html"
    result = invoke("report", "--results", tmp_path / "r", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plots"] == []
    page = out.read_text()
    assert "<h2>Figures not drawn</h2>" in page and page.count("the leaderboard lists them all") == 2
    assert "Accuracy and leakage vs ε: not drawn: 2 configurations" in page
    assert page.split("<tbody>", 1)[1].count("<tr>") == 4  # the table keeps every configuration


def test_the_scale_benchmark_builds_a_store_like_a_sweeps(tmp_path):
    """bench/store_scale.py's synthetic rows: recorded through the store, a run key each, recipe cells and grids
    whose selection is priced (random stopping included), seeds grouped five to a configuration."""
    import importlib.util

    from dpeval import leaderboard as lb

    path = Path(__file__).resolve().parents[2] / "bench" / "store_scale.py"
    spec = importlib.util.spec_from_file_location("store_scale", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.build(tmp_path, 70)
    rows = ResultStore(tmp_path).rows()
    assert len(rows) == 70 and len({r["run_key"] for r in rows}) == 70 and not any(r.get("damaged") for r in rows)
    grouped = lb.leaderboard(ResultStore(tmp_path).results(), seeds_grouped=True)
    assert {g["n"] for g in grouped} == {5} and len(grouped) == 14
    costs = lb.selection_costs(ResultStore(tmp_path).results())
    assert costs and all("random_stopping" in c for c in costs.values())
    recipe = next(paper for _, paper in bench.configurations() if paper)  # every other study (the second on)
    assert {"paper.source", "paper.table", "paper.row"} <= recipe.keys()
