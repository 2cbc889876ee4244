"""bench/membership_table.py: the three membership checks docs/membership.md publishes, read both ways."""

from __future__ import annotations

from tests.helpers import load_bench_script, write_rows_csv

membership_table = load_bench_script("membership_table")


def run(key, defense, eps, online, lira_auc, lira_tpr, eps_lb=0.0, members=5000):
    row = {"run_key": key, "status": "done", "defense": defense, "privacy.epsilon": eps,
           "utility.test_accuracy": 0.8, "attack.lira.online": str(online), "attack.rmia.online": str(online)}
    for attack, auc, tpr in (("lira", lira_auc, lira_tpr), ("rmia", 0.52, 0.001), ("loss", 0.51, 0.001)):
        row |= {f"leakage.{attack}.auc": auc, f"leakage.{attack}.auc_ci_low": auc - 0.01,
                f"leakage.{attack}.auc_ci_high": auc + 0.01, f"leakage.{attack}.tpr_at_0.1pct_fpr": tpr,
                f"leakage.{attack}.tpr_at_1pct_fpr": 0.02, f"leakage.{attack}.epsilon_lower_bound": eps_lb,
                f"leakage.{attack}.n_members": members, f"leakage.{attack}.verdict": "leaks"}
    return row


def table(tmp_path, rows) -> str:
    write_rows_csv(tmp_path / "board.csv", rows)
    return membership_table.table(membership_table.runs(tmp_path / "board.csv"))


def test_checks_hold(tmp_path):
    text = table(tmp_path, [run("a", "none", "inf", True, 0.60, 0.010), run("b", "none", "inf", False, 0.58, 0.006),
                            run("c", "dpsgd", 1.0, True, 0.50, 0.001, eps_lb=1.5)])
    assert "Online LiRA ≥ offline on the non-private victim: holds (AUC 0.600 vs 0.580" in text
    assert "Every DP run's ε lower bound ≤ 2ε: holds (largest over the attacks: dpsgd ε = 1: 1.50)" in text
    assert "above 0.1 %: clearly (p < 0.01) — LiRA online finds 50 of 5000 members (0.0100, 10.0× the FPR" in text
    assert text.count("| LOSS |") == 2  # once per victim, not once per online / offline run
    assert "| 1.50 (yes) |" in text


def test_checks_fail_when_the_numbers_say_so(tmp_path):
    text = table(tmp_path, [run("a", "none", "inf", True, 0.55, 0.0012), run("b", "none", "inf", False, 0.56, 0.001),
                            run("c", "dpsgd", 1.0, True, 0.50, 0.001, eps_lb=2.5)])
    assert "does not hold (AUC 0.550 vs 0.560" in text
    assert "ε lower bound ≤ 2ε: VIOLATED" in text and "| 2.50 (NO) |" in text
    assert "not clearly — LiRA online finds 6 of 5000 members" in text  # 6 hits vs 5 expected at chance
