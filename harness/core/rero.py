"""Bounds on reconstruction success: what a DP mechanism allows an informed, prior-aware adversary.

The game (Hayes, Mahloujifar & Balle, NeurIPS 2023; Balle, Cherubin & Hayes, S&P 2022): the target is drawn
uniformly from n known candidates, the adversary sees the releases of T Poisson-subsampled Gaussian steps
(noise multiplier σ, rate q) and every other example, and guesses which candidate was trained on. Its success
rate is at most ``1 − f(1/n)``, f the trade-off function between

    P = N(0, σ²)^T          (the target's slot empty)      and
    Q = ((1 − q)·N(0, σ²) + q·N(1, σ²))^T   (the target's slot filled, sampled with rate q).

``tradeoff_bound`` computes it from the privacy-loss distribution of (P, Q), composed numerically with Opacus'
privacy random variables (the PRV accountant's discretisation and FFT composition): with L = log(Q/P) and the
distribution of L under Q, the Neyman–Pearson test "L > τ" has type-I error α(τ) = E_Q[e^{−L}·1{L > τ}] and
type-II error β(τ) = P_Q[L ≤ τ]; f is their lower convex envelope and the bound is 1 − f(1/n). Beside it, the
looser bounds of the same mechanism:

- ``gdp_bound``: μ-GDP, Φ(Φ⁻¹(1/n) + μ) (exact for q = 1, where the mechanism is √T/σ-GDP);
- ``rdp_bound``: Balle et al.'s reconstruction robustness from Rényi DP, γ = min_α (κ·e^{ε(α)})^{(α−1)/α}, κ = 1/n;
- ``dp_bound``: from (ε, δ) alone, min{1, e^ε/n + δ, 1 − e^{−ε}(1 − δ − 1/n)}.

Releases before training (a DP-PCA: ``PrivacyLedger.before``) are composed into every bound as the ledger composes
them into ε. Pure numerics (numpy, scipy and Opacus' analysis modules); no torch.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

from dpeval.core.accounting import RDP_ORDERS, Release, gaussian_rdp

EPS_ERROR = 0.005     # the PRV grid's mesh is chosen for this error in ε (Gopi et al.), far below the CI widths
DELTA_ERROR = 1e-10   # mass the truncated domain may lose


def _check(n: int) -> None:
    if n < 2:
        raise ValueError(f"candidates: the prior needs n >= 2 candidates, got {n}")


def gdp_bound(mu: float, n: int) -> float:
    """Success bound of a μ-GDP mechanism against a uniform prior over n candidates: Φ(Φ⁻¹(1/n) + μ)."""
    _check(n)
    return float(stats.norm.cdf(stats.norm.ppf(1.0 / n) + mu))


def gdp_mu_of(success: float, n: int) -> float:
    """The μ whose GDP bound equals ``success`` (the inverse of ``gdp_bound``; 0 at or below chance 1/n): the
    empirical privacy figure of a measured success rate."""
    _check(n)
    if not success > 1.0 / n:
        return 0.0
    if success >= 1.0:
        return math.inf
    return float(stats.norm.ppf(success) - stats.norm.ppf(1.0 / n))


def dp_bound(epsilon: float, delta: float, n: int) -> float:
    """Success bound from (ε, δ)-DP alone: 1 − f(1/n) for f(α) = max(0, 1 − δ − e^ε·α, e^{−ε}(1 − δ − α))."""
    _check(n)
    if not math.isfinite(epsilon):
        return 1.0
    return float(min(1.0, math.exp(epsilon) / n + delta, 1.0 - math.exp(-epsilon) * (1.0 - delta - 1.0 / n)))


def rdp_bound(releases: Sequence[Release], n: int) -> float:
    """Balle et al.'s ReRo bound from Rényi DP: min over the orders α of (κ·e^{ε(α)})^{(α−1)/α}, κ = 1/n, ε(α) the
    composed RDP of ``releases`` (σ, q, T) as the RDP accountant computes it."""
    _check(n)
    if any(sigma <= 0 for sigma, _, _ in releases):
        return 1.0
    curve = np.zeros(len(RDP_ORDERS))
    for sigma, q, steps in releases:
        curve += np.asarray(gaussian_rdp(sigma, q, steps))
    best = 1.0
    for alpha, eps in zip(RDP_ORDERS, curve):
        if math.isfinite(eps):
            best = min(best, math.exp(min(0.0, (alpha - 1) / alpha * (eps - math.log(n)))))
    return float(best)


def tradeoff_bound(releases: Sequence[Release], n: int) -> float:
    """1 − f(1/n) for the composition of ``releases`` (σ, q, T): the tight bound on the success of the
    informed adversary against a uniform prior over n candidates (module docstring)."""
    _check(n)
    if any(sigma <= 0 for sigma, _, _ in releases):
        return 1.0
    return _tradeoff_bound(tuple((float(s), float(q), int(t)) for s, q, t in releases), n)


@functools.lru_cache(maxsize=256)
def _tradeoff_bound(releases: tuple[Release, ...], n: int) -> float:
    ts, pmf = privacy_loss_distribution(releases)
    alpha, beta = tradeoff_curve(ts, pmf)
    return float(1.0 - np.interp(1.0 / n, alpha, beta))


def tradeoff_curve(ts: np.ndarray, pmf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(α, β) of the Neyman–Pearson tests "L > t_i" for a privacy loss L with values ``ts`` (ascending) and
    probabilities ``pmf`` under Q, α increasing (from "reject nothing": (0, 1) to "reject all": (≈1, 0)). Linear
    interpolation between the points is the randomised test: f itself."""
    p_mass = pmf * np.exp(-ts)                                  # the same outcomes' probabilities under P
    alpha = np.concatenate([np.cumsum(p_mass[::-1])[::-1][1:], [0.0]])   # P[L > t_i]
    beta = np.cumsum(pmf)                                       # Q[L <= t_i]
    alpha = np.concatenate([alpha[::-1], [max(1.0, float(p_mass.sum()))]])
    beta = np.concatenate([np.minimum(beta[::-1], 1.0), [0.0]])
    return alpha, beta


def privacy_loss_distribution(releases: tuple[Release, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The composed privacy loss L = log(Q/P) of ``releases`` under Q, discretised as Opacus' PRV accountant does
    (truncated domain safe to ``DELTA_ERROR``, mesh for ``EPS_ERROR``, FFT self-composition): (values, pmf)."""
    from opacus.accountants.analysis.prv import (
        Domain,
        PoissonSubsampledGaussianPRV,
        TruncatedPrivacyRandomVariable,
        compose_heterogeneous,
        discretize,
    )

    prvs = [PoissonSubsampledGaussianPRV(q, sigma) for sigma, q, _ in releases]
    counts = [steps for _, _, steps in releases]
    with warnings.catch_warnings(), np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")  # log(1 − q) at q = 1, Opacus' α-range warnings
        size, mesh = _grid(releases)
        domain = Domain.create_aligned(-size, size, mesh)
        parts = [discretize(TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max), domain) for prv in prvs]
        composed = compose_heterogeneous(parts, counts)
    pmf = np.clip(composed.pmf, 0.0, None)  # FFT round-off leaves tiny negative masses
    return composed.domain.ts, pmf / pmf.sum()


MAX_GRID = 10**8  # points of the discretised privacy loss (beyond it, gigabytes; a σ of 1e-30 asks 1e66)


def _grid(releases: Sequence[Release]) -> tuple[float, float]:
    """(half-width, mesh) of the privacy loss's discretisation, as Opacus' PRV accountant chooses them."""
    from opacus.accountants.analysis.prv import PoissonSubsampledGaussianPRV, compute_safe_domain_size

    prvs = [PoissonSubsampledGaussianPRV(q, sigma) for sigma, q, _ in releases]
    counts = [steps for _, _, steps in releases]
    with warnings.catch_warnings(), np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        size = compute_safe_domain_size(prvs, counts, eps_error=EPS_ERROR, delta_error=DELTA_ERROR)
    return size, EPS_ERROR / math.sqrt(sum(counts) * math.log(12 / DELTA_ERROR) / 2)


def grid_points(releases: Sequence[Release]) -> float:
    """How many points ``tradeoff_bound`` discretises the privacy loss of ``releases`` into (0 for a release without
    noise, whose bound is 1 without any grid): a σ of 1e-30 asks for more than memory holds."""
    if any(sigma <= 0 for sigma, _, _ in releases):
        return 0.0
    size, mesh = _grid(releases)
    return 2 * size / mesh if math.isfinite(size) else math.inf


def bounds(releases: Sequence[Release], epsilon: float, delta: float, n: int) -> dict[str, float]:
    """Every bound of the mechanism for n candidates: ``bound`` (the trade-off function's, the tight one),
    ``bound_rdp`` (ReRo from RDP), ``bound_dp`` (from the accounted (ε, δ)), and ``accounted_mu`` (the GDP μ
    whose bound equals ``bound``: the accounted figure beside the attack's empirical μ)."""
    tight = tradeoff_bound(releases, n)
    return {"bound": tight, "bound_rdp": rdp_bound(releases, n), "bound_dp": dp_bound(epsilon, delta, n),
            "accounted_mu": gdp_mu_of(tight, n)}
