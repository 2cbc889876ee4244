"""Helpers shared by several test files."""

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from dpeval.attacks.view import AttackerView
from dpeval.config import build_spec, set_dotted
from dpeval.core.datasets import packaged
from dpeval.core.datasets.torchvision_sets import SYSTEM_FOLDERS
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Task
from dpeval.defenses.base import Defense
from tests.conftest import REAL_DATA_HOME

# The real Fashion-MNIST files where Debian's package dataset-fashion-mnist installs them (`make test` installs
# it where apt allows); the real-data tests are skipped, with this reason, without them.
FASHIONMNIST_FOLDER = SYSTEM_FOLDERS["FashionMNIST"][0]
FASHIONMNIST_INSTALLED = (FASHIONMNIST_FOLDER / "train-images-idx3-ubyte.gz").is_file()
needs_fashionmnist = pytest.mark.skipif(
    not FASHIONMNIST_INSTALLED,
    reason=f"Fashion-MNIST not in {FASHIONMNIST_FOLDER} (apt-get install dataset-fashion-mnist)")

# MNIST and CIFAR-10 as `dpeval data install` puts them in this machine's data folder (`make test` installs them
# where npm is available); the tests that read them are skipped, with this reason, without them. Such a test
# reads them through conftest's `real_data_home` fixture (every other test sees an empty data folder).
MNIST_INSTALLED = (REAL_DATA_HOME / packaged.MNIST.folder / "train-images-idx3-ubyte").is_file()
CIFAR10_INSTALLED = (REAL_DATA_HOME / packaged.CIFAR10.folder / "train_images.npy").is_file()
needs_mnist = pytest.mark.skipif(not MNIST_INSTALLED, reason=f"MNIST not installed in {REAL_DATA_HOME} "
                                                             f"(dpeval data install mnist)")
needs_cifar10 = pytest.mark.skipif(not CIFAR10_INSTALLED, reason=f"CIFAR-10 not installed in {REAL_DATA_HOME} "
                                                                 f"(dpeval data install cifar10)")


def spec_for(defense: str, **sets) -> RunSpec:
    """A RunSpec for ``defense`` with dotted overrides written with ``__`` (``train__epochs=2``)."""
    raw = {"defense": {"name": defense}}
    for key, value in sets.items():
        set_dotted(raw, key.replace("__", "."), value)
    return build_spec(raw)


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters (only those with requires_grad when ``trainable_only``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def untrained_view(spec: RunSpec, out_dir: str | Path) -> tuple[AttackerView, Task]:
    """An attacker's view (and the task its games keep) for ``attack.at: init`` without training (reconstruction
    attacks need ``at: init`` or ``final`` here: no epoch is recorded).

    Same model initialisation, defense and attack streams as ``dpeval run`` with this spec; the
    ``final`` state is the initial one (nothing was trained). The defense's public state at epoch 0 is
    taken exactly as training would snapshot it (after ``begin_epoch(0)``).
    """
    from dpeval.attacking import attacker_view  # here: most users of this file need no runner
    from dpeval.runner import prepare

    prep = prepare(spec)
    prep.model.to(prep.device).eval()
    init = copy.deepcopy(prep.model.state_dict())
    defense = prep.make_defense(prep.streams.scope("victim"))
    defense.begin_epoch(0, spec.train.epochs)
    state = copy.deepcopy(defense.state_dict())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    view = attacker_view(prep, {"init": init, "final": init}, {"init": state, "final": state}, out)
    return view, prep.task


def noiseless(cls: type[Defense]) -> type[Defense]:
    """A planted bug for positive controls: ``cls`` releasing no noise (every Gaussian draw is zeros) while
    the run's ledger still plans, and reports, σ for the target ε."""

    class Noiseless(cls):
        def standard_normal(self, shape: torch.Size) -> torch.Tensor:  # every draw of the release's noise
            return torch.zeros(shape, device=self.device)

    Noiseless.__name__ = Noiseless.__qualname__ = f"Noiseless{cls.__name__}"
    return Noiseless


def load_bench_script(name: str, *first: str):
    """A script of bench/ as a module (bench/ is not a package): ``load_bench_script("paper_tables")``. ``first``:
    the scripts beside it that it imports, loaded before it (run as a script, its folder is on its path; loaded
    here, it finds them among the loaded modules): ``load_bench_script("zoo", "dp_step")``."""
    for script in first:
        load_bench_script(script)
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass looks its module up while it is defined
    spec.loader.exec_module(module)
    return module


def write_rows_csv(path, rows: list[dict]) -> None:
    """``rows`` as a CSV with every key of any row as a column (sorted), as a leaderboard export has them."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)


def typed(rows: list[dict]) -> list:
    """Store rows written by hand (``run_id``, ``run_key``, ``status``, ``metrics``, ``config``, as
    ``ResultStore.rows`` gives them) as the typed results ``ResultStore.results`` would give back."""
    import dataclasses

    from dpeval.results import RunResult

    return [dataclasses.replace(RunResult.from_flat({**r["metrics"], "run_id": r["run_id"], "status": r["status"]}),
                                run_key=r["run_key"], config=r["config"]) for r in rows]
