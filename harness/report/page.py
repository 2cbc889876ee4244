"""The page: every section in order, written with its figures where ``ResultStore.write_outputs`` allows."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from dpeval import __version__
from dpeval import leaderboard as lb
from dpeval.report.artefact_figures import pictures, reconstruction_grids, roc_curves
from dpeval.report.figures import (
    density_curves,
    learning_curves,
    matched_epsilon,
    trajectories,
    trends,
    utility_vs_leakage,
    versus_epsilon,
)
from dpeval.report.files import earlier_output
from dpeval.report.labels import spread_note, swept_columns
from dpeval.report.leaking_records import TrainingImages, exposure_sections
from dpeval.report.markup import bullets, figure, heading, image, page_html, paragraph, wide
from dpeval.report.tables import metric_tables, summary_lines, table
from dpeval.results import RunResult
from dpeval.store import ResultStore

RULES = ("Verdicts: a reconstruction attack leaks when, at some attacked state, its per-target PSNR "
         "beats the best data-free guess by more than 1 dB on so many targets that a one-sided sign test "
         "rejects at 5% (Bonferroni over the states); a membership attack by its own rule (docs/results.md). "
         "Pareto marks only go to configurations that leak: the others tie at “no leakage detected”.")

METRICS_NOTE = ("Every metric each attack reported, per configuration (mean ± SEM over seeds where they differ); "
                "the per-state metrics of an attack over several model states are in the leaderboard CSV.")


def write_report(runs: list[RunResult], out: Path, results: Path | str,
                 training_images: TrainingImages | None = None) -> dict[str, Any]:
    """Write the HTML report and its figures (PNG + SVG) for the runs (``ResultStore.results``) of the results folder
    ``results`` (where relative artefact paths point); returns what was written, ``damaged`` listing the
    artefacts that could not be read. The figures are drawn in a private folder first; then the page and
    every figure are written beside ``out`` as every output file is (``ResultStore.write_outputs``): none
    through a link, none over the store or a file an earlier report did not write, nothing when one is
    refused. ``training_images`` gives the images of a run's private pool for the exposure grids (None: the grids
    say that none were given; the tables are drawn either way)."""
    root = Path(results).resolve()
    with tempfile.TemporaryDirectory(prefix="dpeval-report-") as scratch:
        page, written = _draw_report(runs, out.stem, root, Path(scratch), training_images)
        files = {out.with_name(p.name): p.read_bytes() for p in written["plots"] + written["vector"]}
    ResultStore(results).write_outputs({**files, out: page.encode()}, "--out", earlier_output)
    folder = out.parent.resolve()
    return {**written, "out": str(folder / out.name), "plots": [str(folder / p.name) for p in written["plots"]],
            "vector": [str(folder / p.name) for p in written["vector"]]}


def _draw_report(runs: list[RunResult], stem: str, root: Path, figures: Path,
                 training_images: TrainingImages | None) -> tuple[str, dict[str, Any]]:
    """The page, and what ``write_report`` says it wrote (``plots``, ``vector``: the figures in ``figures``)."""
    damaged: list[str] = []
    done = lb.latest_per_key([r for r in runs if r.status == "done"])
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
    exposure, exposure_plots = exposure_sections(done, root, swept, figures, stem, damaged, training_images)
    sections += exposure
    if tables := metric_tables(records):
        sections += [heading("Attack metrics"), paragraph(METRICS_NOTE, "note")]
        sections += [part for attack, html in tables for part in (heading(attack, 3), wide(html))]
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
