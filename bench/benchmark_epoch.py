"""The benchmark's cost column: CPU seconds per training epoch of every row's recipe, side by side in one process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/benchmark_epoch.py --out docs/results/benchmark-fashionmnist-epoch.csv

A run's own ``time.train_s`` is wall time, and the benchmark's runs share two cores with whatever else runs, so rows
measured under different loads are not comparable. Here each recipe of configs/benchmark/fashionmnist/ (``none``
and every private row, at one ε, attacks off) trains ``--epochs`` epochs through the harness's own ``prepare`` and
``train`` (the code path of ``dpeval run``, no results store), one after another in this process at ``--threads``
threads; the CPU time of the epochs (the fixed front, computed once per run, left out) is what an idle core takes.
Every row is measured ``--repeats`` times, the rows taking turns, and its least time is kept (what the machine's
other work added least to).
``bench/benchmark_page.py --export`` reads the CSV for the page's "s / epoch" column and each row's cost against
DP-SGD.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import torch

from dpeval.core.streams import seed_globals
from dpeval.engine.training import train
from dpeval.runner import prepare
from dpeval.sweep.grid import load_sweep

RECIPES = Path(__file__).resolve().parent.parent / "configs" / "benchmark" / "fashionmnist"
ROWS = ("none", "dpsgd", "rs", "random-freeze", "adaclip", "groupwise-all", "groupwise-layer", "gep")


def cpu_per_epoch(recipe: Path, epsilon: float, epochs: int) -> tuple[str, float]:
    """(the row's name as the page writes it, CPU seconds per epoch) of the recipe's point at ``epsilon``."""
    specs = load_sweep(recipe)
    spec = next((s for s in specs if s.privacy.epsilon == epsilon), specs[0])  # `none` has no ε
    spec.attacks, spec.attack, spec.train.epochs = [], {}, epochs
    prep = prepare(spec)
    seed_globals(prep.streams)
    cpu = time.process_time()
    result = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                   spec.train, prep.sampler, prep.device, progress=False)
    return spec.defense_name, (time.process_time() - cpu - result.front_cpu_s) / epochs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="measurements per row (the least is kept)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--out", type=Path, help="write the CSV here (row, cpu_s_per_epoch, x_dpsgd, threads)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seconds = {row: math.inf for row in args.rows}
    for _ in range(args.repeats):
        for row in args.rows:
            seconds[row] = min(seconds[row], cpu_per_epoch(RECIPES / f"{row}.yaml", args.epsilon, args.epochs)[1])
    base = seconds.get("dpsgd")
    print(f"threads {torch.get_num_threads()}, {args.epochs} epochs at ε = {args.epsilon:g} (none: ∞), CPU seconds, "
          f"least of {args.repeats}")
    print("| row | CPU s / epoch | × DP-SGD |\n|---|---|---|")
    table = []
    for row, s in seconds.items():
        ratio = s / base if base else float("nan")
        table.append({"row": row, "cpu_s_per_epoch": f"{s:.3f}", "x_dpsgd": f"{ratio:.3f}",
                      "threads": torch.get_num_threads(), "epsilon": args.epsilon, "epochs": args.epochs,
                      "repeats": args.repeats})
        print(f"| {row} | {s:.2f} | {ratio:.2f} |")
    if args.out:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)


if __name__ == "__main__":
    main()
