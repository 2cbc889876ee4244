"""Accounting checked against independent computations, not against itself."""

import math

import numpy as np
import pytest
from opacus.accountants.utils import get_noise_multiplier
from scipy import special, stats

from dpeval.core.accounting import default_delta, epsilon_for, epsilon_of, noise_for, steps_for
from dpeval.core.errors import ConfigError


def independent_rdp(sigma: float, q: float, steps: int, alpha: int) -> float:
    """RDP(α) of T subsampled Gaussian steps from first principles, integer α: A_α = Σ_k C(α,k)(1-q)^(α-k) q^k
    exp((k²-k)/(2σ²)) (Mironov et al. 2019), RDP(α) = T·log(A_α)/(α-1); q = 1 is the Gaussian's α/(2σ²)."""
    if q == 1:
        return steps * alpha / (2 * sigma**2)
    k = np.arange(alpha + 1)
    log_terms = (special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
                 + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2))
    return steps * special.logsumexp(log_terms) / (alpha - 1)


def independent_rdp_epsilon(sigma: float, q: float, steps: int, delta: float,
                            before: tuple[tuple[float, float, int], ...] = (), max_order: int = 256) -> float:
    """ε of the composition (RDP adds up order by order) from first principles, integer orders only (an upper
    bound on what fractional orders give), converted with Balle et al. (2020):
    ε = RDP + log((α-1)/α) - (log δ + log α)/(α-1)."""
    best = math.inf
    for alpha in range(2, max_order):
        rdp = sum(independent_rdp(s, r, n, alpha) for s, r, n in [*before, (sigma, q, steps)])
        eps = rdp + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
        best = min(best, eps)
    return best


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.01, 1000), (1.5, 0.02, 2000), (3.5, 0.2, 120), (0.8, 0.05, 200)])
def test_rdp_epsilon_matches_independent_computation(sigma, q, steps):
    ours = epsilon_for(sigma, q, steps, 1e-5)
    ref = independent_rdp_epsilon(sigma, q, steps, 1e-5)
    # Opacus also uses fractional orders, so it may only be tighter, and only slightly.
    assert ours <= ref + 1e-9
    assert ours >= 0.97 * ref


def test_single_gaussian_release_is_never_underestimated():
    """q = 1, T = 1: the exact (ε, δ) curve of the Gaussian mechanism (Balle & Wang 2018) is
    δ(ε) = Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ). Any sound accountant's ε must be at least the exact ε."""
    sigma, delta = 2.0, 1e-5

    def exact_delta(eps):
        return stats.norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma)

    lo, hi = 0.0, 20.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if exact_delta(mid) > delta else (lo, mid)
    exact_eps = hi
    for accountant in ("rdp", "prv"):
        eps = epsilon_for(sigma, 1.0, 1, delta, accountant)
        assert eps >= exact_eps * 0.999, accountant
    assert epsilon_for(sigma, 1.0, 1, delta, "prv") == pytest.approx(exact_eps, rel=0.05)


@pytest.mark.parametrize("eps", [1.0, 3.0, 8.0])
def test_calibration_reaches_target_without_exceeding_it(eps):
    q, steps, delta = 0.02, steps_for(40, 0.02), 1e-5
    sigma = noise_for(eps, delta, q, steps)
    spent = epsilon_for(sigma, q, steps, delta)
    assert spent <= eps
    assert spent >= 0.995 * eps  # docs/privacy.md: within 0.5% below the target
    # Same σ as Opacus' own calibration entry point, up to its bracket width.
    opacus_sigma = get_noise_multiplier(target_epsilon=eps, target_delta=delta, sample_rate=q, epochs=40,
                                        accountant="rdp", epsilon_tolerance=0.01)
    assert sigma == pytest.approx(opacus_sigma, rel=0.02)


def plain_bisection(epsilon, delta, q, steps, before=()):
    """The calibration's search with every ε evaluated over all orders (the shortcut of ``noise_for`` left out)."""
    tolerance = min(0.01, 0.005 * epsilon)

    def eps(sigma):
        return epsilon_of([*before, (sigma, q, steps)], delta)

    low, high = 0.0, 10.0
    eps_high = eps(high)
    while eps_high > epsilon:
        low, high = high, 2 * high
        eps_high = eps(high)
    while epsilon - eps_high > tolerance:
        mid = (low + high) / 2
        eps_mid = eps(mid)
        if eps_mid < epsilon:
            high, eps_high = mid, eps_mid
        else:
            low = mid
    return high


@pytest.mark.parametrize("case", [(3.0, 1e-5, 128 / 1258, 45, ()), (1.0, 1e-5, 0.004, 7500, ()),
                                  (3.0, 1e-5, 0.1, 100, ((2.0, 1.0, 1),))])
def test_the_calibrations_shortcut_changes_no_sigma(case):
    """``noise_for`` skips the full evaluation where ε at the last evaluation's order alone already puts σ below the
    target by more than the tolerance: the σ it returns is the plain bisection's, to the bit."""
    epsilon, delta, q, steps, before = case
    assert noise_for(epsilon, delta, q, steps, before=before) == plain_bisection(epsilon, delta, q, steps, before)


def test_prv_calibration():
    sigma = noise_for(3.0, 1e-5, 0.02, 2000, "prv")
    assert 0.995 * 3.0 <= epsilon_for(sigma, 0.02, 2000, 1e-5, "prv") <= 3.0


def test_delta_rule():
    assert default_delta(1257) == 1e-5
    assert default_delta(50_000) == 1e-5
    assert default_delta(100_000) == pytest.approx(5e-6)
    assert default_delta(100_000) < 1 / 100_000


def test_steps_rule():
    assert steps_for(40, 0.02) == 2000
    assert steps_for(3, 256 / 1257) == 3 * 4


@pytest.mark.parametrize("n,b", [(2976, 32), (50_000, 1000), (1437, 64), (60_000, 256), (1000, 3), (999, 333),
                                 (10**8, 7), (100, 100)])
def test_steps_from_q_are_the_steps_training_takes(n, b):
    """Training takes ⌊N/B⌋ steps an epoch; from q = B/N alone the count must agree, including when N/B
    is whole and 1/q lands just below it in floating point (32/2976: 1/q = 92.99999999999999)."""
    assert steps_for(10, b / n) == 10 * (n // b)


def test_the_float_rounding_case_no_longer_under_reports():
    q = 32 / 2976
    assert int(1 / q) == 92  # what ⌊1/q⌋ alone counts
    assert steps_for(10, q) == 930
    assert epsilon_for(1.0, q, steps_for(10, q), 1e-5) > epsilon_for(1.0, q, 920, 1e-5)


@pytest.mark.parametrize("eps,delta,q,steps", [
    (-1, 1e-5, 0.1, 10), (1, 1.0, 0.1, 10), (1, 1e-5, 0, 10), (1, 1e-5, 0.1, 0),
    (math.inf, 1e-5, 0.1, 10), (math.nan, 1e-5, 0.1, 10), (1e300, 1e-5, 0.1, 10),
])
def test_bad_inputs_raise_config_error(eps, delta, q, steps):
    with pytest.raises(ConfigError):
        noise_for(eps, delta, q, steps)


def test_zero_noise_is_infinite_epsilon():
    assert epsilon_for(0.0, 0.1, 10, 1e-5) == math.inf


@pytest.mark.parametrize("sigma", [math.nan, math.inf, 1e-300, 1e300])
def test_sigma_the_accountant_cannot_evaluate_is_a_config_error(sigma):
    with pytest.raises(ConfigError, match="privacy.noise_multiplier"):
        epsilon_for(sigma, 0.01, 100, 1e-5)


def test_calibration_refuses_a_target_that_needs_no_noise():
    """Above the ε that σ = 0.01 spends, Opacus' search would never end; below it calibration works."""
    floor = epsilon_for(0.01, 0.01, 100, 1e-5)
    with pytest.raises(ConfigError, match="privacy.epsilon: .* is met even by σ = 0.01"):
        noise_for(floor * 1.01, 1e-5, 0.01, 100)
    assert noise_for(50.0, 1e-5, 0.01, 100) > 0.01


def test_small_targets_are_reached_with_the_large_orders():
    """ε = 0.1 at δ = 1e-5 needs RDP orders near 116 (Opacus' default orders stop at 63, where the conversion
    alone costs 0.186): calibrated, and checked against the first-principles computation over orders to 1024."""
    q, steps, delta = 0.01, 500, 1e-5
    sigma = noise_for(0.1, delta, q, steps)
    assert 0.0995 <= epsilon_for(sigma, q, steps, delta) <= 0.1
    ref = independent_rdp_epsilon(sigma, q, steps, delta, max_order=1025)
    # every integer order up to 1024 there, a coarser grid of large orders here (112, 128, …): as tight within 1%
    assert ref * 0.97 <= epsilon_for(sigma, q, steps, delta) <= ref * 1.01


def test_calibration_after_an_earlier_release_composes_both():
    """A DP-PCA (one Gaussian release, q = 1) before training: the training σ is calibrated so the composition of
    both meets the target, as the first-principles RDP sum says; training alone at that σ spends less."""
    before = ((30.0, 1.0, 1),)
    q, steps, delta, target = 0.01, 2000, 1e-5, 1.0
    sigma = noise_for(target, delta, q, steps, before=before)
    total = epsilon_of([*before, (sigma, q, steps)], delta)
    assert 0.995 * target <= total <= target
    ref = independent_rdp_epsilon(sigma, q, steps, delta, before=before)
    assert ref * 0.97 <= total <= ref * 1.01
    assert epsilon_for(sigma, q, steps, delta) < total
    assert sigma > noise_for(target, delta, q, steps)  # the earlier release leaves training less budget


def test_a_budget_spent_before_training_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="spent before training"):
        noise_for(0.1, 1e-5, 0.01, 100, before=((0.5, 1.0, 1),))


def test_rdp_curves_without_importing_opacus_are_opacus_curves_and_leave_torch_unloaded():
    """The leaderboard prices selections from RDP curves: loaded from Opacus' analysis file alone they match the
    imported module's to the bit, against the first-principles curve too, and neither torch nor opacus' engine is
    imported on the way (a fresh process, as the CLI starts)."""
    import json
    import subprocess
    import sys

    from opacus.accountants.analysis.rdp import compute_rdp

    code = ("import json, sys\nfrom dpeval.core.accounting import gaussian_rdp\n"
            "curve = gaussian_rdp(1.3, 0.02, 500, (2.0, 3.0, 8.0, 32.0))\n"
            "print(json.dumps({'curve': curve, 'torch': 'torch' in sys.modules, 'opacus': 'opacus' in sys.modules}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["torch"] is False and out["opacus"] is False
    assert out["curve"] == [float(v) for v in compute_rdp(q=0.02, noise_multiplier=1.3, steps=500,
                                                          orders=[2.0, 3.0, 8.0, 32.0])]
    assert out["curve"][0] == pytest.approx(independent_rdp(1.3, 0.02, 500, 2), rel=1e-9)
