"""Differentially private PCA of the inputs (Abadi et al. 2016, §4 "DP PCA"), the front of a model that trains on
the projected inputs (the AdaCliP paper's MNIST network: 784 → DP-PCA to 60 → one hidden layer of 1000 → 10).

The mechanism, on the private pool's n inputs as the model sees them (normalised, flattened to d values):

1. each input a_i is scaled to unit ℓ2 norm (an all-zero input stays zero), so adding or removing one example
   changes M = Σ a_i a_iᵀ by a_i a_iᵀ, whose Frobenius norm is ‖a_i‖² ≤ 1;
2. the released matrix is M + Z with Z symmetric, its d(d+1)/2 entries on and above the diagonal drawn
   i.i.d. N(0, σ_p²) and mirrored below it. The entries on and above the diagonal determine M + Z, and the
   change a_i a_iᵀ restricted to them has ℓ2 norm ≤ ‖a_i a_iᵀ‖_F ≤ 1: one Gaussian mechanism of multiplier σ_p
   on the whole pool (sample rate 1, one release), accounted as such before training's releases;
3. the projection is onto the eigenvectors of the k largest eigenvalues of M + Z (post-processing).

Abadi et al. computed it on a random sample of the training set; here on the whole private pool (no
subsampling, no amplification claimed). The split of the budget: ``model.pca.epsilon_share`` f sets σ_p so
that the PCA release alone would be (f·ε, δ)-DP, and training's σ is then calibrated so that the composition of
both is (ε, δ)-DP (the run's ``privacy.epsilon``); or ``model.pca.noise_multiplier`` gives σ_p itself.
"""

from __future__ import annotations

import torch
from torch import nn


def noisy_second_moment(x: torch.Tensor, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """M + Z (float64, d × d): the released matrix of steps 1–2 above (σ_p = ``noise_multiplier``; 0 = M)."""
    a = x.reshape(x.shape[0], -1).double()
    norms = a.norm(dim=1, keepdim=True)
    a = a / torch.where(norms > 0, norms, torch.ones_like(norms))
    second_moment = a.T @ a
    if noise_multiplier > 0:
        z = torch.randn(second_moment.shape, generator=generator, dtype=torch.float64) * noise_multiplier
        second_moment = second_moment + torch.triu(z) + torch.triu(z, diagonal=1).T  # one draw per entry on/above
    return second_moment


def dp_pca(x: torch.Tensor, dims: int, noise_multiplier: float, generator: torch.Generator) -> torch.Tensor:
    """The d × ``dims`` projection (orthonormal columns) onto the top principal directions of ``x`` (n × d),
    released with the Gaussian mechanism above (σ_p = ``noise_multiplier``; 0 = the exact, non-private PCA).

    Computed in float64; each column's sign is fixed (its largest-magnitude entry positive), so the same noise
    gives the same projection."""
    _, vectors = torch.linalg.eigh(noisy_second_moment(x, noise_multiplier, generator))  # ascending eigenvalues
    top = vectors[:, -dims:].flip(1)                                                     # the largest first
    peak = top.abs().argmax(dim=0)
    signs = torch.sign(top[peak, torch.arange(dims)])
    return (top * signs).float().contiguous()


class Projection(nn.Module):
    """x (B × C × H × W) → (x flattened) @ P, as B × k × 1 × 1: a fixed front (a buffer, no parameter), so the
    network behind it sees k one-pixel channels and every per-sample engine applies it outside its vmap."""

    def __init__(self, projection: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("projection", projection)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.projection.shape[1]
        return (x.reshape(*x.shape[:-3], -1) @ self.projection).reshape(*x.shape[:-3], k, 1, 1)

    def extra_repr(self) -> str:
        return f"{self.projection.shape[0]} -> {self.projection.shape[1]}"
