"""The population of a shadow-model membership attack, who trains on what, and the signals read off models.

- **Population**: the victim's private pool ∪ the held-out test set. A membership matrix M (K × N, bool)
  says which examples each shadow model trains on. Two designs:
  - ``membership_matrix``: complementary halves (model 2j gets a random half, model 2j+1 the other half),
    so every example is IN for exactly K/2 models;
  - ``fixed_size_membership``: every model trains on exactly ``size`` examples (the victim's pool size),
    and the OUT slots are spread evenly, so every example is OUT for ⌊K·(N−size)/N⌋ or one more models.
- **Signals** (``phi``): logit-scaled confidence φ = log p_y − log Σ_{y'≠y} p_{y'} = z_y − logsumexp_{y'≠y} z_{y'},
  computed in float64 from logits. Cached per model under a key hashing the weights and the data indices,
  so a stale cache can never be read.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dpeval.core.files import write_atomic
from dpeval.core.per_sample import fixed_front


@dataclass
class Population:
    x: torch.Tensor
    y: torch.Tensor
    in_victim: torch.Tensor  # bool [N]: True for the victim's private pool
    source: list[str]        # "train" / "test" per example, for provenance


def population(task) -> Population:
    x = torch.cat([task.train.x, task.test.x])
    y = torch.cat([task.train.y, task.test.y])
    in_victim = torch.cat([torch.ones(len(task.train), dtype=torch.bool),
                           torch.zeros(len(task.test), dtype=torch.bool)])
    return Population(x, y, in_victim, ["train"] * len(task.train) + ["test"] * len(task.test))


def membership_matrix(k: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """K × N membership with complementary pairs: each example is IN for exactly K/2 models."""
    if k < 2 or k % 2:
        raise ValueError("the number of shadow models must be even and >= 2")
    rows = []
    for _ in range(k // 2):
        half = torch.zeros(n, dtype=torch.bool)
        half[torch.randperm(n, generator=gen)[: n // 2]] = True
        rows += [half, ~half]
    return torch.stack(rows)


def fixed_size_membership(k: int, n: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """K × N membership where every row has exactly ``size`` IN examples and the K·(N − size) OUT slots are
    spread evenly over the examples (each OUT for ⌊K(N−size)/N⌋ or ⌊K(N−size)/N⌋ + 1 rows).

    The OUT sets are consecutive stretches of N − size entries of a sequence of random permutations of
    the N examples (laps). A stretch that crosses into a new lap draws that lap with the stretch's
    examples from the old lap at its end, so no row repeats an example and every lap stays a permutation:
    each example appears once per full lap, at most once in the last, partial one."""
    if not 0 < size <= n:
        raise ValueError(f"a pool of {size} examples cannot be drawn from {n}")
    width = n - size
    out = torch.zeros(k, n, dtype=torch.bool)
    lap, pos = torch.randperm(n, generator=gen), 0
    for row in range(k):
        taken = lap[pos:pos + width]
        pos += len(taken)
        missing = width - len(taken)
        if missing:
            fresh = torch.ones(n, dtype=torch.bool)
            fresh[taken] = False
            others, repeats = torch.nonzero(fresh).flatten(), taken
            lap = torch.cat([others[torch.randperm(len(others), generator=gen)],
                             repeats[torch.randperm(len(repeats), generator=gen)]])
            taken, pos = torch.cat([taken, lap[:missing]]), missing
        out[row, taken] = True
    return ~out


def phi_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """φ = log p_y − log Σ_{y'≠y} p_{y'} = z_y − logsumexp_{y'≠y} z_{y'}, in float64 (no softmax underflow)."""
    z = logits.double()
    true = z.gather(1, labels.view(-1, 1)).squeeze(1)
    others = z.scatter(1, labels.view(-1, 1), -math.inf)
    return (true - torch.logsumexp(others, dim=1)).cpu().numpy()


def cache_key(state: dict[str, torch.Tensor], indices: torch.Tensor, kind: str) -> str:
    digest = hashlib.sha256(kind.encode())
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    digest.update(indices.cpu().numpy().astype(np.int64).tobytes())
    return digest.hexdigest()[:32]


@torch.no_grad()
def model_outputs(model: nn.Module, state: dict[str, torch.Tensor], features: torch.Tensor, y: torch.Tensor,
                  device: torch.device, batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(φ, probability of the true label) of one set of weights on the examples whose fixed-front features
    (``dpeval.core.per_sample.front_features``, computed once for all models of a game) are ``features``."""
    model.load_state_dict(state)
    model.to(device).eval()
    head = fixed_front(model).head
    logits = torch.cat([head(features[i:i + batch].to(device)).cpu() for i in range(0, len(y), batch)])
    prob = torch.softmax(logits.double(), dim=1).gather(1, y.view(-1, 1)).squeeze(1).numpy()
    return phi_from_logits(logits, y), prob


def cached_outputs(model: nn.Module, state: dict[str, torch.Tensor], features: torch.Tensor, y: torch.Tensor,
                   indices: torch.Tensor, cache_dir: Path | None,
                   device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """``model_outputs`` through a disk cache keyed by a hash of the weights and the data indices."""
    if cache_dir is None:
        return model_outputs(model, state, features, y, device)
    path = cache_dir / f"{cache_key(state, indices, 'phi+prob')}.npz"
    if path.is_file():
        data = np.load(path)
        return data["phi"], data["prob"]
    phi, prob = model_outputs(model, state, features, y, device)
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: np.savez(f, phi=phi, prob=prob))
    return phi, prob
