"""Bounds on the informed adversary's reconstruction success (dpeval.core.rero), against independent computations:
the μ-GDP closed form where the mechanism is exactly GDP (q = 1), a Monte-Carlo estimate of the trade-off function
as Hayes et al.'s notebook computes it, the RDP bound over a dense grid of orders, and the figures published for the
benchmark's recipe."""

import math

import numpy as np
import pytest
from scipy import stats

from dpeval.core import rero
from dpeval.core.accounting import epsilon_for


def monte_carlo_bound(sigma, q, steps, n, draws, rng):
    """Hayes et al.'s estimator: x ~ P = N(0, σ²)^T, L = log(Q/P)(x); with κ = 1/n the test rejecting P on the κ
    highest losses has type-II error (1 − κ)·mean(e^L over the other draws)."""
    x = rng.normal(0.0, sigma, size=(draws, steps))
    loss = np.log1p(q * np.expm1((2 * x - 1) / (2 * sigma**2))).sum(axis=1)
    kappa = 1.0 / n
    kept = np.sort(loss)[: int(round((1 - kappa) * draws))]
    return 1.0 - (1 - kappa) * np.exp(kept).mean()


@pytest.mark.parametrize("sigma, steps, n", [(2.0, 100, 8), (5.0, 100, 8), (1.0, 4, 10), (3.0, 10, 2)])
def test_full_batch_is_exactly_gdp(sigma, steps, n):
    """q = 1: T Gaussian steps of sensitivity 1 are √T/σ-GDP, and the bound is Φ(Φ⁻¹(1/n) + √T/σ)."""
    expected = stats.norm.cdf(stats.norm.ppf(1 / n) + math.sqrt(steps) / sigma)
    assert rero.tradeoff_bound([(sigma, 1.0, steps)], n) == pytest.approx(expected, abs=2e-3)
    assert rero.gdp_bound(math.sqrt(steps) / sigma, n) == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
def test_subsampled_bound_matches_monte_carlo():
    rng = np.random.default_rng(0)
    for sigma, q, steps, n in [(1.0, 0.1, 50, 10), (0.8, 0.05, 200, 4)]:
        estimate = monte_carlo_bound(sigma, q, steps, n, 100_000, rng)
        assert rero.tradeoff_bound([(sigma, q, steps)], n) == pytest.approx(estimate, abs=0.01), (sigma, q, steps)


# The benchmark's recipe (Fashion-MNIST, 5,000 private images): q ≈ 0.034, about 900 steps, σ by Opacus' RDP for
# ε = 1, 3, 8 at δ = 1e-5; the tight bound, the RDP ReRo bound and the (ε, δ) one for n = 10, and the tight one for
# n = 2, as published beside the informed-adversary papers' formulas.
RECIPE = [  # σ, bound n=10, RDP n=10, (ε, δ) n=10, bound n=2
    (4.258, 0.15, 0.16, 0.27, 0.60),
    (1.731, 0.26, 0.33, 0.96, 0.74),
    (0.958, 0.53, 0.76, 1.00, 0.91),
]


@pytest.mark.parametrize("sigma, tight, rdp, dp, two", RECIPE)
def test_the_benchmark_recipes_published_bounds(sigma, tight, rdp, dp, two):
    releases = [(sigma, 0.034, 900)]
    eps = epsilon_for(sigma, 0.034, 900, 1e-5)
    got = rero.bounds(releases, eps, 1e-5, 10)
    assert got["bound"] == pytest.approx(tight, abs=0.015)
    assert got["bound_rdp"] == pytest.approx(rdp, abs=0.015)
    assert got["bound_dp"] == pytest.approx(dp, abs=0.015)
    assert rero.tradeoff_bound(releases, 2) == pytest.approx(two, abs=0.015)
    assert 0.1 < got["bound"] < got["bound_rdp"] <= got["bound_dp"]  # the trade-off bound is the tightest


def test_rdp_bound_against_the_closed_form_curve():
    """q = 1: ε(α) = αT/(2σ²); the bound minimised over a dense grid of orders (the module's grid is coarser, so
    its minimum is at least the dense one's and close to it)."""
    sigma, steps, n = 3.0, 20, 10
    alphas = np.linspace(1.01, 200, 200_000)
    dense = np.min(np.exp((alphas - 1) / alphas * (alphas * steps / (2 * sigma**2) - math.log(n))))
    got = rero.rdp_bound([(sigma, 1.0, steps)], n)
    assert dense - 1e-9 <= got <= dense + 0.01


def test_dp_bound_and_mu_inverse():
    assert rero.dp_bound(0.0, 0.0, 10) == pytest.approx(0.1)
    assert rero.dp_bound(1.0, 1e-5, 10) == pytest.approx(math.e / 10 + 1e-5)
    assert rero.dp_bound(math.inf, 1e-5, 10) == 1.0
    for mu in (0.1, 0.7, 2.0):
        assert rero.gdp_mu_of(rero.gdp_bound(mu, 10), 10) == pytest.approx(mu, rel=1e-9)
    assert rero.gdp_mu_of(0.05, 10) == 0.0  # below chance: no evidence of leakage
    assert rero.gdp_mu_of(1.0, 10) == math.inf


def test_a_noiseless_mechanism_allows_certain_success_and_composition_only_adds():
    assert rero.tradeoff_bound([(0.0, 0.5, 10)], 10) == 1.0
    alone = rero.tradeoff_bound([(2.0, 0.1, 100)], 10)
    with_pca = rero.tradeoff_bound([(4.0, 1.0, 1), (2.0, 0.1, 100)], 10)
    assert alone < with_pca < alone + 0.1
    with pytest.raises(ValueError, match="candidates"):
        rero.tradeoff_bound([(2.0, 0.1, 100)], 1)
