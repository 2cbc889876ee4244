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
- a list of layer names, each starting a group (the paper's block heads / FastDP's ``clipping_style``
  list); the first layer always starts the first group.

Choices where the paper is silent: "uniform" groups count layers rather than transformer blocks (the
registered models are not built from repeated blocks); ``clip`` R is kept for ``auto`` too (the paper
fixes R = 1; any other R only rescales the learning rate).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from defenses.base import DefenseParams
from defenses.clipping import CLIP_FUNCTIONS, GroupClipping
from defenses.dpsgd import DPSGD
from defenses.registry import DEFENSES
from harness.core.params import param
from harness.core.errors import ConfigError

GROUPINGS = ("all", "layer", "param", "uniform:M", "[layer names]")


@dataclass
class GroupwiseParams(DefenseParams):
    clip: float = param(1.0, "R: the total per-sample bound; each of the M groups is clipped to R/√M",
                        low=0, low_open=True)
    groups: str | list[str] = param("all", "`all`, `layer`, `param`, `uniform:M`, or a list of layer names "
                                           "each starting a group")
    clip_fn: str = param("auto", "`auto`: R_m/(‖g‖+0.01) (the paper's default); `abadi`: min(1, R_m/‖g‖)",
                         choices=CLIP_FUNCTIONS)

    def validate(self) -> None:
        if isinstance(self.groups, list):
            if not self.groups:
                raise ConfigError("defense.groups: an explicit list needs at least one layer name")
        elif self.groups not in ("all", "layer", "param") and uniform_count(self.groups) is None:
            raise ConfigError(f"defense.groups: must be one of {', '.join(GROUPINGS)}, got {self.groups!r}")


def uniform_count(spec: str) -> int | None:
    """M of ``uniform:M`` (None when ``spec`` is not of that form; ConfigError when M is not ≥ 1)."""
    if not spec.startswith("uniform:"):
        return None
    try:
        m = int(spec.split(":", 1)[1])
    except ValueError:
        m = 0
    if m < 1:
        raise ConfigError(f"defense.groups: uniform:M needs an integer M >= 1, got {spec!r}")
    return m


def layers_of(param_names: list[str]) -> dict[str, list[str]]:
    """Layer name (the owning module's path) → its parameter names, in registration order."""
    layers: dict[str, list[str]] = {}
    for name in param_names:
        layers.setdefault(name.rpartition(".")[0], []).append(name)
    return layers


def resolve_groups(spec: str | list[str], param_names: list[str]) -> list[list[str]]:
    """Turn a ``defense.groups`` value into a partition of ``param_names`` (ConfigError on bad input)."""
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
        return GroupClipping.of(resolve_groups(self.params.groups, list(self.param_shapes)), self.params.clip,
                                self.params.clip_fn)

    @classmethod
    def check_model(cls, params: GroupwiseParams, model: torch.nn.Module) -> None:
        resolve_groups(params.groups, [n for n, p in model.named_parameters() if p.requires_grad])
