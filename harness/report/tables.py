"""The report's text: the leaderboard table and the generated summary (what leaks, which accuracy differences
exceed their SEM, identical results, recipe differences)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from dpeval import leaderboard as lb
from dpeval.core.result_keys import AttackKey
from dpeval.headlines import (
    finite,
    fmt,
    is_number,
    metric_label,
    read,
    smallest_p,
    untested,
)
from dpeval.report.labels import (
    EPSILON,
    HEADERS,
    SHORT_NAMES,
    SUMMARY,
    UTILITY,
    cell_text,
    leaks,
    point_label,
    requested_epsilon,
    setting_name,
    sort_key,
    swept_columns,
)
from dpeval.report.markup import Line, table_html


def table(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(one line of the settings every row shares, the leaderboard as an HTML table that fits the page: ``table_html``
    of its header and cells)."""
    keys = {c for r in records for c in r}
    swept = swept_columns(records)
    common = [f"{HEADERS.get(c, SHORT_NAMES.get(c, setting_name(c)))} {cell_text(records[0].get(c))}"
              for c in SUMMARY
              if all(c in r for r in records) and len({repr(r[c]) for r in records}) == 1]
    columns: list[tuple[str, str]] = [("n", "n")] + [(c, HEADERS.get(c, SHORT_NAMES.get(c, setting_name(c))))
                                                     for c in swept]
    columns.append((UTILITY, "test accuracy"))
    if "privacy.selection_epsilon" in keys:  # the price of choosing among the configurations
        columns += [(c, name) for c, name in (("privacy.epsilon", "ε (one run)"),
                                              ("privacy.selection_epsilon", "ε of the selection (composition)"),
                                              ("privacy.selection_epsilon_random_stopping",
                                               "ε of the selection (random stopping)"))
                    if c in keys and c not in swept]
    for attack in lb.attacks_in(records):
        found = lb.headline(keys, attack)
        if found:
            columns.append((found[0], metric_label(attack)))
        columns += [(c, name) for c, name in ((str(AttackKey.verdict(attack)), f"{attack} verdict"),
                                              (str(AttackKey(attack, "state")), f"{attack} worst state"),
                                              (f"pareto.{attack}", f"Pareto ({attack})")) if c in keys]
    if "identical_results" in keys:
        columns.append(("identical_results", "identical results"))
    names = dict(columns)
    columns = [(c, names.get(c, c)) for c in lb.with_paper(list(names), keys, brief=True) if c in keys]
    body = []
    for r in sorted(records, key=lambda r: sort_key(r, swept)):
        cells = []
        for c, _ in columns:
            text = cell_text(r.get(c)) if c not in swept or c in ("defense", "dataset", "model", "attack") \
                or lb.applies(r, c) else ""
            sem = r.get(f"{c}.sem")
            if is_number(sem) and sem > 0:
                text += f" ± {sem:.2g}"
            key = AttackKey.parse(c)
            cells.append((text, bool(key and key.is_verdict and leaks(r.get(c)))))
        body.append(cells)
    return ", ".join(common), table_html(columns, body)


def metric_tables(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per attack, (its name, an HTML table of every metric it reported beside each configuration): the
    ``leakage.<attack>.<metric>`` columns of the records, whatever their names, so that a metric an attack adds is
    on the page without an edit here (docs/architecture.md, "Adding a metric"). Left out: the verdict and the worst
    state (the leaderboard's columns), per-state metrics (the CSV's), spreads (shown as ± beside their mean) and a
    null metric's ``<metric>_note``."""
    swept = swept_columns(records)
    keys = {c for r in records for c in r}
    out = []
    for attack in lb.attacks_in(records):
        metrics = sorted({key.metric for c in keys if (key := AttackKey.parse(c)) is not None and key.attack == attack
                          and not key.state and not key.is_verdict and key.metric != "state"
                          and not key.metric.endswith((".sem", "_note"))})
        columns = [str(AttackKey(attack, m)) for m in metrics]
        shown = [r for r in sorted(records, key=lambda r: sort_key(r, swept)) if any(c in r for c in columns)]
        if not shown:
            continue
        head = [("configuration", "configuration"), ("n", "n"), *zip(columns, metrics)]
        body = []
        for r in shown:
            cells = [point_label(r, swept), cell_text(r.get("n", 1))]
            for c in columns:
                sem = r.get(f"{c}.sem")
                cells.append(cell_text(r.get(c)) + (f" ± {sem:.2g}" if is_number(sem) and sem > 0 else ""))
            body.append([(text, False) for text in cells])
        out.append((attack, table_html(head, body)))
    return out


def _value(r: dict[str, Any], metric: str) -> str:
    sem = r.get(f"{metric}.sem")
    return fmt(r[metric], 3) + (f" ± {fmt(sem, 2)}" if is_number(sem) and sem > 0 else "")


def leak_lines(records: list[dict[str, Any]], swept: list[str]) -> list[Line]:
    """Per attack: which configurations leak (by their verdict), and how many do not (the attack's name as
    the line's lead)."""
    lines: list[Line] = []
    for attack in lb.attacks_in(records):
        heads = [(r, h) for r in records if (h := read(r, attack)) is not None and h.value is not None]
        if not heads:
            continue
        leaking = [f"{point_label(r, swept)} ({h.verdict or 'beats its reference'})" for r, h in heads if h.leaks]
        quiet = len(heads) - len(leaking)
        if leaking:
            text = f": leaks in {', '.join(leaking)}; no leak detected in {quiet} other configuration(s)."
        else:
            text = (f": no configuration leaks ({len(heads)} configuration(s); “no leak detected” is not a proof "
                    "of privacy).")
        floors = sorted({floor for r, _ in heads if (floor := smallest_p(r, attack))})
        if floors:
            text += f" {'; '.join(floors)}."
        lines.append((attack, text))
    return lines


def utility_lines(records: list[dict[str, Any]], swept: list[str]) -> list[str]:
    """At each requested ε (and among the non-private runs): the most accurate configuration, which others
    are below it by more than the combined SEM, and the cost against the non-private reference."""
    groups: dict[Any, list] = defaultdict(list)
    for r in records:
        if finite(r.get(UTILITY)):  # runs without a test set have no accuracy to compare (summary_lines)
            groups[requested_epsilon(r)].append(r)
    reference = max(groups.get(None, []), key=lambda r: r[UTILITY], default=None)
    lines = []
    for eps, rs in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        where = "non-private" if eps is None else f"ε = {fmt(eps)}"
        best = max(rs, key=lambda r: r[UTILITY])
        swept_here = [c for c in swept if c != EPSILON]  # the line says the ε once
        text = f"{where}: most accurate {point_label(best, swept_here)} — {_value(best, UTILITY)}"
        if len(rs) > 1:
            below, within, unknown = [], [], []
            for r in rs:
                if r is best:
                    continue
                diff = best[UTILITY] - r[UTILITY]
                sems = [best.get(f"{UTILITY}.sem") or 0, r.get(f"{UTILITY}.sem") or 0]
                if best.get("n", 1) == 1 or r.get("n", 1) == 1:
                    unknown.append(f"{point_label(r, swept_here)} (−{fmt(diff, 2)})")
                elif diff > math.hypot(*sems):
                    below.append(f"{point_label(r, swept_here)} (−{fmt(diff, 2)})")
                else:
                    within.append(point_label(r, swept_here))
            if below:
                text += f"; below it by more than their SEM: {', '.join(below)}"
            if within:
                text += f"; within their SEM of it: {', '.join(within)}"
            if unknown:
                text += f"; one seed, no SEM to compare with: {', '.join(unknown)}"
        if eps is not None and reference is not None:
            text += (f"; the non-private {point_label(reference, swept)} reaches {_value(reference, UTILITY)} "
                     f"(most accurate private − non-private = {best[UTILITY] - reference[UTILITY]:+.3f})")
        lines.append(text + ".")
    return lines


def summary_lines(records: list[dict[str, Any]]) -> list[Line]:
    """The report's opening: what leaks, which utility differences exceed their SEM, the test set's
    resolution, configurations with identical results and settings that differ between the runs."""
    if not records:
        return []
    swept = swept_columns(records)
    lines = leak_lines(records, swept) + utility_lines(records, swept)
    sizes = sorted({int(r["data.test_size"]) for r in records if finite(r.get("data.test_size"))} - {0})
    if sizes:
        steps = ", ".join(f"1/{n} = {fmt(1 / n, 2)}" for n in sizes)
        lines.append(f"Test-set resolution: one test example moves accuracy by {steps}; smaller differences "
                     "are ties.")
    if blind := [point_label(r, swept) for r in records if untested(r)]:
        lines.append(f"No test set (data.test_fraction = 0): test accuracy is n/a for {', '.join(blind)}; they "
                     "are left out of the accuracy comparisons and the utility–leakage figures and fronts.")
    same: dict[str, list] = defaultdict(list)
    for r in records:
        if r.get("identical_results"):
            same[r["identical_results"]].append(point_label(r, swept))
    for names in same.values():
        lines.append(f"Identical results (every utility and leakage value, every seed): {' and '.join(names)} — "
                     "the same algorithm under two names, or a setting that changes nothing here.")
    recipe = [c for c in swept if c.startswith(("train.", "data."))]
    if recipe:
        lines.append(f"The training recipe differs between runs ({', '.join(recipe)}): it is part of every "
                     "label; compare configurations with the same recipe.")
    return lines
