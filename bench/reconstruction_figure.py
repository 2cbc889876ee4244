"""The RS paper's Figure 5 (reconstruction error vs a constant sparsification rate r) from dpeval results.

Two steps, so that the committed CSV alone regenerates the docs:

    # 1. one row per attacked target (the scores files of every done run) from results folders
    python bench/reconstruction_figure.py collect runs/fig5-fm runs/fig5-rgap \\
        --out docs/results/reconstruction-fashionmnist.csv
    # 2. table (between the doc's reconstruction-fashionmnist markers) and figure
    python bench/reconstruction_figure.py figure docs/results/reconstruction-fashionmnist.csv \\
        --figure docs/results/reconstruction-fashionmnist.svg --doc docs/gradient-inversion.md

A run is placed by the release it describes: `defense: none` is the non-private reference line; an RS
run by its noise std, rate and `attack.mask_aware`. Per setting the table gives the mean MSE over the
targets ± its standard error, the mean PSNR and how many targets beat their best data-free guess.
The claim read off the numbers: for each attacker and noise, the mean MSE rises with r (every step up,
and r = 0.9 above r = 0 by more than both standard errors); not measurable where at r = 0 fewer than half
of the targets beat their best data-free guess (the attack has nothing left to lose).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from dpeval.core.files import save_figure
from dpeval.doc_markers import write_into

FIELDS = ["run_id", "attack", "defense", "noise_std", "rate", "mask_aware", "model", "target", "mse", "psnr",
          "ssim", "best_guess_psnr"]
NON_PRIVATE = "non-private"
Setting = tuple[str, str, float, str]  # (attack, release label, noise std, attacker)


def collect(results: list[Path], out: Path) -> int:
    """Write one CSV row per attacked target of every done run in ``results``; the number of rows."""
    from dpeval.core.registry import default_model
    from dpeval.store import ResultStore

    rows = []
    for folder in results:
        store = ResultStore(folder)
        for run in store.results("done"):
            config = run.config
            defense = config["defense"]
            model = config["model"]["name"] or default_model(config["data"]["name"])
            for attack in config["attacks"]:
                scores_path = run.folder / attack / f"{attack}-scores.json"
                scores = json.loads(scores_path.read_text())
                (state,) = scores["states"]  # these sweeps attack one state (init)
                release = {"run_id": run.run_id, "attack": attack, "defense": defense["name"],
                           "noise_std": defense.get("noise_std", 0.0) or 0.0, "rate": state.get("defense_rate", 0.0),
                           "mask_aware": config["attack"][attack].get("mask_aware", True), "model": model}
                for t, (mse, psnr, ssim) in enumerate(zip(state["mse"], state["psnr"], state["ssim"])):
                    rows.append({**release, "target": t, "mse": statistics.fmean(mse), "psnr": statistics.fmean(psnr),
                                 "ssim": statistics.fmean(ssim),
                                 "best_guess_psnr": statistics.fmean(scores["best_guess_psnr"][t])})
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def setting(row: dict[str, str]) -> Setting:
    if row["defense"] == "none":
        return row["attack"], NON_PRIVATE, 0.0, NON_PRIVATE
    attacker = "mask-aware" if row["mask_aware"] == "True" else "naive"
    return row["attack"], "rs", float(row["noise_std"]), attacker


def summarise(path: Path) -> dict[Setting, dict[float, dict[str, float]]]:
    """setting → rate → mean MSE, its SEM, mean PSNR, share of targets above their best guess, the best
    guesses' mean MSE, n."""
    groups: dict[Setting, dict[float, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as f:
        for row in csv.DictReader(f):
            groups[setting(row)][float(row["rate"])].append(row)
    out: dict[Setting, dict[float, dict[str, float]]] = {}
    for key, by_rate in groups.items():
        out[key] = {}
        for rate, rows in sorted(by_rate.items()):
            mse = [float(r["mse"]) for r in rows]
            out[key][rate] = {
                "mse": statistics.fmean(mse),
                "sem": statistics.stdev(mse) / math.sqrt(len(mse)) if len(mse) > 1 else math.nan,
                "psnr": statistics.fmean(float(r["psnr"]) for r in rows),
                "beats_guess": sum(float(r["psnr"]) > float(r["best_guess_psnr"]) for r in rows) / len(rows),
                "guess_mse": statistics.fmean(10 ** (-float(r["best_guess_psnr"]) / 10) for r in rows),
                "n": len(rows),
            }
    return out


def rises(by_rate: dict[float, dict[str, float]]) -> tuple[bool, bool]:
    """(every step up in r raises the mean MSE, the largest r exceeds r = 0 by more than both SEMs)."""
    rates = sorted(by_rate)
    mses = [by_rate[r]["mse"] for r in rates]
    first, last = by_rate[rates[0]], by_rate[rates[-1]]
    return (all(b > a for a, b in zip(mses, mses[1:])),
            last["mse"] - first["mse"] > first["sem"] + last["sem"])


def table(data: dict[Setting, dict[float, dict[str, float]]]) -> str:
    lines = ["| attack | noise std | attacker | r | MSE (± SEM) | PSNR | targets above best guess | n |",
             "|---|---|---|---|---|---|---|---|"]
    for (attack, _, std, attacker), by_rate in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][1] != NON_PRIVATE,
                                                                                     kv[0][2], kv[0][3])):
        for rate, s in by_rate.items():
            noise = "none" if attacker == NON_PRIVATE else f"{std:g}"
            lines.append(f"| {attack} | {noise} | {attacker} | {rate:g} | {s['mse']:.4f} ± {s['sem']:.4f} | "
                         f"{s['psnr']:.1f} dB | {s['beats_guess']:.0%} | {s['n']} |")
    return "\n".join(lines)


def claims(data: dict[Setting, dict[float, dict[str, float]]]) -> str:
    lines = []
    for (attack, label, std, attacker), by_rate in sorted(data.items()):
        if label == NON_PRIVATE or len(by_rate) < 2:
            continue
        monotone, clear = rises(by_rate)
        rates = sorted(by_rate)
        first, last = by_rate[rates[0]], by_rate[rates[-1]]
        verdict = "reproduced" if monotone and clear else ("rises, not every step" if clear else "not reproduced")
        if first["beats_guess"] < 0.5:  # no reconstruction to lose: a rise among failures says nothing
            verdict = (f"not measurable: at r = {rates[0]:g} only {first['beats_guess']:.0%} of the targets beat their "
                       "best data-free guess")
        lines.append(f"- {attack}, noise std {std:g}, {attacker}: MSE {first['mse']:.4f} at r = {rates[0]:g} → "
                     f"{last['mse']:.4f} at r = {rates[-1]:g}; every step up: {'yes' if monotone else 'no'} — "
                     f"{verdict}.")
    return "\n".join(lines)


def figure(data: dict[Setting, dict[float, dict[str, float]]], out: Path, attack: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for (att, label, std, attacker), by_rate in sorted(data.items()):
        if att != attack:
            continue
        if label == NON_PRIVATE:
            s = next(iter(by_rate.values()))
            ax.axhline(s["mse"], color="red", linestyle="--", label=f"non-private ({s['mse']:.4f})")
            ax.axhline(s["guess_mse"], color="grey", linestyle="-.",
                       label=f"best data-free guess ({s['guess_mse']:.3f})")
            continue
        rates = sorted(by_rate)
        ax.errorbar(rates, [by_rate[r]["mse"] for r in rates], yerr=[by_rate[r]["sem"] for r in rates],
                    marker="o" if attacker == "mask-aware" else "s", capsize=3,
                    linestyle="-" if attacker == "mask-aware" else ":", label=f"{attacker}, noise std {std:g}")
    ax.set_xlabel("sparsification rate r")
    ax.set_ylabel(f"{attack.upper()} reconstruction MSE (mean ± SEM)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    c = sub.add_parser("collect", help="per-target rows of every done run in the results folders")
    c.add_argument("results", nargs="+", type=Path)
    c.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("figure", help="table, claims and figure from a collected CSV")
    f.add_argument("csv", type=Path)
    f.add_argument("--figure", type=Path, help="SVG of the IG panel")
    f.add_argument("--doc", type=Path, help="write table and claims between its reconstruction-fashionmnist markers")
    args = parser.parse_args()
    if args.step == "collect":
        print(f"{collect(args.results, args.out)} rows → {args.out}")
        return
    data = summarise(args.csv)
    text = table(data) + "\n\n" + claims(data)
    print(text)
    if args.figure:
        figure(data, args.figure, "ig")
    if args.doc:
        write_into(args.doc, "reconstruction-fashionmnist", text)


if __name__ == "__main__":
    main()
