"""The RS paper's trade-off (§6.1, Figures 2 and 3) from a leaderboard CSV: accuracy vs the final rate r* per
setting — DP-SGD at σ × C (σ²C² labels the row), clipped SGD without noise, noisy SGD without clipping — as a
Markdown table and a two-panel figure, with the paper's two claims read off the numbers.

    for f in dp dp-high-noise clip-only noise-only noise-only-paper-scale; do
      dpeval sweep configs/sweeps/rs-tradeoff-fashionmnist/$f.yaml --results runs/rs-tradeoff
  done
    dpeval leaderboard --results runs/rs-tradeoff --out docs/results/rs-tradeoff-fashionmnist.csv
    .venv/bin/python bench/rs_tradeoff.py docs/results/rs-tradeoff-fashionmnist.csv \\
        --figure docs/results/rs-tradeoff-fashionmnist.svg --doc docs/sparsification.md

Settings are told apart by the release they describe: `defense.noise_std` 0 with a clip is clipped SGD
(Algorithm 3), an empty clip with a noise std is noisy SGD (Algorithm 2), anything else DP-SGD at its
`privacy.noise_multiplier` σ and `defense.clip` C. Values are means over the seeds present (n in the table).
Claims: (1) in DP-SGD the gain from RS — the best r* > 0 minus r* = 0, train accuracy as the paper plots —
grows with σ²C²; (2) in both ablations no r* > 0 trains better than r* = 0 and the largest r* trains
worse (RS only slows convergence).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dpeval.core.files import save_figure
from dpeval.doc_markers import write_into

Key = tuple[str, float | None]  # (setting label, σ²C²)
Data = dict[Key, dict[float, tuple[float, float, int]]]  # setting → r* → (train, test, n)
DP, CLIP_ONLY, NOISE_ONLY = "DP-SGD", "clipped SGD, no noise (Alg. 3)", "noisy SGD, no clipping (Alg. 2)"


def _num(text: str) -> float | None:
    return float(text) if text not in ("", "None", "nan") else None


def setting(row: dict[str, str]) -> Key:
    """(label, σ²C²) of a run; σ²C² is None for the ablations, which have no DP noise scale."""
    clip, noise_std = _num(row.get("defense.clip", "")), _num(row.get("defense.noise_std", ""))
    if noise_std == 0.0:
        return f"{CLIP_ONLY}, C = {clip:g}", None
    if clip is None:
        return f"{NOISE_ONLY}, std {noise_std:g}", None
    sigma = float(row["privacy.noise_multiplier"])
    return f"{DP}, σ = {sigma:g}, C = {clip:g}", sigma**2 * clip**2


def collect(path: Path) -> Data:
    """setting → r* → (mean train accuracy, mean test accuracy, n) over the done runs of the CSV."""
    runs: dict[Key, dict[float, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("status", "done") != "done" or row.get("defense") != "rs":
                continue
            runs[setting(row)][float(row["defense.final_rate"])].append(
                (float(row["utility.train_accuracy"]), float(row["utility.test_accuracy"])))
    return {key: {rate: (statistics.fmean(v[0] for v in vals), statistics.fmean(v[1] for v in vals), len(vals))
                  for rate, vals in sorted(by_rate.items())}
            for key, by_rate in runs.items()}


def gain(by_rate: dict[float, tuple[float, float, int]]) -> tuple[float, float] | None:
    """(best r* > 0, its train accuracy minus r* = 0's), None without both."""
    if 0.0 not in by_rate or len(by_rate) < 2:
        return None
    best = max((r for r in by_rate if r > 0), key=lambda r: by_rate[r][0])
    return best, by_rate[best][0] - by_rate[0.0][0]


def _order(key: Key) -> tuple:
    label, s2c2 = key
    return (not label.startswith(DP), s2c2 or 0.0, label)


def table(data: Data) -> str:
    rates = sorted({r for by_rate in data.values() for r in by_rate})
    head = " | ".join(f"r* = {r:g}" for r in rates)
    out = [f"| setting | σ²C² | {head} | best r* − (r* = 0), train | n |",
           "|---" * (len(rates) + 4) + "|"]
    for key in sorted(data, key=_order):
        label, s2c2 = key
        by_rate = data[key]
        cells = " | ".join(f"{100 * by_rate[r][0]:.1f} / {100 * by_rate[r][1]:.1f}" if r in by_rate else "–"
                           for r in rates)
        g = gain(by_rate)
        g_text = f"{100 * g[1]:+.1f} (r* = {g[0]:g})" if g else "–"
        n = sorted({v[2] for v in by_rate.values()})
        out.append(f"| {label} | {'–' if s2c2 is None else f'{s2c2:g}'} | {cells} | {g_text} | "
                   f"{'/'.join(map(str, n))} |")
    out.append("")
    out.append("Cells: train / test accuracy %, last epoch, mean over n seeds.")
    out.append("")
    out.extend(f"- {line}" for line in claims(data))
    return "\n".join(out)


def claims(data: Data) -> list[str]:
    lines = []
    dp = sorted((s2c2, g) for (label, s2c2), by_rate in data.items()
                if label.startswith(DP) and s2c2 is not None and (g := gain(by_rate)) is not None)
    if len(dp) >= 2:
        gains = [g[1] for _, g in dp]
        grows = all(b > a for a, b in zip(gains, gains[1:]))
        listed = ", ".join(f"{100 * g[1]:+.1f} at σ²C² = {s:g}" for s, g in dp)
        lines.append(f"Gain from RS grows with σ²C² (the paper's Figure 2): "
                     f"{'reproduced' if grows else 'not reproduced'} — best-r* gain in train accuracy {listed}.")
    for name in (CLIP_ONLY, NOISE_ONLY):
        for (label, _), by_rate in sorted(data.items()):
            if not label.startswith(name) or 0.0 not in by_rate:
                continue
            # No r* > 0 trains better than r* = 0 (a tie is not a gain), and the largest r* trains worse.
            top = max(by_rate)
            worse = all(by_rate[r][0] <= by_rate[0.0][0] for r in by_rate) and by_rate[top][0] < by_rate[0.0][0]
            listed = ", ".join(f"{100 * (by_rate[r][0] - by_rate[0.0][0]):+.1f} at r* = {r:g}"
                               for r in by_rate if r > 0)
            lines.append(f"{label}: RS only slows convergence (the paper's Figure 3): "
                         f"{'reproduced' if worse else 'not reproduced'} — train accuracy vs r* = 0: {listed}.")
    return lines


def figure(data: Data, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=False)
    for key in sorted(data, key=_order):
        label, s2c2 = key
        ax = axes[0] if label.startswith(DP) else axes[1]
        rates = list(data[key])
        shown = f"{label} (σ²C² = {s2c2:g})" if label.startswith(DP) else label
        line, = ax.plot(rates, [100 * data[key][r][0] for r in rates], "o-", label=shown)
        ax.plot(rates, [100 * data[key][r][1] for r in rates], "s--", color=line.get_color(), alpha=0.5)
    for ax, title in zip(axes, ("DP-SGD + RS (Figure 2)", "ablations (Figure 3)")):
        ax.set_xlabel("final rate r*")
        ax.set_ylabel("accuracy % (solid: train, dashed: test)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="a leaderboard CSV of the trade-off sweeps")
    parser.add_argument("--figure", type=Path, help="write the two-panel figure here (.svg or .png)")
    parser.add_argument("--doc", type=Path, help="write the table into this Markdown file between its "
                                                 "rs-tradeoff markers")
    args = parser.parse_args()
    data = collect(args.csv)
    if not data:
        sys.exit(f"{args.csv}: no finished rs runs")
    text = table(data)
    if args.figure:
        figure(data, args.figure)
    if args.doc:
        write_into(args.doc, "rs-tradeoff", text)
    print(text)


if __name__ == "__main__":
    main()
