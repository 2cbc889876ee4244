"""DP-PCA of the inputs (dpeval.core.pca): the released matrix, its noise and sensitivity checked against
independent computations, the projection against an SVD (a run's ledger composing it with training:
tests/app/test_pca_runs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpeval.core.pca import Projection, dp_pca, noisy_second_moment


def test_without_noise_the_projection_is_the_top_right_singular_vectors_of_the_unit_rows():
    scale = torch.linspace(0.1, 3, 20).view(1, 1, 5, 4)
    x = torch.randn(300, 1, 5, 4, generator=torch.Generator().manual_seed(1)) * scale
    rows = x.reshape(300, -1).double().numpy()
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    _, _, vt = np.linalg.svd(rows, full_matrices=False)
    p = dp_pca(x, 6, 0.0, torch.Generator().manual_seed(0)).double().numpy()
    assert p.shape == (20, 6) and np.allclose(p.T @ p, np.eye(6), atol=1e-6)
    for k in range(6):  # the same directions, up to sign
        assert abs(abs(float(p[:, k] @ vt[k])) - 1) < 1e-5


def test_the_noise_is_one_gaussian_draw_per_entry_on_and_above_the_diagonal():
    """With all-zero inputs the released matrix is the noise itself: symmetric, N(0, σ²) entries."""
    sigma, d = 3.0, 120
    z = noisy_second_moment(torch.zeros(10, d), sigma, torch.Generator().manual_seed(0)).numpy()
    assert np.array_equal(z, z.T)
    upper = z[np.triu_indices(d)]
    assert len(upper) == d * (d + 1) // 2
    assert upper.std() == pytest.approx(sigma, rel=0.03) and abs(upper.mean()) < 0.05 * sigma
    assert np.diag(z).std() == pytest.approx(sigma, rel=0.2)


def test_one_example_moves_the_matrix_by_at_most_one_in_frobenius_norm():
    """The sensitivity the accountant is told (1): whatever the example's scale, it enters as a unit vector."""
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(50, 30, generator=gen)
    for extra in (torch.rand(1, 30, generator=gen) * 1e6, torch.full((1, 30), 1e-9), torch.zeros(1, 30)):
        change = noisy_second_moment(torch.cat([x, extra]), 0.0, gen) - noisy_second_moment(x, 0.0, gen)
        assert float(torch.linalg.matrix_norm(change)) <= 1 + 1e-9


def test_the_projection_is_a_fixed_front_of_k_one_pixel_channels():
    p = torch.linalg.qr(torch.randn(64, 5))[0]
    front = Projection(p)
    x = torch.randn(7, 1, 8, 8)
    assert torch.allclose(front(x), (x.reshape(7, 64) @ p).reshape(7, 5, 1, 1))
    assert front(x[0]).shape == (5, 1, 1)  # one example, as a per-sample engine calls it
    assert not list(front.parameters()) and "projection" in dict(front.named_buffers())
