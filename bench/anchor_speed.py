"""Wall time per model-step: the anchor's own DP-SGD training code (spalabucr/bb-audit-dpsgd: ``utils/dpsgd.py``'s
``clip_and_accum_grads`` on its ``models/cnn.py`` / ``models/lr.py``, then its noise and SGD step as in
``audit_model.py``'s ``train_model``) against dpeval's final-model audit on the same setting (1,000 MNIST records,
full batch, C = 1, lr 1.33e-4 on the sum, ε = 10), side by side in one process, alternating, same thread count.

    git clone / fetch spalabucr/bb-audit-dpsgd to THEIRS (a checkout of its files)
    OMP_NUM_THREADS=1 .venv/bin/python bench/anchor_speed.py THEIRS [--steps 5] [--repeats 3]

Their ``audit_model.py`` itself imports opacus, dill and privacy_estimates at the top; only its training loop is
timed here, restated in ``their_step`` from their ``train_model`` (nothing of theirs is copied into dpeval).
dpeval's side is ``run_model_audit`` with ``--training sequential`` and 20 models, its ``time.train_s`` divided by
the model-steps (the per-model set-up included).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch


def their_step(model, x, y, optimizer, clip_and_accum_grads, sigma: float) -> None:
    """One step of their ``train_model``: per-sample gradients clipped and summed in blocks of 1,000, Gaussian
    noise σ·C on every parameter, ``optimizer.step()``."""
    optimizer.zero_grad()
    accum, _ = clip_and_accum_grads(model, x, y, optimizer, torch.nn.CrossEntropyLoss(), 1.0, block_size=1000)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.grad = accum[name] + sigma * torch.randn_like(accum[name])
    optimizer.step()


def import_theirs(theirs: Path, name: str) -> None:
    """Their top-level package ``name`` imported from their checkout, registered under its own name so that their
    imports of it resolve (their checkout is not put on ``sys.path``: nothing else is looked up there)."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(theirs)])
    if spec is None:
        raise SystemExit(f"no package {name!r} in {theirs}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if spec.loader is not None:  # None for a folder without __init__.py (a namespace package): nothing to run
        spec.loader.exec_module(module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("theirs", type=Path)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import_theirs(args.theirs, "models")
    import_theirs(args.theirs, "utils")
    from models import Models  # theirs
    from utils.dpsgd import clip_and_accum_grads  # theirs

    from dpeval.audit.model import ModelAuditOptions, run_model_audit
    from dpeval.config import build_spec
    from dpeval.core.datasets import load_task

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} cores, load average {load:.1f}, torch threads {torch.get_num_threads()}")
    spec_of = {"cnn": "tanh-cnn-mnist", "lr": "logreg"}
    for theirs_name, ours_name in spec_of.items():
        raw = {"defense": {"name": "dpsgd", "clip": 1.0}, "data": {"name": "mnist", "max_train": 1000},
               "model": {"name": ours_name}, "train": {"epochs": args.steps, "optimizer": "sgd", "lr": 1.33e-4,
                                                       "engine": "func" if ours_name != "logreg" else "auto"},
               "privacy": {"epsilon": 10.0, "accountant": "prv"}}
        spec = build_spec(raw)
        task = load_task(spec.data)
        x = ((task.train.x - 0.1307) / 0.3081).float()  # their normalisation
        y = task.train.y
        ours, mine = [], []
        for _ in range(args.repeats):
            model = Models[theirs_name](x.shape, out_dim=10)
            optimizer = torch.optim.SGD(model.parameters(), lr=1.33e-4)
            started = time.perf_counter()
            for _ in range(args.steps):
                their_step(model, x, y, optimizer, clip_and_accum_grads, 0.7)
            ours.append((time.perf_counter() - started) / args.steps)
            result = run_model_audit(spec, ModelAuditOptions(models=20, training="sequential"))
            mine.append(result["time.train_s"] / (20 * args.steps))
        theirs_best, mine_best = min(ours), min(mine)
        print(f"{ours_name:<15} theirs {theirs_best * 1e3:7.1f} ms per model-step, dpeval {mine_best * 1e3:7.1f} ms "
              f"(best of {args.repeats}); dpeval / theirs = {mine_best / theirs_best:.2f}", flush=True)


if __name__ == "__main__":
    main()
