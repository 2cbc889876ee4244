"""Attacks: one module per attack, registered by name with ``@ATTACKS.register("name", "description")``.

The registry reads the declarations from the source and imports an attack's module when it is first asked
for (``ATTACKS.get``), so adding an attack is one new module. The template is ``dpeval.attacks.base``.
"""

from dpeval.attacks.registry import ATTACKS

__all__ = ["ATTACKS"]
