"""The defense registry (a module of its own, free of torch, so configurations are checked without importing
any defense; ``harness.core.registry`` explains the discovery)."""

from harness.core.registry import Registry

DEFENSES: Registry = Registry("defense", scan="defenses", var="DEFENSES")
