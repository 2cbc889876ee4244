"""The figures drawn from the leaderboard: accuracy and leakage vs the requested ε, configurations at matched ε,
learning curves, communication density, utility vs leakage, leakage over the training trajectory, and
accuracy and leakage vs each swept setting."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from dpeval import leaderboard as lb
from dpeval.core.result_keys import AttackKey
from dpeval.core.states import in_order
from dpeval.headlines import (
    attack_facts,
    finite,
    fmt,
    headline_label,
    is_number,
    metric_label,
    read,
    states_of,
)
from dpeval.report.files import save_drawing
from dpeval.report.labels import (
    CATEGORIES,
    MAX_DRAWN,
    UTILITY,
    UTILITY_LABEL,
    Figures,
    axis_label,
    category,
    colours,
    line_colours,
    line_label,
    metrics_of,
    point_label,
    private,
    requested_epsilon,
    sort_key,
    spread_note,
    swept_columns,
    swept_parameters,
    too_many,
)
from dpeval.results import RunResult


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
        plots.append((f"Utility vs leakage ({attack})", save_drawing(fig, out_dir, stem, f"utility_vs_{attack}")))
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
        drawn = [r for r in sorted(records, key=lambda r: sort_key(r, swept))
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
        plots.append((f"Leakage over training ({attack})", save_drawing(fig, out_dir, stem, f"trajectory_{attack}")))
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
        metrics = metrics_of(rated)
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
        plots.append((f"Accuracy and leakage vs {param}", save_drawing(fig, out_dir, stem, f"trend_{name}")))
    return plots


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


def versus_epsilon(records: list[dict[str, Any]], out_dir: Path, stem: str) -> Figures:
    """Accuracy and each attack's headline against the requested ε, one line per configuration (defense
    and its other varying settings), the non-private runs as reference lines: drawn when the private runs
    ask for at least two values of ε."""
    dp = [r for r in records if requested_epsilon(r) is not None]
    metrics = metrics_of(records)
    if len({requested_epsilon(r) for r in dp}) < 2 or not metrics:
        return []
    swept = swept_columns(records)
    lines: dict[str, list] = defaultdict(list)
    for r in dp:
        lines[line_label(r, swept)].append(r)
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
    return [("Accuracy and leakage vs ε", save_drawing(fig, out_dir, stem, "versus_epsilon"))]


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
    metrics = metrics_of(records)
    if not groups or not metrics:
        return []
    if max(len(rs) for rs in groups.values()) > MAX_DRAWN:
        return too_many("Configurations at matched ε", max(len(rs) for rs in groups.values()))
    palette = line_colours(records, swept)
    width = max(4.8, 0.55 * max(len(rs) for rs in groups.values()) + 2.0)
    fig, axes = plt.subplots(len(metrics), len(groups), figsize=(width * len(groups), 3.9 * len(metrics)),
                             squeeze=False)
    for j, (eps, rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: sort_key(r, swept))
        names = [line_label(r, swept) for r in rs]
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
    return [("Configurations at matched ε", save_drawing(fig, out_dir, stem, "matched_epsilon"))]


def _curves(runs: list[RunResult], key: str) -> dict[str, list[list[float]]]:
    """Per configuration (``group_key``), each seed's per-epoch list ``key`` as recorded (the result key: a run
    recorded without every utility key keeps its curve among its other keys)."""
    found: dict[str, list] = defaultdict(list)
    for run in runs:
        curve = run.flat().get(key)
        if isinstance(curve, list) and len(curve) >= 2 and all(finite(v) for v in curve):
            found[lb.group_key(run)].append(curve)
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


def learning_curves(runs: list[RunResult], records: list[dict[str, Any]], out_dir: Path,
                    stem: str) -> Figures:
    """Test accuracy and mean training loss per epoch, one line per configuration."""
    accuracy, loss = _curves(runs, "utility.test_accuracy_by_epoch"), _curves(runs, "utility.train_loss_by_epoch")
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
    return [("Learning curves", save_drawing(fig, out_dir, stem, "learning_curves"))]


def density_curves(runs: list[RunResult], records: list[dict[str, Any]], out_dir: Path,
                   stem: str) -> Figures:
    """The released density per epoch for the configurations that sparsify (any epoch below 1)."""
    density = _curves(runs, "comm.density_by_epoch")
    curves = {k: seeds for k, seeds in density.items() if any(v < 1 for c in seeds for v in c)}
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
    return [("Communication density over training", save_drawing(fig, out_dir, stem, "density"))]
