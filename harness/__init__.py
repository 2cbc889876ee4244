"""dpeval: train victims with DP defenses, attack what they share, score utility vs ε vs measured leakage.

The Python API (docs/api.md) is reachable from this package, loaded on first use so that ``import dpeval`` stays
light: ``configure``, ``run``, ``load_data``, ``build_model``, ``score_membership``, ``attack_release``,
``load_result``, ``per_sample_norms`` (from ``dpeval.api``) and the typed results ``RunResult``, ``AttackOutcome``
(``dpeval.results``), ``RunSpec`` (``dpeval.core.spec``), and ``one_run_bounds`` (``dpeval.core.one_run_bounds``: ε
lower bounds of a one-run audit from canary scores). The package's layers: ``dpeval.core`` ← ``dpeval.defenses`` ←
``dpeval.engine`` ← ``dpeval.attacks`` ← the application (cli, config, runner, store, sweep, leaderboard, report,
audit, api); docs/architecture.md draws them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {"configure": "dpeval.api", "run": "dpeval.api", "load_data": "dpeval.api", "build_model": "dpeval.api",
        "score_membership": "dpeval.api", "per_sample_norms": "dpeval.api",
        "attack_release": "dpeval.api", "load_result": "dpeval.api", "RunResult": "dpeval.results",
        "AttackOutcome": "dpeval.results", "RunSpec": "dpeval.core.spec",
        "one_run_bounds": "dpeval.core.one_run_bounds"}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'dpeval' has no attribute {name!r}")
