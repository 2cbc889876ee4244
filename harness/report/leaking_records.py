"""The "Which records leak" section: per-record exposure read from the membership games' per-example scores,
the table per configuration and the grid of the most exposed training images. The images are handed in by
the caller (``write_report``'s ``training_images``): the report reads stored artefacts only, never a data set."""

from __future__ import annotations

import dataclasses
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import matplotlib.pyplot as plt
import numpy as np

from dpeval import leaderboard as lb
from dpeval.core.result_keys import AttackKey
from dpeval.exposure import Exposure, exposed, exposures, shrink
from dpeval.headlines import (
    fmt,
)
from dpeval.report.files import ARTEFACT_ERRORS, damaged_line, resolve_artefact, save_drawing
from dpeval.report.labels import MAX_DRAWN, Figures, point_label, private, too_many
from dpeval.report.markup import bullets, heading, image, paragraph, table_html
from dpeval.results import RunResult

EXPOSURE_FPRS = (0.001, 0.01)  # the false-positive rates at which records are counted as named


EXPOSURE_TOP_K = 50            # the non-private model's most exposed records followed into each defense


EXPOSED_SHOWN = 8              # images per configuration in the grid


@dataclasses.dataclass
class ScoredGame:
    """One run's membership game with per-example scores: its records most exposed first."""

    run: RunResult
    record: dict[str, Any]
    label: str
    records: list[Exposure]


def scored_games(runs: list[RunResult], root: Path, swept: list[str],
                 damaged: list[str]) -> dict[str, list[ScoredGame]]:
    """Attack → the runs whose game saved per-example scores (``artefacts.<attack>.scores``, a CSV), each read into
    exposures; a file that cannot be read adds a line to ``damaged``."""
    games: dict[str, list[ScoredGame]] = defaultdict(list)
    for run in runs:
        for attack, outcome in run.attacks.items():
            value = outcome.artefacts.get("scores")
            if not str(value).endswith(".csv"):
                continue
            path = resolve_artefact(value, root, run.run_id)
            if path is None:
                continue
            try:
                found = exposures(path)
            except ARTEFACT_ERRORS as exc:
                damaged.append(damaged_line(run.run_id, str(AttackKey(attack, "scores", "artefacts")), path, exc))
                continue
            record = lb.flat_row(run)
            games[attack].append(ScoredGame(run, record, point_label(record, swept), found))
    return games


def _reference(game: ScoredGame, games: list[ScoredGame]) -> ScoredGame | None:
    """The non-private run of the same data and seed: whose most exposed records a defense is judged on."""
    return next((g for g in games if not private(g.record) and g.record.get("dataset") == game.record.get("dataset")
                 and g.record.get("seed") == game.record.get("seed") and g is not game), None)


def exposure_rows(games: list[ScoredGame]) -> list[list[str]]:
    """One row per configuration: seeds, members, records named at each FPR (mean over seeds), and of the
    non-private model's top k, how many the configuration still names at 1 % FPR and their median FPR."""
    by_label: dict[str, list[ScoredGame]] = defaultdict(list)
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


# Source index → image (H × W or H × W × C in [0, 1]) of a run's private pool, or (None, why not): given by the
# caller, since the report reads stored artefacts only (``dpeval.training_images.loader`` for ``dpeval report``).
TrainingImages = Callable[[RunResult], tuple[dict[int, np.ndarray] | None, str]]


def exposure_grid(attack: str, games: list[ScoredGame], out_dir: Path, stem: str,
                  training_images: TrainingImages | None) -> tuple[Figures, list[str]]:
    """Per configuration (its lowest seed's run), the most exposed training images, each titled with its source
    index and the FPR at which the attack names it; notes for what cannot be shown."""
    first: dict[str, ScoredGame] = {}
    for g in sorted(games, key=lambda g: str(g.record.get("seed"))):
        first.setdefault(g.label, g)
    title = f"Most exposed training records ({attack})"
    if len(first) > MAX_DRAWN:
        return too_many(title, len(first)), []
    shown, notes = [], []
    for label, g in sorted(first.items(), key=lambda kv: (private(kv[1].record), kv[0])):
        images, why = training_images(g.run) if training_images else (None, "no images were given")
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
    return [(title, save_drawing(fig, out_dir, stem, f"exposed_{attack}"))], notes


def exposure_sections(runs: list[RunResult], root: Path, swept: list[str], out_dir: Path, stem: str,
                      damaged: list[str], training_images: TrainingImages | None) -> tuple[list[str], list[Path]]:
    """The page's "Which records leak" section (HTML) and the figures it drew."""
    sections: list[str] = []
    drawn: list[Path] = []
    games = scored_games(runs, root, swept, damaged)
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
        plots, notes = exposure_grid(attack, found, out_dir, stem, training_images)
        for title, path in plots:
            if isinstance(path, Path):
                sections.append(image(path.read_bytes(), title))
                drawn.append(path)
            else:
                notes.append(f"{title}: {path}")
        if notes:
            sections.append(bullets(notes, "missing"))
    return sections, drawn
