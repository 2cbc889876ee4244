"""Named model states of a run, in one place: parse, order, resolve.

A run records its model at ``init`` (before training), ``epoch:N`` (at the start of epoch N, after the
defense's ``begin_epoch``) and ``final`` (after training). Attacks ask for states by those names or by
``trajectory[:k]`` — k states evenly spaced over training, ending at ``final`` (k = 3 when omitted) — which
``resolve`` expands once the number of epochs is known. ``AttackState`` is a ``str`` (it keys the recorded
states and appears in result keys ``leakage.<attack>.<state>.<metric>``) that only a valid name can become.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dpeval.core.errors import ConfigError

PATTERN = re.compile(r"^(init|final|epoch:(\d+)|trajectory(?::(\d+))?)$")
DEFAULT_TRAJECTORY = 3  # states of a bare ``trajectory``


class AttackState(str):
    """``init``, ``epoch:N``, ``final`` (a recorded state) or ``trajectory[:k]`` (a request for several)."""

    def __new__(cls, text: str) -> AttackState:
        match = PATTERN.match(text) if isinstance(text, str) else None
        if match is None or (match.group(3) is not None and int(match.group(3)) < 1):
            raise ValueError(f"not a model state: {text!r} (init, final, epoch:N with N >= 0, trajectory or "
                             f"trajectory:k with k >= 1)")
        return super().__new__(cls, text)

    @classmethod
    def parse(cls, text: object, field: str = "attack.at", recorded_only: bool = False) -> AttackState:
        """``text`` as a state, or ConfigError naming ``field`` (``recorded_only``: no trajectory request)."""
        try:
            state = cls(text)  # type: ignore[arg-type]
        except ValueError:
            state = None
        if state is None or (recorded_only and state.is_request):
            allowed = "init, final or epoch:N (N an integer >= 0)" if recorded_only else \
                "init, final, epoch:N, trajectory or trajectory:k (N >= 0, k >= 1), or a list of them"
            raise ConfigError(f"{field}: must be {allowed}, got {text!r}")
        return state

    @property
    def is_request(self) -> bool:
        return self.startswith("trajectory")

    @property
    def epoch(self) -> int | None:
        """N of ``epoch:N``; None for the other names."""
        return int(self.split(":", 1)[1]) if self.startswith("epoch:") else None

    def order(self) -> tuple[int, int]:
        """Training order: init, epoch:0, epoch:1, …, final."""
        if self == "init":
            return (0, 0)
        return (2, 0) if self == "final" else (1, self.epoch or 0)

    def defense_epoch(self, epochs: int) -> int:
        """The epoch whose defense configuration applies at this state (``final``: the last epoch's)."""
        if self == "init":
            return 0
        if self == "final":
            return max(epochs - 1, 0)
        self.check_exists(epochs)
        return self.epoch  # type: ignore[return-value]

    def check_exists(self, epochs: int) -> None:
        """ConfigError when ``epoch:N`` lies beyond a run of ``epochs`` epochs."""
        if self.epoch is not None and self.epoch >= epochs:
            raise ConfigError(f"attack.at: {self} does not exist in a run of {epochs} epoch(s); "
                              f"use epoch:0 .. epoch:{epochs - 1}, init or final")


def trajectory_epochs(k: int, epochs: int) -> list[int]:
    """The epochs of ``trajectory:k`` before ``final``: round(i·E/k) for i = 1 .. k−1, kept when inside
    1 .. E−1 (epoch 0 is the initial weights), without duplicates. ``final`` closes the trajectory, so
    the k states sit after 1/k, 2/k, …, k/k of training."""
    picked = (round(i * epochs / k) for i in range(1, k))
    return sorted({e for e in picked if 1 <= e <= epochs - 1})


def resolve(names: Iterable[str], epochs: int) -> list[AttackState]:
    """Recorded states (``init``, ``epoch:N``, ``final``) in training order, with every ``trajectory[:k]``
    expanded for a run of ``epochs`` epochs and duplicates dropped (ValueError on a name that is no state)."""
    found: set[AttackState] = set()
    for name in names:
        state = AttackState(name)
        if state.is_request:
            k = int(state.split(":", 1)[1]) if ":" in state else DEFAULT_TRAJECTORY
            found.update(AttackState(f"epoch:{e}") for e in trajectory_epochs(k, epochs))
            found.add(AttackState("final"))
        else:
            found.add(state)
    return sorted(found, key=AttackState.order)


def in_order(names: Iterable[str]) -> list[str]:
    """Recorded-state names (others dropped) in training order."""
    valid = []
    for name in names:
        try:
            state = AttackState(name)
        except ValueError:
            continue
        if not state.is_request:
            valid.append(state)
    return [str(s) for s in sorted(set(valid), key=AttackState.order)]
