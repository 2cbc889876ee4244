
"""The transformers ``vit`` and ``gpt``, built from Conv2d / Embedding / Linear / LayerNorm only — attention from
four ``nn.Linear`` projections (q, k, v, out), never ``nn.MultiheadAttention`` (whose bare ``in_proj_weight``
no per-layer engine knows), positions from an ``nn.Embedding`` over position indices, no class token (mean
pooling) — so the lean engine covers them and torch.func traces them. Attention mixes the tokens of
one sample only. They take shape settings (``model.depth`` …, ``dpeval.core.settings.ModelConfig``); their
blocks are ``blocks.<i>`` so block-wise clipping styles (``defenses/groupwise.py``) can find them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpeval.core.errors import ConfigError
from dpeval.core.models._shapes import Shape, check_in_shape, takes_settings
from dpeval.core.registry import MODELS
from dpeval.core.settings import ModelConfig

TRANSFORMER_DEFAULTS = {"depth": 2, "width": 64, "heads": 4, "patch": 4}
MLP_RATIO = 4


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
@takes_settings("depth", "width", "heads", "patch")
def vit(in_shape: Shape, num_classes: int, settings: ModelConfig | None = None, vocab: int | None = None) -> nn.Module:
    in_shape = check_in_shape("vit", in_shape, num_classes)
    settings = settings if settings is not None else ModelConfig()
    depth, width, heads = _transformer_shape("vit", settings)
    patch = settings.patch or TRANSFORMER_DEFAULTS["patch"]
    if in_shape[1] % patch or in_shape[2] % patch:
        raise ConfigError(f"model.patch: 'vit' needs a patch side dividing the image's height and width "
                          f"{in_shape[1:]}, got {patch}")
    return ViT(in_shape, num_classes, depth, width, heads, patch)


@MODELS.register("gpt", "GPT-style causal decoder classifying token sequences from the last token (token "
                        "data); settings depth/width/heads/seq_len/vocab, GPT-2 small = 12/768/12")
@takes_settings("depth", "width", "heads", "seq_len", "vocab")
def gpt(in_shape: Shape, num_classes: int, settings: ModelConfig | None = None, vocab: int | None = None) -> nn.Module:
    in_shape = check_in_shape("gpt", in_shape, num_classes)
    settings = settings if settings is not None else ModelConfig()
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
