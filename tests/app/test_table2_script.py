"""bench/table2_fashionmnist.py: the interval and the reading that docs/reproducing.md publishes."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("table2", ROOT / "bench/table2_fashionmnist.py")
table2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table2)


def test_welch_interval_is_scipys():
    a, b = [86.1, 86.5, 86.4, 86.0], [87.0, 87.6, 87.2]
    diff, low, high = table2.welch(a, b)
    expected = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(sum(b) / 3 - sum(a) / 4)
    assert (low, high) == pytest.approx((expected.low, expected.high))


@pytest.mark.parametrize("paper, low, high, reading", [
    (0.8, 0.2, 1.4, "sign reproduced; size reproduced"),
    (0.8, 0.1, 0.5, "sign reproduced; size not reproduced"),
    (0.8, -1.6, 1.8, "sign not resolved (interval spans 0)"),
    (1.3, -0.6, 0.3, "sign not resolved (interval spans 0); the paper's +1.3 lies outside it: its size not reproduced"),
    (0.8, -1.0, -0.2, "sign not reproduced"),
])
def test_reading(paper, low, high, reading):
    assert table2.reading_of(paper, (low + high) / 2, low, high).startswith(reading)
    assert "size" not in reading or "sign reproduced" in reading or "outside" in reading


def test_table_from_csv_and_into_the_doc(tmp_path):
    rows = [("dpsgd", s, acc) for s, acc in enumerate([0.864, 0.862, 0.865])] + \
           [("rs", s, acc) for s, acc in enumerate([0.881, 0.880, 0.882])]
    path = tmp_path / "t2.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, table2.KEEP)
        w.writeheader()
        for defense, seed, acc in rows:
            w.writerow({k: "" for k in table2.KEEP} | {
                "model": "dpcnn-small", "defense": defense, "seed": seed, "privacy.epsilon": 2.99,
                "utility.test_accuracy": acc, "paper.test_accuracy": 0.866 if defense == "dpsgd" else 0.874,
                "paper.test_accuracy.sem": 0.0009})
    text = table2.table(path)
    assert "| DP-CNN/S (26K) | 3 | 86.6 ± 0.09 | 87.4 ± 0.09 | +0.8 | 86.4 ± 0.09 (3) | 88.1 ± 0.06 (3) | " \
           "-0.2, +0.7 | +1.7 [" in text
    assert "sign reproduced; size not reproduced" in text  # +0.8 lies outside a tight interval around +1.7
    doc = tmp_path / "doc.md"
    start, end = "<!-- table2:start -->", "<!-- table2:end -->"
    doc.write_text(f"before\n{start}\nold\n{end}\nafter\n")
    table2.write_into(doc, "table2", text)
    assert doc.read_text() == f"before\n{start}\n{text}\n{end}\nafter\n"
