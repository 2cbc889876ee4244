"""`pip install .` puts one top-level name into site-packages, ``dpeval``: the wheel built from the project's
source holds the package (its core, engine, defenses and attacks inside it) and its metadata, and nothing else —
no generic ``harness``, ``defenses`` or ``attacks`` that would collide with other installs."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_dpeval_only(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("harness", "defenses", "attacks"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("dpeval-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"dpeval", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("dpeval/cli.py", "dpeval/core/ledger.py", "dpeval/engine/training.py", "dpeval/defenses/gep.py",
                   "dpeval/attacks/lira.py"):
        assert module in names
    entry_points = zipfile.ZipFile(wheel).read(wheel.name.split("-py3")[0] + ".dist-info/entry_points.txt").decode()
    assert "dpeval = dpeval.cli:main" in entry_points
