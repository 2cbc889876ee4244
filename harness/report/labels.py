"""Names, labels and the shared limits of the report: what a configuration is called, how its settings and
values read, the colours and categories its points are drawn in, and when a figure would tell too many apart."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

from dpeval import leaderboard as lb
from dpeval.core.verdicts import Mixed, Verdict
from dpeval.headlines import (
    finite,
    fmt,
    headline_label,
    is_number,
    read,
)

MAX_PICTURES = 24        # pictures shown one by one (runs without an image array)


# Configurations one figure tells apart (point labels, lines with a legend entry, panel columns, grid rows): a
# figure of more is unreadable and takes minutes to lay out; the page says why it is not drawn instead.
MAX_DRAWN = 40


CELL_IMAGES = 6          # targets shown per run in a reconstruction grid


SUMMARY = ["dataset", "model", "defense", "attack", "privacy.target_epsilon", "train.optimizer", "train.lr",
           "train.momentum", "train.epochs", "train.batch_size", "data.test_size"]


EPSILON = "privacy.target_epsilon"


UTILITY = "utility.test_accuracy"


UTILITY_LABEL = "test accuracy, higher = better"


def cell_text(v: Any) -> str:
    if isinstance(v, bool):
        return "✓" if v else ""
    if isinstance(v, float):
        return fmt(v)
    return "" if v is None else str(v)


def setting_name(column: str) -> str:
    """``defense.final_rate`` -> ``final_rate``; ``attack.ig.at`` -> ``ig at``."""
    parts = column.split(".")
    return " ".join(parts[1:]) if len(parts) > 1 else column


def setting_help(column: str, records: list[dict[str, Any]]) -> str:
    """The declared help text of a ``defense.*`` / ``attack.*`` setting (for axis labels), or ""."""
    from dpeval.attacks import ATTACKS
    from dpeval.defenses import DEFENSES

    parts = column.split(".")
    if parts[0] == "defense" and len(parts) == 2:
        classes = [DEFENSES.get(n) for n in {str(r.get("defense")) for r in records} if n in DEFENSES]
    elif parts[0] == "attack" and len(parts) == 3 and parts[1] in ATTACKS:
        classes = [ATTACKS.get(parts[1])]
    else:
        return ""
    for cls in classes:
        for f in dataclasses.fields(cls.Params):
            if f.name == parts[-1] and f.metadata.get("help"):
                return f.metadata["help"].replace("`", "")
    return ""


def axis_label(column: str, records: list[dict[str, Any]]) -> str:
    help_text = setting_help(column, records)
    text = f"{column} — {help_text}" if help_text else column
    return "\n".join(textwrap.wrap(text, 60))


HEADERS = {EPSILON: "requested ε"}  # table headers that differ from the labels' names


SHORT_NAMES = {EPSILON: "ε", "train.lr": "lr", "train.optimizer": "optimizer", "train.epochs": "epochs",
               "train.batch_size": "B", "train.momentum": "momentum", "attack": "attacks"}


def point_label(record: dict[str, Any], swept: list[str]) -> str:
    """What distinguishes this configuration: the varying settings that apply to it (``final_rate=0.5``,
    ``ε=3``), the defense and attacks by name; settings of other defenses or a non-private run's ε are
    left out."""
    parts = []
    for c in swept:
        if c in ("defense", "dataset", "model") and c in record:
            parts.append(str(record[c]))
        elif c == "attack" and c in record or lb.applies(record, c):
            parts.append(f"{SHORT_NAMES.get(c, setting_name(c))}={cell_text(record.get(c))}")
    return ", ".join(parts) or str(record.get("defense"))


def swept_columns(records: list[dict[str, Any]]) -> list[str]:
    """What varies between configurations: defense, dataset, model, attacks, and every setting that
    differs among the runs it applies to (``varying_settings``: requested ε, train, data, defense and
    attack settings)."""
    summary = [c for c in ("defense", "dataset", "model", "attack") if len({repr(r.get(c)) for r in records}) > 1]
    return summary + lb.varying_settings(records)


def swept_parameters(records: list[dict[str, Any]]) -> list[str]:
    """Numeric settings whose value varies across the records: the swept knobs (ε has its own figure)."""
    return [c for c in lb.varying_settings(records) if c != EPSILON
            if all(is_number(r.get(c)) for r in records if c in r) and any(c in r for r in records)]


def sort_key(record: dict[str, Any], swept: list[str]) -> tuple:
    return tuple((0, record[c], "") if is_number(record.get(c)) else (1, 0, str(record.get(c))) for c in swept)


Figures = list[tuple[str, Path | str]]  # (title, the PNG drawn, or why the figure is not drawn)


def too_many(title: str, count: int) -> Figures:
    return [(title, f"not drawn: {count} configurations, more than one figure tells apart ({MAX_DRAWN}); the "
                    "leaderboard lists them all")]


CATEGORIES = {  # how a point is drawn by what its verdict says
    "leaks": ("o", "full"), "leaks in some seeds": ("o", "left"), "no leak detected": ("o", "none"),
    "no verdict": ("D", "none"),
}


def category(record: dict[str, Any], attack: str) -> str:
    head = read(record, attack)
    if head is None or head.verdict is None:
        return "no verdict"
    if isinstance(head.verdict, Mixed):
        return "leaks in some seeds"
    return "leaks" if head.verdict.leaks else "no leak detected"


def leaks(stored: Any) -> bool:
    """Whether a stored verdict (a run's or a group's) says the attack leaks; False without one."""
    verdict = Verdict.parse(stored)
    return verdict is not None and verdict.leaks


def requested_epsilon(record: dict[str, Any]) -> float | None:
    """The ε a private run asked for (``privacy.epsilon`` as configured), else its accounted ε; None for a
    non-private run."""
    if not private(record):
        return None
    return record[EPSILON] if is_number(record.get(EPSILON)) else record["privacy.epsilon"]


def private(record: dict[str, Any]) -> bool:
    return finite(record.get("privacy.epsilon"))


def colours(records: list[dict[str, Any]], swept: list[str]) -> dict[str, str]:
    """One colour per configuration label (learning and density curves)."""
    labels = [point_label(r, swept) for r in sorted(records, key=lambda r: sort_key(r, swept))]
    return {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}


def line_colours(records: list[dict[str, Any]], swept: list[str]) -> dict[str, str]:
    """One colour per configuration apart from ε (``line_label``): a defense keeps its colour at every ε,
    in the ε figure and the matched-ε figure alike."""
    labels = sorted({line_label(r, swept) for r in records if requested_epsilon(r) is not None})
    return {label: f"C{i % 10}" for i, label in enumerate(labels)}


def metrics_of(records: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(column, axis label, attack): accuracy (unless no run had a test set), then each attack's headline."""
    keys = {c for r in records for c in r}
    heads = [(h[0], headline_label(a), a) for a in lb.attacks_in(records) if (h := lb.headline(keys, a))]
    accuracy = [(UTILITY, UTILITY_LABEL, None)] if any(finite(r.get(UTILITY)) for r in records) else []
    return accuracy + heads


def line_label(record: dict[str, Any], swept: list[str]) -> str:
    return point_label(record, [c for c in swept if c != EPSILON])


def spread_note(records: list[dict[str, Any]]) -> str:
    """What the error bars are: "mean ± SEM over 3 seeds", or "n = 1: one seed, no error bars"."""
    ns = sorted({int(r.get("n", 1)) for r in records})
    if ns == [1]:
        return "n = 1: one seed, no error bars"
    seeds = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return f"mean ± SEM over {seeds} seeds" + ("; n = 1 points have no bar" if ns[0] == 1 else "")
