"""Time one epoch of a paper recipe (configs/papers/) on synthetic data of the recipe's image shape, and
extrapolate to the real data set's size — for planning where the real data is not at hand.

    .venv/bin/python bench/recipe_epoch.py configs/papers/rs-t2-cifar10-hcnn-eps3-rs.yaml --size 2400
    .venv/bin/python bench/recipe_epoch.py configs/papers/rs-t2-cifar10-hcnn-eps3-rs.yaml --size 60000 --device cuda

The recipe's first grid point runs through the harness's own ``prepare`` and ``train`` (the code path of
``dpeval run``; no results store) with ``data`` replaced by ``synthetic`` data of the same shape and classes:
``--size`` examples, a sixth of them held out as the test split (CIFAR-10's 50k/10k ratio). The logical batch
is the recipe's, capped at the private pool. One untimed pass of ``--epochs`` warms up first. An epoch = the
private pool's per-sample gradients, releases and optimizer steps plus one test-set evaluation, so its time
scales with the number of examples; the estimate for the real data set is the measured time × (real size /
synthetic size). Reported: wall time and the process's CPU time (with ``--threads 1`` on a shared machine,
CPU time is what an idle core would take; wall time also counts waiting for the core). On a GPU only the
wall time means anything, and the estimates extrapolate it. Printed as a Markdown row.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from dpeval.core.datasets import load_task
from dpeval.core.streams import seed_globals
from dpeval.engine.training import train
from dpeval.runner import prepare
from dpeval.sweep.grid import load_sweep

# Image shape and (train + test) examples of the real data sets the recipes name.
REAL = {"cifar10": ([3, 32, 32], 60_000), "svhn": ([3, 32, 32], 99_289), "mnist": ([1, 28, 28], 70_000),
        "fashionmnist": ([1, 28, 28], 70_000)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--size", type=int, default=2400, help="synthetic examples (train + test)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = load_sweep(args.recipe)[0]
    shape, real = REAL[spec.data.name]
    spec.data.name, spec.data.test_fraction, spec.data.max_train = "synthetic", 1 / 6, 0
    spec.data.synthetic.shape, spec.data.synthetic.classes, spec.data.synthetic.size = shape, 10, args.size
    spec.device = args.device
    spec.train.epochs = args.epochs
    spec.train.batch_size = min(spec.train.batch_size, len(load_task(spec.data).train))
    prep = prepare(spec)
    seed_globals(prep.streams)
    for _ in range(2):  # the first pass warms up (allocator, kernels, vmap); the second is timed
        defense = prep.make_defense(prep.streams.scope("victim"))
        cpu = time.process_time()
        result = train(prep.model, prep.task.train, prep.task.test, defense, spec.train, prep.sampler,
                       prep.device, progress=False)
        cpu = time.process_time() - cpu
    wall, cpu = result.train_s / args.epochs, cpu / args.epochs
    scale = real / args.size
    epochs = load_sweep(args.recipe)[0].train.epochs
    per = wall if prep.device.type == "cuda" else cpu  # on a GPU the process's CPU time is not the cost
    print("| recipe | device | threads | engine | examples | wall s / epoch | CPU s / epoch | est. s / epoch "
          "at real size | est. h, all epochs |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.recipe.stem} | {prep.device} | {torch.get_num_threads()} | {result.engine} | {args.size} | "
          f"{wall:.2f} | {cpu:.2f} | {per * scale:.1f} | {per * scale * epochs / 3600:.2f} |")

if __name__ == "__main__":
    main()
