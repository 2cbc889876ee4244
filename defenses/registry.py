"""The defense registry (a module of its own, free of torch, so configurations are checked without importing
any defense; ``dpeval.core.registry`` explains the discovery)."""

from dpeval.core.registry import Registry

DEFENSES: Registry = Registry("defense", scan="dpeval.defenses", var="DEFENSES", group="dpeval.defenses")
