"""The final-model column of the benchmark: ``dpeval audit --scope model`` for every private row (each DP defense of
``configs/benchmark/fashionmnist/`` at ε = 1, 3 and 8), in the worst case the auditing literature uses (Annamalai &
De Cristofaro 2024): crafted initial parameters, a blank target, full-batch training, 200 models.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_audit_column.py [RESULTS] [--models K] [--defenses ...]

One JSON per row under RESULTS (default ``runs/model-audit-column``), written when the row's audit ends; a finished
row is skipped and an interrupted one goes on from its kept models (``RESULTS/models/<row>``), so the script is
resumable. ``bench/benchmark_page.py --export-model-audits RESULTS`` turns the rows into the page's column.

Each row keeps its defense's benchmark parameters (clip C = 0.1, RS's rate and schedule, GEP's bases and groups, …)
and changes what makes 200 models affordable on two cores, the same for every row:

- data: Fashion-MNIST, a private pool of 1,000 records, the 2 % public split (1,200 records: crafting and GEP's
  anchors), pixels in [0, 1];
- model: ``mlp`` (784 → 32 tanh → 10, 25,450 parameters: the anchor CNN's size, two weight layers so that
  group-wise clipping per layer differs from all-layer clipping), trained by the lean engine;
- training: T = 100 full-batch steps (q = 1) of plain SGD, each lr × (Σ clipped + noise) with lr = 1.33e-3 (the
  anchor's 1.33e-4 at C = 1, scaled for C = 0.1), σ from the PRV accountant (exact for full batches: the
  benchmark rows' RDP would calibrate a larger σ than ε needs, and the ratio ε_emp / ε would flatter the defense).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFENSES = ("dpsgd", "rs", "random-freeze", "adaclip", "groupwise-all", "groupwise-layer", "gep")
EPSILONS = (1.0, 3.0, 8.0)
OVERRIDES = {
    "data": {"name": "fashionmnist", "max_train": 1000, "public_fraction": 0.02, "normalize": "none"},
    "model": {"name": "mlp", "width": 32, "activation": "tanh"},
    "train": {"epochs": 100, "optimizer": "sgd", "lr": 1.33e-3, "momentum": 0.0, "sampling": "poisson",
              "physical_batch_size": 1001},
}


def row_config(defense: str, epsilon: float) -> dict:
    recipe = yaml.safe_load((ROOT / "configs/benchmark/fashionmnist" / f"{defense}.yaml").read_text())
    return {"defense": recipe["defense"], "data": OVERRIDES["data"], "model": OVERRIDES["model"],
            "train": {**recipe["train"], **OVERRIDES["train"]},
            "privacy": {"epsilon": epsilon, "delta": recipe["privacy"]["delta"], "accountant": "prv"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="runs/model-audit-column")
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=OVERRIDES["train"]["epochs"], help="full-batch steps T")
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=DEFENSES)
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    args = parser.parse_args()
    from dpeval.audit.model import ModelAuditOptions, run_model_audit
    from dpeval.config import build_spec

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}", flush=True)
    for defense in args.defenses:
        for epsilon in args.epsilons:
            name = f"{defense}-eps{epsilon:g}"
            out = results / f"{name}.json"
            if out.exists():
                continue
            config = row_config(defense, epsilon)
            config["train"]["epochs"] = args.epochs
            started = time.perf_counter()
            result = run_model_audit(build_spec(config), ModelAuditOptions(
                models=args.models, init="crafted", target="blank", sampling="full", keep=results / "models" / name))
            result["bench.config"] = config
            result["bench.row"] = defense
            out.with_suffix(".part").write_text(json.dumps(result, indent=1, default=str))
            out.with_suffix(".part").rename(out)
            print(f"{name}: ε_LB {result['audit.epsilon_lower_bound']:.2f} of ε {result['privacy.epsilon']:.2f} "
                  f"({result['audit.estimator']}, {result['audit.statistic']}), μ̂ {result['audit.mu_hat']:.2f}, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
