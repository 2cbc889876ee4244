"""The attacker's boundary, checked from source: a module that registers an attack sees only the ``AttackerView``
(``dpeval.attacks.view``) and what its family's game hands it; the private pool stays with the game.

The same check runs over every built-in attack (``tests/test_layers.py``) and over a plug-in's modules
(``dpeval check-attack FILE_OR_MODULE``): static, by parsing, so a module is checked without being imported.
Reported: importing a module or object that reaches the private pool or the held-out split, naming or taking a
``task``, reading a game accessor, overriding ``play`` (the game's), naming the victim's random streams or
building its own ``Streams``.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

# modules and objects that reach the private pool or the held-out split
POOL_MODULES = ("dpeval.core.datasets", "dpeval.runner", "dpeval.api")
POOL_OBJECTS = {"dpeval.core.splits.Task", "dpeval.attacks.gradient_game.draw_targets",
                "dpeval.attacks.gradient_game.select_targets", "dpeval.attacks.shadow_signals.population",
                "dpeval.attacks.membership_game.plan_game", "dpeval.attacks.membership_game.shadow_pool",
                "dpeval.attacks.informed_game.check_pool", "dpeval.attacks.informed_game.draw_pool"}
POOL_ACCESSORS = {name.rsplit(".", 1)[1] for name in POOL_OBJECTS}  # also reached as ``module.name``


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute name) of every import of a parsed module, including names imported from a package
    (``from dpeval.core import streams`` yields ``dpeval.core.streams``); relative imports are skipped."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def boundary_violations(path: Path) -> list[str]:
    """What the module at ``path`` does past the attacker's boundary, one line each (empty: nothing)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [f"imports {name}" for _, name in imported_modules(tree)
           if name in POOL_OBJECTS or any(name == m or name.startswith(m + ".") for m in POOL_MODULES)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in ("task", "Task"):
            bad.append(f"line {node.lineno}: names {node.id}")
        elif isinstance(node, ast.arg) and node.arg == "task":
            bad.append(f"line {node.lineno}: takes task")
        elif isinstance(node, ast.Attribute) and node.attr in POOL_ACCESSORS | {"task"}:
            bad.append(f"line {node.lineno}: reads .{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name == "play":
            bad.append(f"line {node.lineno}: overrides play (the game's)")
        elif isinstance(node, ast.Constant) and node.value == "victim":
            bad.append(f"line {node.lineno}: names the victim's random streams")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Streams":
            bad.append(f"line {node.lineno}: builds its own Streams")
    return bad


def source_of(target: str) -> Path:
    """A file path as given, or the source file of a module name (found without importing the module itself)."""
    path = Path(target)
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"{target}: no such file")
        return path
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"{target}: neither a file nor an importable module with Python source")
    return Path(spec.origin)
