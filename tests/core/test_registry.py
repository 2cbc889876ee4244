"""Plug-ins are discovered from their source without importing them; a configuration error never needs torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from dpeval.attacks import ATTACKS
from dpeval.core.errors import ConfigError
from dpeval.core.registry import DATASETS, MODELS, Registry
from dpeval.defenses import DEFENSES


@pytest.mark.parametrize("registry", [DEFENSES, ATTACKS, DATASETS, MODELS], ids=lambda r: r.kind)
def test_declared_names_are_the_registered_ones(registry):
    """Reading the source finds exactly what importing every module registers (and the same descriptions)."""
    declared = registry.declared()
    assert declared
    for name, declaration in declared.items():
        importlib.import_module(declaration.module)
        assert name in registry._items, name
        assert registry._descriptions[name] == declaration.description
        assert registry._details[name] == declaration.details  # e.g. a dataset's default_model
    assert set(registry._items) <= set(declared) | {n for n in registry._items if n.startswith("plugin-")}


def test_unknown_names_list_the_choices_without_importing():
    reg = Registry("defense", scan="dpeval.defenses", var="DEFENSES")
    with pytest.raises(ConfigError, match=r"defense: unknown defense 'nope'; choose one of: .*dpsgd"):
        reg.check("nope", field="defense")
    assert reg._items == {}  # nothing was imported to answer


def test_details_are_read_without_importing():
    reg = Registry("dataset", scan="dpeval.core.datasets", var="DATASETS")
    assert reg.detail("digits", "default_model") == "cnn3" and reg.detail("digits", "nope") is None
    assert reg._items == {}


BAD_FLAGS = [["--defense", "nope"], ["--epochs", "0"], ["--attack", "nope"], ["--dataset", "nope"],
             ["--model", "nope"], ["--set", "train.lr=-1"], ["--set", "privacy.delta=2"], ["--seed", "-1"]]


@pytest.mark.parametrize("flags", BAD_FLAGS, ids=lambda f: " ".join(f))
def test_a_bad_flag_is_answered_without_torch(flags):
    """Configuration errors outside a plug-in's own parameters are found before torch or any plug-in loads,
    which is what makes them answer at once (measured in docs/performance.md)."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom dpeval.cli import main\n"
            f"r = CliRunner().invoke(main, ['run', *{flags!r}])\n"
            "print(r.exit_code, 'torch' in sys.modules, any(m.startswith(('defenses.', 'attacks.')) and m not in "
            "('dpeval.defenses.registry', 'dpeval.attacks.registry') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["2", "False", "False"], out
