"""Training K models like the victim at once (shadow / reference models of membership attacks).

Each model i trains on its own pool of example indices into (x, y), with its own defense instance and its
own random streams (``scopes[i]``: initialisation and batch sampling; its defense draws noise and masks
from the streams it was built with), by the same recipe as the victim: architecture, defense, σ, batch
size, epochs, optimizer, schedule and sampling.

- **Vectorised** (``train_shadows``): the K models' parameters are stacked
  (``torch.func.stack_module_state``) and per-sample gradients of all models come from one
  vmap-over-models of vmap-over-samples. Each model's batch is padded to the largest batch of the step;
  then each model's real rows go through that model's own defense instance (``clip_and_accumulate`` /
  ``release``), the releases are stacked, and one optimizer steps all K models (SGD and Adam act per
  element, so stacking does not couple them). The models' common fixed front (``Normalize``, a fixed
  scattering transform: ``dpeval.core.per_sample.fixed_front``) is applied once to the whole population
  (``front_features``), outside the vmaps; only the heads are stacked. Every model comes from the same
  ``build``, so their fronts are equal.
  Defenses that keep their model (``capabilities.needs_model``, GEP) get model i's own module, refreshed with
  its current weights before each step. A defense that needs no per-sample statistic (its ``lean_plan`` says
  ``per_sample=False``: ``none``, RS without clipping) gets each model's plain gradient sum over its real rows
  (``accumulate_lean``), one vmap over models of one backward pass, instead of per-sample gradients it would
  only add up: the same sum, up to float rounding, at a fraction of the cost.
  The models train in the victim's module mode (``train.module_mode``). A model that draws random numbers in
  train mode (dropout, drop-path: ``draws_random``) is trained by the sequential path instead, since nested vmaps
  cannot draw every layer's masks per model and example (attention dropout fails there).
- **Progress** (``store``, a ``ShadowProgress`` such as ``dpeval.checkpoint.ShadowStore``): the shadows
  are trained in groups of ``group`` (all at once by default); each finished shadow is saved as its group
  ends, and a later call with the same store loads the saved ones and trains only the rest. Each shadow
  draws only from its own scope (``scopes[i]``: init, sampler, its defense's noise and masks), so which
  others train beside it changes none of its draws; on CPU its weights come out bit-identical too (tested).
- **Sequential** (``train_shadows_sequential``): the normal training loop, one model after another, with the
  recipe's per-sample engine — the reference path, and on the CPU often the faster one: the lean engine's
  book-keeping never forms a per-sample gradient of a Linear layer (full-batch DP-SGD of a logistic regression on
  1,000 MNIST records: 4 ms a step against 42 ms for one model's torch.func gradients, one thread).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from tqdm import tqdm

from dpeval.core.per_sample import compute_precision, fixed_front, front_features
from dpeval.core.settings import TrainConfig
from dpeval.core.streams import Streams
from dpeval.defenses.base import Defense
from dpeval.defenses.lean_plan import LeanBatch
from dpeval.engine.training import BatchSampler, make_optimizer, make_schedule, train

# make_defense(i, model, steps_per_epoch): shadow i's defense, bound to its model, for epochs of its own pool
MakeDefense = Callable[[int, nn.Module, int], Defense]
# make_sampler(i, pool_size, generator): shadow i's batch sampler over its pool (default: the recipe's BatchSampler)
MakeSampler = Callable[[int, int, torch.Generator], BatchSampler]


class ShadowProgress(Protocol):
    """Where finished shadows are kept (``dpeval.checkpoint.ShadowStore`` keeps them in the run's folder)."""

    def finished(self, k: int) -> dict[int, dict[str, torch.Tensor]]:
        """Shadow index → state dict of those of the K shadows already kept."""

    def save(self, i: int, state: dict[str, torch.Tensor]) -> None:
        """Keep shadow i's state dict."""


def fresh_models(build: Callable[[], nn.Module], scopes: list[Streams]) -> list[nn.Module]:
    """One model per scope, each initialised from its own ``init`` stream."""
    models = []
    for streams in scopes:
        with streams.torch_global("init"):
            models.append(build())
    return models


def draws_random(build: Callable[[], nn.Module], x: torch.Tensor) -> bool:
    """Whether a training-mode forward pass of a model ``build`` makes draws from torch's generators (dropout,
    drop-path); neither the caller's generators nor its models are touched."""
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        model = build().to(x.device).train()
        before = [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]
        model(x)
        after = [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]
    return any(not torch.equal(a, b) for a, b in zip(before, after))


def train_shadows_sequential(build: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor,
                             pools: list[torch.Tensor], make_defense: MakeDefense,
                             cfg: TrainConfig, scopes: list[Streams], device: torch.device,
                             progress: bool | None = None, store: ShadowProgress | None = None,
                             make_sampler: MakeSampler | None = None) -> list[dict[str, torch.Tensor]]:
    """Reference path: the normal training loop (``train``, with the recipe's ``train.engine``), one model after
    another. ``make_defense(i, model, steps_per_epoch)`` binds model i's defense to its own model (needed by
    defenses that keep it, e.g. GEP) and schedules it for the epochs of model i's pool. ``store`` and
    ``make_sampler`` as for ``train_shadows`` (each model is saved as soon as it is trained)."""
    states = store.finished(len(pools)) if store is not None else {}
    models = fresh_models(build, scopes)
    todo = [i for i in range(len(pools)) if i not in states]
    for i in tqdm(todo, desc="shadows (sequential)", disable=progress is False, leave=False):
        model, idx = models[i], pools[i]
        generator = scopes[i].generator("sampler")
        sampler = (BatchSampler(len(idx), cfg.batch_size, cfg.sampling, generator) if make_sampler is None
                   else make_sampler(i, len(idx), generator))
        defense = make_defense(i, model, sampler.steps_per_epoch)
        train(model, _Split(x[idx], y[idx]), _Split(x[:0], y[:0]), defense, cfg, sampler, device, progress=False)
        states[i] = {n: t.detach().clone() for n, t in model.state_dict().items()}
        if store is not None:
            store.save(i, states[i])
    return [states[i] for i in range(len(pools))]


@dataclass
class _Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def train_shadows(build: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, pools: list[torch.Tensor],
                  make_defense: MakeDefense, cfg: TrainConfig, scopes: list[Streams],
                  device: torch.device, progress: bool | None = None, features: torch.Tensor | None = None,
                  store: ShadowProgress | None = None, group: int = 0,
                  make_sampler: MakeSampler | None = None) -> list[dict[str, torch.Tensor]]:
    """Train the K shadow models together (see the module docstring); returns their state dicts.
    ``make_defense(i, model, steps_per_epoch)`` builds model i's defense bound to its own module, scheduled
    for the epochs of its pool; for defenses that keep the model (``capabilities.needs_model``, e.g. GEP's
    anchors) each module is given model i's current weights before every step. ``features``:
    ``front_features`` of ``x`` when the caller has them already. ``store``: load the shadows it holds
    instead of training them, save each one trained; ``group`` > 0: train (and save) that many at a time,
    in index order (0: all that are left at once). ``make_sampler(i, pool_size, generator)``: shadow i's batch
    sampler, drawing from ``generator`` (its scope's ``sampler`` stream), instead of the recipe's
    ``BatchSampler(pool_size, cfg.batch_size, cfg.sampling, generator)`` (the final-model audit samples pools of
    two sizes at one rate)."""
    if cfg.module_mode == "train" and draws_random(build, x[:2].to(device)):
        # vmap over models of vmap over examples cannot draw some layers' masks per model and example (attention
        # dropout, in-place draws); the training loop draws them per example on either engine
        return train_shadows_sequential(build, x, y, pools, make_defense, cfg, scopes, device, progress, store,
                                        make_sampler)
    states = store.finished(len(pools)) if store is not None else {}
    todo = [i for i in range(len(pools)) if i not in states]
    size = group if group > 0 else max(len(todo), 1)
    for start in range(0, len(todo), size):
        chosen = todo[start:start + size]
        trained = _train_together(build, x, y, [pools[i] for i in chosen],
                                  lambda j, model, steps, chosen=chosen: make_defense(chosen[j], model, steps), cfg,
                                  [scopes[i] for i in chosen], device, progress, features,
                                  None if make_sampler is None else
                                  lambda j, n, g, chosen=chosen: make_sampler(chosen[j], n, g))
        for i, state in zip(chosen, trained):
            states[i] = state
            if store is not None:
                store.save(i, state)
    return [states[i] for i in range(len(pools))]


def _train_together(build: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, pools: list[torch.Tensor],
                    make_defense: MakeDefense, cfg: TrainConfig, scopes: list[Streams],
                    device: torch.device, progress: bool | None,
                    features: torch.Tensor | None,
                    make_sampler: MakeSampler | None = None) -> list[dict[str, torch.Tensor]]:
    """The vectorised path for the given models (all of ``pools``), from their initialisation."""
    k = len(pools)
    models = [m.to(device) for m in fresh_models(build, scopes)]
    splits = [fixed_front(m) for m in models]
    front, rename = splits[0].front, splits[0].names  # head name -> model name
    base = copy.deepcopy(splits[0].head).to("meta")
    params, buffers = stack_module_state([s.head for s in splits])
    names = list(params)
    buffers = {n: b.detach() for n, b in buffers.items()}

    def loss_one(p, b, xi, yi):
        return F.cross_entropy(functional_call(base, (p, b), (xi.unsqueeze(0),)), yi.unsqueeze(0))

    def loss_sum(p, b, xs, ys, real):  # the summed loss of a model's real rows (padding weighs 0)
        return (F.cross_entropy(functional_call(base, (p, b), (xs,)), ys, reduction="none") * real).sum()

    # the victim's module mode; in train mode every (model, example) draws its own dropout mask
    base.train(cfg.module_mode == "train")
    per_model = vmap(vmap(grad(loss_one), in_dims=(None, None, 0, 0), randomness="different"),
                     in_dims=(0, 0, 0, 0), randomness="different")
    sum_per_model = vmap(grad(loss_sum), in_dims=(0, 0, 0, 0, 0), randomness="different")

    samplers = [BatchSampler(len(pool), cfg.batch_size, cfg.sampling, scopes[i].generator("sampler"))
                if make_sampler is None else make_sampler(i, len(pool), scopes[i].generator("sampler"))
                for i, pool in enumerate(pools)]
    defenses = [make_defense(i, models[i], samplers[i].steps_per_epoch) for i in range(k)]
    # defenses of one recipe: all need per-sample statistics or none does (``none``, RS without clipping)
    # (asked before any step; a defense that keeps its model, GEP, always needs them and is not asked)
    plain = all(d.capabilities.lean_capable and not d.capabilities.needs_model and not d.lean_plan().per_sample
                for d in defenses)
    bound = [(i, models[i]) for i, d in enumerate(defenses) if d.capabilities.needs_model]
    holder = nn.Module()
    for n in names:  # an optimizer needs leaf tensors; it steps all K models at once
        holder.register_parameter(n.replace(".", "__"), nn.Parameter(params[n].detach().clone()))
    leaf = {n: holder.get_parameter(n.replace(".", "__")) for n in names}
    optimizer = make_optimizer(holder, cfg)
    steps_per_epoch = min(s.steps_per_epoch for s in samplers)
    schedule = make_schedule(optimizer, cfg, cfg.epochs * steps_per_epoch)
    # the fixed front once per data set, not every step
    x_all = (front_features(front, x) if features is None else features).to(device)
    y_all = y.to(device)
    bar = tqdm(total=cfg.epochs * steps_per_epoch, desc=f"shadow models ×{k}", unit="step",
               disable=progress is False, leave=False)
    for epoch in range(cfg.epochs):
        for defense in defenses:
            defense.begin_epoch(epoch, cfg.epochs)
        batches = [s.epoch() for s in samplers]
        for step in range(steps_per_epoch):
            _sync(bound, leaf, rename)
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
                features = x_all[padded]
                if plain:
                    real = torch.stack([torch.arange(size) < len(r) for r in rows]).to(device, torch.float32)
                    with compute_precision(cfg.precision, device):
                        sums = sum_per_model(current, buffers, features, y_all[padded], real)
                    for i, r in enumerate(rows):
                        if len(r):
                            ones = torch.ones(len(r), device=device)
                            defenses[i].accumulate_lean(LeanBatch({rename[n]: g[i] for n, g in sums.items()},
                                                                  [ones], None, len(r)))
                    continue
                with compute_precision(cfg.precision, device):  # as the victim's per-sample passes
                    grads = per_model(current, buffers, features, y_all[padded])
                grads = {n: g.contiguous() for n, g in grads.items()}
                for i, r in enumerate(rows):
                    if len(r):
                        defenses[i].clip_and_accumulate({rename[n]: g[i, :len(r)] for n, g in grads.items()})
            releases = [d.release(cfg.batch_size) for d in defenses]
            for n in names:
                leaf[n].grad = torch.stack([rel.grads[rename[n]] for rel in releases]).to(leaf[n].dtype)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if schedule is not None:
                schedule.step()
            bar.update(1)
    bar.close()
    stacked = {rename[n]: leaf[n].detach() for n in names} | {rename[b]: v for b, v in buffers.items()}
    keys = models[0].state_dict()  # the front's persistent buffers (e.g. Normalize's) come from model 0
    return [{n: (stacked[n][i] if n in stacked else v).clone() for n, v in keys.items()} for i in range(k)]


@torch.no_grad()
def _sync(bound: list[tuple[int, nn.Module]], leaf: dict[str, torch.Tensor], rename: dict[str, str]) -> None:
    """Copy model i's slice of the stacked (head) parameters into its module (its defense reads the module)."""
    for i, model in bound:
        params = dict(model.named_parameters())
        for head_name, stacked in leaf.items():
            params[rename[head_name]].copy_(stacked[i])
