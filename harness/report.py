"""``dpeval report``: one self-contained HTML page (images embedded) with the plots a paper needs.

Sections: the seed-grouped leaderboard; utility vs leakage per attack with the Pareto front; accuracy and
leakage vs each swept defense parameter with error bars (e.g. the RS paper's Fig. 4/5 view over the
sparsification rate); ROC curves (log-log) of
membership attacks; reconstruction grids of gradient attacks. Every plot is also written as a PNG beside
the HTML (``<stem>_<plot>.png``).

Attack artefact conventions read here: ``artefacts.<attack>.roc`` → a JSON file with ``fpr`` and ``tpr``
lists; any other ``artefacts.<attack>.*`` ending in ``.png`` is shown as a reconstruction picture.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display needed
import matplotlib.pyplot as plt  # noqa: E402

from harness import __version__  # noqa: E402
from harness import leaderboard as lb  # noqa: E402

MAX_PICTURES = 24


def _save(fig: plt.Figure, out_dir: Path, stem: str, name: str) -> Path:
    path = out_dir / f"{stem}_{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "✓" if v else ""
    if isinstance(v, float):
        return "inf" if v == math.inf else f"{v:.4g}"
    return "" if v is None else str(v)


def table(records: list[dict[str, Any]]) -> str:
    keys = {c for r in records for c in r}
    varying = sorted(c for c in keys if c.startswith("defense.") and not c.endswith(".sem")
                     and len({repr(r.get(c)) for r in records}) > 1)
    leak = [h[0] for a in lb.attacks_in(records) if (h := lb.headline(keys, a))]
    columns = ["n", "dataset", "model", "defense", *varying, "attack", "privacy.epsilon",
               "utility.test_accuracy", *leak, *sorted(c for c in keys if c.startswith("pareto."))]
    columns = [c for c in lb.with_paper(columns, keys, brief=True) if c in keys]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in records:
        cells = []
        for c in columns:
            text = _fmt(r.get(c))
            sem = r.get(f"{c}.sem")
            if isinstance(sem, float) and sem > 0:
                text += f" ± {sem:.2g}"
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            "</table></div>")


def _label(r: dict[str, Any]) -> str:
    params = ", ".join(f"{k.split('.', 1)[1]}={_fmt(v)}" for k, v in sorted(r.items())
                       if k.startswith("defense.") and not k.endswith(".sem"))
    return f"{r.get('defense')} ({params})" if params else str(r.get("defense"))


def utility_vs_leakage(records: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    plots = []
    keys = {c for r in records for c in r}
    for attack in lb.attacks_in(records):
        found = lb.headline(keys, attack)
        if not found:
            continue
        metric, _ = found
        points = [r for r in records if isinstance(r.get(metric), float | int) and math.isfinite(r[metric])]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6, 4.2))
        by_defense: dict[str, list] = defaultdict(list)
        for r in points:
            by_defense[str(r.get("defense"))].append(r)
        for defense, rs in sorted(by_defense.items()):
            ax.errorbar([r[metric] for r in rs], [r["utility.test_accuracy"] for r in rs],
                        xerr=[r.get(f"{metric}.sem", 0) for r in rs],
                        yerr=[r.get("utility.test_accuracy.sem", 0) for r in rs], fmt="o", label=defense, capsize=3)
        front = sorted((r for r in points if r.get(f"pareto.{attack}")), key=lambda r: r[metric])
        if front:
            ax.plot([r[metric] for r in front], [r["utility.test_accuracy"] for r in front], "k--", lw=1,
                    label="Pareto front")
        ax.set_xlabel(lb.headline_label(attack))
        ax.set_ylabel("test accuracy")
        ax.set_title(f"utility vs leakage: {attack}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        plots.append((f"Utility vs leakage ({attack})", _save(fig, out_dir, stem, f"utility_vs_{attack}")))
    return plots


def swept_parameters(records: list[dict[str, Any]]) -> list[str]:
    """Numeric ``defense.*`` columns whose value varies across the records: the swept knobs."""
    keys = {c for r in records for c in r if c.startswith("defense.") and not c.endswith(".sem")}
    swept = []
    for column in sorted(keys):
        values = [r.get(column) for r in records]
        if all(lb.is_number(v) for v in values) and len(set(values)) > 1:
            swept.append(column)
    return swept


def trends(records: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    """Accuracy and each attack's headline leakage against every swept defense parameter, one line per
    defense (mean ± SEM over seeds)."""
    plots = []
    for param in swept_parameters(records):
        rated = [r for r in records if lb.is_number(r.get(param))]
        keys = {c for r in rated for c in r}
        heads = [(a, h[0]) for a in lb.attacks_in(rated) if (h := lb.headline(keys, a))]
        metrics = [("utility.test_accuracy", "test accuracy")] + [(m, lb.headline_label(a)) for a, m in heads]
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
        for ax, (metric, label) in zip(axes[0], metrics):
            lines: dict[str, list] = defaultdict(list)
            for r in rated:
                if lb.is_number(r.get(metric)):
                    lines[str(r.get("defense"))].append(r)
            for name, rs in sorted(lines.items()):
                rs.sort(key=lambda r: r[param])
                ax.errorbar([r[param] for r in rs], [r[metric] for r in rs],
                            yerr=[r.get(f"{metric}.sem", 0) for r in rs], marker="o", capsize=3, label=name)
            ax.set_xlabel(param)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        name = param.split(".", 1)[1]
        fig.suptitle(f"trends over {param} (mean ± SEM over seeds)")
        plots.append((f"Accuracy and leakage vs {param}", _save(fig, out_dir, stem, f"trend_{name}")))
    return plots


def roc_curves(rows: list[dict[str, Any]], out_dir: Path, stem: str) -> list[tuple[str, Path]]:
    curves: dict[str, list] = defaultdict(list)
    for row in rows:
        for key, value in row["metrics"].items():
            if key.startswith("artefacts.") and key.endswith(".roc") and Path(value).is_file():
                attack = key.split(".")[1]
                data = json.loads(Path(value).read_text())
                curves[attack].append((lb.flat_row(row), data["fpr"], data["tpr"]))
    plots = []
    for attack, items in sorted(curves.items()):
        fig, ax = plt.subplots(figsize=(5, 4.5))
        for record, fpr, tpr in items:
            auc = record.get(f"leakage.{attack}.auc")
            label = _label(record) + (f", AUC {auc:.3f}" if isinstance(auc, float) else "")
            ax.loglog([max(f, 1e-5) for f in fpr], [max(t, 1e-5) for t in tpr], label=label)
        ax.plot([1e-5, 1], [1e-5, 1], "k:", lw=1, label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"ROC (log-log): {attack}")
        ax.legend(fontsize=6)
        plots.append((f"ROC curves ({attack})", _save(fig, out_dir, stem, f"roc_{attack}")))
    return plots


def pictures(rows: list[dict[str, Any]]) -> list[tuple[str, Path]]:
    found = []
    for row in rows:
        for key, value in sorted(row["metrics"].items()):
            if (key.startswith("artefacts.") and str(value).endswith(".png") and "roc" not in key
                    and Path(value).is_file()):
                found.append((f"{key.split('.')[1]} — {_label(lb.flat_row(row))}, seed {row['metrics'].get('seed')}",
                              Path(value)))
    return found[:MAX_PICTURES]


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:nth-child(-n+4) { text-align: left; }
img { max-width: 100%; margin: 0.5em 0; } figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figcaption { font-size: 0.8em; color: #555; max-width: 420px; }
.scroll { overflow-x: auto; }
"""


def write_report(rows: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """Write the HTML report and its PNGs; returns what was written."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.stem
    done = [r for r in rows if r["status"] == "done"]
    records = lb.leaderboard(done, seeds_grouped=True)
    plots = utility_vs_leakage(records, out.parent, stem) + trends(records, out.parent, stem) \
        + roc_curves(done, out.parent, stem)
    pics = pictures(done)
    sections = [f"<h1>dpeval report</h1><p>{len(done)} finished runs in {len(records)} configurations "
                f"(mean ± SEM over seeds); dpeval {__version__}.</p>",
                "<h2>Leaderboard</h2>", table(records) if records else "<p>No finished runs.</p>"]
    for title, path in plots:
        sections.append(f"<h2>{html.escape(title)}</h2>{_img(path, title)}")
    if pics:
        sections.append("<h2>Reconstructions</h2>")
        sections += [f"<figure>{_img(p, c)}<figcaption>{html.escape(c)}</figcaption></figure>" for c, p in pics]
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>dpeval report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>")
    out.write_text(page)
    return {"out": str(out), "runs": len(done), "configurations": len(records),
            "plots": [str(p) for _, p in plots], "pictures": len(pics)}
