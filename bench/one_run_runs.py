"""The one-run audit's three estimators on real runs, as a table: every ``dpeval audit --scope run --json`` output
of a folder (one JSON per run), one row each — defense, canary kind, accounted ε, counting / f-DP / Gaussian-pair
ε lower bounds (a refused pair in brackets, with μ), the headline estimator, the verdict and the audit's time.

    mkdir -p runs/digits-audits
    for kind in gradient input; do for eps in 1 3 8; do
      OMP_NUM_THREADS=1 dpeval audit --defense dpsgd --scope run --set privacy.epsilon=$eps --canary-kind $kind \\
          --json --quiet > runs/digits-audits/dpsgd-$kind-eps$eps.json
    done; done
    python bench/one_run_runs.py runs/digits-audits --doc docs/audit.md --marker one-run-digits \\
        --out docs/results/one-run-digits.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from dpeval.doc_markers import write_into

COLUMNS = ("defense", "dataset", "canary_kind", "epsilon", "counting", "fdp", "fdp_mu", "pair", "pair_mu", "pair_valid",
           "estimator", "verdict", "canaries", "test_accuracy", "audit_s")


def row_of(result: dict) -> dict:
    bounds = result["audit.bounds"]
    pair = bounds.get("gaussian-pair")
    return {"defense": result["defense"], "dataset": result["dataset"], "canary_kind": result["audit.canary_kind"],
            "epsilon": result["privacy.epsilon"], "counting": bounds["counting"]["epsilon_lower_bound"],
            "fdp": bounds["f-dp"]["epsilon_lower_bound"], "fdp_mu": bounds["f-dp"]["mu_lower_bound"],
            "pair": pair and pair["epsilon_lower_bound"], "pair_mu": pair and pair["mu_lower_bound"],
            "pair_valid": pair and pair["valid"], "estimator": result["audit.estimator"],
            "verdict": result["audit.verdict"], "canaries": result["audit.canaries"],
            "test_accuracy": result["utility.test_accuracy"], "audit_s": result["time.audit_s"]}


def table(rows: list[dict]) -> str:
    lines = ["| defense | canaries | ε (run) | counting | f-DP (μ) | Gaussian pair (μ) | headline | verdict | "
             "test acc. | time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["pair"] is None:
            pair = "n/a (loss)"
        else:
            pair = f"{r['pair']:.3f} ({r['pair_mu']:.3f})"
            pair = pair if r["pair_valid"] else f"refused: {pair}"
        lines.append(f"| {r['defense']} | {r['canaries']} {r['canary_kind']} | {r['epsilon']:.3f} | "
                     f"{r['counting']:.3f} | {r['fdp']:.3f} ({r['fdp_mu']:.3f}) | {pair} | {r['estimator']} | "
                     f"{r['verdict']} | {r['test_accuracy']:.3f} | {r['audit_s']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="CSV of the rows")
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument("--marker", default="one-run-digits")
    args = parser.parse_args(argv)
    rows = []
    for path in sorted(args.folder.glob("*.json")):
        text = path.read_text().strip()
        if text:
            rows.append(row_of(json.loads(text)))
    rows.sort(key=lambda r: (r["canary_kind"], r["defense"], r["epsilon"]))
    print(table(rows))
    if args.out:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    if args.doc:
        write_into(args.doc, args.marker, table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
