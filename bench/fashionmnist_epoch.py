"""Seconds per epoch on the real Fashion-MNIST files (Debian's dataset-fashion-mnist), DP-CNN/S vs H-CNN/S,
non-private vs dpsgd vs rs, with the Table-2 recipe's batch and optimizer — one run, ratios side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fashionmnist_epoch.py --epochs 2 --threads 1

Each row trains a fresh model through the harness's own ``prepare`` and ``train`` (the code path of
``dpeval run``, no results store) on the whole 60,000-image pool for ``--epochs`` epochs and reports, per
epoch, the wall time and the process's CPU time of the epochs alone, and separately the one-off cost of the
model's fixed front (normalisation; for H-CNN the scattering transform) over the 70,000 train and test images,
which ``train`` computes once per run and reuses every epoch. "Per epoch, 40 epochs" amortises it over a
Table-2 run: (front + 40 × epoch) / 40. CPU time is what an idle core would take when the machine is shared.
"""

from __future__ import annotations

import argparse
import time

import torch

from dpeval.config import build_spec
from dpeval.core.streams import seed_globals
from dpeval.engine.training import train
from dpeval.runner import prepare

RECIPE = {"train": {"batch_size": 2048, "physical_batch_size": 512, "optimizer": "sgd", "lr": 4.0, "momentum": 0.9,
                    "sampling": "shuffle"}, "data": {"name": "fashionmnist", "public_fraction": 0.0},
          "privacy": {"epsilon": 3.0, "delta": 1e-5}}
DEFENSES = {"non-private": {"name": "none"}, "dpsgd": {"name": "dpsgd", "clip": 0.1},
            "rs": {"name": "rs", "clip": 0.1, "final_rate": 0.9, "schedule": "linear"}}


def measure(model: str, defense: str, epochs: int) -> dict[str, float]:
    """Per-epoch wall and CPU seconds of ``train`` without its one-off front, and the front's."""
    raw = {**RECIPE, "model": {"name": model}, "defense": DEFENSES[defense],
           "train": {**RECIPE["train"], "epochs": epochs}}
    spec = build_spec(raw)
    prep = prepare(spec)
    seed_globals(prep.streams)
    cpu = time.process_time()
    result = train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")),
                   spec.train, prep.sampler, prep.device, progress=False)
    cpu = time.process_time() - cpu
    return {"front": result.front_s, "front_cpu": result.front_cpu_s,
            "wall": (result.train_s - result.front_s) / epochs,
            "cpu": (cpu - result.front_cpu_s) / epochs, "acc": result.history[-1]["test_accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=["dpcnn-small", "hcnn-small"])
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=list(DEFENSES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {(m, d): measure(m, d, args.epochs) for d in args.defenses for m in args.models}
    print(f"threads {torch.get_num_threads()}, {args.epochs} epochs of 60,000 images, B = 2048, physical 512")
    print("| model | defense | front once, wall / CPU s | wall s / epoch | CPU s / epoch | per epoch, 40 epochs "
          "(wall / CPU) | × DP-CNN/S (wall / CPU) | test acc after |")
    print("|---|---|---|---|---|---|---|---|")
    def amortised(r: dict[str, float]) -> tuple[float, float]:
        return (r["front"] + 40 * r["wall"]) / 40, (r["front_cpu"] + 40 * r["cpu"]) / 40

    for (m, d), r in rows.items():
        wall, cpu = amortised(r)
        base = rows.get(("dpcnn-small", d))
        ratio = "–" if base is None else f"{wall / amortised(base)[0]:.2f} / {cpu / amortised(base)[1]:.2f}"
        print(f"| {m} | {d} | {r['front']:.1f} / {r['front_cpu']:.1f} | {r['wall']:.1f} | {r['cpu']:.1f} | "
              f"{wall:.1f} / {cpu:.1f} | {ratio} | {r['acc']:.3f} |")


if __name__ == "__main__":
    main()
