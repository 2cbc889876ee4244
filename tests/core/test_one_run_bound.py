"""The one-run ε lower bound (Steinke, Nasr & Jagielski 2023) against independent computations: exact binomial
tails in rational arithmetic, the closed form of an all-correct audit, and an exact enumeration of its
false-alarm rate on a mechanism that is exactly ε-DP."""

import math

import numpy as np
import pytest

from dpeval.core.statistics import guess_and_count, one_run_epsilon_lower_bound, one_run_p_values


def pmf(r: int, p: float) -> list[float]:
    """Binomial(r, p) probabilities from log-gamma terms (no scipy), summed in float."""
    return [math.exp(math.lgamma(r + 1) - math.lgamma(j + 1) - math.lgamma(r - j + 1)
                     + (j * math.log(p) if j else 0.0) + ((r - j) * math.log1p(-p) if r - j else 0.0))
            for j in range(r + 1)]


def exact_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The theorem's right-hand side written out term by term: P[B ≥ v] + 2mδ · max_i P[v − i ≤ B ≤ v − 1] / i."""
    probs = pmf(r, math.exp(eps) / (1 + math.exp(eps)))
    tail = math.fsum(probs[v:])
    worst = max((math.fsum(probs[v - i:v]) / i for i in range(1, v + 1)), default=0.0)
    return min(tail + 2 * m * delta * worst, 1.0)


@pytest.mark.parametrize("m,r,v,delta", [(40, 30, 27, 0.0), (40, 30, 27, 1e-3), (100, 60, 41, 1e-4),
                                         (100, 100, 100, 1e-5), (20, 12, 5, 1e-2)])
def test_p_value_matches_the_exact_sum(m, r, v, delta):
    eps = np.array([0.0, 0.5, 1.3, 2.7, 4.0])
    ours = one_run_p_values(r, v, m, eps, delta)
    exact = [exact_p_value(m, r, v, e, delta) for e in eps]
    assert ours == pytest.approx(exact, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_all_correct_guesses_give_the_closed_form(r):
    """δ = 0 and v = r: P[B = r] = p^r ≤ β ⇔ p ≤ β^(1/r), so ε_LB = logit(β^(1/r))."""
    beta = 0.05
    p = beta ** (1 / r)
    assert one_run_epsilon_lower_bound(r, r, r, 0.0, beta) == pytest.approx(math.log(p / (1 - p)), abs=1e-6)


@pytest.mark.parametrize("m,r,v,delta", [(1000, 200, 170, 1e-5), (1000, 1000, 990, 1e-5), (50, 50, 45, 0.0)])
def test_bound_is_where_the_exact_p_value_crosses_beta(m, r, v, delta):
    beta = 0.05
    bound = one_run_epsilon_lower_bound(r, v, m, delta, beta)
    assert bound > 0
    assert exact_p_value(m, r, v, bound, delta) <= beta
    assert exact_p_value(m, r, v, bound + 1e-3, delta) > beta


def test_delta_only_lowers_the_bound_and_a_large_delta_rejects_nothing():
    free = one_run_epsilon_lower_bound(500, 480, 1000, 0.0, 0.05)
    assert one_run_epsilon_lower_bound(500, 480, 1000, 1e-5, 0.05) < free
    assert (one_run_epsilon_lower_bound(500, 480, 1000, 1e-3, 0.05)
            < one_run_epsilon_lower_bound(500, 480, 1000, 1e-5, 0.05))
    # 2mδ · (…) alone exceeds β: no ε can be rejected
    assert one_run_epsilon_lower_bound(500, 500, 1000, 0.5, 0.05) == 0.0


def test_chance_guessing_proves_nothing():
    assert one_run_epsilon_lower_bound(1000, 500, 1000, 1e-5, 0.05) == 0.0
    assert one_run_epsilon_lower_bound(0, 0, 1000, 1e-5, 0.05) == 0.0


@pytest.mark.parametrize("eps0,r", [(0.5, 40), (1.0, 60), (2.0, 100)])
def test_false_alarm_rate_on_an_exactly_eps_dp_mechanism_is_at_most_beta(eps0, r):
    """Randomized response on each canary's bit is exactly ε0-DP and makes every guess correct independently
    with probability e^ε0/(1 + e^ε0): W ~ Binomial(r, ·) exactly. Summing its pmf over the counts whose bound
    exceeds ε0 is the audit's exact false-alarm probability, which must be ≤ β (and the audit must have
    power: an all-correct audit of that size would be caught at a much smaller ε)."""
    beta = 0.05
    p = math.exp(eps0) / (1 + math.exp(eps0))
    alarms = [v for v in range(r + 1) if one_run_epsilon_lower_bound(r, v, r, 0.0, beta) > eps0]
    rate = sum(math.comb(r, v) * p**v * (1 - p) ** (r - v) for v in alarms)
    assert alarms and rate <= beta
    assert rate > beta / 10  # not vacuous: the test uses most of its level


def test_guesses_take_the_extremes_and_count_correct_ones():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    included = np.array([True, False, True, False, True, False])
    rng = np.random.default_rng(0)
    # "in" for {5, 4}: one right; "out" for {0}: right
    assert guess_and_count(scores, included, 2, 1, rng) == 2
    assert guess_and_count(scores, included, 0, 3, rng) == 2   # "out" for {2, 1, 0}: 2 and 0 right
    assert guess_and_count(scores, included, 6, 0, rng) == 3
    with pytest.raises(ValueError):
        guess_and_count(scores, included, 4, 3, rng)


def test_ties_are_broken_independently_of_membership():
    """Constant scores carry no information: over many tie-break orders the guesses are right half the time."""
    included = np.arange(200) % 2 == 0
    rng = np.random.default_rng(1)
    correct = [guess_and_count(np.zeros(200), included, 20, 20, rng) for _ in range(300)]
    assert abs(np.mean(correct) / 40 - 0.5) < 0.02


@pytest.mark.parametrize("m,r,v,delta,expected", [
    (1000, 100, 75, 1e-4, 0.673),      # Appendix D's worked example: 75 of 100 guesses right among 1,000 canaries
    (100, 100, 75, 1e-4, 0.699),       # the same without abstentions (m = r)
    (100_000, 1510, 1439, 1e-5, 2.675),  # a reported white-box result: m = 100,000, r = 1,510, v = 1,439
])
def test_numbers_from_the_paper(m, r, v, delta, expected):
    """Values of Steinke, Nasr & Jagielski (arXiv 2305.08846), to the printed digits."""
    assert one_run_epsilon_lower_bound(r, v, m, delta, 0.05) == pytest.approx(expected, abs=1.5e-3)
