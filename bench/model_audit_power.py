"""What the final-model audit's estimators can read from a perfectly tight mechanism: simulated Gaussian scores
(out-models N(0, 1), in-models N(μ, 1), half and half as ``balanced_labels`` draws them), judged by the audit's
held-out GDP test (threshold on the first half of the models, rates on the second, level 0.05 / 4 as in the audit)
and by the anchor's reading (``anchor_reading``: every threshold, all models, not a bound).

    .venv/bin/python bench/model_audit_power.py [--mu 2.0] [--models 200 1000 2000] [--repetitions 40]
"""

from __future__ import annotations

import argparse

import numpy as np

from dpeval.audit.model import ALPHA, ESTIMATORS, STATISTICS, anchor_reading, balanced_labels, gdp_split_test
from dpeval.core.one_run_bounds import gdp_epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mu", type=float, nargs="+", default=[1.67, 2.0])
    parser.add_argument("--models", type=int, nargs="+", default=[200, 1000, 2000])
    parser.add_argument("--repetitions", type=int, default=40)
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    level = ALPHA / (len(STATISTICS) * len(ESTIMATORS))
    print("mu,true_epsilon,models,held_out_median,held_out_q10,held_out_q90,anchor_median")
    for mu in args.mu:
        for k in args.models:
            held, anchor = [], []
            for _ in range(args.repetitions):
                labels = balanced_labels(k, rng)
                scores = rng.normal(size=k) + mu * labels
                held.append(gdp_split_test(scores, labels, args.delta, level)["epsilon_lower_bound"])
                anchor.append(anchor_reading(scores, labels, args.delta)["epsilon"])
            q10, q90 = np.quantile(held, [0.1, 0.9])
            print(f"{mu},{gdp_epsilon(mu, args.delta):.2f},{k},{np.median(held):.2f},{q10:.2f},{q90:.2f},"
                  f"{np.median(anchor):.2f}", flush=True)


if __name__ == "__main__":
    main()
