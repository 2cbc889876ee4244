"""Time to train K digits shadow models: one after another vs vectorised, side by side in one run.

Both paths train the same models (same initialisations, batches and defense noise streams); the script
also prints the mean held-out accuracy of each set to show they agree.

    .venv/bin/python bench/shadow_training.py --shadows 16 --defense dpsgd
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from dpeval.attacks import shadow_signals as sig
from dpeval.config import build_spec
from dpeval.engine.shadow_training import train_shadows, train_shadows_sequential
from dpeval.runner import prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shadows", type=int, default=16)
    parser.add_argument("--defense", default="dpsgd")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    spec = build_spec({"defense": args.defense, "train": {"epochs": args.epochs}})
    prep = prepare(spec)
    task = prep.task
    pop = sig.population(task)
    membership = sig.membership_matrix(args.shadows, len(pop.y), prep.streams.scope("shadows").generator("membership"))
    pools = [torch.nonzero(row).flatten() for row in membership]
    scopes = [prep.streams.scope("shadow", i) for i in range(args.shadows)]
    build = prep.build_model

    def accuracy(states):
        model, accs = build(), []
        for i, state in enumerate(states):
            model.load_state_dict(state)
            out = ~membership[i]
            with torch.no_grad():
                accs.append(float((model(pop.x[out]).argmax(1) == pop.y[out]).float().mean()))
        return sum(accs) / len(accs)

    device = torch.device("cpu")
    print(f"{args.shadows} shadow models, digits/{prep.model_name}, defense {args.defense}, {args.epochs} epochs, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"{torch.get_num_threads()} torch threads")
    t0 = time.perf_counter()
    seq = train_shadows_sequential(build, pop.x, pop.y, pools, lambda i, m, s: prep.make_defense(scopes[i], m, s),
                                   spec.train, scopes, device, progress=False)
    t1 = time.perf_counter()
    vec = train_shadows(build, pop.x, pop.y, pools, lambda i, m, s: prep.make_defense(scopes[i], m, s), spec.train,
                        scopes, device, progress=False)
    t2 = time.perf_counter()
    print(f"{'path':<12}{'seconds':>10}{'mean held-out acc':>20}")
    print(f"{'sequential':<12}{t1 - t0:>10.1f}{accuracy(seq):>20.4f}")
    print(f"{'vectorised':<12}{t2 - t1:>10.1f}{accuracy(vec):>20.4f}")
    print(f"speed-up: {(t1 - t0) / (t2 - t1):.2f}x")


if __name__ == "__main__":
    main()
