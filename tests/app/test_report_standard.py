"""The standard DP figures and the report's summary: accuracy vs requested ε with the non-private reference,
configurations at matched ε, learning curves, density over training; varying recipe settings in columns and
labels, never in the "all runs" header; identical results flagged; a utility-only folder reported in full."""

import json

from click.testing import CliRunner

from dpeval import leaderboard as lb
from dpeval.cli import main
from dpeval.core.verdicts import Verdict
from dpeval.report.labels import spread_note
from dpeval.store import ResultStore


def utility_store(root, points, seeds=(0, 1), extra=None):
    """Runs without attacks: ``points`` = [(defense, requested ε, train settings)], each at every seed, with
    per-epoch curves and the configuration as the runner stores it (requested ε in the config, accounted ε
    in the metrics)."""
    store = ResultStore(root)
    for defense, eps, train in points:
        for seed in seeds:
            dp = defense != "none"
            config = {"data": {"name": "digits", "root": "./data"}, "defense": {"name": defense},
                      "privacy": {"epsilon": eps}, "train": {"optimizer": "sgd", "lr": 1.0, "epochs": 3, **train},
                      "seed": seed}
            run_id = store.begin(f"{defense}{eps}{train}{seed}".ljust(16, "x"), config)
            acc = (0.95 if not dp else 0.80 + 0.01 * eps + 0.002 * len(defense)) + 0.01 * seed
            density = [1.0, 0.5, 0.1] if defense == "rs" else [1.0, 1.0, 1.0]
            store.finish(run_id, {
                "dataset": "digits", "model": "cnn3", "defense": defense, "attack": "none", "seed": seed,
                "privacy.epsilon": eps * 0.998 if dp else float("inf"), "data.test_size": 359,
                "utility.test_accuracy": acc, "utility.test_accuracy_by_epoch": [acc - 0.2, acc - 0.05, acc],
                "utility.train_loss_by_epoch": [2.2, 1.0, 0.5], "comm.density": sum(density) / 3,
                "comm.density_by_epoch": density, **(extra(defense, eps) if extra else {})})
    return store


def report(results, out):
    result = CliRunner().invoke(main, ["report", "--results", str(results), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_utility_only_folder_gets_the_standard_figures(tmp_path):
    utility_store(tmp_path / "r", [("none", 3.0, {}), ("dpsgd", 1.0, {}), ("dpsgd", 3.0, {}), ("rs", 1.0, {}),
                                   ("rs", 3.0, {})])
    out = tmp_path / "report.html"
    written = report(tmp_path / "r", out)
    names = {p.rsplit("report_", 1)[1] for p in written["plots"]}
    assert names == {"versus_epsilon.png", "matched_epsilon.png", "learning_curves.png", "density.png"}
    versus = (tmp_path / "report_versus_epsilon.svg").read_text()
    assert "requested ε (privacy.epsilon as configured)" in versus
    assert "non-private: none (0.955)" in versus  # the reference line, labelled with its accuracy
    assert "mean ± SEM over 2 seeds" in versus
    assert ">2.994<" not in versus and ">3<" in versus  # ticks at the requested ε, not the accounted one
    curves = (tmp_path / "report_learning_curves.svg").read_text()
    assert "mean training loss" in curves and "test accuracy" in curves
    density = (tmp_path / "report_density.svg").read_text()
    assert "rs, ε=1" in density and "dpsgd" not in density  # only sparsifying defenses
    page = out.read_text()
    assert "<h2>Summary</h2>" in page and "1/359 = 0.0028" in page
    assert "ε = 3: most accurate" in page


def test_varying_recipe_settings_are_columns_and_labels_not_header(tmp_path):
    utility_store(tmp_path / "r", [("none", 3.0, {"optimizer": "adam", "lr": 0.01}), ("rs", 3.0, {}),
                                   ("dpsgd", 3.0, {})], seeds=(0,))
    records = lb.leaderboard(ResultStore(tmp_path / "r").results(), seeds_grouped=True)
    assert {"train.lr", "train.optimizer"} <= set(lb.varying_settings(records))
    assert "privacy.target_epsilon" not in lb.varying_settings(records)  # the none run asks for no ε
    assert "train.momentum" not in next(r for r in records if r["defense"] == "none")  # Adam has none
    out = tmp_path / "report.html"
    report(tmp_path / "r", out)
    page = out.read_text()
    header = page.split("<h2>", 1)[0]
    assert "lr" not in header.split("All runs:")[1] and "optimizer" not in header.split("All runs:")[1]
    assert "epochs 3" in header and "requested ε" not in header  # ε is not common: the none run has none
    assert "n = 1: one seed, no error bars" in page
    assert "The training recipe differs between runs (train.lr, train.optimizer)" in page
    matched = (tmp_path / "report_matched_epsilon.svg").read_text()
    assert "rs, lr=1, optimizer=sgd" in matched and "non-private: none, lr=0.01, optimizer=adam" in matched


def test_identical_results_are_flagged(tmp_path):
    store = utility_store(tmp_path / "r", [("rs", 3.0, {}), ("dpsgd", 3.0, {})], seeds=(0,))
    twin = [r for r in store.rows() if r["metrics"]["defense"] == "rs"][0]
    run_id = store.begin("random-freeze-3", {**twin["config"], "defense": {"name": "random-freeze"}})
    store.finish(run_id, {**twin["metrics"], "defense": "random-freeze"})
    records = {r["defense"]: r for r in lb.leaderboard(store.results(), seeds_grouped=True)}
    assert records["rs"]["identical_results"] == records["random-freeze"]["identical_results"]
    assert "identical_results" not in records["dpsgd"]
    out = tmp_path / "report.html"
    report(tmp_path / "r", out)
    assert "Identical results" in out.read_text()


def test_spread_note_says_n_1_instead_of_sem():
    assert spread_note([{"n": 1}, {"n": 1}]) == "n = 1: one seed, no error bars"
    assert spread_note([{"n": 3}]) == "mean ± SEM over 3 seeds"
    assert "n = 1 points have no bar" in spread_note([{"n": 1}, {"n": 2}])


def test_leakage_vs_epsilon_per_attack_and_paper_markers(tmp_path):
    def extra(defense, eps):
        leak = {"attack": "ig", "attack.ig.targets": 3, "leakage.ig.psnr": 30.0 if defense == "none" else 8 + eps,
                "leakage.ig.baseline_psnr": 11.5, "leakage.ig.p_value": 1.0,
                "leakage.ig.verdict": Verdict.of(defense == "none")}
        return {**leak, "paper.test_accuracy": 0.85} if defense == "dpsgd" else leak

    utility_store(tmp_path / "r", [("none", 3.0, {}), ("dpsgd", 1.0, {}), ("dpsgd", 8.0, {})], extra=extra)
    report(tmp_path / "r", tmp_path / "report.html")
    versus = (tmp_path / "report_versus_epsilon.svg").read_text()
    assert "IG PSNR (dB), higher = more leakage" in versus and "best data-free guess (11.5 dB)" in versus
    assert "non-private: none (30)" in versus  # the non-private leakage as the reference line
    assert "paper's reported accuracy" in versus
    page = (tmp_path / "report.html").read_text()
    assert "<b>ig</b>: leaks in none (leaks)" in page
    assert "with 3 targets × 1 state the smallest p is 1·2^-3 = 0.12 (above 0.05: `leaks` is out of reach)" in page

