"""Membership inference by defense from a leaderboard CSV (the Fashion-MNIST game of
configs/sweeps/membership-fashionmnist/): one row per run and attack — AUC with its 95 % interval, TPR at 0.1 %
and 1 % FPR, the ε lower bound beside 2ε — and the three checks docs/membership.md states, read off the numbers.

    for f in none dpsgd rs; do
      dpeval sweep configs/sweeps/membership-fashionmnist/$f.yaml --results runs/mia-fm
  done
    dpeval leaderboard --results runs/mia-fm --out docs/results/membership-fashionmnist.csv
    .venv/bin/python bench/membership_table.py docs/results/membership-fashionmnist.csv --doc docs/membership.md

Checks: (1) on the non-private victim, online LiRA ≥ offline LiRA (AUC and TPR at 0.1 % FPR); (2) every DP
run's ε lower bound ≤ 2ε (the substitution game's bound, every attack); (3) the non-private victim's TPR at
0.1 % FPR is above 0.1 %, by a one-sided binomial test of its true positives against the rate 0.001 (the best
attack's; p < 0.01 reads "clearly").
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from scipy import stats

from dpeval.doc_markers import write_into

ATTACKS = ("lira", "rmia", "loss")


def _f(row: dict[str, str], key: str) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", "None") else math.nan


def runs(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("status", "done") == "done"]
    order = {"none": 0, "dpsgd": 1, "rs": 2}
    return sorted(rows, key=lambda r: (order.get(r["defense"], 9), _f(r, "privacy.epsilon"),
                                       r.get("attack.lira.online") != "True"))


def variant(row: dict[str, str], attack: str) -> str:
    if attack == "loss":
        return "LOSS"
    online = row.get(f"attack.{attack}.online", "True") == "True"
    return f"{attack.upper() if attack == 'rmia' else 'LiRA'} {'online' if online else 'offline'}"


def eps_text(row: dict[str, str]) -> str:
    eps = _f(row, "privacy.epsilon")
    return "∞" if not math.isfinite(eps) else f"{eps:.2g}"


def table(rows: list[dict[str, str]]) -> str:
    out = ["| defense | ε | test acc. | attack | AUC [95 % interval] | TPR at 0.1 % FPR | TPR at 1 % FPR | "
           "ε lower bound (≤ 2ε?) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    seen_loss = set()
    for row in rows:
        eps = _f(row, "privacy.epsilon")
        for attack in ATTACKS:
            if f"leakage.{attack}.auc" not in row or row[f"leakage.{attack}.auc"] == "":
                continue
            if attack == "loss":  # LOSS has no online / offline: show it once per victim
                if row["run_key"] in seen_loss or (row["defense"], eps) in seen_loss:
                    continue
                seen_loss.add((row["defense"], eps))
            p = f"leakage.{attack}."
            lb = _f(row, p + "epsilon_lower_bound")
            bound = "" if not math.isfinite(eps) else f" ({'yes' if lb <= 2 * eps else 'NO'})"
            out.append(f"| {row['defense']} | {eps_text(row)} | {100 * _f(row, 'utility.test_accuracy'):.1f} | "
                       f"{variant(row, attack)} | {_f(row, p + 'auc'):.3f} [{_f(row, p + 'auc_ci_low'):.3f}, "
                       f"{_f(row, p + 'auc_ci_high'):.3f}] | {_f(row, p + 'tpr_at_0.1pct_fpr'):.4f} | "
                       f"{_f(row, p + 'tpr_at_1pct_fpr'):.4f} | {lb:.2f}{bound} | {row.get(p + 'verdict', '')} |")
    out.append("")
    out.extend(f"- {line}" for line in checks(rows))
    return "\n".join(out)


def checks(rows: list[dict[str, str]]) -> list[str]:
    lines = []
    none = [r for r in rows if r["defense"] == "none"]
    on = [r for r in none if r.get("attack.lira.online") == "True"]
    off = [r for r in none if r.get("attack.lira.online") == "False"]
    if on and off:
        a_on, a_off = _f(on[0], "leakage.lira.auc"), _f(off[0], "leakage.lira.auc")
        t_on, t_off = _f(on[0], "leakage.lira.tpr_at_0.1pct_fpr"), _f(off[0], "leakage.lira.tpr_at_0.1pct_fpr")
        holds = a_on >= a_off and t_on >= t_off
        lines.append(f"Online LiRA ≥ offline on the non-private victim: {'holds' if holds else 'does not hold'} "
                     f"(AUC {a_on:.3f} vs {a_off:.3f}; TPR at 0.1 % FPR {t_on:.4f} vs {t_off:.4f}).")
    private = [r for r in rows if math.isfinite(_f(r, "privacy.epsilon"))]
    if private:
        worst: dict[tuple[str, float], float] = {}  # (defense, ε) → the largest bound over its runs and attacks
        for r in private:
            key = (r["defense"], _f(r, "privacy.epsilon"))
            worst[key] = max([worst.get(key, 0.0)] + [_f(r, f"leakage.{a}.epsilon_lower_bound") for a in ATTACKS
                                                      if r.get(f"leakage.{a}.epsilon_lower_bound", "") != ""])
        ok = all(lb <= 2 * eps for (_, eps), lb in worst.items())
        listed = ", ".join(f"{defense} ε = {eps:.2g}: {lb:.2f}" for (defense, eps), lb in worst.items())
        lines.append(f"Every DP run's ε lower bound ≤ 2ε: {'holds' if ok else 'VIOLATED'} (largest over the attacks: "
                     f"{listed}).")
    if none:
        best = max(((_f(r, f"leakage.{a}.tpr_at_0.1pct_fpr"), a, r) for r in none for a in ATTACKS
                    if r.get(f"leakage.{a}.tpr_at_0.1pct_fpr", "") != ""), key=lambda t: t[0])
        tpr, attack, row = best
        members = int(_f(row, f"leakage.{attack}.n_members"))
        hits = round(tpr * members)
        p = stats.binomtest(hits, members, 0.001, alternative="greater").pvalue
        lines.append(f"The non-private victim's TPR at 0.1 % FPR is above 0.1 %: "
                     f"{'clearly (p < 0.01)' if p < 0.01 else 'not clearly'} — {variant(row, attack)} finds "
                     f"{hits} of {members} members ({tpr:.4f}, {tpr / 0.001:.1f}× the FPR; one-sided binomial "
                     f"p = {p:.1g}).")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="a leaderboard CSV of the membership sweeps")
    parser.add_argument("--doc", type=Path, help="write the table into this Markdown file between its "
                                                 "mia-fashionmnist markers")
    args = parser.parse_args()
    rows = runs(args.csv)
    if not rows:
        sys.exit(f"{args.csv}: no finished runs")
    text = table(rows)
    if args.doc:
        write_into(args.doc, "mia-fashionmnist", text)
    print(text)


if __name__ == "__main__":
    main()
