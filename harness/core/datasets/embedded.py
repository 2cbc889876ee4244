"""The datasets that need no files: scikit-learn's bundled digits and learnable synthetic images.

``synthetic``: labels are ``i % classes`` (exactly balanced up to one example), images are one uniform[0, 1]
prototype per class plus N(0, 0.15^2) noise, clipped to [0, 1], all generated from a generator seeded with
``split_seed``.
"""

from __future__ import annotations

import torch

from dpeval.core.registry import DATASETS
from dpeval.core.settings import DataConfig
from dpeval.core.splits import Task, assemble

SYNTHETIC_NOISE_STD = 0.15


@DATASETS.register(
    "digits", "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes; offline default)",
    default_model="cnn3",
)
def _load_digits(cfg: DataConfig) -> Task:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are integers 0..16.
    x = torch.from_numpy(bunch.images).float().div_(16.0).unsqueeze(1)
    y = torch.from_numpy(bunch.target).long()
    return assemble(cfg, 10, x, y)


@DATASETS.register(
    "synthetic", "learnable synthetic images: one random prototype per class plus Gaussian noise",
    default_model="mlp",
)
def _load_synthetic(cfg: DataConfig) -> Task:
    syn = cfg.synthetic
    c, h, w = (int(s) for s in syn.shape)
    gen = torch.Generator().manual_seed(cfg.split_seed)
    prototypes = torch.rand(syn.classes, c, h, w, generator=gen)
    y = torch.arange(syn.size) % syn.classes
    noise = torch.randn(syn.size, c, h, w, generator=gen) * SYNTHETIC_NOISE_STD
    x = (prototypes[y] + noise).clamp_(0.0, 1.0)
    return assemble(cfg, syn.classes, x, y)
