"""A paper's table measured from the runs of its recipes: per cell and arm, the best grid point (the recipes tune
what the paper leaves out on a small grid, three seeds a point), its mean ± SEM beside the paper's number, each
arm against the table's baseline arm, and a reading per cell.

    python bench/paper_tables.py RESULTS... --table "AdaCliP:Table 1" --baseline "Abadi et al" [--doc FILE]
    python bench/paper_tables.py RESULTS... --table "GEP:Table 1" --baseline GP --doc docs/reproducing.md

Rows are the finished runs of the results folders whose ``paper.source`` contains the text before the colon and
whose ``paper.table`` is the text after it. A recipe's ``paper.row`` names its cell and arm: "ARM; CELL" (AdaCliP:
"Abadi et al; ε = 1 (logistic regression)") or "DATA, ARM, CELL" (GEP: "MNIST, GP, ε = 2"). Within a row, runs
that differ only in the seed are one grid point; the point with the best mean test accuracy is the row's result
(chosen on the test set as the papers' own grid searches are, so it is optimistic by the winner's curse; the
privacy price of choosing among the row's points is the leaderboard's ``privacy.selection_epsilon``). Ours − paper
is a t interval over our seeds (the paper's SEM added where the recipe gives one). Arm − baseline: Welch's 95%
interval between the two chosen points. Reading: *reproduced* when ours − paper is within 1.5 points or its
interval holds 0; the arm's gain over the baseline *in sign* when our interval lies on the paper's side of 0, *in
size* when it also holds the paper's gain. ``--doc FILE`` writes the table between the file's
``<!-- paper-table:SOURCE:TABLE:start/end -->`` markers.

Two stages (cheaper than every grid point at every seed, and the chosen point's other seeds are not the ones it
was chosen on): run the grid recipes at seed 0 (``sed 's/^seeds: .*/seeds: [0]/'``), then

    python bench/paper_tables.py RESULTS --second-stage OUT_DIR RECIPE...

writes, per grid recipe, the recipe of its best point at seed 0 with ``seeds: [1, 2]`` into OUT_DIR; sweeping
those completes three seeds of every chosen point.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from dpeval.doc_markers import write_into
from dpeval.leaderboard import group_key, leaderboard
from dpeval.store import ResultStore

ACC = "utility.test_accuracy"
TOLERANCE = 0.015  # a baseline further below its paper than this has its cause found first (docs/reproducing.md)


@dataclass
class Point:
    """One arm of one cell: the chosen grid point."""

    cell: str
    arm: str
    paper: float
    paper_sem: float
    mean: float
    sem: float
    n: int
    configs: int                 # grid points of the row
    selection_epsilon: float     # the price of choosing one of them (NaN with one)
    settings: str                # what the chosen point set, for the reader


def split_row(row: str) -> tuple[str, str]:
    """(cell, arm) of a recipe's ``paper.row``."""
    if ";" in row:
        arm, cell = (p.strip() for p in row.split(";", 1))
        return cell, arm
    parts = [p.strip() for p in row.split(",")]
    if len(parts) < 3:
        raise ValueError(f"paper.row {row!r}: neither 'ARM; CELL' nor 'DATA, ARM, CELL'")
    data, arm, cell = parts[0], parts[1], ", ".join(parts[2:])
    match = re.match(r"(ε = [\d.]+)\s*(.*)", cell)
    if match and match.group(2):  # a variant of the arm (e.g. at another σ) keeps the cell, names the arm
        return f"{data}, {match.group(1)}", f"{arm} {match.group(2)}"
    return f"{data}, {cell}", arm


def number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def grid_settings(record: dict, varying: list[str]) -> str:
    return ", ".join(f"{k.split('.', 1)[1]} {record.get(k)}" for k in varying) or "the recipe's"


def chosen_points(folders: list[Path], source: str, table: str) -> list[Point]:
    runs = [r for folder in folders for r in ResultStore(folder).results("done")]
    records = [r for r in leaderboard(runs, seeds_grouped=True)
               if source in str(r.get("paper.source", "")) and str(r.get("paper.table")) == table]
    by_row: dict[str, list[dict]] = {}
    for r in records:
        by_row.setdefault(str(r["paper.row"]), []).append(r)
    per_seed: dict[str, dict[int, float]] = {}  # configuration (group key) → seed → test accuracy
    for r in runs:
        per_seed.setdefault(group_key(r), {})[r.seed] = number(r.flat().get(ACC))
    points = []
    for row, group in sorted(by_row.items()):
        settings = sorted({k for r in group for k in r if k.startswith(("train.", "defense.", "model."))})
        varying = [k for k in settings if len({str(r.get(k)) for r in group}) > 1]
        best = max(group, key=lambda r: choice_score(r, group, per_seed))
        cell, arm = split_row(row)
        points.append(Point(cell, arm, number(best.get("paper.test_accuracy")),
                            number(best.get("paper.test_accuracy.sem")), number(best.get(ACC)),
                            number(best.get(f"{ACC}.sem")), int(best.get("n", 1)), len(group),
                            number(best.get("privacy.selection_epsilon")), grid_settings(best, varying)))
    return points


def choice_score(record: dict, group: list[dict], per_seed: dict[str, dict[int, float]]) -> float:
    """What a row's point is chosen by: its mean test accuracy over the seeds every point of the row has (seed 0
    after a two-stage grid, so a point is never preferred for having fewer, luckier seeds; all of them where every
    point ran every seed)."""
    common = set.intersection(*(set(per_seed.get(r["group_key"], {})) for r in group))
    values = [per_seed[record["group_key"]][s] for s in common]
    return sum(values) / len(values) if values else number(record.get(ACC))


def interval(mean: float, sem: float, n: int) -> tuple[float, float]:
    if n < 2 or not math.isfinite(sem):
        return math.nan, math.nan
    half = stats.t.ppf(0.975, n - 1) * sem
    return mean - half, mean + half


def welch(a: Point, b: Point) -> tuple[float, float, float]:
    """a − b with Welch's 95% interval (NaN bounds while an arm has one seed)."""
    diff = a.mean - b.mean
    if a.n < 2 or b.n < 2 or not (math.isfinite(a.sem) and math.isfinite(b.sem)):
        return diff, math.nan, math.nan
    se2 = a.sem**2 + b.sem**2
    if se2 == 0:
        return diff, diff, diff
    df = se2**2 / (a.sem**4 / (a.n - 1) + b.sem**4 / (b.n - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(se2)
    return diff, diff - half, diff + half


def pct(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return "–"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def reading(point: Point, base: Point | None) -> str:
    off = point.mean - point.paper
    lo, hi = interval(off, math.hypot(point.sem, point.paper_sem if math.isfinite(point.paper_sem) else 0.0),
                      point.n)
    parts = ["reproduced" if abs(off) <= TOLERANCE or (lo <= 0 <= hi) else
             f"{'above' if off > 0 else 'below'} the paper by {abs(100 * off):.1f} points"]
    if base is not None and base is not point:
        paper_gain = point.paper - base.paper
        _, glo, ghi = welch(point, base)
        if not math.isfinite(glo):
            parts.append("gain not yet testable (one seed)")
        elif (glo > 0 and paper_gain > 0) or (ghi < 0 and paper_gain < 0):
            parts.append("gain reproduced in sign" + (" and size" if glo <= paper_gain <= ghi else
                                                         ", not in size"))
        elif glo <= 0 <= ghi:
            parts.append("gain's sign not resolved" + (" (the paper's lies inside)" if glo <= paper_gain <= ghi
                                                        else " (the paper's lies outside)"))
        else:
            parts.append("gain's sign opposite to the paper's")
    return "; ".join(parts)


def markdown(points: list[Point], baseline: str) -> str:
    lines = ["| cell | arm | paper | ours (n) | ours − paper [95%] | − baseline: ours [95%] / paper | chosen of "
             "(grid) | selection ε | reading |", "|---|---|---|---|---|---|---|---|---|"]
    cells: dict[str, list[Point]] = {}
    for p in points:
        cells.setdefault(p.cell, []).append(p)
    for cell, arms in cells.items():
        base = next((p for p in arms if p.arm == baseline), None)
        for p in sorted(arms, key=lambda p: (p.arm != baseline, p.arm)):
            off = p.mean - p.paper
            lo, hi = interval(off, math.hypot(p.sem, p.paper_sem if math.isfinite(p.paper_sem) else 0.0), p.n)
            if base is None or base is p:
                gain = "–"
            else:
                d, glo, ghi = welch(p, base)
                gain = f"{pct(d, True)} [{pct(glo, True)}, {pct(ghi, True)}] / {pct(p.paper - base.paper, True)}"
            paper = pct(p.paper) + (f" ± {pct(p.paper_sem)}" if math.isfinite(p.paper_sem) else "")
            sel = f"{p.selection_epsilon:.3g}" if math.isfinite(p.selection_epsilon) else "–"
            lines.append(f"| {cell} | {p.arm} | {paper} | {pct(p.mean)} ± {pct(p.sem)} ({p.n}) | {pct(off, True)} "
                         f"[{pct(lo, True)}, {pct(hi, True)}] | {gain} | {p.settings} (of {p.configs}) | {sel} | "
                         f"{reading(p, base)} |")
    return "\n".join(lines)


def second_stage(results: list[Path], recipes: list[Path], out_dir: Path) -> None:
    """Per grid recipe, the recipe of its best grid point at seed 0 (by test accuracy), at seeds 1 and 2."""
    import yaml

    from dpeval.config import set_dotted
    from dpeval.sweep.grid import load_sweep, settings_of, swept_fields

    accuracy = {r.run_key: number(r.flat().get(ACC)) for folder in results
                for r in ResultStore(folder).results("done")}
    out_dir.mkdir(parents=True, exist_ok=True)
    for recipe in recipes:
        specs = [s for s in load_sweep(recipe) if s.seed == 0]
        done = [s for s in specs if s.run_key in accuracy]
        if len(done) < len(specs):
            print(f"{recipe}: {len(done)} of {len(specs)} grid points finished at seed 0; skipped")
            continue
        best = max(done, key=lambda s: accuracy[s.run_key])
        chosen = settings_of(best)
        raw = yaml.safe_load(recipe.read_text())
        for key in swept_fields(specs):
            if key != "seed":
                set_dotted(raw, key.replace("privacy.target_epsilon", "privacy.epsilon"), chosen[key])
        raw["seeds"] = [1, 2]
        text = (f"# The point of {recipe.name} chosen at seed 0 (test accuracy {accuracy[best.run_key]:.4f} of "
                f"{len(specs)} points), at seeds 1 and 2 (bench/paper_tables.py --second-stage).\n")
        (out_dir / recipe.name).write_text(text + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
        print(f"{out_dir / recipe.name}: {', '.join(f'{k}={chosen[k]}' for k in swept_fields(specs) if k != 'seed')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--table", help="SOURCE:TABLE, e.g. 'AdaCliP:Table 1'")
    parser.add_argument("--baseline", help="the arm every other arm is compared with")
    parser.add_argument("--doc", type=Path, help="write the table between this file's markers")
    parser.add_argument("--second-stage", type=Path, metavar="OUT_DIR", help="write the chosen points' recipes")
    parser.add_argument("--recipes", nargs="*", type=Path, default=[], help="the grid recipes (--second-stage)")
    args = parser.parse_args()
    if args.second_stage:
        second_stage(args.results, args.recipes, args.second_stage)
        return
    if not (args.table and args.baseline):
        parser.error("--table and --baseline are needed for a table")
    source, _, table = args.table.partition(":")
    points = chosen_points(args.results, source, table)
    if not points:
        raise SystemExit(f"no finished runs of {source!r} {table!r} in {', '.join(map(str, args.results))}")
    text = markdown(points, args.baseline)
    print(text)
    if args.doc:
        write_into(args.doc, f"paper-table:{source}:{table}", text)


if __name__ == "__main__":
    main()
