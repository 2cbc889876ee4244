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
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

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
    from dpeval.store import ResultStore

    rows, curves = [], 0
    for folder in results:
        store = ResultStore(folder)
        for run in store.results("done"):
            config, metrics = run.config, run.flat()
            for attack in (a for a in config["attacks"] if a in ATTACKS):
                roc = json.loads((run.folder / attack / "roc.json").read_text())
                params = config["attack"].get(attack, {})
                base = {"run_id": run.run_id, "defense": config["defense"]["name"],
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


class Curve(NamedTuple):
    """What a curve of the CSV is of (CSV strings, as written)."""

    run_id: str
    attack: str
    defense: str
    epsilon: str
    members: str
    shadows: str
    online: str
    variance: str


def read(path: Path) -> dict[Curve, tuple[list[float], list[float]]]:
    """Each curve of the CSV → (fpr, tpr)."""
    curves: dict[Curve, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    with path.open() as f:
        for r in csv.DictReader(f):
            key = Curve(*(r[field] for field in Curve._fields))
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
    by_defense = sorted((c for c in curves if c.attack == "lira" and c.members == "5000" and c.shadows == "16"
                         and c.online == "True"), key=lambda c: (order.get(c.defense, 9), float(c.epsilon)))
    for c in by_defense:
        left.plot(*curves[c], label=_eps_label(c.defense, c.epsilon), linestyle="-" if c.defense != "rs" else "--")
    left.set_title("LiRA online by defense (5,000 members, 16 shadows)", fontsize=9)
    victims = sorted((c for c in curves if c.attack == "lira" and c.defense == "none" and c.shadows == "64"
                      and c.variance in ("global", "")), key=lambda c: (c.members, c.online != "True"))
    colours: dict[str, str] = {}
    for c in victims:
        name = "overfit victim, 1,000 members" if c.members == "1000" else "victim of the table, 5,000 members"
        online = c.online == "True"
        right.plot(*curves[c], color=colours.setdefault(c.members, f"C{len(colours)}"),
                   linestyle="-" if online else "--", label=f"{name}, {'online' if online else 'offline'}")
    right.set_title("LiRA online vs offline, non-private, 64 shadows", fontsize=9)
    lo = min((min(fpr) for fpr, _ in curves.values()), default=1e-4)  # the finest FPR any game resolves
    for ax in (left, right):
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
    from dpeval.core.files import save_figure

    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)
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
