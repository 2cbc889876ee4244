"""Sweep grids: a base run plus a grid of values, expanded into validated run configurations (``RunSpec``).

Sweep file = a run configuration in which any field given as a list is swept (cartesian product), plus
``seeds: [..]``. Fields that are lists by nature (``attacks``, ``data.synthetic.shape``, list-typed
defense or attack parameters) are swept only when given as a list of lists: ``attacks: [ig, rgap]`` is
one run with both attacks, ``attacks: [[ig], [rgap]]`` two runs. Every grid point is validated before
any run starts.

A paper recipe (configs/papers/) adds a ``paper:`` section (``PaperNumbers``): what the paper reports for
the configuration. It is no part of any run's configuration or run key; ``paper_columns`` turns it into
result columns ``paper.<field>`` (``test_accuracy_sem`` → ``paper.test_accuracy.sem``) that the sweep
driver adds to each run's result, so the leaderboard and the report show them beside the measured ones.
"""

from __future__ import annotations

import copy
import itertools
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dpeval.config import build_spec, load_yaml, refuse_recorded
from dpeval.core.errors import ConfigError, brief
from dpeval.core.params import Params, from_dict, param
from dpeval.core.spec import RunSpec

NATURAL_LISTS = {"attacks", "data.synthetic.shape"}
# The most grid points (seeds included) one sweep file may hold: every point is built and validated before any
# runs, so a file of a million (three lists of 100) would not even finish planning; split a larger study.
MAX_GRID_POINTS = 10_000


@dataclass
class PaperNumbers(Params):
    """A recipe's ``paper:`` section: the paper's reported numbers for the configuration the recipe runs."""

    source: str = param("", "the paper: authors, title, venue")
    table: str = param("", "the table (or figure) that reports the number")
    row: str = param("", "the row and column of that table")
    test_accuracy: float | None = param(None, "reported test accuracy, as a fraction", low=0, high=1)
    test_accuracy_sem: float | None = param(None, "its standard error of the mean, as a fraction", low=0)
    accuracy_is: str = param("unstated", "`final`: the last epoch's accuracy; `best`: the best epoch's "
                                         "(compare with utility.best_test_accuracy); `unstated`",
                             choices=("final", "best", "unstated"))
    density: float | None = param(None, "reported total density of the released gradient (comm.density)",
                                  low=0, high=1)


def paper_columns(raw: Any, where: str = "paper") -> dict[str, Any]:
    """The validated ``paper:`` section as result columns ``paper.<field>`` (fields left unset omitted)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of the paper's numbers (source, table, row, test_accuracy, ...)")
    numbers = from_dict(PaperNumbers, raw, where)
    columns = {}
    for key, value in vars(numbers).items():
        if value is not None and value != "":
            columns["paper." + (key.replace("_sem", ".sem") if key.endswith("_sem") else key)] = value
    return columns


def load_paper(path: str | Path) -> dict[str, Any]:
    """The result columns of a sweep file's ``paper:`` section ({} when it has none)."""
    return paper_columns(load_yaml(path).get("paper"), f"{path}: paper")


# ---------------------------------------------------------------------------------------------------
# Expansion


def _flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{path}.")
        else:
            yield path, value


def _is_list_typed(path: str, raw: dict[str, Any]) -> bool:
    """Whether ``path`` is a field whose single value is itself a list."""
    if path in NATURAL_LISTS:
        return True
    section, _, name = path.partition(".")
    if section not in ("defense", "attack") or not name or "." in name:
        return False
    from dpeval.attacks import ATTACKS
    from dpeval.defenses import DEFENSES

    if section == "defense":
        names = raw.get("defense", {}).get("name", "dpsgd")
        classes = [DEFENSES.get(n, field="defense") for n in (names if isinstance(names, list) else [names])]
    else:
        names = raw.get("attacks", [])
        names = [n for group in names for n in (group if isinstance(group, list) else [group])]
        classes = [ATTACKS.get(n, field="attack") for n in names if n != "none"]
    for cls in classes:
        hints = typing.get_type_hints(cls.Params)
        tp = hints.get(name)
        if tp is not None and (typing.get_origin(tp) is list or list in typing.get_args(tp)):
            return True
    return False


def expand(raw: dict[str, Any], where: str = "sweep") -> list[dict[str, Any]]:
    """All grid points of a sweep file, as raw run configurations (one per point and seed)."""
    raw = copy.deepcopy(raw)
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    seeds = raw.pop("seeds", None)
    if seeds is not None:
        if "seed" in raw:
            raise ConfigError(f"{where}: seeds: give either seed or seeds, not both")
        if not isinstance(seeds, list) or not seeds:
            raise ConfigError(f"{where}: seeds: must be a non-empty list of integers, got {brief(seeds)}")
        raw["seed"] = seeds
    axes: list[tuple[str, list[Any]]] = []
    for path, value in _flatten(raw):
        if not isinstance(value, list):
            continue
        if _is_list_typed(path, raw) and not (value and all(isinstance(v, list) for v in value)):
            continue  # a single list value, not an axis
        if not value:
            raise ConfigError(f"{where}: {path}: empty list; a swept field needs at least one value")
        axes.append((path, value))
    count = math.prod(len(values) for _, values in axes)
    if count > MAX_GRID_POINTS:
        sizes = " × ".join(f"{len(values)} {path}" for path, values in axes)
        raise ConfigError(f"{where}: the grid has {count} points ({sizes}); a sweep file may hold at most "
                          f"{MAX_GRID_POINTS}: split it into several files")
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        point = copy.deepcopy(raw)
        for (path, _), value in zip(axes, combo):
            node = point
            *parents, leaf = path.split(".")
            for part in parents:
                node = node[part]
            node[leaf] = value
        points.append(point)
    return points


def load_sweep(path: str | Path) -> list[RunSpec]:
    """Read, expand and validate a sweep file; duplicate grid points (same run key) are merged."""
    raw = load_yaml(path, "SWEEP_FILE")
    if not raw:
        raise ConfigError(f"{path}: empty sweep file")
    try:
        refuse_recorded(raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    paper_columns(raw.pop("paper", None), f"{path}: paper")  # validated here; carried by load_paper
    specs: dict[str, RunSpec] = {}
    for point in expand(raw, where=str(path)):
        try:
            spec = build_spec(point)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        specs.setdefault(spec.run_key, spec)
    return list(specs.values())


def settings_of(spec: RunSpec) -> dict[str, Any]:
    """A grid point's settings that apply to it, flat as the leaderboard's columns: names of defense,
    attacks, dataset, model, seed; its defense's and attacks' parameters; ``train.*`` / ``data.*``; for a
    DP run the requested ε (``privacy.epsilon`` marks the point private, as in a result)."""
    from dpeval.defenses import DEFENSES
    from dpeval.leaderboard import setting_columns

    dp = DEFENSES.get(spec.defense_name).is_dp(spec.defense)
    canonical = spec.canonical()
    flat: dict[str, Any] = {"defense": spec.defense_name, "dataset": spec.data.name, "model": spec.model.name,
                            "attacks": "+".join(spec.attacks) or "none", "seed": spec.seed,
                            "privacy.epsilon": (spec.privacy.epsilon or 1.0) if dp else math.inf}
    flat.update(dict(_flatten(canonical["defense"], "defense.")))
    flat.pop("defense.name")
    flat.update(dict(_flatten(canonical["attack"], "attack.")))
    flat.update(setting_columns(canonical, dp))
    return flat


def swept_fields(specs: list[RunSpec]) -> list[str]:
    """What differs between the grid points, among the points each setting applies to."""
    from dpeval.leaderboard import varying_settings

    flats = [settings_of(s) for s in specs]
    names = [k for k in ("defense", "dataset", "model", "attacks") if len({repr(f[k]) for f in flats}) > 1]
    seeds = ["seed"] if len({f["seed"] for f in flats}) > 1 else []
    return names + varying_settings(flats) + seeds


def describe(spec: RunSpec, swept: list[str]) -> str:
    """``name=rs final_rate=0.5 epsilon=3 seed=0``: the swept settings that apply to this point only."""
    from dpeval.leaderboard import applies

    flat = settings_of(spec)
    names = {"privacy.target_epsilon": "epsilon"}
    parts = [f"{names.get(key, key.split('.')[-1])}={flat[key]}" for key in swept
             if key in ("defense", "dataset", "model", "attacks", "seed") or applies(flat, key)]
    return " ".join(dict.fromkeys(parts))  # a shared attack setting is stored once per attack: say it once
