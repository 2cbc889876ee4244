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

Supported layers are the entries of the kernel table (``lean_kernels.py``: one ``LayerKernel`` per layer type) and
their subclasses that keep the parent's ``forward`` (``kernel_for``). A layer type joins it with
``@register_kernel(LayerType)`` on a ``LayerKernel`` subclass, from this package or from outside it (a model
plug-in registers its own layers where it defines them; docs/architecture.md, "Per-sample kernels for your own
layers"). Built in: Linear over any number T of tokens (input [b, *, d]: the attention projections and MLPs of a
transformer), ``nn.MultiheadAttention`` (self-attention; its input projection a Linear over tokens, ``out_proj``
the Linear it is), Conv2d (any stride / padding / dilation / groups: depthwise and grouped, zero padding),
Embedding (plain lookups: no padding_idx, max_norm, scale_grad_by_freq or sparse gradients), GroupNorm and
LayerNorm; and, by dotted class name (``lean_known.py``), the layer scales, channels-first norms, ConvNeXt / ResMLP
blocks with bare layer-scale parameters, LeViT's and torchvision Swin's attention, through ``FuncKernel``
(torch.func over that one module's forward: exact for any sample-wise use of its parameters, at the cost of
recomputing it).

Bare parameters (a class token, a position embedding on a module that holds other modules) are taken two ways: a
module class may declare them as broadcasting over the samples (``register_broadcast``: a leading dimension of 1
that every use broadcasts against the batch, as ``x + pos_embed`` and ``cls_token.expand(b, -1, -1)`` do); the
forward then gets a copy expanded to [b, …] (a leaf of its own), whose gradient autograd computes without summing
over the samples: it *is* the per-sample gradient, at no extra pass. We chose a declaration over inferring the use
(an autograd hook on every op touching the parameter) because a use that reduces over or indexes the leading
dimension would be silently mis-clipped by the expansion; declared owners are the torchvision / timm models whose
forward we read. Any other bare parameter — multiplied, indexed by a buffer — needs a kernel on its owner
(``FuncKernel``).

A model with any other trainable parameter (its layer classes counted in one line) is refused, and so, when it
runs, is a layer used twice in one forward, a layer whose input's first dimension is not the micro-batch (a norm
over samples folded into tokens), and a kept input modified in place before backprop reaches its layer — nothing
is ever dropped or mis-clipped silently. Like the torch.func path, it assumes samples do not interact in the
forward pass (no batch norm in training mode); dropout in train mode draws its mask per element, so per example,
and a layer recomputed through ``FuncKernel`` must draw nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils._pytree import tree_leaves, tree_map

from dpeval.core.errors import ConfigError, RunFailure
from dpeval.core.per_sample import fixed_front
from dpeval.defenses.base import Defense
from dpeval.defenses.clipping import row_squares
from dpeval.defenses.lean_plan import LeanBatch, LeanPlan
from dpeval.engine import lean_known  # noqa: F401 - registers the torchvision / timm layers by name
from dpeval.engine.lean_kernels import (  # noqa: F401 - the kernel table's public names, re-exported
    BROADCAST,
    KERNELS,
    NAMED_KERNELS,
    Conv2dKernel,
    FuncKernel,
    LayerKernel,
    LinearKernel,
    MultiheadAttentionKernel,
    broadcast_of,
    ghost_norm_pays,
    install,
    kernel_for,
    kernel_of,
    register_broadcast,
    register_kernel,
)

WORKSPACE_BUDGET = 1 << 21  # CPU: elements (8 MiB in float32) of transient workspace per chunk of samples
CUDA_WORKSPACE_SHARE = 1 / 64  # a CUDA device: the share of its memory one chunk's workspace may take
LISTED_CLASSES = 4  # the refusal names this many layer classes, then counts the rest (one line, whatever the model)


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


def refused_label(module: nn.Module) -> str:
    """How the refusal names a layer without a kernel: its class, what about it is refused where that is known; a
    parameter owned by a module that also holds other modules (a class token on the model) is a bare one."""
    name = type(module).__name__
    kernel, ancestor = kernel_for(type(module))
    if kernel is not None:
        return f"{name} (this configuration)"
    if ancestor is not None:
        return f"{name} (overrides {ancestor.__name__}.forward)"
    holds_layers = any(True for c in module.children() for _ in c.parameters())
    if holds_layers and not type(module).__module__.startswith("torch."):
        return f"Parameter (bare, in {name})"
    return name


def lean_parts(model: nn.Module, field: str = "train.engine", instead: str = "train.engine=func",
               ) -> tuple[dict[str, nn.Module], dict[str, tuple[str, str]]]:
    """(layers, bare): modules owning trainable parameters that have a kernel, by module path (a ``subtree`` kernel
    takes its children's parameters too), and the parameters declared to broadcast over the samples
    (``register_broadcast``: full name -> (owner path, attribute)). ConfigError counting whatever else holds a
    trainable parameter by class, in one line naming ``field`` and the setting to use ``instead``."""
    layers: dict[str, nn.Module] = {}
    bare: dict[str, tuple[str, str]] = {}
    refused: dict[str, list[str]] = {}
    covered: list[str] = []  # paths of subtree kernels: their children are theirs
    for path, module in model.named_modules():
        if any(path.startswith(c + ".") for c in covered):
            continue
        kernel = kernel_of(module)
        subtree = kernel is not None and kernel.subtree
        own = [n for n, p in module.named_parameters(recurse=subtree) if p.requires_grad]
        if not own:
            continue
        prefix = f"{path}." if path else ""
        if kernel is not None:
            layers[path] = module
            if subtree:
                covered.append(path)
            continue
        broadcast = broadcast_of(module)
        for n in [n for n in own if n in broadcast and getattr(module, n).shape[:1] == (1,)]:
            bare[prefix + n] = (path, n)
            own.remove(n)
        if own:
            label = refused_label(module)
            refused.setdefault(label, []).extend([prefix + n for n in own] if label.startswith("Parameter")
                                                 else [path or "the model"])
    if refused:
        listed = list(refused.items())[:LISTED_CLASSES]
        counted = ", ".join(f"{label} ×{len(where)} at {where[0]}{', …' if len(where) > 1 else ''}"
                            for label, where in listed)
        more = f" and {len(refused) - len(listed)} more layer classes" if len(refused) > len(listed) else ""
        raise ConfigError(f"{field}: the lean engine has no per-sample kernel for {counted}{more}; register one "
                          f"(dpeval.engine.lean.register_kernel, docs/architecture.md) or use {instead} for this model")
    return layers, bare


def trainable_layers(model: nn.Module, field: str = "train.engine", instead: str = "train.engine=func",
                     ) -> dict[str, nn.Module]:
    """The modules with kernels that own the model's trainable parameters, by path (``lean_parts``, which refuses a
    model it cannot take)."""
    return lean_parts(model, field, instead)[0]


@dataclass
class _Kept:
    """What one layer holds between its backward hook and the close of its group(s)."""

    a: object = None                                                    # input activation (or all the inputs)
    ds: torch.Tensor | None = None                                      # per-sample output gradient
    per_sample: dict[str, torch.Tensor] = field(default_factory=dict)   # instantiated per-sample grads
    open_groups: int = 0
    versions: tuple[int, ...] = ()                                      # of the kept inputs: in-place edits refused


def _contiguous_input(module: nn.Module, args: tuple) -> tuple | None:
    """A Linear's input made contiguous (in the lean pass and in a ``FuncKernel``'s recomputation). With the weight
    detached (not requiring grad), torch's matmul does not fold a non-contiguous [b, T, d] input into one matrix
    product but expands the weight to a batched one: 11× slower forward and backward on a transposed [64, 4, 384]
    input (measured; ResMLP's token-mixing layout), where non-private SGD, whose weight requires grad, folds."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].is_contiguous():
        return None
    return (args[0].contiguous(), *args[1:])


def _versions(a: object) -> tuple[int, ...]:
    return tuple(t._version for t in tree_leaves(a) if isinstance(t, torch.Tensor))


class LeanEngine:
    """``engine(x, y, plan) -> LeanBatch``: the factor-weighted gradient sums of one micro-batch (and the
    plan's probes), computed during one backward pass (see the module docstring and ``defenses/lean_plan.py``).

    Parameter names are those of ``model.named_parameters()``.
    """

    def __init__(self, model: nn.Module, features: bool = False) -> None:
        """``features=True``: callers pass ``front_features`` of their inputs, not raw inputs."""
        self.model = model
        self.layers, self.bare = lean_parts(model)
        owner = {}  # full name -> (key of what holds it: a layer's path, or a bare parameter's own name; attribute)
        for path, module in self.layers.items():
            prefix = f"{path}." if path else ""
            for n, p in module.named_parameters(recurse=self._kernel(module).subtree):
                if p.requires_grad:
                    owner[prefix + n] = (path, n)
        for name, (_, attr) in self.bare.items():
            owner[name] = (name, attr)
        self.owner = owner
        keys = [*self.layers, *self.bare]
        self.trainable = {key: {a for k, a in owner.values() if k == key} for key in keys}
        self.peak_held = 0  # most layers holding backprop data at once (a memory proxy, for tests)
        self.split = fixed_front(model).applied() if features else fixed_front(model)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, plan: LeanPlan) -> LeanBatch:
        if set(self.owner) != set(plan.names):
            raise ValueError(f"groups and trainable parameters differ: {sorted(set(self.owner) ^ set(plan.names))}")
        if not plan.per_sample:
            return self._plain_sum(x, y, plan)
        b = x.shape[0]
        group_of = {n: m for m, g in enumerate(plan.groups) for n in g}
        key_groups = {key: {group_of[n] for n, (k, _) in self.owner.items() if k == key} for key in self.trainable}
        kept: dict[str, _Kept] = {}
        # each group's per-parameter statistics, summed in float64 once when it closes (two operators, not one per
        # parameter; GEP's residual ‖g‖² − ‖θ‖² must not lose digits)
        stats: list[list[torch.Tensor]] = [[] for _ in plan.groups]
        probes = torch.zeros(b, plan.probe_dim, device=x.device) if plan.probes else None
        factors: list[torch.Tensor | None] = [None] * len(plan.groups)
        pending = [len(g) for g in plan.groups]  # parameters not yet seen in backprop
        sums: dict[str, torch.Tensor] = {}
        held: set[str] = set()  # layers seen in backprop whose groups are still open
        quiet = [False]  # the forward is over: forwards run later are a kernel's recomputation (FuncKernel)

        def close(group: int) -> None:
            parts = stats[group]  # float32, and float64 where a statistic needed it (stack promotes them exactly)
            # one parameter: its statistic in float64 (the same number as a one-row sum, one operator fewer)
            total = parts[0].double() if len(parts) == 1 else torch.stack(parts).sum(0, dtype=torch.float64)
            c = factors[group] = plan.factors(group, total, probes).to(x.dtype)
            for name in plan.groups[group] if plan.sums else ():
                key, attr = self.owner[name]
                sums[name] = self._weighted_sum(self.layers.get(key), kept[key], attr, c)
            for key in {self.owner[n][0] for n in plan.groups[group]}:
                kept[key].open_groups -= 1
                if kept[key].open_groups == 0:
                    del kept[key]  # free the activation / output gradient / per-sample gradients
                    held.discard(key)

        def record(key: str, prefix: str, found: dict[str, torch.Tensor]) -> None:
            held.add(key)
            self.peak_held = max(self.peak_held, len(held))
            for attr, sq in found.items():
                group = group_of[prefix + attr]
                stats[group].append(sq)
                pending[group] -= 1
                if pending[group] == 0:
                    close(group)

        def on_backward(path: str, module: nn.Module, ds: torch.Tensor) -> None:
            k = kept[path]
            if _versions(k.a) != k.versions:
                raise RunFailure(f"train.engine: the input of layer {path!r} was modified in place after the layer "
                                 "ran; the lean engine needs it as the layer saw it (use train.engine=func)")
            k.ds = ds.detach()
            prefix = f"{path}." if path else ""
            record(path, prefix, self._statistics(module, k, self.trainable[path], prefix, plan, probes))

        def on_bare(name: str, g: torch.Tensor) -> None:
            attr = self.owner[name][1]
            g = g.unsqueeze(1)  # [b, *shape[1:]] -> [b, 1, *shape[1:]]: each sample's gradient of the parameter
            kept[name] = _Kept(per_sample={attr: g}, open_groups=len(key_groups[name]))
            record(name, name.removesuffix(attr), {attr: _statistic(g, name, plan, probes)})

        # joins outputs that do not depend on the features (lookups of token ids or positions) to backprop
        anchor = torch.zeros((), device=x.device, requires_grad=True)

        def observe(path: str, module: nn.Module, a: object, s: torch.Tensor) -> torch.Tensor:
            if path in kept:
                raise RunFailure(f"train.engine: layer {path!r} runs more than once per forward pass; "
                                 "the lean engine needs each layer once (use train.engine=func)")
            if not any(t.dim() > 0 and t.shape[0] == b for t in tree_leaves(a) if isinstance(t, torch.Tensor)) \
                    or s.dim() == 0 or s.shape[0] != b:
                raise RunFailure(f"train.engine: layer {path!r} ({type(module).__name__}) does not see the "
                                 f"{b} samples on its first dimension (a batch folded into another one); the lean "
                                 "engine needs them there (use train.engine=func)")
            kept[path] = _Kept(a=a, open_groups=len(key_groups[path]), versions=_versions(a))
            if not s.requires_grad:
                s = s + anchor
            s.register_hook(lambda g: on_backward(path, module, g))
            return s

        def forward_hook(path: str, whole: bool):
            def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> torch.Tensor | None:
                if quiet[0]:
                    return None
                if not isinstance(output, torch.Tensor):
                    raise RunFailure(f"train.engine: layer {path!r} ({type(module).__name__}) returns "
                                     f"{type(output).__name__}, not a tensor; its kernel cannot take it "
                                     "(use train.engine=func)")
                detach = functools.partial(tree_map, lambda t: t.detach() if isinstance(t, torch.Tensor) else t)
                return observe(path, module, (detach(args), detach(kwargs)) if whole else args[0].detach(), output)
            return hook

        handles, patched = [], []
        for path, module in self.layers.items():
            kernel = self._kernel(module)
            if kernel.forward is not None:  # the kernel runs the layer and names the product it differentiates
                emit = functools.partial(lambda p, m, a, s: observe(p, m, a.detach(), s), path, module)
                module.forward = functools.partial(kernel.forward, module, emit)
                patched.append(module)
            else:
                handles.append(module.register_forward_hook(forward_hook(path, kernel.whole_inputs),
                                                            with_kwargs=True))
            if isinstance(kernel, LinearKernel) and kernel.forward is None:
                handles.append(module.register_forward_pre_hook(_contiguous_input))
        try:
            head = self.split.head
            params = {n: p.detach() for n, p in head.named_parameters()}
            buffers = dict(head.named_buffers())
            roots = [anchor]
            for head_name, model_name in self.split.names.items():
                if model_name in self.bare:  # a leaf of its own, one row per sample: its gradient is per sample
                    p = params[head_name]
                    params[head_name] = p.expand(b, *p.shape[1:]).requires_grad_(True)
                    params[head_name].register_hook(functools.partial(on_bare, model_name))
                    roots.append(params[head_name])
            with torch.no_grad():
                features = self.split.front(x.detach())
            features = features.detach()  # never the caller's tensor
            if features.is_floating_point():
                roots.append(features.requires_grad_(True))
            try:
                logits = functional_call(head, (params, buffers), (features,))
            finally:
                for module in patched:
                    del module.forward
            quiet[0] = True
            loss = F.cross_entropy(logits, y, reduction="sum")
            torch.autograd.grad(loss, roots, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        if any(pending):
            unseen = [n for m, g in enumerate(plan.groups) if pending[m] for n in g]
            raise RunFailure(f"train.engine: no gradient reached {unseen} (is the layer unused, or are its "
                             "weights used without calling it?)")
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
        weight = kernel.weight_attr
        if kernel.weight_layer and weight in trainable:
            name = prefix + weight
            if plan.transformed(name):
                out[weight] = self._transformed_weight(kernel, module, k, name, plan, probes)
            else:
                out[weight] = self._weight_square_norms(kernel, module, k)
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
        w = kernel.weight(module)
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
            k.per_sample[kernel.weight_attr] = _join(parts)
        return _join(stats)

    def _weight_square_norms(self, kernel: LayerKernel, module: nn.Module, k: _Kept) -> torch.Tensor:
        """‖∂L_i/∂W‖² of a weight layer, by ghost norm or by instantiation (then kept in ``k``).

        The rule is FastDP's (``ghost_norm_pays``): ghost norm when the two T×T Gram matrices are smaller than
        the per-sample gradient (2T² < p·d; T tokens or output pixels, d inputs, p outputs), else
        instantiate."""
        b, w = k.a.shape[0], kernel.weight(module)
        step = self._chunk(kernel, module, k.a)
        t = kernel.token_count(module, k.a, k.ds)
        if t == 1 and isinstance(kernel, LinearKernel):  # one token: ‖a_i ds_iᵀ‖ = ‖a_i‖·‖ds_i‖
            a, ds = kernel.tokens(module, k.a, k.ds)
            return row_squares(a) * row_squares(ds)
        if kernel.ghost_norm(module) and ghost_norm_pays(t, w.numel()):  # ⟨a_i a_iᵀ, ds_i ds_iᵀ⟩, in chunks
            squares = []
            for lo in range(0, b, step):
                ga, gs = kernel.grams(module, k.a[lo:lo + step], k.ds[lo:lo + step])  # [c, T, T] each
                squares.append(ga.mul_(gs).sum((1, 2)))  # a reduction: as precise as row_squares
            return _join(squares)
        step = self._chunk(kernel, module, k.a, w)
        g = _join([kernel.weight_grads(module, k.a[lo:lo + step], k.ds[lo:lo + step])
                   for lo in range(0, b, step)])
        if w.numel() <= k.a[0].numel() + k.ds[0].numel():
            k.per_sample[kernel.weight_attr] = g  # smaller than what it replaces: keep it for the sum
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

    def _weighted_sum(self, module: nn.Module | None, k: _Kept, attr: str, c: torch.Tensor) -> torch.Tensor:
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
    per-sample statistics (``capabilities.lean_capable``: it implements ``Defense.lean_plan``) and every
    trainable parameter sits in a supported layer."""
    if precision != "fp32":
        raise ConfigError(f"train.engine: lean runs in float32 only; train.precision {precision} needs the "
                          f"func engine: use auto or func")
    if not defense_cls.capabilities.lean_capable:
        raise ConfigError(f"train.engine: lean needs a defense that declares its per-sample statistics "
                          f"(Defense.lean_plan); {defense_cls.__name__} needs materialised per-sample "
                          f"gradients: use auto or func")
    trainable_layers(model)


# On a CUDA device ``auto`` materialises per-sample gradients when one micro-batch of them takes at most this share
# of the device's memory: there torch.func's batched kernels beat the lean engine's per-sample convolutions (measured
# on an H100 at B = 1,024: DP-CNN 29 vs 127 ms a step, ResNet-20-GN 95 vs 193, ViT 42 vs 45, the GPT 105 vs 112;
# RS, random freeze, AdaCliP and GEP 1.3-4x faster still; docs/performance.md), at 1.5-5x the lean engine's memory.
FUNC_SHARE_ON_CUDA = 0.25


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
