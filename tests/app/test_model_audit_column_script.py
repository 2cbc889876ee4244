"""bench/model_audit_column.py: the benchmark's final-model column — rows exported from the audits' JSON, the page's
table, and the reading against DP-SGD (a difference is called only where its 95 % interval excludes zero)."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers import load_bench_script

column = load_bench_script("model_audit_column")


def audit_json(row: str, eps: float, loss_sep: float, models: int = 200) -> dict:
    tests = [{"statistic": s, "estimator": e, "separation": loss_sep if s == "loss" else loss_sep / 2}
             for s in ("loss", "projection") for e in ("clopper-pearson", "gdp")]
    return {"bench.row": row, "privacy.epsilon": eps, "privacy.delta": 1e-5, "privacy.noise_multiplier": 2.0,
            "audit.models": models, "audit.models_with_target": models // 2, "audit.epsilon_lower_bound": eps / 4,
            "audit.estimator": "gdp", "audit.statistic": "loss", "audit.mu_lower_bound": 0.5, "audit.mu_hat": 1.0,
            "audit.mu_hat_ci": [0.5, 1.5], "audit.tests": tests, "audit.anchor_reading": {"loss": {"epsilon": eps}},
            "audit.init": {"kind": "crafted", "test_accuracy": 0.8}, "time.train_s": 100.0, "time.threads": 1}


def test_rows_section_and_reading_against_dpsgd(tmp_path):
    for row, eps, sep in (("dpsgd", 8.0, 1.7), ("rs", 8.0, 0.6), ("groupwise-all", 8.0, 1.6), ("dpsgd", 1.0, 0.3)):
        (tmp_path / f"{row}-eps{eps:g}.json").write_text(json.dumps(audit_json(row, eps, sep)))
    rows = column.export_rows(tmp_path, tmp_path / "out.csv")
    assert len(rows) == 4 and (tmp_path / "out.csv").is_file()
    by = {(r["defense"], r["target_epsilon"]): r for r in rows}
    assert by[("groupwise (all)", 8.0)]["loss_separation"] == 1.6
    assert by[("dpsgd", 8.0)]["loss_separation_se"] == pytest.approx(math.sqrt(0.02 + 1.7 ** 2 / 200), abs=1e-3)
    text = column.section([{k: str(v) for k, v in r.items()} for r in rows])
    # 0.6 against 1.7: the interval (≈ ±0.4) excludes zero; groupwise (all) 1.6 against 1.7 does not
    assert "Resolved to leak less than DP-SGD: rs at ε = 8. Resolved to leak more: none." in text
    assert "The other 1 of 2 differences are within noise." in text
    differences = text.split("differences are within noise.")[1].strip().splitlines()
    def half(row: str) -> float:  # the 95 % half-width of the difference from DP-SGD at ε = 8
        return 1.96 * math.hypot(by[(row, 8.0)]["loss_separation_se"], by[("dpsgd", 8.0)]["loss_separation_se"])
    assert differences[0] == "| defense − DP-SGD | ε = 1 | ε = 3 | ε = 8 |"
    blank = "| not measured | not measured |"
    assert differences[2:] == [f"| rs {blank} -1.10 ± {half('rs'):.2f} *less* |",
                               f"| groupwise (all) {blank} -0.10 ± {half('groupwise (all)'):.2f} |"]
    assert "Not measured yet:" in text and "gep at ε = 3" in text
    summary = column.summary_line(rows)
    assert "4 of 21 private rows" in summary and "resolved less: rs at ε = 8" in summary


def test_separation_standard_error_shrinks_with_models():
    assert column.separation_se(1.0, 500, 500) < column.separation_se(1.0, 100, 100)
    assert column.separation_se(0.0, 100, 100) == pytest.approx(math.sqrt(0.02))
