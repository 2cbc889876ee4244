"""bench/benchmark_page.py: the benchmark page from a leaderboard export — a row per defense and ε (utility over
seeds, the seed-0 attacks online and offline), and the readings against DP-SGD with their intervals."""

from __future__ import annotations

from tests.helpers import load_bench_script, write_rows_csv

benchmark_page = load_bench_script("benchmark_page")


def run(defense, eps, seed, acc, lira_auc=None, online=True, groups="", train_s=60.0):
    row = {"status": "done", "defense": defense, "defense.groups": groups, "privacy.epsilon": eps * 0.998,
           "privacy.target_epsilon": eps, "seed": seed, "utility.test_accuracy": acc, "train.epochs": 30,
           "time.train_s": train_s, "comm.density": 0.55 if defense == "rs" else 1.0}
    if lira_auc is not None:
        row |= {"attack.lira.online": str(online), "leakage.lira.auc": lira_auc,
                "leakage.lira.auc_ci_low": lira_auc - 0.01, "leakage.lira.auc_ci_high": lira_auc + 0.01,
                "leakage.lira.epsilon_lower_bound": 0.4, "leakage.ig.init.psnr": 11.0,
                "leakage.ig.final.psnr": 9.0, "leakage.ig.baseline_psnr": 10.0}
    return row


def cells(tmp_path, rows):
    write_rows_csv(tmp_path / "board.csv", rows)
    return benchmark_page.cells(benchmark_page.read(tmp_path / "board.csv"))


def test_a_row_per_defense_and_epsilon_with_utility_over_seeds_and_the_seed_0_attacks(tmp_path):
    rows = [run("dpsgd", 3.0, 0, 0.80, 0.52), run("dpsgd", 3.0, 0, 0.80, 0.53, online=False),
            run("dpsgd", 3.0, 1, 0.82), run("dpsgd", 3.0, 2, 0.84),
            run("groupwise", 3.0, 0, 0.70, 0.51, groups="layer"), run("none", float("inf"), 0, 0.9, 0.70)]
    all_cells = cells(tmp_path, rows)
    assert list(all_cells) == [("none", float("inf")), ("dpsgd", 3.0), ("groupwise (layer)", 3.0)]
    text = benchmark_page.table(all_cells)
    dpsgd = next(line for line in text.splitlines() if line.startswith("| dpsgd"))
    assert "| 3 | 82.0 ± 1.2 (3) |" in dpsgd  # the online and offline points are one victim: seed 0 counted once
    assert "0.520 [0.510, 0.530]" in dpsgd and "0.530 [0.520, 0.540]" in dpsgd  # online, then offline
    assert "0.40 / 6" in dpsgd and "11.0 / 9.0 (10.0)" in dpsgd
    assert "| 2.0 |" in dpsgd  # s / epoch from the utility-only runs


def test_readings_resolve_only_what_the_intervals_separate(tmp_path):
    rows = [run("dpsgd", 3.0, s, a, 0.52 if s == 0 else None) for s, a in enumerate((0.80, 0.81, 0.82))]
    rows += [run("rs", 3.0, s, a, 0.60 if s == 0 else None) for s, a in enumerate((0.90, 0.91, 0.92))]
    rows += [run("random-freeze", 3.0, s, a, 0.525 if s == 0 else None) for s, a in enumerate((0.79, 0.83, 0.81))]
    rows += [run("gep", 3.0, s, a, 0.51 if s == 0 else None, train_s=60.0 if s == 0 else 390.0)
             for s, a in enumerate((0.85, 0.86, 0.87))]
    text = benchmark_page.readings(cells(tmp_path, rows))
    rs = next(line for line in text.splitlines() if "**rs" in line)
    assert "utility +10.0 points" in rs and "(resolved)" in rs and "AUC 0.600 vs 0.520 (resolved)" in rs
    assert "density 0.55" in rs and "1.0× DP-SGD's training time per epoch" in rs
    # the cost: utility-only runs' time per epoch (the attack run's includes its shadows), against DP-SGD's
    assert "6.5× DP-SGD's training time per epoch" in next(line for line in text.splitlines() if "**gep" in line)
    rf = next(line for line in text.splitlines() if "**random-freeze" in line)
    assert "(not resolved)" in rf and "intervals overlap: not resolved" in rf


def test_the_one_run_audit_joins_its_row(tmp_path):
    """Each audit JSON (the name carries the ε the row was calibrated for) becomes a CSV row and the table's audit
    column of that defense and ε only; a row without an audit shows a dash."""
    import json

    audits = tmp_path / "audits"
    audits.mkdir()
    for name, eps, bound, verdict in [("dpsgd", 3.0, 0.25, "PASS"), ("groupwise", 8.0, 9.5, "FAIL")]:
        (audits / f"{name}-eps{eps}.json").write_text(json.dumps({
            "defense": name, "defense.groups": "layer" if name == "groupwise" else None,
            "privacy.epsilon": eps * 0.998, "audit.epsilon_lower_bound": bound, "audit.verdict": verdict,
            "audit.guesses": 200, "audit.correct": 130, "audit.canaries": 1000, "utility.test_accuracy": 0.7,
            "time.audit_s": 90.0}))
    out = tmp_path / "audit.csv"
    benchmark_page.export_audits(audits, out)
    all_cells = cells(tmp_path, [run("dpsgd", 3.0, 0, 0.8), run("dpsgd", 8.0, 0, 0.85),
                                 run("groupwise", 8.0, 0, 0.84, groups="layer")])
    benchmark_page.attach_audits(all_cells, benchmark_page.read(out))
    header, _, *rows = benchmark_page.table(all_cells).splitlines()
    column = [c.strip() for c in header.split("|")].index("one-run audit ε_LB: counting / f-DP / Gaussian pair")
    got = {tuple(c.strip() for c in row.split("|")[1:3]): row.split("|")[column].strip() for row in rows}
    assert got == {("dpsgd", "3"): "0.25 PASS", ("dpsgd", "8"): "–", ("groupwise (layer)", "8"): "9.50 FAIL"}


def test_the_audit_column_shows_every_estimator_and_a_refused_pair_in_brackets(tmp_path):
    import json

    audits = tmp_path / "audits"
    audits.mkdir()
    for name, valid in [("dpsgd", True), ("rs", False)]:
        bounds = {"counting": {"epsilon_lower_bound": 0.5, "mu_lower_bound": None, "valid": True},
                  "f-dp": {"epsilon_lower_bound": 0.8, "mu_lower_bound": 0.2, "valid": True},
                  "gaussian-pair": {"epsilon_lower_bound": 1.9, "mu_lower_bound": 0.5, "valid": valid}}
        (audits / f"{name}-eps3.0.json").write_text(json.dumps({
            "defense": name, "privacy.epsilon": 2.99, "audit.epsilon_lower_bound": 1.9 if valid else 0.8,
            "audit.estimator": "gaussian-pair" if valid else "f-dp", "audit.bounds": bounds, "audit.verdict": "PASS",
            "audit.guesses": 200, "audit.correct": 130, "audit.canaries": 1000, "time.audit_s": 90.0}))
    out = tmp_path / "audit.csv"
    benchmark_page.export_audits(audits, out)
    rows = {r["defense"]: r for r in benchmark_page.read(out)}
    assert rows["dpsgd"]["audit.fdp_mu"] == "0.2" and rows["rs"]["audit.pair_valid"] == "False"
    all_cells = cells(tmp_path, [run("dpsgd", 3.0, 0, 0.8), run("rs", 3.0, 0, 0.8)])
    benchmark_page.attach_audits(all_cells, benchmark_page.read(out))
    got = [benchmark_page.audit(c) for c in all_cells.values()]
    assert got == ["0.50 / 0.80 / 1.90 PASS", "0.50 / 0.80 / (1.90) PASS"]


def test_export_reads_a_real_results_folder(tmp_path):
    """--export on a folder written by dpeval itself: the leaderboard CSV (one row per run, no artefact paths) and
    the audits' CSV; the page then renders from those files alone."""
    import csv
    import json

    from click.testing import CliRunner

    from dpeval.cli import main

    results, docs = tmp_path / "results", tmp_path / "docs"
    for seed in ("0", "1"):
        done = CliRunner().invoke(main, ["run", "--defense", "dpsgd", "--epochs", "1", "--seed", seed,
                                         "--results", str(results), "--quiet"])
        assert done.exit_code == 0, done.output
    (results / "audits").mkdir()
    (results / "audits" / "dpsgd-eps3.0.json").write_text(json.dumps(
        {"defense": "dpsgd", "audit.epsilon_lower_bound": 0.3, "audit.verdict": "PASS"}))
    files = benchmark_page.Files(docs)
    files.csv.parent.mkdir(parents=True)
    files.page.write_text("<!-- benchmark-table:start -->\n<!-- benchmark-table:end -->\n")
    benchmark_page.export(results, files)
    with files.csv.open() as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["seed"] for r in rows) == ["0", "1"] and {r["defense"] for r in rows} == {"dpsgd"}
    assert not any(c.startswith("artefacts.") for c in rows[0])
    with files.audit.open() as f:
        assert [(r["defense"], r["privacy.target_epsilon"], r["audit.verdict"]) for r in csv.DictReader(f)] == [
            ("dpsgd", "3.0", "PASS")]
    all_cells = benchmark_page.cells(benchmark_page.read(files.csv))
    assert [c.accuracy.keys() for c in all_cells.values()] == [{0, 1}]


def test_an_incomplete_benchmark_says_how_much_it_holds(tmp_path):
    partial = [run("none", float("inf"), 0, 0.85, 0.63), run("dpsgd", 1.0, 0, 0.73, 0.50)]
    assert "2 of the 22 planned rows attacked, 0 with utility at three seeds" in benchmark_page.progress(
        cells(tmp_path, partial))
    names = ["dpsgd", "rs", "random-freeze", "gep", "adaclip", ("groupwise", "all"), ("groupwise", "layer")]
    full = [run("none", float("inf"), s, 0.85, 0.63 if s == 0 else None) for s in range(3)]
    for name in names:
        defense, groups = name if isinstance(name, tuple) else (name, "")
        full += [run(defense, eps, s, 0.7, 0.5 if s == 0 else None, groups=groups)
                 for eps in (1.0, 3.0, 8.0) for s in range(3)]
    assert benchmark_page.progress(cells(tmp_path, full)) == ""


def test_compute_adds_every_run_and_audit():
    rows = [{"time.train_s": "1800", "time.attack_s": "5400"}, {"time.train_s": "3600", "time.attack_s": ""}]
    assert benchmark_page.compute(rows, [{"time.audit_s": "3600"}]).startswith(
        "Compute: 4.0 h of one thread for these 2 runs and 1 audits")
    assert benchmark_page.compute(rows, [{"time.audit_s": "3600"}]).endswith(
        "≈ 2.0 h of wall time on these 2 cores with `WORKERS=2`.")


def test_the_side_by_side_epoch_costs_replace_the_runs_wall_times(tmp_path):
    """bench/benchmark_epoch.py's CSV (one row per recipe file, CPU s / epoch): the table's s / epoch and each
    reading's cost against DP-SGD come from it, every ε of a row alike (``groupwise-layer`` is ``groupwise (layer)``);
    a row it lacks keeps its runs' wall time, and its cost compares wall time with wall time."""
    rows = [run("dpsgd", eps, s, 0.80 + s / 100, 0.52 if s == 0 else None) for eps in (1.0, 3.0) for s in range(3)]
    rows += [run("groupwise", eps, s, 0.81 + s / 100, 0.52 if s == 0 else None, groups="layer", train_s=900.0)
             for eps in (1.0, 3.0) for s in range(3)]
    rows += [run("rs", 3.0, s, 0.80, 0.52 if s == 0 else None, train_s=120.0) for s in range(3)]
    costs = tmp_path / "epoch.csv"
    costs.write_text("row,cpu_s_per_epoch,x_dpsgd,threads,epsilon,epochs,repeats\n"
                     "dpsgd,2.0,1.0,1,3.0,3,2\ngroupwise-layer,2.5,1.25,1,3.0,3,2\n")
    all_cells = cells(tmp_path, rows)
    benchmark_page.attach_epoch_costs(all_cells, benchmark_page.read(costs))
    header, _, *lines = benchmark_page.table(all_cells).splitlines()
    column = [c.strip() for c in header.split("|")].index("s / epoch")
    got = {tuple(c.strip() for c in line.split("|")[1:3]): line.split("|")[column].strip() for line in lines}
    assert got == {("dpsgd", "1"): "2.0", ("dpsgd", "3"): "2.0", ("groupwise (layer)", "1"): "2.5",
                   ("groupwise (layer)", "3"): "2.5", ("rs", "3"): "4.0"}  # rs: its runs' 120 s / 30 epochs
    text = benchmark_page.readings(all_cells)
    assert all("1.2× DP-SGD's training time per epoch" in line for line in text.splitlines() if "layer" in line)
    # rs, not measured side by side: against DP-SGD's runs' wall time too (120 s vs 60 s), never across the two
    assert "2.0× DP-SGD's training time per epoch" in next(line for line in text.splitlines() if "**rs" in line)


def test_the_summary_counts_what_the_table_resolves(tmp_path):
    rows = [run("none", float("inf"), 0, 0.9, 0.70)]
    rows += [run("dpsgd", 3.0, s, a, 0.52 if s == 0 else None) for s, a in enumerate((0.80, 0.81, 0.82))]
    rows += [run("rs", 3.0, s, a, 0.60 if s == 0 else None) for s, a in enumerate((0.90, 0.91, 0.92))]
    rows += [run("random-freeze", 3.0, s, a, 0.525 if s == 0 else None) for s, a in enumerate((0.79, 0.83, 0.81))]
    rows += [run("gep", 3.0, s, a, 0.51 if s == 0 else None, train_s=60.0 if s == 0 else 390.0)
             for s, a in enumerate((0.70, 0.71, 0.72))]
    all_cells = cells(tmp_path, rows)
    all_cells[("rs", 3.0)].online["leakage.ig.init.psnr"] = "9.5"  # below the guess (10.0) at every state
    all_cells[("rs", 3.0)].online["leakage.ig.final.psnr"] = "8.0"
    all_cells[("dpsgd", 3.0)].audit = {"audit.verdict": "PASS"}
    all_cells[("rs", 3.0)].audit = {"audit.verdict": "FAIL"}
    text = benchmark_page.summary(all_cells)
    assert "AUC 0.700 [0.690, 0.710]" in text and "the 4 private rows lie at AUC 0.510 to 0.600" in text
    assert "1 of 3 defense rows resolve a different online-LiRA AUC (rs at ε = 3)" in text
    assert "resolved better: rs at ε = 3 (+10.0); resolved worse: gep at ε = 3 (-10.0)" in text
    assert "beats its data-free guess on 3 of 4 private rows (on the undefended release: yes)" in text
    assert "1 of 2 one-run audits PASS" in text
    assert "gep 6.5× DP-SGD, every other defense 1.0–1.0×" in text
    assert "Informed reconstruction" not in text  # no informed rows yet: no line
    text = benchmark_page.summary(all_cells, [informed("dpsgd", 3.0, 0.13, 0.26), informed("rs", 3.0, 0.39, 0.26),
                                              informed("gep", 3.0, 0.9, 0.26, check="FAIL", p=1e-9)])
    assert "its bound 1 − f(1/n) held on 2 of 3 private rows; success 50%–346% of the bound" in text


def test_the_summary_of_an_unresolved_table_says_so(tmp_path):
    rows = [run("dpsgd", 3.0, s, a, 0.52 if s == 0 else None) for s, a in enumerate((0.80, 0.81, 0.82))]
    rows += [run("rs", 3.0, s, a, 0.525 if s == 0 else None) for s, a in enumerate((0.79, 0.83, 0.81))]
    text = benchmark_page.summary(cells(tmp_path, rows))
    assert "0 of 1 defense rows resolve a different online-LiRA AUC: no defense's leakage" in text
    assert "resolved better: none; resolved worse: none" in text
    assert benchmark_page.summary(cells(tmp_path, [run("dpsgd", 3.0, 1, 0.8)])) == "- (no private row attacked yet)"


def informed(defense, eps, success, bound, check="PASS", p=0.5):
    return {"defense": defense, "privacy.target_epsilon": eps, "privacy.epsilon": eps * 0.998,
            "privacy.noise_multiplier": 1.0, "leakage.informed-recon.success": success,
            "leakage.informed-recon.success_ci_low": success - 0.05, "leakage.informed-recon.success_ci_high":
            success + 0.05, "leakage.informed-recon.success_linear": success, "leakage.informed-recon.bound": bound,
            "leakage.informed-recon.bound_rdp": bound + 0.05, "leakage.informed-recon.bound_dp": bound + 0.3,
            "leakage.informed-recon.chance": 0.1, "leakage.informed-recon.bound_check": check,
            "leakage.informed-recon.bound_p_value": p, "leakage.informed-recon.empirical_mu": 0.1,
            "leakage.informed-recon.accounted_mu": 0.2, "leakage.informed-recon.norm_ratio": 0.9}


def test_the_informed_section_reads_each_defense_against_its_bound(tmp_path):
    write_rows_csv(tmp_path / "informed.csv", [informed("rs", 3.0, 0.2, 0.26), informed("dpsgd", 3.0, 0.23, 0.26),
                                               informed("dpsgd", 1.0, 0.17, 0.15, p=0.23)])
    text = benchmark_page.informed_section(benchmark_page.read(tmp_path / "informed.csv"))
    table = [line for line in text.splitlines() if line.startswith("| dpsgd") or line.startswith("| rs")]
    assert [line.split(" | ")[:2] for line in table] == [["| dpsgd", "1"], ["| dpsgd", "3"], ["| rs", "3"]]
    assert "3 of the 21 private rows measured" in text and "rs ε = 1" in text and "dpsgd ε = 3," not in text
    assert "above it within sampling error (p = 0.23)" in text and "the bound held in every row" in text
    planted = benchmark_page.informed_section([informed("gep", 8.0, 0.9, 0.5, check="FAIL", p=1e-9)])
    assert "FAILED in a row" in planted and "within sampling error" not in planted


def test_audits_exported_in_parts_replace_their_rows_and_keep_the_rest(tmp_path):
    import json

    out = tmp_path / "audit.csv"
    for batch, rows in enumerate([[("dpsgd", 1.0, 0.1), ("rs", 1.0, 0.2)], [("rs", 1.0, 0.7)]]):
        folder = tmp_path / f"audits{batch}"
        folder.mkdir()
        for name, eps, bound in rows:
            (folder / f"{name}-eps{eps}.json").write_text(json.dumps({
                "defense": name, "privacy.epsilon": eps, "audit.epsilon_lower_bound": bound, "audit.verdict": "PASS",
                "audit.guesses": 20, "audit.correct": 13, "audit.canaries": 1000, "time.audit_s": 9.0}))
        benchmark_page.export_audits(folder, out, merge=True)
    got = {r["defense"]: r["audit.epsilon_lower_bound"] for r in benchmark_page.read(out)}
    assert got == {"dpsgd": "0.1", "rs": "0.7"}
