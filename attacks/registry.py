"""The attack registry (a module of its own, free of torch, so configurations are checked without importing
any attack; ``harness.core.registry`` explains the discovery)."""

from harness.core.registry import Registry

ATTACKS: Registry = Registry("attack", scan="attacks", var="ATTACKS")
