"""The attack template: one self-describing class per attack, one hook, ``guess(evidence)``.

Two methods split an attack between the game and the attacker:

- ``play(view, task) -> AttackResult`` is the game, written once (``attacks/game.py``: ``Game.play``) and
  filled in once per attack family by its hooks (``gradient_game``: ``ReconstructionAttack``,
  ``GradientMembershipAttack``; ``membership_game``: ``ShadowAttack``, ``VictimMembershipAttack``;
  ``informed_game``: ``InformedReconstructionAttack``). It holds the ``task`` (private pool, held-out split: the
  truth), chooses the targets, builds the evidence its threat model grants, calls the hook and scores what the
  hook returns against the truth. No subclass of ``Game`` may override it (``__init_subclass__`` refuses the
  class).
- ``guess(evidence)`` is the attack itself, the one hook every attack implements. ``evidence`` is one typed,
  frozen object of the family's (``Evidence``): what that threat model lets the attacker see and nothing else
  (``Releases``: the ``AttackerView`` of ``attacks/view.py`` plus the releases; ``ReleaseSignals``,
  ``Signals``, ``VictimOutputs``: the membership signals the game computed once, without who is a member;
  ``ResidualSignals``: the informed game's residual releases against each candidate, without the secret).
  It returns guesses (a ``Reconstruction``, the informed family's scores per statistic) or ``Scores``, never
  metrics against the truth.

An attack class registered with ``ATTACKS.register`` subclasses a family and implements ``guess``; it never
reads the task (``tests/test_layers.py``, ``dpeval check-attack``). Metrics are reported under
``leakage.<attack>.<metric>``, those measured at one model state (``AttackResult.states``) under
``leakage.<attack>.<state>.<metric>``.

Each attack class declares:

- ``Params``: its parameter dataclass (fields made with ``dpeval.core.params.param``);
- ``headline`` and ``higher_leaks``: the metric that ranks configurations (leaderboard Pareto marks, the
  report's axes) and whether a higher value means more leakage; ``headline_label`` names it for humans;
- ``baseline`` / ``chance``: what the headline is compared with when nothing leaks: the name of a metric
  the attack reports (a data-free guess, e.g. ``baseline_psnr``) or a constant chance level (AUC 0.5);
- ``wanted_states``: model states beyond ``init`` and ``final`` that training must snapshot for it;
- ``check_task(params, task)`` / ``check_model(params, model, shape)``: refuse data or a model the attack
  cannot work on, before training;
- ``title()``: its name on its figures (default ``"<name> attack"``).

Every attack should report a verdict, ``AttackResult.verdict`` (``dpeval.core.verdicts.Verdict``: ``leaks``
or ``no-leak-detected``), decided by a documented statistical rule against its baseline or chance level
(docs/results.md); the runner stores it as ``leakage.<attack>.verdict``.

Model states are named ``init`` (before training), ``epoch:N`` (at the start of epoch N), ``final`` (after
training) and ``trajectory:k`` (k states evenly spaced over training, ending at ``final``), which
``dpeval.core.states.resolve`` turns into the others once the number of epochs is known.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from torch import nn

from dpeval.attacks.view import AttackerView
from dpeval.core.files import write_atomic, write_text_atomic
from dpeval.core.params import Params
from dpeval.core.result_keys import VERDICT, per_state
from dpeval.core.splits import Task
from dpeval.core.states import AttackState
from dpeval.core.verdicts import Verdict


class AttackParams(Params):
    """Base for an attack's parameter dataclass; ``validate`` (cross-field rules) raises ConfigError naming
    ``attack.<field>``."""


@dataclass
class NoAttackParams(AttackParams):
    pass


class Artefact(ABC):
    """A file of an attack's result: its data and how to write it. A game writes no file: the application writes
    each artefact into the attack's folder under its ``file`` name (``dpeval.attacking.write_artefacts``) and stores
    its path as ``artefacts.<attack>.<name>``."""

    file: str  # a plain file name, e.g. ``roc.json``

    @abstractmethod
    def write(self, path: Path) -> None:
        """Write the file at ``path`` (atomically: ``dpeval.core.files``)."""


@dataclass(frozen=True)
class TextFile(Artefact):
    file: str
    text: str

    def write(self, path: Path) -> None:
        write_text_atomic(path, self.text)


@dataclass(frozen=True)
class ArraysFile(Artefact):
    """Named arrays in one compressed ``.npz``."""

    file: str
    arrays: Mapping[str, Any]  # name -> np.ndarray

    def write(self, path: Path) -> None:
        write_atomic(path, lambda f: np.savez_compressed(f, **self.arrays))


@dataclass
class AttackResult:
    metrics: dict[str, Any]                # metric name -> value, reported as leakage.<attack>.<metric>
    artefacts: dict[str, Artefact] = field(default_factory=dict)  # name -> file, written by the application
    verdict: Verdict | None = None         # reported as leakage.<attack>.verdict; None: the attack has no rule
    # recorded model state -> metric -> value, reported as leakage.<attack>.<state>.<metric>
    states: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if VERDICT in self.metrics:  # one way to report it, typed
            raise ValueError("an attack reports its verdict as AttackResult.verdict, not among its metrics")
        if dotted := [m for m in self.metrics if per_state(m)]:  # else a stored row would read back differently
            raise ValueError(f"an attack reports per-state metrics in AttackResult.states, not as {dotted[0]!r}")
        for state in self.states:
            if AttackState(state).is_request:  # ValueError for a name that is no model state at all
                raise ValueError(f"AttackResult.states: {state!r} is a request, not a recorded model state")
        if self.verdict is not None:
            self.verdict = Verdict(self.verdict)  # ValueError unless leaks / no-leak-detected


@dataclass(frozen=True)
class Scores:
    """What a membership attack's ``guess`` returns: one score per candidate, in the order the evidence lists
    them (higher: more likely a member), and metrics to report beside them (a fitted parameter, say; averaged
    over the game's targets when it has several)."""

    values: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)


Evidence = TypeVar("Evidence")  # the family's evidence type: what its threat model lets the attacker see


class Attack(ABC, Generic[Evidence]):
    name: ClassVar[str] = ""               # set by ATTACKS.register
    Params: ClassVar[type] = NoAttackParams
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

    @classmethod
    def check_model(cls, params: Any, model: nn.Module, shape: tuple[int, ...]) -> None:
        """Raise ConfigError when the attack cannot attack this architecture (inputs of ``shape``, C, H, W);
        called before training and again when the game starts."""
        return None  # an optional hook: by default every model is accepted

    @classmethod
    def check_privacy(cls, params: Any, privacy: Any) -> None:
        """Raise ConfigError when the attack cannot be scored against the run's planned privacy ledger (a
        ``PrivacyLedger``: a bound it computes from σ, q, T); called before training."""
        return None  # an optional hook: by default every ledger is accepted

    def title(self) -> str:
        """The title of the attack's figures (a membership game's ROC curve); a subclass may name its parameters
        in it. A default, so that a plug-in without one cannot fail after its game's training."""
        return f"{self.name} attack"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "play" in vars(cls) and any("play" in vars(base) for base in cls.__mro__[1:]
                                       if issubclass(base, Attack) and base is not Attack):
            raise TypeError(f"{cls.__name__}: an attack implements guess(evidence); play is its family's game")

    @abstractmethod
    def play(self, view: AttackerView, task: Task) -> AttackResult:
        """The attack's game (``attacks/game.py``'s template, filled in by the attack's family): targets drawn
        from ``task``, the evidence built from ``view`` and what training released, ``guess`` called on it, its
        answer scored against ``task``."""

    @abstractmethod
    def guess(self, evidence: Evidence) -> Any:
        """The attack: from what its threat model lets it see (the family's evidence type), guesses
        (``Reconstruction``) or ``Scores``; never metrics against the truth."""
