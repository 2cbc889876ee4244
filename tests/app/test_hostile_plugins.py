"""Plug-ins that try to take over a built-in name or are broken, installed as a distribution would be (a
``*.dist-info`` folder with entry points, on ``sys.path``). A built-in name always means the built-in; a broken
plug-in is reported in one line naming it and its distribution when it is named, and every other name keeps
working; listing names imports no plug-in (nor torch) and prints no terminal command a description carries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import dpeval
from dpeval.attacks import ATTACKS
from dpeval.cli import main
from dpeval.core.errors import ConfigError
from dpeval.core.registry import DATASETS, MODELS
from dpeval.defenses import DEFENSES

ROOT = Path(__file__).resolve().parents[2]
DIST = "hostile-plugin"
GOOD_DEFENSE = textwrap.dedent('''
    from dpeval.defenses import DEFENSES
    from dpeval.defenses.none import NoDefense

    @DEFENSES.register({name!r}, {description!r})
    class Plugin(NoDefense):
        pass
''')


def install(site: Path, modules: dict[str, str | bytes], entry_points: dict[str, str],
            group: str = "dpeval.defenses") -> None:
    """A distribution ``hostile-plugin`` in ``site``: its modules (path -> source) and entry points (name -> value)."""
    for path, source in modules.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(source if isinstance(source, bytes) else source.encode())
    info = site / "hostile_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on ``sys.path`` for one test's distribution; the registries see only the built-ins and it, and
    forget both (and the plug-in's modules) afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for registry in (DEFENSES, ATTACKS, DATASETS, MODELS):
        for name in registry.names():  # loaded now, so the copies below hold them (a module imports once)
            registry.get(name)
        for attr in ("_items", "_descriptions", "_details"):
            monkeypatch.setattr(registry, attr, dict(getattr(registry, attr)))
        monkeypatch.setattr(registry, "_declared", None)
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("hostile"):
            del sys.modules[name]


def one_line_refusal(call, *names: str) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in names), message
    return message


def builtin_dpsgd():
    return DEFENSES.get("dpsgd").__module__ == "dpeval.defenses.dpsgd"


# ------------------------------------------------------------------------------------------ taking over a name

SNEAKY = GOOD_DEFENSE.format(name="sneaky", description="looks harmless") + textwrap.dedent('''
    @DEFENSES.register("dpsgd", "not DP-SGD at all")
    class Fake(NoDefense):
        pass
''')


@pytest.mark.parametrize("first", ["sneaky", "dpsgd"])
def test_a_plugin_registering_a_builtin_name_is_refused_naming_it(site, first):
    """A sweep over [sneaky, dpsgd] (or [dpsgd, sneaky]) used to train the plug-in's class as 'dpsgd'."""
    install(site, {"hostile/sneaky.py": SNEAKY, "hostile/__init__.py": ""}, {"sneaky": "hostile.sneaky"})
    for name in (first, "sneaky" if first == "dpsgd" else "dpsgd"):
        if name == "dpsgd":
            assert builtin_dpsgd()
        else:
            one_line_refusal(lambda: DEFENSES.get("sneaky"), "hostile.sneaky", DIST,
                             "registers the built-in defense name 'dpsgd'")
    assert builtin_dpsgd()


def test_an_entry_point_with_a_builtin_name_is_ignored_with_a_warning_naming_it(site):
    install(site, {"hostile/fake.py": GOOD_DEFENSE.format(name="dpsgd", description="fake")},
            {"dpsgd": "hostile.fake"})
    listed = CliRunner().invoke(main, ["list", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout)["defenses"]["dpsgd"] != "fake"
    warning, = listed.stderr.strip().splitlines()
    assert "hostile.fake" in warning and DIST in warning and "ignored" in warning
    assert builtin_dpsgd()


# ------------------------------------------------------------------------------------------ broken plug-ins

BROKEN = {
    "syntax-error": ({"hostile/bad.py": "def broken(:\n"}, "hostile.bad"),
    "not-utf8": ({"hostile/bad.py": b"# caf\xe9\nX = 1\n"}, "hostile.bad"),
    "raises-at-import": ({"hostile/bad.py": "raise RuntimeError('plug-in exploded')\n"}, "hostile.bad"),
    "exits-at-import": ({"hostile/bad.py": "raise SystemExit(3)\n"}, "hostile.bad"),
    "parent-raises": ({"hostile/__init__.py": "raise RuntimeError('parent exploded')\n",
                       "hostile/bad.py": GOOD_DEFENSE.format(name="broken", description="d")}, "hostile.bad"),
    "value-not-a-module": ({}, "not a module!"),
}


@pytest.mark.parametrize("how", list(BROKEN))
def test_a_broken_plugin_breaks_only_its_own_name(site, how, tmp_path):
    modules, value = BROKEN[how]
    install(site, modules, {"broken": value})
    assert "broken" in DEFENSES.names() and builtin_dpsgd()
    one_line_refusal(lambda: DEFENSES.get("broken"), DIST, "cannot be loaded")
    assert dpeval.configure(defense="dpsgd").defense_name == "dpsgd"
    listed = CliRunner().invoke(main, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "broken" in json.loads(listed.stdout)["defenses"]
    # a run that names another defense reaches its own checks (here: a bad epoch count), not the plug-in's error
    ran = CliRunner().invoke(main, ["run", "--defense", "dpsgd", "--epochs", "0", "--results", str(tmp_path / "r")])
    assert ran.exit_code == 2 and "train.epochs" in ran.stderr and "Traceback" not in ran.stderr, ran.output
    named = CliRunner().invoke(main, ["run", "--defense", "broken", "--epochs", "1", "--results",
                                      str(tmp_path / "r")])
    assert named.exit_code == 2, named.output
    assert len(named.stderr.strip().splitlines()) == 1 and DIST in named.stderr, named.stderr


def test_unreadable_entry_point_metadata_breaks_no_builtin(site):
    """An ``entry_points.txt`` line without ``=`` makes importlib.metadata raise TypeError for the whole group."""
    info = site / "hostile_plugin-0.1.dist-info"
    install(site, {}, {})
    (info / "entry_points.txt").write_text("[dpeval.defenses]\nno value here\n")
    listed = CliRunner().invoke(main, ["list", "--json"])
    assert listed.exit_code == 0 and "dpsgd" in json.loads(listed.stdout)["defenses"], listed.output
    warnings = listed.stderr.strip().splitlines()  # one per registry that looked (each reads its own group)
    assert any("(dpeval.defenses) cannot be listed" in w for w in warnings)
    assert all("cannot be listed" in w for w in warnings), warnings
    assert builtin_dpsgd()


def test_list_with_params_reports_a_broken_plugin_in_one_line(site):
    install(site, {"hostile/bad.py": "raise RuntimeError('plug-in exploded')\n"}, {"broken": "hostile.bad"})
    listed = CliRunner().invoke(main, ["list", "--params"])
    assert listed.exit_code == 0, listed.output
    line, = [ln for ln in listed.stdout.splitlines() if "parameters unavailable" in ln]
    assert DIST in line and "plug-in exploded" in line
    assert "defense.clip" in listed.stdout  # the built-ins' parameters are still listed


# ------------------------------------------------------------------------------------------ listing

def test_list_imports_no_plugin_nor_torch_and_escapes_descriptions(tmp_path):
    """In a fresh process: ``dpeval list`` reads names and descriptions from the source only (a plug-in whose
    parent package would announce its import is never imported), and a description's ESC reaches the terminal as
    text, never as a terminal command."""
    site = tmp_path / "site"
    site.mkdir()
    install(site, {"hostile/__init__.py": "import sys\nsys.stderr.write('PARENT IMPORTED\\n')\n",
                   "hostile/slow.py": GOOD_DEFENSE.format(name="slow", description="red \x1b[31mALERT\x1b[0m")},
            {"slow": "hostile.slow"})
    code = ("import sys\nfrom dpeval.cli import main\ntry:\n    main(['list'])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert not [m for m in sys.modules if m.startswith('hostile')], 'plug-in imported'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "PARENT IMPORTED" not in proc.stderr
    line, = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("slow")]
    assert "\x1b" not in proc.stdout and "red \\x1b[31mALERT" in line
