"""The defense registry (a module of its own so defense modules can import it without cycles)."""

from harness.core.registry import Registry

DEFENSES: Registry = Registry("defense")
