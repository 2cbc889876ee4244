"""Log-log ROC curves of the Fashion-MNIST membership games (docs/membership.md) from dpeval results.

Two steps, so that the committed CSV alone redraws the figure:

    # 1. the ROC of every done LiRA / RMIA / LOSS run in the results folders, on a log grid of FPRs
    python bench/membership_roc.py collect runs/mia-fm runs/mia-fm-64 runs/mia-fm-overfit \\
        --out docs/results/membership-fashionmnist-roc.csv
    # 2. the figure
    python bench/membership_roc.py figure docs/results/membership-fashionmnist-roc.csv \\
        --out docs/results/membership-fashionmnist-roc.svg

Each run's ``<attack>/roc.json`` holds sklearn's ROC (collinear points dropped), so linear interpolation
between its points is the curve itself; the grid runs from 1/``n_nonmembers`` (the smallest FPR the game
resolves, where the plot stops) to 1.

The figure has two panels. Left, by defense: LiRA online (the LiRA paper's attack) against each victim of
the 5,000-member game with 16 shadows. Right, online (solid) vs offline (dashed) LiRA with 64 shadows on
that game's non-private victim and on the overfit one (1,000 members).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

FIELDS = ["run_id", "defense", "epsilon", "members", "epochs", "shadows", "attack", "online", "variance",
          "train_accuracy", "test_accuracy", "fpr", "tpr"]
ATTACKS = ("lira", "rmia", "loss")
GRID_POINTS = 60


def curve_on_grid(fpr: list[float], tpr: list[float], floor: float) -> tuple[np.ndarray, np.ndarray]:
    """The ROC at ``GRID_POINTS`` log-spaced FPRs from ``floor`` to 1 (at a vertical step, the upper end)."""
    f, t = np.asarray(fpr, float), np.asarray(tpr, float)
    xs, idx = np.unique(f, return_index=True)
    ys = np.maximum.reduceat(t, idx)  # the highest TPR at each FPR: the top of a vertical step
    grid = np.geomspace(floor, 1.0, GRID_POINTS)
    return grid, np.interp(grid, xs, ys)


def collect(results: list[Path], out: Path) -> int:
    """Write the gridded ROC of every done run and membership attack in ``results``; the number of curves."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from harness.store import ResultStore

    rows, curves = [], 0
    for folder in results:
        store = ResultStore(folder)
        for run in store.rows("done"):
            config, metrics = run["config"], run["metrics"]
            for attack in (a for a in config["attacks"] if a in ATTACKS):
                roc = json.loads((store.run_dir(run["run_id"]) / attack / "roc.json").read_text())
                params = config["attack"].get(attack, {})
                base = {"run_id": run["run_id"], "defense": config["defense"]["name"],
                        "epsilon": metrics["privacy.epsilon"], "members": metrics[f"leakage.{attack}.n_members"],
                        "epochs": config["train"]["epochs"], "shadows": params.get("shadows", ""),
                        "attack": attack, "online": params.get("online", ""), "variance": params.get("variance", ""),
                        "train_accuracy": metrics["utility.train_accuracy"],
                        "test_accuracy": metrics["utility.test_accuracy"]}
                grid, tpr = curve_on_grid(roc["fpr"], roc["tpr"], roc["fpr_floor"])
                rows += [{**base, "fpr": f"{x:.6g}", "tpr": f"{y:.6g}"} for x, y in zip(grid, tpr)]
                curves += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return curves


def read(path: Path) -> dict[tuple[str, ...], tuple[list[float], list[float]]]:
    """(run_id, attack, defense, ε, members, shadows, online, variance) → (fpr, tpr)."""
    curves: dict[tuple[str, ...], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    with path.open() as f:
        for r in csv.DictReader(f):
            key = (r["run_id"], r["attack"], r["defense"], r["epsilon"], r["members"], r["shadows"], r["online"],
                   r["variance"])
            curves[key][0].append(float(r["fpr"]))
            curves[key][1].append(float(r["tpr"]))
    return dict(curves)


def _eps_label(defense: str, epsilon: str) -> str:
    eps = float(epsilon)
    return "no defense" if not math.isfinite(eps) else f"{defense}, ε = {eps:.2g}"


def figure(path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    order = {"none": 0, "dpsgd": 1, "rs": 2}
    by_defense = sorted(((k, v) for k, v in curves.items() if k[1] == "lira" and k[4] == "5000" and k[5] == "16"
                         and k[6] == "True"), key=lambda kv: (order.get(kv[0][2], 9), float(kv[0][3])))
    for (_, _, defense, eps, *_), (fpr, tpr) in by_defense:
        left.plot(fpr, tpr, label=_eps_label(defense, eps), linestyle="-" if defense != "rs" else "--")
    left.set_title("LiRA online by defense (5,000 members, 16 shadows)", fontsize=9)
    victims = sorted(((k, v) for k, v in curves.items() if k[1] == "lira" and k[2] == "none" and k[5] == "64"
                      and k[7] in ("global", "")), key=lambda kv: (kv[0][4], kv[0][6] != "True"))
    colours: dict[str, str] = {}
    for (_, _, _, _, members, _, online, _), (fpr, tpr) in victims:
        name = "overfit victim, 1,000 members" if members == "1000" else "victim of the table, 5,000 members"
        colour = colours.setdefault(members, f"C{len(colours)}")
        right.plot(fpr, tpr, color=colour, linestyle="-" if online == "True" else "--",
                   label=f"{name}, {'online' if online == 'True' else 'offline'}")
    right.set_title("LiRA online vs offline, non-private, 64 shadows", fontsize=9)
    for ax in (left, right):
        lo = min((min(f) for (f, _) in curves.values()), default=1e-4)
        ax.plot([lo, 1], [lo, 1], color="grey", linewidth=0.8, linestyle=":", label="chance")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, 1)
        ax.set_ylim(lo, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.grid(alpha=0.3, which="both", linewidth=0.4)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    c = sub.add_parser("collect", help="gridded ROC curves of every done membership run in the results folders")
    c.add_argument("results", nargs="+", type=Path)
    c.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("figure", help="the two-panel log-log ROC figure from a collected CSV")
    f.add_argument("csv", type=Path)
    f.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "collect":
        print(f"{collect(args.results, args.out)} curves → {args.out}")
    else:
        figure(args.csv, args.out)
        print(f"figure → {args.out}")


if __name__ == "__main__":
    main()
