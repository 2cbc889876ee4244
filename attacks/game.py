"""The game every attack family plays, written once: ``Game.play``.

A family (``gradient_game``, ``membership_game``, ``informed_game``) supplies what differs, as hooks of ``Game``:

1. ``deal(view, task)``: what the game draws and keeps — targets, candidates, who is a member, the secret — and
   everything it computes once (a shadow pool, the victim's outputs); the family's own dataclass.
2. ``rounds(dealt)``: the evidence, one ``Round`` per call of ``guess`` (a state, a release, a target), built
   lazily, each with the part of the truth that scores its answer and, where the game's own order of the
   candidates would tell (members first), the ``order`` they were shuffled into.
3. ``score(dealt, played)``: the metrics of the answers against the truth (``Scored``: flat and per model state),
   with what the verdict and the artefacts read.
4. ``decide(scored)``: the verdict, by the family's documented rule (docs/results.md).
5. ``artefacts(dealt, scored, verdict)``: the files of the result, as data (``Artefact``); the application writes
   them (``dpeval.attacking.write_artefacts``).

Between 2 and 3 the template calls ``guess`` and puts a shuffled answer's scores back in the game's order
(``unshuffle``). The checks come first (``check_task``, ``check_model``), and a family whose work is many small
per-example problems plays on one CPU thread (``one_thread``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from dpeval.attacks.base import Artefact, Attack, AttackResult, Evidence, Scores
from dpeval.attacks.view import AttackerView
from dpeval.core.runtime import single_cpu_thread
from dpeval.core.splits import Task
from dpeval.core.verdicts import Verdict

Truth = TypeVar("Truth")     # what the game keeps of one round to score its answer
Dealt = TypeVar("Dealt")     # what the game drew and keeps for one play
Measured = TypeVar("Measured", bound="Scored")  # what its scoring measured


@dataclass(frozen=True)
class Round(Generic[Evidence, Truth]):
    """One call of ``guess``: the evidence handed to it, the truth kept back, and the shuffle of its candidates
    (``order[i]``: the game's index of the evidence's i-th candidate; None: not shuffled)."""

    evidence: Evidence
    truth: Truth
    order: np.ndarray | None = None


@dataclass(frozen=True)
class Played(Generic[Truth]):
    """A round's truth and the attack's answer, its scores back in the game's order."""

    truth: Truth
    answer: Any


@dataclass
class Scored:
    metrics: dict[str, Any]                                             # AttackResult.metrics
    states: dict[str, dict[str, Any]] = field(default_factory=dict)     # AttackResult.states


def unshuffle(answer: Any, order: np.ndarray | None) -> Any:
    """``Scores`` listed in the shuffled evidence's order, put back in the game's (an answer without ``order``
    as it is)."""
    if order is None:
        return answer
    values = np.empty(len(order))
    values[order] = answer.values
    return Scores(values, answer.metrics)


class Game(Attack[Evidence], Generic[Evidence, Dealt, Measured]):
    """The template of a family's game (the module docstring): a family implements the hooks, an attack ``guess``."""

    one_thread: ClassVar[bool] = False  # play with one intra-op CPU thread (``single_cpu_thread``)

    def play(self, view: AttackerView, task: Task) -> AttackResult:
        self.check_task(self.params, task)
        self.check_model(self.params, view.architecture, view.shape)  # fail before any work on it
        with single_cpu_thread(view.device) if self.one_thread else nullcontext():
            dealt = self.deal(view, task)
            played = [Played(r.truth, unshuffle(self.guess(r.evidence), r.order)) for r in self.rounds(dealt)]
            scored = self.score(dealt, played)
            verdict = self.decide(scored)
            return AttackResult(scored.metrics, self.artefacts(dealt, scored, verdict), verdict, scored.states)

    @abstractmethod
    def deal(self, view: AttackerView, task: Task) -> Dealt:
        """What the game draws and keeps for one play."""

    @abstractmethod
    def rounds(self, dealt: Dealt) -> Iterable[Round[Evidence, Any]]:
        """The evidence of each call of ``guess``, with its truth and shuffle."""

    @abstractmethod
    def score(self, dealt: Dealt, played: list[Played[Any]]) -> Measured:
        """The metrics of the answers against the truth."""

    @abstractmethod
    def decide(self, scored: Measured) -> Verdict:
        """The verdict of the family's rule."""

    @abstractmethod
    def artefacts(self, dealt: Dealt, scored: Measured, verdict: Verdict) -> dict[str, Artefact]:
        """The result's files, as data, by name (``artefacts.<attack>.<name>``)."""
