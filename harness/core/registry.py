"""Name → object registries of defenses, attacks, datasets and models, discovered without importing them.

A plug-in registers with a decorator, ``@DEFENSES.register("name", "one-line description")``, in any module
of its package. The registry finds every such declaration by *reading* the package's source (the name and
description must be string literals) and imports a module only when one of its names is asked for. So
adding a defense, an attack, a dataset or a model is one new module, and checking a configuration
(``--defense nope``, ``--epochs 0``) imports neither the plug-ins nor torch: a bad flag answers at once.
Further facts about an entry are literal keywords of the same decorator, read the same way: a dataset names
the model a run uses when none is given, ``@DATASETS.register("digits", "…", default_model="cnn3")``.

Plug-ins from outside the package: another installed distribution declares entry points in the groups
``dpeval.defenses``, ``dpeval.attacks``, ``dpeval.datasets`` and ``dpeval.models``, each ``name = "module"``
(the module whose decorator registers ``name``). They are found through the installed distributions' metadata
and their modules' source is read from the distribution's files, so listing and checking still import nothing;
the module is imported when its name is asked for. A built-in name always wins: an entry point of a built-in's
name is ignored (with a one-line warning naming the plug-in and its distribution), and a plug-in module that
registers a built-in's name (``@DEFENSES.register("dpsgd", ...)`` in another module) is refused when it is
imported, so a run recorded as ``dpsgd`` is always the built-in DP-SGD. A broken plug-in — an entry point value
that is not a module name, a source that does not parse or is not UTF-8, a module or parent package that raises
when imported, a module that does not register its name — is reported in one line naming it and its distribution
when its name is asked for (and described as broken by ``dpeval list``); every other name keeps working. Nothing
of a plug-in is imported to list or check names: its source file is found from the distribution's file list or by
looking along ``sys.path`` without running any package's ``__init__`` (a plug-in found neither way is listed with
a generic description).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar, cast

from dpeval.core.errors import ConfigError, brief, printable
from dpeval.core.files import inside, plain_name

T = TypeVar("T")
log = logging.getLogger("dpeval")
# Reading the declarations (and registering) happens once per process, possibly from several threads at once
# (the Python API called from a thread pool): one lock for every registry, re-entrant because importing a plug-in
# module registers from inside ``get``. Each cache is published whole, never while it is filled.
_LOCK = threading.RLock()


@dataclass(frozen=True)
class Declaration:
    module: str
    description: str
    details: dict[str, Any]  # the literal keywords of its decorator
    attributes: dict[str, Any] = field(default_factory=dict)  # literal attributes set in the decorated class's body
    origin: str = ""   # a plug-in's: "the plug-in module M (distribution D)"; "" for a built-in
    broken: str = ""   # why a plug-in cannot be used (its entry point or source), "" when nothing is known wrong


class Registry(Generic[T]):
    """Maps a user-facing name to an object, with a one-line description for ``dpeval list``.

    ``scan`` names the package (every module in it) or the module whose ``@<var>.register(...)``
    decorators declare this registry's entries."""

    def __init__(self, kind: str, scan: str, var: str, group: str | None = None) -> None:
        self.kind = kind
        self.scan = scan
        self.var = var
        self.group = group  # the entry-point group of outside plug-ins (None: built-ins only)
        self._items: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}
        self._details: dict[str, dict[str, Any]] = {}
        self._declared: dict[str, Declaration] | None = None
        self._builtin: dict[str, Declaration] | None = None

    def register(self, name: str, description: str, **details: Any) -> Callable[[T], T]:
        """Register the decorated object as ``name``; ``details`` (literals, so the source tells them without
        an import) are read back by :meth:`detail`."""
        def decorator(obj: T) -> T:
            with _LOCK:
                return self._register(name, description, details, obj)

        return decorator

    def _register(self, name: str, description: str, details: dict[str, Any], obj: T) -> T:
        inside(".", name, f"{self._origin(getattr(obj, '__module__', None))}: the {self.kind} name it registers,")
        builtin = self.builtin().get(name)
        module = getattr(obj, "__module__", None)
        if builtin is not None and module != builtin.module:
            raise ConfigError(f"{self._origin(module)} registers the built-in {self.kind} name {name!r}; "
                              f"refused (a built-in name always means the built-in): rename it in the plug-in")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = obj
        self._descriptions[name] = description
        self._details[name] = details
        if isinstance(obj, type):
            cast(Any, obj).name = name  # a registered class knows its user-facing name
        return obj

    def builtin(self) -> dict[str, Declaration]:
        """The entries declared in the source of the package itself (read once, never imported)."""
        with _LOCK:
            if self._builtin is None:
                builtin = {}
                for module, path in _source_files(self.scan):
                    for name, description, details, attributes in _declarations(path, self.var):
                        builtin[name] = Declaration(module, description, details, attributes)
                self._builtin = builtin
            return self._builtin

    def declared(self) -> dict[str, Declaration]:
        """The built-in entries and those the entry points' modules declare (read once, never imported)."""
        with _LOCK:
            if self._declared is None:
                declared = dict(self.builtin())
                for name, declaration in _entry_point_declarations(self.group, self.var).items():
                    if name in declared:
                        log.warning("warning: %s", printable(f"the {self.kind} {name!r} of {declaration.origin} is "
                                                             f"ignored: a built-in {self.kind} has that name"))
                        continue
                    declared[name] = declaration
                self._declared = declared
            return self._declared

    def _origin(self, module: str | None) -> str:
        """"the plug-in module M (distribution D)" for a module an entry point names (or one of its submodules)."""
        for declaration in self.declared().values():
            if declaration.origin and module and (module + ".").startswith(declaration.module + "."):
                return declaration.origin
        return f"the plug-in module {module}"

    def check(self, name: str, field: str | None = None) -> None:
        """ConfigError naming the choices unless ``name`` is registered or declared (imports nothing)."""
        if name not in self:
            where = field or self.kind
            known = ", ".join(self.names()) or "(none registered yet)"
            raise ConfigError(f"{where}: unknown {self.kind} {brief(name)}; choose one of: {known}")

    def get(self, name: str, field: str | None = None) -> T:
        self.check(name, field)
        if name not in self._items:
            declaration = self.declared()[name]
            where = f"{field or self.kind}: the {self.kind} {brief(name)}"
            origin = declaration.origin or f"its module {declaration.module}"
            if declaration.broken:
                raise ConfigError(f"{where} cannot be loaded: {origin} is broken: {declaration.broken}")
            try:
                importlib.import_module(declaration.module)  # its decorator registers it
            except (Exception, SystemExit) as exc:  # whatever a plug-in raises at import is its failure, one line
                raise ConfigError(f"{where} cannot be loaded: {origin} fails to import "
                                  f"({type(exc).__name__}: {brief(str(exc), 300)})") from None
            if name not in self._items:
                raise ConfigError(f"{where} cannot be loaded: {origin} declares no {self.kind} {brief(name)} "
                                  f"(its entry point names it; the module must register it with "
                                  f"@{self.var}.register({name!r}, ...))")
        return self._items[name]

    def detail(self, name: str, key: str, field: str | None = None) -> Any:
        """The ``key=`` literal of ``name``'s registration, None when it gives none (imports nothing)."""
        self.check(name, field)
        details = self._details[name] if name in self._items else self.declared()[name].details
        return details.get(key)

    def loaded(self, name: str) -> bool:
        """Whether ``name``'s object is registered (its module imported), not only declared."""
        return name in self._items

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


def _module_source(dist: Any, module: str) -> Path | None:
    """The source file of ``module`` among a distribution's installed files, else found along ``sys.path`` by the
    path finder one package level at a time — never importing anything, not even a parent package's
    ``__init__`` (None when neither finds it, e.g. an editable install served by its own finder)."""
    stem = module.replace(".", "/")
    for file in dist.files or ():
        if str(file) in (f"{stem}.py", f"{stem}/__init__.py"):
            return Path(dist.locate_file(file))
    search: list[str] | None = None
    spec = None
    parts = module.split(".")
    for depth in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth + 1]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _is_module_name(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _entry_point_declarations(group: str | None, var: str) -> dict[str, Declaration]:
    """The plug-ins that installed distributions declare in entry-point ``group``: name -> declaration, with the
    description (and literal details) read from the module's source when it declares the name there."""
    if group is None:
        return {}
    from importlib.metadata import entry_points

    found: dict[str, Declaration] = {}
    try:
        points = list(entry_points(group=group))
    except Exception as exc:  # an installed distribution's metadata that does not parse: no plug-in is usable
        log.warning("warning: %s", printable(f"the installed plug-ins ({group}) cannot be listed: "
                                             f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        return found
    for ep in points:
        module = ep.value.split(":", 1)[0].strip()
        dist = ep.dist.name if ep.dist is not None else "unknown"
        origin = f"the plug-in module {printable(module, 100)} (distribution {printable(dist, 100)})"
        description, details, broken = f"(plug-in from {dist})", {}, ""
        try:
            if not plain_name(ep.name):  # names become folders (an attack's artefacts) and result keys
                raise ValueError(f"its entry point {group}: {printable(repr(ep.name), 100)} is not a plain name (one "
                                 f"name starting with a letter or digit, without a path separator)")
            if not _is_module_name(module):
                raise ValueError(f"its entry point {group}: {ep.name} = {ep.value!r} does not name a module")
            path = _module_source(ep.dist, module) if ep.dist is not None else None
            if path is not None and path.is_file():
                for name, text, keywords, _ in _declarations(path, var):
                    if name == ep.name:
                        description, details = text, keywords
        except (Exception, SystemExit) as exc:  # a plug-in's fault: reported when it is named, listed as broken
            if isinstance(exc, ValueError) and str(exc).startswith("its entry point"):
                broken = str(exc)
            else:
                broken = f"its source cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})"
            description = f"(broken plug-in from {dist}: {broken})"
        found[ep.name] = Declaration(module, description, details, origin=origin, broken=broken)
    return found


def _declarations(path: Path, var: str) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(name, description, literal keywords, literal class attributes) of every ``@<var>.register("name",
    "description", key=literal)`` decorator in a file (a keyword whose value is not a literal is left out:
    :meth:`Registry.detail` of an imported entry still has it); the attributes are those the decorated class's
    own body sets to literals (``headline, higher_leaks = "auc", True``), not inherited ones."""
    found = []
    # bytes: parsed as Python reads a source (UTF-8 unless a coding line says otherwise; anything else a SyntaxError)
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        for deco in getattr(node, "decorator_list", ()):
            if not (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr == "register"
                    and isinstance(deco.func.value, ast.Name) and deco.func.value.id == var and len(deco.args) >= 2):
                continue
            name, description = (a.value if isinstance(a, ast.Constant) else None for a in deco.args[:2])
            if isinstance(name, str) and isinstance(description, str):
                details = {k.arg: k.value.value for k in deco.keywords
                           if k.arg is not None and isinstance(k.value, ast.Constant)}
                attributes = class_literals(node) if isinstance(node, ast.ClassDef) else {}
                found.append((name, description, details, attributes))
    return found


def class_literals(node: ast.ClassDef) -> dict[str, Any]:
    """The attributes a class body sets to literals: ``a = 1``, ``a: int = 1``, ``a, b = 1, "x"``."""
    found: dict[str, Any] = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and isinstance(statement.value, ast.Constant):
            found[statement.target.id] = statement.value.value
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                found[target.id] = value.value
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                found.update({t.id: v.value for t, v in zip(target.elts, value.elts)
                              if isinstance(t, ast.Name) and isinstance(v, ast.Constant)})
    return found


def class_source_literals(module: str, name: str) -> dict[str, Any]:
    """``class_literals`` of the class ``name`` in ``module``'s source (read, not imported); {} when absent."""
    ((_, path),) = _source_files(module)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return class_literals(node)
    return {}


DATASETS: Registry = Registry("dataset", scan="dpeval.core.datasets", var="DATASETS", group="dpeval.datasets")
MODELS: Registry = Registry("model", scan="dpeval.core.models", var="MODELS", group="dpeval.models")
# ``model.name`` of a model a Python caller passed to ``dpeval.run(settings, model=factory)``: ``python:<its name>``,
# registered for that call only (a stored configuration naming one runs again only with the function passed again).
PYTHON_MODEL = "python:"


def default_model(dataset: str) -> str:
    """The model a run on ``dataset`` builds when ``model.name`` is not given: the ``default_model`` that the
    dataset's registration declares (read from the source, so nothing is imported)."""
    model = DATASETS.detail(dataset, "default_model", field="data.name")
    if model is None:
        raise ConfigError(f"model.name: dataset {brief(dataset)} declares no default model; name one with "
                          f"--model (dpeval list shows the models)")
    return model
