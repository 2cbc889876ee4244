"""Tiny torchvision and timm models through both per-sample engines: the lean engine's per-sample norms equal
torch.func's (float64), so the layers registered by name in ``lean_known.py`` compute what those packages'
forwards compute. timm's cases are skipped, saying why, where timm is not installed."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

from dpeval.core.per_sample import PerSampleGradients
from dpeval.defenses.lean_plan import LeanPlan
from dpeval.engine.lean import BROADCAST, NAMED_KERNELS, LeanEngine, lean_parts


def group_norm(channels: int, **kwargs) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(4, channels), channels, **kwargs)


def batch_norms_to_group_norms(model: nn.Module) -> nn.Module:
    for name, child in model.named_children():
        if type(child) in (nn.BatchNorm1d, nn.BatchNorm2d):
            setattr(model, name, group_norm(child.num_features))
        else:
            batch_norms_to_group_norms(child)
    return model


def torchvision_cases() -> dict:
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3
    from torchvision.models.swin_transformer import SwinTransformer
    from torchvision.models.vision_transformer import VisionTransformer

    return {
        "tv-vit": (lambda: VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8,
                                             mlp_dim=16, num_classes=3), 8),
        "tv-swin": (lambda: SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[1, 1], num_heads=[1, 2],
                                            window_size=[2, 2], num_classes=3), 8),
        "tv-mobilenet-v3-gn": (lambda: MobileNetV3([InvertedResidualConfig(8, 3, 16, 8, True, "RE", 2, 1, 1.0),
                                                    InvertedResidualConfig(8, 5, 24, 16, True, "HS", 1, 1, 1.0)],
                                                   last_channel=16, num_classes=3, norm_layer=group_norm), 8),
    }


def timm_cases() -> dict:
    timm = pytest.importorskip("timm", reason="timm is an optional extra (pip install dpeval[zoo])")
    from timm.layers import GroupNorm1, GroupNormAct
    from timm.models.metaformer import MetaFormer
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    def create(name, **kwargs):
        return timm.create_model(name, pretrained=False, num_classes=3, **kwargs)

    def levit():
        model = create("levit_128s", img_size=32, embed_dim=(16, 24, 32), key_dim=4, num_heads=(2, 2, 2),
                       depth=(1, 1, 1))
        return batch_norms_to_group_norms(model).train()  # training mode: its eval mode caches the bias lookup

    return {
        "timm-convnext": (lambda: create("convnext_atto", dims=(4, 8, 8, 8), depths=(1, 1, 1, 1)), 32),
        "timm-vit": (lambda: create("vit_tiny_patch16_224", img_size=8, patch_size=4, embed_dim=8, depth=1,
                                    num_heads=2), 8),
        "timm-resmlp": (lambda: MlpMixer(num_classes=3, img_size=8, patch_size=4, num_blocks=1, embed_dim=8,
                                         mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine), 8),
        "timm-poolformer": (lambda: MetaFormer(num_classes=3, depths=(1, 1, 1, 1), dims=(8, 16, 24, 32),
                                               downsample_norm=None, norm_layers=GroupNorm1, mlp_act=nn.GELU,
                                               layer_scale_init_values=1e-5, res_scale_init_values=None,
                                               use_mlp_head=False), 32),
        "timm-levit-gn": (levit, 32),
        "timm-groupnormact": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, 2), GroupNormAct(8, num_groups=4),
                                                    nn.Flatten(), nn.Linear(8 * 3 * 3, 3)), 8),
    }


def norms_agree(build, size: int) -> None:
    torch.manual_seed(0)
    model = build().double()
    if not (model.training and hasattr(model, "stages") and "Levit" in type(model).__name__):
        model.eval()
    x, y = torch.rand(4, 3, size, size, dtype=torch.float64), torch.randint(0, 3, (4,))
    lean_parts(model)  # every parameter has a kernel or is declared
    grads = PerSampleGradients(model)(x, y)
    expected = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()]).sum(0)
    found = []
    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    LeanEngine(model)(x, y, LeanPlan((names,), lambda m, s, p: found.append(s) or torch.ones_like(s), sums=False))
    torch.testing.assert_close(found[0], expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("case", ["tv-vit", "tv-swin", "tv-mobilenet-v3-gn"])
def test_torchvision_models_agree_on_per_sample_norms(case):
    norms_agree(*torchvision_cases()[case])


@pytest.mark.parametrize("case", ["timm-convnext", "timm-vit", "timm-resmlp", "timm-poolformer", "timm-levit-gn",
                                  "timm-groupnormact"])
def test_timm_models_agree_on_per_sample_norms(case):
    norms_agree(*timm_cases()[case])


def test_every_name_registered_for_a_package_names_one_of_its_classes():
    """A misspelt name would leave the layer refused (not mis-clipped), but the registration would be dead."""
    checked = 0
    for name in [*NAMED_KERNELS, *BROADCAST]:
        module, _, qualname = name.rpartition(".")
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue  # that package is not installed here
        assert isinstance(getattr(found, qualname, None), type), name
        checked += 1
    assert checked >= len([n for n in [*NAMED_KERNELS, *BROADCAST] if n.startswith("torchvision.")])
