"""Defenses: one module per defense, registered by name with ``@DEFENSES.register("name", "description")``.

The registry reads the declarations from the source and imports a defense's module when it is first asked
for (``DEFENSES.get``), so adding a defense is one new module. The template is ``dpeval.defenses.base``.
"""

from dpeval.defenses.registry import DEFENSES

__all__ = ["DEFENSES"]
