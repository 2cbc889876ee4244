"""ResNet-20 with GroupNorm (``resnet20-gn``)."""

from __future__ import annotations

import torch
from torch import nn

from dpeval.core.models._shapes import Shape, check_in_shape, require_min_side
from dpeval.core.registry import MODELS

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
    in_shape = check_in_shape("resnet20-gn", in_shape, num_classes)
    # Strided 3x3/pad-1 convs never produce empty maps, so torch would accept any size; we require
    # 4x4 so both stride-2 stages really downsample (4 -> 2 -> 1) instead of running on 1x1 maps.
    require_min_side("resnet20-gn", in_shape, 4)
    return ResNetGN(in_shape[0], num_classes, blocks=3)
