"""Model zoo: small image classifiers used by the DP training and privacy-attack experiments.

Every network takes images in pixel range [0, 1]; ``build_model`` prepends a ``Normalize`` layer so
gradient-inversion attacks can optimise directly in pixel space. Networks use only Conv2d, Linear,
GroupNorm, activations, pooling and Flatten (never BatchNorm, which mixes samples in a batch and so
breaks per-sample gradients and DP-SGD), plus — in ``hcnn`` / ``hcnn-small`` — a fixed scattering
transform in front (``harness.core.scatternet``), which has no parameters. That keeps them usable by both
``torch.func`` (functional_call + vmap, with the fixed front applied outside vmap:
``harness.core.per_sample.fixed_front``) and Opacus' per-layer hooks.

Factories validate the input shape arithmetically so a shape that cannot work is reported as a
``ConfigError`` when the model is built, not as a torch shape error in the middle of training.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from harness.core.errors import ConfigError
from harness.core.registry import MODELS
from harness.core.scatternet import SCATTER_J, Scattering, coefficients_per_channel

Shape = tuple[int, int, int]
ModelFactory = Callable[[Shape, int], nn.Module]


# Dataset name -> model used when the config does not name one.
DEFAULT_MODELS: dict[str, str] = {
    "digits": "cnn3",
    "synthetic": "mlp",
    "mnist": "dpcnn-small",
    "fashionmnist": "dpcnn-small",
    "cifar10": "dpcnn",
    "svhn": "dpcnn",
    "imagefolder": "resnet20-gn",
}


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
) -> nn.Sequential:
    """Build registered model ``name`` as ``Sequential(Normalize(mean, std), net)``.

    Raises ConfigError for an unknown name, an unusable input shape, or mean/std whose length does
    not match the number of input channels.
    """
    factory = MODELS.get(name, field="model.name")
    shape = _check_in_shape(name, in_shape, num_classes)
    if len(mean) != shape[0] or len(std) != shape[0]:
        raise ConfigError(
            f"model.normalize: input has {shape[0]} channel(s) but normalisation mean/std have "
            f"{len(mean)}/{len(std)} values; give one per channel"
        )
    norm = Normalize(mean, std)
    return nn.Sequential(norm, factory(shape, num_classes))


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with requires_grad when ``trainable_only``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------------------------------
# Shape validation helpers


def _check_in_shape(name: str, in_shape: Sequence[int], num_classes: int) -> Shape:
    if (
        len(tuple(in_shape)) != 3
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in in_shape)
    ):
        raise ConfigError(
            f"model.name: {name!r} needs an input shape (channels, height, width) of positive "
            f"integers, got {tuple(in_shape)}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"model.name: {name!r} needs num_classes >= 1, got {num_classes!r}")
    c, h, w = in_shape
    return (c, h, w)


def _pair(v: int | tuple[int, ...], i: int) -> int:
    return v if isinstance(v, int) else v[i]


def _walk(layers: nn.Sequential, shape: Shape) -> Shape | None:
    """Output shape of a plain conv/pool stack, or None if some feature map would be empty.

    Uses the floor formula from the Conv2d/MaxPool2d docs; ceil_mode and string padding are not used
    by any model here.
    """
    c, h, w = shape
    for m in layers:
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            k, s, p = m.kernel_size, m.stride, m.padding
            d = getattr(m, "dilation", 1)
            if isinstance(p, str) or getattr(m, "ceil_mode", False):
                raise NotImplementedError("shape walk supports numeric padding and floor mode only")
            h, w = (
                (size + 2 * _pair(p, i) - _pair(d, i) * (_pair(k, i) - 1) - 1) // _pair(s, i) + 1
                for i, size in enumerate((h, w))
            )
            if isinstance(m, nn.Conv2d):
                c = m.out_channels
            if h < 1 or w < 1:
                return None
    return (c, h, w)


def _min_side(layers: nn.Sequential, channels: int) -> int:
    """Smallest square side the stack accepts (only called on the error path)."""
    for side in range(1, 4097):
        if _walk(layers, (channels, side, side)) is not None:
            return side
    return 4097


def _features_out(name: str, layers: nn.Sequential, in_shape: Shape) -> Shape:
    out = _walk(layers, in_shape)
    if out is None:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): its strides/pools "
            f"need height and width >= {_min_side(layers, in_shape[0])}"
        )
    return out


def _require_min_side(name: str, in_shape: Shape, min_side: int) -> None:
    if in_shape[1] < min_side or in_shape[2] < min_side:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): it needs height "
            f"and width >= {min_side}"
        )


def _numel(shape: Shape) -> int:
    return shape[0] * shape[1] * shape[2]


# --------------------------------------------------------------------------------------------------
# Registered models. Each factory: (in_shape, num_classes) -> nn.Module taking (B, C, H, W).


@MODELS.register("dpcnn", "Tanh CNN of Papernot et al. (550K params at 3x32x32); needs H, W >= 8")
def dpcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("dpcnn", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 32, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1), nn.Tanh(),
        nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.Tanh(),
        nn.Conv2d(128, 128, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2),
    )  # fmt: skip
    flat = _numel(_features_out("dpcnn", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 128), nn.Tanh(), nn.Linear(128, num_classes)
    )


@MODELS.register(
    "dpcnn-small", "Tramer & Boneh tanh CNN for 28x28 grayscale (26K params); needs H, W >= 16"
)
def dpcnn_small(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("dpcnn-small", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=2, padding=2), nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2, padding=0), nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
    )  # fmt: skip
    flat = _numel(_features_out("dpcnn-small", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes)
    )


@MODELS.register(
    "cnn6", "R-GAP CNN6 (Zhu & Blaschko): 6 bias-free convs, LeakyReLU(0.2), strides, no pooling"
)
def cnn6(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("cnn6", in_shape, num_classes)
    c = in_shape[0]
    # Convs are bias-free as in R-GAP (the closed-form attack solves W x = y layer by layer);
    # this is also what gives the reference 154,266 parameters at 3x32x32 / 10 classes.
    specs = [(c, 12, 4, 2, 2), (12, 36, 3, 2, 1), (36, 36, 3, 1, 1), (36, 36, 3, 1, 1),
             (36, 64, 3, 2, 1), (64, 128, 3, 1, 1)]  # fmt: skip
    layers: list[nn.Module] = []
    for cin, cout, k, s, p in specs:
        layers += [nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False), nn.LeakyReLU(0.2)]
    features = nn.Sequential(*layers)
    flat = _numel(_features_out("cnn6", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes, bias=True))


@MODELS.register("cnn3", "3-conv strided LeakyReLU CNN for 8x8 digits; attackable by IG and R-GAP")
def cnn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("cnn3", in_shape, num_classes)
    c = in_shape[0]
    # Bias-free convs follow the R-GAP convention (as cnn6) so the closed-form attack applies as-is.
    features = nn.Sequential(
        nn.Conv2d(c, 16, 3, stride=1, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
    )  # fmt: skip
    flat = _numel(_features_out("cnn3", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes))


@MODELS.register("fcn3", "R-GAP FCN3: Linear(CHW->1000->100->classes) with LeakyReLU(0.2)")
def fcn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("fcn3", in_shape, num_classes)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(_numel(in_shape), 1000), nn.LeakyReLU(0.2),
        nn.Linear(1000, 100), nn.LeakyReLU(0.2),
        nn.Linear(100, num_classes),
    )  # fmt: skip


@MODELS.register("mlp", "One-hidden-layer tanh MLP (128 units); small and fast, used by tests")
def mlp(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("mlp", in_shape, num_classes)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(_numel(in_shape), 128), nn.Tanh(), nn.Linear(128, num_classes)
    )


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
    in_shape = _check_in_shape(name, in_shape, num_classes)
    c, h, w = in_shape
    k, step = c * coefficients_per_channel(), 2 ** SCATTER_J
    features = head(k)
    if min(h, w) < step or _walk(features, (k, h // step, w // step)) is None:
        least = next(s for s in range(step, 4097) if _walk(features, (k, s // step, s // step)) is not None)
        raise ConfigError(f"model.name: {name!r} cannot take input shape {tuple(in_shape)} (C, H, W): its "
                          f"scattering (÷{step}) and pools need height and width >= {least}")
    scattering = Scattering(in_shape)
    flat = _numel(_features_out(name, features, scattering.out_shape))
    return nn.Sequential(scattering, nn.GroupNorm(SCATTER_GROUPS, scattering.out_shape[0], affine=False),
                         *features, nn.Flatten(), *classifier(flat))


@MODELS.register("hcnn", "ScatterNet+CNN of Tramer & Boneh (fixed scattering J=2, GroupNorm; 187K params at "
                         "3x32x32); needs H, W >= 8")
def hcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    def head(k: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(k, 64, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2, 2),
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


# ResNet-20 with GroupNorm. 4 groups everywhere: the widths 16/32/64 are all divisible by 4, giving
# 4/8/16 channels per group, so early layers still normalise over several channels.
_GN_GROUPS = 4


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(_GN_GROUPS, channels, affine=True)


class _BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus shortcut, then ReLU (He et al. 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        # Convs before a norm layer carry no bias: GN's affine shift makes it redundant.
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _gn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.norm2 = _gn(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), _gn(cout)
            )
        # Separate, non-inplace ReLUs: in-place ops interfere with Opacus' backward hooks.
        self.act1 = nn.ReLU()
        self.act2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNetGN(nn.Module):
    """CIFAR-style ResNet (3 stages of ``blocks`` basic blocks, widths 16/32/64) with GroupNorm."""

    def __init__(self, in_channels: int, num_classes: int, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), _gn(16), nn.ReLU()
        )
        stages: list[nn.Module] = []
        cin = 16
        for i, width in enumerate((16, 32, 64)):
            for j in range(blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(_BasicBlock(cin, width, stride))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))


@MODELS.register("resnet20-gn", "ResNet-20 (16/32/64) with GroupNorm(4 groups), any C; H, W >= 4")
def resnet20_gn(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("resnet20-gn", in_shape, num_classes)
    # Strided 3x3/pad-1 convs never produce empty maps, so torch would accept any size; we require
    # 4x4 so both stride-2 stages really downsample (4 -> 2 -> 1) instead of running on 1x1 maps.
    _require_min_side("resnet20-gn", in_shape, 4)
    return ResNetGN(in_shape[0], num_classes, blocks=3)
