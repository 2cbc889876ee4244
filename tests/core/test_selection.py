"""The price of tuning on private data: plain composition and Papernot & Steinke's random-stopping bound, each
against an independent computation (the distribution's mean by summing its pmf; the bound for the plain
Gaussian mechanism, whose RDP curve and best λ̂ have closed forms)."""

import math

import numpy as np
import pytest

from dpeval.core.accounting import (
    RDP_ORDERS,
    composition,
    epsilon_for,
    gaussian_rdp,
    random_stopping_cost,
    random_stopping_rdp,
    rdp_to_dp,
    tnb_gamma_for_mean,
    tnb_mean,
)


def tnb_pmf(eta: float, gamma: float, k: int) -> float:
    """P[K = k] of the truncated negative binomial, written from its definition."""
    if eta == 0:
        return (1 - gamma) ** k / (k * math.log(1 / gamma))
    coefficient = math.prod((ell + eta) / (ell + 1) for ell in range(k))
    return coefficient * (1 - gamma) ** k / (gamma ** (-eta) - 1)


@pytest.mark.parametrize("eta,gamma", [(0.0, 0.2), (0.0, 0.05), (1.0, 0.1), (0.5, 0.3), (2.0, 0.25)])
def test_tnb_mean_is_the_mean_of_its_pmf(eta, gamma):
    ks = range(1, 5000)
    probs = [tnb_pmf(eta, gamma, k) for k in ks]
    assert math.fsum(probs) == pytest.approx(1.0, abs=1e-9)
    assert tnb_mean(eta, gamma) == pytest.approx(math.fsum(k * p for k, p in zip(ks, probs)), rel=1e-8)


@pytest.mark.parametrize("eta,mean", [(0.0, 12), (1.0, 12), (0.0, 2), (1.0, 100)])
def test_gamma_is_chosen_for_the_mean(eta, mean):
    assert tnb_mean(eta, tnb_gamma_for_mean(eta, mean)) == pytest.approx(mean, rel=1e-9)
    if eta == 1.0:
        assert tnb_gamma_for_mean(eta, mean) == pytest.approx(1 / mean, rel=1e-9)  # the geometric


def test_composition_adds_epsilons_and_deltas():
    assert composition([3.0] * 12, [1e-5] * 12) == pytest.approx((36.0, 1.2e-4))


def test_rdp_of_the_full_batch_gaussian_is_the_closed_form():
    sigma, steps = 3.0, 50
    assert gaussian_rdp(sigma, 1.0, steps) == pytest.approx([steps * a / (2 * sigma**2) for a in RDP_ORDERS],
                                                             rel=1e-9)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_random_stopping_matches_the_theorem_for_the_gaussian_mechanism(eta):
    """Q = T steps of the Gaussian mechanism (q = 1): ε(λ) = ρλ with ρ = T/(2σ²), and the theorem's
    (1 + η)[(1 − 1/λ̂)ε(λ̂) + log(1/γ)/λ̂] = (1 + η)[ρ(λ̂ − 1) + log(1/γ)/λ̂] is smallest at λ̂* = √(log(1/γ)/ρ)
    (if ≥ 1). The grid of orders can only do worse than the continuous optimum, and not by much."""
    sigma, steps, trials, delta = 20.0, 100, 12, 1e-5
    rho = steps / (2 * sigma**2)
    gamma = tnb_gamma_for_mean(eta, trials)
    a_hat = max(1.0, math.sqrt(math.log(1 / gamma) / rho))
    extra = (1 + eta) * (rho * (a_hat - 1) + math.log(1 / gamma) / a_hat)
    expected = [rho * a + extra + math.log(trials) / (a - 1) for a in RDP_ORDERS]
    ours = random_stopping_rdp(gaussian_rdp(sigma, 1.0, steps), eta, gamma)
    assert all(o >= e - 1e-9 for o, e in zip(ours, expected))
    assert ours == pytest.approx(expected, rel=0.02)
    # (ε, δ) by the conversion ε = min_λ ε'(λ) + log((λ − 1)/λ) − (log δ + log λ)/(λ − 1), on a fine grid
    fine = np.linspace(1.01, 200, 50_000)
    by_hand = float(np.min(rho * fine + extra + math.log(trials) / (fine - 1) + np.log((fine - 1) / fine)
                           - (math.log(delta) + np.log(fine)) / (fine - 1)))
    assert rdp_to_dp(ours, delta) == pytest.approx(by_hand, rel=0.02)
    assert rdp_to_dp(ours, delta) >= by_hand - 1e-9


def test_rdp_conversion_is_the_accountant_s():
    sigma, q, steps, delta = 1.1, 0.05, 400, 1e-5
    assert rdp_to_dp(gaussian_rdp(sigma, q, steps), delta) == pytest.approx(epsilon_for(sigma, q, steps, delta),
                                                                            rel=1e-3)


def test_random_stopping_costs_a_small_multiple_of_one_run_and_far_less_than_composition():
    sigma, q, steps, delta = 2.275, 0.1017, 180, 1e-5
    one = epsilon_for(sigma, q, steps, delta)
    cost = random_stopping_cost(gaussian_rdp(sigma, q, steps), 12, delta)
    assert one < cost["epsilon"] < 3 * one < 12 * one
    assert cost["mean_trials"] == pytest.approx(12) and cost["eta"] in (0.0, 1.0)
    more = random_stopping_cost(gaussian_rdp(sigma, q, steps), 100, delta)
    assert more["epsilon"] > cost["epsilon"]  # more trials cost more, logarithmically
