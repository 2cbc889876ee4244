"""Parameters declared once: default, allowed values and help text live in dataclass field metadata.

Every knob of dpeval (the settings in ``dpeval.core.settings``, each defense's and each attack's
``Params``) is a dataclass field made with :func:`param`. From that one declaration come

- type checking and coercion of user input (``from_dict``), with errors naming the dotted field;
- range and choice checks (``check_declared``), so a ``validate`` method only holds cross-field rules;
- every float setting within float32's range (``check_float32``): dpeval's tensors are float32, where a larger
  value becomes inf and a nonzero one below 1.4e-45 becomes 0 once the run has started; ``noise_scale`` marks a
  setting that σ multiplies into a noise std, whose draws are checked the same way once σ is known
  (``check_noise_scales``);
- the help text of ``dpeval list`` and the tables of docs/configuration.md (``params_table``), which a
  test regenerates and compares with the docs.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field, fields, is_dataclass
from typing import Any

from dpeval.core.errors import ConfigError, brief

_MISSING = dataclasses.MISSING


def param(default: Any = _MISSING, help: str = "", *, factory: Any = None, low: float | None = None,
          high: float | None = None, low_open: bool = False, high_open: bool = False,
          choices: tuple[str, ...] | None = None, added: bool = False, keyed: bool = True,
          noise_scale: bool = False) -> Any:
    """A declared parameter: ``low``/``high`` bound numbers (``*_open`` for strict bounds), ``choices``
    lists the allowed strings, ``help`` is the one-line description shown to users. ``noise_scale=True`` marks a
    bound that the noise multiplier σ scales into a noise std (a clip norm): σ times it must stay a float32.

    ``added=True`` marks a setting added after results were stored: while it holds its default it is left
    out of the run key, so every stored run keeps its key (sweeps still find their finished points, resumes
    their checkpoints) and only runs that change it get a new one. Every setting added to a released
    version is declared so. ``keyed=False`` marks a setting that cannot change results (how often to
    checkpoint): never part of the run key, like ``device``."""
    meta = {"help": help, "low": low, "high": high, "low_open": low_open, "high_open": high_open,
            "choices": tuple(choices) if choices else None, "added": added, "keyed": keyed,
            "noise_scale": noise_scale}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def unkeyed(obj: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of ``obj``'s settings (nested Params included) left out of the run key: ``keyed=False`` ones,
    and ``added`` ones that hold their defaults."""
    found = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        at_default = value == default_of(f)
        if f.metadata.get("keyed") is False or (f.metadata.get("added") and at_default):
            found.append((*path, f.name))
        elif is_dataclass(value):
            found += unkeyed(value, (*path, f.name))
    return found


class Params:
    """Base of every parameter dataclass. ``validate`` holds cross-field rules only (ranges and choices are
    declared with :func:`param` and checked before it); it raises ConfigError naming ``<prefix>.<field>``."""

    def validate(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------------
# checks


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


# float32's largest finite value and smallest nonzero magnitude (torch.finfo(torch.float32).max, .smallest_normal
# / 2**23): what the tensors a setting becomes can hold.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45


def check_float32(where: str, value: float, what: str = "") -> None:
    """Raise ConfigError unless ``value`` (``what`` describes it, default the setting itself) is a float32: at most
    FLOAT32_MAX in magnitude, and 0 or at least FLOAT32_TINY (a smaller one would become 0)."""
    if abs(value) > FLOAT32_MAX or 0 < abs(value) < FLOAT32_TINY:
        raise ConfigError(f"{where}: {what or where.split('.')[-1]} must lie within float32's range (0 or "
                          f"{FLOAT32_TINY:.3g} to {FLOAT32_MAX:.4g} in magnitude; it becomes a float32 tensor), "
                          f"got {value:.4g}")


NOISE_TAIL = 16  # a Gaussian draw is std·z with |z| < 16 (P < 1e-57 a draw): std·16 must be a float32 too


def check_noise_scales(obj: Any, prefix: str, noise_multiplier: float) -> None:
    """Check each ``noise_scale`` setting of ``obj`` times σ (a noise std) and the Gaussian tail against float32's
    range, once σ is known (given, or calibrated for the target ε) and before anything trains."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("noise_scale") and isinstance(value, float):
            check_float32(f"{prefix}.{f.name}", NOISE_TAIL * noise_multiplier * value,
                          f"the noise's reach {NOISE_TAIL}·σ·{f.name} (σ = {noise_multiplier:.4g})")


def check_choice(where: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}, got {brief(value)}")


def check_declared(obj: Any, prefix: str) -> None:
    """Check every field of dataclass ``obj`` against its declared range / choices."""
    for f in dataclasses.fields(obj):
        meta = f.metadata
        if not meta:
            continue
        value = getattr(obj, f.name)
        where = f"{prefix}.{f.name}" if prefix else f.name
        if meta.get("choices") and isinstance(value, str):
            check_choice(where, value, meta["choices"])
        if (meta.get("low") is not None or meta.get("high") is not None) and _is_number(value):
            check_range(where, value, low=meta["low"], high=meta["high"], low_open=meta["low_open"],
                        high_open=meta["high_open"])
        if isinstance(value, float):  # coerce made every number of a float setting a float
            check_float32(where, value)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---------------------------------------------------------------------------------------------------
# building dataclasses from user data


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
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
                return coerce(value, option, where)
            except ConfigError as error:
                errors.append(error)
        for option, failure in zip(inner, errors):  # the option of the value's own kind explains best
            if isinstance(value, typing.get_origin(option) or option):
                raise failure
        if len(inner) == 1:
            raise errors[0]
        raise ConfigError(f"{where}: must be {' or '.join(_type_name(t) for t in inner)}, got {brief(value)}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list of {_type_name(item_tp)}, got {brief(value)}")
        return [coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a mapping with keys {', '.join(field_names(tp))}")
        return from_dict(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {brief(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string; take the number meant
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {brief(value)}")
        if math.isinf(value):
            raise ConfigError(f"{where}: must be a finite number, got {brief(value)}")
        if math.isnan(value):
            raise ConfigError(f"{where}: must be a number, got nan")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {brief(value)}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from ``data``: unknown keys, wrong types, declared ranges / choices and the
    class's own ``validate`` rules raise ConfigError naming the field."""
    hints = typing.get_type_hints(cls)
    names = field_names(cls)
    for key in data:
        if key not in names:
            prefix = f"{where}." if where else ""
            valid = ", ".join(names) if names else "none (this takes no parameters)"
            raise ConfigError(f"{prefix}{key}: unknown setting; valid keys here: {valid}")
    kwargs = {key: coerce(value, hints[key], f"{where}.{key}" if where else key) for key, value in data.items()}
    obj = cls(**kwargs)
    check_declared(obj, where)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


# ---------------------------------------------------------------------------------------------------
# describing parameters (dpeval list, docs/configuration.md)


def _bound_text(v: float) -> str:
    if isinstance(v, int) and v > 1 and v & (v - 1) == 0 and v >= 2**16:
        return f"2^{v.bit_length() - 1}"
    return f"{v:g}"


def allowed_text(meta: Any) -> str:
    """The declared allowed values in words: ``one of a, b``, ``> 0``, ``[0, 1)``."""
    if meta.get("choices"):
        return "one of " + ", ".join(meta["choices"])
    low, high = meta.get("low"), meta.get("high")
    if low is not None and high is not None:
        return (f"{'(' if meta['low_open'] else '['}{_bound_text(low)}, {_bound_text(high)}"
                f"{')' if meta['high_open'] else ']'}")
    if low is not None:
        return f"{'>' if meta['low_open'] else '>='} {_bound_text(low)}"
    if high is not None:
        return f"{'<' if meta['high_open'] else '<='} {_bound_text(high)}"
    return ""


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return None


def describe(cls: type) -> list[dict[str, Any]]:
    """One entry per declared field: name, type, default, allowed values, help (nested dataclasses
    flattened with dotted names)."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows += [dict(r, name=f"{f.name}.{r['name']}") for r in describe(tp)]
            continue
        rows.append({"name": f.name, "type": _type_text(tp), "default": default_of(f),
                     "allowed": allowed_text(f.metadata) if f.metadata else "",
                     "help": f.metadata.get("help", "") if f.metadata else ""})
    return rows


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if t is type(None) else _type_text(t) for t in typing.get_args(tp))
    if origin is list:
        return f"list[{_type_text(typing.get_args(tp)[0])}]"
    return {bool: "bool", int: "int", float: "float", str: "str"}.get(tp, _type_name(tp))


def _yaml_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def params_table(cls: type, prefix: str) -> str:
    """A markdown table of ``cls``'s parameters under ``prefix`` (the docs' configuration reference)."""
    lines = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for row in describe(cls):
        key = f"{prefix}.{row['name']}" if prefix else row["name"]
        cells = [f"`{key}`", row["type"], f"`{_yaml_text(row['default'])}`", row["allowed"], row["help"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
