"""Attacks: one module per attack, registered by name with ``@ATTACKS.register``.

Every module in this package is imported on first use, so adding an attack is one new module.
"""

from attacks.base import Attack, AttackContext, AttackResult
from attacks.registry import ATTACKS
from harness.core.registry import import_submodules

import_submodules(__name__, skip=("base", "registry"))

__all__ = ["ATTACKS", "Attack", "AttackContext", "AttackResult"]
