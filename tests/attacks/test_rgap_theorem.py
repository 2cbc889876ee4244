"""R-GAP's mask-aware head step is the least squares of the RS paper's Theorem 5.1 (bench/rgap_theorem.py).

On a linear classifier every pixel is one instance of the theorem (k = δ = ∂L/∂logits), so R-GAP's error
must match Eq. 16's expectation σ²/‖m ⊙ δ‖² given the masks, rise with the rate, and sit at or above Eq. 17's
bound where every column keeps a coordinate. Margins: over seeds 0–7 (8 images of 6x6, 16 classes, 4 draws)
measured / Eq. 16 spread 0.91–1.10 (sd ≈ 0.05); the bounds below are about 5 sd. Control: the naive attacker
(no mask) is 14–93 times Eq. 16 at r ≥ 0.5, so a head that ignored the mask fails the first check.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("rgap_theorem", ROOT / "bench/rgap_theorem.py")
rgap_theorem = importlib.util.module_from_spec(spec)
sys.modules["rgap_theorem"] = rgap_theorem
spec.loader.exec_module(rgap_theorem)

RATES = [0.0, 0.5, 0.9]


@pytest.fixture(scope="module", params=[0, 1])
def rows(request):
    seed = request.param
    gen = torch.Generator().manual_seed(100 + seed)
    images = torch.rand(8, 1, 6, 6, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 16, (8,), generator=gen)
    labels[0] = 15  # sixteen classes
    found = rgap_theorem.measure(images, labels, RATES, 0.01, 4, seed, ("theorem", "naive"))
    return {(r.rate, r.attacker): r for r in found}


def test_mask_aware_error_is_eq16s_expectation(rows):
    for rate in RATES:
        assert 0.75 < rows[rate, "theorem"].ratio < 1.25, (rate, rows[rate, "theorem"])


def test_the_naive_attacker_is_far_from_it(rows):
    assert rows[0.0, "naive"].measured == pytest.approx(rows[0.0, "theorem"].measured)  # nothing withheld
    for rate in RATES[1:]:
        assert rows[rate, "naive"].ratio > 3, (rate, rows[rate, "naive"])


def test_error_rises_with_the_rate_and_respects_eq17(rows):
    errors = [rows[rate, "theorem"].measured for rate in RATES]
    assert errors[0] * 5 < errors[1] and errors[1] * 3 < errors[2], errors
    for rate in RATES[:2]:  # every column keeps a coordinate: the conditional mean is the unconditional one
        row = rows[rate, "theorem"]
        assert row.recovered == 1.0
        assert row.eq16 >= row.eq17 * (1 - 1e-9)
    assert rows[0.0, "theorem"].eq16 == pytest.approx(rows[0.0, "theorem"].eq17)  # r = 0: Jensen is tight
