"""Run configuration assembly: the validated, canonical RunSpec (``dpeval.core.spec``) from raw settings.

A run is described by nested plain data (YAML file ← CLI flags ← ``--set dotted.key=value``). ``build_spec``
validates it against the declared settings (``dpeval.core.settings``) and the chosen defense's and attacks'
own ``Params``: unknown keys are rejected with the list of valid ones, values are type-, range- and
choice-checked from their declarations, and every failure is a ``ConfigError`` naming the dotted field.

A real data set's training defaults (``dpeval.core.dataset_defaults``) fill the keys the settings leave out
before validation; the spec records which (``RunSpec.defaults``).

The canonical form is the fully-defaulted nested dict; the run key is a hash of it (``device`` and ``defaults``
excluded: where a run executes does not change what it is, nor whether a value was given or defaulted).
"""

from __future__ import annotations

import copy
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from dpeval.core.dataset_defaults import fill_defaults, skipped
from dpeval.core.errors import ConfigError, brief, printable
from dpeval.core.params import coerce, field_names, from_dict
from dpeval.core.settings import DEFAULT_EPSILON
from dpeval.core.spec import RunSpec

log = logging.getLogger("dpeval")
_SAID: set[str] = set()  # the data-set recipe notes said in this process

# ---------------------------------------------------------------------------------------------------
# Loading and merging raw config data


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key written twice in one mapping (plain YAML keeps the last one silently).
    Keys merged in with ``<<`` may still be overridden: that is what a merge is for. An integer too long for
    Python to read (over ``sys.get_int_max_str_digits()`` digits, a ValueError) is a YAML error at its place."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(str(node.value))} characters, longer than Python reads "
                f"({sys.get_int_max_str_digits()} digits at most)", node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: SafeLoader explains that one itself
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {brief(key)} (first given at line {first + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


MAX_YAML_BYTES = 1 << 20      # a settings file or sweep is a few KB; far larger is a mistake or an attack
MAX_YAML_NODES = 100_000      # values after alias expansion: bounds a "billion laughs" alias bomb


class YamlTooLarge(yaml.YAMLError):
    """YAML over one of the limits above."""


def expanded_size(node: yaml.Node, sizes: dict[int, int] | None = None) -> int:
    """How many values ``node`` holds once every alias is expanded, counted on the composed graph (an
    alias is the same node object again), so a bomb is measured without being built."""
    sizes = {} if sizes is None else sizes
    if id(node) not in sizes:
        sizes[id(node)] = MAX_YAML_NODES + 1  # a node reached again while counting it: a recursive alias
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        total = 1
        for child in children:
            total += expanded_size(child, sizes)
            if total > MAX_YAML_NODES:
                break
        sizes[id(node)] = total
    return sizes[id(node)]


def parse_yaml(text: str) -> Any:
    """One YAML document, safely, refusing duplicate keys, more than ``MAX_YAML_BYTES`` of text and more
    than ``MAX_YAML_NODES`` values after alias expansion (``yaml.YAMLError`` saying which limit)."""
    if len(text) > MAX_YAML_BYTES:
        raise YamlTooLarge(f"{len(text)} characters; the limit is {MAX_YAML_BYTES}")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node) > MAX_YAML_NODES:
            raise YamlTooLarge(f"more than {MAX_YAML_NODES} values, counting each alias as what it expands "
                                 "to (an alias bomb?); write fewer values or fewer nested aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_settings_file(path: Path, label: str) -> bytes:
    """The bytes of a regular file of at most ``MAX_YAML_BYTES``. Checked with ``stat`` before opening, so
    a FIFO, a device or a socket is refused at once instead of blocking or reading without end."""
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{label}: {path} is a folder, not a YAML file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{label}: {path} is not a regular file (a FIFO, device or socket); name a YAML file")
    if info.st_size > MAX_YAML_BYTES:
        raise ConfigError(f"{label}: {path} is {info.st_size} bytes; a settings file may hold at most "
                          f"{MAX_YAML_BYTES}")
    with open(path, "rb") as handle:
        return handle.read(MAX_YAML_BYTES + 1)


def load_yaml(path: str | Path, label: str = "--config") -> dict[str, Any]:
    """Read a YAML settings file safely. A file that cannot be read, is not UTF-8 text, is malformed, holds
    a key twice, holds nothing or holds no mapping is a ConfigError naming ``label`` (the option or argument
    that gave the file) and the file."""
    path = Path(path)
    try:
        text = read_settings_file(path, label).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {printable(path, 200)}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: {path} is not a UTF-8 text (YAML) file: undecodable byte at offset "
                          f"{exc.start}") from None
    try:
        data = parse_yaml(text)
    except YamlTooLarge as exc:
        raise ConfigError(f"{label}: {path} holds {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{label}: malformed YAML in {path}{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"{label}: {path} is empty (no settings); write at least one setting in it")
    if not isinstance(data, dict):
        raise ConfigError(f"{label}: {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


def parse_set(items: list[str]) -> list[tuple[str, Any]]:
    """Parse ``--set dotted.key=value``; values are YAML scalars/lists (``true``, ``0.5``, ``[1, 2]``)."""
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set: expected dotted.key=value, got {brief(item)}")
        try:
            value = parse_yaml(raw) if raw.strip() else None
        except YamlTooLarge as exc:
            raise ConfigError(f"--set {brief(key)}: the value holds {exc}") from None
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


def refuse_recorded(raw: Any) -> None:
    """The user's settings (a YAML file, ``--set``, a sweep file, ``configure``) never carry ``defaults``: it is
    dpeval's record of the data-set defaults a run took, and a given one would be recorded although the run never
    took it. Only a stored run's settings read back (a ``RunSpec``'s canonical form) keep theirs."""
    if isinstance(raw, dict) and "defaults" in raw:
        raise ConfigError("defaults: recorded by dpeval (the data set's defaults a run took for keys it did not set), "
                          "not a setting: set the keys themselves (e.g. train.lr=0.05) and leave `defaults` out")


def build_spec(raw: dict[str, Any]) -> RunSpec:
    """Validate nested raw config data into a RunSpec (all ConfigErrors name the field).

    Everything but the chosen defense's and attacks' own parameters is checked first, from declarations
    and the registries' source-level names alone, so such errors answer without importing torch or any
    plug-in; then the chosen plug-ins are imported and their parameters checked."""
    from dpeval.attacks import ATTACKS
    from dpeval.core.registry import DATASETS, MODELS, PYTHON_MODEL, default_model
    from dpeval.defenses import DEFENSES

    raw = copy.deepcopy(raw)  # the data set's defaults fill nested sections: never the caller's
    top = [f for f in field_names(RunSpec) if f != "defense_name"]
    for key in raw:
        if key not in top:
            raise ConfigError(f"{key}: unknown setting; valid top-level keys: {', '.join(top)}")
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    note = skipped(raw, default_model)
    if note is not None and note not in _SAID:  # once per process: sweeps and resumes build a spec many times
        _SAID.add(note)
        log.warning(note)
    applied = fill_defaults(raw, default_model)

    defense_raw = raw.pop("defense", None) or {}
    if not isinstance(defense_raw, dict):
        raise ConfigError("defense: must be a defense name or a mapping with 'name' and its parameters")
    defense_raw = dict(defense_raw)
    defense_name = str(defense_raw.pop("name", "dpsgd"))
    attacks = raw.pop("attacks", []) or []
    if isinstance(attacks, str):
        attacks = [attacks]
    attacks = [a for a in coerce(attacks, list[str], "attacks") if a != "none"]
    if len(set(attacks)) != len(attacks):
        raise ConfigError(f"attacks: each attack may be listed once, got {attacks}")
    attack_raw = raw.pop("attack", None) or {}

    spec = from_dict(RunSpec, raw, "")  # data, model, privacy, train, seed, device
    DATASETS.check(spec.data.name, field="data.name")
    model = spec.model.name if spec.model.name is not None else default_model(spec.data.name)
    if model.startswith(PYTHON_MODEL) and model not in MODELS:
        function = model.removeprefix(PYTHON_MODEL)
        raise ConfigError(f"model.name: {brief(model)} is a model a Python caller passed as a function "
                          f"(dpeval.run(settings, model={printable(function, 60)})), known only during that call: run "
                          f"it again from Python with the same function as model=")
    MODELS.check(model, field="model.name")
    DEFENSES.check(defense_name, field="defense")
    for name in attacks:
        ATTACKS.check(name, field="attack")

    spec.defense_name = defense_name
    spec.defense = from_dict(DEFENSES.get(defense_name).Params, defense_raw, "defense")
    spec.attacks = attacks
    spec.attack = _validate_attack_params(attack_raw, attacks, [ATTACKS.get(name) for name in attacks])
    if spec.model.weights is not None:
        applied += _given_weights_states(spec, attack_raw)
    if spec.privacy.epsilon is None and spec.privacy.noise_multiplier is None:
        spec.privacy.epsilon = DEFAULT_EPSILON
    spec.defaults = [*spec.defaults, *(a for a in applied if a not in spec.defaults)]  # a stored run's, then new
    return spec


def _given_weights_states(spec: RunSpec, attack_raw: Any) -> list[str]:
    """A run from ``model.weights`` has two states, ``init`` (its own initialisation) and ``final`` (the given
    weights): an attack whose ``at`` the settings leave at a default naming others (``trajectory``) attacks
    ``final``. Returns the ``attack.<name>.at=final`` it set."""
    applied = []
    for name, params in spec.attack.items():
        own = attack_raw.get(name) if isinstance(attack_raw, dict) else None
        given = isinstance(attack_raw, dict) and "at" in attack_raw or isinstance(own, dict) and "at" in own
        if hasattr(params, "at") and not given and params.at not in ("init", "final"):
            params.at = "final"
            applied.append(f"attack.{name}.at=final")
    return applied


def _validate_attack_params(raw: Any, names: list[str], classes: list[type]) -> dict[str, Any]:
    """Attack parameters: ``attack.<param>`` applies to every selected attack that has that parameter
    (a name means the same thing in each), ``attack.<attack>.<param>`` to that attack alone; every attack
    keeps its own defaults. Returns ``{attack name: validated Params}``."""
    if not isinstance(raw, dict):
        raise ConfigError("attack: must be a mapping of attack parameters")
    shared = {k: v for k, v in raw.items() if k not in names}
    valid = sorted({f for cls in classes for f in field_names(cls.Params)}
                   | {short for name, cls in zip(names, classes) for short in short_names(name, cls)})
    for key in shared:
        if key not in valid:
            allowed = ", ".join(valid) if valid else f"none (no parameters for attacks {names or '[]'})"
            raise ConfigError(f"attack.{key}: unknown setting; valid keys here: {allowed}")
    params: dict[str, Any] = {}
    for name, cls in zip(names, classes):
        fields = field_names(cls.Params)
        specific = raw.get(name, {})
        if not isinstance(specific, dict):
            raise ConfigError(f"attack.{name}: must be a mapping of {name}'s parameters")
        own = _full_names(name, fields, {k: v for k, v in shared.items() if k in fields or k in short_names(name, cls)},
                          "attack")
        own.update(_full_names(name, fields, specific, f"attack.{name}"))
        params[name] = from_dict(cls.Params, own, f"attack.{name}" if specific else "attack")
    return params


def short_names(name: str, cls: type) -> dict[str, str]:
    """An attack's parameters named without its own prefix: ``{"iterations": "ig_iterations"}`` for ``ig``
    (``attack.ig.iterations`` and ``attack.ig.ig_iterations`` are the same setting; results keep the
    declared name)."""
    prefix = name.replace("-", "_") + "_"
    return {f[len(prefix):]: f for f in field_names(cls.Params) if f.startswith(prefix)}


def _full_names(name: str, fields: list[str], given: dict[str, Any], where: str) -> dict[str, Any]:
    """``given`` with short names replaced by the declared ones; both spellings of one setting is an error."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in given.items():
        full = key if key in fields else f"{name.replace('-', '_')}_{key}"
        full = full if full in fields else key  # unknown: from_dict names it
        if full in out:
            raise ConfigError(f"{where}.{key}: the same setting as {where}.{spelled[full]}; give it once")
        out[full], spelled[full] = value, key
    return out
