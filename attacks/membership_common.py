"""What the shadow-model membership attacks (``lira``, ``rmia``) share: parameters, the shadow pool of a
run, and the target/reference views of it.

Protocols (``attack.mia_target``):
- ``victim`` (default): the trained victim is the target; members are its private pool, non-members the
  held-out test set; all K shadows are references (each example is IN for exactly K/2 of them).
- ``shadows``: leave-one-model-out — each shadow in turn is the target, the other K − 1 are references,
  and the scores of all K targets are pooled (K·N scores, balanced members/non-members).
Both report ``n_members`` / ``n_nonmembers``.

The pool is trained once per run and process, and shared by every shadow attack of the run; signals are
cached on disk under ``<run>/signals/`` keyed by a hash of weights and data indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.base import Attack, AttackContext, AttackParams, AttackResult
from attacks.membership_metrics import membership_metrics, save_roc
from attacks import shadow_signals as sig
from harness.core.errors import ConfigError
from harness.core.params import param
from harness.engine.shadow_training import train_shadows

TARGETS = ("victim", "shadows")


@dataclass
class ShadowParams(AttackParams):
    shadows: int = param(16, "K shadow models (even: complementary pairs)", low=2)
    mia_target: str = param("victim", "`victim`: the trained victim is the target; `shadows`: "
                                      "leave-one-model-out over the shadows", choices=TARGETS)
    online: bool = param(True, "online: IN and OUT references; offline: OUT references only")

    def validate(self) -> None:
        if self.shadows % 2:
            raise ConfigError(f"attack.shadows: must be even (complementary pairs), got {self.shadows}")
        if self.mia_target == "shadows" and self.shadows < 4:
            raise ConfigError("attack.shadows: leave-one-model-out needs at least 4 shadow models")


@dataclass
class ShadowPool:
    membership: np.ndarray     # [K, N] bool
    phi: np.ndarray            # [K, N] shadows' φ on the population
    prob: np.ndarray           # [K, N] shadows' probability of the true label
    victim_phi: np.ndarray     # [N]
    victim_prob: np.ndarray    # [N]
    in_victim: np.ndarray      # [N] bool
    public_prob: np.ndarray    # [K, Z] shadows on the public set (RMIA's population z)
    victim_public_prob: np.ndarray  # [Z]


@dataclass
class View:
    """One target against its references: what every shadow attack scores."""

    target_phi: np.ndarray     # [N]
    target_prob: np.ndarray    # [N]
    target_public_prob: np.ndarray  # [Z]
    ref_phi: np.ndarray        # [R, N]
    ref_prob: np.ndarray       # [R, N]
    ref_in: np.ndarray         # [R, N] bool: reference trained on the example
    ref_public_prob: np.ndarray  # [R, Z]
    labels: np.ndarray         # [N] bool: the target trained on the example


_POOLS: dict[tuple, ShadowPool] = {}


def shadow_pool(context: AttackContext, k: int) -> ShadowPool:
    key = (context.spec.run_key, k, id(context.trained_defense))
    if key in _POOLS:
        return _POOLS[key]
    task, spec, device = context.task, context.spec, context.device
    pop = sig.population(task)
    membership = sig.membership_matrix(k, len(pop.y), context.streams.scope("shadows").generator("membership"))
    pools = [torch.nonzero(row).flatten() for row in membership]
    scopes = [context.streams.scope("shadow", i) for i in range(k)]
    states = train_shadows(context.build_model, pop.x, pop.y, pools,
                           lambda i, model: context.make_defense(scopes[i], model), spec.train, scopes, device)
    cache = context.out_dir.parent / "signals"
    model = context.build_model()
    pop_idx = torch.arange(len(pop.y))
    pub_idx = -1 - torch.arange(len(task.public))  # distinct keys for the public set
    outputs = [sig.cached_outputs(model, s, pop.x, pop.y, pop_idx, cache, device) for s in states]
    public = [sig.cached_outputs(model, s, task.public.x, task.public.y, pub_idx, cache, device)[1] for s in states]
    victim_state = context.states["final"]
    victim_phi, victim_prob = sig.cached_outputs(model, victim_state, pop.x, pop.y, pop_idx, cache, device)
    _, victim_public = sig.cached_outputs(model, victim_state, task.public.x, task.public.y, pub_idx, cache, device)
    pool = ShadowPool(
        membership=membership.numpy(), phi=np.stack([o[0] for o in outputs]), prob=np.stack([o[1] for o in outputs]),
        victim_phi=victim_phi, victim_prob=victim_prob, in_victim=pop.in_victim.numpy(),
        public_prob=np.stack(public) if public and len(task.public) else np.zeros((k, 0)),
        victim_public_prob=victim_public,
    )
    _POOLS.clear()  # keep one run's pool in memory at a time
    _POOLS[key] = pool
    return pool


def views(pool: ShadowPool, target: str) -> list[View]:
    if target == "victim":
        return [View(pool.victim_phi, pool.victim_prob, pool.victim_public_prob, pool.phi, pool.prob,
                     pool.membership, pool.public_prob, pool.in_victim)]
    out = []
    for t in range(pool.phi.shape[0]):
        refs = np.arange(pool.phi.shape[0]) != t
        out.append(View(pool.phi[t], pool.prob[t], pool.public_prob[t], pool.phi[refs], pool.prob[refs],
                        pool.membership[refs], pool.public_prob[refs], pool.membership[t]))
    return out


def score_all(pool: ShadowPool, target: str, score_view: Any) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the scores and labels of every view of the chosen protocol."""
    scores, labels = zip(*[(score_view(v), v.labels) for v in views(pool, target)])
    return np.concatenate(scores), np.concatenate(labels)


def out_dir(context: AttackContext) -> Path:
    context.out_dir.mkdir(parents=True, exist_ok=True)
    return context.out_dir


class ShadowAttack(Attack):
    """A membership attack scoring a target against shadow references: subclasses give ``score(view)``
    and ``title()``; the pool, protocol, metrics and ROC artefacts are common."""

    def score(self, view: View) -> np.ndarray:
        raise NotImplementedError

    def title(self) -> str:
        raise NotImplementedError

    def run(self, context: AttackContext) -> AttackResult:
        pool = shadow_pool(context, self.params.shadows)
        scores, labels = score_all(pool, self.params.mia_target, self.score)
        metrics = membership_metrics(scores, labels, context.accounted.delta,
                                     context.streams.scope("attack", self.name).numpy("threshold"))
        return AttackResult(metrics, save_roc(scores, labels, out_dir(context), self.title()))
