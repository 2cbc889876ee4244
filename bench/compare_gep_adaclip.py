"""DP-SGD vs GEP vs AdaCliP at the same (ε, δ): test accuracy over seeds (mean ± SEM), and optionally the
AdaCliP paper's noise measure ‖g − g̃‖ split into clipping error and noise.

    .venv/bin/python bench/compare_gep_adaclip.py --seeds 0 1 2 --run dpsgd --run gep --run adaclip
    .venv/bin/python bench/compare_gep_adaclip.py --seeds 0 --run "gep:clip0=1,clip1=0.2" --set train.epochs=10
    .venv/bin/python bench/compare_gep_adaclip.py --seeds 0 1 2 --run dpsgd --run adaclip --noise-study

Each ``--run`` is ``NAME[:key=value,...]`` (defense parameters); ``--set dotted.key=value`` applies to every
run (YAML scalars, as the CLI's ``--set``). Runs go through the harness's own ``prepare`` and ``train``
(the same code path as ``dpeval run``), without writing to a results store. Printed as a Markdown table.

``--noise-study`` wraps the defense with a probe that, per step, also computes (diagnostics only, never fed
back into training): ḡ = (1/B)·Σ unclipped per-sample gradients, the release g̃, and the noise-free release
g⁰ of a shallow copy of the defense with σ = 0 and its own generator (same state, same accumulated sums, so
the real noise stream is untouched). Reported per run as means over steps: ‖g̃ − ḡ‖ (the paper's Fig. 3
quantity), ‖g⁰ − ḡ‖ (clipping / projection error) and ‖g̃ − g⁰‖ (noise).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from typing import Any

import torch

from dpeval.config import build_spec, parse_set, set_dotted
from dpeval.core.streams import seed_globals
from dpeval.engine.training import train
from dpeval.runner import prepare


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads.values()])


class NoiseProbe:
    """Forwards the three stages to ``inner`` and records ‖g̃ − ḡ‖, ‖g⁰ − ḡ‖, ‖g̃ − g⁰‖ per step."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.raw: torch.Tensor | None = None
        self.total: list[float] = []
        self.clip_err: list[float] = []
        self.noise: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        self.inner.begin_epoch(epoch, epochs)

    def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
        s = torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1).sum(dim=0)
        self.raw = s if self.raw is None else self.raw + s
        self.inner.clip_and_accumulate(grads)

    def release(self, batch_size: int):
        clean_copy = copy.copy(self.inner)
        clean_copy.noise_multiplier = 0.0
        clean_copy.generator = torch.Generator(device=self.inner.device)  # unused at σ = 0
        clean = flat(clean_copy.release(batch_size).grads)
        shared = self.inner.release(batch_size)
        noisy = flat(shared.grads)
        mean = (self.raw if self.raw is not None else torch.zeros_like(noisy)) / batch_size
        self.raw = None
        self.total.append(float((noisy - mean).norm()))
        self.clip_err.append(float((clean - mean).norm()))
        self.noise.append(float((noisy - clean).norm()))
        return shared


def parse_run(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    params = dict(parse_set([kv for kv in rest.split(",") if kv])) if rest else {}
    return name, params


def one(name: str, params: dict[str, Any], seed: int, sets: list[tuple[str, Any]], epsilon: float,
        noise_study: bool) -> dict[str, float]:
    raw: dict[str, Any] = {"defense": {"name": name, **params}, "privacy": {"epsilon": epsilon}, "seed": seed,
                           "device": "cpu"}
    for key, value in sets:
        set_dotted(raw, key, value)
    spec = build_spec(raw)
    prep = prepare(spec)
    seed_globals(prep.streams)
    defense = prep.make_defense(prep.streams.scope("victim"))
    probe = NoiseProbe(defense) if noise_study else None
    start = time.perf_counter()
    result = train(prep.model, prep.task.train, prep.task.test, probe or defense, spec.train, prep.sampler,
                   prep.device, progress=False)
    out = {"acc": result.history[-1]["test_accuracy"], "eps": prep.privacy.epsilon,
           "sigma": prep.privacy.noise_multiplier, "time": time.perf_counter() - start}
    if probe is not None:
        out.update(total=statistics.fmean(probe.total), clip=statistics.fmean(probe.clip_err),
                   noise=statistics.fmean(probe.noise))
    if hasattr(defense, "at_h2"):
        out["frac_h2"] = defense.at_h2 / defense.d
    return out


def mean_sem(values: list[float]) -> str:
    m = statistics.fmean(values)
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{m:.4f} ± {sem:.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="NAME[:key=value,...]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--noise-study", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sets = parse_set(args.sets)
    header = "| run | ε | σ | test accuracy (mean ± SEM) | per seed | train s/run |"
    if args.noise_study:
        header += " ‖g̃−ḡ‖ | clip err ‖g⁰−ḡ‖ | noise ‖g̃−g⁰‖ |"
    print(f"seeds {args.seeds}, target ε = {args.epsilon}, sets {args.sets}", flush=True)
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for text in args.run:
        name, params = parse_run(text)
        rows = [one(name, params, s, sets, args.epsilon, args.noise_study) for s in args.seeds]
        per_seed = " ".join(f"{r['acc']:.3f}" for r in rows)
        line = (f"| {text} | {rows[0]['eps']:.3f} | {rows[0]['sigma']:.3f} | "
                f"{mean_sem([r['acc'] for r in rows])} | {per_seed} | "
                f"{statistics.fmean(r['time'] for r in rows):.1f} |")
        if args.noise_study:
            line += " " + " | ".join(f"{statistics.fmean(r[k] for r in rows):.4f}"
                                     for k in ("total", "clip", "noise")) + " |"
        if "frac_h2" in rows[0]:  # AdaCliP: fraction of coordinates whose last variance estimate hit h2
            line += f" at h2: {statistics.fmean(r['frac_h2'] for r in rows):.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
