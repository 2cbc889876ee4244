"""The attack template: ``run(context) -> AttackResult``, one self-describing class per attack.

The context is the attacker's view: the model and its states, the task, the defense (to produce the
shared gradient of a target batch through the defense's own ``release`` path, or to train shadow models
with the same defense), the run's random streams and a folder for artefacts. An attack reports its
metrics under ``leakage.<attack>.<metric>``.

Each attack class declares:

- ``Params``: its parameter dataclass (fields made with ``harness.core.params.param``);
- ``headline`` and ``higher_leaks``: the metric that ranks configurations (leaderboard Pareto marks, the
  report's axes) and whether a higher value means more leakage; ``headline_label`` names it for humans;
- ``baseline`` / ``chance``: what the headline is compared with when nothing leaks: the name of a metric
  the attack reports (a data-free guess, e.g. ``baseline_psnr``) or a constant chance level (AUC 0.5);
- ``wanted_states``: model states beyond ``init`` and ``final`` that training must snapshot for it.

Every attack should report ``verdict``: exactly ``leaks`` or ``no-leak-detected``, decided by a documented
statistical rule against its baseline or chance level (docs/results.md).

Model states are named ``init`` (before training), ``epoch:N`` (at the start of epoch N), ``final`` (after
training) and ``trajectory:k`` (k states evenly spaced over training, ending at ``final``), which
``harness.core.states.resolve`` turns into the others once the number of epochs is known.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from defenses.base import Defense
from harness.core.params import Params
from harness.core.streams import Streams


VERDICTS = ("leaks", "no-leak-detected")
class AttackParams(Params):
    """Base for an attack's parameter dataclass; ``validate`` (cross-field rules) raises ConfigError naming
    ``attack.<field>``."""


@dataclass
class NoAttackParams(AttackParams):
    pass


@dataclass
class AttackContext:
    """The attacker's view of a run.

    ``states`` maps a model state name to its weights: always ``init`` (before training) and ``final``,
    plus ``epoch:N`` (weights at the start of epoch N) for every name an attack asked for through
    ``Attack.wanted_states``. ``defense_states`` holds the defense's public state (``state_dict()``)
    at the same moments; ``trained_defense`` is the defense object training used, in its final state.
    """

    model: torch.nn.Module                 # architecture with the final weights loaded
    states: dict[str, dict[str, torch.Tensor]]
    defense_states: dict[str, dict[str, Any]]
    trained_defense: Defense
    task: Any                              # harness.core.splits.Task
    # make_defense(streams, bound_to=None): a fresh defense configured exactly as in training, drawing its
    # noise / masks / anchors from ``streams``, bound to ``bound_to`` (default: the victim model)
    make_defense: Callable[..., Defense]
    build_model: Callable[[], torch.nn.Module]  # a fresh model of the victim's architecture
    spec: Any                              # harness.config.RunSpec (public hyperparameters)
    accounted: Any                         # harness.runner.PrivacyPlan: ε, δ, σ, q, steps of the victim
    seed: int
    streams: Streams                       # the run's random streams (scope them: attack, shadow i, …)
    out_dir: Path
    device: torch.device


@dataclass
class AttackResult:
    metrics: dict[str, float]              # metric name -> value, reported as leakage.<attack>.<metric>
    artefacts: dict[str, str] = field(default_factory=dict)  # name -> path of files written


class Attack(ABC):
    name: ClassVar[str] = ""               # set by ATTACKS.register
    Params: ClassVar[type] = NoAttackParams
    description: ClassVar[str] = ""
    headline: ClassVar[str] = ""           # the metric that ranks configurations under this attack
    higher_leaks: ClassVar[bool] = True    # whether a higher headline value means more leakage
    headline_label: ClassVar[str] = ""     # e.g. "IG PSNR (dB)"; "" = the metric's key
    baseline: ClassVar[str] = ""           # a reported metric: the headline of a data-free guess
    chance: ClassVar[float | None] = None  # the headline's value when nothing leaks (a constant)

    def __init__(self, params: Any) -> None:
        self.params = params

    @classmethod
    def chance_level(cls) -> float | None:
        """The declared ``chance``; an AUC headline's chance level is 0.5 by definition."""
        if cls.chance is not None:
            return cls.chance
        return 0.5 if cls.headline == "auc" else None

    @classmethod
    def wanted_states(cls, params: Any) -> set[str]:
        """Model states to snapshot during training besides ``init`` and ``final``: ``epoch:N`` or
        ``trajectory[:k]`` (the runner resolves it against the run's epochs, ``harness.core.states.resolve``)."""
        return set()

    @classmethod
    def check_task(cls, params: Any, task: Any) -> None:
        """Raise ConfigError when the data cannot serve the attack (too few examples for its game);
        called before training."""

    @abstractmethod
    def run(self, context: AttackContext) -> AttackResult:
        """Attack what the defense releases; never read raw per-sample gradients or private labels
        beyond what the threat model grants."""
