"""A tiny name -> object registry shared by defenses, attacks, datasets and models."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, TypeVar

from harness.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps a user-facing name to an object, with a one-line description for ``dpeval list``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}

    def register(self, name: str, description: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            self._descriptions[name] = description
            if isinstance(obj, type):
                obj.name = name  # a registered class knows its user-facing name
            return obj

        return decorator

    def get(self, name: str, field: str | None = None) -> T:
        if name not in self._items:
            where = field or self.kind
            known = ", ".join(self.names()) or "(none registered yet)"
            raise ConfigError(f"{where}: unknown {self.kind} {name!r}; choose one of: {known}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def describe(self) -> dict[str, str]:
        return {name: self._descriptions[name] for name in self.names()}

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a plug-in for their own duration)."""
        self._items.pop(name)
        self._descriptions.pop(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items


def import_submodules(package_name: str, skip: tuple[str, ...] = ()) -> None:
    """Import every module of a package so their ``@register`` decorators run.

    Adding a defense or an attack is then one new module: nothing else needs editing.
    """
    package = importlib.import_module(package_name)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in skip and not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")
