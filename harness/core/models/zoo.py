"""Model zoo: small image classifiers used by the DP training and privacy-attack experiments.

Every network takes images in pixel range [0, 1]; ``build_model`` prepends a ``Normalize`` layer so
gradient-inversion attacks can optimise directly in pixel space. Networks use only Conv2d, Linear,
GroupNorm, activations, pooling and Flatten (never BatchNorm, which mixes samples in a batch and so
breaks per-sample gradients and DP-SGD), plus — in ``hcnn`` / ``hcnn-small`` — a fixed scattering
transform in front (``harness.core.scatternet``), which has no parameters. That keeps them usable by both
``torch.func`` (functional_call + vmap, with the fixed front applied outside vmap:
``harness.core.per_sample.fixed_front``) and Opacus' per-layer hooks.

Factories validate the input shape arithmetically so a shape that cannot work is reported as a
``ConfigError`` when the model is built, not as a torch shape error in the middle of training.

The transformers (``vit``, ``gpt``) are built from Conv2d / Embedding / Linear / LayerNorm only — attention from
four ``nn.Linear`` projections (q, k, v, out), never ``nn.MultiheadAttention`` (whose bare ``in_proj_weight``
no per-layer engine knows), positions from an ``nn.Embedding`` over position indices, no class token (mean
pooling) — so the book-keeping engine covers them and torch.func traces them. Attention mixes the tokens of
one sample only. They take shape settings (``model.depth`` …, ``harness.core.settings.ModelConfig``); their
blocks are ``blocks.<i>`` so block-wise clipping styles (``defenses/groupwise.py``) can find them.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import nn

from harness.core.errors import ConfigError
from harness.core.registry import MODELS
from harness.core.scatternet import SCATTER_J, Scattering, coefficients_per_channel
from harness.core.settings import ModelConfig

Shape = tuple[int, int, int]
ModelFactory = Callable[[Shape, int], nn.Module]


# Dataset name -> model used when the config does not name one.
DEFAULT_MODELS: dict[str, str] = {
    "digits": "cnn3",
    "synthetic": "mlp",
    "mnist": "dpcnn-small",
    "fashionmnist": "dpcnn-small",
    "cifar10": "dpcnn",
    "svhn": "dpcnn",
    "imagefolder": "resnet20-gn",
    "tokens": "gpt",
    "textfile": "gpt",
}


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std``.

    mean/std are buffers, not parameters: they must follow ``.to(device)`` and be saved in the state
    dict, but never be trained, clipped or noised, and never appear in per-sample gradients.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) == 0 or len(mean) != len(std):
            raise ConfigError(
                f"model.normalize: mean and std need one value per channel, got {len(mean)} mean "
                f"and {len(std)} std values"
            )
        if any(s <= 0 for s in std):
            raise ConfigError(f"model.normalize: std values must all be > 0, got {std}")
        # Shape (C, 1, 1) broadcasts over (B, C, H, W) and over single (C, H, W) samples under vmap.
        self.register_buffer("mean", torch.tensor(mean).view(-1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(-1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"channels={self.mean.numel()}"


def build_model(
    name: str,
    in_shape: tuple[int, int, int],
    num_classes: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    settings: ModelConfig | None = None,
    vocab: int | None = None,
) -> nn.Sequential:
    """Build registered model ``name`` as ``Sequential(Normalize(mean, std), net)``.

    ``settings`` carries the shape settings of the models that take them (``takes_settings``); ``vocab`` is the
    token data's vocabulary (None for images). Raises ConfigError for an unknown name, an unusable input
    shape, settings given to a model that takes none, or mean/std whose length does not match the number of
    input channels.
    """
    factory = MODELS.get(name, field="model.name")
    settings = settings if settings is not None else ModelConfig()
    given = settings.given()
    if given and not getattr(factory, "takes_settings", False):
        raise ConfigError(f"model.{next(iter(given))}: model {name!r} takes no shape settings (only the "
                          f"transformers `vit` and `gpt` do); leave model.{', model.'.join(given)} unset")
    shape = _check_in_shape(name, in_shape, num_classes)
    if len(mean) != shape[0] or len(std) != shape[0]:
        raise ConfigError(
            f"model.normalize: input has {shape[0]} channel(s) but normalisation mean/std have "
            f"{len(mean)}/{len(std)} values; give one per channel"
        )
    norm = Normalize(mean, std)
    if getattr(factory, "takes_settings", False):
        return nn.Sequential(norm, factory(shape, num_classes, settings=settings, vocab=vocab))
    return nn.Sequential(norm, factory(shape, num_classes))


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with requires_grad when ``trainable_only``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------------------------------
# Shape validation helpers


def _check_in_shape(name: str, in_shape: Sequence[int], num_classes: int) -> Shape:
    if (
        len(tuple(in_shape)) != 3
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in in_shape)
    ):
        raise ConfigError(
            f"model.name: {name!r} needs an input shape (channels, height, width) of positive "
            f"integers, got {tuple(in_shape)}"
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"model.name: {name!r} needs num_classes >= 1, got {num_classes!r}")
    c, h, w = in_shape
    return (c, h, w)


def _pair(v: int | tuple[int, ...], i: int) -> int:
    return v if isinstance(v, int) else v[i]


def _walk(layers: nn.Sequential, shape: Shape) -> Shape | None:
    """Output shape of a plain conv/pool stack, or None if some feature map would be empty.

    Uses the floor formula from the Conv2d/MaxPool2d docs; ceil_mode and string padding are not used
    by any model here.
    """
    c, h, w = shape
    for m in layers:
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            k, s, p = m.kernel_size, m.stride, m.padding
            d = getattr(m, "dilation", 1)
            if isinstance(p, str) or getattr(m, "ceil_mode", False):
                raise NotImplementedError("shape walk supports numeric padding and floor mode only")
            h, w = (
                (size + 2 * _pair(p, i) - _pair(d, i) * (_pair(k, i) - 1) - 1) // _pair(s, i) + 1
                for i, size in enumerate((h, w))
            )
            if isinstance(m, nn.Conv2d):
                c = m.out_channels
            if h < 1 or w < 1:
                return None
    return (c, h, w)


def _min_side(layers: nn.Sequential, channels: int) -> int:
    """Smallest square side the stack accepts (only called on the error path)."""
    for side in range(1, 4097):
        if _walk(layers, (channels, side, side)) is not None:
            return side
    return 4097


def _features_out(name: str, layers: nn.Sequential, in_shape: Shape) -> Shape:
    out = _walk(layers, in_shape)
    if out is None:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): its strides/pools "
            f"need height and width >= {_min_side(layers, in_shape[0])}"
        )
    return out


def _require_min_side(name: str, in_shape: Shape, min_side: int) -> None:
    if in_shape[1] < min_side or in_shape[2] < min_side:
        raise ConfigError(
            f"model.name: {name!r} cannot take input shape {in_shape} (C, H, W): it needs height "
            f"and width >= {min_side}"
        )


def _numel(shape: Shape) -> int:
    return shape[0] * shape[1] * shape[2]


# --------------------------------------------------------------------------------------------------
# Registered models. Each factory: (in_shape, num_classes) -> nn.Module taking (B, C, H, W).


@MODELS.register("dpcnn", "Tanh CNN of Papernot et al. (550K params at 3x32x32); needs H, W >= 8")
def dpcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("dpcnn", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1), nn.Tanh(),
        nn.Conv2d(32, 32, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(32, 64, 3, padding=1), nn.Tanh(),
        nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.Tanh(),
        nn.Conv2d(128, 128, 3, padding=1), nn.Tanh(),
        nn.MaxPool2d(2),
    )  # fmt: skip
    flat = _numel(_features_out("dpcnn", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 128), nn.Tanh(), nn.Linear(128, num_classes)
    )


@MODELS.register(
    "dpcnn-small", "Tramer & Boneh tanh CNN for 28x28 grayscale (26K params); needs H, W >= 16"
)
def dpcnn_small(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("dpcnn-small", in_shape, num_classes)
    c = in_shape[0]
    features = nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=2, padding=2), nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2, padding=0), nn.Tanh(),
        nn.MaxPool2d(2, stride=1),
    )  # fmt: skip
    flat = _numel(_features_out("dpcnn-small", features, in_shape))
    return nn.Sequential(
        *features, nn.Flatten(), nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes)
    )


@MODELS.register(
    "cnn6", "R-GAP CNN6 (Zhu & Blaschko): 6 bias-free convs, LeakyReLU(0.2), strides, no pooling"
)
def cnn6(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("cnn6", in_shape, num_classes)
    c = in_shape[0]
    # Convs are bias-free as in R-GAP (the closed-form attack solves W x = y layer by layer);
    # this is also what gives the reference 154,266 parameters at 3x32x32 / 10 classes.
    specs = [(c, 12, 4, 2, 2), (12, 36, 3, 2, 1), (36, 36, 3, 1, 1), (36, 36, 3, 1, 1),
             (36, 64, 3, 2, 1), (64, 128, 3, 1, 1)]  # fmt: skip
    layers: list[nn.Module] = []
    for cin, cout, k, s, p in specs:
        layers += [nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False), nn.LeakyReLU(0.2)]
    features = nn.Sequential(*layers)
    flat = _numel(_features_out("cnn6", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes, bias=True))


@MODELS.register("cnn3", "3-conv strided LeakyReLU CNN for 8x8 digits; attackable by IG and R-GAP")
def cnn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("cnn3", in_shape, num_classes)
    c = in_shape[0]
    # Bias-free convs follow the R-GAP convention (as cnn6) so the closed-form attack applies as-is.
    features = nn.Sequential(
        nn.Conv2d(c, 16, 3, stride=1, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
        nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False), nn.LeakyReLU(0.2),
    )  # fmt: skip
    flat = _numel(_features_out("cnn3", features, in_shape))
    return nn.Sequential(*features, nn.Flatten(), nn.Linear(flat, num_classes))


@MODELS.register("fcn3", "R-GAP FCN3: Linear(CHW->1000->100->classes) with LeakyReLU(0.2)")
def fcn3(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("fcn3", in_shape, num_classes)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(_numel(in_shape), 1000), nn.LeakyReLU(0.2),
        nn.Linear(1000, 100), nn.LeakyReLU(0.2),
        nn.Linear(100, num_classes),
    )  # fmt: skip


@MODELS.register("mlp", "One-hidden-layer tanh MLP (128 units); small and fast, used by tests")
def mlp(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("mlp", in_shape, num_classes)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(_numel(in_shape), 128), nn.Tanh(), nn.Linear(128, num_classes)
    )


# ScatterNet + CNN (Tramèr & Boneh 2021, "H-CNN"): the fixed scattering transform (harness/core/scatternet.py),
# a parameter-free GroupNorm, then a small tanh CNN. Normalisation choice: Tramèr & Boneh normalise the
# scattering features either by GroupNorm(27 groups, affine off) — a per-sample operation, no privacy cost — or
# by a private "data normalisation" whose noisy statistics spend privacy budget. dpeval uses the GroupNorm for
# both models: nothing about the private data leaks through it, so the accountant's ε is the whole cost.
# 27 groups divide every C·81 (9 maps per group at 243 channels, 3 at 81).
SCATTER_GROUPS = 27


def _scatter_cnn(name: str, in_shape: Shape, num_classes: int, head: Callable[[int], nn.Sequential],
                 classifier: Callable[[int], list[nn.Module]]) -> nn.Sequential:
    """Sequential(Scattering, GroupNorm(27, affine off), *head, Flatten, *classifier(flat))."""
    in_shape = _check_in_shape(name, in_shape, num_classes)
    c, h, w = in_shape
    k, step = c * coefficients_per_channel(), 2 ** SCATTER_J
    features = head(k)
    if min(h, w) < step or _walk(features, (k, h // step, w // step)) is None:
        least = next(s for s in range(step, 4097) if _walk(features, (k, s // step, s // step)) is not None)
        raise ConfigError(f"model.name: {name!r} cannot take input shape {tuple(in_shape)} (C, H, W): its "
                          f"scattering (÷{step}) and pools need height and width >= {least}")
    scattering = Scattering(in_shape)
    flat = _numel(_features_out(name, features, scattering.out_shape))
    return nn.Sequential(scattering, nn.GroupNorm(SCATTER_GROUPS, scattering.out_shape[0], affine=False),
                         *features, nn.Flatten(), *classifier(flat))


@MODELS.register("hcnn", "ScatterNet+CNN of Tramer & Boneh (fixed scattering J=2, GroupNorm; 187K params at "
                         "3x32x32); needs H, W >= 8")
def hcnn(in_shape: Shape, num_classes: int) -> nn.Module:
    def head(k: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(k, 64, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2, 2),
            nn.Conv2d(64, 64, 3, padding=1), nn.Tanh(),
        )  # fmt: skip

    return _scatter_cnn("hcnn", in_shape, num_classes, head, lambda flat: [nn.Linear(flat, num_classes)])


@MODELS.register("hcnn-small", "ScatterNet+CNN for 28x28 grayscale (Tramer & Boneh; 33K params at 1x28x28); "
                               "needs H, W >= 4")
def hcnn_small(in_shape: Shape, num_classes: int) -> nn.Module:
    def head(k: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(k, 16, 3, stride=2, padding=1), nn.Tanh(),
            nn.Conv2d(16, 32, 3, padding=1), nn.Tanh(),
        )  # fmt: skip

    return _scatter_cnn("hcnn-small", in_shape, num_classes, head,
                        lambda flat: [nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes)])


# ResNet-20 with GroupNorm. 4 groups everywhere: the widths 16/32/64 are all divisible by 4, giving
# 4/8/16 channels per group, so early layers still normalise over several channels.
_GN_GROUPS = 4


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(_GN_GROUPS, channels, affine=True)


class _BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN plus shortcut, then ReLU (He et al. 2016)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        # Convs before a norm layer carry no bias: GN's affine shift makes it redundant.
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _gn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.norm2 = _gn(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), _gn(cout)
            )
        # Separate, non-inplace ReLUs: in-place ops interfere with Opacus' backward hooks.
        self.act1 = nn.ReLU()
        self.act2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNetGN(nn.Module):
    """CIFAR-style ResNet (3 stages of ``blocks`` basic blocks, widths 16/32/64) with GroupNorm."""

    def __init__(self, in_channels: int, num_classes: int, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), _gn(16), nn.ReLU()
        )
        stages: list[nn.Module] = []
        cin = 16
        for i, width in enumerate((16, 32, 64)):
            for j in range(blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(_BasicBlock(cin, width, stride))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))


@MODELS.register("resnet20-gn", "ResNet-20 (16/32/64) with GroupNorm(4 groups), any C; H, W >= 4")
def resnet20_gn(in_shape: Shape, num_classes: int) -> nn.Module:
    in_shape = _check_in_shape("resnet20-gn", in_shape, num_classes)
    # Strided 3x3/pad-1 convs never produce empty maps, so torch would accept any size; we require
    # 4x4 so both stride-2 stages really downsample (4 -> 2 -> 1) instead of running on 1x1 maps.
    _require_min_side("resnet20-gn", in_shape, 4)
    return ResNetGN(in_shape[0], num_classes, blocks=3)


# --------------------------------------------------------------------------------------------------
# Transformers: a small ViT and a GPT-style causal decoder (see the module docstring).

TRANSFORMER_DEFAULTS = {"depth": 2, "width": 64, "heads": 4, "patch": 4}
MLP_RATIO = 4


def takes_settings(factory: Callable) -> Callable:
    """Mark a factory as taking the shape settings: ``factory(in_shape, num_classes, settings=, vocab=)``."""
    factory.takes_settings = True
    return factory


class SelfAttention(nn.Module):
    """Multi-head self-attention over the tokens of each sample, from four Linear projections (q, k, v, out; the
    key projection without bias); ``causal``: token t attends to tokens ≤ t."""

    def __init__(self, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        # No key bias: softmax is invariant to it (q·b_k is the same for every key), so its gradient is
        # identically zero and per-sample clipping would only see rounding noise in it.
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width, bias=False), nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, w = h.shape
        dh = w // self.heads

        def split(z: torch.Tensor) -> torch.Tensor:  # [b, T, w] -> [b, heads, T, dh]
            return z.reshape(b, t, self.heads, dh).transpose(1, 2)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if self.causal:
            future = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        mixed = scores.softmax(-1) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, t, w))


class Block(nn.Module):
    """Pre-norm transformer block: h + attn(ln1(h)), then h + mlp(ln2(h)) with a GELU MLP of 4× width."""

    def __init__(self, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads, causal)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, MLP_RATIO * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(MLP_RATIO * width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.fc2(self.act(self.fc1(self.ln2(h))))


def _positions(h: torch.Tensor) -> torch.Tensor:
    """Position indices [b, T] for tokens h [b, T, w] (one row per sample, so lookups stay per-sample)."""
    return torch.arange(h.shape[1], device=h.device).expand(h.shape[0], -1)


class ViT(nn.Module):
    """Patch embedding (Conv2d, kernel = stride = patch), learned positions (Embedding), pre-norm blocks, final
    LayerNorm, mean pooling over the patches (no class token), Linear head."""

    def __init__(self, in_shape: Shape, num_classes: int, depth: int, width: int, heads: int, patch: int) -> None:
        super().__init__()
        c, h, w = in_shape
        self.patch = nn.Conv2d(c, width, patch, stride=patch)
        self.pos = nn.Embedding((h // patch) * (w // patch), width)
        self.blocks = nn.Sequential(*[Block(width, heads, causal=False) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2)  # [b, patches, width]
        h = h + self.pos(_positions(h))
        return self.head(self.norm(self.blocks(h)).mean(1))


class GPT(nn.Module):
    """GPT-style causal decoder over token ids: token and position Embeddings, causal pre-norm blocks, final
    LayerNorm, an untied Linear head on the *last* token's state (it has seen the whole sequence).

    The task is sequence classification — (ids [T], class) pairs trained with the harness's cross-entropy —
    rather than a next-token loss, so every defense, engine and accountant applies unchanged. Token ids arrive
    as the float values of a token dataset (``tokens``, ``textfile``: shape (1, 1, T), identity normalisation)
    and are rounded to integers here; the graph stops at the lookup."""

    def __init__(self, seq_len: int, vocab: int, num_classes: int, depth: int, width: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.Sequential(*[Block(width, heads, causal=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.reshape(x.shape[0], -1).round().long()
        h = self.tok(ids)
        h = h + self.pos(_positions(h))
        return self.head(self.norm(self.blocks(h))[:, -1])


def _transformer_shape(name: str, settings: ModelConfig) -> tuple[int, int, int]:
    depth, width, heads = (getattr(settings, k) or TRANSFORMER_DEFAULTS[k] for k in ("depth", "width", "heads"))
    if width % heads:
        raise ConfigError(f"model.width: {name!r} needs a width divisible by model.heads ({heads}), got {width}")
    return depth, width, heads


@MODELS.register("vit", "small ViT: Conv2d patches, learned positions, pre-norm blocks, mean pooling; "
                        "settings depth/width/heads/patch (patch divides H and W)")
@takes_settings
def vit(in_shape: Shape, num_classes: int, settings: ModelConfig | None = None, vocab: int | None = None) -> nn.Module:
    in_shape = _check_in_shape("vit", in_shape, num_classes)
    settings = settings if settings is not None else ModelConfig()
    for key in ("seq_len", "vocab"):
        if getattr(settings, key) is not None:
            raise ConfigError(f"model.{key}: 'vit' has no {key} setting (its tokens are the image's patches)")
    depth, width, heads = _transformer_shape("vit", settings)
    patch = settings.patch or TRANSFORMER_DEFAULTS["patch"]
    if in_shape[1] % patch or in_shape[2] % patch:
        raise ConfigError(f"model.patch: 'vit' needs a patch side dividing the image's height and width "
                          f"{in_shape[1:]}, got {patch}")
    return ViT(in_shape, num_classes, depth, width, heads, patch)


@MODELS.register("gpt", "GPT-style causal decoder classifying token sequences from the last token (token "
                        "data); settings depth/width/heads/seq_len/vocab, GPT-2 small = 12/768/12")
@takes_settings
def gpt(in_shape: Shape, num_classes: int, settings: ModelConfig | None = None, vocab: int | None = None) -> nn.Module:
    in_shape = _check_in_shape("gpt", in_shape, num_classes)
    settings = settings if settings is not None else ModelConfig()
    if settings.patch is not None:
        raise ConfigError("model.patch: 'gpt' has no patch setting (it reads token ids)")
    if in_shape[0] != 1 or in_shape[1] != 1:
        raise ConfigError(f"model.name: 'gpt' reads token sequences of shape (1, 1, T) (data `tokens` or "
                          f"`textfile`), got input shape {in_shape}")
    if vocab is None and settings.vocab is None:
        raise ConfigError("model.vocab: 'gpt' needs the vocabulary size: use a token dataset (`tokens`, "
                          "`textfile`) or set model.vocab")
    if vocab is not None and settings.vocab is not None and settings.vocab < vocab:
        raise ConfigError(f"model.vocab: the data has {vocab} token ids, got a vocabulary of {settings.vocab}")
    seq_len = settings.seq_len or in_shape[2]
    if seq_len < in_shape[2]:
        raise ConfigError(f"model.seq_len: the data's sequences have {in_shape[2]} tokens, got {seq_len} positions")
    depth, width, heads = _transformer_shape("gpt", settings)
    return GPT(seq_len, settings.vocab or vocab, num_classes, depth, width, heads)
