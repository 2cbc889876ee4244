"""Image metrics and pictures for gradient-inversion attacks (no attack is registered here).

Conventions (docs/results.md): images are ``B x C x H x W`` in [0, 1]; reconstructions are
clamped to [0, 1] before scoring; a batch of reconstructions is matched one-to-one to the originals by
a Hungarian assignment (scipy's ``linear_sum_assignment``) on the per-pair MSE, then

* ``mse``  - mean over matched pairs of the per-image mean squared error (the RS paper's metric);
* ``psnr`` - mean of the per-image PSNRs (``skimage.metrics.peak_signal_noise_ratio``, data range 1);
* ``ssim`` - mean of the per-image SSIMs (``skimage.metrics.structural_similarity``, data range 1,
  Gaussian-free 7x7 uniform window as skimage's default, shrunk to the largest odd size that fits
  images smaller than 7 pixels).

A pair whose MSE is below 1e-10 is scored as MSE 1e-10 (PSNR 100 dB) so results never hold ``inf``.
scikit-image and matplotlib are imported lazily: this module is imported whenever the attack registry
is, and ``dpeval list`` should stay fast.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

MSE_FLOOR = 1e-10  # PSNR cap of 100 dB on [0, 1] images
MAX_GRID_COLUMNS = 16


def _as_numpy(images: torch.Tensor) -> np.ndarray:
    """``B x C x H x W`` tensor -> float64 numpy array clamped to [0, 1]."""
    return images.detach().to("cpu", torch.float64).clamp(0.0, 1.0).numpy()


def match(originals: torch.Tensor, reconstructions: torch.Tensor) -> np.ndarray:
    """Index ``perm`` such that ``reconstructions[perm[i]]`` is matched to ``originals[i]``.

    Hungarian assignment minimising the total per-pair MSE; the identity for a batch of one.
    """
    from scipy.optimize import linear_sum_assignment

    a, b = _as_numpy(originals), _as_numpy(reconstructions)
    if a.shape != b.shape:
        raise ValueError(f"originals {a.shape} and reconstructions {b.shape} differ in shape")
    if a.shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    flat_a, flat_b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    cost = ((flat_a[:, None, :] - flat_b[None, :, :]) ** 2).mean(axis=2)
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty(a.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def _ssim_one(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    side = min(a.shape[1], a.shape[2])
    win = min(7, side if side % 2 == 1 else side - 1)
    if win < 3:  # SSIM is undefined on images smaller than 3x3
        return math.nan
    if a.shape[0] == 1:
        return float(structural_similarity(a[0], b[0], data_range=1.0, win_size=win))
    return float(structural_similarity(a, b, data_range=1.0, win_size=win, channel_axis=0))


def per_image(originals: torch.Tensor, reconstructions: torch.Tensor) -> dict[str, list[float]]:
    """Per-image MSE, PSNR and SSIM of already matched pairs (``originals[i]`` vs ``reconstructions[i]``)."""
    from skimage.metrics import mean_squared_error, peak_signal_noise_ratio

    a, b = _as_numpy(originals), _as_numpy(reconstructions)
    out: dict[str, list[float]] = {"mse": [], "psnr": [], "ssim": []}
    for x, y in zip(a, b):
        mse = float(mean_squared_error(x, y))
        if mse < MSE_FLOOR:
            psnr = 10.0 * math.log10(1.0 / MSE_FLOOR)
        else:
            psnr = float(peak_signal_noise_ratio(x, y, data_range=1.0))
        out["mse"].append(mse)
        out["psnr"].append(psnr)
        out["ssim"].append(_ssim_one(x, y))
    return out


def score(originals: torch.Tensor, reconstructions: torch.Tensor) -> tuple[dict[str, float], np.ndarray]:
    """Match reconstructions to originals, then return (mean metrics, matching permutation)."""
    perm = match(originals, reconstructions)
    scores = per_image(originals, reconstructions[torch.as_tensor(perm)])
    return {k: float(np.mean(v)) for k, v in scores.items()}, perm


def baselines(originals: torch.Tensor, mean: Sequence[float], generator: torch.Generator) -> dict[str, float]:
    """PSNR of two guesses made without any gradient: uniform noise, and a constant image at the
    per-channel dataset mean (public: it is the model's Normalize layer). An attack whose PSNR is
    near these learnt nothing about the target."""
    noise = torch.rand(originals.shape, generator=generator, dtype=torch.float32)
    flat = torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1).expand_as(originals)
    return {
        "baseline_psnr_noise": score(originals, noise)[0]["psnr"],
        "baseline_psnr_mean": score(originals, flat.contiguous())[0]["psnr"],
    }


def save_grid(originals: torch.Tensor, reconstructions: torch.Tensor, path: str | Path, title: str = "",
              captions: Sequence[str] | None = None) -> Path:
    """PNG with the originals (top row) over their matched reconstructions (bottom row).

    Uses matplotlib's object API with the Agg canvas (no pyplot global state, no display needed).
    At most ``MAX_GRID_COLUMNS`` pairs are drawn.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    a, b = _as_numpy(originals), _as_numpy(reconstructions)
    n = min(a.shape[0], MAX_GRID_COLUMNS)
    fig = Figure(figsize=(max(1.3 * n + 0.6, 3.6), 3.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, n, squeeze=False)
    for i in range(n):
        for row, img in ((0, a[i]), (1, b[i])):
            ax = axes[row][i]
            if img.shape[0] == 1:
                ax.imshow(img[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            else:
                ax.imshow(np.transpose(img, (1, 2, 0)), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
        if captions is not None and i < len(captions):
            axes[1][i].set_xlabel(captions[i], fontsize=7)
    axes[0][0].set_ylabel("original", fontsize=8)
    axes[1][0].set_ylabel("reconstructed", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
