"""Membership inference on digits: LOSS, LiRA online/offline and RMIA online/offline against a non-private
and a DP-SGD (ε = 1) victim, on the default digits victim and the overfit recipe
(configs/digits-mia-overfit.yaml), over several seeds (mean ± standard error of the mean).

Each (recipe, defense, seed) trains one victim and one pool of K shadow models (the default game,
``attack.mia_target: victim``); the online and offline variants score the same shadows (the pool is kept
in memory between the two runs, which differ only in attack parameters). ``--game shadows`` scores the
leave-one-model-out game instead (LOSS still attacks the victim). CPU-heavy: 5–10 minutes per
(recipe, defense, seed) with 16 shadows on 2 busy cores.

    PYTHONPATH=. .venv/bin/python bench/membership.py --seeds 0 1 2 --shadows 16
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from dpeval.config import build_spec
from dpeval.runner import execute
from dpeval.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"default": {"data": {"name": "digits"}},
           "overfit": yaml.safe_load((ROOT / "configs" / "digits-mia-overfit.yaml").read_text())}
DEFENSES = {"none": {"defense": {"name": "none"}},
            "dpsgd ε=1": {"defense": {"name": "dpsgd"}, "privacy": {"epsilon": 1.0}}}
# (row label, attack, online): each run scores its attacks on the same victim and shadow pool
ROWS = [("LOSS", "loss", None), ("LiRA online", "lira", True), ("LiRA offline", "lira", False),
        ("RMIA online", "rmia", True), ("RMIA offline", "rmia", False)]
METRICS = [("AUC", "auc"), ("TPR@1%FPR", "tpr_at_1pct_fpr"), ("TPR@10%FPR", "tpr_at_10pct_fpr")]


def one(recipe: dict, defense: dict, seed: int, shadows: int, game: str, results: Path) -> dict[tuple[str, str], float]:
    """Metrics of every row of ROWS for one victim: an online run (loss, lira, rmia) and an offline one."""
    out = {}
    for online in (True, False):
        attacks = ["lira", "rmia"] + (["loss"] if online else [])
        raw = {**recipe, **defense, "seed": seed, "attacks": attacks,
               "attack": {"shadows": shadows, "online": online, "mia_target": game}}
        metrics = execute(build_spec(raw), ResultStore(results), progress=False).flat()
        for label, attack, row_online in ROWS:
            if attack in attacks and row_online in (None, online):
                for _, key in METRICS:
                    out[label, key] = metrics[f"leakage.{attack}.{key}"]
        out["test accuracy", "acc"] = metrics["utility.test_accuracy"]
        out["epsilon", "eps"] = metrics["privacy.epsilon"]
    print("  seed", seed, defense["defense"]["name"],
          " ".join(f"{label} {out[label, 'auc']:.3f}" for label, *_ in ROWS), flush=True)
    return out


def mean_sem(values: list[float]) -> str:
    if any(v is None for v in values):
        return "n/a"
    mean = statistics.fmean(values)
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{mean:.3f} ± {sem:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shadows", type=int, default=16)
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=list(DEFENSES))
    parser.add_argument("--game", default="victim", choices=("victim", "shadows"),
                        help="attack.mia_target of the shadow attacks (LOSS always attacks the victim)")
    args = parser.parse_args()
    print(f"digits membership benchmark: {args.shadows} shadows (game: {args.game}), seeds {args.seeds}; "
          f"mean ± SEM over seeds", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            table = {}
            for name in args.defenses:
                defense = DEFENSES[name]
                runs = [one(RECIPES[recipe], defense, seed, args.shadows, args.game, Path(tmp)) for seed in args.seeds]
                table[name] = {key: [r[key] for r in runs] for key in runs[0]}
            print(f"\n### {recipe} recipe", flush=True)
            header = "| attack | " + " | ".join(f"{m} ({d})" for d in args.defenses for m, _ in METRICS) + " |"
            print(header)
            print("|" + "---|" * (1 + len(args.defenses) * len(METRICS)))
            for label, _, _ in ROWS:
                cells = [mean_sem(table[d][label, key]) for d in args.defenses for _, key in METRICS]
                print(f"| {label} | " + " | ".join(cells) + " |")
            for d in args.defenses:
                print(f"{d}: test accuracy {mean_sem(table[d]['test accuracy', 'acc'])}, "
                      f"accounted ε {table[d]['epsilon', 'eps'][0]:.3g}")
    print(f"\n{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
