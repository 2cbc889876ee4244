"""Name → object registries of defenses, attacks, datasets and models, discovered without importing them.

A plug-in registers with a decorator, ``@DEFENSES.register("name", "one-line description")``, in any module
of its package. The registry finds every such declaration by *reading* the package's source (the name and
description must be string literals) and imports a module only when one of its names is asked for. So
adding a defense, an attack, a dataset or a model is one new module, and checking a configuration
(``--defense nope``, ``--epochs 0``) imports neither the plug-ins nor torch: a bad flag answers at once.
Further facts about an entry are literal keywords of the same decorator, read the same way: a dataset names
the model a run uses when none is given, ``@DATASETS.register("digits", "…", default_model="cnn3")``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar, cast

from dpeval.core.errors import ConfigError, brief

T = TypeVar("T")


@dataclass(frozen=True)
class Declaration:
    module: str
    description: str
    details: dict[str, Any]  # the literal keywords of its decorator


class Registry(Generic[T]):
    """Maps a user-facing name to an object, with a one-line description for ``dpeval list``.

    ``scan`` names the package (every module in it) or the module whose ``@<var>.register(...)``
    decorators declare this registry's entries."""

    def __init__(self, kind: str, scan: str, var: str) -> None:
        self.kind = kind
        self.scan = scan
        self.var = var
        self._items: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}
        self._details: dict[str, dict[str, Any]] = {}
        self._declared: dict[str, Declaration] | None = None

    def register(self, name: str, description: str, **details: Any) -> Callable[[T], T]:
        """Register the decorated object as ``name``; ``details`` (literals, so the source tells them without
        an import) are read back by :meth:`detail`."""
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._descriptions[name] = description
            self._details[name] = details
            if isinstance(obj, type):
                cast(Any, obj).name = name  # a registered class knows its user-facing name
            return obj

        return decorator

    def declared(self) -> dict[str, Declaration]:
        """The entries declared in the source (read once, never imported)."""
        if self._declared is None:
            self._declared = {}
            for module, path in _source_files(self.scan):
                for name, description, details in _declarations(path, self.var):
                    self._declared[name] = Declaration(module, description, details)
        return self._declared

    def check(self, name: str, field: str | None = None) -> None:
        """ConfigError naming the choices unless ``name`` is registered or declared (imports nothing)."""
        if name not in self:
            where = field or self.kind
            known = ", ".join(self.names()) or "(none registered yet)"
            raise ConfigError(f"{where}: unknown {self.kind} {brief(name)}; choose one of: {known}")

    def get(self, name: str, field: str | None = None) -> T:
        self.check(name, field)
        if name not in self._items:
            importlib.import_module(self.declared()[name].module)  # its decorator registers it
        return self._items[name]

    def detail(self, name: str, key: str, field: str | None = None) -> Any:
        """The ``key=`` literal of ``name``'s registration, None when it gives none (imports nothing)."""
        self.check(name, field)
        details = self._details[name] if name in self._items else self.declared()[name].details
        return details.get(key)

    def names(self) -> list[str]:
        return sorted(set(self._items) | set(self.declared()))

    def describe(self) -> dict[str, str]:
        declared = self.declared()
        return {n: self._descriptions.get(n) or declared[n].description for n in self.names()}

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a plug-in for their own duration)."""
        self._items.pop(name)
        self._descriptions.pop(name)
        self._details.pop(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.declared()


def _source_files(target: str) -> list[tuple[str, Path]]:
    """(module name, file) of a module, or of every public module of a package."""
    spec = importlib.util.find_spec(target)
    if spec is None or spec.origin is None:
        raise ImportError(f"cannot find {target}")
    if not spec.submodule_search_locations:
        return [(target, Path(spec.origin))]
    folder = Path(spec.origin).parent
    return [(f"{target}.{p.stem}", p) for p in sorted(folder.glob("*.py")) if not p.stem.startswith("_")]


def _declarations(path: Path, var: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, literal keywords) of every ``@<var>.register("name", "description", key=literal)``
    decorator in a file (a keyword whose value is not a literal is left out: :meth:`Registry.detail` of an
    imported entry still has it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        for deco in getattr(node, "decorator_list", ()):
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr == "register"
                    and isinstance(deco.func.value, ast.Name) and deco.func.value.id == var and len(deco.args) >= 2):
                continue
            name, description = (a.value if isinstance(a, ast.Constant) else None for a in deco.args[:2])
            if isinstance(name, str) and isinstance(description, str):
                details = {k.arg: k.value.value for k in deco.keywords
                           if k.arg is not None and isinstance(k.value, ast.Constant)}
                found.append((name, description, details))
    return found


DATASETS: Registry = Registry("dataset", scan="dpeval.core.datasets", var="DATASETS")
MODELS: Registry = Registry("model", scan="dpeval.core.models", var="MODELS")


def default_model(dataset: str) -> str:
    """The model a run on ``dataset`` builds when ``model.name`` is not given: the ``default_model`` that the
    dataset's registration declares (read from the source, so nothing is imported)."""
    model = DATASETS.detail(dataset, "default_model", field="data.name")
    if model is None:
        raise ConfigError(f"model.name: dataset {brief(dataset)} declares no default model; name one with "
                          f"--model (dpeval list shows the models)")
    return model
