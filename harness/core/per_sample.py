"""Per-sample gradients with torch.func (functional_call + vmap + grad), micro-batched.

Each example's loss is computed on its own (a batch of one inside ``vmap``), so the gradient of example i
depends on example i alone — the property DP clipping relies on. Memory is bounded by the micro-batch
(``train.physical_batch_size``): the caller feeds micro-batches and the defense keeps a running sum.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap


class PerSampleGradients:
    """``psg(x, y) -> {name: Tensor[b, *param.shape]}`` for the trainable parameters of ``model``.

    Reads the model's current parameters at every call (no copy is kept), so it follows training.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]

        def loss_one(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                     x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
            return F.cross_entropy(logits, y.unsqueeze(0))

        self._per_sample = vmap(grad(loss_one), in_dims=(None, None, 0, 0))

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        params = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        buffers = {n: b.detach() for n, b in self.model.named_buffers()}
        return self._per_sample(params, buffers, x, y)


def micro_batches(x: torch.Tensor, y: torch.Tensor, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Split a logical batch into chunks of at most ``size`` examples (none for an empty batch)."""
    for start in range(0, x.shape[0], size):
        yield x[start:start + size], y[start:start + size]
