"""How `dpeval leaderboard` and `dpeval report` scale with the size of the results store: build a synthetic
store of N runs (default 10,000) and time the commands on it, each in its own process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/store_scale.py --runs 10000 --store /tmp/dpeval-store-10k

The store is written through the store's own API (``ResultStore.begin`` / ``finish``, configurations from
``build_spec``), so its rows are what sweeps record: studies of one dataset, epoch budget and learning rate
(no two runs share a run key), each a grid of DP defenses (dpsgd over its clip, rs and random-freeze over
their final rate) × requested ε × 5 seeds plus a non-private baseline, attacked by ig (per-state PSNR,
baseline, verdict) and lira (AUC, TPR, verdict), with per-epoch curves; every other study is a paper recipe
(``paper.source`` / ``table`` / ``row`` per cell), so the selection's price is computed per recipe cell, the
rest per dataset. Rows carry no artefact files (ROC files, image arrays): figures drawn from artefacts cost
with their number, not with the store's.

A store already at ``--store`` with N runs is reused (building 10,000 runs takes a few minutes). Printed: one
table of wall and CPU seconds per command (CPU: user + system of the child, a steadier figure than wall time
on a busy machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from dpeval.config import build_spec
from dpeval.store import ResultStore

DATASETS = ("digits", "mnist", "fashionmnist", "cifar10")
EPOCHS = (10, 20, 30)
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
SEEDS = range(5)
DEFENSES = {"dpsgd": ("clip", (0.1, 0.5, 1.0, 2.0)), "rs": ("final_rate", (0.0, 0.5, 0.7, 0.9)),
            "random-freeze": ("final_rate", (0.5, 0.7, 0.9, 0.99))}
STATES = ("epoch:3", "epoch:6", "final")


def studies() -> Iterator[tuple[str, int, float, int]]:
    """(dataset, epochs, learning rate, study number), as many as asked for, no two alike."""
    for n in itertools.count():
        cycle = len(DATASETS) * len(EPOCHS)
        yield DATASETS[n % len(DATASETS)], EPOCHS[(n // len(DATASETS)) % len(EPOCHS)], 0.01 * (1 + n // cycle), n


def configurations() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(raw configuration, paper columns) of every run, study after study: every run a configuration and
    seed of its own."""
    for dataset, epochs, lr, n in studies():
        base = {"data": {"name": dataset}, "attacks": ["ig", "lira"], "train": {"epochs": epochs, "lr": lr}}
        cells = [(name, {param: value}, eps) for name, (param, values) in DEFENSES.items() for eps in EPSILONS
                 for value in values]
        for name, params, eps in cells + [("none", {}, None)]:
            paper = {}
            if n % 2 and eps is not None:  # a paper recipe: one cell per defense and ε, tuned over its parameter
                paper = {"paper.source": f"Synthetic et al., study {n}", "paper.table": f"Table {n}",
                         "paper.row": f"{dataset}, ε = {eps:g}; {name}", "paper.test_accuracy": 0.8,
                         "paper.accuracy_is": "final"}
            for seed in SEEDS:
                raw = {**base, "defense": {"name": name, **params}, "seed": seed,
                       "privacy": {"epsilon": eps} if eps is not None else {}}
                yield raw, paper


def metrics_of(spec: Any, config: dict[str, Any], paper: dict[str, Any], index: int) -> dict[str, Any]:
    """What a finished run of ``spec`` records, with plausible numbers."""
    eps = config["privacy"]["epsilon"]
    private = eps is not None
    epochs = config["train"]["epochs"]
    shift = ((index * 7919) % 101) / 1000  # seed noise
    acc = 0.55 + 0.35 * (1 - math.exp(-(eps or 50) / 2)) - shift / 2
    psnr = 10 + 2 * math.log1p(eps or 50) + 10 * shift
    steps = epochs * 100
    m: dict[str, Any] = {
        "run_key": spec.run_key, "status": "done", "version": "0.1.0", "device": "cpu",
        "dataset": spec.data.name, "model": "cnn3", "defense": spec.defense_name, "attack": "ig+lira",
        "seed": spec.seed, **{f"defense.{k}": v for k, v in config["defense"].items() if k != "name"},
        **{f"attack.{a}.{k}": v for a, params in config["attack"].items() for k, v in params.items()},
        "privacy.epsilon": eps if private else math.inf, "privacy.delta": 1e-5 if private else 0.0,
        "privacy.noise_multiplier": 4.0 / eps if private else 0.0,
        "privacy.accounted_noise_multiplier": 4.0 / eps if private else 0.0,
        "privacy.sample_rate": 0.01, "privacy.steps": steps, "privacy.accountant": "rdp",
        "privacy.sampling": "poisson", "data.train_size": 10_000, "data.test_size": 2_000, "data.public_size": 500,
        "utility.test_accuracy": acc, "utility.train_accuracy": acc + 0.02,
        "utility.test_accuracy_by_epoch": [acc * (1 - 0.5 ** (e + 1)) for e in range(epochs)],
        "utility.train_loss_by_epoch": [2.3 * 0.9 ** e for e in range(epochs)],
        "comm.density": 1.0 - config["defense"].get("final_rate", 0.0) / 2, "comm.bytes_dense": 2_202_280,
        "comm.bytes_sparse": 1_212_632.0, "comm.density_by_epoch": [1.0] * epochs,
        "time.train_s": 40.0 + 100 * shift, "time.attack_s": 12.0, "time.threads": 1, "train.engine_used": "func",
        "leakage.ig.psnr": psnr, "leakage.ig.baseline_psnr": 12.0, "leakage.ig.state": "final",
        "leakage.ig.verdict": "leaks" if psnr > 14 else "no-leak-detected", "leakage.ig.p_value": 0.01,
        "leakage.ig.defense_rate": config["defense"].get("final_rate", 0.0),
        "leakage.lira.auc": 0.5 + 0.2 * shift, "leakage.lira.tpr_at_0.1pct_fpr": 0.002,
        "leakage.lira.verdict": "no-leak-detected",
        **paper,
    }
    for i, state in enumerate(STATES):
        m[f"leakage.ig.{state}.psnr"] = psnr - 2 + i
    return m


def build(root: Path, runs: int) -> float:
    """Record ``runs`` finished runs in a new store at ``root``; seconds taken."""
    store = ResultStore(root)
    start = time.perf_counter()
    for index, (raw, paper) in enumerate(itertools.islice(configurations(), runs)):
        spec = build_spec(raw)
        config = spec.canonical()
        run_id = store.begin(spec.run_key, config)
        store.finish(run_id, {"run_id": run_id, **metrics_of(spec, config, paper, index)})
        if (index + 1) % 1000 == 0:
            print(f"  {index + 1} runs recorded", file=sys.stderr)
    return time.perf_counter() - start


def timed(args: list[str], timeout: float) -> tuple[float, float, str]:
    """(wall s, CPU s, what happened) of ``python -m dpeval.cli <args>`` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "dpeval.cli", *args], capture_output=True, text=True,
                              timeout=timeout)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
    except subprocess.TimeoutExpired:
        status = f"stopped after {timeout:g} s"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000, help="runs in the synthetic store")
    parser.add_argument("--store", type=Path, help="results folder to build (or reuse); default a temporary one")
    parser.add_argument("--timeout", type=float, default=3600, help="stop a command after this many seconds")
    parser.add_argument("--skip-report", action="store_true", help="time the leaderboard commands only")
    parser.add_argument("--json", type=Path, help="also write the timings to this JSON file")
    args = parser.parse_args()
    root = args.store or Path(tempfile.mkdtemp(prefix="dpeval-store-"))
    recorded = len(ResultStore(root).rows("done")) if (root / "results.sqlite").exists() else 0
    if recorded not in (0, args.runs):
        sys.exit(f"{root} holds {recorded} runs, not {args.runs}: name another --store")
    if recorded:
        print(f"reusing {root} ({recorded} runs)", file=sys.stderr)
    else:
        print(f"building {args.runs} runs in {root} ({build(root, args.runs):.0f} s)", file=sys.stderr)
    outputs = Path(tempfile.mkdtemp(prefix="dpeval-scale-out-"))
    commands = [("leaderboard", ["leaderboard", "--results", str(root)]),
                ("leaderboard --group-seeds", ["leaderboard", "--results", str(root), "--group-seeds"]),
                ("leaderboard --out", ["leaderboard", "--results", str(root), "--out", str(outputs / "board.csv")])]
    if not args.skip_report:
        commands.append(("report", ["report", "--results", str(root), "--out", str(outputs / "report.html")]))
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"{args.runs} runs, OMP_NUM_THREADS={threads}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} before the first command")
    print("| command | wall s | CPU s | |\n|---|---|---|---|")
    rows = []
    for name, argv in commands:
        wall, cpu, status = timed(argv, args.timeout)
        rows.append({"command": name, "wall_s": wall, "cpu_s": cpu, "status": status})
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {'' if status == 'ok' else status} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "threads": threads, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
