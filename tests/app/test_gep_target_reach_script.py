"""bench/gep_target_reach.py: the fraction of GEP's accounted μ that a statistic along the target's gradient sees,
against a simulation of GEP's two noisy releases."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import load_bench_script

reach = load_bench_script("gep_target_reach").reach


def simulated_reach(theta_norm: float, residual_norm: float, clip0: float, clip1: float, draws: int = 200_000) -> float:
    """One GEP step released with and without the target (σ_acc = 1, so σ = √2 and the accounted μ is 1), scored by
    g · release; the standardised shift of the in-scores over the out-scores."""
    gen = torch.Generator().manual_seed(0)
    d, k, sigma = 60, 6, math.sqrt(2)
    basis, _ = torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))
    theta = torch.randn(k, generator=gen, dtype=torch.float64)
    theta *= theta_norm / theta.norm()
    residual = torch.randn(d, generator=gen, dtype=torch.float64)
    residual -= basis @ (basis.T @ residual)
    residual *= residual_norm / residual.norm()
    g = basis @ theta + residual
    clipped = basis @ (theta * min(1, clip0 / theta_norm)) + residual * min(1, clip1 / residual_norm)
    noise = (torch.randn(draws, k, generator=gen, dtype=torch.float64) * sigma * clip0) @ basis.T \
        + torch.randn(draws, d, generator=gen, dtype=torch.float64) * sigma * clip1
    out_scores = noise[: draws // 2] @ g
    in_scores = (noise[draws // 2:] + clipped) @ g
    return float((in_scores.mean() - out_scores.mean()) / out_scores.std())


@pytest.mark.parametrize("theta_norm, residual_norm", [(0.889, 0.867), (1e-3, 1.0), (1.0, 1e-3), (0.05, 0.01)])
def test_reach_matches_a_simulated_gep_step(theta_norm, residual_norm):
    # the column's split at crafted θ₀, nearly all residual, nearly all embedding, both under their clips
    assert reach(theta_norm, residual_norm, 0.1, 0.02) == pytest.approx(
        simulated_reach(theta_norm, residual_norm, 0.1, 0.02), rel=0.015)


def test_one_part_alone_reaches_below_the_accounted_mu():
    # the residual alone at its clip: sensitivity 1 of the accounted √2
    assert reach(0.0, 1.0, 0.1, 0.02) == pytest.approx(1 / math.sqrt(2))
    # the embedding alone at its clip: 1/√2, less the residual noise that also falls in the subspace
    assert reach(1.0, 0.0, 0.1, 0.02) == pytest.approx(0.1 / math.sqrt(2 * (0.1 ** 2 + 0.02 ** 2)))
    assert reach(0.889, 0.867, 0.1, 0.02) < 1
