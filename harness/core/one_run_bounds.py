"""ε lower bounds from one training run: the counting, f-DP and Gaussian-pair analyses of the same canaries.

The game (Steinke, Nasr & Jagielski 2023): m canaries, each included independently with probability ½; after
training the auditor scores every canary (higher = "in"). Three analyses turn the same scores into a bound:

- **counting** (Steinke et al.): guess "in" for the k+ highest scores, "out" for the k− lowest, count the correct
  guesses W of r = k+ + k−; under (ε, δ)-DP W is dominated by Binomial(r, e^ε/(1 + e^ε)) plus a δ term
  (``dpeval.core.statistics.one_run_epsilon_lower_bound``). Valid for any mechanism: it assumes only (ε, δ)-DP
  with respect to each canary.
- **f-DP** (Mahloujifar, Melis & Chaudhuri 2025, "Auditing f-Differential Privacy in One Run"): the same guesses
  and count, judged against a whole trade-off curve f instead of the two lines of (ε, δ)-DP. If P[W ≥ c] were at
  least τ, an f-DP mechanism would force a least probability on every smaller count; their recursion (below)
  computes that least mass, and when it exceeds the share of guessed canaries r/m the hypothesis "the run is f-DP
  and W ≥ c happened with probability ≥ τ" is impossible: f is rejected at level τ. With Gaussian curves
  f = G_μ the largest rejected μ is μ_LB: the run is not μ-GDP for any μ ≤ μ_LB.
- **Gaussian pair** (the model of Agrawal, Wei, Singh, Magdon-Ismail & Zikas 2026, "Let's Ask Gauss"): the in and
  out scores as two Gaussians of one variance. Their standardised distance (a noncentral-t lower confidence limit:
  exact for such a pair) is a μ whose Gaussian test the auditor can run, so the run is not μ-GDP below it. Uses
  every score, no guesses: the tightest of the three when its model holds (a white-box ``sum`` statistic, a sum of
  Gaussian noise projections, is such a pair as the steps add up), wrong when it does not (heavy or light tails).

**Reading μ as ε.** A GDP bound μ_LB becomes ε_LB = ε_μ(δ), the ε of the μ-GDP curve at δ (Dong, Roth & Su
2019, Cor. 2.13). That reading is an ε lower bound for mechanisms whose privacy curve is Gaussian: the Gaussian
mechanism exactly, DP-SGD and the other subsampled-Gaussian defenses asymptotically (their composed curve tends
to G_μ, and at dpeval's recipes ε_μ of the CLT's μ is below the accounted ε). It is not one for a mechanism with
another curve: a Laplace mechanism (pure ε-DP) reads as a larger ε (``tests/core/test_one_run_bounds.py`` shows
it). The counting bound needs no such reading.

**Confidence.** Each estimator family runs its tests (statistics × guessing rules) at level β_f/K (Bonferroni);
when several families report side by side and the headline is their maximum, ``one_run_bounds`` splits β over
the families (β_f = β/F), so the maximum is still a (1 − β) lower bound.

**The f-DP recursion** (the paper's numerical tail bound, k = 2 outcomes per guess). With τ the level, r guesses
among m canaries and c correct, start from r_c = τ·c/m and h_c = τ·(r − c)/m (the mass on "≥ c correct" split
between correct and incorrect guesses) and for i = c − 1, …, 0
    h_i = max(h_{i+1}, f̄(r_{i+1})),     r_i = r_{i+1} + i/(r − i) · (h_i − h_{i+1}),
with f̄(x) = Φ(Φ⁻¹(x) − μ) for G_μ; f is rejected when r_0 + h_0 > r/m. Rejection is monotone in μ (a smaller μ
is a stronger claim), so μ_LB is found by refining a grid, and only a μ whose rejection was computed is reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special, stats

from dpeval.core.statistics import guess_and_count, one_run_epsilon_lower_bound

ESTIMATORS = ("counting", "f-dp", "gaussian-pair")
# (k+, k−) as fractions of m: symmetric guesses from 2% to all canaries, and "in"-only guesses
GUESS_RULES = ((0.01, 0.01), (0.025, 0.025), (0.05, 0.05), (0.1, 0.1), (0.25, 0.25), (0.5, 0.5),
               (0.05, 0.0), (0.1, 0.0), (0.2, 0.0), (0.3, 0.0))
MU_MAX = 40.0             # the largest μ searched (ε_μ(1e-5) ≈ 800): beyond it nothing is distinguishable
PAIR_MIN_PER_GROUP = 50   # the Gaussian pair needs this many in and out scores
PAIR_NORMALITY_LEVEL = 0.01  # each group's D'Agostino–Pearson test: below this p the pair model is refused


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su 2019, Cor. 2.13)."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    # e^ε Φ(x) as exp(ε + log Φ(x)): no overflow at large ε
    return float(special.ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon + special.log_ndtr(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε at which μ-GDP gives δ: the (ε, δ) reading of a GDP bound (0 when δ(0) ≤ δ already)."""
    if not mu > 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    if math.isinf(mu):
        return math.inf
    hi = max(1.0, mu * mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-10))


def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ whose GDP curve gives exactly (ε, δ) (the inverse of ``gdp_epsilon`` in μ)."""
    if not math.isfinite(epsilon):
        return math.inf
    hi = 1.0
    while gdp_delta(hi, epsilon) < delta:
        hi *= 2
    return float(optimize.brentq(lambda m: gdp_delta(m, epsilon) - delta, 1e-12, hi, xtol=1e-12))


def fdp_rejects(mus: np.ndarray, guesses: int, correct: int, canaries: int, level: float) -> np.ndarray:
    """For every μ of ``mus``: does ``correct`` of ``guesses`` (among ``canaries``) reject μ-GDP at ``level``
    (the recursion of the module docstring, vectorised over μ)?"""
    r, c, m = int(guesses), int(correct), int(canaries)
    if not 0 <= c <= r <= m or r == 0:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries and guesses > 0, got {c}, {r}, {m}")
    mus = np.asarray(mus, dtype=float)
    tau = level * r / m
    right = np.full(mus.shape, tau * c / r)
    wrong = np.full(mus.shape, tau * (r - c) / r)
    limit = r / m
    for i in range(c - 1, -1, -1):
        grown = np.maximum(wrong, special.ndtr(special.ndtri(np.minimum(right, 1.0)) - mus))
        right = right + i / (r - i) * (grown - wrong)
        wrong = grown
        if (right + wrong > limit).all():  # both only grow as i falls: rejected already
            break
    return right + wrong > limit


def fdp_mu_lower_bound(guesses: int, correct: int, canaries: int, level: float) -> float:
    """The largest μ for which μ-GDP is rejected (0 when none is): the grid [0, ``MU_MAX``] refined three
    times around the boundary; the reported μ is one whose rejection was computed."""
    lo, hi = 0.0, MU_MAX
    best = 0.0
    for _ in range(3):
        grid = np.linspace(lo, hi, 65)
        rejected = fdp_rejects(grid, guesses, correct, canaries, level)
        if not rejected.any():
            break
        j = int(np.flatnonzero(rejected)[-1])
        best = float(grid[j])
        if j == len(grid) - 1:
            break
        lo, hi = grid[j], grid[j + 1]
    return best


def gaussian_pair_mu_lower_bound(in_scores: np.ndarray, out_scores: np.ndarray, level: float) -> float:
    """Lower (1 − ``level``) confidence limit of (mean_in − mean_out)/σ for two Gaussian samples of one σ:
    the noncentral-t limit λ_L of the pooled two-sample t statistic, times √(1/n_in + 1/n_out); 0 below 0."""
    a, b = np.asarray(in_scores, dtype=float), np.asarray(out_scores, dtype=float)
    n1, n0 = len(a), len(b)
    if n1 < 2 or n0 < 2:
        return 0.0
    df = n1 + n0 - 2
    pooled = math.sqrt(((n1 - 1) * a.var(ddof=1) + (n0 - 1) * b.var(ddof=1)) / df)
    scale = math.sqrt(1 / n1 + 1 / n0)
    shift = float(a.mean() - b.mean())
    if pooled == 0:
        return math.inf if shift > 0 else 0.0
    t = shift / (pooled * scale)

    def excess(nc: float) -> float:  # P_nc[T ≥ t] − level: increasing in nc
        return float(stats.nct.sf(t, df, nc)) - level

    if excess(0.0) >= 0:  # not even "no shift" is rejected
        return 0.0
    hi = max(1.0, 2 * t)
    while excess(hi) < 0:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-10)) * scale


def gaussian_pair_refusal(in_scores: np.ndarray, out_scores: np.ndarray) -> str | None:
    """Why the Gaussian-pair model does not fit these scores (None when it does): too few scores in a group,
    or a group whose D'Agostino–Pearson normality test rejects at ``PAIR_NORMALITY_LEVEL``."""
    for name, group in (("in", in_scores), ("out", out_scores)):
        if len(group) < PAIR_MIN_PER_GROUP:
            return f"{len(group)} {name}-canary scores (the pair model needs at least {PAIR_MIN_PER_GROUP} per group)"
        if np.ptp(group) == 0:
            return f"the {name}-canary scores have no spread (a degenerate Gaussian: the pair model does not apply)"
        p = float(stats.normaltest(group).pvalue)
        if not p >= PAIR_NORMALITY_LEVEL:  # NaN (a test that cannot be computed) refuses too
            return (f"the {name}-canary scores are not Gaussian (D'Agostino–Pearson p = {p:.2g} < "
                    f"{PAIR_NORMALITY_LEVEL})")
    return None


def guess_counts(m: int, rules: Sequence[tuple[float, float]] = GUESS_RULES) -> list[tuple[int, int]]:
    """The (k+, k−) of every rule for m canaries (at least one guess each, at most m)."""
    out = []
    for f_in, f_out in rules:
        # The total is rounded as one number and k− is what k+ leaves of it: rounding each half on its own
        # makes m + 1 guesses of m ≡ 3 (mod 4) canaries at (½, ½) (round half to even: 3.5 + 3.5 → 4 + 4).
        k_in = round(f_in * m)
        k_out = round((f_in + f_out) * m) - k_in
        if k_in + k_out == 0:
            k_in = 1
        out.append((k_in, k_out))
    return out


ASSUMPTIONS = {
    "counting": "(ε, δ)-DP with respect to each canary; nothing about the scores; any number of canaries (a few "
                "hundred guesses cannot prove a large ε)",
    "f-dp": "the same guesses judged against Gaussian trade-off curves: rejects μ-GDP for μ ≤ μ_LB; its ε reading "
            "assumes the run's privacy curve is Gaussian (the Gaussian mechanism; subsampled-Gaussian defenses "
            "asymptotically)",
    "gaussian-pair": "in and out scores are two Gaussians of one variance (a white-box sum of Gaussian noise "
                     "projections, asymptotically); needs >= 50 scores per group, each passing a D'Agostino–Pearson "
                     "test at 1 % (refused otherwise); its ε reading assumes a Gaussian privacy curve",
}


@dataclass(frozen=True)
class OneRunTest:
    """One guessing test of a family: the statistic, k+ / k−, the correct guesses and the bound it gives."""
    estimator: str
    statistic: str
    k_in: int
    k_out: int
    correct: int
    epsilon_lower_bound: float
    mu_lower_bound: float | None = None

    @property
    def guesses(self) -> int:
        return self.k_in + self.k_out


@dataclass(frozen=True)
class OneRunBound:
    """One estimator's bound: ε (and μ for the GDP estimators), its confidence, the test that gave it, whether
    its model fits these scores (``valid``) and, if not, why (``refused``)."""
    estimator: str
    epsilon_lower_bound: float
    confidence: float
    assumption: str
    mu_lower_bound: float | None = None
    statistic: str | None = None
    k_in: int = 0
    k_out: int = 0
    correct: int = 0
    refused: str | None = None

    @property
    def valid(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class OneRunBounds:
    """Every estimator's bound on one set of canary scores, the tests behind them and the headline: the
    strongest valid bound (a (1 − β) lower bound with β split over the estimators)."""
    bounds: dict[str, OneRunBound]
    tests: list[OneRunTest] = field(default_factory=list)
    confidence: float = 0.95

    @property
    def best(self) -> OneRunBound | None:
        valid = [b for b in self.bounds.values() if b.valid]
        return max(valid, key=lambda b: b.epsilon_lower_bound) if valid else None


def _check_scores(scores: Mapping[str, np.ndarray], included: np.ndarray) -> None:
    for name, values in scores.items():
        if values.shape != included.shape:
            raise ValueError(f"scores[{name!r}]: {values.shape[0] if values.ndim else 0} scores for "
                             f"{included.shape[0]} inclusion bits")
        if not np.isfinite(values).all():
            raise ValueError(f"scores[{name!r}]: {int((~np.isfinite(values)).sum())} non-finite score(s); a NaN or "
                             f"infinite score cannot be judged")


def one_run_bounds(scores: np.ndarray | Mapping[str, np.ndarray], included: np.ndarray, delta: float, *,
                   confidence: float = 0.95, estimators: Sequence[str] = ESTIMATORS,
                   guesses: Sequence[tuple[int, int]] | None = None,
                   pair_statistics: Sequence[str] | None = None,
                   rng: np.random.Generator | None = None) -> OneRunBounds:
    """ε lower bounds of one run from its canaries' scores (higher = "in") and inclusion bits.

    ``scores``: one array, or several statistics by name (each family takes the maximum over them, Bonferroni
    inside the family). ``included``: boolean, one per canary (each drawn with probability ½ before training).
    ``delta``: the run's δ. ``confidence``: of the headline (``.best``); with F estimators each family runs at
    1 − (1 − confidence)/F. ``guesses``: the (k+, k−) designs of the counting and f-DP tests (default: the grid
    ``GUESS_RULES`` of fractions of m); choose them before seeing the scores. ``pair_statistics``: the
    statistics the Gaussian pair models (default: all). ``rng``: breaks ties among equal scores (default: seeded
    0). Raises ``ValueError`` on mismatched lengths, a non-finite score or an unknown estimator."""
    raw = dict(scores) if isinstance(scores, Mapping) else {"score": scores}
    named = {k: np.asarray(v, dtype=float) for k, v in raw.items()}
    included = np.asarray(included, dtype=bool)
    _check_scores(named, included)
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown or not estimators:
        raise ValueError(f"estimators: choose from {', '.join(ESTIMATORS)}, got {list(estimators)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence}")
    m = len(included)
    designs = list(guesses) if guesses is not None else guess_counts(m)
    for k_in, k_out in designs:
        if k_in < 0 or k_out < 0 or not 0 < k_in + k_out <= m:
            raise ValueError(f"guesses: ({k_in}, {k_out}) is not a design for {m} canaries")
    rng = rng if rng is not None else np.random.default_rng(0)
    beta = (1 - confidence) / len(estimators)
    counts = {(name, k_in, k_out): guess_and_count(values, included, k_in, k_out, rng)
              for name, values in named.items() for k_in, k_out in designs}
    bounds: dict[str, OneRunBound] = {}
    tests: list[OneRunTest] = []
    guess_level = beta / len(counts)
    if "counting" in estimators:
        family = [OneRunTest("counting", s, ki, ko, c, one_run_epsilon_lower_bound(ki + ko, c, m, delta, guess_level))
                  for (s, ki, ko), c in counts.items()]
        tests += family
        bounds["counting"] = _best_of("counting", family, 1 - beta)
    if "f-dp" in estimators:
        family = []
        for (s, ki, ko), c in counts.items():
            mu = fdp_mu_lower_bound(ki + ko, c, m, guess_level)
            family.append(OneRunTest("f-dp", s, ki, ko, c, gdp_epsilon(mu, delta), mu))
        tests += family
        bounds["f-dp"] = _best_of("f-dp", family, 1 - beta)
    if "gaussian-pair" in estimators:
        bounds["gaussian-pair"] = _pair_bound(named, included, delta, beta,
                                              list(pair_statistics) if pair_statistics is not None else list(named))
    return OneRunBounds(bounds, tests, confidence)


def _best_of(estimator: str, family: list[OneRunTest], confidence: float) -> OneRunBound:
    best = max(family, key=lambda t: t.epsilon_lower_bound)
    return OneRunBound(estimator, best.epsilon_lower_bound, confidence, ASSUMPTIONS[estimator], best.mu_lower_bound,
                       best.statistic, best.k_in, best.k_out, best.correct)


def _pair_bound(named: dict[str, np.ndarray], included: np.ndarray, delta: float, beta: float,
                statistics: list[str]) -> OneRunBound:
    assumption = ASSUMPTIONS["gaussian-pair"]
    missing = [s for s in statistics if s not in named]
    if missing or not statistics:
        raise ValueError(f"pair_statistics: {missing or statistics} not among the scores ({', '.join(named)})")
    level = beta / len(statistics)
    results = []
    for name in statistics:
        a, b = named[name][included], named[name][~included]
        refusal = gaussian_pair_refusal(a, b)
        mu = gaussian_pair_mu_lower_bound(a, b, level)
        results.append((refusal, mu, name))
    fitting = [r for r in results if r[0] is None]
    refusal, mu, name = max(fitting or results, key=lambda r: r[1])
    return OneRunBound("gaussian-pair", gdp_epsilon(mu, delta), 1 - beta, assumption, mu, name, refused=refusal)
