"""bench/zoo.py: its table reads the measured rows (ratios to non-private SGD, with and without the noise draw;
failures and auto's fallbacks as notes), and a run with ``--models`` refreshes its rows of the CSV and keeps the
rest."""

from __future__ import annotations

import csv

from tests.helpers import load_bench_script


def rows() -> list[dict]:
    return [{"model": "tv-vit", "params": 914122.0, "auto": "lean", "non-private_s": 0.4, "func_s": 0.8,
             "lean_s": 0.5, "opacus_s": 1.2, "noise_s": 0.1, "non-private_mb": 100.0, "lean_mb": 120.0,
             "func_norm_err": 5e-8, "lean_norm_err": 1e-7},
            {"model": "timm-efficientnet-b0-opacus-fix", "params": 5.3e6, "auto": "func", "non-private_s": 1.0,
             "func_s": 2.0, "lean_error": "ConfigError: no kernel for BatchNormAct2d", "noise_s": 0.0,
             "auto_reason": "book-keeping cannot serve this run (BatchNormAct2d)", "func_norm_err": 1e-7}]


def test_the_table_gives_each_ratio_with_and_without_the_noise_and_notes_failures():
    zoo = load_bench_script("zoo", "dp_step")
    text = zoo.table(rows(), "header")
    vit = next(line for line in text.splitlines() if line.startswith("| tv-vit"))
    assert "0.500 (1.25×; 1.00×)" in vit and "0.800 (2.00×; 1.75×)" in vit and "0.91M" in vit
    assert "100 / - / 120 / -" in vit and "5.0e-08 / 1.0e-07" in vit
    fixed = next(line for line in text.splitlines() if line.startswith("| timm-efficientnet-b0-opacus-fix"))
    assert "| failed |" in fixed
    assert "- lean failed on timm-efficientnet-b0-opacus-fix: ConfigError: no kernel for BatchNormAct2d" in text
    assert "- timm-efficientnet-b0-opacus-fix: auto → func: book-keeping cannot serve" in text
    assert "tv-vit: auto" not in text


def test_a_partial_run_keeps_the_other_rows_of_the_csv(tmp_path):
    zoo = load_bench_script("zoo", "dp_step")
    path = tmp_path / "zoo.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=zoo.COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows())
    back = zoo.previous_rows(path, ["tv-vit"])  # a model no longer in the zoo is dropped
    assert [r["model"] for r in back] == ["tv-vit"]
    assert back[0]["lean_s"] == 0.5 and back[0]["auto"] == "lean" and "opacus_mb" not in back[0]
