"""The result keys an attack owns: ``leakage.<attack>.<metric>`` and ``artefacts.<attack>.<name>``.

An attack's name never contains a dot (``AttackKey`` refuses one) while a metric's may: a rate
(``tpr_at_0.1pct_fpr``), a per-state metric ``<state>.<metric>`` (``epoch:3.psnr``), a grouped row's spread
``<metric>.sem``. So a key splits at its first two dots, and a metric is per-state exactly when its first
part is a recorded model state (``init``, ``epoch:N``, ``final``; ``dpeval.core.states``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dpeval.core.states import AttackState

SECTIONS = ("leakage", "artefacts")
VERDICT = "verdict"  # the metric an attack's verdict is stored under (``dpeval.core.verdicts``)


@dataclass(frozen=True, order=True)
class AttackKey:
    attack: str
    metric: str                  # an artefact's name under ``artefacts``
    section: str = "leakage"

    def __post_init__(self) -> None:
        if self.section not in SECTIONS or not self.attack or "." in self.attack or not self.metric:
            raise ValueError(f"not an attack's result key: {self.section!r}, {self.attack!r}, {self.metric!r} "
                             f"(sections {', '.join(SECTIONS)}; an attack name without '.', a metric name)")

    def __str__(self) -> str:
        return f"{self.section}.{self.attack}.{self.metric}"

    @classmethod
    def verdict(cls, attack: str) -> AttackKey:
        return cls(attack, VERDICT)

    @classmethod
    def at_state(cls, attack: str, state: str, metric: str) -> AttackKey:
        """``leakage.<attack>.<state>.<metric>``: ``metric`` measured at one recorded model state."""
        if AttackState(state).is_request:
            raise ValueError(f"not a recorded model state: {state!r}")
        return cls(attack, f"{state}.{metric}")

    @classmethod
    def parse(cls, key: str, section: str = "leakage") -> AttackKey | None:
        """The key as ``section.<attack>.<metric>``; None for any other key."""
        head, _, rest = key.partition(".")
        attack, _, metric = rest.partition(".")
        if head != section or not attack or not metric:
            return None
        return cls(attack, metric, section)

    @property
    def is_verdict(self) -> bool:
        return self.section == "leakage" and self.metric == VERDICT

    @property
    def state(self) -> str | None:
        """The recorded model state of a per-state metric (``epoch:3`` of ``epoch:3.psnr``), else None."""
        return per_state(self.metric)

    @property
    def state_metric(self) -> str:
        """The metric without its state (``psnr`` of ``epoch:3.psnr``); the whole metric when not per-state."""
        return self.metric.partition(".")[2] if self.state else self.metric


def per_state(metric: str) -> str | None:
    """The recorded model state a flat metric name begins with (``epoch:3`` of ``epoch:3.psnr``), else None."""
    first, dot, _ = metric.partition(".")
    try:
        return first if dot and not AttackState(first).is_request else None
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def leakage_key(attack: str, metric: str) -> str:
    """``str(AttackKey(attack, metric))``, remembered: a table reads the same few keys of thousands of records."""
    return str(AttackKey(attack, metric))
