"""The lean per-sample engine (``train.engine: lean``): memory-lean per-sample clipping by book-keeping (Bu et al.;
FastDP's "BK" / mixed ghost norm), for every defense that declares its per-sample statistics
(``Defense.lean_plan``; the plans are described in ``defenses/lean_plan.py``).

One forward and one backward pass per micro-batch, no per-sample gradient of the whole model ever exists:

1. A forward hook on every trainable layer keeps its input activation ``a``; a hook on the layer's output
   tensor receives the per-sample output gradient ``ds`` (the loss is a *sum* over samples, so row i of
   ``ds`` is ∂L_i/∂s_i).
2. In that hook the layer's per-sample statistics are computed and added to its group's: plain squared
   norms by the ghost norm (‖g_i‖² = ⟨a_i a_iᵀ, ds_i ds_iᵀ⟩, no per-sample gradient) where that needs
   less memory, else by instantiating the layer's per-sample gradient (for a conv: one grouped
   convolution, one group per sample, on the CPU; one batched product with the unfolded input on CUDA;
   in chunks of samples, small on the CPU, large on a GPU: ``workspace_budget``); masked or whitened norms
   ‖(g_i − shift) ⊙ scale‖² and linear probes (GEP's V^T g_i) from the instantiated per-sample gradient,
   chunk by chunk (a one-token Linear under a mask needs none: (ds_i²)ᵀ m² (a_i²)).
3. When the last layer of a group has been seen (backprop runs output → input, so a group closes at its
   earliest layer), the defense turns the group's statistics into per-sample factors c_i and each
   member's sum Σ_i c_i·g_i is computed from what the layer kept (a weighted weight-gradient product, or
   the instantiated per-sample gradient); then the kept tensors are freed. Finer groups close sooner, so
   they hold less at the peak. The defense finishes the release from these sums (masking, un-whitening,
   projecting), exactly as its materialised path would.

Parameters are passed to the forward pass detached, so autograd computes no parameter gradients at all
(the engine forms the only weight-gradient products needed). The model's fixed front (``Normalize``, a fixed
scattering transform, a parameter-free norm: ``dpeval.core.per_sample.fixed_front``) runs without autograd;
its output requires grad and drives backprop, which so stops at the first trainable layer's input.

Supported layers are the entries of the kernel table ``KERNELS`` (one ``LayerKernel`` per layer type) and their
subclasses that keep the parent's ``forward`` (``kernel_for``). A layer type joins it with
``@register_kernel(LayerType)`` on a ``LayerKernel`` subclass, from this module or from outside the package (a model
plug-in registers its own layers where it defines them; docs/architecture.md, "Per-sample kernels for your own
layers"). Built in: Linear over any number T of tokens (input [b, *, d]: the attention
projections and MLPs of a transformer), Conv2d (any stride / padding / dilation, groups = 1, zero padding),
Embedding (plain lookups: no padding_idx, max_norm, scale_grad_by_freq or sparse gradients; its per-sample
gradient is the scatter-add of the output-gradient rows into the looked-up rows), GroupNorm and LayerNorm
(affine parameters; per-sample gradients instantiated, they are small). A layer whose output does not depend
on the input features (an Embedding of token ids or of positions) is joined to backprop by adding a zero
"anchor" scalar to its output, so its output-gradient hook still fires; the values are unchanged. A model with any other
trainable parameter (its layer classes counted in the message) or a layer used twice in one forward is refused —
nothing is ever dropped silently. Like the torch.func path, it assumes samples do not interact in the forward pass
(BatchNorm is refused; dropout in train mode draws its mask per element, so per example).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.per_sample import fixed_front
from dpeval.defenses.base import Defense
from dpeval.defenses.clipping import row_squares
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan

WORKSPACE_BUDGET = 1 << 21  # CPU: elements (8 MiB in float32) of transient workspace per chunk of samples
CUDA_WORKSPACE_SHARE = 1 / 64  # a CUDA device: the share of its memory one chunk's workspace may take


@functools.cache
def _cuda_memory(index: int) -> int:
    return torch.cuda.get_device_properties(index).total_memory


def workspace_budget(device: torch.device) -> int:
    """Elements of transient workspace one chunk of samples may take: 8 MiB on the CPU, where chunks of cache
    size suit mkldnn's convolutions; ``CUDA_WORKSPACE_SHARE`` of a CUDA device's memory (2.2 GB on a 140 GB
    card), because there each chunk costs several kernel launches: 8 MiB chunks cut a DP-CNN's 512-sample
    micro-batch into 166 of them, and lean DP-SGD measured 13.6x non-private SGD's step on an H200 with them
    (docs/performance.md)."""
    if device.type == "cuda":
        return int(_cuda_memory(device.index if device.index is not None else torch.cuda.current_device())
                   * CUDA_WORKSPACE_SHARE) // 4
    return WORKSPACE_BUDGET


class LayerKernel:
    """What the engine knows about one type of layer (one entry of ``KERNELS``, FastDP's layer table).

    A *weight layer* (Linear, Conv2d) is a per-sample product s_i = a_i·Wᵀ over T tokens: its weight's
    statistics come by ghost norm or instantiation, its weighted sum from one weight-gradient product; its
    bias is always instantiated. A *small layer* (GroupNorm, LayerNorm) instantiates every per-sample
    gradient (they are small)."""

    weight_layer = True

    def supports(self, module: nn.Module) -> bool:
        return True

    def small_grads(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample gradients always instantiated: {attr: [b, *shape]} (a weight layer's bias)."""
        return {"bias": self.tokens(module, a, ds)[1].sum(1)}

    def tokens(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer as a per-sample product over T tokens: a [b, T, d], ds [b, T, p]."""
        raise NotImplementedError

    def weight_grads(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """Per-sample weight gradients [b, *weight.shape] (of a chunk of samples)."""
        a, ds = self.tokens(module, a, ds)
        return ds.transpose(1, 2) @ a

    def weight_sum(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """Σ_i ∂L_i/∂W for output gradients ``ds`` already weighted by the samples' factors."""
        return ds.reshape(-1, ds.shape[-1]).t() @ a.reshape(-1, a.shape[-1])

    def workspace(self, module: nn.Module, a: torch.Tensor) -> int:
        """Elements of transient workspace per sample (beyond the kept tensors), 0 if none."""
        return 0

    def token_count(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> int:
        """T: the tokens (or output pixels) of one sample, for the ghost-norm rule."""
        return self.tokens(module, a[:1], ds[:1])[0].shape[1]

    def grams(self, module: nn.Module, a: torch.Tensor, ds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-sample T×T Gram matrices (of the inputs and of the output gradients) whose inner product is
        ‖∂L_i/∂W‖² (the ghost norm)."""
        a, ds = self.tokens(module, a, ds)  # [c, T, d], [c, T, p]
        return a @ a.transpose(1, 2), ds @ ds.transpose(1, 2)


K = TypeVar("K", bound=LayerKernel)
KERNELS: dict[type[nn.Module], LayerKernel] = {}
BUILT_IN = "Linear, Conv2d with groups=1 and zero padding, Embedding without padding_idx / max_norm / " \
           "scale_grad_by_freq / sparse, GroupNorm, LayerNorm"


def register_kernel(layer: type[nn.Module]) -> Callable[[type[K]], type[K]]:
    """Class decorator: the lean engine computes the per-sample statistics and sums of layers of type ``layer``
    (and of its subclasses that keep its ``forward``: ``kernel_for``) with an instance of the decorated
    ``LayerKernel`` subclass. A weight layer (``weight_layer = True``)
    implements ``tokens`` (and, where it pays, ``weight_grads`` / ``weight_sum`` / ``grams``); a small layer
    (``weight_layer = False``) implements ``small_grads``; ``supports`` may refuse some configurations of the
    type. A type registered twice is refused (ValueError): a kernel is never replaced silently."""
    if not (isinstance(layer, type) and issubclass(layer, nn.Module)):
        raise TypeError(f"register_kernel: expects an nn.Module subclass, got {layer!r}")

    def register(kernel: type[K]) -> type[K]:
        if not (isinstance(kernel, type) and issubclass(kernel, LayerKernel)):
            raise TypeError(f"register_kernel({layer.__name__}): decorates a LayerKernel subclass, got {kernel!r}")
        if layer in KERNELS:
            raise ValueError(f"register_kernel: {layer.__module__}.{layer.__qualname__} already has a kernel "
                             f"({type(KERNELS[layer]).__name__})")
        KERNELS[layer] = kernel()
        return kernel

    return register


@register_kernel(nn.Linear)
class LinearKernel(LayerKernel):
    def token_count(self, module, a, ds):
        return a[0].numel() // a.shape[-1]

    def tokens(self, module, a, ds):
        b = a.shape[0]
        return a.reshape(b, -1, a.shape[-1]), ds.reshape(b, -1, ds.shape[-1])


@register_kernel(nn.Conv2d)
class Conv2dKernel(LayerKernel):
    def supports(self, module):
        return module.groups == 1 and module.padding_mode == "zeros" and not isinstance(module.padding, str)

    def small_grads(self, module, a, ds):
        return {"bias": ds.flatten(2).sum(2)}

    def tokens(self, module, a, ds):
        b = a.shape[0]
        cols = F.unfold(a, module.kernel_size, module.dilation, module.padding, module.stride)  # [b, d, T]
        return cols.transpose(1, 2), ds.reshape(b, ds.shape[1], -1).transpose(1, 2)

    def weight_grads(self, module, a, ds):
        if a.is_cuda:  # cuDNN's grouped convolution is slow with a group per sample; one batched product is not
            return self.weight_grads_by_matmul(module, a, ds)
        return self.weight_grads_by_grouped_conv(module, a, ds)

    def weight_grads_by_matmul(self, module, a, ds):
        """g_i = ds_i^T · unfold(a_i): [p, T] × [T, d], one batched matrix product over the chunk."""
        cols, d = self.tokens(module, a, ds)  # [b, T, d], [b, T, p]
        return torch.bmm(d.transpose(1, 2), cols).view(a.shape[0], *module.weight.shape)

    def weight_grads_by_grouped_conv(self, module, a, ds):
        """b samples as one convolution with b groups (no unfold needed; mkldnn's fast path on the CPU)."""
        b, w = a.shape[0], module.weight
        g = torch.nn.grad.conv2d_weight(a.reshape(1, -1, *a.shape[2:]), (b * w.shape[0], *w.shape[1:]),
                                        ds.reshape(1, -1, *ds.shape[2:]), module.stride, module.padding,
                                        module.dilation, b)
        return g.view(b, *w.shape)

    def weight_sum(self, module, a, ds):
        return torch.nn.grad.conv2d_weight(a, module.weight.shape, ds, module.stride, module.padding,
                                           module.dilation, module.groups)

    def token_count(self, module, a, ds):
        return ds[0, 0].numel()  # output pixels, without unfolding a sample

    def workspace(self, module, a):
        kh, kw = module.kernel_size
        return a[0].numel() * kh * kw  # the unfolded input


@register_kernel(nn.Embedding)
class EmbeddingKernel(LayerKernel):
    """A lookup s_i[t] = W[idx_i[t]]: the weight layer of one-hot inputs, without forming them. Its per-sample
    gradient scatter-adds ds_i's rows into the looked-up rows; the ghost norm's input Gram matrix is
    [idx_i[t] == idx_i[t']] (exact: rows of repeated tokens add up)."""

    def supports(self, module):
        return (module.padding_idx is None and module.max_norm is None and not module.scale_grad_by_freq
                and not module.sparse)

    def small_grads(self, module, a, ds):
        return {}  # no bias

    def token_count(self, module, a, ds):
        return a[0].numel()

    def grams(self, module, a, ds):
        idx, ds = a.reshape(a.shape[0], -1), ds.reshape(a.shape[0], -1, ds.shape[-1])
        return (idx[:, :, None] == idx[:, None, :]).to(ds.dtype), ds @ ds.transpose(1, 2)

    def weight_grads(self, module, a, ds):
        b, d = a.shape[0], ds.shape[-1]
        idx, ds = a.reshape(b, -1, 1).expand(-1, -1, d), ds.reshape(b, -1, d)
        return ds.new_zeros(b, *module.weight.shape).scatter_add_(1, idx, ds)

    def weight_sum(self, module, a, ds):
        d = ds.shape[-1]
        return ds.new_zeros(module.weight.shape).index_add_(0, a.reshape(-1), ds.reshape(-1, d))


@register_kernel(nn.GroupNorm)
class GroupNormKernel(LayerKernel):
    weight_layer = False

    def small_grads(self, module, a, ds):
        x_hat = F.group_norm(a, module.num_groups, eps=module.eps)
        dims = tuple(range(2, a.dim()))  # [b, C, *spatial] -> [b, C]
        return {"weight": _sum_over(x_hat * ds, dims), "bias": _sum_over(ds, dims)}


@register_kernel(nn.LayerNorm)
class LayerNormKernel(LayerKernel):
    weight_layer = False

    def small_grads(self, module, a, ds):
        x_hat = F.layer_norm(a, module.normalized_shape, eps=module.eps)
        dims = tuple(range(1, a.dim() - len(module.normalized_shape)))  # [b, *, *normalized] -> [b, *normalized]
        return {"weight": _sum_over(x_hat * ds, dims), "bias": _sum_over(ds, dims)}


def _sum_over(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``t`` summed over ``dims``; none (a norm layer's input [b, features], no token or pixel dimension) leaves it
    as it is — ``sum(())`` would sum over every dimension, the samples' too."""
    return t.sum(dims) if dims else t


def ghost_norm_pays(tokens: int, weight_numel: int) -> bool:
    """FastDP's rule for a weight layer's per-sample norm: the ghost norm (two T×T Gram matrices per sample)
    when 2T² < p·d (the weight's size), else instantiate the per-sample gradient [p, d]."""
    return 2 * tokens * tokens < weight_numel


def kernel_for(layer: type[nn.Module]) -> tuple[LayerKernel | None, type[nn.Module] | None]:
    """(kernel, the class it is registered for) of layers of type ``layer``: its own kernel, else its nearest
    ancestor's in the table — a user's ``class MyLinear(nn.Linear)`` computes what ``nn.Linear`` computes — but only
    when no class from ``layer`` up to that ancestor overrides ``forward``: a subclass with a forward of its own may
    use its parameters otherwise (timm's ``LayerNorm2d`` normalises over channels first), and the ancestor's kernel
    would then compute wrong per-sample gradients silently. Such a subclass gets (None, ancestor): it needs a kernel
    of its own. (None, None): no ancestor has a kernel."""
    classes = layer.__mro__
    for depth, cls in enumerate(classes):
        if cls in KERNELS:
            overridden = any("forward" in vars(c) for c in classes[:depth])
            return (None if overridden else KERNELS[cls]), cls
    return None, None


def kernel_of(module: nn.Module) -> LayerKernel | None:
    """The table's kernel for ``module`` (``kernel_for`` its type), None when the engine does not know the layer or
    the kernel does not support its configuration."""
    kernel = kernel_for(type(module))[0]
    return kernel if kernel is not None and kernel.supports(module) else None


def refused_label(module: nn.Module) -> str:
    """How the refusal names a layer without a kernel: its class, what about it is refused where that is known; a
    parameter owned by a module that also holds other modules (a class token on the model) is a bare one."""
    name = type(module).__name__
    kernel, ancestor = kernel_for(type(module))
    if kernel is not None:
        return f"{name} (this configuration)"
    if ancestor is not None:
        return f"{name} (overrides {ancestor.__name__}.forward)"
    if next(module.children(), None) is not None and not type(module).__module__.startswith("torch."):
        return f"Parameter (bare, in {name})"  # a torch layer with children (MultiheadAttention) is named as such
    return name


def trainable_layers(model: nn.Module, field: str = "train.engine", instead: str = "train.engine=func",
                     ) -> dict[str, nn.Module]:
    """Modules owning trainable parameters, by module path; ConfigError counting the unsupported ones by class
    (a model can hold hundreds of parameters of a few layer classes: the message stays one line), naming ``field``
    and the setting to use ``instead``."""
    layers: dict[str, nn.Module] = {}
    refused: dict[str, list[str]] = {}
    for path, module in model.named_modules():
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if kernel_of(module) is None:
            label = refused_label(module)
            prefix = f"{path}." if path else ""
            refused.setdefault(label, []).extend([prefix + n for n in own] if label.startswith("Parameter")
                                                 else [path or "the model"])
            continue
        layers[path] = module
    if refused:
        counted = ", ".join(f"{label} ×{len(where)} at {where[0]}{', …' if len(where) > 1 else ''}"
                            for label, where in refused.items())
        registered = [t.__name__ for t in KERNELS if not t.__module__.startswith("torch.")]  # beyond the built-ins
        more = f"; registered: {', '.join(registered)}" if registered else ""
        raise ConfigError(
            f"{field}: the lean engine has no per-sample kernel for {counted} (it knows {BUILT_IN}{more}, and "
            f"their subclasses that keep forward); register one with dpeval.engine.lean.register_kernel "
            f"(docs/architecture.md), or use {instead} for this model")
    return layers


@dataclass
class _Kept:
    """What one layer holds between its backward hook and the close of its group(s)."""

    a: torch.Tensor | None = None                                       # input activation
    ds: torch.Tensor | None = None                                      # per-sample output gradient
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)   # instantiated per-sample grads
    open_groups: int = 0


class LeanEngine:
    """``engine(x, y, plan) -> LeanBatch``: the factor-weighted gradient sums of one micro-batch (and the
    plan's probes), computed during one backward pass (see the module docstring and ``defenses/lean_plan.py``).

    Parameter names are those of ``model.named_parameters()``.
    """

    def __init__(self, model: nn.Module, features: bool = False) -> None:
        """``features=True``: callers pass ``front_features`` of their inputs, not raw inputs."""
        self.model = model
        self.layers = trainable_layers(model)
        owner = {}
        for path, module in self.layers.items():
            prefix = f"{path}." if path else ""
            for n, p in module.named_parameters(recurse=False):
                if p.requires_grad:
                    owner[prefix + n] = (path, n)
        self.owner = owner  # full name -> (layer path, attribute)
        self.trainable = {path: {a for p, a in owner.values() if p == path} for path in self.layers}
        self.peak_held = 0  # most layers holding backprop data at once (a memory proxy, for tests)
        self.split = fixed_front(model).applied() if features else fixed_front(model)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, plan: LeanPlan) -> LeanBatch:
        if set(self.owner) != set(plan.names):
            raise ValueError(f"groups and trainable parameters differ: {sorted(set(self.owner) ^ set(plan.names))}")
        if not plan.per_sample:
            return self._plain_sum(x, y, plan)
        b = x.shape[0]
        group_of = {n: m for m, g in enumerate(plan.groups) for n in g}
        layer_groups = {path: {group_of[n] for n, (p, _) in self.owner.items() if p == path} for path in self.layers}
        kept: dict[str, _Kept] = {}
        # each group's per-parameter statistics, summed in float64 once when it closes (two operators, not one per
        # parameter; GEP's residual ‖g‖² − ‖θ‖² must not lose digits)
        stats: list[list[torch.Tensor]] = [[] for _ in plan.groups]
        probes = torch.zeros(b, plan.probe_dim, device=x.device) if plan.probes else None
        factors: list[torch.Tensor | None] = [None] * len(plan.groups)
        pending = [len(g) for g in plan.groups]  # parameters not yet seen in backprop
        sums: dict[str, torch.Tensor] = {}
        held: set[str] = set()  # layers seen in backprop whose groups are still open

        def close(group: int) -> None:
            parts = stats[group]  # float32, and float64 where a statistic needed it (stack promotes them exactly)
            # one parameter: its statistic in float64 (the same number as a one-row sum, one operator fewer)
            total = parts[0].double() if len(parts) == 1 else torch.stack(parts).sum(0, dtype=torch.float64)
            c = factors[group] = plan.factors(group, total, probes).to(x.dtype)
            for name in plan.groups[group] if plan.sums else ():
                path, attr = self.owner[name]
                sums[name] = self._weighted_sum(self.layers[path], kept[path], attr, c)
            for path in {self.owner[n][0] for n in plan.groups[group]}:
                kept[path].open_groups -= 1
                if kept[path].open_groups == 0:
                    del kept[path]  # free the activation / output gradient / per-sample gradients
                    held.discard(path)

        def on_backward(path: str, module: nn.Module, ds: torch.Tensor) -> None:
            k = kept[path]
            k.ds = ds.detach()
            held.add(path)
            self.peak_held = max(self.peak_held, len(held))
            prefix = f"{path}." if path else ""
            for attr, sq in self._statistics(module, k, self.trainable[path], prefix, plan, probes).items():
                group = group_of[prefix + attr]
                stats[group].append(sq)
                pending[group] -= 1
                if pending[group] == 0:
                    close(group)

        # joins outputs that do not depend on the features (lookups of token ids or positions) to backprop
        anchor = torch.zeros((), device=x.device, requires_grad=True)

        def forward_hook(path: str):
            def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
                if path in kept:
                    raise RunFailure(f"train.engine: layer {path!r} runs more than once per forward pass; "
                                     "the lean engine needs each layer once (use train.engine=func)")
                kept[path] = _Kept(a=inputs[0].detach(), open_groups=len(layer_groups[path]))
                if not output.requires_grad:
                    output = output + anchor
                output.register_hook(lambda g: on_backward(path, module, g))
                return output
            return hook

        handles = [m.register_forward_hook(forward_hook(p)) for p, m in self.layers.items()]
        try:
            head = self.split.head
            params = {n: p.detach() for n, p in head.named_parameters()}
            buffers = dict(head.named_buffers())
            with torch.no_grad():
                features = self.split.front(x.detach())
            features = features.detach()  # never the caller's tensor
            roots = [anchor]
            if features.is_floating_point():
                roots.append(features.requires_grad_(True))
            logits = functional_call(head, (params, buffers), (features,))
            loss = F.cross_entropy(logits, y, reduction="sum")
            torch.autograd.grad(loss, roots, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        if any(pending):
            unseen = [n for m, g in enumerate(plan.groups) if pending[m] for n in g]
            raise RunFailure(f"train.engine: no gradient reached {unseen} (is the layer unused?)")
        return LeanBatch({n: sums[n] for n in plan.names if n in sums}, factors, probes, b, loss.detach())

    def _plain_sum(self, x: torch.Tensor, y: torch.Tensor, plan: LeanPlan) -> LeanBatch:
        """No per-sample statistic: Σ_i g_i is the gradient of the summed loss (plain autograd)."""
        names = plan.names
        params = dict(self.model.named_parameters())
        loss = F.cross_entropy(self.split.head(self.split.front(x)), y, reduction="sum")
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        ones = torch.ones(x.shape[0], device=x.device)
        return LeanBatch(dict(zip(names, grads)), [ones] * len(plan.groups), None, x.shape[0], loss.detach())

    # -- per-layer work, through the kernel table ------------------------------------------------------
    def _statistics(self, module: nn.Module, k: _Kept, trainable: set[str], prefix: str, plan: LeanPlan,
                    probes: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Per-sample statistics ‖(g_i − shift) ⊙ scale‖² of the layer's trainable parameters, {attr: [b]},
        and their probe contributions (added to ``probes``).

        Keeps in ``k`` what the weighted sums will need: instantiated per-sample gradients (small layers,
        biases, weights whose per-sample gradient is the smaller object) or the activation and output
        gradient; the rest is dropped here."""
        kernel = self._kernel(module)
        out: dict[str, torch.Tensor] = {}
        k.per_sample = {n: g for n, g in kernel.small_grads(module, k.a, k.ds).items() if n in trainable}
        if kernel.weight_layer and "weight" in trainable:
            name = prefix + "weight"
            if plan.transformed(name):
                out["weight"] = self._transformed_weight(kernel, module, k, name, plan, probes)
            else:
                out["weight"] = self._weight_square_norms(kernel, module, k)
        for attr, g in k.per_sample.items():
            if attr not in out:
                out[attr] = _statistic(g, prefix + attr, plan, probes)
        if set(k.per_sample) == trainable:
            k.a = k.ds = None  # everything the close needs is instantiated
        return out

    def _transformed_weight(self, kernel: LayerKernel, module: nn.Module, k: _Kept, name: str, plan: LeanPlan,
                            probes: torch.Tensor | None) -> torch.Tensor:
        """The statistic of a weight under a shift, scale or probes: from the instantiated per-sample
        gradient, chunk by chunk (kept when smaller than what it replaces) — except a one-token Linear without
        probes, whose statistic has a closed form (``_one_token_linear``)."""
        w = module.weight
        if isinstance(kernel, LinearKernel) and k.a[0].numel() == w.shape[1] and name not in plan.probes:
            return _one_token_linear(k.a, k.ds, plan.shift.get(name), plan.scale.get(name))
        b = k.a.shape[0]
        keep = w.numel() <= k.a[0].numel() + k.ds[0].numel()
        parts, stats = [], []
        step = self._chunk(kernel, module, k.a, w)
        for lo in range(0, b, step):
            g = kernel.weight_grads(module, k.a[lo:lo + step], k.ds[lo:lo + step])
            stats.append(_statistic(g, name, plan, None if probes is None else probes[lo:lo + step]))
            if keep:
                parts.append(g)
        if keep:
            k.per_sample["weight"] = _join(parts)
        return _join(stats)

    def _weight_square_norms(self, kernel: LayerKernel, module: nn.Module, k: _Kept) -> torch.Tensor:
        """‖∂L_i/∂W‖² of a weight layer, by ghost norm or by instantiation (then kept in ``k``).

        The rule is FastDP's (``ghost_norm_pays``): ghost norm when the two T×T Gram matrices are smaller than
        the per-sample gradient (2T² < p·d; T tokens or output pixels, d inputs, p outputs), else
        instantiate."""
        b, w = k.a.shape[0], module.weight
        step = self._chunk(kernel, module, k.a)
        t = kernel.token_count(module, k.a, k.ds)
        if t == 1 and isinstance(kernel, LinearKernel):  # one token: ‖a_i ds_iᵀ‖ = ‖a_i‖·‖ds_i‖
            a, ds = kernel.tokens(module, k.a, k.ds)
            return row_squares(a) * row_squares(ds)
        if ghost_norm_pays(t, w.numel()):  # ghost norm ⟨a_i a_iᵀ, ds_i ds_iᵀ⟩, in chunks of samples
            squares = []
            for lo in range(0, b, step):
                ga, gs = kernel.grams(module, k.a[lo:lo + step], k.ds[lo:lo + step])  # [c, T, T] each
                squares.append(ga.mul_(gs).sum((1, 2)))  # a reduction: as precise as row_squares
            return _join(squares)
        step = self._chunk(kernel, module, k.a, w)
        g = _join([kernel.weight_grads(module, k.a[lo:lo + step], k.ds[lo:lo + step])
                   for lo in range(0, b, step)])
        if w.numel() <= k.a[0].numel() + k.ds[0].numel():
            k.per_sample["weight"] = g  # smaller than what it replaces: keep it for the sum
        return row_squares(g)

    @staticmethod
    def _chunk(kernel: LayerKernel, module: nn.Module, a: torch.Tensor, weight: torch.Tensor | None = None) -> int:
        """Samples per chunk, so a transient workspace stays within ``workspace_budget`` elements whatever
        the micro-batch size: the kernel's own (a conv's unfolded input, k²× the activation) and, when
        instantiating per-sample weight gradients (``weight``), the chunk of those."""
        per_sample = kernel.workspace(module, a)
        if weight is not None:
            per_sample = max(per_sample, weight.numel())
        return max(1, workspace_budget(a.device) // per_sample) if per_sample else a.shape[0]

    def _weighted_sum(self, module: nn.Module, k: _Kept, attr: str, c: torch.Tensor) -> torch.Tensor:
        """Σ_i c_i·g_i for parameter ``attr`` of ``module`` from what the layer kept."""
        if attr in k.per_sample:
            return torch.einsum("b,b...->...", c, k.per_sample[attr])
        ds = k.ds * c.view(-1, *([1] * (k.ds.dim() - 1)))  # only weights of weight layers get here
        return self._kernel(module).weight_sum(module, k.a, ds)

    @staticmethod
    def _kernel(module: nn.Module) -> LayerKernel:
        kernel = kernel_of(module)
        assert kernel is not None, module  # trainable_layers refused the model otherwise
        return kernel


def _statistic(g: torch.Tensor, name: str, plan: LeanPlan, probes: torch.Tensor | None) -> torch.Tensor:
    """‖(g_i − shift) ⊙ scale‖² per sample of instantiated per-sample gradients g [b, *shape], and the
    plan's probes of ``name`` added into ``probes`` [b, k] (rows of the same samples)."""
    flat = g.reshape(g.shape[0], -1)
    for lo, hi, col, v in plan.probes.get(name, ()):
        probes[:, col:col + v.shape[1]] += flat[:, lo:hi] @ v
    shift, scale = plan.shift.get(name), plan.scale.get(name)
    if shift is None and scale is None:
        # summed in float64 where probes make a residual of it (GEP), else one fused dot per row
        return flat.pow(2).sum(1, dtype=torch.float64) if plan.probes else row_squares(flat)
    w = torch.sub(g, shift) if shift is not None else g * scale  # one fresh buffer, transformed in place
    if shift is not None and scale is not None:
        w.mul_(scale)
    w = w.reshape(g.shape[0], -1)
    return row_squares(w)


def _join(parts: list[torch.Tensor]) -> torch.Tensor:
    """The chunks of samples as one tensor (no copy when there is one chunk, as on a GPU)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _one_token_linear(a: torch.Tensor, ds: torch.Tensor, shift: torch.Tensor | None,
                      scale: torch.Tensor | None) -> torch.Tensor:
    """‖(ds_i a_iᵀ − m) ⊙ s‖² per sample of a one-token Linear, without instantiating ds_i a_iᵀ:
    Σ s²·ds²·a² − 2·ds_iᵀ (s²⊙m) a_i + ‖s⊙m‖² (expanded in float64, where the cancellation is harmless)."""
    a, ds = a.double(), ds.double()
    if scale is None:
        square = torch.ones(ds.shape[1], a.shape[1], dtype=ds.dtype, device=ds.device)
    else:
        square = scale.double().pow(2)
    total = ((ds.pow(2) @ square) * a.pow(2)).sum(1)
    if shift is not None:
        shift = shift.double()
        weighted = square * shift
        total = total - 2 * ((ds @ weighted) * a).sum(1) + (weighted * shift).sum()
    return total


def check_lean(defense_cls: type[Defense], model: nn.Module, precision: str = "fp32") -> None:
    """ConfigError unless ``lean`` can serve: float32 (``train.precision``), the defense declares its
    per-sample statistics (``Defense.lean_plan``) and every trainable parameter sits in a supported layer."""
    if precision != "fp32":
        raise ConfigError(f"train.engine: lean runs in float32 only; train.precision {precision} needs the "
                          f"func engine: use auto or func")
    if defense_cls.lean_plan is Defense.lean_plan:
        raise ConfigError(f"train.engine: lean needs a defense that declares its per-sample statistics "
                          f"(Defense.lean_plan); {defense_cls.__name__} needs materialised per-sample "
                          f"gradients: use auto or func")
    trainable_layers(model)


# On a CUDA device ``auto`` materialises per-sample gradients when one micro-batch of them takes at most this share
# of the device's memory: there torch.func's batched kernels beat the lean engine's per-sample convolutions (measured
# on an H100 at B = 1,024: DP-CNN 29 vs 127 ms a step, ResNet-20-GN 95 vs 193, ViT 42 vs 45, the GPT 105 vs 112;
# RS, random freeze, AdaCliP and GEP 1.3-4x faster still; docs/performance.md), at 1.5-5x the lean engine's memory.
FUNC_SHARE_ON_CUDA = 0.25


def select_engine(name: str, model: nn.Module, defense: Defense, device: torch.device | str = "cpu",
                  micro_batch: int = 0, precision: str = "fp32") -> str:
    """Resolve ``train.engine`` (``engine_choice`` without its reason)."""
    return engine_choice(name, model, defense, device, micro_batch, precision)[0]


def engine_choice(name: str, model: nn.Module, defense: Defense, device: torch.device | str = "cpu",
                  micro_batch: int = 0, precision: str = "fp32") -> tuple[str, str]:
    """(engine, why) for ``train.engine``: ``func`` always works; ``lean`` (book-keeping) where ``check_lean``
    passes; ``auto`` = ``lean`` where it passes, except on a CUDA device where ``micro_batch`` per-sample
    gradients fit in ``FUNC_SHARE_ON_CUDA`` of its memory (then ``func``, faster there), and ``func`` where it
    does not. ``precision`` ``bf16`` runs on ``func`` only (``auto`` picks it; ``lean`` is refused). The
    reason is one line for the run's log."""
    if name == "func":
        return "func", "as configured"
    try:
        check_lean(type(defense), model, precision)
    except ConfigError as exc:
        if name == "lean":
            raise
        return "func", f"book-keeping cannot serve this run ({str(exc).split(';')[0].removeprefix('train.engine: ')})"
    if name == "lean":
        return "lean", "as configured"
    if torch.device(device).type == "cuda" and micro_batch > 0:
        size = micro_batch * sum(p.numel() for p in model.parameters() if p.requires_grad) * 4  # float32 bytes
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        if size <= FUNC_SHARE_ON_CUDA * total:
            return "func", (f"CUDA: a micro-batch of per-sample gradients ({size / 2**30:.2f} GiB) fits in "
                            f"{FUNC_SHARE_ON_CUDA:.0%} of the device's memory, and func measured faster there")
        return "lean", f"CUDA: a micro-batch of per-sample gradients ({size / 2**30:.2f} GiB) would not fit"
    return "lean", "book-keeping serves this defense and model; on the CPU it measured faster than func"
