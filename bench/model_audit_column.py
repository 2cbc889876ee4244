"""The final-model column of the benchmark: ``dpeval audit --scope model`` for every private row (each DP defense of
``configs/benchmark/fashionmnist/`` at ε = 1, 3 and 8), in the worst case the auditing literature uses (Annamalai &
De Cristofaro 2024): crafted initial parameters, a blank target, full-batch training, 200 models.

    OMP_NUM_THREADS=1 .venv/bin/python bench/model_audit_column.py [RESULTS] [--models K] [--defenses ...]

One JSON per row under RESULTS (default ``runs/model-audit-column``), written when the row's audit ends; a finished
row is skipped and an interrupted one goes on from its kept models (``RESULTS/models/<row>``), so the script is
resumable. ``bench/benchmark_page.py --export-model-audits RESULTS`` turns the rows into
docs/results/benchmark-fashionmnist-model-audit.csv (``export_rows``) and the page's section (``section``).

Each row keeps its defense's benchmark parameters (clip C = 0.1, RS's rate and schedule, GEP's bases and groups, …)
and changes what makes 200 models affordable on two cores, the same for every row:

- data: Fashion-MNIST, a private pool of 1,000 records, the 2 % public split (1,200 records: crafting and GEP's
  anchors), pixels in [0, 1];
- model: ``mlp`` (784 → 32 tanh → 10, 25,450 parameters: the anchor CNN's size, two weight layers so that
  group-wise clipping per layer differs from all-layer clipping), trained by the lean engine;
- training: T = 100 full-batch steps (q = 1) of plain SGD, each lr × (Σ clipped + noise) with lr = 1.33e-3 (the
  anchor's 1.33e-4 at C = 1, scaled for C = 0.1), σ from the PRV accountant (exact for full batches: the
  benchmark rows' RDP would calibrate a larger σ than ε needs, and the ratio ε_emp / ε would flatter the defense).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFENSES = ("dpsgd", "rs", "random-freeze", "adaclip", "groupwise-all", "groupwise-layer", "gep")
EPSILONS = (1.0, 3.0, 8.0)
OVERRIDES = {
    "data": {"name": "fashionmnist", "max_train": 1000, "public_fraction": 0.02, "normalize": "none"},
    "model": {"name": "mlp", "width": 32, "activation": "tanh"},
    "train": {"epochs": 100, "optimizer": "sgd", "lr": 1.33e-3, "momentum": 0.0, "sampling": "poisson",
              "physical_batch_size": 1001},
}


def row_config(defense: str, epsilon: float) -> dict:
    recipe = yaml.safe_load((ROOT / "configs/benchmark/fashionmnist" / f"{defense}.yaml").read_text())
    return {"defense": recipe["defense"], "data": OVERRIDES["data"], "model": OVERRIDES["model"],
            "train": {**recipe["train"], **OVERRIDES["train"]},
            "privacy": {"epsilon": epsilon, "delta": recipe["privacy"]["delta"], "accountant": "prv"}}


ROW_NAMES = {"groupwise-all": "groupwise (all)", "groupwise-layer": "groupwise (layer)"}
COLUMNS = ["defense", "target_epsilon", "epsilon", "accounted_mu", "noise_multiplier", "models", "epsilon_lower_bound",
           "estimator", "statistic", "mu_lower_bound", "mu_hat", "mu_hat_lo", "mu_hat_hi", "loss_separation",
           "loss_separation_se", "projection_separation", "anchor_reading_epsilon", "crafted_test_accuracy", "train_s",
           "threads", "models_trained"]


def models_trained(result: dict) -> int | str:
    """How many of the audit's models its ``time.train_s`` trained (the others were kept by an interrupted run and
    loaded); blank for a result written before dpeval recorded ``audit.models_resumed``."""
    resumed = result.get("audit.models_resumed")
    return "" if resumed is None else result["audit.models"] - resumed


def separation_se(d: float, n_in: int, n_out: int) -> float:
    """Standard error of the standardised shift (mean_in − mean_out) / sd_out of Gaussian scores of equal spread:
    √(1/n_in + 1/n_out + d²/(2 n_out)) (the last term from estimating sd_out)."""
    return math.sqrt(1 / n_in + 1 / n_out + d * d / (2 * n_out))


def export_rows(results: Path, out: Path) -> list[dict]:
    """One CSV row per finished row of the column (``<defense>-eps<ε>.json``)."""
    from dpeval.core.one_run_bounds import gdp_mu

    rows = []
    for path in sorted(results.glob("*-eps*.json")):
        r = json.loads(path.read_text())
        tests = {(t["statistic"], t["estimator"]): t for t in r["audit.tests"]}
        loss = tests[("loss", "gdp")]["separation"]
        n_in = r["audit.models_with_target"]
        rows.append({
            "defense": ROW_NAMES.get(r["bench.row"], r["bench.row"]),
            "target_epsilon": float(path.stem.rsplit("-eps", 1)[1]), "epsilon": round(r["privacy.epsilon"], 3),
            "accounted_mu": round(gdp_mu(r["privacy.epsilon"], r["privacy.delta"]), 3),
            "noise_multiplier": round(r["privacy.noise_multiplier"], 4), "models": r["audit.models"],
            "epsilon_lower_bound": round(r["audit.epsilon_lower_bound"], 3), "estimator": r["audit.estimator"],
            "statistic": r["audit.statistic"], "mu_lower_bound": round(r["audit.mu_lower_bound"], 3),
            "mu_hat": round(r["audit.mu_hat"], 3), "mu_hat_lo": round(r["audit.mu_hat_ci"][0], 3),
            "mu_hat_hi": round(r["audit.mu_hat_ci"][1], 3), "loss_separation": round(loss, 3),
            "loss_separation_se": round(separation_se(loss, n_in, r["audit.models"] - n_in), 3),
            "projection_separation": round(tests[("projection", "gdp")]["separation"], 3),
            "anchor_reading_epsilon": round(max((a["epsilon"] for a in r.get("audit.anchor_reading", {}).values()),
                                                default=math.nan), 3),
            "crafted_test_accuracy": round(r["audit.init"].get("test_accuracy", float("nan")), 4),
            "train_s": round(r["time.train_s"]), "threads": r["time.threads"], "models_trained": models_trained(r)})
    if rows:
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {out} ({len(rows)} rows)")
    return rows


ORDER = ["dpsgd", "rs", "random-freeze", "gep", "adaclip", "groupwise (all)", "groupwise (layer)"]


def _f(row: dict, key: str) -> float:
    return float(row[key])


def against_dpsgd(rows: list[dict]) -> list[tuple[dict, dict, float, float]]:
    """(row, DP-SGD's row at the same ε, difference of the loss separations, its 95 % half-width)."""
    base = {_f(r, "target_epsilon"): r for r in rows if r["defense"] == "dpsgd"}
    out = []
    for r in rows:
        b = base.get(_f(r, "target_epsilon"))
        if r["defense"] != "dpsgd" and b is not None:
            half = 1.96 * math.hypot(_f(r, "loss_separation_se"), _f(b, "loss_separation_se"))
            out.append((r, b, _f(r, "loss_separation") - _f(b, "loss_separation"), half))
    return out


def section(rows: list[dict]) -> str:
    """The page's table (one line per row) and its reading against DP-SGD, from the CSV rows."""
    rows = sorted(rows, key=lambda r: (_f(r, "target_epsilon"), ORDER.index(r["defense"])
                                       if r["defense"] in ORDER else 99))
    lines = ["| defense | ε | μ (accounted) | ε_LB (95 %) | ε_LB / ε | test | μ̂ [interval] | loss separation ± 1.96 SE "
             "| projection separation | anchor's reading |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['defense']} | {_f(r, 'epsilon'):.2f} | {_f(r, 'accounted_mu'):.2f} | "
            f"{_f(r, 'epsilon_lower_bound'):.2f} | {_f(r, 'epsilon_lower_bound') / _f(r, 'epsilon'):.0%} | "
            f"{r['statistic']}/{r['estimator']} | {_f(r, 'mu_hat'):.2f} [{_f(r, 'mu_hat_lo'):.2f}, "
            f"{_f(r, 'mu_hat_hi'):.2f}] | {_f(r, 'loss_separation'):.2f} ± {1.96 * _f(r, 'loss_separation_se'):.2f} | "
            f"{_f(r, 'projection_separation'):.2f} | {_f(r, 'anchor_reading_epsilon'):.2f} |")
    missing = sorted({f"{d} at ε = {e:g}" for d in ORDER for e in EPSILONS}
                     - {f"{r['defense']} at ε = {_f(r, 'target_epsilon'):g}" for r in rows})
    text = ["\n".join(lines), ""]
    if missing:
        text.append(f"Not measured yet: {', '.join(missing)}.\n")
    compared = against_dpsgd(rows)
    if compared:
        text += [reading(compared), "", differences_table(compared)]
    return "\n".join(text)


def verdict(diff: float, half: float) -> str:
    """"less" or "more" than DP-SGD where the difference's 95 % interval excludes zero, else "" (within noise)."""
    return "less" if diff + half < 0 else "more" if diff - half > 0 else ""


def called(compared: list[tuple[dict, dict, float, float]]) -> tuple[list[str], list[str]]:
    """The rows resolved to leak less and more than DP-SGD."""
    names = {"less": [], "more": [], "": []}
    for r, _, diff, half in compared:
        names[verdict(diff, half)].append(f"{r['defense']} at ε = {_f(r, 'target_epsilon'):g}")
    return names["less"], names["more"]


def reading(compared: list[tuple[dict, dict, float, float]]) -> str:
    """The reading against DP-SGD in sentences: what is resolved either way, and how much is within noise."""
    less, more = called(compared)
    rest = len(compared) - len(less) - len(more)
    return ("Against DP-SGD at the same ε, by the difference of the loss separations (the row's minus DP-SGD's) and "
            "its 95 % interval; a difference is called only where the interval excludes zero. "
            f"Resolved to leak less than DP-SGD: {', '.join(less) or 'none'}. "
            f"Resolved to leak more: {', '.join(more) or 'none'}. "
            + (f"The other {rest} of {len(compared)}" if less or more else f"All {rest}")
            + " differences are within noise.")


def differences_table(compared: list[tuple[dict, dict, float, float]]) -> str:
    """One line per defense, one column per ε: the difference ± its half-width, *less* / *more* where resolved."""
    cells: dict[str, dict[float, str]] = {}
    for r, _, diff, half in compared:
        called_as = verdict(diff, half)
        cells.setdefault(r["defense"], {})[_f(r, "target_epsilon")] = (
            f"{diff:+.2f} ± {half:.2f}" + (f" *{called_as}*" if called_as else ""))
    lines = ["| defense − DP-SGD | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |",
             "|---|" + "---|" * len(EPSILONS)]
    for defense in sorted(cells, key=lambda d: ORDER.index(d) if d in ORDER else 99):
        lines.append(f"| {defense} | " + " | ".join(cells[defense].get(e, "not measured") for e in EPSILONS) + " |")
    return "\n".join(lines)


def summary_line(rows: list[dict]) -> str:
    """The page's "In short" bullet."""
    if not rows:
        return ""
    ratios = [_f(r, "epsilon_lower_bound") / _f(r, "epsilon") for r in rows]
    compared = against_dpsgd(rows)
    less, more = called(compared)
    return (f"- **Final model, worst case** (`--scope model`, crafted θ₀, blank target, {rows[0]['models']} models "
            f"a row): {len(rows)} of 21 private rows audited; ε_LB is {min(ratios):.0%}–{max(ratios):.0%} of the "
            f"accounted ε; against DP-SGD's loss separation at the same ε, "
            f"{len(compared)} rows compared: resolved less: "
            f"{', '.join(less) or 'none'}; resolved more: {', '.join(more) or 'none'}; the rest within noise.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", default="runs/model-audit-column")
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=OVERRIDES["train"]["epochs"], help="full-batch steps T")
    parser.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=DEFENSES)
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    args = parser.parse_args()
    from dpeval.audit.model import ModelAuditOptions, run_model_audit
    from dpeval.config import build_spec

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}", flush=True)
    for defense in args.defenses:
        for epsilon in args.epsilons:
            name = f"{defense}-eps{epsilon:g}"
            out = results / f"{name}.json"
            if out.exists():
                continue
            config = row_config(defense, epsilon)
            config["train"]["epochs"] = args.epochs
            started = time.perf_counter()
            result = run_model_audit(build_spec(config), ModelAuditOptions(
                models=args.models, init="crafted", target="blank", sampling="full", keep=results / "models" / name))
            result["bench.config"] = config
            result["bench.row"] = defense
            out.with_suffix(".part").write_text(json.dumps(result, indent=1, default=str))
            out.with_suffix(".part").rename(out)
            print(f"{name}: ε_LB {result['audit.epsilon_lower_bound']:.2f} of ε {result['privacy.epsilon']:.2f} "
                  f"({result['audit.estimator']}, {result['audit.statistic']}), μ̂ {result['audit.mu_hat']:.2f}, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
