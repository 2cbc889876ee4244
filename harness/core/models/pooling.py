"""2×2 max-pooling that evaluates fast on the CPU.

torch's CPU kernel for a 2×2 window is slow at stride 1 (the Tramèr & Boneh CNN pools that way): on 512 feature maps
of 16×14×14 it takes about 25 ms where the maximum of shifted slices takes 1.5 ms, and evaluating the test split
after every epoch spent most of a small run's time there. The maximum of the same four numbers is exact whichever
way it is taken, so inference (no autograd graph) uses the slices; with autograd on, torch's own kernel runs, so
that training's gradients — which of several tied inputs receives the gradient, and the order in which overlapping
windows add into one input — stay exactly those torch's backward gives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def window_max(x: torch.Tensor, stride: int) -> torch.Tensor:
    """``F.max_pool2d(x, 2, stride)`` (no padding, floor mode) as the maximum of shifted slices: along the width,
    then along the height."""
    rows, cols = (x.shape[-2] - 2) // stride + 1, (x.shape[-1] - 2) // stride + 1
    wide = torch.maximum(x[..., 0:stride * (cols - 1) + 1:stride], x[..., 1:stride * (cols - 1) + 2:stride])
    return torch.maximum(wide[..., 0:stride * (rows - 1) + 1:stride, :], wide[..., 1:stride * (rows - 1) + 2:stride, :])


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` (same parameters, same repr, same results) whose 2×2 windows of stride 1 or 2 are taken by
    ``window_max`` when no gradient is recorded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and self.fast():
            return window_max(x, self.stride if isinstance(self.stride, int) else self.stride[0])
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def fast(self) -> bool:
        """Whether this pooling is one ``window_max`` computes: a 2×2 window, stride 1 or 2 in both directions, no
        padding or dilation, floor mode, no indices returned."""
        def pair(v: object) -> tuple:
            return tuple(v) if isinstance(v, (tuple, list)) else (v, v)

        stride = pair(self.stride)
        return (pair(self.kernel_size) == (2, 2) and stride[0] == stride[1] and stride[0] in (1, 2)
                and pair(self.padding) == (0, 0) and pair(self.dilation) == (1, 1) and not self.ceil_mode
                and not self.return_indices)
