"""R-GAP against the RS paper's Theorem 5.1 (its Eq. 16 and 17), on the theorem's own model, with real images.

The theorem: a layer's gradient is g = k·x for an input x and a constraint vector k ∈ R^d; the release adds
N(0, σ² I_d) noise and keeps each coordinate with probability 1 − r; the attacker knows the mask and solves
least squares on the kept coordinates (Eq. 16). Given the mask m the error is Gaussian with

    E[(x − x̂)² | m] = σ² / ‖m ⊙ k‖²                       (Eq. 16's expectation over the noise)
    E[(x − x̂)²]     = σ² E[1/‖m ⊙ k‖²] ≥ σ² / ((1 − r)‖k‖²)   (Eq. 17, by Jensen)

A linear classifier (Flatten → Linear(C·H·W, classes), no bias on the input) is that model once per pixel:
∂W[:, j] = δ·x_j with δ = ∂L/∂logits, so pixel j is one instance with k = δ (d = number of classes) and
R-GAP's head step (attacks/rgap.py) is exactly the masked least squares. Two attackers run R-GAP:

* ``theorem``: k known exactly (the bias gradient δ released whole and noiseless), as the theorem assumes;
* ``release``: everything from the release (the bias gradient noisy and masked like the weights; withheld
  δ_c come from R-GAP's alternating least squares), the attacker the product runs;
* ``naive`` (on request, a control): the theorem's attacker without the mask, taking withheld coordinates
  as zeros.

Pixels whose column lost every coordinate cannot be recovered (R-GAP returns 0); the errors are averaged
over the recovered pixels, and their share is reported. Eq. 17 bounds the unconditional mean, which is
infinite once a column can lose every coordinate, so with few classes at large r the mean over recovered
pixels may fall below it.

    python bench/rgap_theorem.py                     # Fashion-MNIST (Debian's package), 50 images
    python bench/rgap_theorem.py --images 20 --draws 4 --sigma 0.001 0.01
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpeval.attacks.rgap import reconstruct_one

ATTACKERS = ("theorem", "release")  # and "naive"


@dataclass
class Row:
    sigma: float
    rate: float
    attacker: str
    measured: float       # mean (x_j − x̂_j)² over recovered pixels, images and draws
    clamped: float        # the same with x̂ clamped to the pixel range [0, 1], as the product scores
    eq16: float           # mean σ²/‖m_j ⊙ δ‖² over the same pixels (Eq. 16's expectation given the masks)
    eq17: float           # mean σ²/((1 − r)‖δ‖²) over the images (the Jensen bound)
    recovered: float      # share of pixels with at least one kept coordinate

    @property
    def ratio(self) -> float:
        return self.measured / self.eq16


def linear_model(in_shape: tuple[int, ...], classes: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(in_shape)), classes))


@torch.no_grad()
def measure(images: torch.Tensor, labels: torch.Tensor, rates: list[float], sigma: float, draws: int,
            seed: int = 0, attackers: tuple[str, ...] = ATTACKERS) -> list[Row]:
    """Rows of measured vs predicted error for every rate and attacker; images in [0, 1], [N, C, H, W]."""
    in_shape = tuple(images.shape[1:])
    classes = int(labels.max()) + 1
    model = linear_model(in_shape, classes, seed).double()
    head = model[1]
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    for rate in rates:
        sums = {a: np.zeros(4) for a in attackers}  # measured, clamped, eq16, recovered pixels
        eq17, pixels = 0.0, 0
        for x, y in zip(images.double(), labels):
            delta = torch.softmax(head(x.reshape(1, -1))[0], 0) - nn.functional.one_hot(y, classes).double()
            grad_w = delta[:, None] * x.reshape(1, -1)
            eq17 += sigma**2 / ((1 - rate) * float(delta.pow(2).sum()))
            for _ in range(draws):
                keep_w = (torch.rand(grad_w.shape, generator=gen, dtype=torch.float64) >= rate).double()
                keep_b = (torch.rand(delta.shape, generator=gen, dtype=torch.float64) >= rate).double()
                noisy_w = keep_w * (grad_w + sigma * torch.randn(grad_w.shape, generator=gen, dtype=torch.float64))
                noisy_b = keep_b * (delta + sigma * torch.randn(delta.shape, generator=gen, dtype=torch.float64))
                norms = (keep_w * delta[:, None] ** 2).sum(0)
                seen = norms > 0
                pixels += x.numel()
                for attacker in attackers:
                    exact = attacker != "release"
                    grads = {"1.weight": noisy_w, "1.bias": delta if exact else noisy_b}
                    masks = {"1.weight": keep_w, "1.bias": torch.ones_like(delta) if exact else keep_b}
                    x_hat, _ = reconstruct_one(model, grads, None if attacker == "naive" else masks, int(y), in_shape)
                    err = (x_hat.reshape(-1) - x.reshape(-1)) ** 2
                    clamped = (x_hat.reshape(-1).clamp(0, 1) - x.reshape(-1)) ** 2
                    sums[attacker] += [float(err[seen].sum()), float(clamped[seen].sum()),
                                       float((sigma**2 / norms[seen]).sum()), float(seen.sum())]
        for attacker in attackers:
            measured, clamped_sum, eq16, seen_total = sums[attacker]
            rows.append(Row(sigma, rate, attacker, measured / seen_total, clamped_sum / seen_total, eq16 / seen_total,
                            eq17 / len(images), seen_total / pixels))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| σ | r | attacker | measured MSE | Eq. 16 expectation | measured / Eq. 16 | Eq. 17 bound | "
             "pixels recovered | MSE clamped to [0, 1] |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.sigma:g} | {r.rate:g} | {r.attacker} | {r.measured:.3g} | {r.eq16:.3g} | "
                     f"{r.ratio:.3g} | {r.eq17:.3g} | {r.recovered:.1%} | {r.clamped:.3g} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=50, help="Fashion-MNIST training images (the first N)")
    parser.add_argument("--draws", type=int, default=4, help="noise and mask draws per image")
    parser.add_argument("--sigma", type=float, nargs="+", default=[0.001, 0.01], help="noise std per coordinate")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7, 0.9])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from dpeval.core.datasets.torchvision_sets import SYSTEM_FOLDERS, read_idx
    folder = SYSTEM_FOLDERS["FashionMNIST"][0]
    images = read_idx(folder / "train-images-idx3-ubyte.gz")[: args.images].unsqueeze(1).double() / 255
    labels = read_idx(folder / "train-labels-idx1-ubyte.gz")[: args.images].long()
    rows = [row for sigma in args.sigma for row in measure(images, labels, args.rates, sigma, args.draws, args.seed)]
    print(table(rows))


if __name__ == "__main__":
    main()
