"""The attack template: ``play(view, task) -> AttackResult``, one self-describing class per attack.

An attack sees an ``AttackerView`` (``attacks/view.py``): the recorded model states, the defense's public
state, the release oracle, the public split, the privacy ledger, the public hyperparameters. The ``task``
(private pool, held-out split) is the truth the game keeps: ``play`` is implemented once per attack family
(``gradient_game.ReconstructionAttack`` and ``GradientMembershipAttack``, ``membership_game.ShadowAttack``
and ``VictimMembershipAttack``), which chooses the targets, hands the attack's own hook only the view,
releases and unlabelled candidates, and scores the hook's guesses or scores against the truth. An attack
class registered with ``ATTACKS.register`` subclasses a family and implements its hook; it never reads the
task (``tests/test_layers.py``). Metrics are reported under ``leakage.<attack>.<metric>``.

Each attack class declares:

- ``Params``: its parameter dataclass (fields made with ``dpeval.core.params.param``);
- ``headline`` and ``higher_leaks``: the metric that ranks configurations (leaderboard Pareto marks, the
  report's axes) and whether a higher value means more leakage; ``headline_label`` names it for humans;
- ``baseline`` / ``chance``: what the headline is compared with when nothing leaks: the name of a metric
  the attack reports (a data-free guess, e.g. ``baseline_psnr``) or a constant chance level (AUC 0.5);
- ``wanted_states``: model states beyond ``init`` and ``final`` that training must snapshot for it.

Every attack should report a verdict, ``AttackResult.verdict`` (``dpeval.core.verdicts.Verdict``: ``leaks``
or ``no-leak-detected``), decided by a documented statistical rule against its baseline or chance level
(docs/results.md); the runner stores it as ``leakage.<attack>.verdict``.

Model states are named ``init`` (before training), ``epoch:N`` (at the start of epoch N), ``final`` (after
training) and ``trajectory:k`` (k states evenly spaced over training, ending at ``final``), which
``dpeval.core.states.resolve`` turns into the others once the number of epochs is known.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dpeval.attacks.view import AttackerView
from dpeval.core.params import Params
from dpeval.core.result_keys import VERDICT
from dpeval.core.splits import Task
from dpeval.core.verdicts import Verdict


class AttackParams(Params):
    """Base for an attack's parameter dataclass; ``validate`` (cross-field rules) raises ConfigError naming
    ``attack.<field>``."""


@dataclass
class NoAttackParams(AttackParams):
    pass


@dataclass
class AttackResult:
    metrics: dict[str, Any]                # metric name -> value, reported as leakage.<attack>.<metric>
    artefacts: dict[str, str] = field(default_factory=dict)  # name -> path of files written
    verdict: Verdict | None = None         # reported as leakage.<attack>.verdict; None: the attack has no rule

    def __post_init__(self) -> None:
        if VERDICT in self.metrics:  # one way to report it, typed
            raise ValueError("an attack reports its verdict as AttackResult.verdict, not among its metrics")
        if self.verdict is not None:
            self.verdict = Verdict(self.verdict)  # ValueError unless leaks / no-leak-detected


class Attack(ABC):
    name: ClassVar[str] = ""               # set by ATTACKS.register
    Params: ClassVar[type] = NoAttackParams
    description: ClassVar[str] = ""
    headline: ClassVar[str] = ""           # the metric that ranks configurations under this attack
    higher_leaks: ClassVar[bool] = True    # whether a higher headline value means more leakage
    headline_label: ClassVar[str] = ""     # e.g. "IG PSNR (dB)"; "" = the metric's key
    baseline: ClassVar[str] = ""           # a reported metric: the headline of a data-free guess
    chance: ClassVar[float | None] = None  # the headline's value when nothing leaks (None: 0.5 for an auc)

    def __init__(self, params: Any) -> None:
        self.params = params

    @classmethod
    def wanted_states(cls, params: Any) -> set[str]:
        """Model states to snapshot during training besides ``init`` and ``final``: ``epoch:N`` or
        ``trajectory[:k]`` (the runner resolves it against the run's epochs, ``dpeval.core.states.resolve``)."""
        return set()

    @classmethod
    def check_task(cls, params: Any, task: Any) -> None:
        """Raise ConfigError when the data cannot serve the attack (too few examples for its game);
        called before training."""
        return None  # an optional hook: by default every task is accepted

    @abstractmethod
    def play(self, view: AttackerView, task: Task) -> AttackResult:
        """The attack's game (an attack family implements it): targets drawn from ``task``, the attack's
        hook given only ``view`` and what the game hands it, its guesses scored against ``task``."""
