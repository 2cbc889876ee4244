"""Privacy accounting through Opacus' accountants (RDP by default, PRV selectable).

The accountant is told the noise multiplier σ, the sample rate q = B/N and the number of steps T, and
assumes Poisson sampling with rate q. ``train.sampling: shuffle`` (fixed-size shuffled batches, as several
papers used) is accounted the same way by convention; the run records which sampling it used.

δ rule (when ``privacy.delta`` is null): δ = min(1e-5, 1/(2N)) for a private pool of N examples — the
papers' 1e-5 whenever N ≤ 50,000, and always well below 1/N.
"""

from __future__ import annotations

import math
import warnings

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from harness.core.errors import ConfigError


def default_delta(n_private: int) -> float:
    return min(1e-5, 1.0 / (2 * n_private))


def _accountant(name: str):
    if name not in ("rdp", "prv"):
        raise ConfigError(f"privacy.accountant: must be one of rdp, prv, got {name!r}")
    return create_accountant(mechanism=name)


def epsilon_for(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                accountant: str = "rdp") -> float:
    """ε spent by ``steps`` subsampled Gaussian steps with σ = ``noise_multiplier`` at rate q."""
    if noise_multiplier <= 0:
        return math.inf
    acc = _accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about α ranges for very small / large ε
        return float(acc.get_epsilon(delta=delta))


def noise_for(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp") -> float:
    """The smallest σ (to a relative tolerance of 0.5% in ε) whose accounted ε is ≤ ``epsilon``.

    Opacus' binary search keeps the upper end of its bracket, so the returned σ never under-noises.
    """
    _check(epsilon, delta, sample_rate, steps)
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
    if not epsilon > 0:
        raise ConfigError(f"--epsilon: must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ConfigError(f"--delta: must satisfy 0 < delta < 1, got {delta}")
    if not 0 < sample_rate <= 1:
        raise ConfigError(f"--sample-rate: must satisfy 0 < q <= 1, got {sample_rate}")
    if steps < 1:
        raise ConfigError(f"--steps: must be >= 1, got {steps}")


def steps_for(epochs: int, sample_rate: float) -> int:
    """Steps of ``epochs`` passes at rate q: ⌊1/q⌋ steps an epoch (Opacus' convention)."""
    return epochs * int(1 / sample_rate)
