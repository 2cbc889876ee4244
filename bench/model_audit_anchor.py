"""Annamalai & De Cristofaro's (NeurIPS 2024) final-model audit of DP-SGD, reproduced with ``dpeval audit --scope
model``: full-batch DP-SGD on 1,000 MNIST records, 100 steps, C = 1, lr 1.33e-4 on the summed release, σ from the
PRV accountant at q = 1, a blank target, crafted (worst-case) or random (average-case) initial parameters.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_audit_anchor.py RESULTS run [CELL ...]   # all cells by default
    .venv/bin/python bench/model_audit_anchor.py RESULTS export                             # CSV + figure into docs/

Cells (each one JSON under RESULTS, resumable: a finished cell is skipped, an interrupted one goes on from its kept
models under RESULTS/models/<cell>):

- ``cnn-theirs-eps10``: their cell exactly: ``tanh-cnn-mnist`` (their network) from THEIR published crafted
  parameters and THEIR blank target (``bench/anchor_init.py``, given with ``--anchor FOLDER``), 999 records + the
  target, 200 models. Theirs: ε_emp = 7.21.
- ``cnn-crafted-eps10`` / ``cnn-random-eps10``: the same network from dpeval's own crafted parameters (pre-trained
  on the public split) or its random initialisation, dpeval's blank.
- ``logreg-{crafted,random}-eps{1,2,4,10}``: logistic regression, the same game at every ε of their figure (200
  models; 1,000 at ε = 10, where the held-out test needs them: docs/audit.md).

The CNN cells cost about 2.3 h of one core each (20,000 model-steps of ≈ 0.4 s); the logistic-regression cells
2–15 min.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from model_audit_column import models_trained  # a script's own folder is on its path

ROOT = Path(__file__).resolve().parents[1]
COMMON = {"data": {"name": "mnist", "max_train": 1000}, "train": {"epochs": 100, "optimizer": "sgd", "lr": 1.33e-4,
          "momentum": 0.0, "engine": "func"}, "defense": {"name": "dpsgd", "clip": 1.0}}


def cells(anchor: Path) -> dict[str, tuple[dict, dict]]:
    """cell → (config overrides, audit options)."""
    out: dict[str, tuple[dict, dict]] = {
        "cnn-theirs-eps10": ({"model": {"name": "tanh-cnn-mnist"}, "data": {"max_train": 999},
                              "privacy": {"epsilon": 10.0}},
                             {"init": str(anchor / "init.pt"), "target": str(anchor / "blank.pt"), "models": 200}),
    }
    for init in ("crafted", "random"):
        out[f"cnn-{init}-eps10"] = ({"model": {"name": "tanh-cnn-mnist"}, "privacy": {"epsilon": 10.0}},
                                    {"init": init, "target": "blank", "models": 200})
    for init in ("crafted", "random"):
        for eps in (1.0, 2.0, 4.0, 10.0):
            out[f"logreg-{init}-eps{eps:g}"] = ({"model": {"name": "logreg"}, "train": {"engine": "auto"},
                                                 "privacy": {"epsilon": eps}},
                                                {"init": init, "target": "blank", "models": 1000 if eps == 10 else 200})
    return out


def config(overrides: dict) -> dict:
    raw = {k: dict(v) for k, v in COMMON.items()}
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    raw["privacy"] = {"delta": 1e-5, "accountant": "prv", **raw.get("privacy", {})}
    return raw


def run(results: Path, chosen: list[str], anchor: Path) -> None:
    from dpeval.audit.model import ModelAuditOptions, run_model_audit
    from dpeval.config import build_spec

    table = cells(anchor)
    for name in chosen or list(table):
        out = results / f"{name}.json"
        if out.exists():
            continue
        overrides, options = table[name]
        raw = config(overrides)
        started = time.perf_counter()
        result = run_model_audit(build_spec(raw), ModelAuditOptions(**options, sampling="full", progress=True,
                                                                    keep=results / "models" / name))
        result.update({"bench.cell": name, "bench.config": raw, "bench.options": options})
        out.with_suffix(".part").write_text(json.dumps(result, indent=1, default=str))
        out.with_suffix(".part").rename(out)
        print(f"{name}: ε_LB {result['audit.epsilon_lower_bound']:.2f} of ε {result['privacy.epsilon']:.2f}, anchor's "
              f"reading {max(a['epsilon'] for a in result['audit.anchor_reading'].values()):.2f}, μ̂ "
              f"{result['audit.mu_hat']:.2f}; {time.perf_counter() - started:.0f} s", flush=True)


COLUMNS = ["cell", "model", "init", "models", "epsilon", "accounted_mu", "epsilon_lower_bound", "estimator",
           "statistic", "mu_lower_bound", "mu_hat", "mu_hat_lo", "mu_hat_hi", "anchor_reading_epsilon",
           "anchor_reading_mu", "loss_separation", "train_s", "threads", "models_trained"]


def trained_here(row: dict) -> str:
    known = str(row.get("models_trained", "")) not in ("", str(row["models"]))
    return f", {row['models_trained']} models" if known else ""


def table(rows: list[dict]) -> str:
    """The cells as a Markdown table for docs/audit.md."""
    lines = ["| cell | model | θ₀ | K | ε | μ (accounted) | ε_LB held out (95 %) | test | μ̂ [interval] "
             "| loss separation | anchor's reading ε (μ) | train s (threads) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["init"], float(r["epsilon"]))):
        lines.append(f"| `{r['cell']}` | {r['model']} | {r['init']} | {r['models']} | {float(r['epsilon']):.2f} | "
                     f"{float(r['accounted_mu']):.2f} | **{float(r['epsilon_lower_bound']):.2f}** | "
                     f"{r['statistic']}/{r['estimator']} | {float(r['mu_hat']):.2f} [{float(r['mu_hat_lo']):.2f}, "
                     f"{float(r['mu_hat_hi']):.2f}] | {float(r['loss_separation']):.2f} | "
                     f"{float(r['anchor_reading_epsilon']):.2f} ({float(r['anchor_reading_mu']):.2f}) | "
                     f"{r['train_s']} ({r['threads']}){trained_here(r)} |")
    return "\n".join(lines)


def export(results: Path) -> None:
    from dpeval.core.files import save_figure
    from dpeval.core.one_run_bounds import gdp_mu

    rows = []
    for path in sorted(results.glob("*.json")):
        r = json.loads(path.read_text())
        best = max(r["audit.anchor_reading"].values(), key=lambda a: a["epsilon"])
        loss = next(t for t in r["audit.tests"] if t["statistic"] == "loss")
        rows.append({"cell": r["bench.cell"], "model": r["model"], "init": r["audit.init"]["kind"],
                     "models": r["audit.models"], "epsilon": round(r["privacy.epsilon"], 3),
                     "accounted_mu": round(gdp_mu(r["privacy.epsilon"], r["privacy.delta"]), 3),
                     "epsilon_lower_bound": round(r["audit.epsilon_lower_bound"], 3), "estimator": r["audit.estimator"],
                     "statistic": r["audit.statistic"], "mu_lower_bound": round(r["audit.mu_lower_bound"], 3),
                     "mu_hat": round(r["audit.mu_hat"], 3), "mu_hat_lo": round(r["audit.mu_hat_ci"][0], 3),
                     "mu_hat_hi": round(r["audit.mu_hat_ci"][1], 3),
                     "anchor_reading_epsilon": round(best["epsilon"], 3),
                     "anchor_reading_mu": round(best["mu"], 3), "loss_separation": round(loss["separation"], 3),
                     "train_s": round(r["time.train_s"]), "threads": r["time.threads"],
                     "models_trained": models_trained(r)})
    out = ROOT / "docs/results/model-audit-anchor.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out} ({len(rows)} cells)")
    from dpeval.doc_markers import write_into

    write_into(ROOT / "docs/audit.md", "model-audit-anchor", table(rows))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    top = 11
    ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="ε_emp = ε")
    styles = {"crafted": ("tab:red", "worst case (crafted θ₀)"), "random": ("tab:blue", "average case (random θ₀)"),
              "file": ("black", "their crafted θ₀ (CNN)")}
    for kind, (colour, text) in styles.items():
        for model, marker in (("logreg", "o"), ("tanh-cnn-mnist", "s")):
            pick = sorted((r for r in rows if r["init"] == kind and r["model"] == model), key=lambda r: r["epsilon"])
            if not pick:
                continue
            xs = [r["epsilon"] for r in pick]
            ax.plot(xs, [r["epsilon_lower_bound"] for r in pick], marker=marker, color=colour, lw=1,
                    label=f"{text}, {model}: held-out 95 % bound")
            ax.plot(xs, [r["anchor_reading_epsilon"] for r in pick], marker=marker, color=colour, lw=0.8, ls=":",
                    mfc="none", label=f"{text}, {model}: the anchor's reading")
    ax.set_xlabel("accounted ε (PRV, δ = 1e-5)")
    ax.set_ylabel("empirical ε")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(fontsize=6.5, loc="upper left")
    ax.set_title("Final-model audit of full-batch DP-SGD, MNIST, 1,000 records", fontsize=9)
    save_figure(fig, ROOT / "docs/results/model-audit-anchor.svg")
    plt.close(fig)
    print("wrote docs/results/model-audit-anchor.svg")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("action", choices=("run", "export"))
    parser.add_argument("cells", nargs="*", help="run only these cells")
    parser.add_argument("--anchor", type=Path, default=Path("runs/anchor"),
                        help="bench/anchor_init.py's output folder (init.pt, blank.pt)")
    args = parser.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    if args.action == "run":
        unknown = set(args.cells) - set(cells(args.anchor))
        if unknown:
            raise SystemExit(f"unknown cells {sorted(unknown)}; known: {', '.join(cells(args.anchor))}")
        run(args.results, args.cells, args.anchor)
    else:
        export(args.results)


if __name__ == "__main__":
    main()
