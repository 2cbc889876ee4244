"""What ``dpeval list`` shows: the registered defenses, attacks, datasets (with their default models) and models
with their one-line descriptions and, on request, every defense's and attack's parameter. Names and descriptions
are read from source (the registries' own descriptions), so listing imports neither torch nor a plug-in's module
unless its parameters are asked for."""

from __future__ import annotations

from typing import Any

from dpeval.attacks import ATTACKS
from dpeval.core.errors import ConfigError, printable
from dpeval.core.params import describe
from dpeval.core.registry import DATASETS, MODELS
from dpeval.defenses import DEFENSES


def catalogue(with_params: bool = False) -> dict[str, Any]:
    """``dpeval list --json``'s object: ``defenses``, ``attacks``, ``datasets``, ``models`` (name → description),
    ``default_models`` and, ``with_params``, ``parameters`` (and ``unavailable``: a broken plug-in's one-line
    reason instead of its parameters)."""
    data: dict[str, Any] = {"defenses": DEFENSES.describe(), "attacks": {"none": "no attack", **ATTACKS.describe()},
                            "datasets": DATASETS.describe(), "models": MODELS.describe()}
    defaults = {n: DATASETS.detail(n, "default_model") for n in DATASETS.names()}
    data["default_models"] = {n: m for n, m in defaults.items() if m is not None}
    params: dict[str, dict[str, Any]] = {}
    unavailable: dict[str, str] = {}  # --params: a broken plug-in's one-line reason instead of its parameters
    if with_params:  # only then are the modules (and torch) imported: names and descriptions are read from source
        for section, registry in (("defenses", DEFENSES), ("attacks", ATTACKS)):
            params[section] = {}
            for name in registry.names():
                try:
                    params[section][name] = describe(registry.get(name).Params)
                except ConfigError as exc:
                    unavailable[name] = str(exc)
        data["parameters"] = params
        if unavailable:
            data["unavailable"] = unavailable
    return data


def catalogue_text(data: dict[str, Any]) -> str:
    """The terminal listing of ``catalogue``'s object."""
    params = data.get("parameters", {})
    unavailable = data.get("unavailable", {})
    text = []
    for section in ("defenses", "attacks", "datasets", "models"):
        text.append(f"{section}:")
        for name, desc in data[section].items():
            model = data["default_models"].get(name) if section == "datasets" else None
            line = f"  {name:<16} {desc}" + (f" [default model: {model}]" if model else "")
            text.append(printable(line))  # a plug-in's name or description may hold terminal commands
            prefix = "defense" if section == "defenses" else "attack"
            if name in unavailable and section in params:
                text.append(printable(f"      (parameters unavailable: {unavailable[name]})"))
            for row in params.get(section, {}).get(name, []):
                allowed = f" ({row['allowed']})" if row["allowed"] else ""
                own = name.replace("-", "_") + "_"
                key = (f"{name}.{row['name'][len(own):]}" if prefix == "attack" and row["name"].startswith(own)
                       else row["name"])  # attack.ig.iterations, not attack.ig_iterations
                text.append(printable(f"      {prefix}.{key} = {row['default']!r}{allowed}: {row['help']}"))
    return "\n".join(text)
