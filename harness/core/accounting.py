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

import math
import warnings

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from harness.core.errors import ConfigError

ACCOUNTED_SAMPLING = "poisson"  # what the RDP / PRV analyses of the subsampled Gaussian assume
# Calibration refuses ε targets that even this σ meets (RDP's ε at it): below it Opacus' search does not end
# for huge targets (RDP) or needs minutes and gigabytes per evaluation (PRV's grids grow as σ shrinks).
SIGMA_FLOOR = {"rdp": 0.01, "prv": 0.2}


def default_delta(n_private: int) -> float:
    return min(1e-5, 1.0 / (2 * n_private))


def _accountant(name: str):
    if name not in ("rdp", "prv"):
        raise ConfigError(f"privacy.accountant: must be one of rdp, prv, got {name!r}")
    return create_accountant(mechanism=name)


def epsilon_for(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                accountant: str = "rdp") -> float:
    """ε spent by ``steps`` subsampled Gaussian steps with σ = ``noise_multiplier`` at rate q."""
    if not math.isfinite(noise_multiplier):  # Opacus would search forever for nan / inf
        raise ConfigError(f"privacy.noise_multiplier: must be a finite number, got {noise_multiplier}")
    if noise_multiplier <= 0:
        return math.inf
    acc = _accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about α ranges for very small / large ε
        try:
            return float(acc.get_epsilon(delta=delta))
        except (ArithmeticError, MemoryError) as exc:  # σ² under- / overflows, PRV grids explode
            raise ConfigError(f"privacy.noise_multiplier: the {accountant} accountant cannot evaluate σ = "
                              f"{noise_multiplier:g} at q = {sample_rate:g}, T = {steps} "
                              f"({type(exc).__name__}); choose a σ of a sensible size") from None


def noise_for(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp") -> float:
    """The smallest σ (to a relative tolerance of 0.5% in ε) whose accounted ε is ≤ ``epsilon``.

    Opacus' binary search keeps the upper end of its bracket, so the returned σ never under-noises.
    """
    _check(epsilon, delta, sample_rate, steps)
    sigma_floor = SIGMA_FLOOR.get(accountant, 0.01)
    floor = epsilon_for(sigma_floor, sample_rate, steps, delta, "rdp")
    if epsilon >= floor:
        raise ConfigError(f"privacy.epsilon: ε = {epsilon:g} is met even by σ = {sigma_floor} (ε = {floor:.4g} at "
                          f"δ = {delta:g}, q = {sample_rate:g}, T = {steps}): effectively no noise; give a smaller "
                          "ε, or σ itself (privacy.noise_multiplier / --noise-multiplier)")
    tolerance = min(0.01, 0.005 * epsilon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                              steps=steps, accountant=accountant, epsilon_tolerance=tolerance))
        except ValueError as exc:
            raise ConfigError(f"privacy.epsilon: cannot reach ε={epsilon} at δ={delta}, q={sample_rate}, "
                              f"T={steps} ({exc})") from None


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


def steps_for(epochs: int, sample_rate: float) -> int:
    """Steps of ``epochs`` passes at rate q: ``steps_per_epoch(q)`` each, as training takes them."""
    return epochs * steps_per_epoch(sample_rate)
