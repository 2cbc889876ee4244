"""bench/reconstruction_figure.py: per-target rows from a real results folder, and the claim read both ways."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

from click.testing import CliRunner

from dpeval.cli import main

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("reconstruction_figure", ROOT / "bench/reconstruction_figure.py")
reconstruction_figure = importlib.util.module_from_spec(spec)
sys.modules["reconstruction_figure"] = reconstruction_figure
spec.loader.exec_module(reconstruction_figure)


def test_collect_writes_one_row_per_target_with_the_release_it_attacked(tmp_path):
    results = tmp_path / "runs"
    common = ["run", "--epochs", "1", "--results", str(results), "--quiet", "--set", "attack.at=init",
              "--set", "attack.targets=3", "--set", "attack.ig_iterations=3"]
    rs = ["--defense", "rs", "--attack", "ig", "--set", "defense.clip=null", "--set", "defense.noise_std=0.001",
          "--set", "defense.schedule=constant", "--set", "defense.final_rate=0.5", "--set", "attack.mask_aware=false"]
    for args in (common + rs, common + ["--defense", "none", "--attack", "ig"]):
        assert CliRunner().invoke(main, args).exit_code == 0
    out = tmp_path / "targets.csv"
    assert reconstruction_figure.collect([results], out) == 6
    with out.open() as f:
        rows = list(csv.DictReader(f))
    settings = {reconstruction_figure.setting(r) for r in rows}
    assert settings == {("ig", "rs", 0.001, "naive"), ("ig", "non-private", 0.0, "non-private")}
    assert {float(r["rate"]) for r in rows if r["defense"] == "rs"} == {0.5}
    assert all(0 < float(r["mse"]) < 1 and r["model"] == "cnn3" for r in rows)


def write(path: Path, mse_by_rate: dict[float, list[float]], psnr: float = 20.0) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=reconstruction_figure.FIELDS)
        w.writeheader()
        for rate, values in mse_by_rate.items():
            for t, mse in enumerate(values):
                w.writerow({"run_id": f"r{rate}", "attack": "ig", "defense": "rs", "noise_std": 0.001, "rate": rate,
                            "mask_aware": True, "model": "cnn6", "target": t, "mse": mse, "psnr": psnr, "ssim": 0.5,
                            "best_guess_psnr": 10.0})
    return path


def test_the_claim_reads_the_numbers_both_ways(tmp_path):
    rising = reconstruction_figure.summarise(write(tmp_path / "a.csv", {0.0: [0.01, 0.02], 0.5: [0.03, 0.04],
                                                                        0.9: [0.10, 0.12]}))
    text = reconstruction_figure.claims(rising)
    assert "ig, noise std 0.001, mask-aware: MSE 0.0150 at r = 0 → 0.1100 at r = 0.9; every step up: yes — " \
           "reproduced." in text
    assert "| ig | 0.001 | mask-aware | 0.5 | 0.0350 ± 0.0050 | 20.0 dB | 100% | 2 |" in \
        reconstruction_figure.table(rising)

    noisy = reconstruction_figure.summarise(write(tmp_path / "b.csv", {0.0: [0.01, 0.09], 0.5: [0.03, 0.04],
                                                                       0.9: [0.02, 0.12]}))
    assert "every step up: no — not reproduced." in reconstruction_figure.claims(noisy)


def test_a_trend_among_failed_reconstructions_is_not_read_as_the_claim(tmp_path):
    failing = reconstruction_figure.summarise(write(tmp_path / "c.csv", {0.0: [0.30, 0.32], 0.9: [0.40, 0.42]},
                                                    psnr=5.0))
    assert "not measurable: at r = 0 only 0% of the targets beat their best data-free guess" in \
        reconstruction_figure.claims(failing)
