"""The figures drawn from the runs' artefacts: ROC curves of membership attacks, one reconstruction grid per
attack, and the pictures a run names (with those that cannot be found)."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt

from dpeval import leaderboard as lb
from dpeval.core.result_keys import AttackKey
from dpeval.headlines import (
    is_number,
)
from dpeval.report.files import (
    ARTEFACT_ERRORS,
    damaged_line,
    grid_cell,
    read_cell,
    read_roc,
    resolve_artefact,
    save_drawing,
)
from dpeval.report.labels import MAX_DRAWN, MAX_PICTURES, Figures, point_label, sort_key, too_many
from dpeval.results import RunResult


def roc_curves(runs: list[RunResult], root: Path, swept: list[str], out_dir: Path,
               stem: str, damaged: list[str] | None = None) -> Figures:
    """One log-log ROC figure per membership attack; a ROC file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    curves: dict[str, list] = defaultdict(list)
    for run in runs:
        for attack, outcome in run.attacks.items():
            if "roc" not in outcome.artefacts:
                continue
            path = resolve_artefact(outcome.artefacts["roc"], root, run.run_id)
            if path is None:
                continue
            try:
                fpr, tpr, floor = read_roc(path)
            except ARTEFACT_ERRORS as exc:
                damaged.append(damaged_line(run.run_id, str(AttackKey(attack, "roc", "artefacts")), path, exc))
                continue
            n_out = outcome.metrics.get("n_nonmembers")
            floor = floor or (1 / n_out if is_number(n_out) and n_out > 0 else 1e-5)
            curves[attack].append((lb.flat_row(run), fpr, tpr, floor))
    plots = []
    for attack, items in sorted(curves.items()):
        if len(items) > MAX_DRAWN:  # one line per run
            plots += too_many(f"ROC curves ({attack})", len(items))
            continue
        fig, ax = plt.subplots(figsize=(5.4, 4.6))
        floor = min(i[3] for i in items)  # below 1/n_nonmembers no curve resolves a rate: the axes stop there
        configs = list(dict.fromkeys(point_label(i[0], swept)
                                     for i in sorted(items, key=lambda i: sort_key(i[0], swept))))
        seeds = sorted({str(i[0].get("seed")) for i in items})
        styles = ["-", "--", ":", "-."]
        for record, fpr, tpr, _ in sorted(items, key=lambda i: (sort_key(i[0], swept), str(i[0].get("seed")))):
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
        plots.append((f"ROC curves ({attack})", save_drawing(fig, out_dir, stem, f"roc_{attack}")))
    return plots


def reconstruction_grids(runs: list[RunResult], root: Path, swept: list[str], out_dir: Path,
                         stem: str, damaged: list[str] | None = None) -> tuple[Figures, set[str]]:
    """One figure per gradient attack: rows = configurations (swept values), columns = seeds; each cell the
    run's first targets (originals over the worst state's reconstructions) with its PSNR and state.
    Returns the figures and the run ids they cover; an images file that cannot be read adds a line to
    ``damaged``."""
    damaged = [] if damaged is None else damaged
    cells: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for run in runs:
        for attack, outcome in run.attacks.items():
            if "images" not in outcome.artefacts:
                continue
            path = resolve_artefact(outcome.artefacts["images"], root, run.run_id)
            if path is None:
                continue
            try:
                flat, recon, psnr, state = read_cell(path, outcome.metrics.get("state"))
                image = grid_cell(flat, recon)
            except ARTEFACT_ERRORS as exc:
                damaged.append(damaged_line(run.run_id, str(AttackKey(attack, "images", "artefacts")), path, exc))
                continue
            record = lb.flat_row(run)
            cells[attack][(point_label(record, swept), run.seed)] = {
                "image": image, "text": f"seed {run.seed}: {psnr:.1f} dB @{state}",
                "sort": sort_key(record, swept), "run": run.run_id}
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
        plots.append((f"Reconstructions ({attack})", save_drawing(fig, out_dir, stem, f"reconstructions_{attack}")))
    return plots, covered


def pictures(runs: list[RunResult], root: Path, swept: list[str],
             skip_runs: set[str]) -> tuple[list[tuple[str, Path]], list[str]]:
    """(pictures of runs not in a grid, one line per artefact that cannot be found)."""
    found, missing = [], []
    for run in runs:
        artefacts = sorted((str(AttackKey(attack, name, "artefacts")), attack, value)
                           for attack, outcome in run.attacks.items()
                           for name, value in outcome.artefacts.items())
        record = lb.flat_row(run) if artefacts else {}  # only for a run that has artefacts: a store has thousands
        for key, attack, value in artefacts:
            path = resolve_artefact(value, root, run.run_id)
            if path is None:
                missing.append(f"run {run.run_id} ({point_label(record, swept)}, seed {record.get('seed')}): "
                               f"{key} = {value}")
            elif (str(value).endswith(".png") and "roc" not in key and run.run_id not in skip_runs):
                found.append((f"{attack} — {point_label(record, swept)}, seed {record.get('seed')}", path))
    return found[:MAX_PICTURES], missing
