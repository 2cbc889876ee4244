"""Per-data-set training defaults: the recipe a run on a real data set starts from.

The generic defaults of ``dpeval.core.settings`` (Adam at lr 0.01, B = 128, 20 epochs) are tuned for the embedded
digits (1,437 examples). On MNIST's 54,000 they over-train under the noise (86.8 % for DP-SGD at ε = 3), so
each real data set carries the recipe dpeval measured on it (docs/configuration.md, "Data-set defaults"). A recipe
fills only the keys the run does not set (YAML, a flag or ``--set`` always wins), and only where it was measured:

- the run's model is the data set's default model (the one the recipe trained; another model keeps the generic
  defaults, which a recipe tuned for a different network could make diverge);
- the run's defense has an entry in the recipe (its clip bounds: each defense's clipping parameter means another
  thing); the non-private ``none`` has none, since the recipe's large steps are safe only under clipping;
- the run trains (no ``model.weights``: the settings then describe how the given weights were trained).

With ``data.max_train`` set, only the recipe's part that does not depend on the training set's size applies (the
pixel range and the defense's clip bounds, ``SIZE_FREE``): its batch, optimizer, step size and epochs are sized for
the whole set, and on fewer examples the generic training defaults do better. Measured on MNIST with 3,000 training
images at ε = 3 (seed 0, 20 epochs): DP-SGD 89.5 % with the size-free part, 85.8 % with none of the recipe, 45.8 %
with all of it at B scaled to keep q = B/N; AdaCliP 83.1 %, 73.4 %, 40.9 %. ``skipped`` says so in one line.

What applied is recorded in the run's ``defaults`` (``key=value`` strings; not part of the run key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# Tramèr & Boneh's tanh CNN for 28×28 images (`dpcnn-small`) with their Fashion-MNIST values (B = 2048, SGD lr 4,
# momentum 0.9, C = 0.1), the RS paper's Table-2 baseline as dpeval measured it (docs/reproducing.md); the pixels
# in [0, 1] as that network was tuned on (centring them cost 2.1 points at ε = 1).
_SMALL_CNN = {"data.normalize": "none", "train.batch_size": 2048, "train.physical_batch_size": 512,
              "train.optimizer": "sgd", "train.lr": 4.0, "train.momentum": 0.9}
# Each defense's clip at the same scale as DP-SGD's C = 0.1 (configs/benchmark/fashionmnist/: GEP's embedding and
# residual bounds, AdaCliP's h2 set so that it clips at ≈ 0.1 in gradient space on this network's 26,010 weights).
_SMALL_CNN_DEFENSES: dict[str, dict[str, Any]] = {
    "dpsgd": {"clip": 0.1}, "rs": {"clip": 0.1}, "random-freeze": {"clip": 0.1}, "groupwise": {"clip": 0.1},
    "gep": {"clip0": 0.1, "clip1": 0.02}, "adaclip": {"h2": 1.2e-6},
}


@dataclass(frozen=True)
class Recipe:
    """A data set's training defaults: ``settings`` (dotted keys) for every defense it lists, plus that defense's
    own parameters (``defense.<param>``)."""

    model: str                                   # the model it was measured with: the data set's default model
    settings: dict[str, Any]
    defenses: dict[str, dict[str, Any]] = field(default_factory=dict)


RECIPES: dict[str, Recipe] = {
    # MNIST: the Fashion-MNIST recipe below at half its epochs (MNIST is easier; 97.x % at ε = 3, docs).
    "mnist": Recipe("dpcnn-small", {**_SMALL_CNN, "train.epochs": 20}, _SMALL_CNN_DEFENSES),
    # The RS paper's Table-2 DP-CNN/S baseline (E = 40), 86.3 % at ε = 3 over 4 seeds here.
    "fashionmnist": Recipe("dpcnn-small", {**_SMALL_CNN, "train.epochs": 40}, _SMALL_CNN_DEFENSES),
    # The RS paper's DP-CNN baseline from its code's README (B = 1000, lr 1, no momentum, C = 1, E = 40), measured on
    # GPUs here: 61.7 ± 0.6 % at ε = 3 (3 seeds; the paper 62.8). Only the defenses whose paper recipes train this
    # network: RS (C = 1) and random freeze (C = 0.1 with momentum 0.9: the same step by the scaling rule C/(1−μ)).
    "cifar10": Recipe("dpcnn", {"train.epochs": 40, "train.batch_size": 1000, "train.physical_batch_size": 250,
                                "train.optimizer": "sgd", "train.lr": 1.0, "train.momentum": 0.0},
                      {"dpsgd": {"clip": 1.0}, "rs": {"clip": 1.0}, "random-freeze": {"clip": 1.0}}),
}


def _value(raw: dict[str, Any], key: str, default: Any = None) -> Any:
    """The dotted ``key`` of the nested raw settings, ``default`` when they do not set it."""
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


# The settings of a recipe that do not depend on the training set's size (with them, the defense's clip bounds).
SIZE_FREE = ("data.normalize",)


def recipe_for(raw: dict[str, Any], default_model: Callable[[str], str]) -> Recipe | None:
    """The recipe that applies (whole, or its size-free part with ``data.max_train``) to the nested raw settings
    ``raw`` (its defense a mapping); ``default_model(name)`` is the model a run on data set ``name`` builds when
    ``model.name`` is not set."""
    dataset = _value(raw, "data.name", "digits")
    recipe = RECIPES.get(dataset) if isinstance(dataset, str) else None
    if recipe is None or (_value(raw, "model.name") or default_model(dataset)) != recipe.model:
        return None
    if _value(raw, "model.weights") is not None:
        return None
    return recipe if _value(raw, "defense.name", "dpsgd") in recipe.defenses else None


def _subset(raw: dict[str, Any]) -> bool:
    return bool(_value(raw, "data.max_train", 0))


def skipped(raw: dict[str, Any], default_model: Callable[[str], str]) -> str | None:
    """One line naming the recipe settings a run on a subset of the training set does not take (None: nothing
    was left out); call it before ``fill_defaults``, which sets keys of ``raw``."""
    recipe = recipe_for(raw, default_model)
    if recipe is None or not _subset(raw):
        return None
    left = [f"{k}={v}" for k, v in recipe.settings.items() if k not in SIZE_FREE and _value(raw, k) is None]
    if not left:
        return None
    return (f"data.max_train is set: {_value(raw, 'data.name')}'s recipe is sized for its whole training set, so "
            f"this run takes only its pixel range and clip bounds and the generic training defaults, not "
            f"{', '.join(left)} (docs/configuration.md, \"Data-set defaults\")")


def fill_defaults(raw: dict[str, Any], default_model: Callable[[str], str]) -> list[str]:
    """Set, in the nested ``raw`` settings (changed in place), each key of the applicable recipe that ``raw`` does
    not set (with ``data.max_train``, only its size-free part); returns them as ``key=value`` strings (empty when no
    recipe applies)."""
    recipe = recipe_for(raw, default_model)
    if recipe is None:
        return []
    own = recipe.defenses[_value(raw, "defense.name", "dpsgd")]
    settings = ({k: v for k, v in recipe.settings.items() if k in SIZE_FREE} if _subset(raw) else recipe.settings)
    wanted = {**settings, **{f"defense.{k}": v for k, v in own.items()}}
    applied = []
    for key, value in wanted.items():
        *parents, leaf = key.split(".")
        node: Any = raw
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf not in node:  # a malformed section is left for validation to name
            node[leaf] = value
            applied.append(f"{key}={value}")
    return applied
