"""The layering stays one-way: every module of the project is parsed and each import checked against its layer.

The installed package is ``dpeval``; its folders keep the repository's layout (pyproject's package-dir):

    layer         package            folder           may import
    core          dpeval.core        harness/core     core
    defenses      dpeval.defenses    defenses/        core, defenses
    engine        dpeval.engine      harness/engine   core, defenses, engine
    attacks       dpeval.attacks     attacks/         core, engine, attacks, and dpeval.defenses.base (no other defense)
    application   dpeval (the rest)  harness/         everything

Each layer imports itself and the layers above it in this table, never one below. Imports inside functions
count too (a lazy import is still a dependency). ``dpeval`` itself (the package's ``__init__``: the version and
the public API's lazy names) may be imported from anywhere.

Within the attacks layer, a module that registers an attack (and the plug-in fixture) stays on the attacker's
side of the threat model: it sees the ``AttackerView`` and what its family's game hands it, nothing that
reaches the private pool (see ``boundary_violations``).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from dpeval import boundary

ROOT = Path(__file__).resolve().parents[1]
# package -> folder, as pyproject's [tool.setuptools.package-dir] maps them
FOLDERS = {"dpeval.defenses": ROOT / "defenses", "dpeval.attacks": ROOT / "attacks", "dpeval": ROOT / "harness"}
# The layers in import order: each may import itself and those before it.
LAYERS = (("core", "dpeval.core"), ("defenses", "dpeval.defenses"), ("engine", "dpeval.engine"),
          ("attacks", "dpeval.attacks"), ("application", "dpeval"))
ALLOWED = {layer: tuple(name for name, _ in LAYERS[:i + 1]) for i, (layer, _) in enumerate(LAYERS)}
ALLOWED["attacks"] = tuple(n for n in ALLOWED["attacks"] if n != "defenses") + ("defenses-base",)


def module_name(path: Path) -> str:
    for package, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise AssertionError(f"{path} is in no package folder")


def module_path(name: str) -> Path | None:
    """The file of a module or package of the project, None if the name is none of its modules."""
    for package, folder in FOLDERS.items():
        if name == package or name.startswith(package + "."):
            base = folder.joinpath(*name[len(package):].strip(".").split(".")) if name != package else folder
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def layer_of(module: str) -> str:
    if module == "dpeval":
        return "version"
    for layer, prefix in sorted(LAYERS, key=lambda lp: -len(lp[1])):  # the longest package prefix first
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return "external"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, including names imported from a package
    (``from dpeval.core import streams`` yields ``dpeval.core.streams``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}:{node.lineno}: relative import; use absolute imports")
    return found


def project_modules() -> list[Path]:
    return sorted(p for folder in FOLDERS.values() for p in folder.rglob("*.py"))


def kind_of(imported: str) -> str | None:
    """The layer an imported name belongs to (``defenses-base`` for the defenses' interfaces), or None for
    names that are not the project's (or a ``from package import name`` that is not a module)."""
    if imported == "dpeval.defenses.base" or imported.startswith("dpeval.defenses.base."):
        return "defenses-base"
    layer = layer_of(imported)
    return None if layer in ("external", "version") else layer


def is_module(name: str) -> bool:
    return module_path(name) is not None


def import_violations(path: Path, module: str) -> list[str]:
    """The imports of the file at ``path``, read as the project module ``module``, that go against its layer."""
    layer = layer_of(module)
    bad = []
    for line, imported in imported_modules(path):
        if not is_module(imported):
            continue  # ``from x import function``: x itself was checked
        kind = kind_of(imported)
        if kind is None:
            continue
        allowed = ALLOWED[layer]
        if kind in allowed or (kind == "defenses-base" and "defenses" in allowed):
            continue
        bad.append(f"{path.name if not path.is_relative_to(ROOT) else path.relative_to(ROOT)}:{line}: "
                   f"{layer} imports {imported} ({kind})")
    return bad


def violations() -> list[str]:
    return [b for path in project_modules() for b in import_violations(path, module_name(path))]


def test_no_module_imports_the_folder_names():
    """Nothing imports ``harness``, ``defenses`` or ``attacks`` as top-level names: the folders exist only under
    their ``dpeval`` names (an import of a folder name would work from the repository's root and nowhere else)."""
    folders = ("harness", "defenses", "attacks")
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for folder in ("harness", "defenses", "attacks", "tests", "bench")
           for path in sorted((ROOT / folder).rglob("*.py")) for line, name in imported_modules(path)
           if name.split(".")[0] in folders]
    assert not bad, bad


def edits_of_the_import_path(path: Path) -> list[int]:
    """Lines of ``path`` that change ``sys.path`` (a call on it, or an assignment to it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if isinstance(node, ast.Assign | ast.AugAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if isinstance(target, ast.Attribute) and target.attr == "path" and isinstance(target.value, ast.Name) \
                and target.value.id == "sys":
            lines.append(node.lineno)
    return sorted(lines)


def test_no_package_module_or_script_edits_the_import_path(tmp_path):
    """The package and bench/'s scripts import what is installed and, for a script, what sits beside it (a
    script's own folder is on its path): none edits ``sys.path``. Checked on a planted edit first."""
    planted = tmp_path / "planted.py"
    planted.write_text("import sys\nsys.path.insert(0, 'x')\nsys.path = ['y']\nsys.path += ['z']\n")
    assert edits_of_the_import_path(planted) == [2, 3, 4]
    bad = [f"{path.relative_to(ROOT)}:{line}" for folder in ("harness", "defenses", "attacks", "bench")
           for path in sorted((ROOT / folder).rglob("*.py")) for line in edits_of_the_import_path(path)]
    assert not bad, bad


def test_the_package_dir_matches_the_folders():
    """pyproject maps exactly these folders and lists every package in them."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {package: ROOT / folder for package, folder in tool["package-dir"].items()}
    assert mapped == FOLDERS
    packages = {module_name(init.parent / "__init__.py") for folder in FOLDERS.values()
                for init in folder.rglob("__init__.py")}
    assert set(tool["packages"]) == packages


def test_every_project_module_is_in_a_layer():
    assert project_modules(), "no modules found"
    assert all(layer_of(module_name(p)) != "external" for p in project_modules())


def test_imports_go_one_way():
    bad = violations()
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


def test_the_checker_catches_an_upward_import(tmp_path):
    """The checker itself can fail: a core module importing the engine is reported (the probe is read as a core
    module from a temporary folder: nothing is written into the package)."""
    fake = tmp_path / "_layer_probe_tmp.py"
    fake.write_text("from dpeval.engine.training import train\nimport dpeval.attacks.base\n")
    bad = import_violations(fake, "dpeval.core._layer_probe_tmp")
    assert any("_layer_probe_tmp.py:1: core imports dpeval.engine.training" in b for b in bad)
    assert any("_layer_probe_tmp.py:2: core imports dpeval.attacks.base" in b for b in bad)


@pytest.mark.parametrize("path", ["harness/audit", "attacks"])
def test_no_concrete_defense_module(path):
    """The audit and the attacks know defenses only through their declared interfaces."""
    interfaces = {"dpeval.defenses.base", "dpeval.defenses.auditing", "dpeval.defenses.registry"}
    concrete = []
    for file in sorted((ROOT / path).rglob("*.py")):
        for line, imported in imported_modules(file):
            if imported.startswith("dpeval.defenses.") and is_module(imported) and imported not in interfaces:
                concrete.append(f"{file.relative_to(ROOT)}:{line}: {imported}")
    assert not concrete, concrete


def test_no_file_cites_what_the_repository_does_not_contain():
    """No design document outside the repository, no internal issue numbers, no sibling folders."""
    pattern = re.compile(r"\b" + "DESIGN" + r"\.md\b|\b[Ii]ssue [0-9]+\b|\.\./" + "shared")
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml", "*.yml", "*.toml", "Makefile"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    cited = [f for f in files if pattern.search((ROOT / f).read_text(errors="replace"))]
    assert not cited, cited


def test_the_architecture_lists_every_module():
    """docs/architecture.md has a section per layer, headed with its folder: every module of the folder (its
    ``__init__`` aside) is a row (`` `name.py` ``), every sub-package that is no layer of its own a row
    (`` `name/` ``) naming each of its modules (`` `module` ``)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    sections = dict(re.findall(r"^### dpeval[.\w]* \(([\w/]+/)\)\n(.*?)(?=^#)", doc, flags=re.S | re.M))
    assert set(sections) == {"harness/core/", "defenses/", "harness/engine/", "attacks/", "harness/"}, set(sections)
    missing = []
    for folder, text in sections.items():
        rows = text.splitlines()
        missing += [f"{folder}{m.name}" for m in sorted((ROOT / folder).glob("*.py"))
                    if m.name != "__init__.py" and f"`{m.name}`" not in text]
        for package in sorted(p.parent for p in (ROOT / folder).glob("*/__init__.py")):
            if f"{folder}{package.name}/" in sections:
                continue  # a layer of its own, with its own section
            row = next((r for r in rows if r.startswith(f"| `{package.name}/`")), "")
            missing += [f"{folder}{package.name}/{m.name}" for m in sorted(package.glob("*.py"))
                        if not row or (m.stem != "__init__" and f"`{m.stem}`" not in row)]
    assert not missing, "modules docs/architecture.md does not list: " + ", ".join(missing)


def test_docs_links_resolve():
    """Every relative link in the docs and the README points at a file of the repository."""
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} → {target}")
    assert not broken, broken


# ------------------------------------------------------------------------------------------------------------
# The threat-model boundary (dpeval.boundary): a module that registers an attack sees only the AttackerView
# (attacks/view.py) and what its family's game hands it; the private pool stays with the game.

FIXTURE_ATTACK = ROOT / "tests" / "fixtures" / "plugin_attack.py"


def registers_attack(path: Path) -> bool:
    """Whether a class of the module is decorated with ``ATTACKS.register(...)``."""
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "register"
               and isinstance(d.func.value, ast.Name) and d.func.value.id == "ATTACKS"
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
               for d in node.decorator_list)


def attack_modules() -> list[Path]:
    """Every module that registers an attack, and the plug-in fixture."""
    return [p for p in sorted((ROOT / "attacks").rglob("*.py")) if registers_attack(p)] + [FIXTURE_ATTACK]


def boundary_violations(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}: {b}" for b in boundary.boundary_violations(path)]


def test_every_registered_attack_is_checked_for_the_boundary():
    """The check covers the module of every registered attack (nothing escapes by where it is defined)."""
    import importlib

    from dpeval.attacks import ATTACKS

    registered = "plugin-confidence" in ATTACKS
    module = importlib.import_module("tests.fixtures.plugin_attack")
    if "plugin-confidence" not in ATTACKS:
        importlib.reload(module)  # registers again after an earlier test's teardown
    try:
        modules = {Path(importlib.import_module(ATTACKS.get(n).__module__).__file__).resolve() for n in ATTACKS.names()}
    finally:
        if not registered:
            ATTACKS.unregister("plugin-confidence")
    assert FIXTURE_ATTACK.resolve() in modules and (ROOT / "attacks" / "ig.py").resolve() in modules
    assert modules <= {p.resolve() for p in attack_modules()}


def test_attacks_never_reach_the_private_pool():
    bad = [b for path in attack_modules() for b in boundary_violations(path)]
    assert not bad, "attack modules reaching past the AttackerView:\n" + "\n".join(bad)


def test_the_boundary_check_catches_an_attack_reading_the_pool(tmp_path):
    """Positive control: an attack module that imports the task, plays its own game, reads the pool through a
    game accessor and draws the victim's noise is reported for each."""
    probe = tmp_path / "_boundary_probe_tmp.py"  # outside the package: the check reads any file
    probe.write_text(
        "from dpeval.core.splits import Task\n"
        "from dpeval.attacks import gradient_game as gc\n"
        "from dpeval.attacks.gradient_game import ReconstructionAttack\n"
        "from dpeval.attacks.registry import ATTACKS\n"
        "from dpeval.core.streams import Streams\n"
        "\n"
        "@ATTACKS.register('probe', 'reads the pool')\n"
        "class Probe(ReconstructionAttack):\n"
        "    def play(self, view, task):\n"
        "        noise = Streams(0).scope('victim')\n"
        "        return gc.draw_targets(view, task, self.params)\n"
        "\n"
        "from dpeval.attacks.informed_game import draw_pool\n")
    assert registers_attack(probe)  # attack_modules() would pick it up in attacks/
    bad = "\n".join(boundary.boundary_violations(probe))
    for expected in ("imports dpeval.core.splits.Task", "line 9: overrides play", "line 9: takes task",
                     "line 10: builds its own Streams", "line 10: names the victim's random streams",
                     "line 11: reads .draw_targets", "line 11: names task",
                     "imports dpeval.attacks.informed_game.draw_pool"):
        assert expected in bad, (expected, bad)
