"""ScatterNet + CNN (Tramèr & Boneh 2021, "H-CNN"): ``hcnn`` and ``hcnn-small``."""

from __future__ import annotations

from typing import Callable

from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.models._shapes import Shape, check_in_shape, features_out, numel, walk
from dpeval.core.models.pooling import MaxPool2d
from dpeval.core.registry import MODELS
from dpeval.core.scatternet import SCATTER_J, Scattering, coefficients_per_channel

# ScatterNet + CNN (Tramèr & Boneh 2021, "H-CNN"): the fixed scattering transform (harness/core/scatternet.py),
# a parameter-free GroupNorm, then a small tanh CNN. Normalisation choice: Tramèr & Boneh normalise the
# scattering features either by GroupNorm(27 groups, affine off) — a per-sample operation, no privacy cost — or
# by a private "data normalisation" whose noisy statistics spend privacy budget. dpeval uses the GroupNorm for
# both models: nothing about the private data leaks through it, so the accountant's ε is the whole cost.
# 27 groups divide every C·81 (9 maps per group at 243 channels, 3 at 81).
SCATTER_GROUPS = 27


def _scatter_cnn(name: str, in_shape: Shape, num_classes: int, head: Callable[[int], nn.Sequential],
                 classifier: Callable[[int], list[nn.Module]]) -> nn.Sequential:
    """Sequential(Scattering, GroupNorm(27, affine off), *head, Flatten, *classifier(flat))."""
    in_shape = check_in_shape(name, in_shape, num_classes)
    c, h, w = in_shape
    k, step = c * coefficients_per_channel(), 2 ** SCATTER_J
    features = head(k)
    if min(h, w) < step or walk(features, (k, h // step, w // step)) is None:
        least = next(s for s in range(step, 4097) if walk(features, (k, s // step, s // step)) is not None)
        raise ConfigError(f"model.name: {name!r} cannot take input shape {tuple(in_shape)} (C, H, W): its "
                          f"scattering (÷{step}) and pools need height and width >= {least}")
    scattering = Scattering(in_shape)
    flat = numel(features_out(name, features, scattering.out_shape))
    return nn.Sequential(scattering, nn.GroupNorm(SCATTER_GROUPS, scattering.out_shape[0], affine=False),
                         *features, nn.Flatten(), *classifier(flat))


@MODELS.register("hcnn", "ScatterNet+CNN of Tramer & Boneh (fixed scattering J=2, GroupNorm; 187K params at "
                         "3x32x32); needs H, W >= 8")
def hcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    def head(k: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(k, 64, 3, padding=1), nn.Tanh(), MaxPool2d(2, 2),
            nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
        )  # fmt: skip

    return _scatter_cnn("hcnn", in_shape, num_classes, head, lambda flat: [nn.Linear(flat, num_classes)])


@MODELS.register("hcnn-small", "ScatterNet+CNN for 28x28 grayscale (Tramer & Boneh; 33K params at 1x28x28); "
                               "needs H, W >= 4")
def hcnn_small(in_shape: Shape, num_classes: int) -> nn.Module:
    def head(k: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(k, 16, 3, stride=2, padding=1), nn.Tanh(),
            nn.Conv2d(16, 32, 3, padding=1), nn.Tanh(),
        )  # fmt: skip

    return _scatter_cnn("hcnn-small", in_shape, num_classes, head,
                        lambda flat: [nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes)])
