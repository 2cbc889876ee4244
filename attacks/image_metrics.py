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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from dpeval.attacks.base import Artefact
from dpeval.core.files import save_figure

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


def guesses(originals: torch.Tensor, mean: Sequence[float], generator: torch.Generator,
            public: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Data-free guesses of ``originals`` (same shape), made without any gradient: ``noise`` (uniform),
    ``mean`` (a constant image at the per-channel dataset mean, public: it is the model's Normalize
    layer) and, given public images, ``public`` (their per-pixel mean: the best constant guess in MSE)."""
    out = {
        "noise": torch.rand(originals.shape, generator=generator, dtype=torch.float32),
        "mean": torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1).expand_as(originals).contiguous(),
    }
    if public is not None and len(public):
        out["public"] = public.float().mean(dim=0, keepdim=True).expand_as(originals).contiguous()
    return out


def matched_psnr(originals: torch.Tensor, reconstructions: torch.Tensor) -> list[float]:
    """Per-image PSNR of ``originals[i]`` against its Hungarian-matched reconstruction."""
    perm = match(originals, reconstructions)
    return per_image(originals, reconstructions[torch.as_tensor(perm)])["psnr"]


def baselines(originals: torch.Tensor, mean: Sequence[float], generator: torch.Generator,
              public: torch.Tensor | None = None) -> dict[str, float]:
    """Mean PSNR of each data-free guess (``baseline_psnr_<guess>``, see ``guesses``). An attack whose
    PSNR is near these learnt nothing about the target."""
    return {f"baseline_psnr_{name}": float(np.mean(matched_psnr(originals, guess)))
            for name, guess in guesses(originals, mean, generator, public).items()}


def save_grid(originals: torch.Tensor, reconstructions: torch.Tensor | Sequence[torch.Tensor], path: str | Path,
              title: str = "", captions: Sequence[str] | Sequence[Sequence[str]] | None = None,
              row_labels: Sequence[str] | None = None) -> Path:
    """PNG with the originals (top row) over rows of matched reconstructions (one tensor per row, e.g.
    one per attacked state, each ``B x C x H x W``), ``captions`` under each reconstruction (one list per
    row, or a flat list for a single row) and ``row_labels`` naming the reconstruction rows.

    Uses matplotlib's object API with the Agg canvas (no pyplot global state, no display needed).
    At most ``MAX_GRID_COLUMNS`` columns are drawn.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [reconstructions] if isinstance(reconstructions, torch.Tensor) else list(reconstructions)
    if captions is not None and captions and isinstance(captions[0], str):
        captions = [captions]
    labels = list(row_labels) if row_labels is not None else ["reconstructed"] * len(rows)
    a = _as_numpy(originals)
    n = min(a.shape[0], MAX_GRID_COLUMNS)
    fig = Figure(figsize=(max(1.15 * n + 1.0, 3.6), 1.3 * (len(rows) + 1) + 0.7))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows) + 1, n, squeeze=False)
    images = [a] + [_as_numpy(r) for r in rows]
    for row, block in enumerate(images):
        for i in range(n):
            ax = axes[row][i]
            img = block[i]
            if img.shape[0] == 1:
                ax.imshow(img[0], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            else:
                ax.imshow(np.transpose(img, (1, 2, 0)), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row and captions is not None and row - 1 < len(captions) and i < len(captions[row - 1]):
                ax.set_xlabel(captions[row - 1][i], fontsize=7)
    axes[0][0].set_ylabel("original", fontsize=8)
    for row, label in enumerate(labels[:len(rows)], start=1):
        axes[row][0].set_ylabel(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=100)
    return path


@dataclass(frozen=True)
class Grid(Artefact):
    """The picture of ``save_grid`` as an artefact: its arguments, drawn when the application writes it."""

    file: str
    originals: torch.Tensor
    reconstructions: Sequence[torch.Tensor]
    title: str
    captions: Sequence[Sequence[str]]
    row_labels: Sequence[str]

    def write(self, path: Path) -> None:
        save_grid(self.originals, self.reconstructions, path, self.title, self.captions, self.row_labels)
