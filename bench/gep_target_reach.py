"""How much of GEP's accounted μ a final-model statistic along the target's gradient can see: the reason GEP's row
of the benchmark's final-model column reads below DP-SGD's at the same ε.

    OMP_NUM_THREADS=1 .venv/bin/python bench/gep_target_reach.py [--draws 3] [--kept RESULTS/models]

GEP releases a record's gradient g in two parts (``dpeval.defenses.gep``): its embedding θ = Vᵀg in the step's
anchor subspace, clipped to C0 with noise σ·C0 on each of the k coordinates, and its residual r = g − Vθ, clipped
to C1 with noise σ·C1 on each of the d coordinates, σ = √2·σ_acc. Both parts at their clip make the accounted
sensitivity √2: one step is then worth μ = 1/σ_acc to an auditor who sees the two parts apart. The final-model
audit's loss and projection statistics score the final model along g. Along g, one step moves the target's
contribution by g·(Vθ̂ + r̂) = ‖θ‖‖θ̂‖ + ‖r‖‖r̂‖, and the noise has variance σ²(C0²‖θ‖² + C1²‖g‖²) (the residual's
noise covers all d coordinates), so such a statistic sees the fraction

    reach = (‖θ‖‖θ̂‖ + ‖r‖‖r̂‖) / (√2 · √(C0²‖θ‖² + C1²‖g‖²))

of the accounted μ. For DP-SGD (one part, isotropic noise, g at its clip) the same computation gives 1. This script
measures ‖θ‖ and ‖r‖ of the column's blank target at the column's crafted θ₀, with GEP's own anchors and bases (one
line per anchor draw: a model's scope), and prints reach × the accounted μ of each ε beside the loss separation the
column measured (docs/results/benchmark-fashionmnist-model-audit.csv).

``--kept`` (the column's ``RESULTS/models``) also scores the kept GEP models along a GEP-aware direction
w = r̂/C1² + Vθ̂/(C0² + C1²), the noise-whitened direction for one step's V, beside the audit's −g: an auditor who
knew the subspace. Measured, it reads no more than −g: GEP redraws its subspace at every step of every model.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def reach(theta_norm: float, residual_norm: float, clip0: float, clip1: float) -> float:
    """The fraction of GEP's accounted μ that a statistic along g sees (module docstring), from the norms of the
    unclipped embedding and residual of g."""
    g2 = theta_norm ** 2 + residual_norm ** 2
    shift = theta_norm * min(theta_norm, clip0) + residual_norm * min(residual_norm, clip1)
    return shift / (math.sqrt(2) * math.sqrt(clip0 ** 2 * theta_norm ** 2 + clip1 ** 2 * g2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=3, help="anchor draws (the first models' scopes)")
    parser.add_argument("--kept", type=Path, help="the column's RESULTS/models: score the kept GEP models too")
    parser.add_argument("--column", type=Path, default=ROOT / "docs/results/benchmark-fashionmnist-model-audit.csv")
    args = parser.parse_args()
    import torch.nn.functional as F
    from model_audit_column import EPSILONS, row_config

    from dpeval.audit.model import ModelAuditOptions, balanced_labels, choose_target, initial_parameters, settings_key
    from dpeval.checkpoint import ShadowStore
    from dpeval.config import build_spec
    from dpeval.core.datasets import load_task
    from dpeval.core.statistics import separation  # the column's loss and projection separations
    from dpeval.runner import prepare

    measured = {}
    if args.column.is_file():
        with args.column.open() as f:
            measured = {float(r["target_epsilon"]): r for r in csv.DictReader(f) if r["defense"] == "gep"}
    spec = build_spec(row_config("gep", EPSILONS[0]))
    task = load_task(spec.data)
    target, task = choose_target("blank", task)
    prep = prepare(spec, task=task)
    streams = prep.streams.scope("audit", "model")  # the audit's: the same θ₀ and anchor draws as the column
    theta0, _ = initial_parameters("crafted", prep.model, task, streams, prep.device)
    model = prep.build_model()
    model.load_state_dict(theta0)
    clip0, clip1 = spec.defense.clip0, spec.defense.clip1
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(target.x.unsqueeze(0)), torch.tensor([target.y])).backward()
    grads = {name: p.grad.detach().unsqueeze(0) for name, p in model.named_parameters()}  # type: ignore[union-attr]
    print(f"GEP, C0 = {clip0}, C1 = {clip1}, k = {spec.defense.num_bases}; blank target at crafted θ₀; "
          f"torch threads {torch.get_num_threads()}")
    directions = []
    for draw in range(args.draws):
        defense = prep.make_defense(streams.scope("models", draw), model, 1)
        defense.current_bases()
        g = defense.flatten(grads)[0]
        theta = defense.embed(g[None])[0]
        residual = g - defense.lift(theta[None])[0]
        a, b = float(theta.norm()), float(residual.norm())
        fraction = reach(a, b, clip0, clip1)
        expected = ", ".join(
            f"ε = {eps:g}: {fraction * float(measured[eps]['accounted_mu']):.2f} (measured "
            f"{float(measured[eps]['loss_separation']):.2f})" for eps in EPSILONS if eps in measured)
        print(f"draw {draw}: ‖g‖ {float(g.norm()):.3f}, ‖θ‖ {a:.3f}, ‖r‖ {b:.3f}; reach {fraction:.3f} of the "
              f"accounted μ; expected loss separation {expected or '(no measured rows)'}")
        theta_hat = theta * min(1.0, clip0 / a)
        residual_hat = residual * min(1.0, clip1 / b)
        whitened = residual_hat / clip1 ** 2 + defense.lift(theta_hat[None])[0] / (clip0 ** 2 + clip1 ** 2)
        directions.append((draw, g.double(), whitened.double()))
    if args.kept is None:
        return

    def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:  # every draw's defense flattens alike
        return defense.flatten({name: state[name].unsqueeze(0) for name in defense.names})[0]

    start = flat(theta0)
    options = ModelAuditOptions(models=200, init="crafted", target="blank", sampling="full")
    labels = balanced_labels(options.models, streams.numpy("membership"))
    for eps in EPSILONS:
        folder = args.kept / f"gep-eps{eps:g}"
        row = build_spec(row_config("gep", eps))
        states = ShadowStore(folder, settings_key(row, dataclasses.replace(options, keep=folder), None)).finished(
            options.models)
        if len(states) < options.models:
            print(f"ε = {eps:g}: {len(states)} of {options.models} models kept in {folder}; skipped")
            continue
        moved = torch.stack([flat(states[i]) - start for i in range(options.models)]).double()
        for draw, g, whitened in directions:
            along_g, along_w = -(moved @ g).numpy(), -(moved @ whitened).numpy()
            print(f"ε = {eps:g}, draw {draw}: kept models' separation along −g {separation(along_g, labels):.3f}, "
                  f"along the GEP-aware −w {separation(along_w, labels):.3f}")


if __name__ == "__main__":
    sys.exit(main())
