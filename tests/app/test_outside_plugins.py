"""Plug-ins from outside the package: a separately installed distribution adds a defense and an attack through
entry points (``dpeval.defenses``, ``dpeval.attacks``), and a model whose own layer it teaches the lean engine
(``dpeval.models``, ``register_kernel``). The test pip-installs a tiny plug-in package (into a
target folder on ``PYTHONPATH``, so the project's virtualenv is left as it was) and uses it through ``dpeval
list``, ``dpeval run``, ``dpeval check-attack`` and the Python API, in fresh processes that see only what is
installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def plugin_source(fixture: str, old: str, new: str) -> str:
    """A fixture plug-in (docs/architecture.md's recipe) under the plug-in package's own name."""
    return (FIXTURES / f"{fixture}.py").read_text().replace(old, new)


# A model plug-in with a layer of its own (docs/architecture.md, "Per-sample kernels for your own layers"): the
# lean engine learns its per-sample gradient from the kernel the plug-in registers where it defines the layer.
SCALED_MODEL = '''"""A model with a layer of its own, and that layer's per-sample kernel for dpeval's lean engine."""

import torch
from torch import nn

from dpeval.core.registry import MODELS
from dpeval.engine.lean import LayerKernel, register_kernel


class Scale(nn.Module):
    """Each input feature times a learned weight."""

    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))

    def forward(self, x):
        return x * self.weight


@register_kernel(Scale)
class ScaleKernel(LayerKernel):
    weight_layer = False  # small: its per-sample gradients are instantiated

    def small_grads(self, module, a, ds):
        return {"weight": (a * ds).reshape(a.shape[0], -1, a.shape[-1]).sum(1)}


@MODELS.register("demo-scaled", "a learned per-feature scale, then a linear classifier (plug-in)")
def demo_scaled(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), Scale(c * h * w), nn.Linear(c * h * w, num_classes))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that has the plug-in package installed (by pip, from its source folder)."""
    src = tmp_path_factory.mktemp("dpeval-plugin-demo")
    package = src / "dpeval_plugin_demo"
    package.mkdir()
    (package / "__init__.py").write_text('"""A demo plug-in package for dpeval."""\n')
    (package / "defense.py").write_text(plugin_source("plugin_defense", '"plugin-dpsgd"', '"demo-dpsgd"'))
    (package / "attack.py").write_text(plugin_source("plugin_attack", '"plugin-confidence"', '"demo-confidence"'))
    (package / "layer.py").write_text(SCALED_MODEL)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "dpeval-plugin-demo"\nversion = "0.1"\n\n'
        '[project.entry-points."dpeval.defenses"]\ndemo-dpsgd = "dpeval_plugin_demo.defense"\n\n'
        '[project.entry-points."dpeval.attacks"]\ndemo-confidence = "dpeval_plugin_demo.attack"\n\n'
        '[project.entry-points."dpeval.models"]\ndemo-scaled = "dpeval_plugin_demo.layer"\n\n'
        '[tool.setuptools]\npackages = ["dpeval_plugin_demo"]\n')
    target = tmp_path_factory.mktemp("site")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(target), str(src)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert (target / "dpeval_plugin_demo" / "attack.py").is_file()
    return {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}


def dpeval(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpeval.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd)


def test_dpeval_list_shows_the_plugins_from_their_source(installed, tmp_path):
    listed = dpeval(installed, "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["defenses"]["demo-dpsgd"].startswith("DP-SGD written as a one-file plug-in")
    assert "confidence" in data["attacks"]["demo-confidence"]
    assert "demo-dpsgd" not in json.loads(dpeval({**installed, "PYTHONPATH": ""}, "list", "--json",
                                                 cwd=tmp_path).stdout)["defenses"]  # only where installed


def test_a_bad_name_answers_before_the_plugins_or_torch_load(installed, tmp_path):
    code = ("import sys\nfrom dpeval.cli import main\n"
            "try:\n    main(['run', '--defense', 'demo-dpsgdd', '--results', 'r'])\nexcept SystemExit as e:\n"
            "    assert e.code == 2, e.code\n"
            "assert 'torch' not in sys.modules and 'dpeval_plugin_demo.defense' not in sys.modules\nprint('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=installed, cwd=tmp_path)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    assert "unknown defense 'demo-dpsgdd'" in proc.stderr and "demo-dpsgd" in proc.stderr


def test_the_plugins_run_through_dpeval_run(installed, tmp_path):
    proc = dpeval(installed, "run", "--defense", "demo-dpsgd", "--attack", "demo-confidence", "--epochs", "1",
                  "--set", "data.max_train=300", "--json", "--quiet", "--results", "r", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["defense"] == "demo-dpsgd" and row["privacy.epsilon"] <= 3.0
    assert 0 <= row["leakage.demo-confidence.auc"] <= 1 and row["leakage.demo-confidence.verdict"] in (
        "leaks", "no-leak-detected")


def test_an_outside_attack_is_checked_for_the_boundary(installed, tmp_path):
    ok = dpeval(installed, "check-attack", "dpeval_plugin_demo.attack", cwd=tmp_path)
    assert ok.returncode == 0 and "dpeval_plugin_demo.attack: ok" in ok.stdout, ok.stderr
    (tmp_path / "peek.py").write_text("def score(view, task):\n    return task.train.x\n")  # positive control
    bad = dpeval(installed, "check-attack", str(tmp_path / "peek.py"), cwd=tmp_path)
    assert bad.returncode == 1 and "takes task" in bad.stdout and "names task" in bad.stdout


def test_an_outside_layer_registers_its_kernel_with_the_lean_engine(installed, tmp_path):
    """The plug-in's kernel gives the same clipped sums as torch.func's per-sample gradients (in a process that sees
    only what is installed); without it the engine refuses the layer, naming its parameter (positive control)."""
    code = ("import torch\n"
            "from dpeval.core.errors import ConfigError\n"
            "from dpeval.core.per_sample import PerSampleGradients\n"
            "from dpeval.core.registry import MODELS\n"
            "from dpeval.defenses.clipping import GroupClipping\n"
            "from dpeval.engine import lean\n"
            "torch.manual_seed(0)\n"
            "model = MODELS.get('demo-scaled')((1, 4, 4), 3)\n"
            "with torch.no_grad():\n"
            "    model[1].weight.uniform_(0.5, 1.5)\n"
            "x, y = torch.randn(6, 1, 4, 4), torch.randint(0, 3, (6,))\n"
            "names = [n for n, _ in model.named_parameters()]\n"
            "clipping = GroupClipping.of([[n] for n in names], 0.2, 'abadi')\n"
            "ref = clipping.clip_sum(PerSampleGradients(model)(x, y))\n"
            "got = lean.LeanEngine(model)(x, y, clipping.plan()).sums\n"
            "worst = max(float((ref[n] - got[n]).abs().max() / ref[n].abs().max()) for n in names)\n"
            "assert worst < 1e-5, worst\n"
            "kernel = lean.KERNELS.pop(type(model[1]))\n"
            "try:\n"
            "    lean.trainable_layers(model)\n"
            "    print('accepted without its kernel')\n"
            "except ConfigError as exc:\n"
            "    assert 'Scale ×1 at 1;' in str(exc), exc\n"
            "lean.KERNELS[type(model[1])] = kernel\n"
            "try:\n"
            "    lean.register_kernel(type(model[1]))(type(kernel))\n"
            "except ValueError as exc:\n"
            "    assert 'already has a kernel' in str(exc)\n"
            "    print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=installed, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    run = dpeval(installed, "run", "--model", "demo-scaled", "--set", "train.engine=lean", "--epochs", "1",
                 "--set", "data.max_train=200", "--json", "--quiet", "--results", "r", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["model"] == "demo-scaled"
