"""Model zoo: small classifiers used by the DP training and privacy-attack experiments, registered by name, one
module per family: ``cnns`` (the plain CNNs and the MLP), ``hcnn`` (ScatterNet + CNN), ``resnet`` (ResNet-20 with
GroupNorm) and ``transformers`` (``vit``, ``gpt``). A model is a factory ``(in_shape, num_classes) -> nn.Module``
decorated with ``@MODELS.register("name", "description")``; adding one is one new module here
(docs/architecture.md, "How to add a model").

Every network takes images in pixel range [0, 1]; ``build_model`` prepends a ``Normalize`` layer so
gradient-inversion attacks can optimise directly in pixel space. Networks use only Conv2d, Linear,
GroupNorm, activations, pooling and Flatten (never BatchNorm, which mixes samples in a batch and so
breaks per-sample gradients and DP-SGD), plus — in ``hcnn`` / ``hcnn-small`` — a fixed scattering
transform in front (``dpeval.core.scatternet``), which has no parameters. That keeps them usable by both
``torch.func`` (functional_call + vmap, with the fixed front applied outside vmap:
``dpeval.core.per_sample.fixed_front``) and Opacus' per-layer hooks.

Factories validate the input shape arithmetically so a shape that cannot work is reported as a
``ConfigError`` when the model is built, not as a torch shape error in the middle of training
(``_shapes``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.models._shapes import check_in_shape
from dpeval.core.pca import Projection
from dpeval.core.registry import MODELS
from dpeval.core.settings import ModelConfig


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std``.

    mean/std are buffers, not parameters: they must follow ``.to(device)`` and be saved in the state
    dict, but never be trained, clipped or noised, and never appear in per-sample gradients.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) == 0 or len(mean) != len(std):
            raise ConfigError(
                f"model.normalize: mean and std need one value per channel, got {len(mean)} mean "
                f"and {len(std)} std values"
            )
        if any(s <= 0 for s in std):
            raise ConfigError(f"model.normalize: std values must all be > 0, got {std}")
        # Shape (C, 1, 1) broadcasts over (B, C, H, W) and over single (C, H, W) samples under vmap.
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"channels={self.mean.numel()}"


def build_model(
    name: str,
    in_shape: tuple[int, int, int],
    num_classes: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    settings: ModelConfig | None = None,
    vocab: int | None = None,
    projection: torch.Tensor | None = None,
) -> nn.Sequential:
    """Build registered model ``name`` as ``Sequential(Normalize(mean, std), net)``, or with a DP-PCA
    ``projection`` (d × k, ``dpeval.core.pca``) as ``Sequential(Normalize, Projection, net)`` where the net takes
    the k projected values as a (k, 1, 1) input.

    ``settings`` carries the shape settings of the models that take them (``takes_settings``: a factory's
    ``settings`` names the ones it reads, and any other that is set is refused); ``vocab`` is the
    token data's vocabulary (None for images). Raises ConfigError for an unknown name, an unusable input
    shape, settings given to a model that takes none, or mean/std whose length does not match the number of
    input channels.
    """
    factory = MODELS.get(name, field="model.name")
    settings = settings if settings is not None else ModelConfig()
    given = settings.given()
    accepted = getattr(factory, "settings", ())
    refused = [key for key in given if key not in accepted]
    if refused:
        takes = f"takes only model.{', model.'.join(accepted)}" if accepted else "takes no shape settings"
        raise ConfigError(f"model.{refused[0]}: model {name!r} {takes}; leave model.{', model.'.join(refused)} unset")
    shape = check_in_shape(name, in_shape, num_classes)
    if len(mean) != shape[0] or len(std) != shape[0]:
        raise ConfigError(
            f"model.normalize: input has {shape[0]} channel(s) but normalisation mean/std have "
            f"{len(mean)}/{len(std)} values; give one per channel"
        )
    norm = Normalize(mean, std)
    front: list[nn.Module] = [norm]
    if projection is not None:
        if projection.shape[0] != math.prod(shape):
            raise ConfigError(f"model.pca.dims: the projection takes {projection.shape[0]} input values, the data "
                              f"has {math.prod(shape)}")
        front.append(Projection(projection))
        shape = check_in_shape(name, (int(projection.shape[1]), 1, 1), num_classes)
    if accepted:
        return nn.Sequential(*front, factory(shape, num_classes, settings=settings, vocab=vocab))
    return nn.Sequential(*front, factory(shape, num_classes))
