"""Helpers shared by several test files."""

import pytest
import torch

from dpeval.config import RunSpec, build_spec, set_dotted
from dpeval.core.datasets.torchvision_sets import SYSTEM_FOLDERS
from dpeval.defenses.base import Defense

# The real Fashion-MNIST files where Debian's package dataset-fashion-mnist installs them (`make test` installs
# it where apt allows); the real-data tests are skipped, with this reason, without them.
FASHIONMNIST_FOLDER = SYSTEM_FOLDERS["FashionMNIST"][0]
FASHIONMNIST_INSTALLED = (FASHIONMNIST_FOLDER / "train-images-idx3-ubyte.gz").is_file()
needs_fashionmnist = pytest.mark.skipif(
    not FASHIONMNIST_INSTALLED,
    reason=f"Fashion-MNIST not in {FASHIONMNIST_FOLDER} (apt-get install dataset-fashion-mnist)")


def spec_for(defense: str, **sets) -> RunSpec:
    """A RunSpec for ``defense`` with dotted overrides written with ``__`` (``train__epochs=2``)."""
    raw = {"defense": {"name": defense}}
    for key, value in sets.items():
        set_dotted(raw, key.replace("__", "."), value)
    return build_spec(raw)


def noiseless(cls: type[Defense]) -> type[Defense]:
    """A planted bug for positive controls: ``cls`` releasing no noise (every Gaussian draw is zeros) while
    the run's ledger still plans, and reports, σ for the target ε."""

    class Noiseless(cls):
        def gaussian(self, shape: torch.Size, std: float) -> torch.Tensor:
            return torch.zeros(shape, device=self.device)

    Noiseless.__name__ = Noiseless.__qualname__ = f"Noiseless{cls.__name__}"
    return Noiseless
