"""The privacy ledger: what a run's training released, as the accountant is told it, and the one place ε
comes from.

A ``PrivacyLedger`` holds the accounted facts of a sequence of releases — the σ the defense adds, the σ it
is accounted at, the sample rate q, the number of steps T, δ, the accountant and the sampling — and derives
ε from them with the configured accountant (``dpeval.core.accounting.epsilon_for``). Every ε a result
reports is a ledger's: the run's ``privacy.epsilon``, the shadow game's ``target_epsilon`` (the same σ at
the shadows' q and T: ``at``) and grad-MIA's ``accounted_epsilon`` (one release of a whole batch:
``at(1.0, 1)``). An accounted σ of 0 means no DP mechanism: ε = inf. A DP-PCA of the inputs before training
(``dpeval.core.pca``: one Gaussian release of multiplier ``pca_noise_multiplier`` on the whole pool) is composed
into every ε the ledger gives.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import InitVar, dataclass, field

from dpeval.core.accounting import ACCOUNTED_SAMPLING, Release, epsilon_of


@dataclass(frozen=True)
class PrivacyLedger:
    noise_multiplier: float             # the σ the defense adds
    accounted_noise_multiplier: float   # the σ the accountant is told (0: not a DP mechanism)
    sample_rate: float                  # q
    steps: int                          # T
    delta: float
    accountant: str                     # ``rdp`` or ``prv``
    sampling: str                       # how batches were drawn (``poisson`` or ``shuffle``)
    pca_noise_multiplier: float = 0.0   # σ_p of a DP-PCA released before training (0: none)

    # A stored run's ledger is read back with the ε it recorded (``RunResult.from_flat``), not derived again: the
    # version that wrote it is the record. None (a new ledger, or one changed by ``dataclasses.replace``): derived.
    recorded_epsilon: InitVar[float | None] = None
    recorded_pca_epsilon: InitVar[float | None] = None

    epsilon: float = field(init=False)      # the accountant's ε of the above
    pca_epsilon: float = field(init=False)  # the DP-PCA's ε alone (0 without one)

    def __post_init__(self, recorded_epsilon: float | None, recorded_pca_epsilon: float | None) -> None:
        """ε by the configured accountant, on construction: a σ it cannot evaluate is a ConfigError here."""
        eps = recorded_epsilon
        if eps is None:
            eps = math.inf
            if self.accounted_noise_multiplier > 0:
                eps = epsilon_of([*self.before, (self.accounted_noise_multiplier, self.sample_rate, self.steps)],
                                 self.delta, self.accountant)
        pca_eps = recorded_pca_epsilon
        if pca_eps is None:
            pca_eps = epsilon_of(list(self.before), self.delta, self.accountant) if self.before else 0.0
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "pca_epsilon", pca_eps)

    @property
    def before(self) -> tuple[Release, ...]:
        """The releases made before training, as the accountant is told them: the DP-PCA, if any."""
        return ((self.pca_noise_multiplier, 1.0, 1),) if self.pca_noise_multiplier > 0 else ()

    def at(self, sample_rate: float, steps: int) -> PrivacyLedger:
        """The same mechanism (σ, δ, accountant) released ``steps`` times at rate ``sample_rate``."""
        if (sample_rate, steps) == (self.sample_rate, self.steps):
            return self
        return dataclasses.replace(self, sample_rate=sample_rate, steps=steps)

    def metrics(self) -> dict[str, float | int | str]:
        """The ``privacy.*`` result keys."""
        keys: dict[str, float | int | str] = {
            "privacy.epsilon": self.epsilon,
            "privacy.delta": self.delta,
            "privacy.noise_multiplier": self.noise_multiplier,
            "privacy.accounted_noise_multiplier": self.accounted_noise_multiplier,
            "privacy.sample_rate": self.sample_rate,
            "privacy.steps": self.steps,
            "privacy.accountant": self.accountant,
            "privacy.sampling": self.sampling,
            "privacy.accounted_sampling": ACCOUNTED_SAMPLING,
        }
        if self.before:  # the DP-PCA: its σ_p and what it would spend alone
            keys["privacy.pca_noise_multiplier"] = self.pca_noise_multiplier
            keys["privacy.pca_epsilon"] = self.pca_epsilon
        return keys
