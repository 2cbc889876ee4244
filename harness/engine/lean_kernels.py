"""The lean engine's kernel table: what it knows about each type of layer (``harness/engine/lean.py`` runs them).

A kernel turns what a layer kept during the forward pass (its input ``a``) and the per-sample gradient of its output
(``ds``, row i = ∂L_i/∂s_i) into the per-sample statistics and weighted sums of the layer's parameters. Built in:

- ``Linear`` over any number of tokens (input [b, *, d]); ``nn.MultiheadAttention`` as what it computes (its input
  projection a Linear over the tokens, its ``out_proj`` the Linear module it is: ``MultiheadAttentionKernel``);
- ``Conv2d`` with any stride / padding / dilation and any ``groups`` (depthwise, with or without a channel
  multiplier), zero padding;
- ``Embedding`` (plain lookups), ``GroupNorm``, ``LayerNorm`` (affine parameters, instantiated: they are small);
- ``FuncKernel``: per-sample gradients by torch.func over one module's own forward, for layers whose parameters have
  no closed form here (layer scales, relative-position bias tables, attention written with ``F.linear`` on its
  children's weights). It recomputes that module's forward, so it costs what the module costs once more;
- parameters with a leading singleton dimension that broadcasts over the samples (a class token, a position
  embedding: ``register_broadcast``), differentiated by the engine through an expanded copy (see ``lean.py``).

Third-party layers (timm's, torchvision's) are registered by their dotted class name (``"timm.layers.LayerScale"``
style: ``__module__`` + ``__qualname__``), so nothing here imports those packages: ``lean_known.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from dpeval.core.errors import RunFailure


class LayerKernel:
    """What the engine knows about one type of layer (one entry of ``KERNELS``, FastDP's layer table).

    A *weight layer* (Linear, Conv2d) is a per-sample product s_i = a_i·Wᵀ over T tokens: its weight's
    statistics come by ghost norm or instantiation, its weighted sum from one weight-gradient product; its
    bias is always instantiated. A *small layer* (GroupNorm, LayerNorm) instantiates every per-sample
    gradient (they are small).

    ``weight_attr`` / ``bias_attr`` name the weight layer's two parameters on the module. A kernel that defines
    ``forward(module, emit, *args, **kwargs)`` runs in place of the module's own forward during the lean pass and
    calls ``emit(a, s)`` on the product it differentiates (``MultiheadAttentionKernel``); ``whole_inputs``: the
    engine keeps every argument of the forward, ``a = (args, kwargs)`` (``FuncKernel``); ``subtree``: the kernel
    serves the parameters of the module's children too (they are not called as modules)."""

    weight_layer = True
    weight_attr = "weight"
    bias_attr = "bias"
    whole_inputs = False
    subtree = False
    forward: Callable | None = None

    def supports(self, module: nn.Module) -> bool:
        return True

    def weight(self, module: nn.Module) -> torch.Tensor:
        return getattr(module, self.weight_attr)

    def ghost_norm(self, module: nn.Module) -> bool:
        """Whether ``grams`` gives this layer's ghost norm (else its weight is always instantiated)."""
        return True

    def small_grads(self, module: nn.Module, a, ds: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-sample gradients always instantiated: {attr: [b, *shape]} (a weight layer's bias)."""
        return {self.bias_attr: self.tokens(module, a, ds)[1].sum(1)}

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
NAMED_KERNELS: dict[str, LayerKernel] = {}  # by dotted class name: layers of packages this one does not import
BROADCAST: dict[str, frozenset[str]] = {}  # dotted class name -> its parameters that broadcast over the samples


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_kernel(layer: type[nn.Module] | str) -> Callable[[type[K]], type[K]]:
    """Class decorator: the lean engine computes the per-sample statistics and sums of layers of type ``layer`` (a
    class, or a dotted ``module.QualName`` for a class of a package that need not be installed) and of its subclasses
    that keep its ``forward`` (``kernel_for``) with an instance of the decorated ``LayerKernel`` subclass. A weight
    layer (``weight_layer = True``) implements ``tokens`` (and, where it pays, ``weight_grads`` / ``weight_sum`` /
    ``grams``); a small layer (``weight_layer = False``) implements ``small_grads``; ``supports`` may refuse some
    configurations of the type. A type registered twice is refused (ValueError): a kernel is never replaced
    silently."""
    if not (isinstance(layer, str) or (isinstance(layer, type) and issubclass(layer, nn.Module))):
        raise TypeError(f"register_kernel: expects an nn.Module subclass or its dotted name, got {layer!r}")
    key = layer if isinstance(layer, str) else class_name(layer)

    def register(kernel: type[K]) -> type[K]:
        if not (isinstance(kernel, type) and issubclass(kernel, LayerKernel)):
            raise TypeError(f"register_kernel({key}): decorates a LayerKernel subclass, got {kernel!r}")
        install(layer, kernel())
        return kernel

    return register


def install(layer: type[nn.Module] | str, kernel: LayerKernel) -> None:
    """Put a kernel instance in the table (``register_kernel`` without the decorator; a ``FuncKernel(subtree=True)``
    needs its argument)."""
    key = layer if isinstance(layer, str) else class_name(layer)
    known = {class_name(t): k for t, k in KERNELS.items()} | NAMED_KERNELS
    if key in known:
        raise ValueError(f"register_kernel: {key} already has a kernel ({type(known[key]).__name__})")
    if isinstance(layer, str):
        NAMED_KERNELS[layer] = kernel
    else:
        KERNELS[layer] = kernel


def register_broadcast(owner: type[nn.Module] | str, *names: str) -> None:
    """Declare that parameters ``names`` of modules of class ``owner`` have a leading dimension of 1 that every use
    broadcasts over the samples (``x + pos_embed``, ``torch.cat([cls_token.expand(b, -1, -1), x], 1)``): the engine
    then hands the forward a copy expanded to [b, …] whose gradient is the per-sample gradient. A use that reduces
    over that dimension or indexes into it (``p[0]``, ``p.sum(0)``) would be mis-clipped: declare only what the
    owner's forward broadcasts. Other bare parameters need a kernel (``FuncKernel`` on their owner)."""
    key = owner if isinstance(owner, str) else class_name(owner)
    BROADCAST[key] = BROADCAST.get(key, frozenset()) | frozenset(names)


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
        kernel = KERNELS.get(cls) or NAMED_KERNELS.get(class_name(cls))
        if kernel is not None:
            overridden = any("forward" in vars(c) for c in classes[:depth])
            return (None if overridden else kernel), cls
    return None, None


def kernel_of(module: nn.Module) -> LayerKernel | None:
    """The table's kernel for ``module`` (``kernel_for`` its type), None when the engine does not know the layer or
    the kernel does not support its configuration."""
    kernel = kernel_for(type(module))[0]
    return kernel if kernel is not None and kernel.supports(module) else None


def broadcast_of(module: nn.Module) -> frozenset[str]:
    """The parameters of ``module`` declared to broadcast over the samples (``register_broadcast``)."""
    return BROADCAST.get(class_name(type(module)), frozenset())


@register_kernel(nn.Linear)
class LinearKernel(LayerKernel):
    def token_count(self, module, a, ds):
        return a[0].numel() // a.shape[-1]

    def tokens(self, module, a, ds):
        b = a.shape[0]
        return a.reshape(b, -1, a.shape[-1]), ds.reshape(b, -1, ds.shape[-1])


@register_kernel(nn.Conv2d)
class Conv2dKernel(LayerKernel):
    """Any ``groups``: a depthwise conv's per-sample weight gradient is small (C·m·k²), so grouped convs always
    instantiate it (the ghost norm's Gram matrices would be per group)."""

    def supports(self, module):
        return module.padding_mode == "zeros" and not isinstance(module.padding, str)

    def ghost_norm(self, module):
        return module.groups == 1

    def small_grads(self, module, a, ds):
        return {"bias": ds.flatten(2).sum(2)}

    def tokens(self, module, a, ds):
        b = a.shape[0]
        cols = F.unfold(a, module.kernel_size, module.dilation, module.padding, module.stride)  # [b, d, T]
        return cols.transpose(1, 2), ds.reshape(b, ds.shape[1], -1).transpose(1, 2)

    def weight_grads(self, module, a, ds):
        if module.groups == module.in_channels and len(self.taps(module, a, ds)) < math.prod(module.kernel_size):
            return self.weight_grads_by_taps(module, a, ds)
        if a.is_cuda:  # cuDNN's grouped convolution is slow with a group per sample; one batched product is not
            return self.weight_grads_by_matmul(module, a, ds)
        return self.weight_grads_by_grouped_conv(module, a, ds)

    @staticmethod
    def taps(module, a, ds) -> list[tuple[int, int]]:
        """The kernel offsets (i, j) that read some input pixel, not only padding (a 5×5 kernel on a 2×2 map: 9)."""
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = module.kernel_size, module.stride, module.dilation, module.padding
        (h, w), (oh, ow) = a.shape[2:], ds.shape[2:]
        rows = [i for i in range(kh) if i * dh + (oh - 1) * sh >= ph and i * dh < ph + h]
        cols = [j for j in range(kw) if j * dw + (ow - 1) * sw >= pw and j * dw < pw + w]
        return [(i, j) for i in rows for j in cols]

    def weight_grads_by_taps(self, module, a, ds):
        """A depthwise conv's per-sample gradient one kernel offset at a time: g_i[c, ·, i, j] = Σ_pixels ds_i ⊙ the
        input shifted by (i, j). Used where some offsets read only padding (late, small maps under 5×5 kernels, as
        in MobileNetV3 and EfficientNet at 32×32), which it skips: mkldnn's convolution with b·C groups takes up to
        7× longer there, as measured on a 1×1 map with 576 channels."""
        b, c = a.shape[:2]
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = module.kernel_size, module.stride, module.dilation, module.padding
        oh, ow = ds.shape[2:]
        padded = F.pad(a, (pw, pw, ph, ph))
        d = ds.reshape(b, c, -1, oh, ow)  # [b, C, multiplier, oh, ow]
        g = ds.new_zeros(b, c, d.shape[2], kh, kw)
        for i, j in self.taps(module, a, ds):
            shifted = padded[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            g[:, :, :, i, j] = (shifted.unsqueeze(2) * d).sum((3, 4))
        return g.view(b, *module.weight.shape)

    def weight_grads_by_matmul(self, module, a, ds):
        """g_i = ds_i^T · unfold(a_i) per group: [G, p/G, T] × [G, T, d/G], one batched product over the chunk."""
        b, g = a.shape[0], module.groups
        cols = F.unfold(a, module.kernel_size, module.dilation, module.padding, module.stride)  # [b, d, T]
        cols = cols.view(b, g, cols.shape[1] // g, cols.shape[2])  # unfold's rows are channel-major: groups split
        d = ds.reshape(b, g, ds.shape[1] // g, -1)
        return torch.matmul(d, cols.transpose(2, 3)).view(b, *module.weight.shape)

    def weight_grads_by_grouped_conv(self, module, a, ds):
        """b samples as one convolution with b·G groups (no unfold needed; mkldnn's fast path on the CPU)."""
        b, w = a.shape[0], module.weight
        g = torch.nn.grad.conv2d_weight(a.reshape(1, -1, *a.shape[2:]), (b * w.shape[0], *w.shape[1:]),
                                        ds.reshape(1, -1, *ds.shape[2:]), module.stride, module.padding,
                                        module.dilation, b * module.groups)
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


@register_kernel(nn.MultiheadAttention)
class MultiheadAttentionKernel(LinearKernel):
    """Self-attention as the three steps it computes: the input projection [q k v] = x·W_inᵀ + b_in (this kernel:
    a Linear over the tokens, whose parameters are ``in_proj_weight`` / ``in_proj_bias``), scaled dot-product
    attention (no parameter), and ``out_proj`` called as the Linear module it is (its own kernel). torch's forward
    uses ``out_proj``'s weights directly, which would hide that layer from the hooks, so the engine runs this
    forward in its place; it computes the same function (masks, dropout and the returned weights included).
    Cross-attention (query, key, value not one tensor) is refused when it runs."""

    weight_attr, bias_attr = "in_proj_weight", "in_proj_bias"

    def supports(self, module):
        return module._qkv_same_embed_dim and module.bias_k is None and not module.add_zero_attn

    def forward(self, module, emit, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if not (query is key and key is value) or query.dim() != 3:
            raise RunFailure("train.engine: the lean engine takes nn.MultiheadAttention as batched self-attention "
                             "(query, key and value one [b, T, d] tensor); use train.engine=func for this model")
        x = (query if module.batch_first else query.transpose(0, 1)).contiguous()  # see lean._contiguous_input
        b, t, d = x.shape
        h = module.num_heads
        qkv = emit(x, F.linear(x, module.in_proj_weight, module.in_proj_bias))
        q, k, v = qkv.view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)  # [b, h, T, d/h] each
        logits = (q * (d // h) ** -0.5) @ k.transpose(-2, -1)
        if is_causal and attn_mask is None:
            attn_mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for mask in (attn_mask, key_padding_mask):
            if mask is None:
                continue
            if mask is key_padding_mask:
                mask = mask.view(b, 1, 1, t)
            elif mask.dim() == 3:
                mask = mask.view(b, h, t, t)
            logits = logits.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
        weights = F.dropout(logits.softmax(-1), module.dropout, module.training)
        out = module.out_proj((weights @ v).transpose(1, 2).reshape(b, t, d))
        out = out if module.batch_first else out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, weights.mean(1) if average_attn_weights else weights


class LeanCannotRecompute(RunFailure):
    """A module the lean engine recomputes (``FuncKernel``) draws random numbers: ``train.engine=auto`` then trains
    with torch.func instead (the training loop's first micro-batch finds it)."""


class FuncKernel(LayerKernel):
    """Per-sample gradients of a module's parameters by torch.func: the module's own forward, one sample at a time
    under ``vmap``, pulled back from that sample's output gradient. Exact for any module that treats its samples
    independently, whatever it does with its parameters (a layer scale ``x * gamma``, a relative-position bias
    table indexed by a buffer, a block that multiplies a child's output by a bare parameter). It recomputes the
    module's forward (children included: their own hooks are quiet meanwhile), so it costs about what the module
    costs once more; its per-sample gradients are instantiated. ``subtree=True``: also the parameters of its
    children, for modules that use their children's weights without calling them (torchvision's Swin attention
    passes ``self.qkv.weight`` to ``F.linear``)."""

    weight_layer = False
    whole_inputs = True

    def __init__(self, subtree: bool = False) -> None:
        self.subtree = subtree

    def small_grads(self, module, a, ds):
        args, kwargs = a
        b = ds.shape[0]
        fixed = {n: p.detach() for n, p in module.named_parameters()}
        own = {n: fixed[n] for n, p in module.named_parameters(recurse=self.subtree) if p.requires_grad}
        buffers = dict(module.named_buffers())
        leaves, spec = tree_flatten((args, kwargs))
        batched = [isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == b for t in leaves]

        def one(params, ds_i, *rows):
            it = iter(rows)
            values = [next(it).unsqueeze(0) if flag else leaf for leaf, flag in zip(leaves, batched)]
            a_i, kw_i = tree_unflatten(values, spec)
            _, pullback = vjp(lambda p: functional_call(module, ({**fixed, **p}, buffers), tuple(a_i), kw_i), params)
            return pullback(ds_i.unsqueeze(0))[0]

        rows = [t for t, flag in zip(leaves, batched) if flag]
        try:
            return vmap(one, in_dims=(None, 0, *[0] * len(rows)))(own, ds, *rows)
        except RuntimeError as exc:
            if "random" not in str(exc):
                raise
            # vmap refuses random ops: a recomputed dropout would not draw the forward's mask
            raise LeanCannotRecompute(f"train.engine: the lean engine recomputes {type(module).__name__}'s forward "
                             "(FuncKernel), which draws random numbers (dropout or stochastic depth in training "
                             "mode) and so would not match the pass it differentiates; use train.engine=func") \
                from None
