"""Accuracy vs RS final rate r* on digits at fixed noise (the RS paper's Fig. 2 view), side by side.

Each setting fixes σ (privacy.noise_multiplier) and C, trains with gradual cooling to each r*, several
seeds, and prints mean ± SEM of train and test accuracy with the difference to r* = 0 of the same
setting. The paper's claim: RS helps more when the noise term σ²C²·d/B² dominates.

    .venv/bin/python bench/rs_final_rate_digits.py --setting 1.0:0.5 --setting 4.0:1.0 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from dpeval.config import build_spec, set_dotted
from dpeval.core.streams import seed_globals
from dpeval.engine.training import accuracy, train
from dpeval.runner import prepare


def run_once(sigma: float, clip: float, rate: float, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    raw: dict = {}
    for key, value in {
        "defense.name": "rs", "defense.clip": clip, "defense.final_rate": rate, "defense.schedule": "linear",
        "privacy.noise_multiplier": sigma, "train.epochs": args.epochs, "train.batch_size": args.batch_size,
        "train.optimizer": args.optimizer, "train.lr": args.lr, "train.momentum": args.momentum,
        "seed": seed, "device": "cpu",
    }.items():
        set_dotted(raw, key, value)
    spec = build_spec(raw)
    prep = prepare(spec)
    seed_globals(prep.streams)
    train(prep.model, prep.task.train, prep.task.test, prep.make_defense(prep.streams.scope("victim")), spec.train,
          prep.sampler,
          prep.device, progress=False)
    return accuracy(prep.model, prep.task.train, prep.device), accuracy(prep.model, prep.task.test, prep.device)


def mean_sem(values: list[float]) -> str:
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sem:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", action="append", default=None, metavar="SIGMA:CLIP",
                        help="fixed noise multiplier and clip norm (repeatable)")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.0)
    args = parser.parse_args()
    settings = [tuple(map(float, s.split(":"))) for s in (args.setting or ["1.0:0.5", "4.0:1.0"])]

    print(f"digits, cnn3, rs linear cooling, {args.optimizer} lr={args.lr} momentum={args.momentum}, "
          f"B={args.batch_size}, {args.epochs} epochs, seeds {args.seeds}\n")
    print("| σ | C | σ²C² | r* | train acc | test acc | Δ train vs r*=0 | Δ test vs r*=0 |")
    print("|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    for sigma, clip in settings:
        base_train = base_test = None
        for rate in args.rates:
            results = [run_once(sigma, clip, rate, seed, args) for seed in args.seeds]
            tr, te = [r[0] for r in results], [r[1] for r in results]
            if base_train is None:
                base_train, base_test = tr, te
            d_tr = [a - b for a, b in zip(tr, base_train)]
            d_te = [a - b for a, b in zip(te, base_test)]
            print(f"| {sigma:g} | {clip:g} | {sigma**2 * clip**2:g} | {rate:g} | {mean_sem(tr)} | {mean_sem(te)} "
                  f"| {mean_sem(d_tr)} | {mean_sem(d_te)} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
