"""How much of the private gradient GEP's anchor subspace misses, and whether the residual's signal survives its
noise: the quantity behind GEP vs B-GEP (B-GEP drops the residual, GEP releases it with its own clip and noise).

    python bench/gep_residual.py RESULTS/runs/RUN_ID [--batches 5]

For a stored GEP or B-GEP run, at its initial weights (rebuilt from its seed) and its final ones (model.pt): the
anchor bases V as training computes them (the run's own defense class and settings), then over batches of the
recipe's size from the private pool: the projection error of the batch's mean gradient ‖ḡ − VVᵀḡ‖/‖ḡ‖ (the GEP
paper's Figure 4 quantity, unclipped), and for the two parts GEP releases, the norm of the clipped mean signal
beside the norm of the noise the run adds to it — embedding: ‖mean clip_C0(Vᵀg_i)‖ vs σ_e·C0·√k/B; residual:
‖mean clip_C1(r_i)‖ vs σ·C1·√d/B, σ_e and σ the run's (σ_e = σ/√2 for B-GEP). A residual whose signal is a small
fraction of its noise adds little to the release, so B-GEP loses little by dropping it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import yaml


def measure(run: Path, batches: int) -> dict:
    """The run's facts and, per state (init, final), the batch averages and the two noise norms."""
    import dpeval
    from dpeval.defenses.gep import clip_rows
    from dpeval.runner import prepare

    config = yaml.safe_load((run / "config.yaml").read_text())
    config.pop("defaults", None)  # dpeval's record of the run, not a setting: configure refuses it as input
    spec = dpeval.configure({**config, "device": "cpu"})
    if spec.defense_name != "gep":
        raise SystemExit(f"{run}: a {spec.defense_name} run; this reads gep runs only")
    prep = prepare(spec)
    defense = prep.make_defense(prep.streams.scope("victim"))
    p, b = spec.defense, spec.train.batch_size
    sigma = defense.noise_multiplier  # the run's σ, planned from its config as training planned it
    states = {"init": {k: v.clone() for k, v in prep.model.state_dict().items()},
              "final": torch.load(run / "model.pt", map_location="cpu")}
    pool = prep.task.train
    out: dict = {"biased": p.biased, "d": defense.d, "sigma": sigma, "batch": b, "states": {}}
    for name, state in states.items():
        prep.model.load_state_dict(state)
        defense.refresh_anchors()
        out["k"] = defense.k  # the bases computed (num_bases, or fewer where the anchors cap them)
        rows = []
        for i in range(min(batches, len(pool) // b)):
            x, y = pool.x[i * b:(i + 1) * b], pool.y[i * b:(i + 1) * b]
            g = defense.flatten(defense._psg(x, y))
            theta = defense.embed(g)
            residual = g - defense.lift(theta)
            rows.append({
                "projection_error": float(residual.mean(0).norm() / g.mean(0).norm()),
                "embedding_signal": float(clip_rows(theta, p.clip0).mean(0).norm()),
                "residual_signal": float(clip_rows(residual, p.clip1).mean(0).norm()),
            })
        avg = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
        avg["embedding_noise"] = defense.embedding_multiplier * p.clip0 * math.sqrt(defense.k) / b
        avg["residual_noise"] = sigma * p.clip1 * math.sqrt(defense.d) / b
        out["states"][name] = avg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder (RESULTS/runs/RUN_ID) of a gep run")
    parser.add_argument("--batches", type=int, default=5, help="private batches averaged per state (default 5)")
    args = parser.parse_args()
    m = measure(args.run, args.batches)
    print(f"{args.run.name}: {'B-GEP' if m['biased'] else 'GEP'}, k = {m['k']}, d = {m['d']}, σ = {m['sigma']:.3f}, "
          f"B = {m['batch']}, {args.batches} batches per state")
    for name, s in m["states"].items():
        print(f"  {name:5}  projection error ‖r̄‖/‖ḡ‖ = {s['projection_error']:.3f}   "
              f"embedding signal {s['embedding_signal']:.4f} vs noise {s['embedding_noise']:.4f}   "
              f"residual signal {s['residual_signal']:.4f} vs noise {s['residual_noise']:.4f} "
              f"(ratio {s['residual_signal'] / s['residual_noise']:.3f}{'; B-GEP drops it' if m['biased'] else ''})")


if __name__ == "__main__":
    main()
