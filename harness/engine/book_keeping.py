"""Memory-lean per-sample clipping by book-keeping (Bu et al.; FastDP's "BK" / mixed ghost norm).

One forward and one backward pass per micro-batch, no per-sample gradient of the whole model ever exists:

1. A forward hook on every trainable layer keeps its input activation ``a``; a hook on the layer's output
   tensor receives the per-sample output gradient ``ds`` (the loss is a *sum* over samples, so row i of
   ``ds`` is ∂L_i/∂s_i).
2. In that hook the layer's per-sample squared norms are computed — by the ghost norm
   (‖g_i‖² = ⟨a_i a_iᵀ, ds_i ds_iᵀ⟩, no per-sample gradient) where that needs less memory, else by
   instantiating the layer's per-sample gradient (for a conv: one grouped convolution, one group per
   sample, in chunks of samples) — and added to the norms of the layer's group(s).
3. When the last layer of a group has been seen (backprop runs output → input, so a group closes at its
   earliest layer), the group's clip factors C_i are formed and each member's clipped sum Σ_i C_i·g_i is
   computed from what the layer kept (a weighted weight-gradient product, or the instantiated per-sample
   gradient); then the kept tensors are freed. Finer groups close sooner, so they hold less at the peak.

Parameters are passed to the forward pass detached, so autograd computes no parameter gradients at all
(the engine forms the only weight-gradient products needed). The model's fixed front (``Normalize``, a fixed
scattering transform, a parameter-free norm: ``harness.core.per_sample.fixed_front``) runs without autograd;
its output requires grad and drives backprop, which so stops at the first trainable layer's input.

Supported layers: Linear, Conv2d (any stride / padding / dilation, groups = 1, zero padding),
GroupNorm and LayerNorm (per-sample gradients instantiated; they are small). A model with any other
trainable parameter (named in the message) or a layer used twice in one forward is refused — nothing is
ever dropped silently. Like the torch.func path, it assumes samples do not interact in the forward pass
(training runs the model in eval mode; the registry has no batch norm).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from defenses.base import Defense
from defenses.clipping import GroupClipping
from harness.core.errors import ConfigError, RunFailure
from harness.core.per_sample import fixed_front

SUPPORTED = (nn.Linear, nn.Conv2d, nn.GroupNorm, nn.LayerNorm)
WORKSPACE_BUDGET = 1 << 21  # elements (8 MiB in float32) of unfolded conv input per chunk of samples


def trainable_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Modules owning trainable parameters, by module path; ConfigError naming any unsupported ones."""
    layers: dict[str, nn.Module] = {}
    refused: list[str] = []
    for path, module in model.named_modules():
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        prefix = f"{path}." if path else ""
        if not isinstance(module, SUPPORTED) or not _supported_config(module):
            refused += [prefix + n for n in own]
            continue
        layers[path] = module
    if refused:
        raise ConfigError(
            f"train.engine: the book-keeping engine cannot compute per-sample norms of {refused} "
            f"(supported: Linear, Conv2d with groups=1 and zero padding, GroupNorm, LayerNorm); "
            f"use train.engine=func for this model")
    return layers


def _supported_config(module: nn.Module) -> bool:
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str)
    return True


@dataclass
class _Kept:
    """What one layer holds between its backward hook and the close of its group(s)."""

    a: torch.Tensor | None = None                                       # input activation
    ds: torch.Tensor | None = None                                      # per-sample output gradient
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)   # instantiated per-sample grads
    open_groups: int = 0


class BookKeeping:
    """``bk(x, y) -> {name: Σ_i clip(g_i)}``: the clipped gradient sum of one micro-batch.

    ``clipping`` names the model's parameters as ``model.named_parameters()`` does.
    """

    def __init__(self, model: nn.Module, clipping: GroupClipping) -> None:
        self.model = model
        self.clipping = clipping
        self.layers = trainable_layers(model)
        owner = {}
        for path, module in self.layers.items():
            prefix = f"{path}." if path else ""
            for n, p in module.named_parameters(recurse=False):
                if p.requires_grad:
                    owner[prefix + n] = (path, n)
        if set(owner) != set(clipping.names):
            raise ValueError(f"groups and trainable parameters differ: {sorted(set(owner) ^ set(clipping.names))}")
        self.owner = owner  # full name -> (layer path, attribute)
        self.trainable = {path: {a for p, a in owner.values() if p == path} for path in self.layers}
        self.group_of = {n: m for m, g in enumerate(clipping.groups) for n in g}
        self.peak_held = 0  # most layers holding backprop data at once (a memory proxy, for tests)
        self.layer_groups = {path: sorted({self.group_of[n] for n, (p, _) in owner.items() if p == path})
                             for path in self.layers}
        self.split = fixed_front(model)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        kept: dict[str, _Kept] = {}
        norms = [torch.zeros(x.shape[0], device=x.device) for _ in self.clipping.groups]
        pending = [len(g) for g in self.clipping.groups]  # parameters not yet seen in backprop
        sums: dict[str, torch.Tensor] = {}
        held: set[str] = set()  # layers seen in backprop whose groups are still open

        def close(group: int) -> None:
            factors = self.clipping.factor(norms[group].sqrt())
            for name in self.clipping.groups[group]:
                path, attr = self.owner[name]
                sums[name] = self._clipped_sum(self.layers[path], kept[path], attr, factors)
            for path in {self.owner[n][0] for n in self.clipping.groups[group]}:
                kept[path].open_groups -= 1
                if kept[path].open_groups == 0:
                    del kept[path]  # free the activation / output gradient / per-sample gradients
                    held.discard(path)

        def on_backward(path: str, module: nn.Module, ds: torch.Tensor) -> None:
            k = kept[path]
            k.ds = ds.detach()
            held.add(path)
            self.peak_held = max(self.peak_held, len(held))
            for attr, sq in self._square_norms(module, k, self.trainable[path]).items():
                name = f"{path}.{attr}" if path else attr
                group = self.group_of[name]
                norms[group] += sq
                pending[group] -= 1
                if pending[group] == 0:
                    close(group)

        def forward_hook(path: str):
            def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
                if path in kept:
                    raise RunFailure(f"train.engine: layer {path!r} runs more than once per forward pass; "
                                     "book-keeping needs each layer once (use train.engine=func)")
                kept[path] = _Kept(a=inputs[0].detach(), open_groups=len(self.layer_groups[path]))
                output.register_hook(lambda g: on_backward(path, module, g))
            return hook

        handles = [m.register_forward_hook(forward_hook(p)) for p, m in self.layers.items()]
        try:
            head = self.split.head
            params = {n: p.detach() for n, p in head.named_parameters()}
            buffers = dict(head.named_buffers())
            with torch.no_grad():
                features = self.split.front(x.detach())
            features = features.detach().requires_grad_(True)  # never the caller's tensor
            logits = functional_call(head, (params, buffers), (features,))
            loss = F.cross_entropy(logits, y, reduction="sum")
            torch.autograd.grad(loss, features)
        finally:
            for h in handles:
                h.remove()
        if any(pending):
            unseen = [n for m, g in enumerate(self.clipping.groups) if pending[m] for n in g]
            raise RunFailure(f"train.engine: no gradient reached {unseen} (is the layer unused?)")
        return {n: sums[n] for n in self.clipping.names}

    # -- per-layer kernels -------------------------------------------------------------------------------
    def _square_norms(self, module: nn.Module, k: _Kept, trainable: set[str]) -> dict[str, torch.Tensor]:
        """Per-sample squared gradient norms of the layer's trainable parameters: {attr: Tensor[b]}.

        Keeps in ``k`` what the clipped sums will need: instantiated per-sample gradients (norm layers,
        biases, weights whose per-sample gradient is the smaller object) or the activation and output
        gradient (ghost-norm weights); the rest is dropped here."""
        out: dict[str, torch.Tensor] = {}
        if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
            k.per_sample = {n: g for n, g in _norm_layer_grads(module, k.a, k.ds).items() if n in trainable}
        else:
            if "bias" in trainable:  # per-sample bias gradients are small: always instantiated
                k.per_sample["bias"] = k.ds.flatten(2).sum(2) if isinstance(module, nn.Conv2d) else \
                    k.ds.reshape(k.ds.shape[0], -1, k.ds.shape[-1]).sum(1)
            if "weight" in trainable:
                out["weight"] = self._weight_square_norms(module, k)
        out.update({n: g.flatten(1).pow(2).sum(1) for n, g in k.per_sample.items() if n not in out})
        if set(k.per_sample) == trainable:
            k.a = k.ds = None  # everything the close needs is instantiated
        return out

    def _weight_square_norms(self, module: nn.Module, k: _Kept) -> torch.Tensor:
        """‖∂L_i/∂W‖² of a Linear / Conv2d, by ghost norm or by instantiation (then kept in ``k``).

        The rule is FastDP's: ghost norm when the T×T Gram matrices are smaller than the per-sample
        gradient (2T² ≤ p·d; T tokens or output pixels, d inputs, p outputs), else instantiate."""
        b, w = k.a.shape[0], module.weight
        if isinstance(module, nn.Conv2d):
            t, d, p = k.ds[0, 0].numel(), w[0].numel(), w.shape[0]
        else:
            t, d, p = k.a[0].numel() // w.shape[1], w.shape[1], w.shape[0]
        if t == 1:  # one token: ‖a_i ds_iᵀ‖ = ‖a_i‖·‖ds_i‖
            a, ds = _as_tokens(module, k.a, k.ds)
            return a.pow(2).sum((1, 2)) * ds.pow(2).sum((1, 2))
        step = self._chunk(module, k.a)
        if 2 * t * t <= p * d:  # ghost norm ⟨a_i a_iᵀ, ds_i ds_iᵀ⟩, in chunks of samples
            squares = []
            for lo in range(0, b, step):
                a, ds = _as_tokens(module, k.a[lo:lo + step], k.ds[lo:lo + step])  # [c, T, d], [c, T, p]
                squares.append((a @ a.transpose(1, 2)).mul_(ds @ ds.transpose(1, 2)).sum((1, 2)))
            return torch.cat(squares)
        if isinstance(module, nn.Conv2d):  # per-sample gradients by grouped convolutions, one group per sample
            g = torch.cat([_conv_per_sample_grads(module, k.a[lo:lo + step], k.ds[lo:lo + step])
                           for lo in range(0, b, step)])
        else:
            a, ds = _as_tokens(module, k.a, k.ds)
            g = ds.transpose(1, 2) @ a
        if w.numel() <= k.a[0].numel() + k.ds[0].numel():
            k.per_sample["weight"] = g.view(b, *w.shape)  # smaller than what it replaces: keep it for the sum
        return g.view(b, -1).pow(2).sum(1)

    @staticmethod
    def _chunk(module: nn.Module, a: torch.Tensor) -> int:
        """Samples per chunk, so a conv's transient workspace (unfolded input, k²× the activation) stays
        within ``WORKSPACE_BUDGET`` elements whatever the micro-batch size."""
        if not isinstance(module, nn.Conv2d):
            return a.shape[0]
        kh, kw = module.kernel_size
        return max(1, WORKSPACE_BUDGET // (a[0].numel() * kh * kw))

    def _clipped_sum(self, module: nn.Module, k: _Kept, attr: str, c: torch.Tensor) -> torch.Tensor:
        """Σ_i c_i·g_i for parameter ``attr`` of ``module`` from what the layer kept."""
        if attr in k.per_sample:
            return torch.einsum("b,b...->...", c, k.per_sample[attr])
        ds = k.ds * c.view(-1, *([1] * (k.ds.dim() - 1)))  # only weights of Linear / Conv2d get here
        if isinstance(module, nn.Conv2d):
            return torch.nn.grad.conv2d_weight(k.a, module.weight.shape, ds, module.stride, module.padding,
                                               module.dilation, module.groups)
        return ds.reshape(-1, ds.shape[-1]).t() @ k.a.reshape(-1, k.a.shape[-1])


def _as_tokens(module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear / Conv2d as a per-sample product s_i = a_i·Wᵀ over T tokens: a [b, T, d], ds [b, T, p]."""
    b = a.shape[0]
    if isinstance(module, nn.Conv2d):
        cols = F.unfold(a, module.kernel_size, module.dilation, module.padding, module.stride)  # [b, d, T]
        return cols.transpose(1, 2), ds.reshape(b, ds.shape[1], -1).transpose(1, 2)
    return a.reshape(b, -1, a.shape[-1]), ds.reshape(b, -1, ds.shape[-1])


def _conv_per_sample_grads(module: nn.Conv2d, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
    """[b, *weight.shape]: a batch of b samples as one convolution with b groups (no unfold needed)."""
    b, w = a.shape[0], module.weight
    g = torch.nn.grad.conv2d_weight(a.reshape(1, -1, *a.shape[2:]), (b * w.shape[0], *w.shape[1:]),
                                    ds.reshape(1, -1, *ds.shape[2:]), module.stride, module.padding,
                                    module.dilation, b)
    return g.view(b, *w.shape)


def _norm_layer_grads(module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample gradients of a GroupNorm / LayerNorm's affine weight and bias: {attr: Tensor[b, *shape]}."""
    if isinstance(module, nn.GroupNorm):
        x_hat = F.group_norm(a, module.num_groups, eps=module.eps)
        dims = tuple(range(2, a.dim()))  # [b, C, *spatial] -> [b, C]
        return {"weight": (x_hat * ds).sum(dims), "bias": ds.sum(dims)}
    x_hat = F.layer_norm(a, module.normalized_shape, eps=module.eps)
    dims = tuple(range(1, a.dim() - len(module.normalized_shape)))  # [b, *, *normalized] -> [b, *normalized]
    return {"weight": (x_hat * ds).sum(dims), "bias": ds.sum(dims)}


def check_lean(defense_cls: type[Defense], model: nn.Module) -> None:
    """ConfigError unless ``lean`` can serve: the defense's per-sample transform is group-wise clipping
    (it implements ``Defense.clipping``) and every trainable parameter sits in a supported layer."""
    if defense_cls.clipping is Defense.clipping:
        raise ConfigError(f"train.engine: lean needs a defense whose per-sample transform is group-wise "
                          f"clipping (dpsgd, groupwise); {defense_cls.__name__} needs materialised "
                          f"per-sample gradients: use auto or func")
    trainable_layers(model)


def select_engine(name: str, model: nn.Module, defense: Defense) -> str:
    """Resolve ``train.engine``: ``lean`` (book-keeping) where ``check_lean`` passes, ``auto`` falls back to
    ``func`` where it does not, ``func`` always works."""
    if name == "func":
        return "func"
    try:
        check_lean(type(defense), model)
    except ConfigError:
        if name == "lean":
            raise
        return "func"
    return "lean"
