"""Shadow models for membership inference: K models trained like the victim on halves of a population.

- **Population**: the victim's private pool ∪ the held-out test set. The membership matrix M (K × N,
  bool) gives each model a random half of it, built in complementary pairs (model 2j gets a random half,
  model 2j+1 the other half), so every example is IN for exactly K/2 models.
- **Same recipe as the victim**: architecture, defense (with its own noise/mask streams per model), σ,
  batch size, epochs, optimizer, schedule and sampling. The pool is the model's half of the population,
  so q = B/(N/2) differs from the victim's q; σ is kept (the defense is the same mechanism).
- **Vectorised training** (``train_shadows``): the K models' parameters are stacked
  (``torch.func.stack_module_state``) and per-sample gradients of all models come from one
  vmap-over-models of vmap-over-samples. Each model's batch is padded to the largest batch of the step;
  then each model's real rows go through that model's own defense instance (``clip_and_accumulate`` /
  ``release``), the releases are stacked, and one optimizer steps all K models (SGD and Adam act per
  element, so stacking does not couple them). ``train_shadows_sequential`` is the reference path.
- **Signals** (``phi``): logit-scaled confidence φ = log p_y − log Σ_{y'≠y} p_{y'} = z_y − logsumexp_{y'≠y} z_{y'},
  computed in float64 from logits. Cached per model under a key hashing the weights and the data indices,
  so a stale cache can never be read.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from tqdm import tqdm

from defenses.base import Defense
from harness.config import TrainConfig
from harness.training import BatchSampler, make_optimizer, make_schedule, train


@dataclass
class Population:
    x: torch.Tensor
    y: torch.Tensor
    in_victim: torch.Tensor  # bool [N]: True for the victim's private pool
    source: list[str]        # "train" / "test" per example, for provenance


def population(task) -> Population:
    x = torch.cat([task.train.x, task.test.x])
    y = torch.cat([task.train.y, task.test.y])
    in_victim = torch.cat([torch.ones(len(task.train), dtype=torch.bool), torch.zeros(len(task.test), dtype=torch.bool)])
    return Population(x, y, in_victim, ["train"] * len(task.train) + ["test"] * len(task.test))


def membership_matrix(k: int, n: int, seed: int) -> torch.Tensor:
    """K × N membership with complementary pairs: each example is IN for exactly K/2 models."""
    if k < 2 or k % 2:
        raise ValueError("the number of shadow models must be even and >= 2")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(k // 2):
        half = torch.zeros(n, dtype=torch.bool)
        half[torch.randperm(n, generator=gen)[: n // 2]] = True
        rows += [half, ~half]
    return torch.stack(rows)


def _fresh_models(build: Callable[[], nn.Module], k: int, seed: int) -> list[nn.Module]:
    models = []
    for i in range(k):
        torch.manual_seed(seed * 7919 + i)  # independent, reproducible initialisations
        models.append(build())
    return models


def train_shadows_sequential(build: Callable[[], nn.Module], pop: Population, membership: torch.Tensor,
                             make_defense: Callable[[int, nn.Module], Defense], cfg: TrainConfig,
                             sampling_seed: int, device: torch.device,
                             progress: bool | None = None) -> list[dict[str, torch.Tensor]]:
    """Reference path: the normal training loop, one model after another. ``make_defense(i, model)``
    binds shadow i's defense to its own model (needed by defenses that read the model, e.g. GEP)."""
    states = []
    models = _fresh_models(build, membership.shape[0], sampling_seed)
    for i, model in enumerate(tqdm(models, desc="shadows (sequential)", disable=progress is False, leave=False)):
        idx = torch.nonzero(membership[i]).flatten()
        split = _Split(pop.x[idx], pop.y[idx])
        gen = torch.Generator().manual_seed(sampling_seed * 1000 + i)
        sampler = BatchSampler(len(idx), cfg.batch_size, cfg.sampling, gen)
        defense = make_defense(i, model)
        defense.steps_per_epoch = sampler.steps_per_epoch
        train(model, split, _Split(pop.x[:0], pop.y[:0]), defense, cfg, sampler, device, progress=False)
        states.append({n: t.detach().clone() for n, t in model.state_dict().items()})
    return states


@dataclass
class _Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def train_shadows(build: Callable[[], nn.Module], pop: Population, membership: torch.Tensor,
                  make_defense: Callable[[int], Defense], cfg: TrainConfig, sampling_seed: int,
                  device: torch.device, progress: bool | None = None) -> list[dict[str, torch.Tensor]]:
    """Train the K shadow models together (see the module docstring); returns their state dicts."""
    k = membership.shape[0]
    models = _fresh_models(build, k, sampling_seed)
    base = copy.deepcopy(models[0]).to("meta")
    params, buffers = stack_module_state([m.to(device) for m in models])
    names = list(params)
    buffers = {n: b.detach() for n, b in buffers.items()}

    def loss_one(p, b, x, y):
        return F.cross_entropy(functional_call(base, (p, b), (x.unsqueeze(0),)), y.unsqueeze(0))

    per_model = vmap(vmap(grad(loss_one), in_dims=(None, None, 0, 0)), in_dims=(0, 0, 0, 0))

    pools = [torch.nonzero(membership[i]).flatten() for i in range(k)]
    samplers = [BatchSampler(len(pool), cfg.batch_size, cfg.sampling,
                             torch.Generator().manual_seed(sampling_seed * 1000 + i)) for i, pool in enumerate(pools)]
    defenses = []
    for i in range(k):
        defense = make_defense(i)
        defense.steps_per_epoch = samplers[i].steps_per_epoch
        defenses.append(defense)
    holder = nn.Module()
    for n in names:  # an optimizer needs leaf tensors; it steps all K models at once
        holder.register_parameter(n.replace(".", "__"), nn.Parameter(params[n].detach().clone()))
    leaf = {n: holder.get_parameter(n.replace(".", "__")) for n in names}
    optimizer = make_optimizer(holder, cfg)
    steps_per_epoch = min(s.steps_per_epoch for s in samplers)
    schedule = make_schedule(optimizer, cfg, cfg.epochs * steps_per_epoch)
    x_all, y_all = pop.x.to(device), pop.y.to(device)
    bar = tqdm(total=cfg.epochs * steps_per_epoch, desc=f"shadow models ×{k}", unit="step",
               disable=progress is False, leave=False)
    for epoch in range(cfg.epochs):
        for defense in defenses:
            defense.begin_epoch(epoch, cfg.epochs)
        batches = [s.epoch() for s in samplers]
        for step in range(steps_per_epoch):
            chosen = [pools[i][batches[i][step]] for i in range(k)]
            width = max(len(c) for c in chosen)
            for start in range(0, max(width, 1), cfg.physical_batch_size):
                rows = [c[start:start + cfg.physical_batch_size] for c in chosen]
                size = max(len(r) for r in rows)
                if size == 0:
                    continue
                padded = torch.stack([torch.cat([r, r.new_zeros(size - len(r))]) for r in rows]).to(device)
                current = {n: leaf[n].detach() for n in names}
                # contiguous: slicing vmap's strided output per model is otherwise very slow
                grads = {n: g.contiguous() for n, g in per_model(current, buffers, x_all[padded], y_all[padded]).items()}
                for i, r in enumerate(rows):
                    if len(r):
                        defenses[i].clip_and_accumulate({n: g[i, :len(r)] for n, g in grads.items()})
            releases = [d.release(cfg.batch_size) for d in defenses]
            for n in names:
                leaf[n].grad = torch.stack([rel.grads[n] for rel in releases]).to(leaf[n].dtype)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if schedule is not None:
                schedule.step()
            bar.update(1)
    bar.close()
    buffer_names = list(buffers)
    return [{**{n: leaf[n].detach()[i].clone() for n in names}, **{b: buffers[b][i].clone() for b in buffer_names}}
            for i in range(k)]


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
def model_outputs(model: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, batch: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(φ, probability of the true label) of one set of weights on (x, y)."""
    model.load_state_dict(state)
    model.to(device).eval()
    logits = torch.cat([model(x[i:i + batch].to(device)).cpu() for i in range(0, len(x), batch)])
    prob = torch.softmax(logits.double(), dim=1).gather(1, y.view(-1, 1)).squeeze(1).numpy()
    return phi_from_logits(logits, y), prob


def cached_outputs(model: nn.Module, state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                   indices: torch.Tensor, cache_dir: Path | None, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """``model_outputs`` through a disk cache keyed by a hash of the weights and the data indices."""
    if cache_dir is None:
        return model_outputs(model, state, x, y, device)
    path = cache_dir / f"{cache_key(state, indices, 'phi+prob')}.npz"
    if path.is_file():
        data = np.load(path)
        return data["phi"], data["prob"]
    phi, prob = model_outputs(model, state, x, y, device)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.savez(path, phi=phi, prob=prob)
    return phi, prob
