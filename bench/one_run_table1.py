"""Mahloujifar, Melis & Chaudhuri (ICML 2025), Table 1, with dpeval's one-run estimators, side by side.

The idealised Gaussian mechanism of their Table 1: m canaries (10⁵; 10⁶ at σ = 4), each included with probability
½; the auditor sees one score per canary, x_i = 1[included] + N(0, σ²) (μ = 1/σ), guesses "in" for the k highest
and "out" for the k lowest scores, and bounds ε at δ = 1e-5 with 95 % confidence. As in their table, each
estimator reports its best guess count k of a grid fixed in advance (``K_FRACTIONS`` of m), each k judged at the
full 95 % (no correction over the grid: the table's convention; dpeval's audit corrects, see docs/audit.md). Each
estimator runs alone (``estimators=(name,)``), so its confidence is the paper's 95 %. The Gaussian pair takes every
score and needs no k. Repetitions give the spread (mean ± sd, min, max).

    .venv/bin/python bench/one_run_table1.py --reps 5 --out docs/results/one-run-table1.csv \\
        --figure docs/results/one-run-table1.svg --doc docs/audit.md
    .venv/bin/python bench/one_run_table1.py --from-csv docs/results/one-run-table1.csv --doc docs/audit.md

One thread is enough: the estimators are NumPy/SciPy loops; the 10⁶-canary row's counting bound takes minutes.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from dpeval.core.one_run_bounds import gdp_epsilon, one_run_bounds
from dpeval.doc_markers import write_into

DELTA = 1e-5
# their Table 1: σ → (canaries, theory, Steinke et al., f-DP)
PAPER = {0.5: (10**5, 9.99, 4.99, 8.16), 1.0: (10**5, 4.37, 2.61, 3.61), 2.0: (10**5, 1.99, 1.33, 1.59),
         4.0: (10**6, 0.92, 0.61, 0.82)}
# k+ = k− as fractions of m, fixed before any score is seen
K_FRACTIONS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.03, 0.05)
COLUMNS = ("sigma", "canaries", "rep", "theory", "estimator", "epsilon_lower_bound", "mu_lower_bound", "k", "correct",
           "paper")


def one_rep(sigma: float, m: int, rep: int) -> list[dict[str, object]]:
    rng = np.random.default_rng([int(sigma * 1000), rep])
    included = rng.random(m) < 0.5
    scores = included + rng.normal(0.0, sigma, m)
    theory = gdp_epsilon(1 / sigma, DELTA)
    paper = {"counting": PAPER[sigma][2], "f-dp": PAPER[sigma][3], "gaussian-pair": None}
    rows = []
    for estimator in ("counting", "f-dp"):
        best = None
        for fraction in K_FRACTIONS:
            k = max(1, round(fraction * m))
            bound = one_run_bounds(scores, included, DELTA, estimators=(estimator,), guesses=[(k, k)],
                                   rng=np.random.default_rng(rep)).bounds[estimator]
            if best is None or bound.epsilon_lower_bound > best.epsilon_lower_bound:
                best = bound
        assert best is not None
        rows.append({"estimator": estimator, "epsilon_lower_bound": best.epsilon_lower_bound,
                     "mu_lower_bound": best.mu_lower_bound, "k": best.k_in, "correct": best.correct})
    pair = one_run_bounds(scores, included, DELTA, estimators=("gaussian-pair",)).bounds["gaussian-pair"]
    rows.append({"estimator": "gaussian-pair", "epsilon_lower_bound": pair.epsilon_lower_bound,
                 "mu_lower_bound": pair.mu_lower_bound, "k": None, "correct": None})
    for row in rows:
        row.update(sigma=sigma, canaries=m, rep=rep, theory=theory, paper=paper[str(row["estimator"])])
    return rows


def summary(rows: list[dict[str, object]]) -> str:
    lines = ["| σ | canaries | theory | counting (paper) | f-DP (paper) | Gaussian pair |", "|---|---|---|---|---|---|"]
    for sigma, (m, theory, steinke, fdp) in PAPER.items():
        cells = []
        for name in ("counting", "f-dp", "gaussian-pair"):
            values = [float(r["epsilon_lower_bound"]) for r in rows  # type: ignore[arg-type]
                      if r["sigma"] == sigma and r["estimator"] == name]
            if not values:
                cells.append("–")
                continue
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.2f} ± {sd:.2f} [{min(values):.2f}, {max(values):.2f}]")
        lines.append(f"| {sigma} | {m:,} | {theory} | {cells[0]} ({steinke}) | {cells[1]} ({fdp}) | {cells[2]} |")
    return "\n".join(lines)


def figure(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sigmas = sorted(PAPER)
    x = np.arange(len(sigmas))
    ax.plot(x, [PAPER[s][1] for s in sigmas], "k_", markersize=20, label="theory ε (μ = 1/σ)")
    for offset, (name, colour, paper_col) in enumerate((("counting", "C0", 2), ("f-dp", "C1", 3),
                                                         ("gaussian-pair", "C2", None))):
        for i, s in enumerate(sigmas):
            values = [float(r["epsilon_lower_bound"]) for r in rows  # type: ignore[arg-type]
                      if r["sigma"] == s and r["estimator"] == name]
            xs = np.full(len(values), i + (offset - 1) * 0.18)
            ax.scatter(xs, values, color=colour, s=12, label=f"dpeval {name}" if i == 0 else None)
            if paper_col is not None:
                ax.scatter([i + (offset - 1) * 0.18], [PAPER[s][paper_col]], color=colour, marker="x", s=60,
                           label=f"paper {name}" if i == 0 else None)
    ax.set_xticks(x, [f"σ = {s}" for s in sigmas])
    ax.set_ylabel("ε lower bound (δ = 1e-5, 95 %)")
    ax.set_yscale("log")
    ax.set_title("One-run bounds on the idealised Gaussian mechanism (Table 1)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sigmas", default="0.5,1,2,4", help="comma-separated σ of the table")
    parser.add_argument("--out", type=Path, default=None, help="CSV of every repetition and estimator")
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument("--from-csv", type=Path, default=None, help="summarise an earlier CSV instead of simulating")
    parser.add_argument("--doc", type=Path, default=None,
                        help="write the summary between the page's one-run-table1 markers (docs/audit.md)")
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    if args.from_csv:
        with args.from_csv.open() as f:
            for r in csv.DictReader(f):
                rows.append({**r, "sigma": float(r["sigma"]), "epsilon_lower_bound": float(r["epsilon_lower_bound"])})
    else:
        for sigma in (float(s) for s in args.sigmas.split(",")):
            m = PAPER[sigma][0]
            for rep in range(args.reps):
                start = time.perf_counter()
                got = one_rep(sigma, m, rep)
                rows += got
                print(f"σ = {sigma} rep {rep}: " + ", ".join(f"{r['estimator']} {r['epsilon_lower_bound']:.3f}"
                                                           for r in got)
                      + f" ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
                if args.out:  # after every repetition: an interrupted run keeps what it measured
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    with args.out.open("w", newline="") as f:
                        writer = csv.DictWriter(f, COLUMNS)
                        writer.writeheader()
                        writer.writerows(rows)
    print(summary(rows))
    if args.doc:
        write_into(args.doc, "one-run-table1", summary(rows))
    if args.figure:
        figure(rows, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
