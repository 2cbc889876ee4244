"""The noise multiplier GEP's reference code would use for a target ε, beside dpeval's.

The reference implementation of GEP (Yu et al., ICLR 2021) picks σ as the smallest value on a 0.01 grid whose ε
is below the target, with ε from the sampled Gaussian's RDP at orders 2, 2.1, …, 31.9, *doubled* for GEP (its
two releases, embedding and residual, treated as two independent sampled Gaussians at σ), and the classic
conversion ε = RDP(α) − log δ / (α − 1); T = epochs · N / B. dpeval accounts the joint release as one sampled
Gaussian of sensitivity √2 (docs/gep-adaclip.md), which needs a larger σ for the same ε. To compare with the
paper's numbers like for like, a run can be given the reference code's σ (``privacy.noise_multiplier``) and
reports the ε dpeval's joint accounting gives that σ.

    python bench/gep_reference_sigma.py --epsilon 2 --sample-rate 0.0166667 --steps 3000 [--delta 1e-5]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

ORDERS = np.arange(2, 32, 0.1)


def reference_epsilon(sigma: float, sample_rate: float, steps: int, delta: float, gep: bool) -> float:
    """ε by the reference code's rule: RDP of the sampled Gaussian (×2 for GEP), classic conversion."""
    from opacus.accountants.analysis.rdp import compute_rdp

    rdp = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=sigma, steps=steps, orders=list(ORDERS)))
    return float(np.nanmin((2 if gep else 1) * rdp - math.log(delta) / (ORDERS - 1)))


def reference_sigma(epsilon: float, sample_rate: float, steps: int, delta: float, gep: bool = True) -> float:
    """The smallest σ on the 0.01 grid whose reference-code ε is below ``epsilon``."""
    low, high = 1, 100_000  # in hundredths
    if reference_epsilon(high / 100, sample_rate, steps, delta, gep) >= epsilon:
        raise ValueError(f"ε = {epsilon} is out of reach at q = {sample_rate}, T = {steps}")
    while low < high:
        mid = (low + high) // 2
        if reference_epsilon(mid / 100, sample_rate, steps, delta, gep) < epsilon:
            high = mid
        else:
            low = mid + 1
    return high / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--sample-rate", type=float, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    from dpeval.core.accounting import epsilon_for

    for name, gep in (("GEP (RDP × 2)", True), ("GP / B-GEP", False)):
        sigma = reference_sigma(args.epsilon, args.sample_rate, args.steps, args.delta, gep)
        # dpeval's joint accounting of GEP: one sampled Gaussian at σ/√2 (B-GEP and GP: at σ)
        ours = epsilon_for(sigma / math.sqrt(2) if gep else sigma, args.sample_rate, args.steps, args.delta)
        print(f"{name:14} reference code's σ = {sigma:.2f}  (dpeval's ε of that σ: {ours:.3f})")


if __name__ == "__main__":
    main()
