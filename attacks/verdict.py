"""The verdict of a reconstruction attack: does it beat every data-free guess by more than chance allows?

The rule (docs/results.md, "Verdicts"):

* Unit of evidence: one target batch t of the T independent target batches (``attack.targets``), each
  released on its own, at one attacked state s. Its gain d(s, t) is the mean over the batch's images of
  PSNR(reconstruction) − PSNR(best data-free guess of that image), the best guess being, per image, the
  better of uniform noise, the constant per-channel mean and the per-pixel mean of the public split.
* Per state: an exact one-sided sign test of H0 "a target's gain exceeds ``MARGIN_DB`` with probability at
  most 1/2": W(s) = #{t : d(s, t) > MARGIN_DB} and p(s) = P[Binomial(T, 1/2) ≥ W(s)]. Targets are drawn
  independently (without replacement) and every release draws fresh noise, so under H0 the T outcomes
  are independent coin flips with success probability ≤ 1/2 and p(s) is valid without any assumption on
  the distribution of PSNRs.
* Across the k attacked states (the same targets at every state, so the states are not independent):
  Bonferroni, p = min(1, k · min_s p(s)). The verdict is ``leaks`` when p ≤ ``ALPHA`` and
  ``no-leak-detected`` otherwise.

The smallest p a run can reach is k · 2^-T, so with fewer than ``min_targets(k)`` targets the verdict
cannot be ``leaks``: ``no-leak-detected`` then means "not enough targets to tell", and the run's printout
says so. The default (6 targets, 3 states) reaches p = 3/64 < 0.05 when every target beats the margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpeval.core.verdicts import Verdict

MARGIN_DB = 1.0  # a target counts as leaking only if it beats the best data-free guess by more than this
ALPHA = 0.05     # family-wise level over the attacked states


@dataclass(frozen=True)
class SignTest:
    wins: int  # targets whose gain exceeds the margin
    n: int     # targets

    @property
    def p_value(self) -> float:
        """P[Binomial(n, 1/2) ≥ wins], exact."""
        return sum(math.comb(self.n, j) for j in range(self.wins, self.n + 1)) / 2 ** self.n


def sign_test(gains: Sequence[float] | np.ndarray, margin: float = MARGIN_DB) -> SignTest:
    """Count the gains (dB over the best data-free guess) that exceed ``margin``; a tie does not count."""
    values = np.asarray(gains, dtype=float)
    return SignTest(wins=int((values > margin).sum()), n=int(values.size))


def decide(tests: Sequence[SignTest], alpha: float = ALPHA) -> tuple[Verdict, float]:
    """(verdict, Bonferroni-adjusted p) over the per-state tests."""
    p = min(1.0, len(tests) * min(t.p_value for t in tests))
    return Verdict.of(p <= alpha), p


def min_targets(states: int, alpha: float = ALPHA) -> int:
    """The fewest targets with which ``states`` attacked states can yield ``leaks``: states · 2^-T ≤ α."""
    return math.ceil(math.log2(states / alpha))
