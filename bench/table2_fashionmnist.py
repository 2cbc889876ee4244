"""The RS paper's Table 2, Fashion-MNIST rows, measured: the paper's mean ± SEM beside ours, RS − baseline with
a 95% interval, and per cell whether the paper's effect is reproduced in sign and size.

    # one CSV of every finished run of the eight recipes (their results folders, one per recipe)
    .venv/bin/python bench/table2_fashionmnist.py --export RESULTS_DIR... --out docs/results/rs-t2-fashionmnist.csv
    # the Markdown table from that CSV
    .venv/bin/python bench/table2_fashionmnist.py docs/results/rs-t2-fashionmnist.csv [--doc docs/reproducing.md]

A cell is (model, ε); its baseline runs are the `dpsgd` recipe's, its RS runs the `rs` recipe's (rows carry the
recipe's `paper.*` columns). Ours: mean ± SEM over seeds (sample std / √n), n. RS − baseline: difference of
means with Welch's 95% t interval (none while an arm has one seed). Reading, per cell: *sign reproduced* when
our interval lies on the paper's side of 0 (with one seed per arm: the point estimate does, said as
"not yet testable"); once the sign is, *size reproduced* when the paper's difference lies inside our interval
(while the interval spans 0, the size is read only when the paper's difference lies outside it: not
reproduced). "ours − paper" is each arm's mean minus the paper's.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

from scipy import stats

from dpeval.doc_markers import write_into

MODELS = {"dpcnn-small": "DP-CNN/S (26K)", "hcnn-small": "H-CNN/S (33K)"}
KEEP = ["run_id", "run_key", "dataset", "model", "defense", "seed", "privacy.epsilon", "privacy.noise_multiplier",
        "privacy.steps", "defense.clip", "defense.final_rate", "train.epochs", "utility.test_accuracy",
        "utility.best_test_accuracy", "utility.train_accuracy", "time.train_s", "paper.row",
        "paper.test_accuracy", "paper.test_accuracy.sem"]


def export(folders: list[Path], out: Path) -> None:
    """Every done run of the given results folders, one row each, the columns the table needs."""
    from dpeval.leaderboard import flat_row
    from dpeval.store import ResultStore

    rows = []
    for folder in folders:
        for run in ResultStore(folder).results("done"):
            flat = flat_row(run)
            flat.update({f"train.{k}": v for k, v in run.config.get("train", {}).items() if k == "epochs"})
            rows.append({k: flat.get(k, "") for k in KEEP})
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, KEEP)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["model"], -float(r["privacy.epsilon"]), r["defense"],
                                                    int(r["seed"]))))
    print(f"wrote {out} ({len(rows)} runs)")


def mean_sem(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan)


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(difference of means b − a, 95% interval low, high); NaN bounds while an arm has one value."""
    diff = statistics.fmean(b) - statistics.fmean(a)
    if len(a) < 2 or len(b) < 2:
        return diff, math.nan, math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, dof) * math.sqrt(va + vb)
    return diff, diff - half, diff + half


def table(path: Path) -> str:
    rows = list(csv.DictReader(path.open()))
    cells: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for r in rows:
        eps = round(float(r["privacy.epsilon"]))
        cells.setdefault((r["model"], eps), {}).setdefault("rs" if r["defense"] == "rs" else "baseline", []).append(r)
    out = ["| model | ε | paper baseline | paper RS | paper RS − base | ours baseline (n) | ours RS (n) | "
           "ours − paper: baseline, RS | ours RS − base [95% interval] | reading |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, eps), arms in sorted(cells.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        base, rs = arms.get("baseline", []), arms.get("rs", [])
        paper = {arm: (float(v[0]["paper.test_accuracy"]) * 100, float(v[0]["paper.test_accuracy.sem"]) * 100)
                 for arm, v in arms.items()}
        fmt = lambda arm, paper=paper: f"{paper[arm][0]:.1f} ± {paper[arm][1]:.2f}" if arm in paper else "–"  # noqa: E731
        ours = {}
        for arm, runs in (("baseline", base), ("rs", rs)):
            acc = [100 * float(r["utility.test_accuracy"]) for r in runs]
            if acc:
                m, s = mean_sem(acc)
                ours[arm] = (acc, f"{m:.1f} ± {s:.2f} ({len(acc)})" if len(acc) > 1 else f"{m:.1f} (1)")
        paper_diff = paper["rs"][0] - paper["baseline"][0] if len(paper) == 2 else math.nan
        if len(ours) == 2:
            diff, low, high = welch(ours["baseline"][0], ours["rs"][0])
            interval = f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]" if math.isfinite(low) else f"{diff:+.1f} (no interval)"
            reading = reading_of(paper_diff, diff, low, high)
        else:
            interval, reading = "–", "an arm has no run yet"
        paper_gap = f"{paper_diff:+.1f}" if math.isfinite(paper_diff) else "–"
        offsets = ", ".join(f"{round(statistics.fmean(ours[arm][0]) - paper[arm][0], 1) + 0.0:+.1f}"
                            if arm in ours and arm in paper else "–" for arm in ("baseline", "rs"))
        out.append(f"| {MODELS.get(model, model)} | {eps} | {fmt('baseline')} | {fmt('rs')} | {paper_gap} | "
                   f"{ours.get('baseline', (0, '–'))[1]} | {ours.get('rs', (0, '–'))[1]} | {offsets} | {interval} | "
                   f"{reading} |")
    return "\n".join(out)


def reading_of(paper_diff: float, diff: float, low: float, high: float) -> str:
    if not math.isfinite(low):
        same = (diff > 0) == (paper_diff > 0)
        return ("not yet testable (an arm has one seed); the point estimate has the paper's sign: "
                f"{'yes' if same else 'no'}")
    if paper_diff > 0:
        sign = "reproduced" if low > 0 else "not reproduced" if high < 0 else "not resolved (interval spans 0)"
    else:
        sign = "reproduced" if high < 0 else "not reproduced" if low > 0 else "not resolved (interval spans 0)"
    if sign != "reproduced":
        # An interval spanning 0 leaves the sign open, but a narrow one can still rule the paper's size out.
        if sign.startswith("not resolved") and not low <= paper_diff <= high:
            return f"sign {sign}; the paper's {paper_diff:+.1f} lies outside it: its size not reproduced"
        return f"sign {sign}"
    size = "reproduced" if low <= paper_diff <= high else "not reproduced"
    return f"sign {sign}; size {size} (the paper's difference {'inside' if size == 'reproduced' else 'outside'} ours)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", type=Path)
    parser.add_argument("--export", nargs="+", type=Path, help="results folders to export into --out")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--doc", type=Path, help="write the table into this Markdown file between its table2 markers")
    args = parser.parse_args()
    if args.export:
        export(args.export, args.out)
    if args.csv:
        text = table(args.csv)
        if args.doc:
            write_into(args.doc, "table2", text)
        print(text)


if __name__ == "__main__":
    main()
