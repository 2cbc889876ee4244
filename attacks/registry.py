"""The attack registry (a module of its own, free of torch, so configurations are checked without importing
any attack; ``dpeval.core.registry`` explains the discovery)."""

from dpeval.core.registry import Registry

ATTACKS: Registry = Registry("attack", scan="dpeval.attacks", var="ATTACKS", group="dpeval.attacks")
