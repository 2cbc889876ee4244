"""``dpeval report``: one self-contained HTML page (images embedded) with the figures and the table a paper
needs, every figure also written beside the HTML as PNG and as vector SVG (``<stem>_<figure>.png|svg``;
text stays text, so labels can be edited or searched).

Sections: a generated summary (what leaks under which attack, which accuracy differences exceed their
SEM, the test-set resolution, identical results, recipe differences); the seed-grouped leaderboard (every
varying setting, accuracy, each attack's headline, verdict and worst state, Pareto marks; settings common
to every run in one line above it); the standard DP figures — accuracy and leakage vs the requested ε with
the non-private runs as reference lines, configurations at matched ε, learning curves (test accuracy,
training loss), communication density over training — each when the runs make it meaningful; utility vs leakage per
attack (every point labelled with its swept value, filled = leaks / hollow = no leak detected, the
data-free baseline or chance level as a line, the Pareto front through the marked points only); leakage
over the training trajectory per attack (per-state headline against the attacked states); accuracy and
leakage vs each swept numeric setting; ROC curves (log-log) of membership attacks; reconstructions as
one compact grid per attack (swept value × seed, originals over the worst state's reconstructions); and
the pictures a run names that cannot be found. A figure that would tell more than ``MAX_DRAWN``
configurations apart is listed under "Figures not drawn" instead. Everything read from the store is text on
the page: the page builder (``heading`` … ``page_html``) is the one place that writes HTML, and escapes it.
The page and the figures are written only where ``ResultStore.write_outputs`` allows (``write_report``).

Artefact paths in results are relative to the results folder (``dpeval.runner.artefact_path``), so a
moved or copied folder still reports its pictures; absolute paths of older runs are read under the
folder's own ``runs/<run_id>/``. An artefact resolves only inside its own run's folder (after following
links): a path that leads elsewhere (``../``, an absolute path, a symlink out) is never read. A file that
cannot be read as its convention says (damaged JSON, a truncated or pickled NPZ) is left out of its figure
and listed in one line under "Damaged artefacts". Artefact conventions read here:
``artefacts.<attack>.roc`` → JSON with ``fpr`` / ``tpr``; ``artefacts.<attack>.images`` → NPZ with
``originals`` [T, B, C, H, W], ``reconstructions`` [S, T, B, C, H, W] (uint8), ``states`` and ``psnr``;
any other ``artefacts.<attack>.*`` ending in ``.png`` is a picture (shown when a run has no NPZ).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import itertools
import json
import math
import re
import tempfile
import textwrap
import zipfile
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # headless: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dpeval import __version__  # noqa: E402
from dpeval import leaderboard as lb  # noqa: E402
from dpeval.core.errors import brief  # noqa: E402
from dpeval.core.files import save_figure  # noqa: E402
from dpeval.core.result_keys import AttackKey  # noqa: E402
from dpeval.core.states import in_order  # noqa: E402
from dpeval.core.verdicts import Mixed, Verdict  # noqa: E402
from dpeval.exposure import Exposure, exposed, exposures, shrink  # noqa: E402
from dpeval.headlines import (  # noqa: E402
    attack_facts,
    finite,
    fmt,
    headline_label,
    is_number,
    metric_label,
    read,
    smallest_p,
    states_of,
    untested,
)
from dpeval.store import ResultStore  # noqa: E402

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


# ---------------------------------------------------------------------------------------------------
# Files


# What reading a damaged artefact raises: unreadable, not JSON / NPZ, pickled, truncated, wrong fields.
ARTEFACT_ERRORS = (OSError, ValueError, KeyError, IndexError, TypeError, EOFError, zipfile.BadZipFile, zlib.error)


def resolve_artefact(value: Any, root: Path, run_id: str) -> Path | None:
    """The file an artefact value names, relative to the results folder ``root`` (an absolute path of an
    older run: its part from ``<run_id>/`` on, under ``root/runs/``); None when it does not exist or
    leads outside ``root/runs/<run_id>/``."""
    if not isinstance(value, str) or not value or not run_id:
        return None
    path = Path(value)
    if path.is_absolute():
        if run_id not in path.parts:
            return None
        path = Path("runs", *path.parts[path.parts.index(run_id):])
    run_dir = (root / "runs" / run_id).resolve()
    candidate = (root / path).resolve()
    return candidate if candidate.is_relative_to(run_dir) and candidate.is_file() else None


def damaged_line(row: dict[str, Any], key: str, path: Path, exc: BaseException) -> str:
    return f"run {row['run_id']}: {key} = {path}: cannot be read ({type(exc).__name__}: {brief(str(exc), 120)})"


PAGE_START = "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>dpeval report</title>"
PNG_START = b"\x89PNG\r\n\x1a\n"


def earlier_output(path: Path) -> bool:
    """Whether the existing file ``path`` is one ``dpeval report`` writes, which a new report may replace: a page
    (by how it starts) or a figure (PNG or SVG drawn by Matplotlib, as all of report's are). The store behind a
    link, or a file of someone else's that has a figure's name, is not."""
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(4096)
    if path.suffix in (".html", ".htm"):
        return head.startswith(PAGE_START.encode())
    drawn = {".png": head.startswith(PNG_START), ".svg": b"<svg" in head}
    return drawn.get(path.suffix, False) and b"Matplotlib" in head


def _save(fig: plt.Figure, out_dir: Path, stem: str, name: str) -> Path:
    """PNG (embedded in the page) and SVG (vector, text kept as text) beside the HTML; returns the PNG. ``name``
    holds names from the store (an attack's, a setting's): the file name keeps their letters, digits, - and _
    only (never a / or ..), numbered where two names come out the same."""
    base = f"{stem}_{re.sub(r'[^A-Za-z0-9_-]+', '_', name)}"
    path = out_dir / f"{base}.png"
    for n in itertools.count(2):
        if not path.exists():
            break
        path = out_dir / f"{base}_{n}.png"
    try:
        save_figure(fig, path, dpi=110, bbox_inches="tight")
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            save_figure(fig, path.with_suffix(".svg"), bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------
# Names and labels


def _fmt(v: Any) -> str:
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
            parts.append(f"{SHORT_NAMES.get(c, setting_name(c))}={_fmt(record.get(c))}")
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


def _sort_key(record: dict[str, Any], swept: list[str]) -> tuple:
    return tuple((0, record[c], "") if is_number(record.get(c)) else (1, 0, str(record.get(c))) for c in swept)


# ---------------------------------------------------------------------------------------------------
# The table


def table(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(one line of the settings every row shares, the leaderboard as an HTML table that fits the page: ``table_html``
    of its header and cells)."""
    keys = {c for r in records for c in r}
    swept = swept_columns(records)
    common = [f"{HEADERS.get(c, SHORT_NAMES.get(c, setting_name(c)))} {_fmt(records[0].get(c))}"
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
    for r in sorted(records, key=lambda r: _sort_key(r, swept)):
        cells = []
        for c, _ in columns:
            text = _fmt(r.get(c)) if c not in swept or c in ("defense", "dataset", "model", "attack") \
                or lb.applies(r, c) else ""
            sem = r.get(f"{c}.sem")
            if is_number(sem) and sem > 0:
                text += f" ± {sem:.2g}"
            key = AttackKey.parse(c)
            cells.append((text, bool(key and key.is_verdict and _leaks(r.get(c)))))
        body.append(cells)
    return ", ".join(common), table_html(columns, body)


# ---------------------------------------------------------------------------------------------------
# Figures

Figures = list[tuple[str, Path | str]]  # (title, the PNG drawn, or why the figure is not drawn)


def too_many(title: str, count: int) -> Figures:
    return [(title, f"not drawn: {count} configurations, more than one figure tells apart ({MAX_DRAWN}); the "
                    "leaderboard lists them all")]


def _reference_line(ax: plt.Axes, records: list[dict[str, Any]], attack: str, vertical: bool) -> None:
    """The data-free baseline (mean over the configurations) or the chance level, as a dashed line."""
    heads = [h for r in records if (h := read(r, attack)) is not None and h.reference is not None]
    if not heads:
        return
    level = float(np.mean([h.reference for h in heads]))
    unit = metric_label(attack).rsplit("(", 1)[-1].rstrip(")") if "(" in metric_label(attack) else ""
    label = f"{heads[0].reference_name} ({fmt(level, 3)}{f' {unit}' if unit else ''})"
    (ax.axvline if vertical else ax.axhline)(level, color="0.35", ls=":", lw=1.2, label=label)


def _legend_outside(ax: plt.Axes) -> None:
    """The legend to the right of the axes, where it hides no point."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _states_text(records: list[dict[str, Any]], attack: str) -> str:
    """" — worst state epoch:7, final": the worst attacked states of these records (seeds may differ)."""
    found = {s for r in records for s in str(r.get(str(AttackKey(attack, "state"))) or "").split("|") if s}
    return f" — worst state {', '.join(in_order(found))}" if found else ""


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


def _leaks(stored: Any) -> bool:
    """Whether a stored verdict (a run's or a group's) says the attack leaks; False without one."""
    verdict = Verdict.parse(stored)
    return verdict is not None and verdict.leaks


def place_labels(ax: plt.Axes, points: list[tuple[float, float, str]]) -> None:
    """Label every point, trying offsets around it until the label overlaps no earlier label (a thin leader
    line joins labels set further away); the last try is kept when every position is taken."""
    fig = ax.figure
    fig.canvas.draw()  # settles the (lazy) autoscaled limits, so positions measured now are final
    ax.set_autoscale_on(False)
    renderer = fig.canvas.get_renderer()
    near = [(5, 4), (5, -11), (-5, 4), (-5, -11)]
    far = [(dx * k, dy * k) for k in (2, 3, 4) for dx, dy in ((8, 8), (8, -12), (-8, 8), (-8, -12), (0, 14), (0, -16))]
    taken: list[Any] = []
    for x, y, text in sorted(points, key=lambda p: (-p[1], p[0])):
        for dx, dy in near + far:
            arrow = {"arrowstyle": "-", "lw": 0.5, "color": "0.5"} if (dx, dy) not in near else None
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7,
                               ha="left" if dx >= 0 else "right", va="center", arrowprops=arrow)
            box = note.get_window_extent(renderer).expanded(1.04, 1.15)
            if not any(box.overlaps(t) for t in taken) or (dx, dy) == far[-1]:
                taken.append(box)
                break
            note.remove()


def utility_vs_leakage(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    plots = []
    keys = {c for r in records for c in r}
    swept = swept_columns(records)
    for attack in lb.attacks_in(records):
        found = lb.headline(keys, attack)
        if not found:
            continue
        metric, _ = found
        points = [r for r in records if finite(r.get(metric)) and finite(r.get(UTILITY))]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        by_defense: dict[str, list] = defaultdict(list)
        for r in points:
            by_defense[str(r.get("defense"))].append(r)
        labels = []
        for index, (defense, rs) in enumerate(sorted(by_defense.items())):
            color = f"C{index}"
            for name, (marker, fill) in CATEGORIES.items():
                group = [r for r in rs if category(r, attack) == name]
                if not group:
                    continue
                ax.errorbar([r[metric] for r in group], [r[UTILITY] for r in group],
                            xerr=[r.get(f"{metric}.sem", 0) for r in group],
                            yerr=[r.get(f"{UTILITY}.sem", 0) for r in group], fmt=marker, color=color, capsize=3,
                            fillstyle=fill, markerfacecolor=color if fill != "none" else "white",
                            markerfacecoloralt="white", label=f"{defense}: {name}{_states_text(group, attack)}")
            if len(points) <= MAX_DRAWN:
                labels += [(r[metric], r[UTILITY], point_label(r, [c for c in swept if c != "defense"]) or defense)
                           for r in rs]
        _reference_line(ax, points, attack, vertical=True)
        front = sorted((r for r in points if r.get(f"pareto.{attack}")), key=lambda r: r[metric])
        if front:
            ax.plot([r[metric] for r in front], [r[UTILITY] for r in front], "k--", lw=1,
                    label="Pareto front (configurations that leak)")
        ax.margins(x=0.15, y=0.12)  # room for the labels of the outermost points
        ax.set_xlabel(headline_label(attack))
        ax.set_ylabel(UTILITY_LABEL)
        unlabelled = f"; {len(points)} configurations, unlabelled" if len(points) > MAX_DRAWN else ""
        ax.set_title(f"Utility vs leakage: {attack} ({spread_note(points)}{unlabelled})", fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        if labels:
            place_labels(ax, labels)
        plots.append((f"Utility vs leakage ({attack})", _save(fig, out_dir, stem, f"utility_vs_{attack}")))
    return plots


def trajectories(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    """Per attack with per-state results: the headline at each attacked state, one line per configuration."""
    plots = []
    swept = swept_columns(records)
    for attack in lb.attacks_in(records):
        found = lb.headline({c for r in records for c in r}, attack)
        states = in_order({s for r in records for s in states_of(r, attack)})
        if not found or len(states) < 2:
            continue
        metric = attack_facts(attack).headline
        columns = [str(AttackKey.at_state(attack, s, metric)) for s in states]
        drawn = [r for r in sorted(records, key=lambda r: _sort_key(r, swept))
                 if any(is_number(r.get(c)) for c in columns)]
        if len(drawn) > MAX_DRAWN:
            plots += too_many(f"Leakage over training ({attack})", len(drawn))
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for r in drawn:
            xs = [i for i, c in enumerate(columns) if is_number(r.get(c))]
            ys = [r[columns[i]] for i in xs]
            err = [r.get(f"{columns[i]}.sem", 0) for i in xs]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=point_label(r, swept))
        _reference_line(ax, records, attack, vertical=False)
        ax.set_xticks(range(len(states)), states)
        ax.set_xlabel("attacked model state (training order)")
        ax.set_ylabel(headline_label(attack))
        ax.set_title(f"Leakage over training: {attack} ({spread_note(records)})", fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        plots.append((f"Leakage over training ({attack})", _save(fig, out_dir, stem, f"trajectory_{attack}")))
    return plots


def trends(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    """Accuracy and each attack's headline leakage against every swept numeric setting, one line per
    defense (mean ± SEM over seeds), with each attack's baseline or chance level."""
    plots = []
    for param in swept_parameters(records):
        rated = [r for r in records if is_number(r.get(param))]
        per_defense: dict[str, set] = defaultdict(set)
        for r in rated:
            per_defense[str(r.get("defense"))].add(r[param])
        rated = [r for r in rated if len(per_defense[str(r.get("defense"))]) > 1]  # a line needs two values
        if not rated:
            continue
        metrics = _metrics_of(rated)
        if not metrics:
            continue
        cols = min(2, len(metrics))
        rows = math.ceil(len(metrics) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.3 * rows), squeeze=False)
        for ax in axes.flat[len(metrics):]:
            ax.set_axis_off()
        for ax, (metric, label, attack) in zip(axes.flat, metrics):
            lines: dict[str, list] = defaultdict(list)
            for r in rated:
                if finite(r.get(metric)):
                    lines[str(r.get("defense"))].append(r)
            for name, rs in sorted(lines.items()):
                rs.sort(key=lambda r: r[param])
                legend = name + (_states_text(rs, attack) if attack else "")
                ax.errorbar([r[param] for r in rs], [r[metric] for r in rs],
                            yerr=[r.get(f"{metric}.sem", 0) for r in rs], marker="o", capsize=3, label=legend)
            if attack:
                _reference_line(ax, rated, attack, vertical=False)
            ax.set_xlabel(axis_label(param, rated), fontsize=8)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(f"Accuracy and leakage vs {param} ({spread_note(rated)})", fontsize=10)
        fig.tight_layout()
        name = param.split(".", 1)[1].replace(".", "_")
        plots.append((f"Accuracy and leakage vs {param}", _save(fig, out_dir, stem, f"trend_{name}")))
    return plots


def read_roc(path: Path) -> tuple[list[float], list[float], float | None]:
    """(fpr, tpr, fpr_floor) of a ROC file; ValueError / KeyError / TypeError when it is not one."""
    data = json.loads(path.read_text())
    fpr, tpr = [float(v) for v in data["fpr"]], [float(v) for v in data["tpr"]]
    if len(fpr) != len(tpr) or not fpr:
        raise ValueError(f"{len(fpr)} false and {len(tpr)} true positive rates")
    floor = data.get("fpr_floor")
    return fpr, tpr, float(floor) if floor else None


def roc_curves(rows: list[dict[str, Any]], root: Path, swept: list[str], out_dir: Path,
               stem: str, damaged: list[str] | None = None) -> Figures:
    """One log-log ROC figure per membership attack; a ROC file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    curves: dict[str, list] = defaultdict(list)
    for row in rows:
        for key, value in row["metrics"].items():
            owner = AttackKey.parse(key, "artefacts")
            if owner and owner.metric == "roc":
                path = resolve_artefact(value, root, row["run_id"])
                if path is None:
                    continue
                try:
                    fpr, tpr, floor = read_roc(path)
                except ARTEFACT_ERRORS as exc:
                    damaged.append(damaged_line(row, key, path, exc))
                    continue
                n_out = row["metrics"].get(str(AttackKey(owner.attack, "n_nonmembers")))
                floor = floor or (1 / n_out if is_number(n_out) and n_out > 0 else 1e-5)
                curves[owner.attack].append((lb.flat_row(row), fpr, tpr, floor))
    plots = []
    for attack, items in sorted(curves.items()):
        if len(items) > MAX_DRAWN:  # one line per run
            plots += too_many(f"ROC curves ({attack})", len(items))
            continue
        fig, ax = plt.subplots(figsize=(5.4, 4.6))
        floor = min(i[3] for i in items)  # below 1/n_nonmembers no curve resolves a rate: the axes stop there
        configs = list(dict.fromkeys(point_label(i[0], swept)
                                     for i in sorted(items, key=lambda i: _sort_key(i[0], swept))))
        seeds = sorted({str(i[0].get("seed")) for i in items})
        styles = ["-", "--", ":", "-."]
        for record, fpr, tpr, _ in sorted(items, key=lambda i: (_sort_key(i[0], swept), str(i[0].get("seed")))):
            auc = record.get(str(AttackKey(attack, "auc")))
            config = point_label(record, swept)
            label = f"{config}, seed {record.get('seed')}" + (f", AUC {auc:.3f}" if is_number(auc) else "")
            # one colour per configuration, one line style per seed
            ax.loglog([max(f, floor) for f in fpr], [max(t, floor) for t in tpr], label=label, lw=1,
                      color=f"C{configs.index(config) % 10}",
                      ls=styles[seeds.index(str(record.get("seed"))) % len(styles)])
        ax.plot([floor, 1], [floor, 1], "k:", lw=1, label="chance")
        ax.set_xlim(floor, 1.05)
        ax.set_ylim(floor, 1.05)
        ax.set_xlabel("false positive rate (log)")
        ax.set_ylabel("true positive rate (log)")
        ax.set_title(f"ROC (log-log): {attack}", fontsize=10)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  ncol=1 if len(items) <= 16 else 2)
        plots.append((f"ROC curves ({attack})", _save(fig, out_dir, stem, f"roc_{attack}")))
    return plots


def _cell(originals: np.ndarray, recon: np.ndarray) -> np.ndarray:
    """Originals (top) over reconstructions (bottom), side by side with 1-pixel white gaps: H x W x C."""
    def strip(images: np.ndarray) -> np.ndarray:
        c, h, _ = images.shape[1:]
        gap = np.full((c, h, 1), 255, np.uint8)
        parts = [p for img in images for p in (img, gap)][:-1]
        return np.concatenate(parts, axis=2)

    top, bottom = strip(originals), strip(recon)
    gap = np.full((top.shape[0], 1, top.shape[2]), 255, np.uint8)
    return np.transpose(np.concatenate([top, gap, bottom], axis=1), (1, 2, 0))


def read_cell(path: Path, state: Any) -> tuple[np.ndarray, np.ndarray, float, str]:
    """(originals, reconstructions at ``state`` or the best one, mean PSNR, state) of an images NPZ, never
    unpickling (``allow_pickle=False``); ARTEFACT_ERRORS when the file is not such an NPZ."""
    with np.load(path, allow_pickle=False) as data:
        states = [str(s) for s in data["states"]]
        k = states.index(state) if state in states else int(np.argmax(data["psnr"].mean(axis=(1, 2))))
        flat = data["originals"].reshape(-1, *data["originals"].shape[2:])[:CELL_IMAGES]
        recon = data["reconstructions"][k].reshape(-1, *flat.shape[1:])[:CELL_IMAGES]
        return flat, recon, float(data["psnr"][k].mean()), states[k]


def reconstruction_grids(rows: list[dict[str, Any]], root: Path, swept: list[str], out_dir: Path,
                         stem: str, damaged: list[str] | None = None) -> tuple[Figures, set[str]]:
    """One figure per gradient attack: rows = configurations (swept values), columns = seeds; each cell the
    run's first targets (originals over the worst state's reconstructions) with its PSNR and state.
    Returns the figures and the run ids they cover; an images file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    cells: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for row in rows:
        m = row["metrics"]
        for key, value in m.items():
            owner = AttackKey.parse(key, "artefacts")
            if not (owner and owner.metric == "images"):
                continue
            attack = owner.attack
            path = resolve_artefact(value, root, row["run_id"])
            if path is None:
                continue
            try:
                flat, recon, psnr, state = read_cell(path, m.get(str(AttackKey(attack, "state"))))
                image = _cell(flat, recon)
            except ARTEFACT_ERRORS as exc:
                damaged.append(damaged_line(row, key, path, exc))
                continue
            record = lb.flat_row(row)
            cells[attack][(point_label(record, swept), m.get("seed"))] = {
                "image": image, "text": f"seed {m.get('seed')}: {psnr:.1f} dB @{state}",
                "sort": _sort_key(record, swept), "run": row["run_id"]}
    plots, covered = [], set()
    for attack, found in sorted(cells.items()):
        configs = sorted({(v["sort"], label) for (label, _), v in found.items()})
        if len(configs) > MAX_DRAWN:  # one row per configuration
            plots += too_many(f"Reconstructions ({attack})", len(configs))
            continue
        seeds = sorted({seed for _, seed in found}, key=str)
        shape = next(iter(found.values()))["image"].shape
        width = 2.4  # inches per cell; the height follows the cell's aspect, plus its caption
        fig, axes = plt.subplots(len(configs), len(seeds), squeeze=False,
                                 figsize=(width * len(seeds) + 1.6,
                                          (width * shape[0] / shape[1] + 0.3) * len(configs) + 0.5))
        for i, (_, label) in enumerate(configs):
            for j, seed in enumerate(seeds):
                ax = axes[i][j]
                ax.set_xticks([])
                ax.set_yticks([])
                cell = found.get((label, seed))
                if cell is None:
                    ax.set_axis_off()
                    continue
                covered.add(cell["run"])
                img = cell["image"]
                ax.imshow(img[..., 0] if img.shape[2] == 1 else img, cmap="gray", vmin=0, vmax=255,
                          interpolation="nearest")
                ax.set_title(cell["text"], fontsize=7)
                if j == 0:
                    ax.set_ylabel("\n".join(textwrap.wrap(label, 22)), fontsize=7, rotation=0, ha="right",
                                  va="center")
        fig.suptitle(f"{attack}: originals (top) over reconstructions at the worst attacked state (bottom)",
                     fontsize=9)
        fig.tight_layout()
        plots.append((f"Reconstructions ({attack})", _save(fig, out_dir, stem, f"reconstructions_{attack}")))
    return plots, covered


def pictures(rows: list[dict[str, Any]], root: Path, swept: list[str],
             skip_runs: set[str]) -> tuple[list[tuple[str, Path]], list[str]]:
    """(pictures of runs not in a grid, one line per artefact that cannot be found)."""
    found, missing = [], []
    for row in rows:
        artefacts = sorted((k, v) for k, v in row["metrics"].items() if k.startswith("artefacts."))
        record = lb.flat_row(row) if artefacts else {}  # only for a run that has artefacts: a store has thousands
        for key, value in artefacts:
            owner = AttackKey.parse(key, "artefacts")
            if owner is None:
                continue
            path = resolve_artefact(value, root, row["run_id"])
            if path is None:
                missing.append(f"run {row['run_id']} ({point_label(record, swept)}, seed {record.get('seed')}): "
                               f"{key} = {value}")
            elif (str(value).endswith(".png") and "roc" not in key and row["run_id"] not in skip_runs):
                found.append((f"{owner.attack} — {point_label(record, swept)}, seed {record.get('seed')}", path))
    return found[:MAX_PICTURES], missing



# ---------------------------------------------------------------------------------------------------
# Which records leak: per-record exposure of the membership games that saved per-example scores

EXPOSURE_FPRS = (0.001, 0.01)  # the false-positive rates at which records are counted as named
EXPOSURE_TOP_K = 50            # the non-private model's most exposed records followed into each defense
EXPOSED_SHOWN = 8              # images per configuration in the grid


@dataclasses.dataclass
class Game:
    """One run's membership game with per-example scores: its records most exposed first."""

    row: dict[str, Any]
    record: dict[str, Any]
    label: str
    records: list[Exposure]


def scored_games(rows: list[dict[str, Any]], root: Path, swept: list[str],
                 damaged: list[str]) -> dict[str, list[Game]]:
    """Attack → the runs whose game saved per-example scores (``artefacts.<attack>.scores``, a CSV), each read into
    exposures; a file that cannot be read adds a line to ``damaged``."""
    games: dict[str, list[Game]] = defaultdict(list)
    for row in rows:
        for key, value in sorted(row["metrics"].items()):
            owner = AttackKey.parse(key, "artefacts")
            if not (owner and owner.metric == "scores" and str(value).endswith(".csv")):
                continue
            path = resolve_artefact(value, root, row["run_id"])
            if path is None:
                continue
            try:
                found = exposures(path)
            except ARTEFACT_ERRORS as exc:
                damaged.append(damaged_line(row, key, path, exc))
                continue
            record = lb.flat_row(row)
            games[owner.attack].append(Game(row, record, point_label(record, swept), found))
    return games


def _reference(game: Game, games: list[Game]) -> Game | None:
    """The non-private run of the same data and seed: whose most exposed records a defense is judged on."""
    return next((g for g in games if not private(g.record) and g.record.get("dataset") == game.record.get("dataset")
                 and g.record.get("seed") == game.record.get("seed") and g is not game), None)


def exposure_rows(games: list[Game]) -> list[list[str]]:
    """One row per configuration: seeds, members, records named at each FPR (mean over seeds), and of the
    non-private model's top k, how many the configuration still names at 1 % FPR and their median FPR."""
    by_label: dict[str, list[Game]] = defaultdict(list)
    for g in games:
        by_label[g.label].append(g)
    out = []
    for label, group in sorted(by_label.items(), key=lambda kv: (private(kv[1][0].record), kv[0])):
        named = [fmt(float(np.mean([len(exposed(g.records, fpr)) for g in group])), 3) for fpr in EXPOSURE_FPRS]
        shrinks = [shrink(ref.records, g.records, EXPOSURE_TOP_K, 0.01) for g in group
                   if private(g.record) and (ref := _reference(g, games)) is not None]
        comparable = [s for s in shrinks if s.missing < s.k]
        still = fmt(float(np.mean([s.still_exposed for s in comparable])), 3) if comparable else "–"
        median = fmt(float(np.median([s.median_fpr for s in comparable])), 2) if comparable else "–"
        out.append([label, str(len(group)), str(len(group[0].records)), *named, still, median])
    return out


def _training_images(row: dict[str, Any], cache: dict[str, Any]) -> tuple[dict[int, np.ndarray] | None, str]:
    """Source index → image (H × W or H × W × C in [0, 1]) of the run's private pool, loaded from its stored
    configuration (once per data configuration); (None, why) when the data cannot be loaded here."""
    from dpeval.config import build_spec
    from dpeval.core.datasets import load_task
    from dpeval.core.errors import ConfigError

    key = json.dumps((row.get("config") or {}).get("data"), sort_keys=True, default=str)
    if key not in cache:
        try:
            task = load_task(build_spec(row.get("config") or {}).data)
            x = task.train.x.numpy()
            x = x[:, 0] if x.shape[1] == 1 else x.transpose(0, 2, 3, 1)
            cache[key] = ({int(i): img for i, img in zip(task.train.source_index.tolist(), x)}, "")
        except (ConfigError, OSError, ValueError) as exc:
            cache[key] = (None, brief(str(exc), 200))
    return cache[key]


def exposure_grid(attack: str, games: list[Game], out_dir: Path, stem: str) -> tuple[Figures, list[str]]:
    """Per configuration (its lowest seed's run), the most exposed training images, each titled with its source
    index and the FPR at which the attack names it; notes for what cannot be shown."""
    first: dict[str, Game] = {}
    for g in sorted(games, key=lambda g: str(g.record.get("seed"))):
        first.setdefault(g.label, g)
    title = f"Most exposed training records ({attack})"
    if len(first) > MAX_DRAWN:
        return too_many(title, len(first)), []
    cache: dict[str, Any] = {}
    shown, notes = [], []
    for label, g in sorted(first.items(), key=lambda kv: (private(kv[1].record), kv[0])):
        images, why = _training_images(g.row, cache)
        if images is None:
            notes.append(f"{attack}, {label}: the training images cannot be loaded here ({why}); the table counts "
                         f"its records")
            continue
        shown.append((label, g, [(e, images[e.index]) for e in g.records[:EXPOSED_SHOWN]
                                 if e.split == "train" and e.index in images]))
    if not shown:
        return [], notes
    fig, axes = plt.subplots(len(shown), EXPOSED_SHOWN, squeeze=False,
                             figsize=(EXPOSED_SHOWN * 1.1 + 1.6, len(shown) * 1.35 + 0.5))
    for i, (label, g, cells) in enumerate(shown):
        for j in range(EXPOSED_SHOWN):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(cells):
                ax.set_axis_off()
                continue
            e, img = cells[j]
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(f"#{e.index} FPR {e.fpr:.2g}", fontsize=6)
            if j == 0:
                ax.set_ylabel("\n".join(textwrap.wrap(f"{label}, seed {g.record.get('seed')}", 22)), fontsize=7,
                              rotation=0, ha="right", va="center")
    fig.suptitle(f"{attack}: the training images named at the lowest false-positive rate (source index, FPR)",
                 fontsize=9)
    fig.tight_layout()
    return [(title, _save(fig, out_dir, stem, f"exposed_{attack}"))], notes


def exposure_sections(rows: list[dict[str, Any]], root: Path, swept: list[str], out_dir: Path, stem: str,
                      damaged: list[str]) -> tuple[list[str], list[Path]]:
    """The page's "Which records leak" section (HTML) and the figures it drew."""
    sections: list[str] = []
    drawn: list[Path] = []
    games = scored_games(rows, root, swept, damaged)
    if not games:
        return sections, drawn
    sections += [heading("Which records leak"), paragraph(
        "A member's exposure is the false-positive rate at which the attack names it: the share of the game's "
        "non-members that score at least as high. Named at an FPR: the members exposed at that rate (mean over "
        f"seeds). Of the non-private model's {EXPOSURE_TOP_K} most exposed records (same data, same seed), how "
        "many a configuration still names at 1 % FPR, and their median exposure there.", "note")]
    head = [("configuration", "configuration"), ("seeds", "seeds"), ("members", "members"),
            *[(f"named_at_{f:g}", f"named at {f * 100:g}% FPR") for f in EXPOSURE_FPRS],
            ("still_named", f"of none's top {EXPOSURE_TOP_K}: still named at 1% FPR"),
            ("median_fpr", f"of none's top {EXPOSURE_TOP_K}: median FPR")]
    for attack, found in sorted(games.items()):
        sections += [heading(f"Exposure under {attack}", 3),
                     table_html(head, [[(cell, False) for cell in row] for row in exposure_rows(found)])]
        plots, notes = exposure_grid(attack, found, out_dir, stem)
        for title, path in plots:
            if isinstance(path, Path):
                sections.append(image(path.read_bytes(), title))
                drawn.append(path)
            else:
                notes.append(f"{title}: {path}")
        if notes:
            sections.append(bullets(notes, "missing"))
    return sections, drawn

# ---------------------------------------------------------------------------------------------------
# The standard DP figures: accuracy and leakage vs ε, defenses at matched ε, learning curves, density


def requested_epsilon(record: dict[str, Any]) -> float | None:
    """The ε a private run asked for (``privacy.epsilon`` as configured), else its accounted ε; None for a
    non-private run."""
    if not private(record):
        return None
    return record[EPSILON] if is_number(record.get(EPSILON)) else record["privacy.epsilon"]


def private(record: dict[str, Any]) -> bool:
    return finite(record.get("privacy.epsilon"))


def spread_note(records: list[dict[str, Any]]) -> str:
    """What the error bars are: "mean ± SEM over 3 seeds", or "n = 1: one seed, no error bars"."""
    ns = sorted({int(r.get("n", 1)) for r in records})
    if ns == [1]:
        return "n = 1: one seed, no error bars"
    seeds = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return f"mean ± SEM over {seeds} seeds" + ("; n = 1 points have no bar" if ns[0] == 1 else "")


def colours(records: list[dict[str, Any]], swept: list[str]) -> dict[str, str]:
    """One colour per configuration label (learning and density curves)."""
    labels = [point_label(r, swept) for r in sorted(records, key=lambda r: _sort_key(r, swept))]
    return {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}


def line_colours(records: list[dict[str, Any]], swept: list[str]) -> dict[str, str]:
    """One colour per configuration apart from ε (``_line_label``): a defense keeps its colour at every ε,
    in the ε figure and the matched-ε figure alike."""
    labels = sorted({_line_label(r, swept) for r in records if requested_epsilon(r) is not None})
    return {label: f"C{i % 10}" for i, label in enumerate(labels)}


def _metrics_of(records: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(column, axis label, attack): accuracy (unless no run had a test set), then each attack's headline."""
    keys = {c for r in records for c in r}
    heads = [(h[0], headline_label(a), a) for a in lb.attacks_in(records) if (h := lb.headline(keys, a))]
    accuracy = [(UTILITY, UTILITY_LABEL, None)] if any(finite(r.get(UTILITY)) for r in records) else []
    return accuracy + heads


def _non_private_lines(ax: plt.Axes, records: list[dict[str, Any]], metric: str, swept: list[str]) -> None:
    """Each non-private configuration's value as a horizontal reference line (± SEM as a band)."""
    shown = [r for r in records if not private(r) and is_number(r.get(metric)) and math.isfinite(r[metric])]
    for r, style in zip(shown, ["--", "-.", ":", (0, (5, 1, 1, 1))] * len(shown)):
        value, sem = r[metric], r.get(f"{metric}.sem", 0) or 0
        line = ax.axhline(value, color="0.2", ls=style, lw=1.1,
                          label=f"non-private: {point_label(r, swept)} ({fmt(value, 3)})")
        if sem:
            ax.axhspan(value - sem, value + sem, color=line.get_color(), alpha=0.08)


def _paper_markers(ax: plt.Axes, records: list[dict[str, Any]], x_of: Callable[[dict[str, Any]], Any]) -> None:
    """The paper's reported accuracy where a recipe carries one (``paper.test_accuracy``)."""
    marked = [r for r in records if is_number(r.get("paper.test_accuracy")) and x_of(r) is not None]
    for i, r in enumerate(marked):
        ax.errorbar([x_of(r)], [r["paper.test_accuracy"]], yerr=[r.get("paper.test_accuracy.sem") or 0],
                    fmt="*", color="k", ms=9, capsize=3, label="paper's reported accuracy" if i == 0 else None)


def _line_label(record: dict[str, Any], swept: list[str]) -> str:
    return point_label(record, [c for c in swept if c != EPSILON])


def versus_epsilon(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    """Accuracy and each attack's headline against the requested ε, one line per configuration (defense
    and its other varying settings), the non-private runs as reference lines: drawn when the private runs
    ask for at least two values of ε."""
    dp = [r for r in records if requested_epsilon(r) is not None]
    metrics = _metrics_of(records)
    if len({requested_epsilon(r) for r in dp}) < 2 or not metrics:
        return []
    swept = swept_columns(records)
    lines: dict[str, list] = defaultdict(list)
    for r in dp:
        lines[_line_label(r, swept)].append(r)
    if len(lines) > MAX_DRAWN:
        return too_many("Accuracy and leakage vs ε", len(lines))
    cols = min(2, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(metrics):]:
        ax.set_axis_off()
    palette = line_colours(records, swept)
    ticks = sorted({requested_epsilon(r) for r in dp})
    for ax, (metric, label, attack) in zip(axes.flat, metrics):
        for name, rs in sorted(lines.items()):
            rs = sorted((r for r in rs if finite(r.get(metric))), key=requested_epsilon)
            if rs:
                ax.errorbar([requested_epsilon(r) for r in rs], [r[metric] for r in rs],
                            yerr=[r.get(f"{metric}.sem", 0) for r in rs], marker="o", capsize=3,
                            color=palette[name], label=name + (_states_text(rs, attack) if attack else ""))
        _non_private_lines(ax, records, metric, swept)
        if attack:
            _reference_line(ax, dp, attack, vertical=False)
        else:
            _paper_markers(ax, dp, requested_epsilon)
        ax.set_xscale("log")
        ax.set_xticks(ticks, [fmt(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("requested ε (privacy.epsilon as configured)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.margins(x=0.08, y=0.1)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"Accuracy and leakage vs ε ({spread_note(dp)})", fontsize=10)
    fig.tight_layout()
    return [("Accuracy and leakage vs ε", _save(fig, out_dir, stem, "versus_epsilon"))]


def matched_epsilon(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    """Configurations side by side at each requested ε that at least two of them share: accuracy and each
    attack's headline as points with error bars (filled = leaks), the non-private runs as reference
    lines and the attack's baseline or chance level."""
    swept = swept_columns(records)
    by_eps: dict[float, list] = defaultdict(list)
    for r in records:
        if requested_epsilon(r) is not None:
            by_eps[requested_epsilon(r)].append(r)
    groups = {e: rs for e, rs in sorted(by_eps.items()) if len(rs) >= 2}
    metrics = _metrics_of(records)
    if not groups or not metrics:
        return []
    if max(len(rs) for rs in groups.values()) > MAX_DRAWN:
        return too_many("Configurations at matched ε", max(len(rs) for rs in groups.values()))
    palette = line_colours(records, swept)
    width = max(4.8, 0.55 * max(len(rs) for rs in groups.values()) + 2.0)
    fig, axes = plt.subplots(len(metrics), len(groups), figsize=(width * len(groups), 3.9 * len(metrics)),
                             squeeze=False)
    for j, (eps, rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: _sort_key(r, swept))
        names = [_line_label(r, swept) for r in rs]
        for i, (metric, label, attack) in enumerate(metrics):
            ax = axes[i][j]
            for x, r in enumerate(rs):
                if not finite(r.get(metric)):
                    continue
                marker, fill = CATEGORIES[category(r, attack)] if attack else ("o", "full")
                colour = palette[names[x]]
                ax.errorbar([x], [r[metric]], yerr=[r.get(f"{metric}.sem", 0)], fmt=marker, color=colour, ms=7,
                            capsize=4, fillstyle=fill, markerfacecolor=colour if fill != "none" else "white")
            _non_private_lines(ax, records, metric, swept)
            if attack:
                _reference_line(ax, rs, attack, vertical=False)
            else:
                _paper_markers(ax, rs, lambda r, rs=rs: rs.index(r))
            ax.set_xticks(range(len(rs)), names if i == len(metrics) - 1 else [""] * len(rs), rotation=30,
                          ha="right", fontsize=8)
            ax.set_xlim(-0.6, len(rs) - 0.4)
            ax.margins(y=0.12)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
            if i == 0:
                ax.set_title(f"requested ε = {fmt(eps)}", fontsize=9)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best")
    note = "filled = leaks, hollow = no leak detected; " if len(metrics) > 1 else ""
    fig.suptitle(f"Configurations at matched ε ({note}{spread_note(records)})", fontsize=10)
    fig.tight_layout()
    return [("Configurations at matched ε", _save(fig, out_dir, stem, "matched_epsilon"))]


def _curves(rows: list[dict[str, Any]], key: str) -> dict[str, list[list[float]]]:
    """Per configuration (``group_key``), each seed's per-epoch list ``key``."""
    found: dict[str, list] = defaultdict(list)
    for row in rows:
        curve = row["metrics"].get(key)
        if isinstance(curve, list) and len(curve) >= 2 and all(finite(v) for v in curve):
            found[lb.group_key(row)].append(curve)
    return found


def _draw_curves(ax: plt.Axes, curves: dict[str, list], labels: dict[str, str], palette: dict[str, str]) -> None:
    """Mean over seeds per epoch (epochs counted from 1), ± SEM as a band."""
    for key, runs in sorted(curves.items(), key=lambda kv: labels.get(kv[0], "")):
        if key not in labels:
            continue
        length = min(len(c) for c in runs)
        data = np.array([c[:length] for c in runs], dtype=float)
        mean = data.mean(axis=0)
        epochs = np.arange(1, length + 1)
        colour = palette.get(labels[key])
        ax.plot(epochs, mean, marker="o", ms=3, color=colour, label=labels[key])
        if len(runs) > 1:
            sem = data.std(axis=0, ddof=1) / math.sqrt(len(runs))
            ax.fill_between(epochs, mean - sem, mean + sem, color=colour, alpha=0.15, lw=0)


def learning_curves(rows: list[dict[str, Any]], records: list[dict[str, Any]], out_dir: Path,
                    stem: str) -> Figures:
    """Test accuracy and mean training loss per epoch, one line per configuration."""
    accuracy, loss = _curves(rows, "utility.test_accuracy_by_epoch"), _curves(rows, "utility.train_loss_by_epoch")
    if not accuracy and not loss:
        return []
    if len(accuracy.keys() | loss.keys()) > MAX_DRAWN:
        return too_many("Learning curves", len(accuracy.keys() | loss.keys()))
    swept = swept_columns(records)
    labels = {str(r.get("group_key")): point_label(r, swept) for r in records}
    palette = colours(records, swept)
    panels = [(c, name) for c, name in ((accuracy, "test accuracy, higher = better"),
                                         (loss, "mean training loss (cross-entropy), lower = better")) if c]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), squeeze=False)
    for ax, (curves, name) in zip(axes[0], panels):
        _draw_curves(ax, curves, labels, palette)
        positive = [v for runs in curves.values() for c in runs for v in c if math.isfinite(v) and v > 0]
        if "loss" in name and positive and max(positive) / min(positive) > 50:
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    _legend_outside(axes[0][-1])
    fig.suptitle(f"Learning curves ({spread_note(records)})", fontsize=10)
    fig.tight_layout()
    return [("Learning curves", _save(fig, out_dir, stem, "learning_curves"))]


def density_curves(rows: list[dict[str, Any]], records: list[dict[str, Any]], out_dir: Path,
                   stem: str) -> Figures:
    """The released density per epoch for the configurations that sparsify (any epoch below 1)."""
    curves = {k: runs for k, runs in _curves(rows, "comm.density_by_epoch").items()
              if any(v < 1 for c in runs for v in c)}
    if not curves:
        return []
    if len(curves) > MAX_DRAWN:
        return too_many("Communication density over training", len(curves))
    swept = swept_columns(records)
    labels = {str(r.get("group_key")): point_label(r, swept) for r in records}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    _draw_curves(ax, curves, labels, colours(records, swept))
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("released fraction of the trainable coordinates\n(mean per step over the epoch)", fontsize=9)
    ax.set_title("Communication density over training (sparsifying defenses)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return [("Communication density over training", _save(fig, out_dir, stem, "density"))]


# ---------------------------------------------------------------------------------------------------
# The generated summary


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


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.78em; margin: 0.6em 0; width: 100%; table-layout: auto; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.4em; text-align: right; }
th { background: #f3f3f3; font-weight: 600; white-space: normal; vertical-align: bottom; }
td { white-space: nowrap; } td.leaks { color: #a00; font-weight: 600; }
img { max-width: 100%; margin: 0.4em 0; } figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figcaption { font-size: 0.8em; color: #555; max-width: 420px; }
p.note { font-size: 0.85em; color: #444; } ul.missing { font-size: 0.8em; color: #a00; }
"""

# ---------------------------------------------------------------------------------------------------
# The page: the one place where text becomes HTML. Everything above produces plain text (names, settings,
# paths and messages read from a store among it); these functions escape all of it, so none becomes markup.

Line = str | tuple[str, str]  # a summary line, or (a lead set in bold, the rest of the line)


def _text(value: Any, attribute: bool = False) -> str:
    return html.escape(str(value), quote=attribute)


def _class(name: str) -> str:
    return f' class="{_text(name, True)}"' if name else ""


def heading(title: str, level: int = 2) -> str:
    return f"<h{level}>{_text(title)}</h{level}>"


def paragraph(text: str, cls: str = "") -> str:
    return f"<p{_class(cls)}>{_text(text)}</p>"


def bullets(lines: list[Line], cls: str) -> str:
    items = "".join(f"<li><b>{_text(line[0])}</b>{_text(line[1])}</li>" if isinstance(line, tuple)
                    else f"<li>{_text(line)}</li>" for line in lines)
    return f"<ul{_class(cls)}>{items}</ul>"


def table_html(head: list[tuple[str, str]], rows: list[list[tuple[str, bool]]]) -> str:
    """``head``: (column key, shown on hover; header); ``rows``: cells (text, whether it is a verdict that leaks)."""
    header = "".join(f'<th title="{_text(key, True)}">{_text(name)}</th>' for key, name in head)
    body = "".join("<tr>" + "".join(f"<td{_class('leaks' if leaks else '')}>{_text(text)}</td>" for text, leaks in row)
                   + "</tr>" for row in rows)
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{_text(alt, True)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def figure(png: bytes, caption: str) -> str:
    return f"<figure>{image(png, caption)}<figcaption>{_text(caption)}</figcaption></figure>"


def page_html(sections: list[str]) -> str:
    return f"{PAGE_START}<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>"


RULES = ("Verdicts: a reconstruction attack leaks when, at some attacked state, its per-target PSNR "
         "beats the best data-free guess by more than 1 dB on so many targets that a one-sided sign test "
         "rejects at 5% (Bonferroni over the states); a membership attack by its own rule (docs/results.md). "
         "Pareto marks only go to configurations that leak: the others tie at “no leakage detected”.")


def write_report(rows: list[dict[str, Any]], out: Path, results: Path | str) -> dict[str, Any]:
    """Write the HTML report and its figures (PNG + SVG) for the store rows of the results folder
    ``results`` (where relative artefact paths point); returns what was written, ``damaged`` listing the
    artefacts that could not be read. The figures are drawn in a private folder first; then the page and
    every figure are written beside ``out`` as every output file is (``ResultStore.write_outputs``): none
    through a link, none over the store or a file an earlier report did not write, nothing when one is
    refused."""
    root = Path(results).resolve()
    with tempfile.TemporaryDirectory(prefix="dpeval-report-") as scratch:
        page, written = _draw_report(rows, out.stem, root, Path(scratch))
        files = {out.with_name(p.name): p.read_bytes() for p in written["plots"] + written["vector"]}
    ResultStore(results).write_outputs({**files, out: page.encode()}, "--out", earlier_output)
    folder = out.parent.resolve()
    return {**written, "out": str(folder / out.name), "plots": [str(folder / p.name) for p in written["plots"]],
            "vector": [str(folder / p.name) for p in written["vector"]]}


def _draw_report(rows: list[dict[str, Any]], stem: str, root: Path, figures: Path) -> tuple[str, dict[str, Any]]:
    """The page, and what ``write_report`` says it wrote (``plots``, ``vector``: the figures in ``figures``)."""
    damaged: list[str] = []
    done = lb.latest_per_key([r for r in rows if r["status"] == "done"])
    costs = lb.selection_costs(done)
    records = lb.leaderboard(done, seeds_grouped=True, costs=costs)
    swept = swept_columns(records)
    grids, covered = reconstruction_grids(done, root, swept, figures, stem, damaged)
    plots = versus_epsilon(records, figures, stem) + matched_epsilon(records, figures, stem) \
        + learning_curves(done, records, figures, stem) + density_curves(done, records, figures, stem) \
        + utility_vs_leakage(records, figures, stem) + trajectories(records, figures, stem) \
        + trends(records, figures, stem) + roc_curves(done, root, swept, figures, stem, damaged) + grids
    pics, missing = pictures(done, root, swept, covered)
    not_drawn = [f"{title}: {why}" for title, why in plots if isinstance(why, str)]
    plots = [(title, path) for title, path in plots if isinstance(path, Path)]
    common, board = table(records) if records else ("", paragraph("No finished runs."))
    summary = summary_lines(records)
    sections = [heading("dpeval report", 1),
                paragraph(f"{len(done)} finished runs in {len(records)} configurations "
                          f"({spread_note(records) if records else 'none'}); dpeval {__version__}."
                          f"{f' All runs: {common}.' if common else ''}")]
    if summary:
        sections += [heading("Summary"), bullets(summary, "summary")]
    sections += [paragraph(RULES, "note"), heading("Leaderboard"), board]
    sections += [paragraph(line, "selection") for line in lb.selection_sentences(costs)]
    for title, path in plots:
        sections += [heading(title), image(path.read_bytes(), title)]
    exposure, exposure_plots = exposure_sections(done, root, swept, figures, stem, damaged)
    sections += exposure
    plots += [(p.stem, p) for p in exposure_plots]
    if not_drawn:
        sections += [heading("Figures not drawn"), bullets(not_drawn, "missing")]
    if pics:
        sections += [heading("Pictures")] + [figure(p.read_bytes(), c) for c, p in pics]
    if missing:
        sections += [heading("Missing pictures"),
                     paragraph(f"{len(missing)} artefact(s) named by the results cannot be found under {root}:"),
                     bullets(missing, "missing")]
    if damaged:
        sections += [heading("Damaged artefacts"),
                     paragraph(f"{len(damaged)} artefact(s) could not be read and are left out of their figures:"),
                     bullets(damaged, "missing")]
    vector = ", ".join(p.with_suffix(".svg").name for _, p in plots)
    if vector:
        sections.append(paragraph(f"Vector versions (SVG) beside this page: {vector}.", "note"))
    page = page_html(sections)
    return page, {"runs": len(done), "configurations": len(records), "plots": [p for _, p in plots],
                  "vector": [p.with_suffix(".svg") for _, p in plots], "pictures": len(pics) + len(covered),
                  "missing": missing, "damaged": damaged}
