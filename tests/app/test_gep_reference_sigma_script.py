"""bench/gep_reference_sigma.py: the σ GEP's reference code picks for a target ε, as its accounting computes it
(the values below were computed with the reference repository's own accountant)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from dpeval.core.accounting import noise_for

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gep_reference_sigma", ROOT / "bench/gep_reference_sigma.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


@pytest.mark.parametrize("epsilon,q,steps,delta,gep,expected", [
    (2, 0.02, 2500, 1e-5, True, 3.64), (5, 0.02, 5000, 1e-5, True, 2.24), (8, 0.02, 10000, 1e-5, True, 2.09),
    (2, 0.02, 2500, 1e-5, False, 2.64), (8, 0.02, 10000, 1e-5, False, 1.56),  # CIFAR-10, batch 1000
    (2, 1000 / 604388, 3021, 1e-6, True, 0.87), (2, 1000 / 604388, 3021, 1e-6, False, 0.85),  # extended SVHN
])
def test_the_reference_codes_sigma(epsilon, q, steps, delta, gep, expected):
    assert script.reference_sigma(epsilon, q, steps, delta, gep) == pytest.approx(expected, abs=1e-9)


def test_the_grid_point_is_the_smallest_below_the_target():
    sigma = script.reference_sigma(2, 1 / 60, 3000, 1e-5)
    assert script.reference_epsilon(sigma, 1 / 60, 3000, 1e-5, True) < 2
    assert script.reference_epsilon(sigma - 0.01, 1 / 60, 3000, 1e-5, True) >= 2
    # dpeval's joint accounting (one sampled Gaussian at σ/√2, Balle et al.'s conversion, orders to 1024) calibrates
    # a different σ for the same ε: the recipes say which one a run used
    assert not math.isclose(noise_for(2, 1e-5, 1 / 60, 3000) * math.sqrt(2), sigma, rel_tol=0.02)
