"""``dpeval report``: one self-contained HTML page (images embedded) with the figures and the table a paper
needs, every figure also written beside the HTML as PNG and as vector SVG (``<stem>_<figure>.png|svg``;
text stays text, so labels can be edited or searched).

Sections: the seed-grouped leaderboard (what was swept, accuracy, each attack's headline, verdict and
worst state, Pareto marks; settings common to every row in one line above it); utility vs leakage per
attack (every point labelled with its swept value, filled = leaks / hollow = no leak detected, the
data-free baseline or chance level as a line, the Pareto front through the marked points only); leakage
over the training trajectory per attack (per-state headline against the attacked states); accuracy and
leakage vs each swept numeric setting; ROC curves (log-log) of membership attacks; reconstructions as
one compact grid per attack (swept value × seed, originals over the worst state's reconstructions); and
the pictures a run names that cannot be found.

Artefact paths in results are relative to the results folder (``harness.runner.artefact_path``), so a
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
import json
import math
import textwrap
import zipfile
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from harness import __version__  # noqa: E402
from harness.core.errors import brief  # noqa: E402
from harness import leaderboard as lb  # noqa: E402
from harness.core.states import in_order  # noqa: E402
from harness.headlines import fmt, headline_label, is_number, metric_label, read, states_of  # noqa: E402

MAX_PICTURES = 24        # pictures shown one by one (runs without an image array)
CELL_IMAGES = 6          # targets shown per run in a reconstruction grid
SUMMARY = ["dataset", "model", "defense", "attack", "privacy.epsilon"]
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


def _save(fig: plt.Figure, out_dir: Path, stem: str, name: str) -> Path:
    """PNG (embedded in the page) and SVG (vector, text kept as text) beside the HTML; returns the PNG."""
    path = out_dir / f"{stem}_{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(path.with_suffix(".svg"), bbox_inches="tight")
    plt.close(fig)
    return path


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


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
    from attacks import ATTACKS
    from defenses import DEFENSES

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


def point_label(record: dict[str, Any], swept: list[str]) -> str:
    """What distinguishes this configuration: its swept values (``final_rate=0.5``)."""
    return ", ".join(f"{setting_name(c)}={_fmt(record.get(c))}" for c in swept if c in record) or str(record.get("defense"))


def swept_columns(records: list[dict[str, Any]]) -> list[str]:
    """What varies between configurations: the summary columns and the settings (``varying_settings``)."""
    summary = [c for c in ("defense", "dataset", "model", "privacy.epsilon")
               if len({repr(r.get(c)) for r in records}) > 1]
    return summary + lb.varying_settings(records)


def swept_parameters(records: list[dict[str, Any]]) -> list[str]:
    """Numeric ``defense.*`` / ``attack.*`` settings whose value varies across the records: the swept knobs."""
    return [c for c in lb.varying_settings(records)
            if all(is_number(r.get(c)) for r in records if c in r) and any(c in r for r in records)]


def _sort_key(record: dict[str, Any], swept: list[str]) -> tuple:
    return tuple((0, record[c], "") if is_number(record.get(c)) else (1, 0, str(record.get(c))) for c in swept)


# ---------------------------------------------------------------------------------------------------
# The table


def table(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(one line of the settings every row shares, the leaderboard as an HTML table that fits the page)."""
    keys = {c for r in records for c in r}
    swept = swept_columns(records)
    common = [f"{c.split('.')[-1]} {html.escape(_fmt(records[0].get(c)))}" for c in SUMMARY
              if c in keys and c not in swept]
    columns: list[tuple[str, str]] = [("n", "n")] + [(c, setting_name(c)) for c in swept]
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
        columns += [(c, name) for c, name in ((f"leakage.{attack}.verdict", f"{attack} verdict"),
                                              (f"leakage.{attack}.state", f"{attack} worst state"),
                                              (f"pareto.{attack}", f"Pareto ({attack})")) if c in keys]
    names = dict(columns)
    columns = [(c, names.get(c, c)) for c in lb.with_paper(list(names), keys, brief=True) if c in keys]
    head = "".join(f'<th title="{html.escape(c)}">{html.escape(name)}</th>' for c, name in columns)
    body = []
    for r in sorted(records, key=lambda r: _sort_key(r, swept)):
        cells = []
        for c, _ in columns:
            text = _fmt(r.get(c))
            sem = r.get(f"{c}.sem")
            if is_number(sem) and sem > 0:
                text += f" ± {sem:.2g}"
            cls = ' class="leaks"' if c.endswith(".verdict") and str(r.get(c)) != "no-leak-detected" else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ", ".join(common), f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# ---------------------------------------------------------------------------------------------------
# Figures


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
    found = {s for r in records for s in str(r.get(f"leakage.{attack}.state") or "").split("|") if s}
    return f" — worst state {', '.join(in_order(found))}" if found else ""


CATEGORIES = {  # how a point is drawn by what its verdict says
    "leaks": ("o", "full"), "leaks in some seeds": ("o", "left"), "no leak detected": ("o", "none"),
    "no verdict": ("D", "none"),
}


def category(record: dict[str, Any], attack: str) -> str:
    head = read(record, attack)
    if head is None or not head.verdict:
        return "no verdict"
    if head.verdict == "no-leak-detected":
        return "no leak detected"
    return "leaks" if head.verdict == "leaks" else "leaks in some seeds"


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


def utility_vs_leakage(records: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    plots = []
    keys = {c for r in records for c in r}
    swept = swept_columns(records)
    for attack in lb.attacks_in(records):
        found = lb.headline(keys, attack)
        if not found:
            continue
        metric, _ = found
        points = [r for r in records if is_number(r.get(metric)) and math.isfinite(r[metric])
                  and is_number(r.get(UTILITY))]
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
        ax.set_title(f"Utility vs leakage: {attack} (mean ± SEM over seeds)", fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        place_labels(ax, labels)
        plots.append((f"Utility vs leakage ({attack})", _save(fig, out_dir, stem, f"utility_vs_{attack}")))
    return plots


def trajectories(records: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    """Per attack with per-state results: the headline at each attacked state, one line per configuration."""
    plots = []
    swept = swept_columns(records)
    for attack in lb.attacks_in(records):
        found = lb.headline({c for r in records for c in r}, attack)
        states = in_order({s for r in records for s in states_of(r, attack)})
        if not found or len(states) < 2:
            continue
        metric = found[0].rsplit(".", 1)[1]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for r in sorted(records, key=lambda r: _sort_key(r, swept)):
            xs = [i for i, s in enumerate(states) if is_number(r.get(f"leakage.{attack}.{s}.{metric}"))]
            if not xs:
                continue
            ys = [r[f"leakage.{attack}.{states[i]}.{metric}"] for i in xs]
            err = [r.get(f"leakage.{attack}.{states[i]}.{metric}.sem", 0) for i in xs]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=point_label(r, swept))
        _reference_line(ax, records, attack, vertical=False)
        ax.set_xticks(range(len(states)), states)
        ax.set_xlabel("attacked model state (training order)")
        ax.set_ylabel(headline_label(attack))
        ax.set_title(f"Leakage over training: {attack} (mean ± SEM over seeds)", fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        plots.append((f"Leakage over training ({attack})", _save(fig, out_dir, stem, f"trajectory_{attack}")))
    return plots


def trends(records: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    """Accuracy and each attack's headline leakage against every swept numeric setting, one line per
    defense (mean ± SEM over seeds), with each attack's baseline or chance level."""
    plots = []
    for param in swept_parameters(records):
        rated = [r for r in records if is_number(r.get(param))]
        keys = {c for r in rated for c in r}
        heads = [(a, h[0]) for a in lb.attacks_in(rated) if (h := lb.headline(keys, a))]
        metrics = [(UTILITY, UTILITY_LABEL, None)] + [(m, headline_label(a), a) for a, m in heads]
        cols = min(2, len(metrics))
        rows = math.ceil(len(metrics) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.3 * rows), squeeze=False)
        for ax in axes.flat[len(metrics):]:
            ax.set_axis_off()
        for ax, (metric, label, attack) in zip(axes.flat, metrics):
            lines: dict[str, list] = defaultdict(list)
            for r in rated:
                if is_number(r.get(metric)):
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
        fig.suptitle(f"Accuracy and leakage vs {param} (mean ± SEM over seeds)", fontsize=10)
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
               stem: str, damaged: list[str] | None = None) -> list[tuple[str, Path]]:
    """One log-log ROC figure per membership attack; a ROC file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    curves: dict[str, list] = defaultdict(list)
    for row in rows:
        for key, value in row["metrics"].items():
            if key.startswith("artefacts.") and key.endswith(".roc"):
                path = resolve_artefact(value, root, row["run_id"])
                if path is None:
                    continue
                try:
                    fpr, tpr, floor = read_roc(path)
                except ARTEFACT_ERRORS as exc:
                    damaged.append(damaged_line(row, key, path, exc))
                    continue
                n_out = row["metrics"].get(f"leakage.{key.split('.')[1]}.n_nonmembers")
                floor = floor or (1 / n_out if is_number(n_out) and n_out > 0 else 1e-5)
                curves[key.split(".")[1]].append((lb.flat_row(row), fpr, tpr, floor))
    plots = []
    for attack, items in sorted(curves.items()):
        fig, ax = plt.subplots(figsize=(5.4, 4.6))
        floor = min(i[3] for i in items)  # below 1/n_nonmembers no curve resolves a rate: the axes stop there
        for record, fpr, tpr, _ in sorted(items, key=lambda i: (_sort_key(i[0], swept), str(i[0].get("seed")))):
            auc = record.get(f"leakage.{attack}.auc")
            label = f"{point_label(record, swept)}, seed {record.get('seed')}" + (f", AUC {auc:.3f}" if is_number(auc) else "")
            ax.loglog([max(f, floor) for f in fpr], [max(t, floor) for t in tpr], label=label, lw=1)
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
                         stem: str, damaged: list[str] | None = None) -> tuple[list[tuple[str, Path]], set[str]]:
    """One figure per gradient attack: rows = configurations (swept values), columns = seeds; each cell the
    run's first targets (originals over the worst state's reconstructions) with its PSNR and state.
    Returns the figures and the run ids they cover; an images file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    cells: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for row in rows:
        m = row["metrics"]
        for key, value in m.items():
            if not (key.startswith("artefacts.") and key.endswith(".images")):
                continue
            attack = key.split(".")[1]
            path = resolve_artefact(value, root, row["run_id"])
            if path is None:
                continue
            try:
                flat, recon, psnr, state = read_cell(path, m.get(f"leakage.{attack}.state"))
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
        seeds = sorted({seed for _, seed in found}, key=str)
        shape = next(iter(found.values()))["image"].shape
        width = 2.4  # inches per cell; the height follows the cell's aspect, plus its caption
        fig, axes = plt.subplots(len(configs), len(seeds), squeeze=False,
                                 figsize=(width * len(seeds) + 1.6, (width * shape[0] / shape[1] + 0.3) * len(configs) + 0.5))
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
        record = lb.flat_row(row)
        for key, value in sorted(row["metrics"].items()):
            if not key.startswith("artefacts."):
                continue
            path = resolve_artefact(value, root, row["run_id"])
            if path is None:
                missing.append(f"run {row['run_id']} ({point_label(record, swept)}, seed {record.get('seed')}): "
                               f"{key} = {value}")
            elif (str(value).endswith(".png") and "roc" not in key and row["run_id"] not in skip_runs):
                found.append((f"{key.split('.')[1]} — {point_label(record, swept)}, seed {record.get('seed')}", path))
    return found[:MAX_PICTURES], missing


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

RULES = ("Verdicts: a reconstruction attack <b>leaks</b> when, at some attacked state, its per-target PSNR "
         "beats the best data-free guess by more than 1 dB on so many targets that a one-sided sign test "
         "rejects at 5% (Bonferroni over the states); a membership attack by its own rule (docs/results.md). "
         "Pareto marks only go to configurations that leak: the others tie at “no leakage detected”.")


def write_report(rows: list[dict[str, Any]], out: Path, results: Path | str) -> dict[str, Any]:
    """Write the HTML report and its figures (PNG + PDF) for the store rows of the results folder
    ``results`` (where relative artefact paths point); returns what was written, ``damaged`` listing the
    artefacts that could not be read."""
    out = out.resolve()
    root = Path(results).resolve()
    damaged: list[str] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.stem
    done = lb.latest_per_key([r for r in rows if r["status"] == "done"])
    records = lb.leaderboard(done, seeds_grouped=True)
    swept = swept_columns(records)
    grids, covered = reconstruction_grids(done, root, swept, out.parent, stem, damaged)
    plots = utility_vs_leakage(records, out.parent, stem) + trajectories(records, out.parent, stem) \
        + trends(records, out.parent, stem) + roc_curves(done, root, swept, out.parent, stem, damaged) + grids
    pics, missing = pictures(done, root, swept, covered)
    common, board = table(records) if records else ("", "<p>No finished runs.</p>")
    sections = [f"<h1>dpeval report</h1><p>{len(done)} finished runs in {len(records)} configurations "
                f"(mean ± SEM over seeds); dpeval {__version__}.{f' All runs: {common}.' if common else ''}</p>",
                f"<p class='note'>{RULES}</p>", "<h2>Leaderboard</h2>", board]
    sections += [f"<p class='selection'>{html.escape(line)}</p>"
                 for line in lb.selection_sentences(lb.selection_costs(done))]
    for title, path in plots:
        sections.append(f"<h2>{html.escape(title)}</h2>{_img(path, title)}")
    if pics:
        sections.append("<h2>Pictures</h2>")
        sections += [f"<figure>{_img(p, c)}<figcaption>{html.escape(c)}</figcaption></figure>" for c, p in pics]
    if missing:
        sections.append(f"<h2>Missing pictures</h2><p>{len(missing)} artefact(s) named by the results "
                        f"cannot be found under {html.escape(str(root))}:</p><ul class='missing'>"
                        + "".join(f"<li>{html.escape(line)}</li>" for line in missing) + "</ul>")
    if damaged:
        sections.append(f"<h2>Damaged artefacts</h2><p>{len(damaged)} artefact(s) could not be read and are left "
                        "out of their figures:</p><ul class='missing'>"
                        + "".join(f"<li>{html.escape(line)}</li>" for line in damaged) + "</ul>")
    vector = ", ".join(p.with_suffix(".svg").name for _, p in plots)
    if vector:
        sections.append(f"<p class='note'>Vector versions (SVG) beside this page: {html.escape(vector)}.</p>")
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>dpeval report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")
    out.write_text(page)
    return {"out": str(out), "runs": len(done), "configurations": len(records),
            "plots": [str(p) for _, p in plots], "vector": [str(p.with_suffix(".svg")) for _, p in plots],
            "pictures": len(pics) + len(covered), "missing": missing, "damaged": damaged}
