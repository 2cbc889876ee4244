"""The one-run estimators (dpeval.core.one_run_bounds): the GDP conversions against closed forms and the
paper's theory column, the f-DP recursion against a scalar transcription, coverage on simulated mechanisms with
a known ε (the Gaussian mechanism and idealised DP-SGD), planted under-noising caught by every estimator, the
ceilings of a noise-free run, the Gaussian pair refused where its model fails (and why: a Laplace mechanism),
agreement with Mahloujifar et al.'s Table 1, and the public function's contract."""

import math

import numpy as np
import pytest
from scipy import special, stats

import dpeval
from dpeval.core.accounting import epsilon_for
from dpeval.core.one_run_bounds import (
    ESTIMATORS,
    fdp_mu_lower_bound,
    fdp_rejects,
    gaussian_pair_mu_lower_bound,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    one_run_bounds,
)
from dpeval.core.statistics import one_run_epsilon_lower_bound

DELTA = 1e-5


def gaussian_game(mu: float, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """m canaries of a μ-GDP Gaussian mechanism: in ⇒ score 1[in]·μ + N(0, 1)."""
    included = rng.random(m) < 0.5
    return included * mu + rng.normal(size=m), included


def dpsgd_game(q: float, steps: int, sigma: float, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Idealised white-box DP-SGD: an included canary joins each step with probability q and adds 1 (its clipped
    gradient, C = 1) to a projection carrying N(0, σ²) noise; the score is the sum over steps."""
    included = rng.random(m) < 0.5
    samplings = rng.binomial(steps, q, size=m) * included
    return samplings + rng.normal(0.0, sigma * math.sqrt(steps), m), included


# ---------------------------------------------------------------------------------------------------
# GDP conversions


@pytest.mark.parametrize("sigma, theory", [(0.5, 9.99), (1.0, 4.37), (2.0, 1.99), (4.0, 0.92)])
def test_gdp_epsilon_matches_the_papers_theory_column(sigma, theory):
    # Table 1's "theory" column: the ε of the Gaussian mechanism with μ = 1/σ at δ = 1e-5 (two decimals, cut)
    assert gdp_epsilon(1 / sigma, DELTA) == pytest.approx(theory, abs=0.011)


def test_gdp_delta_is_the_privacy_profile_of_two_gaussians():
    # δ(ε) = sup_S P(S) − e^ε Q(S) for P = N(μ, 1), Q = N(0, 1): integrate the positive part numerically
    for mu, eps in [(0.5, 0.3), (1.0, 1.0), (2.0, 3.0)]:
        x = np.linspace(-20, 20, 400_001)
        p, q = stats.norm.pdf(x, mu), stats.norm.pdf(x)
        numeric = np.trapezoid(np.maximum(p - math.exp(eps) * q, 0), x)
        assert gdp_delta(mu, eps) == pytest.approx(numeric, rel=1e-6, abs=1e-12)


def test_gdp_mu_inverts_gdp_epsilon():
    for mu in (0.1, 0.5, 1.0, 3.0, 10.0):
        assert gdp_mu(gdp_epsilon(mu, DELTA), DELTA) == pytest.approx(mu, rel=1e-8)
    assert gdp_epsilon(0.0, DELTA) == 0.0 and gdp_epsilon(math.inf, DELTA) == math.inf


# ---------------------------------------------------------------------------------------------------
# the f-DP recursion


def rejects_scalar(mu: float, r: int, c: int, m: int, level: float) -> bool:
    """The recursion as the paper writes it, one μ, plain Python floats."""
    right, wrong = level * c / m, level * (r - c) / m
    for i in range(c - 1, -1, -1):
        x = min(right, 1.0)
        grown = max(wrong, float(special.ndtr(special.ndtri(x) - mu)))
        right, wrong = right + i / (r - i) * (grown - wrong), grown
    return right + wrong > r / m


def test_vectorised_recursion_matches_the_scalar_one():
    rng = np.random.default_rng(0)
    for _ in range(40):
        m = int(rng.integers(20, 2000))
        r = int(rng.integers(1, m + 1))
        c = int(rng.integers(0, r + 1))
        mus = rng.uniform(0, 6, size=7)
        got = fdp_rejects(mus, r, c, m, 0.05)
        assert list(got) == [rejects_scalar(float(mu), r, c, m, 0.05) for mu in mus], (m, r, c)


def test_fdp_bound_grows_with_correct_guesses_and_is_zero_at_chance():
    m, r = 1000, 200
    mus = [fdp_mu_lower_bound(r, c, m, 0.05) for c in range(100, 201, 20)]
    assert mus == sorted(mus) and mus[0] == 0.0 and mus[-1] > 1.5


# ---------------------------------------------------------------------------------------------------
# coverage: every estimator's bound ≤ the true ε in ≥ 95 % of 200 repetitions


@pytest.mark.slow
@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_every_estimator_covers_a_gaussian_mechanism(mu):
    rng = np.random.default_rng(int(mu * 10))
    truth = gdp_epsilon(mu, DELTA)
    over = {name: 0 for name in ESTIMATORS}
    for rep in range(200):
        scores, included = gaussian_game(mu, 500, rng)
        result = one_run_bounds(scores, included, DELTA, guesses=[(50, 50)],
                                rng=np.random.default_rng(rep))
        for name, bound in result.bounds.items():
            over[name] += bound.epsilon_lower_bound > truth
    assert all(v <= 10 for v in over.values()), over  # ≤ 5 % of 200


@pytest.mark.slow
def test_every_estimator_covers_idealised_dpsgd_at_its_accounted_epsilon():
    """Poisson-subsampled steps: the in-scores are a mixture, not a Gaussian, yet every bound, read as ε,
    stays below the accountant's ε (the GDP readings are conservative here: the mean shift q√T/σ is below the
    CLT's μ)."""
    q, steps, sigma = 0.1, 100, 0.8
    truth = epsilon_for(sigma, q, steps, DELTA)
    rng = np.random.default_rng(3)
    over = {name: 0 for name in ESTIMATORS}
    for rep in range(200):
        scores, included = dpsgd_game(q, steps, sigma, 500, rng)
        result = one_run_bounds(scores, included, DELTA, guesses=[(50, 50)],
                                rng=np.random.default_rng(rep))
        for name, bound in result.bounds.items():
            over[name] += bound.epsilon_lower_bound > truth
    assert all(v <= 10 for v in over.values()), (over, truth)


def test_the_clt_mu_of_dpeval_recipes_reads_below_their_accounted_epsilon():
    """Why the GDP readings may face the accountant's ε: for the default digits run and the Fashion-MNIST
    benchmark's recipes, ε of the CLT's μ = q√(T(e^{1/σ²} − 1)) is below the RDP ε the run reports."""
    from dpeval.core.accounting import noise_for

    for eps, q, steps in [(3.0, 0.1017, 180), (1.0, 0.034, 870), (8.0, 0.034, 870)]:
        sigma = noise_for(eps, DELTA, q, steps)
        mu_clt = q * math.sqrt(steps * (math.exp(1 / sigma**2) - 1))
        assert gdp_epsilon(mu_clt, DELTA) < epsilon_for(sigma, q, steps, DELTA)


# ---------------------------------------------------------------------------------------------------
# planted under-noising, noise-free ceilings


def test_a_tenth_of_the_noise_fails_under_every_estimator():
    """The mechanism claims σ (μ = 0.5, ε = 1.93) but adds σ/10: every estimator proves more than the claim."""
    rng = np.random.default_rng(1)
    claimed = gdp_epsilon(0.5, DELTA)
    design = [(50, 50), (150, 150)]
    scores, included = gaussian_game(5.0, 1000, rng)
    result = one_run_bounds(scores, included, DELTA, guesses=design)
    for name, bound in result.bounds.items():
        assert bound.valid and bound.epsilon_lower_bound > claimed, (name, bound)
    # and the correct mechanism passes them all
    scores, included = gaussian_game(0.5, 1000, rng)
    assert all(b.epsilon_lower_bound <= claimed
               for b in one_run_bounds(scores, included, DELTA, guesses=design).bounds.values())


def test_a_noise_free_run_reaches_each_guessing_estimators_ceiling():
    """Perfectly separated scores: every guess right, so the counting and f-DP bounds are those of r = m all-correct
    guesses — the most m canaries can show — and the Gaussian pair (no spread) is unbounded."""
    m = 400
    included = np.random.default_rng(2).random(m) < 0.5
    scores = included.astype(float)
    k_in = int(included.sum())  # the design that guesses every canary: all "in" guesses on the included ones
    result = one_run_bounds(scores, included, DELTA, guesses=[(k_in, m - k_in)], estimators=("counting", "f-dp"))
    level = 0.05 / 2
    assert result.bounds["counting"].correct == m
    assert result.bounds["counting"].epsilon_lower_bound == pytest.approx(
        one_run_epsilon_lower_bound(m, m, m, DELTA, level))
    assert result.bounds["f-dp"].mu_lower_bound == pytest.approx(fdp_mu_lower_bound(m, m, m, level))
    assert gaussian_pair_mu_lower_bound(scores[included] + 0.0, scores[~included], 0.05) == math.inf


# ---------------------------------------------------------------------------------------------------
# the Gaussian pair: exact under its model, refused where its model fails


def test_gaussian_pair_limit_is_the_noncentral_t_limit():
    rng = np.random.default_rng(4)
    a, b = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 250)
    mu = gaussian_pair_mu_lower_bound(a, b, 0.05)
    scale = math.sqrt(1 / 300 + 1 / 250)
    pooled = math.sqrt((299 * a.var(ddof=1) + 249 * b.var(ddof=1)) / 548)
    t = (a.mean() - b.mean()) / (pooled * scale)
    assert stats.nct.sf(t, 548, mu / scale) == pytest.approx(0.05, abs=1e-6)


def test_a_laplace_mechanism_refuses_the_gaussian_pair_and_shows_why():
    """Pure ε = 1 (Laplace, scale 1): the Gaussian model of its scores would read ε ≈ 2.8 (the tails are not
    Gaussian), so the pair is refused; the counting bound, which assumes nothing, stays ≤ 1."""
    rng = np.random.default_rng(0)
    included = rng.random(10_000) < 0.5
    scores = included + rng.laplace(0.0, 1.0, included.size)
    result = one_run_bounds(scores, included, DELTA, guesses=[(500, 500), (1000, 1000)])
    pair = result.bounds["gaussian-pair"]
    assert not pair.valid and "not Gaussian" in pair.refused and pair.epsilon_lower_bound > 2
    assert result.bounds["counting"].epsilon_lower_bound <= 1.0
    assert result.best is not None and result.best.estimator != "gaussian-pair"


def test_too_few_scores_refuse_the_pair():
    scores, included = gaussian_game(1.0, 60, np.random.default_rng(5))
    assert "at least" in one_run_bounds(scores, included, DELTA).bounds["gaussian-pair"].refused


def test_a_group_without_spread_refuses_the_pair():
    included = np.random.default_rng(7).random(400) < 0.5
    scores = np.where(included, np.random.default_rng(8).normal(3.0, 1.0, 400), 0.0)  # noise-free out-scores
    pair = one_run_bounds(scores, included, DELTA, guesses=[(50, 50)]).bounds["gaussian-pair"]
    assert not pair.valid and "no spread" in pair.refused


# ---------------------------------------------------------------------------------------------------
# Table 1 of Mahloujifar, Melis & Chaudhuri (bench/one_run_table1.py reproduces all four rows)


@pytest.mark.slow
def test_table1_sigma_2_within_015_of_the_paper():
    """σ = 2, 10⁵ canaries: counting 1.33 and f-DP 1.59 in the paper; the mean over 3 repetitions at the guess
    counts the reproduction found best (k = 0.5 % of m for both) is within ±0.15 of each."""
    got: dict[str, list[float]] = {"counting": [], "f-dp": []}
    for rep in range(3):
        rng = np.random.default_rng([2000, rep])
        included = rng.random(100_000) < 0.5
        scores = included + rng.normal(0.0, 2.0, included.size)
        for name in got:
            bound = one_run_bounds(scores, included, DELTA, estimators=(name,), guesses=[(500, 500)])
            got[name].append(bound.bounds[name].epsilon_lower_bound)
    assert np.mean(got["counting"]) == pytest.approx(1.33, abs=0.15), got
    assert np.mean(got["f-dp"]) == pytest.approx(1.59, abs=0.15), got


# ---------------------------------------------------------------------------------------------------
# the public function


def test_public_function_contract():
    assert dpeval.one_run_bounds is one_run_bounds
    scores, included = gaussian_game(1.0, 500, np.random.default_rng(6))
    result = dpeval.one_run_bounds({"a": scores, "b": -scores}, included, DELTA, pair_statistics=["a"])
    assert set(result.bounds) == set(ESTIMATORS)
    assert all(b.confidence == pytest.approx(1 - 0.05 / 3) for b in result.bounds.values())
    assert result.best is max(result.bounds.values(), key=lambda b: b.epsilon_lower_bound)
    assert {t.statistic for t in result.tests} == {"a", "b"}
    with pytest.raises(ValueError, match="non-finite"):
        one_run_bounds(np.where(included, np.nan, 0.0), included, DELTA)
    with pytest.raises(ValueError, match="inclusion bits"):
        one_run_bounds(scores[:-1], included, DELTA)
    with pytest.raises(ValueError, match="estimators"):
        one_run_bounds(scores, included, DELTA, estimators=("steinke",))
    with pytest.raises(ValueError, match="guesses"):
        one_run_bounds(scores, included, DELTA, guesses=[(400, 400)])
