"""Leaderboard records: Pareto front per attack, sorting, seed grouping, CSV."""

import csv
import io
import math

import pytest

from dpeval import leaderboard as lb
from dpeval.attacks import ATTACKS
from dpeval.attacks.base import Attack
from dpeval.core.errors import ConfigError
from dpeval.core.verdicts import Verdict
from tests.helpers import typed


def row(run_id, seed, acc, psnr=None, auc=None, rate=0.0):
    metrics = {"dataset": "digits", "defense": "rs", "seed": seed, "defense.final_rate": rate,
               "utility.test_accuracy": acc, "privacy.epsilon": 3.0, "utility.test_accuracy_by_epoch": [acc]}
    if psnr is not None:
        metrics["leakage.ig.psnr"] = psnr
    if auc is not None:
        metrics["leakage.lira.auc"] = auc
    config = {"defense": {"name": "rs", "final_rate": rate}, "seed": seed}
    return {"run_id": run_id, "run_key": run_id, "status": "done", "metrics": metrics, "config": config}


def test_pareto_front_per_attack():
    rows = [row("a", 0, 0.90, psnr=30), row("b", 0, 0.80, psnr=20), row("c", 0, 0.70, psnr=25),  # c dominated by b
            row("d", 0, 0.90, psnr=31), row("e", 0, 0.95, auc=0.6)]
    records = {r["run_id"]: r for r in lb.leaderboard(typed(rows))}
    assert records["a"]["pareto.ig"] and records["b"]["pareto.ig"]
    assert not records["c"]["pareto.ig"] and not records["d"]["pareto.ig"]  # d: same accuracy, more leakage
    assert "pareto.ig" not in records["e"] and records["e"]["pareto.lira"]


@pytest.fixture
def lower_leaks():
    """A plug-in attack whose declared headline (a reconstruction error) leaks more when lower."""

    @ATTACKS.register("mse-probe", "test plug-in: reconstruction MSE, lower = more leakage")
    class MseProbe(Attack):
        headline, higher_leaks = "mse", False

        def run(self, context):
            raise NotImplementedError

    yield "mse-probe"
    ATTACKS.unregister("mse-probe")


def test_lower_mse_means_more_leakage(lower_leaks):
    rows = [row("a", 0, 0.9), row("b", 0, 0.9)]
    rows[0]["metrics"][f"leakage.{lower_leaks}.mse"] = 0.01
    rows[1]["metrics"][f"leakage.{lower_leaks}.mse"] = 0.2
    records = {r["run_id"]: r for r in lb.leaderboard(typed(rows))}
    assert records["b"][f"pareto.{lower_leaks}"] and not records["a"][f"pareto.{lower_leaks}"]
    assert "lower = more leakage" in lb.headline_label(lower_leaks)


def test_only_the_declared_headline_ranks():
    """ig declares PSNR as its headline: its MSE alone puts no run on a Pareto front."""
    rows = [row("a", 0, 0.9), row("b", 0, 0.9)]
    rows[0]["metrics"]["leakage.ig.mse"] = 0.01
    rows[1]["metrics"]["leakage.ig.mse"] = 0.2
    records = {r["run_id"]: r for r in lb.leaderboard(typed(rows))}
    assert "pareto.ig" not in records["a"] and "pareto.ig" not in records["b"]
    assert lb.headline({"leakage.ig.psnr", "leakage.ig.mse"}, "ig") == ("leakage.ig.psnr", True)


def test_sorting_and_unknown_column():
    rows = [row("a", 0, 0.5), row("b", 0, 0.9), row("c", 0, 0.7)]
    assert [r["run_id"] for r in lb.leaderboard(typed(rows), sort="utility.test_accuracy")] == ["a", "c", "b"]
    descending = lb.leaderboard(typed(rows), sort="utility.test_accuracy", descending=True)
    assert [r["run_id"] for r in descending] == ["b", "c", "a"]
    with pytest.raises(ConfigError, match="--sort"):
        lb.leaderboard(typed(rows), sort="nope")


def test_group_seeds_mean_and_sem():
    rows = [row("a", 0, 0.8, rate=0.5), row("b", 1, 0.9, rate=0.5), row("c", 2, 1.0, rate=0.5),
            row("d", 0, 0.3, rate=0.9)]
    groups = sorted(lb.leaderboard(typed(rows), seeds_grouped=True), key=lambda g: g["defense.final_rate"])
    assert [g["n"] for g in groups] == [3, 1]
    assert groups[0]["utility.test_accuracy"] == pytest.approx(0.9)
    assert groups[0]["utility.test_accuracy.sem"] == pytest.approx(0.1 / math.sqrt(3))
    assert groups[0]["defense.final_rate"] == 0.5 and "defense.final_rate.sem" not in groups[0]
    assert groups[0]["seeds"] == "0 1 2"


def test_csv_has_fixed_leading_columns_and_no_lists():
    handle = io.StringIO()
    lb.write_csv(lb.leaderboard(typed([row("a", 0, 0.5, psnr=12.0)])), handle)
    reader = csv.DictReader(io.StringIO(handle.getvalue()))
    assert reader.fieldnames[:8] == ["run_id", "run_key", "status", "dataset", "model", "defense", "attack", "seed"]
    assert "utility.test_accuracy_by_epoch" not in reader.fieldnames
    assert next(reader)["leakage.ig.psnr"] == "12.0"


def test_failed_runs_are_not_on_the_board():
    failed = row("x", 0, 0.1)
    failed["status"] = "failed"
    assert [r["run_id"] for r in lb.leaderboard(typed([row("a", 0, 0.5), failed]))] == ["a"]


def test_results_digest_compares_values_as_stored():
    curve = [0.5, 0.75, math.nan]
    metrics = {"utility.test_accuracy": 0.75, "utility.test_accuracy_by_epoch": curve, "leakage.ig.verdict": "leaks",
               "time.train_s": 3.0, "seed": 0}
    same = {"seed": 1, "time.train_s": 9.0, "leakage.ig.verdict": Verdict.LEAKS,  # another order, time and seed
            "utility.test_accuracy_by_epoch": [0.5, 0.75, float("nan")], "utility.test_accuracy": 0.75}
    assert lb.results_digest(metrics) == lb.results_digest(same)
    for key, value in (("utility.test_accuracy_by_epoch", [0.5, 0.75, 0.7]), ("utility.test_accuracy", 0.7500001),
                       ("leakage.ig.verdict", "no-leak-detected"), ("leakage.ig.psnr", 12.0)):
        assert lb.results_digest({**metrics, key: value}) != lb.results_digest(metrics), key
    assert lb.results_digest({"utility.x": 1}) != lb.results_digest({"utility.x": 1.0})


def test_identical_run_keys_count_once_when_grouping():
    """The same configuration and seed run twice is one observation: n = 2 for seeds 0 and 1, not 3."""
    rows = [row("a", 0, 0.8), row("b", 1, 0.9), row("c", 0, 0.6)]
    rows[2]["run_key"] = rows[0]["run_key"] = "same"
    (group,) = lb.leaderboard(typed(rows), seeds_grouped=True)
    assert group["n"] == 2 and group["seeds"] == "0 1"
    assert group["utility.test_accuracy"] == pytest.approx((0.6 + 0.9) / 2)  # the later run of the two counts


@pytest.mark.parametrize("values", [[0.8, 0.9], [0.91, 0.915, 0.9125], [1e-9, 3e-9, 2e-9, 5e-9, 8e-9],
                                    [1e6 + 0.1, 1e6 + 0.3, 1e6 + 0.2]])
def test_standard_error_matches_exact_arithmetic(values):
    import statistics
    assert lb.standard_error(values) == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-9)


def test_sem_only_where_values_vary():
    rows = [row("a", 0, 0.8, psnr=10.0), row("b", 1, 0.9, psnr=10.0)]
    rows[0]["metrics"]["leakage.ig.defense_rate"] = rows[1]["metrics"]["leakage.ig.defense_rate"] = 0.9
    (group,) = lb.leaderboard(typed(rows), seeds_grouped=True)
    assert "utility.test_accuracy.sem" in group
    assert "leakage.ig.psnr.sem" not in group and "leakage.ig.defense_rate.sem" not in group
    (single,) = lb.leaderboard(typed(rows[:1]), seeds_grouped=True)
    assert not any(c.endswith(".sem") for c in single)


def test_grouped_verdicts_say_how_many_seeds_leak():
    rows = [row(r, s, 0.9, psnr=20.0) for r, s in (("a", 0), ("b", 1), ("c", 2))]
    for r, verdict in zip(rows, (Verdict.LEAKS, Verdict.NO_LEAK, Verdict.NO_LEAK)):
        r["metrics"]["leakage.ig.verdict"] = verdict
    (group,) = lb.leaderboard(typed(rows), seeds_grouped=True)
    assert group["leakage.ig.verdict"] == "mixed (1/3 leak)"
    (agreed,) = lb.leaderboard(typed(rows[1:]), seeds_grouped=True)
    assert agreed["leakage.ig.verdict"] == "no-leak-detected"


def test_no_pareto_mark_inside_the_baseline_noise():
    """Configurations at the data-free baseline tie at "no leakage": none is marked for a PSNR difference
    that lies in the noise, and the most accurate of them still dominates leaking configurations."""
    rows = [row("quiet-a", 0, 0.90, psnr=8.0), row("quiet-b", 0, 0.85, psnr=7.0),
            row("leaky", 0, 0.88, psnr=30.0), row("leaky-best", 0, 0.95, psnr=40.0)]
    for r in rows:
        r["metrics"]["leakage.ig.verdict"] = Verdict.of(r["run_id"].startswith("leaky"))
        r["metrics"]["leakage.ig.baseline_psnr"] = 9.0
    marks = {r["run_id"]: r["pareto.ig"] for r in lb.leaderboard(typed(rows))}
    # quiet-b has less PSNR than quiet-a but is inside the noise: neither is marked; leaky is dominated by
    # quiet-a (more accurate, no detected leakage); leaky-best buys accuracy with leakage: on the front.
    assert marks == {"quiet-a": False, "quiet-b": False, "leaky": False, "leaky-best": True}


def test_without_a_verdict_the_declared_baseline_decides():
    rows = [row("below", 0, 0.95, psnr=8.0), row("above", 0, 0.90, psnr=20.0)]
    for r in rows:
        r["metrics"]["leakage.ig.baseline_psnr"] = 9.0
    marks = {r["run_id"]: r["pareto.ig"] for r in lb.leaderboard(typed(rows))}
    assert marks == {"below": False, "above": False}  # "above" is dominated by a more accurate, non-leaking run
    auc = [row("chance", 0, 0.9, auc=0.49), row("better", 0, 0.95, auc=0.7)]
    marks = {r["run_id"]: r["pareto.lira"] for r in lb.leaderboard(typed(auc))}
    assert marks == {"chance": False, "better": True}  # AUC's chance level 0.5 (declared by its headline)


def test_terminal_table_shows_verdicts_and_swept_attack_settings():
    rows = [row("a", 0, 0.9, psnr=20.0), row("b", 0, 0.8, psnr=10.0)]
    rows[0]["metrics"].update({"leakage.ig.verdict": Verdict.LEAKS, "attack.ig.targets": 6})
    rows[1]["metrics"].update({"leakage.ig.verdict": Verdict.NO_LEAK, "attack.ig.targets": 12})
    text = lb.format_table(lb.leaderboard(typed(rows)))
    assert "leakage.ig.verdict" in text and "no-leak-detected" in text and "attack.ig.targets" in text


def test_a_setting_only_some_records_carry_is_not_a_sweep():
    """A non-private run beside an RS sweep: RS's own settings are not 'varying' because the other run lacks
    them; a value that differs among the runs that carry it is; an explicit null counts as a value."""
    records = [{"defense": "none"},
               {"defense": "rs", "defense.clip": 1.0, "defense.final_rate": 0.5, "attack.lira.shadows": 6},
               {"defense": "rs", "defense.clip": 1.0, "defense.final_rate": 0.9, "attack.lira.shadows": 6},
               {"defense": "rs", "defense.clip": None, "defense.final_rate": 0.9, "attack.lira.shadows": 6}]
    assert lb.varying_settings(records) == ["defense.clip", "defense.final_rate"]
    assert lb.varying_settings(records[:3]) == ["defense.final_rate"]



@pytest.mark.parametrize("values, varies", [([1, 1.0], True), ([1, True], True), ([0.1, 0.1], False),
                                            ([math.nan, float("nan")], False), (["a", "a", "b"], True),
                                            ([None, None], False), ([2, 2, 2], False)])
def test_a_setting_varies_when_its_written_values_differ(values, varies):
    records = [{"defense": "dpsgd", "train.lr": v} for v in values]
    assert (lb.varying_settings(records) == ["train.lr"]) is varies

# ---------------------------------------------------------------------------------------------------
# the price of selecting a configuration on the private data


def dp_row(run_id, seed, clip, acc, eps=3.0, delta=1e-5, dataset="digits"):
    metrics = {"dataset": dataset, "defense": "dpsgd", "seed": seed, "defense.clip": clip,
               "utility.test_accuracy": acc, "privacy.epsilon": eps, "privacy.delta": delta,
               "privacy.noise_multiplier": 2.275, "privacy.accounted_noise_multiplier": 2.275,
               "privacy.sample_rate": 0.1017, "privacy.steps": 180}
    config = {"defense": {"name": "dpsgd", "clip": clip}, "seed": seed, "data": {"name": dataset}}
    return {"run_id": run_id, "run_key": run_id, "status": "done", "metrics": metrics, "config": config}


def test_a_grid_of_twelve_reports_the_selection_cost_in_a_column_and_a_sentence():
    from dpeval.core.accounting import gaussian_rdp, random_stopping_cost

    rows = [dp_row(f"r{i}", 0, 0.1 * (i + 1), 0.80 + 0.01 * i) for i in range(12)]
    baseline = row("none", 0, 0.97)
    baseline["metrics"].update({"defense": "none", "privacy.epsilon": math.inf})
    baseline["config"] = {"defense": {"name": "none"}, "seed": 0}
    records = {r["run_id"]: r for r in lb.leaderboard(typed(rows + [baseline]))}
    best = records["r11"]
    assert best["privacy.selection_configs"] == 12  # the non-private baseline is not a candidate
    assert best["privacy.selection_epsilon"] == pytest.approx(36.0)  # 12 × 3
    assert best["privacy.selection_delta"] == pytest.approx(1.2e-4)  # 12 × 1e-5
    expected = random_stopping_cost(gaussian_rdp(2.275, 0.1017, 180), 12, 1e-5)
    assert best["privacy.selection_epsilon_random_stopping"] == pytest.approx(expected["epsilon"])
    assert 3.0 < best["privacy.selection_epsilon_random_stopping"] < 9.0
    assert "truncated negative binomial" in best["privacy.selection_random_stopping"]
    assert "privacy.selection_epsilon" not in records["none"]
    (sentence,) = lb.selection_sentences(lb.selection_costs(typed(rows + [baseline])))
    assert "best of 12 DP configurations" in sentence and "ε ≤ 3" in sentence
    assert "(36, 0.00012)-DP by composition" in sentence and "E[K] = 12" in sentence
    text = lb.format_table(lb.leaderboard(typed(rows)))
    assert "privacy.selection_epsilon" in text.splitlines()[0]


def test_seeds_of_one_configuration_are_runs_of_one_trial():
    rows = [dp_row("a0", 0, 1.0, 0.9), dp_row("a1", 1, 1.0, 0.91), dp_row("b0", 0, 2.0, 0.92)]
    (cost,) = lb.selection_costs(typed(rows)).values()
    assert cost["configs"] == 2 and cost["runs"] == 3
    assert cost["epsilon"] == pytest.approx(9.0)  # every run on the private data counts
    grouped = lb.leaderboard(typed(rows), seeds_grouped=True)
    assert [g["privacy.selection_epsilon"] for g in grouped] == pytest.approx([9.0, 9.0])


def test_one_configuration_or_separate_datasets_select_nothing():
    assert lb.selection_costs(typed([dp_row("a0", 0, 1.0, 0.9), dp_row("a1", 1, 1.0, 0.9)])) == {}
    assert lb.selection_costs(typed([dp_row("a", 0, 1.0, 0.9), dp_row("b", 0, 2.0, 0.9, dataset="cifar10")])) == {}
    assert "privacy.selection_epsilon" not in lb.leaderboard(typed([dp_row("a", 0, 1.0, 0.9)]))[0]


def test_without_sigma_only_composition_is_reported():
    rows = [row("a", 0, 0.9, rate=0.5), row("b", 0, 0.8, rate=0.9)]  # ε = 3 but no σ, q, T recorded
    (cost,) = lb.selection_costs(typed(rows)).values()
    assert cost["epsilon"] == pytest.approx(6.0) and "random_stopping" not in cost
    (sentence,) = lb.selection_sentences({"digits": cost})
    assert "by composition." in sentence and "random" not in sentence


def test_each_recipe_cell_is_priced_on_its_own_grid():
    """Two tuned cells of one paper table in one results folder (as the AdaCliP tables run): each cell's best is
    chosen among its own configurations, so each is priced on its own grid, not on both."""
    cells = {"Abadi et al; ε = 1": [1.0, 2.0], "AdaCliP; ε = 1": [1.0, 2.0, 3.0]}
    rows = []
    for cell, clips in cells.items():
        for clip in clips:
            r = dp_row(f"{cell}-{clip}", 0, clip, 0.9)
            r["metrics"].update({"paper.table": "Table 1", "paper.row": cell})
            r["run_key"] = f"{cell}-{clip}"
            rows.append(r)
    costs = lb.selection_costs(typed(rows))
    assert sorted(c["configs"] for c in costs.values()) == [2, 3]
    assert any("Table 1, AdaCliP; ε = 1" in line and "best of 3" in line for line in lb.selection_sentences(costs))
    records = {r["run_id"]: r for r in lb.leaderboard(typed(rows))}
    assert records["AdaCliP; ε = 1-1.0"]["privacy.selection_configs"] == 3
    assert records["Abadi et al; ε = 1-2.0"]["privacy.selection_epsilon"] == pytest.approx(6.0)


def test_model_settings_are_columns_and_a_swept_one_is_named():
    """A grid over a model setting (the DP-PCA's share) shows it as a column and names it among the swept settings;
    settings left at null and a PCA that is off are no columns."""
    from dpeval.config import build_spec

    with_pca = build_spec({"model": {"name": "mlp", "width": 1000, "pca": {"dims": 60, "epsilon_share": 0.5}}})
    flat = lb.setting_columns(with_pca.canonical(), dp=True)
    assert flat["model.width"] == 1000 and flat["model.pca.epsilon_share"] == 0.5 and "model.name" not in flat
    assert "model.depth" not in flat
    plain = lb.setting_columns(build_spec({"model": {"name": "mlp"}}).canonical(), dp=True)
    assert not any(k.startswith("model.") for k in plain)
    other = dict(flat, **{"model.pca.epsilon_share": 0.1})
    assert "model.pca.epsilon_share" in lb.varying_settings([flat, other])
