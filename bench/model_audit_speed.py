"""Wall time per model-step of the final-model audit's vectorised training (``dpeval audit --scope model``), and
the extrapolation to the anchor's cell (Annamalai & De Cristofaro 2024: 200 models × 100 full-batch steps × 1,000
records), for a logistic regression and the anchor's tanh CNN (``dpcnn-small``), side by side in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_audit_speed.py --models 20 --steps 2

Each setting trains ``--models`` models from one θ₀ on ``--records`` Fashion-MNIST records (28×28, like MNIST; the
Debian package's files) with full-batch DP-SGD for ``--steps`` steps; the time is training only (``time.train_s``),
divided by models × steps. The CNN / logreg ratio is printed too.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from dpeval.audit.model import ModelAuditOptions, run_model_audit
from dpeval.config import build_spec

ANCHOR_MODELS, ANCHOR_STEPS = 200, 100


def per_model_step(model: str, args: argparse.Namespace) -> float:
    spec = build_spec({"defense": {"name": "dpsgd"}, "data": {"name": args.dataset, "max_train": args.records},
                       "model": {"name": model}, "train": {"epochs": args.steps, "optimizer": "sgd", "lr": 0.01},
                       "privacy": {"epsilon": 10.0}, "device": "cpu"})
    result = run_model_audit(spec, ModelAuditOptions(models=args.models))
    return result["time.train_s"] / (args.models * args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--dataset", default="fashionmnist")
    args = parser.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}, "
          f"torch threads {torch.get_num_threads()}; {args.models} models × {args.steps} full-batch steps × "
          f"{args.records} records ({args.dataset})")
    times = {}
    for model in ("logreg", "dpcnn-small"):
        times[model] = per_model_step(model, args)
        cell = times[model] * ANCHOR_MODELS * ANCHOR_STEPS
        print(f"  {model:<12} {times[model] * 1e3:9.1f} ms per model-step; the anchor's cell ({ANCHOR_MODELS} models × "
              f"{ANCHOR_STEPS} steps) ≈ {cell / 3600:.2f} h at this thread count")
    print(f"  ratio dpcnn-small / logreg: {times['dpcnn-small'] / times['logreg']:.1f}")


if __name__ == "__main__":
    main()
