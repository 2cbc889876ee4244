"""An attack's verdict, as stored under ``leakage.<attack>.verdict`` (docs/results.md, "Verdicts").

A run's verdict is ``Verdict.LEAKS`` or ``Verdict.NO_LEAK``: a ``str`` enum whose values are the stored
text (``leaks``, ``no-leak-detected``), so JSON and SQLite hold what they always held. A leaderboard row of
seeds grouped together holds their common verdict, or ``Mixed`` (``mixed (k/n leak)``) when they disagree.
``Verdict.parse`` reads either back (None: no verdict); both kinds answer ``leaks``.

A check of a claimed bound has the other kind of verdict, ``BoundCheck`` (``PASS`` / ``FAIL``): an audit's
``audit.verdict`` (its ε lower bound within the accounted ε) and the informed game's ``bound_check`` (its success
within the mechanism's bound). Stored as its text too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    LEAKS = "leaks"
    NO_LEAK = "no-leak-detected"

    @property
    def leaks(self) -> bool:
        return self is Verdict.LEAKS

    @classmethod
    def of(cls, leaks: bool) -> Verdict:
        return cls.LEAKS if leaks else cls.NO_LEAK

    @classmethod
    def parse(cls, value: Any) -> Verdict | Mixed | None:
        """A stored verdict back: None (missing) → None, a run's → Verdict, a group's disagreement → Mixed;
        ValueError on anything else."""
        if value is None or isinstance(value, (Verdict, Mixed)):
            return value
        if isinstance(value, str) and (known := _BY_TEXT.get(value)) is not None:  # tables parse thousands
            return known
        try:
            return cls(value)
        except ValueError:
            return Mixed.parse(value)

    @classmethod
    def merge(cls, values: Iterable[Any]) -> Verdict | Mixed | None:
        """The verdict of seeds grouped together (stored values, None where a seed has none): the common
        one when they all agree, else ``Mixed`` counting the seeds that leak."""
        parsed = [cls.parse(v) for v in values]
        if len(set(parsed)) == 1:
            return parsed[0]
        return Mixed(sum(v is cls.LEAKS for v in parsed), len(parsed))


_BY_TEXT = {v.value: v for v in Verdict}


class BoundCheck(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"

    @property
    def passed(self) -> bool:
        return self is BoundCheck.PASS

    @classmethod
    def of(cls, passed: bool) -> BoundCheck:
        return cls.PASS if passed else cls.FAIL


@dataclass(frozen=True)
class Mixed:
    """Grouped seeds that disagree: ``leaking`` of ``seeds`` leak."""

    leaking: int
    seeds: int

    PATTERN = re.compile(r"mixed \((\d+)/(\d+) leak\)")

    @property
    def leaks(self) -> bool:
        return True  # seeds disagree: read conservatively, as leakage some seeds show

    def __str__(self) -> str:
        return f"mixed ({self.leaking}/{self.seeds} leak)"

    @classmethod
    def parse(cls, text: Any) -> Mixed:
        found = cls.PATTERN.fullmatch(text) if isinstance(text, str) else None
        if found is None:
            raise ValueError(f"not a verdict: {text!r} (leaks, no-leak-detected or mixed (k/n leak))")
        return cls(int(found.group(1)), int(found.group(2)))
