"""An attack's result as a reader takes it in: the declared headline metric and its direction, what it is
compared with (a data-free baseline or a chance level), the verdict, the worst attacked state.

Everything comes from the attack's declaration (``Attack.headline``, ``higher_leaks``, ``headline_label``,
``baseline``, ``chance``; a built-in attack's are read from its source, without importing it and torch) and a
run's typed ``AttackOutcome`` or the flat result keys of a leaderboard row, so a plug-in attack needs no edit here;
an attack that reports no ``verdict`` yet reads as "no verdict". Shared by ``dpeval run``, the sweep's status
lines, the leaderboard and the report.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Callable

from dpeval.core.result_keys import VERDICT, AttackKey, leakage_key
from dpeval.core.states import in_order
from dpeval.core.verdicts import Mixed, Verdict
from dpeval.results import AttackOutcome


@dataclass(frozen=True)
class Facts:
    """What an attack declares about its headline (``dpeval.attacks.base.Attack``)."""

    headline: str          # the metric that ranks configurations under this attack
    higher_leaks: bool     # whether a higher headline value means more leakage
    headline_label: str    # e.g. "IG PSNR (dB)"; "" = the metric's key
    baseline: str          # a reported metric: the headline of a data-free guess
    chance: float | None   # the headline's value when nothing leaks (a constant)

    def chance_level(self) -> float | None:
        """The declared ``chance``; an AUC headline's chance level is 0.5 by definition."""
        if self.chance is not None:
            return self.chance
        return 0.5 if self.headline == "auc" else None


FACTS = tuple(f.name for f in fields(Facts))  # the Attack class attributes they are read from


@functools.cache
def _declared_facts(attack: str) -> Facts | None:
    """A built-in attack's facts read from its source, without importing it (attack modules import torch, which
    a listing of results never needs): the literals its class body sets over ``Attack``'s defaults. Built-in
    attacks only, whose families set none of these (tests/attacks/test_contract.py compares every built-in
    attack's read facts with its imported class's); None where the source does not tell them all."""
    from dpeval.attacks import ATTACKS
    from dpeval.core.registry import class_source_literals

    declaration = ATTACKS.declared().get(attack)
    if declaration is None or not declaration.module.startswith("dpeval.attacks."):
        return None
    values = {**class_source_literals("dpeval.attacks.base", "Attack"), **declaration.attributes}
    if not all(k in values for k in FACTS):
        return None
    return Facts(*(values[k] for k in FACTS))


def attack_facts(attack: str) -> Facts | None:
    """The headline facts of ``attack``, or None (a result of an attack that is no longer installed)."""
    from dpeval.attacks import ATTACKS

    if attack not in ATTACKS:
        return None
    if not ATTACKS.loaded(attack) and (declared := _declared_facts(attack)) is not None:
        return declared
    cls = ATTACKS.get(attack)
    return Facts(*(getattr(cls, k) for k in FACTS))


def attacks_in(records: list[dict[str, Any]] | dict[str, Any]) -> list[str]:
    """Attacks with ``leakage.<attack>.*`` keys in a record or a list of records."""
    rows = [records] if isinstance(records, dict) else records
    columns = set().union(*rows)  # each distinct column parsed once, not once per record
    return sorted({key.attack for c in columns if (key := AttackKey.parse(c))})


def headline(record_keys: set[str], attack: str) -> tuple[str, bool] | None:
    """The attack's declared headline column (``Attack.headline``) and whether higher means more leakage;
    None when the attack is not registered or its records lack the column."""
    facts = attack_facts(attack)
    if facts is None or not facts.headline:
        return None
    column = str(AttackKey(attack, facts.headline))
    return (column, facts.higher_leaks) if column in record_keys else None


def metric_label(attack: str) -> str:
    """The human name of an attack's headline metric, e.g. "IG PSNR (dB)"."""
    facts = attack_facts(attack)
    return (facts.headline_label or str(AttackKey(attack, facts.headline))) if facts else f"leakage.{attack}"


def headline_label(attack: str) -> str:
    """The headline's name with its direction, for axes and legends."""
    facts = attack_facts(attack)
    direction = "higher" if facts is None or facts.higher_leaks else "lower"
    return f"{metric_label(attack)}, {direction} = more leakage"


def unit_of(label: str) -> str:
    """The unit a label names in trailing parentheses ("IG PSNR (dB)" -> "dB"), else ""."""
    found = re.search(r"\(([^()]*)\)\s*$", label)
    return found.group(1) if found else ""


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v: Any) -> bool:
    """A finite number: what a figure can draw and a comparison can rank. A run without a test set
    (``data.test_fraction = 0``) records its test accuracy as NaN."""
    return is_number(v) and math.isfinite(v)


def untested(record: dict[str, Any]) -> bool:
    """Whether a run (or seed group) had no test set: its test accuracy is NaN."""
    accuracy = record.get("utility.test_accuracy")
    return is_number(accuracy) and math.isnan(accuracy)


def fmt(value: Any, digits: int = 4) -> str:
    if not is_number(value):
        return "" if value is None else str(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def states_of(record: dict[str, Any] | AttackOutcome, attack: str | None = None) -> list[str]:
    """The attacked model states, in training order: of a typed outcome, or those with per-state keys
    ``leakage.<attack>.<state>.<metric>`` in a flat record (a seed-grouped leaderboard row)."""
    if isinstance(record, AttackOutcome):
        return in_order(record.states)
    keys = [key for c in record if (key := AttackKey.parse(c)) and key.attack == attack]
    return in_order({key.state for key in keys if key.state})


def smallest_p(record: dict[str, Any], attack: str) -> str:
    """For a sign-test verdict over T targets at S states (Bonferroni), the smallest p the run could give,
    in words; "" for an attack without a p-value or a target count, and for one whose p-value is not that sign
    test of gains over a data-free guess (no ``baseline_psnr``: the informed game's binomial test has no such
    floor)."""
    targets = record.get(f"attack.{attack}.targets")
    p_value = record.get(str(AttackKey(attack, "p_value")))
    guess = record.get(str(AttackKey(attack, "baseline_psnr")))
    if not isinstance(targets, int) or isinstance(targets, bool) or p_value is None or guess is None:
        return ""
    states = max(1, len(states_of(record, attack)))
    floor = min(1.0, states * 2.0 ** -targets)
    plural = "s" if states != 1 else ""
    return (f"with {targets} targets × {states} state{plural} the smallest p is {states}·2^-{targets} = "
            f"{fmt(floor, 2)}"
            + (" (above 0.05: `leaks` is out of reach)" if floor > 0.05 else ""))


@dataclass
class Headline:
    attack: str
    metric: str                 # the declared headline metric, e.g. psnr
    label: str                  # "IG PSNR (dB)"
    value: Any
    higher_leaks: bool
    verdict: Verdict | Mixed | None  # Mixed: grouped seeds that disagree; None when the attack reports none
    reference: float | None     # the data-free baseline or chance level
    reference_name: str         # "best data-free guess" / "chance"
    state: str | None           # the worst attacked state
    rate: float | None          # the defense's rate there
    p_value: float | None
    interval: tuple[float, float] | None = None  # a confidence interval of the headline, when reported
    decided_by: tuple[str, float] | None = None  # another statistic that gave the verdict (``decisive``)
    bound: float | None = None  # what the run's accounted mechanism allows the headline (informed reconstruction)
    bound_check: str | None = None  # PASS / FAIL: whether the headline stayed within ``bound``

    @property
    def column(self) -> str:
        """``leakage.<attack>.<metric>``."""
        return str(AttackKey(self.attack, self.metric))

    @property
    def leaks(self) -> bool | None:
        """True / False from the verdict; without one, whether the headline beats its reference (None
        when there is nothing to compare with)."""
        if self.verdict is not None:
            return self.verdict.leaks
        if not is_number(self.value) or self.reference is None:
            return None
        return self.value > self.reference if self.higher_leaks else self.value < self.reference

    def sentence(self) -> str:
        """e.g. "no-leak-detected: IG PSNR 7.62 dB at final (rate 0.90) vs best data-free guess 12.1 dB, p = 1"."""
        unit = unit_of(self.label)
        name = self.label[: self.label.rfind("(")].strip() if unit else self.label
        text = f"{name} {fmt(self.value)}{f' {unit}' if unit else ''}"
        if self.state:
            text += f" at {self.state}"
            if self.rate is not None:
                text += f" (rate {self.rate:.2f})"
        if self.interval is not None:
            text += f" (95% CI {fmt(self.interval[0], 3)}–{fmt(self.interval[1], 3)})"
        if self.reference is not None:
            text += f" vs {self.reference_name} {fmt(self.reference)}{f' {unit}' if unit else ''}"
        if self.p_value is not None:
            text += f", p = {fmt(self.p_value, 2)}"
        if self.bound is not None:
            text += f"; DP bound {fmt(self.bound, 3)}{f' ({self.bound_check})' if self.bound_check else ''}"
        if self.decided_by is not None:  # the statistic that decided first, the headline after it
            statistic, value = self.decided_by
            return f"{self.verdict}: {statistic} {fmt(value)} > 0 ({text})"
        return f"{self.verdict or 'no verdict'}: {text}"

    def short(self) -> str:
        """e.g. "ig 7.62 no-leak-detected @final" (sweep status lines)."""
        state = f" @{self.state}" if self.state else ""
        return f"{self.attack} {fmt(self.value)} {self.verdict or 'no-verdict'}{state}"


def decisive(record: dict[str, Any] | AttackOutcome, attack: str, head: Headline) -> tuple[str, float] | None:
    """The statistic other than the headline that made the verdict ``leaks``, or None when the headline itself
    supports it. A membership verdict (``attacks/membership_metrics.py``) is ``leaks`` when the ε lower bound is
    above 0 *or* the AUC's interval lies above chance: when the AUC does not, the bound decided."""
    bound = _getter(record, attack)("epsilon_lower_bound")
    if head.verdict is not Verdict.LEAKS or not is_number(bound) or not bound > 0 or head.reference is None:
        return None
    low = head.interval[0] if head.interval is not None else head.value
    if is_number(low) and (low > head.reference if head.higher_leaks else low < head.reference):
        return None
    return "ε lower bound", float(bound)


def _getter(record: dict[str, Any] | AttackOutcome, attack: str) -> Callable[[str], Any]:
    """A metric of ``attack`` by its name: from a typed outcome, or from a flat record's key."""
    if isinstance(record, AttackOutcome):
        return record.metrics.get
    return lambda metric: record.get(leakage_key(attack, metric))


def read(record: dict[str, Any] | AttackOutcome, attack: str | None = None) -> Headline | None:
    """The headline of ``attack`` in a flat record (a leaderboard row, seeds grouped or not), or of a run's typed
    ``AttackOutcome`` (``attack``: its name by default)."""
    if isinstance(record, AttackOutcome):
        attack = attack or record.name
    if attack is None:
        raise TypeError("read: name the attack whose headline a flat record holds")
    facts = attack_facts(attack)
    if facts is None or not facts.headline:
        return None
    get = _getter(record, attack)
    verdict = record.verdict if isinstance(record, AttackOutcome) else Verdict.parse(get(VERDICT))

    reference, name = None, ""
    if facts.baseline and is_number(get(facts.baseline)):
        reference = float(get(facts.baseline))
        name = "chance" if facts.baseline == "chance" else "best data-free guess"
    elif facts.chance_level() is not None:
        reference, name = facts.chance_level(), "chance"
    rate, p_value, state = get("defense_rate"), get("p_value"), get("state")
    low, high = get(f"{facts.headline}_ci_low"), get(f"{facts.headline}_ci_high")
    head = Headline(attack, facts.headline, metric_label(attack), get(facts.headline),
                    facts.higher_leaks, verdict, reference, name,
                    state if isinstance(state, str) else None, rate if is_number(rate) else None,
                    p_value if is_number(p_value) else None,
                    (low, high) if is_number(low) and is_number(high) else None,
                    bound=float(get("bound")) if is_number(get("bound")) else None,
                    bound_check=get("bound_check") if isinstance(get("bound_check"), str) else None)
    head.decided_by = decisive(record, attack, head)
    return head
