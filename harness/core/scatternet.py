"""The fixed front end of Tramèr & Boneh's hybrid "ScatterNet + CNN" models (H-CNN): a 2-D wavelet scattering
transform (Oyallon & Mallat) computed by kymatio's PyTorch frontend.

- J = 2 scales, L = 8 orientations, order 2 (Tramèr & Boneh's setting): every input channel gives
  1 + J·L + L²·J(J−1)/2 = 81 coefficient maps of ⌊H/2^J⌋ × ⌊W/2^J⌋, flattened channel-major into
  ``C·81`` channels (3×32×32 → 243×8×8, 1×28×28 → 81×7×7).
- Fixed and data-independent: no parameters, and its wavelet filters are *non-persistent* buffers (rebuilt
  from J, L and the image shape), so they follow ``.to(device)`` but never enter a state dict, an optimizer,
  a defense or a per-sample gradient. ``FixedFeatures`` marks such a module.
- Differentiable with respect to its input (kymatio's modulus has a stable backward), so an attacker can
  optimise pixels through it (``ig``). The per-sample engines never differentiate through it: they compute
  the model's fixed front once per micro-batch, outside ``vmap`` (``dpeval.core.per_sample.fixed_front``).
  Inside ``vmap`` it cannot run: kymatio's modulus is an ``autograd.Function`` without a vmap rule.
- On CPU it runs with one intra-op thread (``single_cpu_thread``): it is hundreds of small elementwise and
  FFT ops per call; measured on the loaded 2-core development machine, 50 CIFAR images took 0.5 s with one
  thread and 7 s with two.
- kymatio 0.3's ``kymatio.torch`` also imports its 3-D scattering, which needs ``scipy.special.sph_harm``
  (removed in SciPy 1.17); the 2-D frontend module is imported directly, which avoids that import.
"""

from __future__ import annotations

import torch
from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.runtime import single_cpu_thread

SCATTER_J = 2
SCATTER_L = 8


def coefficients_per_channel(j: int = SCATTER_J, angles: int = SCATTER_L) -> int:
    """Order-2 scattering maps per input channel: 1 low-pass, J·L first order, L²·J(J−1)/2 second order."""
    return 1 + j * angles + angles * angles * j * (j - 1) // 2


class FixedFeatures(nn.Module):
    """Marker base of a fixed (non-trainable, data-independent, sample-wise) feature map."""

    func_transforms = True  # False when torch.func (vmap, grad) cannot trace the forward: callers use autograd


class Scattering(FixedFeatures):
    """``(B, C, H, W) -> (B, C·81, H//4, W//4)``: kymatio's 2-D scattering, J = 2, L = 8, order 2."""

    func_transforms = False  # kymatio's torch backend works in place and uses old-style autograd.Functions

    def __init__(self, in_shape: tuple[int, int, int], j: int = SCATTER_J, angles: int = SCATTER_L) -> None:
        super().__init__()
        c, h, w = in_shape
        if h < 2 ** j or w < 2 ** j:
            raise ConfigError(f"model.name: the scattering transform (J = {j}) needs height and width >= {2 ** j}, "
                              f"got input shape {tuple(in_shape)}")
        try:
            from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
        except ImportError as exc:
            raise ConfigError(f"model.name: the ScatterNet models need the kymatio package "
                              f"(pip install kymatio): {exc}") from None
        self.in_shape = (c, h, w)
        self.j, self.angles = j, angles
        self.transform = ScatteringTorch2D(J=j, shape=(h, w), L=angles, max_order=2)
        for name, buf in list(self.transform.named_buffers(recurse=False)):
            self.transform.register_buffer(name, buf, persistent=False)  # rebuilt, never saved or loaded
        self.out_shape = (c * coefficients_per_channel(j, angles), h // 2 ** j, w // 2 ** j)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with single_cpu_thread(x.device):  # ~300 elementwise / FFT ops per call: threads only add contention
            return self.transform(x.contiguous()).flatten(1, 2)  # (B, C, K, h, w) -> (B, C·K, h, w)

    def extra_repr(self) -> str:
        return f"J={self.j}, L={self.angles}, in={self.in_shape}, out={self.out_shape}"
