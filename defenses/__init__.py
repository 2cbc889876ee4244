"""Defenses: one module per defense, registered by name with ``@DEFENSES.register``.

Every module in this package is imported on first use, so adding a defense is one new module.
"""

from defenses.base import Defense, SharedGradient
from defenses.registry import DEFENSES
from harness.core.registry import import_submodules

import_submodules(__name__, skip=("base", "registry"))

__all__ = ["DEFENSES", "Defense", "SharedGradient"]
