"""Helpers shared by several test files."""

import torch

from defenses.base import Defense
from harness.config import RunSpec, build_spec, set_dotted


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
