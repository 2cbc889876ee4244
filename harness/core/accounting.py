"""Privacy accounting through Opacus' accountants (RDP by default, PRV selectable).

The accountant is told the noise multiplier σ, the sample rate q = B/N and the number of steps T, and
assumes Poisson sampling with rate q (``ACCOUNTED_SAMPLING``). ``train.sampling: shuffle`` (fixed-size
shuffled batches, as several papers used) is accounted the same way by convention — the customary figure,
not a proven bound for shuffling; such a run warns and records ``privacy.accounted_sampling: poisson`` beside
``privacy.sampling: shuffle``.

δ rule (when ``privacy.delta`` is null): δ = min(1e-5, 1/(2N)) for a private pool of N examples — the
papers' 1e-5 whenever N ≤ 50,000, and always well below 1/N.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dpeval.core.errors import ConfigError

ACCOUNTED_SAMPLING = "poisson"  # what the RDP / PRV analyses of the subsampled Gaussian assume
# Calibration refuses ε targets that even this σ meets (RDP's ε at it): below it Opacus' search does not end
# for huge targets (RDP) or needs minutes and gigabytes per evaluation (PRV's grids grow as σ shrinks).
SIGMA_FLOOR = {"rdp": 0.01, "prv": 0.2}


def default_delta(n_private: int) -> float:
    return min(1e-5, 1.0 / (2 * n_private))


# RDP orders λ the RDP accountant minimises over: Opacus' defaults (1.1 … 10.9, 12 … 63) and larger ones, without
# which ε = min_λ [RDP(λ) + conversion(λ)] cannot go below about 0.19 at δ = 1e-5 (the conversion term alone is
# ≈ log(1/δ)/(λ − 1)); ε = 0.1 needs λ ≈ 116. More orders only tighten the minimum (each is a valid bound).
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
                   + [64, 72, 80, 96, 112, 128, 160, 192, 256, 384, 512, 768, 1024])
MAX_SIGMA = 1e6  # calibration gives up above this σ (a target ε no sensible mechanism reaches)

Release = tuple[float, float, int]  # (σ, q, T): T subsampled Gaussian releases with multiplier σ at rate q


def _accountant(name: str):
    if name not in ("rdp", "prv"):
        raise ConfigError(f"privacy.accountant: must be one of rdp, prv, got {name!r}")
    from opacus.accountants import create_accountant  # here: Opacus brings torch, which leaderboard never needs

    return create_accountant(mechanism=name)


def epsilon_of(releases: list[Release], delta: float, accountant: str = "rdp") -> float:
    """ε of the composition of ``releases`` by the accountant (RDP over ``RDP_ORDERS``, or PRV); inf when one of
    them adds no noise."""
    for sigma, _, _ in releases:
        if not math.isfinite(sigma):  # Opacus would search forever for nan / inf
            raise ConfigError(f"privacy.noise_multiplier: must be a finite number, got {sigma}")
    if any(sigma <= 0 for sigma, _, _ in releases):
        return math.inf
    return _epsilon(tuple((s, q, t) for s, q, t in releases), delta, accountant)


# ε is a pure function of (releases, δ, accountant), and one evaluation costs a fraction of a second (RDP over 173
# orders): a run's σ calibration evaluates it about 15 times, and the processes that plan many runs — a sweep, the
# Python API, the test suite — ask for the same values again. Only results are kept; errors are raised every time.
def _epsilon(releases: tuple[Release, ...], delta: float, accountant: str) -> float:
    return _spent(releases, delta, accountant)[0]


@functools.lru_cache(maxsize=4096)
def _spent(releases: tuple[Release, ...], delta: float, accountant: str) -> tuple[float, float | None]:
    """(ε, the RDP order that gives it; None for PRV) of ``releases``."""
    acc = _accountant(accountant)
    acc.history = list(releases)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about α ranges for very small / large ε
        try:
            if accountant == "rdp":
                eps, order = acc.get_privacy_spent(delta=delta, alphas=list(RDP_ORDERS))
                return float(eps), float(order)
            return float(acc.get_epsilon(delta=delta)), None
        except (ArithmeticError, MemoryError) as exc:  # σ² under- / overflows, PRV grids explode
            what = ", ".join(f"σ = {s:g} at q = {q:g}, T = {n}" for s, q, n in releases)
            raise ConfigError(f"privacy.noise_multiplier: the {accountant} accountant cannot evaluate {what} "
                              f"({type(exc).__name__}); choose a σ of a sensible size") from None


def _epsilon_at_order(releases: tuple[Release, ...], delta: float, order: float) -> float:
    """The RDP accountant's ε of ``releases`` at the one order ``order``: the accountant's ε is the least of these
    over ``RDP_ORDERS``, so this is an upper bound on it (nan or inf where the order gives nothing)."""
    analysis = _opacus_rdp()
    rdp = sum(analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=[order])
              for sigma, q, steps in releases)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            return float(analysis.get_privacy_spent(orders=[order], rdp=rdp, delta=delta)[0])
        except (ArithmeticError, MemoryError):
            return math.inf


def epsilon_for(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                accountant: str = "rdp") -> float:
    """ε spent by ``steps`` subsampled Gaussian steps with σ = ``noise_multiplier`` at rate q."""
    return epsilon_of([(noise_multiplier, sample_rate, steps)], delta, accountant)


def noise_for(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp",
              before: tuple[Release, ...] = ()) -> float:
    """The smallest σ (to a relative tolerance of 0.5% in ε) whose accounted ε is ≤ ``epsilon``, for ``steps``
    releases at rate q composed after the releases ``before`` (e.g. a DP-PCA of the inputs).

    The bisection keeps the upper end of its bracket (as Opacus' does), so the returned σ never under-noises.
    """
    _check(epsilon, delta, sample_rate, steps)
    sigma_floor = SIGMA_FLOOR.get(accountant, 0.01)
    floor = epsilon_of([*before, (sigma_floor, sample_rate, steps)], delta, "rdp")
    if epsilon >= floor:
        raise ConfigError(f"privacy.epsilon: ε = {epsilon:g} is met even by σ = {sigma_floor} (ε = {floor:.4g} at "
                          f"δ = {delta:g}, q = {sample_rate:g}, T = {steps}): effectively no noise; give a smaller "
                          "ε, or σ itself (privacy.noise_multiplier / --noise-multiplier)")
    tolerance = min(0.01, 0.005 * epsilon)

    order: list[float | None] = [None]  # the RDP order of the last full evaluation

    def eps(sigma: float) -> float:
        value = epsilon_of([*before, (sigma, sample_rate, steps)], delta, accountant)
        if accountant == "rdp" and sigma > 0:
            order[0] = _spent((*before, (sigma, sample_rate, steps)), delta, "rdp")[1]
        return value

    def goes_on_below(sigma: float) -> float | None:
        """A shortcut that changes no decision: where ε at the last evaluation's order alone (an upper bound on ε)
        is below the target by more than the tolerance, ε(σ) is too, and the bisection's next step — take σ as the
        upper end and go on — is the same as with the full evaluation over every order; that bound, else None."""
        if order[0] is None:
            return None
        bound = _epsilon_at_order((*before, (sigma, sample_rate, steps)), delta, order[0])
        return bound if bound < epsilon - tolerance - 1e-9 * epsilon else None  # a margin for rounding

    low, high = 0.0, 10.0
    eps_high = eps(high)
    while eps_high > epsilon:
        low, high = high, 2 * high
        if high > MAX_SIGMA:
            spent = f"; {epsilon_of(list(before), delta, accountant):.4g} is spent before training" if before else ""
            raise ConfigError(f"privacy.epsilon: cannot reach ε = {epsilon:g} at δ = {delta:g}, q = {sample_rate:g}, "
                              f"T = {steps}{spent}: not even σ = {MAX_SIGMA:g} gets there")
        eps_high = eps(high)
    while epsilon - eps_high > tolerance:
        mid = (low + high) / 2
        bound = goes_on_below(mid)
        if bound is not None:
            high, eps_high = mid, bound
            continue
        eps_mid = eps(mid)
        if eps_mid < epsilon:
            high, eps_high = mid, eps_mid
        else:
            low = mid
    return high


def _check(epsilon: float, delta: float, sample_rate: float, steps: int) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ConfigError(f"--epsilon: must be a finite number > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ConfigError(f"--delta: must satisfy 0 < delta < 1, got {delta}")
    if not 0 < sample_rate <= 1:
        raise ConfigError(f"--sample-rate: must satisfy 0 < q <= 1, got {sample_rate}")
    if steps < 1:
        raise ConfigError(f"--steps: must be >= 1, got {steps}")


def steps_per_epoch(sample_rate: float) -> int:
    """Steps an epoch as training counts them, from q alone: training takes ⌊N/B⌋ steps an epoch with
    q = B/N, and ⌊N/B⌋ = ⌊1/q⌋ — except that 1/q is N/B only up to float rounding, which can land just
    below a whole N/B (q = 32/2976 gives 1/q = 92.99999999999999 for N/B = 93). So when 1/q lies within a
    relative 1e-9 of an integer, that integer is N/B; otherwise ⌊1/q⌋. (A whole N/B and a fractional one
    differ by at least 1/N relative, so this cannot round a fractional N/B up for pools below 10⁹.)"""
    ratio = 1.0 / sample_rate
    nearest = round(ratio)
    if nearest >= 1 and math.isclose(ratio, nearest, rel_tol=1e-9):
        return nearest
    return math.floor(ratio)


MAX_STEPS = 10**9  # releases one ledger counts (`dpeval privacy --steps`): far beyond any training, still quick


def steps_for(epochs: int, sample_rate: float) -> int:
    """Steps of ``epochs`` passes at rate q: ``steps_per_epoch(q)`` each, as training takes them."""
    return epochs * steps_per_epoch(sample_rate)


# ---------------------------------------------------------------------------------------------------
# the price of tuning: selecting the best of k configurations trained on the same private data
#
# Plain composition: k runs that are (ε_i, δ_i)-DP are together (Σε_i, Σδ_i)-DP, and so is anything chosen
# from their outputs (the selection is post-processing of all k runs).
#
# Random stopping (Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy",
# Theorem 2): run a random number K of trials, each a configuration drawn at random and trained with an
# RDP mechanism Q, and release the best; with K ~ truncated negative binomial TNB(η, γ) (η = 0: the
# logarithmic distribution; η = 1: the geometric, Liu & Talwar 2019) the whole procedure is (λ, ε')-RDP with
#     ε'(λ) = ε(λ) + (1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ) / λ̂ + log E[K] / (λ − 1)
# for every λ̂ ≥ 1, where Q is (λ, ε(λ))- and (λ̂, ε(λ̂))-RDP. Here ε(·) is the largest RDP curve among the
# grid's configurations, λ̂ the best order on the grid, γ chosen so that E[K] = k (as many trials on average
# as the grid has configurations), and ε'(λ) is converted to (ε, δ) at the run's δ as the RDP accountant does.

STOPPING_ETAS = (0.0, 1.0)  # the random-stopping distributions tried (the better one is reported)


def composition(epsilons: list[float], deltas: list[float]) -> tuple[float, float]:
    """Basic composition of runs on the same data: (Σ ε_i, Σ δ_i)."""
    return float(sum(epsilons)), float(sum(deltas))


def gaussian_rdp(noise_multiplier: float, sample_rate: float, steps: int,
                 orders: tuple[float, ...] = RDP_ORDERS) -> list[float]:
    """RDP ε(λ) of ``steps`` subsampled Gaussian steps (Opacus' analysis, as the RDP accountant uses): ``steps``
    times one step's curve, as Opacus computes it, so the same numbers to the bit."""
    return list(_rdp_curve(noise_multiplier, sample_rate, steps, orders))


@functools.lru_cache(maxsize=65536)
def _rdp_curve(noise_multiplier: float, sample_rate: float, steps: int, orders: tuple[float, ...]) -> tuple[float, ...]:
    """``gaussian_rdp``'s curve, cached: a store's runs share a few mechanisms (σ, q, T)."""
    return tuple(float(v) for v in np.asarray(_one_step_rdp(noise_multiplier, sample_rate, orders)) * steps)


@functools.cache
def _opacus_rdp() -> Any:
    """Opacus' RDP analysis (``opacus.accountants.analysis.rdp``: numpy and scipy only). Where the opacus package
    is not imported yet, the module is loaded from its file alone: the package's ``__init__`` imports torch,
    seconds that ``leaderboard`` and ``report`` (which price selections, never train) would spend for nothing.
    The same file either way, so the same numbers."""
    if "opacus" in sys.modules:
        return importlib.import_module("opacus.accountants.analysis.rdp")
    package = importlib.util.find_spec("opacus")  # finds the package without running its __init__
    if package is None or package.origin is None:
        raise ImportError("dpeval needs opacus: pip install opacus")
    path = Path(package.origin).parent / "accountants" / "analysis" / "rdp.py"
    spec = importlib.util.spec_from_file_location("dpeval._opacus_rdp", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=4096)
def _one_step_rdp(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    """One step's RDP curve, cached by its parameters: the leaderboard prices the selection of every run in a
    store, thousands of runs that share a few (σ, q), and one curve costs tens of milliseconds."""
    return tuple(np.atleast_1d(_opacus_rdp().compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                                           orders=list(orders))))


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] of the truncated negative binomial TNB(η, γ) (Papernot & Steinke, Definition 1)."""
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def tnb_gamma_for_mean(eta: float, mean: float) -> float:
    """The γ ∈ (0, 1) with E[K] = ``mean`` (≥ 1; E[K] falls from ∞ to 1 as γ goes from 0 to 1)."""
    if mean <= 1:
        return 1.0 - 1e-12
    lo, hi = 1e-300, 1.0 - 1e-12
    for _ in range(200):  # bisection on log γ
        mid = math.sqrt(lo * hi)
        if tnb_mean(eta, mid) > mean:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def rdp_to_dp(rdp: list[float], delta: float, orders: tuple[float, ...] = RDP_ORDERS) -> float:
    """(ε, δ) from an RDP curve with the conversion the Opacus RDP accountant uses (Balle et al. 2020)."""
    best = math.inf
    for a, r in zip(orders, rdp):
        if math.isfinite(r):
            best = min(best, r - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a))
    return max(best, 0.0)


def random_stopping_rdp(rdp: list[float], eta: float, gamma: float,
                        orders: tuple[float, ...] = RDP_ORDERS) -> list[float]:
    """ε'(λ) of Papernot & Steinke's Theorem 2 for every order λ, minimised over λ̂ on the same grid."""
    extra = min((1 + eta) * (1 - 1 / ah) * rh + (1 + eta) * math.log(1 / gamma) / ah
                for ah, rh in zip(orders, rdp) if math.isfinite(rh))
    log_mean = math.log(tnb_mean(eta, gamma))
    return [r + extra + log_mean / (a - 1) for a, r in zip(orders, rdp)]


def random_stopping_cost(rdp: list[float], trials: float, delta: float) -> dict[str, float]:
    """The best (over ``STOPPING_ETAS``) (ε, δ) of random stopping with E[K] = ``trials``, and its η, γ."""
    best: dict[str, float] = {}
    for eta in STOPPING_ETAS:
        gamma = tnb_gamma_for_mean(eta, trials)
        eps = rdp_to_dp(random_stopping_rdp(rdp, eta, gamma), delta)
        if not best or eps < best["epsilon"]:
            best = {"epsilon": eps, "delta": delta, "eta": eta, "gamma": gamma, "mean_trials": tnb_mean(eta, gamma)}
    return best
