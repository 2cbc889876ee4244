"""The victim training loop: batch sampling, per-sample gradients, the defense's release, optimizer step.

Every step goes through the defense per micro-batch and ``Defense.release``; the released
``SharedGradient`` becomes ``p.grad`` and the optimizer steps on it, so the model only ever learns from what
the defense shares. Per micro-batch, one of two engines (``train.engine``) feeds the defense:

- ``func``: materialised per-sample gradients (torch.func) into ``clip_and_accumulate`` — every defense;
- ``lean``: the lean engine (``harness/engine/lean.py``) computes the per-sample statistics the
  defense's plan asks for (``Defense.lean_plan``) during backprop, forms the factor-weighted sums and hands
  them to ``Defense.accumulate_lean`` — every built-in defense; the same release to float rounding, with
  less memory and time. ``auto`` picks ``lean`` where the defense and the model allow it.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from dpeval.core.per_sample import PerSampleGradients, fixed_front, front_features, micro_batches
from dpeval.core.settings import TrainConfig
from dpeval.core.splits import Split
from dpeval.defenses.base import Defense, SharedGradient
from dpeval.engine.lean import LeanEngine, engine_choice
from dpeval.engine.lean_kernels import LeanCannotRecompute
from dpeval.engine.release import apply_release

log = logging.getLogger("dpeval")


@dataclass
class BatchSampler:
    """Logical batches of indices into a pool of ``n`` examples.

    ``poisson``: each example joins each batch independently with probability q = B/n (what the
    accountant assumes); batch sizes vary and may be empty. ``shuffle``: a fresh permutation per epoch cut
    into ⌊n/B⌋ batches of exactly B (the partition convention of several papers; the remainder is
    dropped). Both give ⌊n/B⌋ steps per epoch.
    """

    n: int
    batch_size: int
    mode: str
    generator: torch.Generator

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.n

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.batch_size

    def epoch(self) -> list[torch.Tensor]:
        if self.mode == "poisson":
            return [torch.nonzero(torch.rand(self.n, generator=self.generator) < self.sample_rate).flatten()
                    for _ in range(self.steps_per_epoch)]
        order = torch.randperm(self.n, generator=self.generator)
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(self.steps_per_epoch)]


@dataclass
class FixedRateSampler(BatchSampler):
    """Poisson batches of a pool at a fixed rate and step count, whatever the pool's size: the models with and
    without the target sample every record at the same q (the accountant's add / remove neighbours). Rate 1 is
    full-batch training: every record in every step."""

    rate: float = 1.0
    steps: int = 1

    @property
    def sample_rate(self) -> float:
        return self.rate

    @property
    def steps_per_epoch(self) -> int:
        return self.steps

    def epoch(self) -> list[torch.Tensor]:
        if self.rate >= 1.0:
            return [torch.arange(self.n) for _ in range(self.steps)]
        return [torch.nonzero(torch.rand(self.n, generator=self.generator) < self.rate).flatten()
                for _ in range(self.steps)]


@dataclass
class TrainResult:
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: test_accuracy, train_loss, density
    steps: int = 0
    train_s: float = 0.0
    density: float = 1.0           # mean fraction of released coordinates per step
    bytes_sparse: float = 0.0      # mean bytes per released gradient, sparse encoding
    bytes_dense: float = 0.0       # bytes per released gradient, dense float32
    engine: str = "func"           # the per-sample engine used (train.engine resolved)
    engine_reason: str = ""        # why (engine_choice's one line)
    front_s: float = 0.0           # of train_s: the fixed front of the train and test images, computed once
    front_cpu_s: float = 0.0       # its CPU time (this process)
    train_accuracy: float = math.nan  # the final model's on the training split (not part of train_s)


class SilentParameters:
    """Watches for a parameter whose gradient is identically zero for every example of a step although it was not
    on the first step — what a layer that caches a function of its parameters outside autograd looks like (timm's
    LeViT caches its attention biases in eval mode) — and says so once per parameter, in one line. A parameter
    that never gets a gradient (a frozen branch) is not reported; one that only some batches reach (an
    embedding row) can be, which the line says."""

    def __init__(self) -> None:
        self.first: set[str] | None = None  # the parameters the first step's gradient reached
        self.reached: set[str] = set()
        self.reported: set[str] = set()
        self.fed = False  # whether the step being watched held an example

    def see(self, grads: dict[str, torch.Tensor]) -> None:
        """Note the parameters a micro-batch's gradients (per-sample, or the engine's weighted sums) reach."""
        self.fed = True
        for name, grad in grads.items():
            if name not in self.reached and bool(grad.any()):
                self.reached.add(name)

    def end_step(self, step: int) -> None:
        """Close a step (``step``: its number from 1); a step that held no example (Poisson sampling) is skipped."""
        if not self.fed:
            return
        self.fed = False
        if self.first is None:
            self.first = set(self.reached)
        silent = sorted(self.first - self.reached - self.reported)
        if silent:
            self.reported.update(silent)
            log.warning("step %d: no example's gradient reaches %s, although the first step's did (a layer that "
                        "caches a function of its parameters outside autograd, or a parameter only some batches "
                        "use): check the model trains as intended", step, ", ".join(silent))
        self.reached = set()


def clipped_sum_feeder(engine: str, model: nn.Module, defense: Defense, precision: str = "fp32",
                       watch: SilentParameters | None = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``feed(features, y)``: add one micro-batch, given as the model's ``front_features``, to the defense's
    running sum with the chosen engine; returns the micro-batch's summed training loss, as the engine's
    forward pass computed it (no extra pass). ``precision``: ``train.precision`` (``func`` only); ``watch`` sees
    each micro-batch's gradients."""
    if engine == "lean":
        engine = LeanEngine(model, features=True)

        def feed_lean(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            batch = engine(x, y, defense.lean_plan())
            if watch is not None:
                watch.see(batch.sums)
            defense.accumulate_lean(batch)
            return batch.loss_sum

        return feed_lean
    psg = PerSampleGradients(model, features=True, precision=precision)

    def feed_func(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads = psg(x, y)
        if watch is not None:
            watch.see(grads)
        defense.clip_and_accumulate(grads)
        return psg.loss_sum

    return feed_func


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def make_schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """``constant``; ``cosine`` annealing to 0 over all steps; ``step``: ×0.1 at 50% and 75% of training; ``half``:
    ×0.1 at 50% only."""
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total_steps, 1))
    marks = {"step": [0.5, 0.75], "half": [0.5]}.get(cfg.lr_schedule)
    if marks is not None:
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[int(total_steps * m) for m in marks],
                                                    gamma=0.1)
    return None


@torch.no_grad()
def accuracy(model: nn.Module, split: Split, device: torch.device, batch: int = 1024) -> float:
    return fraction_correct(model, split.x, split.y, device, batch)


@contextmanager
def evaluating(module: Any) -> Iterator[None]:
    """Run a block with ``module`` (when it is an ``nn.Module``) in eval mode, then give every submodule its mode
    back (a model may mix modes on purpose)."""
    if not isinstance(module, nn.Module):
        yield
        return
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


@torch.no_grad()
def fraction_correct(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                     device: torch.device, batch: int = 1024) -> float:
    """Top-1 accuracy of ``forward`` on (x, y), in eval mode, NaN for no example."""
    if len(y) == 0:
        return math.nan
    correct = 0
    with evaluating(forward):
        for start in range(0, len(y), batch):
            logits = forward(x[start:start + batch].to(device))
            correct += int((logits.argmax(dim=1) == y[start:start + batch].to(device)).sum())
    return correct / len(y)


class Diverged(RuntimeError):
    """Training produced a non-finite weight: every later step would only carry NaN."""


def check_finite(params: dict[str, nn.Parameter], cfg: TrainConfig, epoch: int, step: int,
                 shared: SharedGradient | None = None, defense: Defense | None = None) -> None:
    """Stop at the first step that leaves a weight NaN or infinite (a learning rate far too large, an
    exploding loss), naming the setting to change instead of training on and recording NaN results; when the
    step's release ``shared`` was itself not finite, the message says so and names the defense (a plug-in whose
    release is NaN looks like this, and so does a release computed from exploded weights)."""
    bad = next((name for name, p in params.items() if not bool(torch.isfinite(p).all())), None)
    if bad is not None:
        released = shared.nonfinite() if shared is not None else None
        if released is not None and defense is not None:
            raise Diverged(f"training diverged: the defense {type(defense).name or type(defense).__name__!r} released "
                           f"NaN or infinite values ({released}) at step {step} (epoch {epoch + 1}); a bug of the "
                           f"defense, or weights that exploded: lower train.lr (now {cfg.lr:g})")
        raise Diverged(f"training diverged: weight {bad} is NaN or infinite after step {step} (epoch {epoch + 1}); "
                       f"lower train.lr (now {cfg.lr:g})")


def global_rng_state() -> dict[str, Any]:
    """Python's, NumPy's and torch's global generators (seeded from the ``global`` stream), as plain data."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]}


def set_global_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def defense_state(defense: Defense) -> dict[str, Any]:
    """A defense's state between epochs: its ``state_dict`` (masks, statistics, anchors, counters) and the
    position of every generator it holds (noise, mask, anchors)."""
    generators = {name: g.get_state() for name, g in vars(defense).items() if isinstance(g, torch.Generator)}
    return {"state": copy.deepcopy(defense.state_dict()), "generators": generators}


def load_defense_state(defense: Defense, state: dict[str, Any]) -> None:
    defense.load_state_dict(state["state"])
    for name, generator_state in state["generators"].items():
        getattr(defense, name).set_state(generator_state)
    for name, value in state.get("attributes", {}).items():
        setattr(defense, name, value)


def _plain(value: Any) -> bool:
    """Tensors, numbers, strings, None, and lists / tuples / dicts of them: what a checkpoint can hold."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def defense_state_within_epoch(defense: Defense) -> dict[str, Any]:
    """A defense's state between two steps of an epoch: ``defense_state`` plus every plain-data attribute
    of the instance (``_plain``: counters within the epoch, whether the mask is new, the current rate, running
    statistics), which ``state_dict`` need not hold because ``begin_epoch`` sets them at the epoch's start."""
    state = defense_state(defense)
    state["attributes"] = {name: copy.deepcopy(value) for name, value in vars(defense).items()
                           if _plain(value)}
    return state


@dataclass
class Loop:
    """What the loop needs to go on after ``epochs_done`` epochs exactly as it would have without a stop:
    ``state()`` is plain data (tensors, numbers, lists) for a checkpoint, ``restore`` puts it back. Its
    format, and the check of a stored one, is the checkpoint's (``dpeval.checkpoint.LOOP_STATE``).

    ``within``: set by the loop while it asks for a checkpoint inside an epoch (``train.checkpoint_every``):
    the epoch's batches, the steps of it done and its running loss; ``state`` then also holds the defense's
    within-epoch attributes (``defense_state_within_epoch``)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any
    sampler: BatchSampler
    defense: Defense
    result: TrainResult
    densities: list[float]
    sparse_bytes: list[int]
    within: dict[str, Any] | None = None
    started: float = field(default_factory=time.perf_counter)  # when this process's part of the training began

    def state(self, epochs_done: int) -> dict[str, Any]:
        state = {
            "epochs_done": epochs_done,
            "model": copy.deepcopy(self.model.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "sampler": self.sampler.generator.get_state(),
            "defense": defense_state(self.defense),
            "globals": global_rng_state(),
            "history": copy.deepcopy(self.result.history),
            "steps": self.result.steps,
            "bytes_dense": self.result.bytes_dense,
            "densities": list(self.densities),
            "sparse_bytes": list(self.sparse_bytes),
            # the training time so far, earlier processes' parts included: a resumed run reports its whole time
            "train_s": self.result.train_s + time.perf_counter() - self.started,
        }
        if self.within is not None:
            state["defense"] = defense_state_within_epoch(self.defense)
            state["within"] = copy.deepcopy(self.within)
        return state

    def restore(self, state: dict[str, Any]) -> int:
        """Put ``state`` back; returns the epoch to go on with (the one a within-epoch state stopped in:
        ``within`` then holds where in it)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.sampler.generator.set_state(state["sampler"])
        load_defense_state(self.defense, state["defense"])
        set_global_rng_state(state["globals"])
        self.result.history = list(state["history"])
        self.result.steps = int(state["steps"])
        self.result.bytes_dense = state["bytes_dense"]
        self.densities[:] = state["densities"]
        self.sparse_bytes[:] = state["sparse_bytes"]
        self.result.train_s = float(state["train_s"])
        self.within = state.get("within")
        return int(state["epochs_done"])


class TrainingObserver:
    """What watches training at fixed moments (each method a no-op here: override the moments you need).

    ``epoch_start(epoch, model, defense)`` runs after the defense's ``begin_epoch`` (e.g. to snapshot the weights
    and public defense state an attack targets). ``before_release(step, epoch, defense)`` runs after a step's batch
    entered the defense's running sum and before its release (the run-level audit adds its canaries' per-sample
    gradients there), ``after_release(step, shared)`` sees every release. ``epoch_end(loop, epochs_done)`` runs
    after each epoch (a checkpoint: ``loop.state(epochs_done)``) and, for an observer that ``checkpoints`` with
    ``cfg.checkpoint_every`` = N > 0, also after every N-th step within an epoch (not its last), with
    ``loop.within`` set and ``epochs_done`` the epochs finished before it."""

    checkpoints = False

    def epoch_start(self, epoch: int, model: nn.Module, defense: Defense) -> None:
        pass

    def before_release(self, step: int, epoch: int, defense: Defense) -> None:
        pass

    def after_release(self, step: int, shared: SharedGradient) -> None:
        pass

    def epoch_end(self, loop: Loop, epochs_done: int) -> None:
        pass


class Observers(TrainingObserver):
    """Several observers as one: each moment goes to each of them, in the order given."""

    def __init__(self, *observers: TrainingObserver) -> None:
        self.observers = observers
        self.checkpoints = any(o.checkpoints for o in observers)

    def epoch_start(self, epoch: int, model: nn.Module, defense: Defense) -> None:
        for o in self.observers:
            o.epoch_start(epoch, model, defense)

    def before_release(self, step: int, epoch: int, defense: Defense) -> None:
        for o in self.observers:
            o.before_release(step, epoch, defense)

    def after_release(self, step: int, shared: SharedGradient) -> None:
        for o in self.observers:
            o.after_release(step, shared)

    def epoch_end(self, loop: Loop, epochs_done: int) -> None:
        for o in self.observers:
            o.epoch_end(loop, epochs_done)


def epoch_batches(within: dict[str, Any]) -> list[torch.Tensor]:
    """The epoch's batches as a within-epoch state stores them (all indices, cut by the batch sizes)."""
    return list(torch.split(within["order"], within["sizes"]))


def train(model: nn.Module, train_split: Split, test_split: Split, defense: Defense, cfg: TrainConfig,
          sampler: BatchSampler, device: torch.device, progress: bool = True,
          observer: TrainingObserver | None = None, resume: dict[str, Any] | None = None) -> TrainResult:
    """Train ``model`` in place on ``train_split`` with every gradient released by ``defense``.

    ``observer`` sees training at its moments (``TrainingObserver``). ``resume``, a state its ``epoch_end`` was
    handed, continues training from its epoch (and step) exactly as the uninterrupted loop would have."""
    # Train mode: dropout and drop-path act, each example with its own mask (the engines compute every example on its
    # own, and BatchNorm, which would mix them, is refused before training); evaluation switches to eval mode.
    model.to(device).train(cfg.module_mode == "train")
    engine, why = engine_choice(cfg.engine, model, defense, device, cfg.physical_batch_size, cfg.precision)
    result = TrainResult(engine=engine, engine_reason=why)
    log.info("per-sample engine: %s (train.engine=%s, train.precision=%s: %s)", engine, cfg.engine,
             cfg.precision, why)
    optimizer = make_optimizer(model, cfg)
    total_steps = cfg.epochs * sampler.steps_per_epoch
    schedule = make_schedule(optimizer, cfg, total_steps)
    params = dict(model.named_parameters())
    watch = SilentParameters()
    feed = clipped_sum_feeder(result.engine, model, defense, cfg.precision, watch)
    start, start_cpu = time.perf_counter(), time.process_time()
    # The fixed front (normalisation, H-CNN's scattering) is computed once per data set, not once per epoch.
    cut = fixed_front(model)
    x_all, y_all = front_features(cut.front, train_split.x.to(device)), train_split.y.to(device)
    test_x = front_features(cut.front, test_split.x.to(device))
    result.front_s, result.front_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    densities: list[float] = []
    sparse_bytes: list[int] = []
    loop = Loop(model, optimizer, schedule, sampler, defense, result, densities, sparse_bytes, started=start)
    first = loop.restore(resume) if resume is not None else 0
    bar = tqdm(total=total_steps, initial=result.steps, desc="train", unit="step", disable=not progress,
               leave=False)
    observer = observer if observer is not None else TrainingObserver()
    every = cfg.checkpoint_every if observer.checkpoints else 0
    for epoch in range(first, cfg.epochs):
        if loop.within is None:
            defense.begin_epoch(epoch, cfg.epochs)
            observer.epoch_start(epoch, model, defense)
            loss_sum = torch.zeros((), device=device, dtype=torch.float64)  # summed on the device: no sync per step
            seen, done = 0, 0
            batches = sampler.epoch()
        else:  # resumed within this epoch: its batches, steps done and running loss come from the checkpoint
            batches, done = epoch_batches(loop.within), int(loop.within["step"])
            loss_sum, seen = loop.within["loss_sum"].to(device), int(loop.within["seen"])
            loop.within = None
        first_step = len(densities) - done
        for index in range(done, len(batches)):
            batch = batches[index].to(device)
            for xb, yb in micro_batches(x_all[batch], y_all[batch], cfg.physical_batch_size):
                try:
                    loss_sum += feed(xb, yb)
                except LeanCannotRecompute as exc:
                    if cfg.engine != "auto" or result.steps or seen:  # only before anything entered the sum
                        raise
                    result.engine, result.engine_reason = "func", f"auto: lean refused when it ran ({exc})"
                    log.info("per-sample engine: func (%s)", result.engine_reason)
                    feed = clipped_sum_feeder("func", model, defense, cfg.precision, watch)
                    loss_sum += feed(xb, yb)
                seen += len(yb)
            watch.end_step(result.steps + 1)
            observer.before_release(result.steps, epoch, defense)
            shared = defense.release(sampler.batch_size)
            observer.after_release(result.steps, shared)
            apply_release(params, shared)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if schedule is not None:
                schedule.step()
            check_finite(params, cfg, epoch, result.steps + 1, shared, defense)
            densities.append(shared.density)
            sparse_bytes.append(shared.bytes_sparse())
            result.bytes_dense = shared.bytes_dense()
            result.steps += 1
            bar.update(1)
            if every and (index + 1) % every == 0 and index + 1 < len(batches):
                loop.within = {"order": torch.cat(batches).cpu(), "sizes": [len(b) for b in batches],
                               "step": index + 1, "loss_sum": loss_sum.detach().cpu(), "seen": seen}
                observer.epoch_end(loop, epoch)
                loop.within = None
        test_acc = fraction_correct(cut.head, test_x, test_split.y, device)
        epoch_densities = densities[first_step:]
        result.history.append({"epoch": epoch, "test_accuracy": test_acc,
                               "train_loss": float(loss_sum) / seen if seen else math.nan,
                               "density": sum(epoch_densities) / len(epoch_densities) if epoch_densities else 1.0})
        bar.set_postfix(epoch=epoch + 1, test_acc=f"{test_acc:.3f}")
        log.info("epoch %d/%d test accuracy %.4f", epoch + 1, cfg.epochs, test_acc)
        observer.epoch_end(loop, epoch + 1)
    bar.close()
    model.eval()  # the trained model leaves in eval mode: whatever comes next evaluates or attacks it
    result.train_s += time.perf_counter() - start  # after a resume: the earlier processes' part, restored, and this
    # from the front features already computed, in the chunks ``accuracy`` would take: the same number, without a
    # second pass of the fixed front (H-CNN's scattering) over the training split
    result.train_accuracy = fraction_correct(cut.head, x_all, train_split.y, device)
    if densities:
        result.density = sum(densities) / len(densities)
        result.bytes_sparse = sum(sparse_bytes) / len(sparse_bytes)
    return result
