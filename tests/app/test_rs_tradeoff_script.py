"""bench/rs_tradeoff.py: which release a run describes, and the two claims docs/sparsification.md publishes."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("rs_tradeoff", ROOT / "bench/rs_tradeoff.py")
rs_tradeoff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rs_tradeoff)

COLUMNS = ["status", "defense", "seed", "defense.clip", "defense.noise_std", "privacy.noise_multiplier",
           "defense.final_rate", "utility.train_accuracy", "utility.test_accuracy"]


def write(path: Path, runs: list[tuple]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for run in runs:
            w.writerow(["done", "rs", *run])
    return path


def grid(train_by_setting: dict[tuple[str, str, str], list[float]]) -> list[tuple]:
    rates = [0.0, 0.5, 0.9]
    return [(0, clip, noise_std, sigma, rate, acc, acc - 0.01)
            for (clip, noise_std, sigma), accs in train_by_setting.items() for rate, acc in zip(rates, accs)]


def test_settings_are_told_apart_by_their_release():
    assert rs_tradeoff.setting({"defense.clip": "0.5", "defense.noise_std": "", "privacy.noise_multiplier": "2.0"}) \
        == ("DP-SGD, σ = 2, C = 0.5", 1.0)
    label, s2c2 = rs_tradeoff.setting({"defense.clip": "1.0", "defense.noise_std": "0.0",
                                       "privacy.noise_multiplier": "0.0"})
    assert label.startswith(rs_tradeoff.CLIP_ONLY) and s2c2 is None
    label, _ = rs_tradeoff.setting({"defense.clip": "", "defense.noise_std": "0.02", "privacy.noise_multiplier": "0"})
    assert label.startswith(rs_tradeoff.NOISE_ONLY)


def test_the_claims_read_the_numbers_both_ways(tmp_path):  # the noise-only row ties at r* = 0.5: not a gain
    growing = grid({("0.25", "", "2.0"): [0.80, 0.80, 0.79], ("1.0", "", "2.0"): [0.70, 0.73, 0.75],
                    ("1.0", "0.0", "0.0"): [0.85, 0.84, 0.83], ("", "0.02", "0.0"): [0.82, 0.82, 0.80]})
    text = rs_tradeoff.table(rs_tradeoff.collect(write(tmp_path / "a.csv", growing)))
    assert "grows with σ²C² (the paper's Figure 2): reproduced — best-r* gain in train accuracy +0.0 at σ²C² = " \
           "0.25, +5.0 at σ²C² = 4" in text
    assert text.count("RS only slows convergence (the paper's Figure 3): reproduced") == 2
    assert "| DP-SGD, σ = 2, C = 1 | 4 | 70.0 / 69.0 | 73.0 / 72.0 | 75.0 / 74.0 | +5.0 (r* = 0.9) | 1 |" in text

    flat = grid({("0.25", "", "2.0"): [0.80, 0.83, 0.79], ("1.0", "", "2.0"): [0.70, 0.71, 0.69],
                 ("1.0", "0.0", "0.0"): [0.85, 0.86, 0.83]})
    text = rs_tradeoff.table(rs_tradeoff.collect(write(tmp_path / "b.csv", flat)))
    assert "(the paper's Figure 2): not reproduced" in text
    assert "(the paper's Figure 3): not reproduced — train accuracy vs r* = 0: +1.0 at r* = 0.5" in text


def test_seeds_are_averaged_and_counted(tmp_path):
    runs = [(seed, "0.5", "", "2.0", 0.0, acc, acc) for seed, acc in ((0, 0.80), (1, 0.82))]
    data = rs_tradeoff.collect(write(tmp_path / "c.csv", runs))
    ((_, by_rate),) = data.items()
    assert by_rate[0.0][0] == 0.81 and by_rate[0.0][2] == 2
