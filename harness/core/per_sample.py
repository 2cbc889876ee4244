"""Per-sample gradients with torch.func (functional_call + vmap + grad), micro-batched.

Each example's loss is computed on its own (a batch of one inside ``vmap``), so the gradient of example i
depends on example i alone — the property DP clipping relies on. Memory is bounded by the micro-batch
(``train.physical_batch_size``): the caller feeds micro-batches and the defense keeps a running sum.

A model's *fixed front* — the leading modules of its (nested) ``nn.Sequential`` that own no trainable
parameter: the ``Normalize`` layer, a fixed scattering transform and a parameter-free GroupNorm — is applied
to the whole micro-batch once, outside ``vmap``, and only the rest (the *head*) is differentiated per sample
(``fixed_front``). The front has no parameter to differentiate and mixes no samples (the registry's modules
are sample-wise), so the per-sample gradients are the same; the front need not support ``vmap`` (kymatio's
scattering does not) and is not recomputed per sample.

Precision (``train.precision``): ``bf16`` runs the per-sample forward and backward passes under bfloat16
autocast; parameters stay float32 and so do the per-sample gradients handed to the defense, so clipping, the
running sums and the noise stay float32 and the clip bound is exact for the gradients the defense is given —
what bfloat16 changes is how accurately those gradients are computed, not the privacy guarantee.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from dpeval.core.errors import ConfigError, RunFailure

PRECISIONS = ("fp32", "bf16")


def compute_precision(precision: str, device: torch.device | str) -> AbstractContextManager:
    """The autocast context of ``train.precision`` for per-sample gradient passes on ``device`` (``fp32``:
    autocast off)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


@dataclass
class FixedFront:
    """``model(x) == head(front(x))``; ``head`` shares the model's modules (and so its parameters)."""

    front: nn.Sequential      # leading modules without trainable parameters (possibly none)
    head: nn.Module           # everything after them
    names: dict[str, str]     # head parameter / buffer name -> the model's name for the same tensor

    def applied(self) -> "FixedFront":
        """The same cut for inputs that are already ``front(x)`` (see ``front_features``): an empty front."""
        return FixedFront(nn.Sequential(), self.head, self.names)


@torch.no_grad()
def front_features(front: nn.Module, x: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """``front(x)`` for every row, computed once in chunks of ``chunk`` rows.

    The fixed front is sample-wise and has no parameter, so an example's features never change during a run:
    training, shadow models and attacks compute them once per data set and reuse them every epoch (the
    scattering transform of ``hcnn`` costs ~1.4 ms of CPU per 28×28 image). Chunking bounds the front's
    working memory and changes no value. An empty front returns ``x`` itself (no copy)."""
    if isinstance(front, nn.Sequential) and len(front) == 0:
        return x
    if len(x) == 0:
        return front(x.new_zeros(1, *x.shape[1:]))[:0]
    return torch.cat([front(x[i:i + chunk]) for i in range(0, len(x), chunk)])


def _trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def fixed_front(model: nn.Module) -> FixedFront:
    """Cut ``model`` after its longest prefix of modules without trainable parameters, descending into
    nested ``nn.Sequential`` containers (a model that is no Sequential has an empty front)."""
    front: list[nn.Module] = []
    rest: list[nn.Module] = []

    def walk(seq: nn.Sequential) -> bool:  # True once the cut is made inside ``seq``
        children = list(seq.children())
        for i, child in enumerate(children):
            if not _trainable(child):
                front.append(child)
                continue
            if not (isinstance(child, nn.Sequential) and walk(child)):
                rest.append(child)
            rest.extend(children[i + 1:])
            return True
        return False

    if isinstance(model, nn.Sequential):
        walk(model)
        head: nn.Module = nn.Sequential(*rest)
    else:
        head = model
    ids = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    names = {n: ids[id(t)] for n, t in [*head.named_parameters(), *head.named_buffers()]}
    return FixedFront(nn.Sequential(*front), head, names)


class PerSampleGradients:
    """``psg(x, y) -> {name: Tensor[b, *param.shape]}`` for the trainable parameters of ``model``.

    Reads the model's current parameters at every call (no copy is kept), so it follows training. The
    per-sample losses come with the gradients at no extra cost: ``loss_sum`` holds the summed loss of the
    last call.
    """

    def __init__(self, model: nn.Module, features: bool = False, precision: str = "fp32") -> None:
        """``features=True``: callers pass ``front_features`` of their inputs, not raw inputs. ``precision``:
        ``bf16`` computes under bfloat16 autocast; the gradients returned keep the parameters' dtype."""
        compute_precision(precision, "cpu")  # validates the name
        self.model = model
        self.precision = precision
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.split = fixed_front(model).applied() if features else fixed_front(model)
        head = self.split.head
        self._head_name = {model_name: n for n, model_name in self.split.names.items()}

        def loss_one(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                     x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = functional_call(head, (params, buffers), (x.unsqueeze(0),))
            return F.cross_entropy(logits, y.unsqueeze(0))

        # randomness="different": in train mode each example draws its own dropout mask (from torch's global
        # generator), as in a batched forward pass; in eval mode nothing is drawn
        self._per_sample = vmap(grad_and_value(loss_one), in_dims=(None, None, 0, 0), randomness="different")
        self.loss_sum: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        head = self.split.head
        params = {n: p.detach() for n, p in head.named_parameters() if p.requires_grad}
        buffers = {n: b.detach() for n, b in head.named_buffers()}
        features = self.split.front(x)  # float32, as training computes it (front_features, outside autocast)
        with compute_precision(self.precision, x.device):
            try:
                grads, losses = self._per_sample(params, buffers, features, y)
            except RuntimeError as exc:
                if "randomness" not in str(exc):
                    raise
                raise RunFailure("train.engine=func: a layer of the model draws random numbers in train mode in a way "
                                 "torch.func cannot draw per example (in place, on a tensor of its own: torchvision's "
                                 "StochasticDepth); use train.engine=lean, or train.module_mode=eval") from None
        self.loss_sum = losses.detach().sum()
        # in the parameters' dtype whatever the precision: autocast casts a copy of each parameter to bfloat16
        # inside an op, and the gradient flowing back through that cast is cast back to the parameter's dtype
        return {n: grads[self._head_name[n]] for n in self.names}


def micro_batches(x: torch.Tensor, y: torch.Tensor, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Split a logical batch into chunks of at most ``size`` examples (none for an empty batch)."""
    for start in range(0, x.shape[0], size):
        yield x[start:start + size], y[start:start + size]


def check_per_sample(model: nn.Module, field: str) -> None:
    """The per-sample engines need a model whose every example is computed alone: BatchNorm mixes the examples of
    a batch (its per-sample gradients do not exist), so a model holding one is refused before anything runs."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(f"{field}: {name or 'the model'} is a {type(module).__name__}, which mixes the examples "
                              f"of a batch; per-sample gradients need a model without BatchNorm (GroupNorm or "
                              f"LayerNorm instead)")


def check_trainable(model: nn.Module, field: str) -> None:
    """Refuse before training a model dpeval cannot train (a plug-in's, or one given to the API): tensors on the meta
    device (shapes without values), no trainable parameter (nothing to release), or trainable parameters that are
    not float32 (the engines, the defenses' noise and the release path compute in float32)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    meta = next((name for name, t in tensors if t.is_meta), None)
    if meta is not None:
        raise ConfigError(f"{field}: {meta} is on the meta device (a shape without values); build the model with "
                          f"real weights")
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise ConfigError(f"{field}: the model has no trainable parameter (every requires_grad is False); a defense "
                          f"releases the gradients of trainable parameters")
    other = next(((name, p.dtype) for name, p in trainable if p.dtype != torch.float32), None)
    if other is not None:
        raise ConfigError(f"{field}: parameter {other[0]} is {str(other[1]).removeprefix('torch.')}; dpeval trains "
                          f"float32 models (build it in float32, or call .float())")
