"""Per-sample norms from Python (``dpeval.per_sample_norms``) against a float64 loop of per-example autograd
gradients, on both engines; the lean engine's kernel lookup by class hierarchy (a subclass that keeps its parent's
``forward`` uses the parent's kernel, one that overrides it is refused, and ``auto`` falls back to ``func``); the
lean refusal as one line counting layer classes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpeval
from dpeval.core.errors import ConfigError
from dpeval.engine.lean import KERNELS, kernel_of, trainable_layers


class MyLinear(nn.Linear):
    """A user's Linear that only adds a method: its parameters mean what nn.Linear's do."""

    def describe(self) -> str:
        return f"{self.in_features} -> {self.out_features}"


class PlainLayerNorm(nn.LayerNorm):
    pass


class LayerNorm2d(nn.LayerNorm):
    """timm's channels-first LayerNorm: its own forward normalises over C of [B, C, H, W]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.GroupNorm(1, 3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 6 * 6, 10))


def mlp() -> nn.Module:
    """Norm layers on [B, features] (no token dimension: their kernels must not sum over the samples)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.GroupNorm(4, 16), nn.Tanh(), nn.LayerNorm(16),
                         nn.Linear(16, 10))


def subclassed() -> nn.Module:
    return nn.Sequential(nn.Flatten(), MyLinear(64, 16), nn.Tanh(), PlainLayerNorm(16), MyLinear(16, 10))


def reference_norms(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One example at a time, in float64: the norm of its loss's gradient over the trainable parameters."""
    model = model.double()
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(len(y)):
        loss = F.cross_entropy(model(x[i:i + 1].double()), y[i:i + 1])
        grads = torch.autograd.grad(loss, params)
        norms.append(torch.cat([g.flatten() for g in grads]).norm())
    return torch.stack(norms)


@pytest.mark.parametrize("build", [cnn, mlp, subclassed])
@pytest.mark.parametrize("engine", ["func", "lean"])
def test_per_sample_norms_match_a_float64_loop(build, engine):
    torch.manual_seed(0)
    model = build()
    x, y = torch.rand(7, 1, 8, 8), torch.randint(0, 10, (7,))
    model.train()
    got = dpeval.per_sample_norms(model, x, y, engine=engine)
    assert got.dtype == torch.float32 and got.shape == (7,)
    assert model.training  # its mode given back
    expected = reference_norms(model, x, y)
    assert float(((got.double() - expected).abs() / expected).max()) < 1e-5


def test_a_subclass_keeping_forward_uses_its_parents_kernel():
    model = subclassed()
    assert kernel_of(model[1]) is KERNELS[nn.Linear] and kernel_of(model[3]) is KERNELS[nn.LayerNorm]
    assert set(trainable_layers(model)) == {"1", "3", "4"}
    result = dpeval.run({"data": {"name": "digits", "max_train": 100}, "defense": "dpsgd",
                         "train": {"epochs": 1, "batch_size": 25, "engine": "lean"}},
                        model=small_subclassed)
    assert result.extra["train.engine_used"] == "lean" and result.extra["train.engine_reason"] == "as configured"


def small_subclassed(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), MyLinear(c * h * w, 16), nn.Tanh(), PlainLayerNorm(16),
                         MyLinear(16, num_classes))


def channels_first(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Conv2d(c, 4, 3), LayerNorm2d(4), nn.Flatten(), nn.Linear(4 * (h - 2) * (w - 2),
                                                                                     num_classes))


def test_a_subclass_overriding_forward_is_refused_and_auto_uses_func():
    model = channels_first((1, 8, 8), 10)
    assert kernel_of(model[1]) is None
    with pytest.raises(ConfigError, match=r"LayerNorm2d \(overrides LayerNorm\.forward\) ×1 at 1;"):
        trainable_layers(model)
    settings = {"data": {"name": "digits", "max_train": 100}, "defense": "dpsgd", "train": {"epochs": 1,
                                                                                          "batch_size": 25}}
    with pytest.raises(ConfigError, match="LayerNorm2d"):
        dpeval.run({**settings, "train": {**settings["train"], "engine": "lean"}}, model=channels_first)
    result = dpeval.run(settings, model=channels_first)  # train.engine: auto
    assert result.extra["train.engine_used"] == "func"
    assert "LayerNorm2d (overrides LayerNorm.forward)" in result.extra["train.engine_reason"]
    assert "LayerNorm2d" in (result.folder / "log.txt").read_text()  # the API run's log says why too


class Unsupported(nn.Module):
    """100 trainable parameters: 32 blocks, each a Linear (supported) and a PReLU (no kernel), and two learned
    parameters on the model itself (bare parameters nothing declares)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 8))
        self.scale = nn.Parameter(torch.ones(8))
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.PReLU(8)) for _ in range(32)])
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x[:, :8] + self.token) * self.scale)


def test_the_refusal_counts_layer_classes_in_one_line():
    with pytest.raises(ConfigError) as err:
        trainable_layers(Unsupported())
    message = str(err.value)
    assert "\n" not in message and len(message) <= 300 and "blocks.1" not in message
    assert sum(p.numel() > 0 for p in Unsupported().parameters()) == 100
    assert "PReLU ×32 at blocks.0.1, …" in message and "Parameter (bare, in Unsupported) ×2 at token, …" in message
    assert "Linear" not in message
    assert "register_kernel" in message and message.endswith("use train.engine=func for this model")
    with pytest.raises(ConfigError, match=r'^engine: .*PReLU ×32.*use engine="func"'):
        dpeval.per_sample_norms(Unsupported(), torch.rand(3, 64), torch.tensor([0, 1, 2]), engine="lean")


def test_the_refusal_lists_a_few_layer_classes_and_counts_the_rest():
    layers = [nn.BatchNorm1d(4), nn.InstanceNorm1d(4, affine=True), nn.PReLU(), nn.Bilinear(4, 4, 4), nn.RMSNorm(4)]
    with pytest.raises(ConfigError) as err:
        trainable_layers(nn.Sequential(*layers))
    message = str(err.value)
    assert "Bilinear ×1 at 3;" not in message and "Bilinear ×1 at 3 and 1 more layer classes;" in message
    assert "RMSNorm" not in message and len(message) <= 300
