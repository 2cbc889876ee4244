"""Run configuration: the validated, canonical RunSpec and its run key.

A run is described by nested plain data (YAML file ← CLI flags ← ``--set dotted.key=value``). ``build_spec``
validates it against the dataclasses below: unknown keys are rejected with the list of valid ones, values
are type- and range-checked, and every failure is a ``ConfigError`` naming the dotted field. The defense's
parameters are validated by the chosen defense's own ``Params`` dataclass, the attacks' by theirs.

The canonical form is the fully-defaulted nested dict; the run key is a hash of it (``device`` excluded:
where a run executes does not change what it is).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError


@dataclass
class SyntheticConfig:
    """Shape, classes and size of the synthetic dataset (class prototypes plus noise)."""

    shape: list[int] = field(default_factory=lambda: [1, 8, 8])
    classes: int = 10
    size: int = 1000


@dataclass
class DataConfig:
    """Which dataset to load and how its roles (private train pool, test, public) are split."""

    name: str = "digits"
    root: str = "./data"
    download: bool = False
    split_seed: int = 0
    test_fraction: float = 0.2
    public_fraction: float = 0.1
    max_train: int = 0
    image_size: int = 32
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class ModelConfig:
    """Model registry name; ``None`` means the dataset's default model."""

    name: str | None = None


@dataclass
class PrivacyConfig:
    """Target privacy, or a fixed noise multiplier whose ε is reported.

    One of ``epsilon`` / ``noise_multiplier`` drives a DP run: with ``epsilon`` σ is calibrated, with
    ``noise_multiplier`` the ε of that σ is reported. Neither given: ε = 3. ``delta: null`` applies the
    rule in ``harness.accounting``.
    """

    epsilon: float | None = None
    delta: float | None = None
    noise_multiplier: float | None = None
    accountant: str = "rdp"


@dataclass
class TrainConfig:
    """Victim training. Defaults are tuned for the embedded digits data (see docs/configuration.md):
    Adam at lr 0.01 serves both DP-SGD (≈0.91 test accuracy at ε = 3) and the non-private baseline (≈0.97);
    the papers' SGD recipes are in configs/. ``momentum`` applies to SGD only."""

    epochs: int = 20
    batch_size: int = 128
    physical_batch_size: int = 256
    optimizer: str = "adam"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    sampling: str = "poisson"
    engine: str = "auto"


DEFAULT_EPSILON = 3.0

CHOICES: dict[str, tuple[str, ...]] = {
    "privacy.accountant": ("rdp", "prv"),
    "train.optimizer": ("sgd", "adam"),
    "train.lr_schedule": ("constant", "cosine", "step"),
    "train.sampling": ("poisson", "shuffle"),
    "train.engine": ("auto", "func", "lean"),
    "device": ("auto", "cpu", "cuda"),
}


@dataclass
class RunSpec:
    """Everything that defines one run. ``defense`` holds the defense's validated Params; ``attack`` maps
    each selected attack's name to its validated Params."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    defense_name: str = "dpsgd"
    defense: Any = None
    attacks: list[str] = field(default_factory=list)
    attack: dict[str, Any] = field(default_factory=dict)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    device: str = "auto"

    def canonical(self) -> dict[str, Any]:
        """The fully-defaulted nested form: what is hashed, stored and shown."""
        return {
            "data": dataclasses.asdict(self.data),
            "model": dataclasses.asdict(self.model),
            "defense": {"name": self.defense_name, **dataclasses.asdict(self.defense)},
            "attacks": list(self.attacks),
            "attack": {name: dataclasses.asdict(params) for name, params in sorted(self.attack.items())},
            "privacy": dataclasses.asdict(self.privacy),
            "train": dataclasses.asdict(self.train),
            "seed": self.seed,
            "device": self.device,
        }

    @property
    def run_key(self) -> str:
        content = {k: v for k, v in self.canonical().items() if k != "device"}
        blob = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------
# Loading and merging raw config data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file safely; malformed files are a ConfigError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"--config: malformed YAML in {path}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """Parse ``--set dotted.key=value``; values are YAML scalars/lists (``true``, ``0.5``, ``[1, 2]``)."""
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set: expected dotted.key=value, got {item!r}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        parsed.append((key, value))
    return parsed


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict, creating intermediate mappings."""
    parts = key.split(".")
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: depth + 1])}: is a value, cannot set {key}")
        node = child
    node[parts[-1]] = value


# ---------------------------------------------------------------------------------------------------
# Validation


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against a dataclass field type; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)]
        errors = []
        for option in inner:  # the first type that accepts the value wins
            try:
                return _coerce(value, option, where)
            except ConfigError as error:
                errors.append(error)
        for option, error in zip(inner, errors):  # the option of the value's own kind explains best
            if isinstance(value, typing.get_origin(option) or option):
                raise error
        if len(inner) == 1:
            raise errors[0]
        raise ConfigError(f"{where}: must be {' or '.join(_type_name(t) for t in inner)}, got {value!r}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list of {_type_name(item_tp)}, got {value!r}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a mapping with keys {', '.join(field_names(tp))}")
        return from_dict(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; take the number meant
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        if math.isinf(value):
            raise ConfigError(f"{where}: must be a finite number, got {value!r}")
        if math.isnan(value):
            raise ConfigError(f"{where}: must be a number, got nan")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {value!r}")
        return value
    return value


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types raise ConfigError."""
    hints = typing.get_type_hints(cls)
    names = field_names(cls)
    for key in data:
        if key not in names:
            prefix = f"{where}." if where else ""
            raise ConfigError(f"{prefix}{key}: unknown setting; valid keys here: {', '.join(names)}")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}" if where else key)
    return cls(**kwargs)


def check_range(where: str, value: float | None, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> None:
    """Raise ConfigError unless low (<|<=) value (<|<=) high; None skips the check."""
    if value is None:
        return
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high:
        lo = "" if low is None else f"{low} {'<' if low_open else '<='} "
        hi = "" if high is None else f" {'<' if high_open else '<='} {high}"
        raise ConfigError(f"{where}: must satisfy {lo}{where.split('.')[-1]}{hi}, got {value}")


def _check_choices(spec: RunSpec) -> None:
    values = {
        "privacy.accountant": spec.privacy.accountant,
        "train.optimizer": spec.train.optimizer,
        "train.lr_schedule": spec.train.lr_schedule,
        "train.sampling": spec.train.sampling,
        "train.engine": spec.train.engine,
        "device": spec.device,
    }
    for key, value in values.items():
        if value not in CHOICES[key]:
            raise ConfigError(f"{key}: must be one of {', '.join(CHOICES[key])}, got {value!r}")


def _check_ranges(spec: RunSpec) -> None:
    p, t = spec.privacy, spec.train
    check_range("privacy.epsilon", p.epsilon, low=0, low_open=True)
    check_range("privacy.delta", p.delta, low=0, high=1, low_open=True, high_open=True)
    check_range("privacy.noise_multiplier", p.noise_multiplier, low=0, low_open=True)
    check_range("train.epochs", t.epochs, low=1)
    check_range("train.batch_size", t.batch_size, low=1)
    check_range("train.physical_batch_size", t.physical_batch_size, low=1)
    check_range("train.lr", t.lr, low=0, low_open=True)
    check_range("train.momentum", t.momentum, low=0, high=1, high_open=True)
    check_range("train.weight_decay", t.weight_decay, low=0)
    check_range("seed", spec.seed, low=0)


def build_spec(raw: dict[str, Any]) -> RunSpec:
    """Validate nested raw config data into a RunSpec (all ConfigErrors name the field)."""
    # Imported here: the registries import config (for DataConfig), so importing them at module level
    # would be circular.
    from attacks import ATTACKS
    from defenses import DEFENSES

    raw = dict(raw)
    top = [f for f in field_names(RunSpec) if f != "defense_name"]
    for key in raw:
        if key not in top:
            raise ConfigError(f"{key}: unknown setting; valid top-level keys: {', '.join(top)}")

    defense_raw = raw.pop("defense", None) or {}
    if isinstance(defense_raw, str):
        defense_raw = {"name": defense_raw}
    if not isinstance(defense_raw, dict):
        raise ConfigError("defense: must be a defense name or a mapping with 'name' and its parameters")
    defense_raw = dict(defense_raw)
    defense_name = defense_raw.pop("name", "dpsgd")
    defense_cls = DEFENSES.get(str(defense_name), field="defense")
    defense_params = from_dict(defense_cls.Params, defense_raw, "defense")
    defense_params.validate()

    attacks = raw.pop("attacks", []) or []
    if isinstance(attacks, str):
        attacks = [attacks]
    attacks = [a for a in _coerce(attacks, list[str], "attacks") if a != "none"]
    if len(set(attacks)) != len(attacks):
        raise ConfigError(f"attacks: each attack may be listed once, got {attacks}")
    attack_classes = [ATTACKS.get(name, field="attack") for name in attacks]
    attack_raw = raw.pop("attack", None) or {}
    attack_params = _validate_attack_params(attack_raw, attacks, attack_classes)

    spec = from_dict(RunSpec, raw, "")
    spec.defense_name = str(defense_name)
    spec.defense = defense_params
    spec.attacks = attacks
    spec.attack = attack_params
    _check_choices(spec)
    _check_ranges(spec)
    if spec.privacy.epsilon is not None and spec.privacy.noise_multiplier is not None:
        raise ConfigError("privacy.noise_multiplier: give either privacy.epsilon (σ is calibrated) or "
                          "privacy.noise_multiplier (its ε is reported), not both")
    if spec.privacy.epsilon is None and spec.privacy.noise_multiplier is None:
        spec.privacy.epsilon = DEFAULT_EPSILON
    return spec


def _validate_attack_params(raw: Any, names: list[str], classes: list[type]) -> dict[str, Any]:
    """Attack parameters: ``attack.<param>`` applies to every selected attack that has that parameter
    (a name means the same thing in each), ``attack.<attack>.<param>`` to that attack alone; every attack
    keeps its own defaults. Returns ``{attack name: validated Params}``."""
    if not isinstance(raw, dict):
        raise ConfigError("attack: must be a mapping of attack parameters")
    shared = {k: v for k, v in raw.items() if k not in names}
    valid = sorted({f for cls in classes for f in field_names(cls.Params)})
    for key in shared:
        if key not in valid:
            allowed = ", ".join(valid) if valid else f"none (no parameters for attacks {names or '[]'})"
            raise ConfigError(f"attack.{key}: unknown setting; valid keys here: {allowed}")
    params: dict[str, Any] = {}
    for name, cls in zip(names, classes):
        fields = field_names(cls.Params)
        own = {k: v for k, v in shared.items() if k in fields}
        specific = raw.get(name, {})
        if not isinstance(specific, dict):
            raise ConfigError(f"attack.{name}: must be a mapping of {name}'s parameters")
        own.update(specific)
        params[name] = from_dict(cls.Params, own, f"attack.{name}" if specific else "attack")
        params[name].validate()
    return params
