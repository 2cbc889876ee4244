"""Kernels for torchvision's and timm's layers, registered by dotted class name (nothing here imports either
package: a name is matched against a model's classes when the engine meets them, ``lean_kernels.kernel_for``).

Each entry was read against that package's forward (timm 1.0, torchvision 0.2x) and is checked against torch.func
in ``tests/engine/test_lean_zoo.py``:

- leaf layers that multiply or shift by their parameters (``LayerScale``, ``LayerScale2d``, MetaFormer's ``Scale``
  and ``StarReLU``, ResMLP's ``Affine``): ``FuncKernel`` (a vmapped elementwise op: cheap);
- timm's ``LayerNorm``, ``GroupNorm``, ``GroupNorm1`` (torch's, with an optional fast path): torch's kernels;
  its ``LayerNorm2d`` (a LayerNorm over the channels of [b, C, H, W]): a closed form; ``GroupNormAct`` (a group
  norm, then its activation): ``FuncKernel``;
- blocks holding a bare layer-scale parameter beside their children (ConvNeXt's ``gamma``, ResMLP's ``ls1`` /
  ``ls2``) and LeViT's attention (``attention_biases`` indexed by a buffer): ``FuncKernel`` on the block, for its
  own parameters — it recomputes the block;
- modules that use their children's weights without calling them, or fold the samples into another dimension
  (torchvision's ``ShiftedWindowAttention`` passes ``qkv.weight`` to ``F.linear``; LeViT's ``LinearNorm`` normalises
  [b·T, C]): ``FuncKernel(subtree=True)``;
- the class token and position embeddings of the two ViTs, which their forwards only broadcast over the samples:
  ``register_broadcast``.
"""

from __future__ import annotations

import torch.nn.functional as F

from dpeval.engine.lean_kernels import (
    FuncKernel,
    GroupNormKernel,
    LayerKernel,
    LayerNormKernel,
    install,
    register_broadcast,
    register_kernel,
)

# timm's norms that override forward only to offer a "fast norm" path computing the same function
for _name in ("timm.layers.norm.GroupNorm", "timm.layers.norm.GroupNorm1"):
    install(_name, GroupNormKernel())
install("timm.layers.norm.LayerNorm", LayerNormKernel())

for _name in ("timm.layers.layer_scale.LayerScale", "timm.layers.layer_scale.LayerScale2d",
              "timm.models.metaformer.Scale", "timm.models.metaformer.StarReLU", "timm.models.mlp_mixer.Affine",
              "timm.models.convnext.ConvNeXtBlock",
              "timm.models.mlp_mixer.ResBlock", "timm.models.levit.Attention",
              "timm.models.levit.AttentionDownsample", "timm.layers.norm_act.GroupNormAct"):
    install(_name, FuncKernel())
for _name in ("torchvision.models.swin_transformer.ShiftedWindowAttention", "timm.models.levit.LinearNorm"):
    install(_name, FuncKernel(subtree=True))

register_broadcast("torchvision.models.vision_transformer.VisionTransformer", "class_token")
register_broadcast("torchvision.models.vision_transformer.Encoder", "pos_embedding")
register_broadcast("timm.models.vision_transformer.VisionTransformer", "cls_token", "reg_token", "pos_embed")


@register_kernel("timm.layers.norm.LayerNorm2d")
class LayerNorm2dKernel(LayerKernel):
    """LayerNorm over the channels of [b, C, H, W] (timm's ``LayerNorm2d``; its fast-norm path computes the same)."""

    weight_layer = False

    def small_grads(self, module, a, ds):
        x_hat = F.layer_norm(a.permute(0, 2, 3, 1), module.normalized_shape, eps=module.eps)
        weighted = x_hat * ds.permute(0, 2, 3, 1)
        return {"weight": weighted.sum((1, 2)), "bias": ds.sum((2, 3))}
