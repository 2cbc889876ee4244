"""The attack registry (a module of its own so attack modules can import it without cycles)."""

from harness.core.registry import Registry

ATTACKS: Registry = Registry("attack")
