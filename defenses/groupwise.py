"""``groupwise``: DP-SGD with group-wise clipping (Bu et al., "On the accuracy and efficiency of group-wise
clipping in differentially private optimization").

Each per-sample gradient is split into M groups of parameters; group m is clipped to R_m = R/√M with the
``auto`` (R_m/(‖g‖ + 0.01), the paper's default) or ``abadi`` (min(1, R_m/‖g‖)) function; one noise
N(0, σ²R²) goes on every coordinate of the sum. The clipped per-sample vector has norm < R for every
grouping, so the accounting is DP-SGD's (paper, Remark 5.1). ``groups: all`` with ``clip_fn: abadi`` is
``dpsgd`` exactly.

Groupings (``defense.groups``), over the model's *layers* — a layer is a module owning trainable
parameters (weight and bias together), taken in parameter registration order, which is the forward order
of every registered model:

- ``all``        one group (flat clipping)
- ``layer``      one group per layer (the paper's layer-wise clipping)
- ``param``      one group per parameter tensor (Opacus' "per_layer" clipping)
- ``uniform:M``  M contiguous groups with equal layer counts (sizes differ by at most one, the larger
                 groups first, when M does not divide the layer count)
- ``device:N``   N pipeline stages: N contiguous groups of layers with balanced parameter counts. Balancing
                 rule: the k-th cut (k = 1 … N−1) falls at the layer boundary whose cumulative parameter
                 count is nearest k·P/N (P: all trainable parameters; ties to the earlier boundary), each
                 stage keeping at least one layer — the quantile cut a pipeline-parallel split makes.
- ``boundary:X`` two groups split after X transformer blocks: the layers before block X (the embeddings and
                 blocks 0 … X−1) and the rest (blocks X …, the final norm and the head), 0 ≤ X ≤ the
                 block count; needs a model whose layers are named ``…blocks.<i>.…`` (``vit``, ``gpt``).
- a list of layer names, each starting a group (the paper's block heads / FastDP's ``clipping_style``
  list); the first layer always starts the first group.

Choices where the paper is silent: "uniform" groups count layers rather than transformer blocks (most
registered models are not built from repeated blocks; ``boundary:X`` is the block-wise style); ``clip`` R is
kept for ``auto`` too (the paper fixes R = 1; any other R only rescales the learning rate).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import torch

from dpeval.core.errors import ConfigError
from dpeval.core.params import param
from dpeval.defenses.base import DefenseParams
from dpeval.defenses.clipping import CLIP_FUNCTIONS, GroupClipping
from dpeval.defenses.dpsgd import DPSGD
from dpeval.defenses.registry import DEFENSES

GROUPINGS = ("all", "layer", "param", "uniform:M", "device:N", "boundary:X", "[layer names]")


@dataclass
class GroupwiseParams(DefenseParams):
    clip: float = param(1.0, "R: the total per-sample bound; each of the M groups is clipped to R/√M",
                        low=0, low_open=True, noise_scale=True)
    groups: str | list[str] = param("all", "`all`, `layer`, `param`, `uniform:M`, `device:N` (N pipeline stages "
                                           "of balanced parameter counts), `boundary:X` (two groups split after X "
                                           "transformer blocks), or a list of layer names each starting a group")
    clip_fn: str = param("auto", "`auto`: R_m/(‖g‖+0.01) (the paper's default); `abadi`: min(1, R_m/‖g‖)",
                         choices=CLIP_FUNCTIONS)

    def validate(self) -> None:
        if isinstance(self.groups, list):
            if not self.groups:
                raise ConfigError("defense.groups: an explicit list needs at least one layer name")
        elif self.groups not in ("all", "layer", "param") and all(
                count(self.groups) is None for count in (uniform_count, device_count, boundary_blocks)):
            raise ConfigError(f"defense.groups: must be one of {', '.join(GROUPINGS)}, got {self.groups!r}")


def _count(spec: str, prefix: str, letter: str, least: int) -> int | None:
    if not spec.startswith(prefix + ":"):
        return None
    try:
        m = int(spec.split(":", 1)[1])
    except ValueError:
        m = least - 1
    if m < least:
        raise ConfigError(f"defense.groups: {prefix}:{letter} needs an integer {letter} >= {least}, got {spec!r}")
    return m


def uniform_count(spec: str) -> int | None:
    """M of ``uniform:M`` (None when ``spec`` is not of that form; ConfigError when M is not ≥ 1)."""
    return _count(spec, "uniform", "M", 1)


def device_count(spec: str) -> int | None:
    """N of ``device:N`` (None when ``spec`` is not of that form; ConfigError when N is not ≥ 1)."""
    return _count(spec, "device", "N", 1)


def boundary_blocks(spec: str) -> int | None:
    """X of ``boundary:X`` (None when ``spec`` is not of that form; ConfigError when X is not ≥ 0)."""
    return _count(spec, "boundary", "X", 0)


BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)(?:\.|$)")


def block_of(layer: str) -> int | None:
    """The transformer block index of a layer named ``…blocks.<i>.…`` (None outside the blocks)."""
    m = BLOCK.search(layer)
    return int(m.group(1)) if m else None


def _device_starts(spec: str, n: int, names: list[str], layers: dict[str, list[str]],
                   sizes: dict[str, int] | None) -> list[int]:
    if sizes is None:
        raise ValueError("device:N groups need the parameters' sizes")
    if n > len(names):
        raise ConfigError(f"defense.groups: {spec} asks for more stages than the model has layers ({len(names)})")
    cum = list(itertools.accumulate((sum(sizes[p] for p in layers[layer]) for layer in names), initial=0))
    total, starts = cum[-1], [0]
    for k in range(1, n):
        lo, hi = starts[-1] + 1, len(names) - (n - k)  # every stage keeps at least one layer
        starts.append(min(range(lo, hi + 1), key=lambda i: (abs(cum[i] - k * total / n), i)))
    return starts


def _boundary_starts(spec: str, x: int, names: list[str]) -> list[int]:
    blocks = [block_of(layer) for layer in names]
    count = max((b + 1 for b in blocks if b is not None), default=0)
    if count == 0:
        raise ConfigError(f"defense.groups: {spec} needs a model built from transformer blocks (layers named "
                          f"'blocks.<i>', as vit and gpt); this model's layers are {names}")
    if x > count:
        raise ConfigError(f"defense.groups: {spec} is out of range: the model has {count} blocks (X in 0..{count})")
    cut = next((i for i, b in enumerate(blocks) if b is not None and b >= x), None)
    if cut is None:  # after the last block
        cut = max(i for i, b in enumerate(blocks) if b is not None) + 1
    if cut == 0 or cut == len(names):
        raise ConfigError(f"defense.groups: {spec} leaves one of the two groups empty")
    return [0, cut]


def layers_of(param_names: list[str]) -> dict[str, list[str]]:
    """Layer name (the owning module's path) → its parameter names, in registration order."""
    layers: dict[str, list[str]] = {}
    for name in param_names:
        layers.setdefault(name.rpartition(".")[0], []).append(name)
    return layers


def resolve_groups(spec: str | list[str], param_names: list[str],
                   sizes: dict[str, int] | None = None) -> list[list[str]]:
    """Turn a ``defense.groups`` value into a partition of ``param_names`` (ConfigError on bad input);
    ``sizes`` (parameter name → element count) is needed by ``device:N`` only."""
    layers = layers_of(param_names)
    names = list(layers)
    if spec == "all":
        return [list(param_names)]
    if spec == "param":
        return [[n] for n in param_names]
    if spec == "layer":
        return [list(ps) for ps in layers.values()]
    if isinstance(spec, list):
        unknown = [h for h in spec if h not in layers]
        if unknown:
            raise ConfigError(f"defense.groups: unknown layer name(s) {unknown}; the model's layers are {names}")
        indices = [names.index(h) for h in spec]
        if indices != sorted(set(indices)):
            raise ConfigError(f"defense.groups: list each group-head layer once, in forward order; got {spec}")
        starts = indices if indices[0] == 0 else [0] + indices
    elif device_count(spec) is not None:
        starts = _device_starts(spec, device_count(spec), names, layers, sizes)
    elif boundary_blocks(spec) is not None:
        starts = _boundary_starts(spec, boundary_blocks(spec), names)
    else:
        m = uniform_count(spec)
        if m is None:
            raise ConfigError(f"defense.groups: must be one of {', '.join(GROUPINGS)}, got {spec!r}")
        if m > len(names):
            raise ConfigError(f"defense.groups: {spec} asks for more groups than the model has layers ({len(names)})")
        base, extra = divmod(len(names), m)
        sizes = [base + (1 if i < extra else 0) for i in range(m)]
        starts = [sum(sizes[:i]) for i in range(m)]
    bounds = starts + [len(names)]
    return [[p for layer in names[a:b] for p in layers[layer]] for a, b in itertools.pairwise(bounds)]


@DEFENSES.register("groupwise", "group-wise clipping: M groups clipped to R/√M each (auto or abadi), noise N(0, σ²R²)")
class Groupwise(DPSGD):
    Params = GroupwiseParams

    def make_clipping(self) -> GroupClipping:
        sizes = {n: math.prod(shape) for n, shape in self.param_shapes.items()}
        return GroupClipping.of(resolve_groups(self.params.groups, list(self.param_shapes), sizes),
                                self.params.clip, self.params.clip_fn)

    @classmethod
    def check_model(cls, params: GroupwiseParams, model: torch.nn.Module) -> None:
        trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
        resolve_groups(params.groups, list(trainable), trainable)
