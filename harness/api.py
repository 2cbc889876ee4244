"""dpeval from Python: build an experiment from settings, train, attack and read a typed result — no store, CLI
or YAML involved (docs/api.md). Everything here is also reachable as ``dpeval.<name>``.

* ``configure(settings, **dotted)``: a validated ``RunSpec`` (the same settings as a YAML file or ``--set``).
* ``run(spec)``: train the victim with its defense, play its attacks, return a ``RunResult``; with ``results=``
  also recorded in a results folder, exactly as ``dpeval run`` records it.
* ``load_data(settings)``: the data a run would use (private pool, test, public splits), for your own training.
* ``build_model(settings)``: the model a run would build (untrained), to train elsewhere and attack with
  ``dpeval run --weights``.
* ``score_membership(model, members, nonmembers, recipe)``: a model trained elsewhere (your loop, Opacus, a
  fine-tuned checkpoint) scored by the membership attacks with the same games and verdicts as a dpeval run;
  shadow models train with dpeval's trainer under the recipe it was trained with, or with your own function.
* ``attack_release(release, recipe, ...)``: a defense written as a function (batch → released gradient) attacked
  by the gradient attacks (``ig``, ``rgap``, ``grad-mia``) under the same games and verdicts.
* ``load_result(results, run_id)``: a stored run as a ``RunResult``.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpeval.config import build_spec, set_dotted
from dpeval.core.errors import ConfigError
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Split, Task
from dpeval.results import RunResult

Settings = Mapping[str, Any] | RunSpec
TrainShadow = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], nn.Module | None]


def configure(settings: Settings | None = None, /, **dotted: Any) -> RunSpec:
    """A validated run specification: ``settings`` nested as in a YAML file (``{"defense": {"name": "dpsgd",
    "clip": 1.0}, "train": {"epochs": 5}}``; a defense may be given by name alone), then ``dotted`` settings with
    ``__`` for the dots (``train__epochs=5``, ``attacks=["lira"]``), which win. Bad input raises ``ConfigError``
    naming the field, as the CLI's exit 2 does."""
    if isinstance(settings, RunSpec):
        raw: dict[str, Any] = settings.canonical()
    else:
        raw = copy.deepcopy(dict(settings or {}))
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    for key, value in dotted.items():
        set_dotted(raw, key.replace("__", "."), value)
    return build_spec(raw)


def load_data(settings: Settings | None = None, /, **dotted: Any) -> Task:
    """The data a run with these settings uses: ``task.train`` (the private pool), ``task.test``, ``task.public``
    (images in [0, 1], N × C × H × W), ``task.num_classes``. Train your own model on ``task.train`` and score it
    with ``score_membership(model, task.train, task.test, recipe)``."""
    from dpeval.core.datasets import load_task

    return load_task(configure(settings, **dotted).data)


def build_model(settings: Settings | None = None, /, **dotted: Any) -> nn.Module:
    """The model a run with these settings trains, untrained: the same architecture, input normalisation
    (``Sequential(Normalize(mean, std), net)``: buffers ``0.mean``, ``0.std``, then the network's ``1.*``) and
    initial weights. Train it your way, ``torch.save(model.state_dict(), path)``, and ``dpeval run --weights path``
    with the same settings attacks it."""
    from dpeval.runner import prepare

    spec = configure(settings, **dotted)
    if spec.model.weights is not None:
        raise ConfigError("model.weights: build_model builds the untrained model; leave model.weights unset")
    return prepare(spec).model


def run(spec: Settings, *, results: str | Path | None = None, out: str | Path | None = None,
        progress: bool = False) -> RunResult:
    """Train and attack one run; its typed result. ``results``: also record it in that results folder (resuming an
    interrupted run of the same configuration there, as ``dpeval run`` does). Otherwise nothing is recorded and
    the run's files (``model.pt``, ``log.txt``, attack artefacts) go to ``out`` (a new temporary folder when not
    given: ``RunResult.folder``). An attack that fails after training is reported in its ``AttackOutcome.error``
    (status ``failed``); any other failure raises."""
    from dpeval.core.runtime import apply_thread_default
    from dpeval.runner import AttacksFailed, perform, prepare

    spec = spec if isinstance(spec, RunSpec) else configure(spec)
    if results is not None:
        from dpeval.runner import execute
        from dpeval.store import ResultStore

        store = ResultStore(results)
        store.check(create=True)
        metrics = execute(spec, store, progress=progress)
        return dataclasses.replace(RunResult.from_flat(metrics), folder=store.run_dir(metrics["run_id"]))
    prep = prepare(spec)
    if prep.device.type == "cpu":
        apply_thread_default()
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="dpeval-run-"))
    try:
        metrics = perform(prep, "", folder, progress=progress)
    except AttacksFailed as exc:
        metrics = exc.metrics
    return dataclasses.replace(RunResult.from_flat(metrics), folder=folder)


def load_result(results: str | Path, run_id: str) -> RunResult:
    """A stored run (any unique part of its id) as a ``RunResult``."""
    from dpeval.store import ResultStore

    row = ResultStore(results).get(run_id)
    return dataclasses.replace(RunResult.from_flat({**(row["metrics"] or {}), "run_id": row["run_id"],
                                                    "status": row["status"]}),
                               folder=ResultStore(results).run_dir(row["run_id"]))


# ---------------------------------------------------------------------------------------------------
# the researcher's own victim


def as_split(data: Split | tuple[torch.Tensor, torch.Tensor]) -> Split:
    if isinstance(data, Split):
        return data
    x, y = data
    x, y = torch.as_tensor(x), torch.as_tensor(y).long()
    return Split(x.float(), y, torch.arange(len(y)))


HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
         "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def without_hooks(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every module's hooks removed: a model trained with Opacus keeps the hooks its
    ``GradSampleModule`` put on it, and dpeval's per-sample engines need the plain module."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        for hooks in HOOKS:
            getattr(module, hooks, {}).clear()
    return plain


def fresh_copy(model: nn.Module) -> Callable[[], nn.Module]:
    """A builder of freshly initialised copies of ``model``'s architecture: a deep copy whose every submodule with
    ``reset_parameters`` is re-initialised (under torch's global generator, which the caller seeds)."""
    def build() -> nn.Module:
        fresh = copy.deepcopy(model).cpu()
        for module in fresh.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        return fresh
    return build


def outside_task(members: Split, nonmembers: Split, num_classes: int | None) -> Task:
    """A task whose private pool is the model's members and whose held-out split its non-members (no public
    split; the model's own normalisation stays inside it)."""
    if members.x.shape[1:] != nonmembers.x.shape[1:]:
        raise ValueError(f"members and non-members differ in shape: {tuple(members.x.shape[1:])} vs "
                         f"{tuple(nonmembers.x.shape[1:])}")
    shape = tuple(int(s) for s in members.x.shape[1:])
    classes = num_classes or int(max(members.y.max(), nonmembers.y.max())) + 1
    empty = Split(members.x[:0], members.y[:0], members.source_index[:0])
    channels = shape[0] if len(shape) == 3 else 1
    return Task("outside", members, nonmembers, empty, classes, shape,  # type: ignore[arg-type]
                (0.0,) * channels, (1.0,) * channels)


def score_membership(model: nn.Module, members: Split | tuple[torch.Tensor, torch.Tensor],
                     nonmembers: Split | tuple[torch.Tensor, torch.Tensor], recipe: Settings,
                     attacks: tuple[str, ...] | list[str] = ("loss", "lira", "rmia"), *,
                     train_shadow: TrainShadow | None = None, architecture: Callable[[], nn.Module] | None = None,
                     num_classes: int | None = None, out: str | Path | None = None,
                     progress: bool = False) -> RunResult:
    """Membership inference against a model trained elsewhere, with dpeval's games, metrics and verdicts.

    ``model``: the trained network (any ``nn.Module`` that dpeval's per-sample engines support: no BatchNorm),
    called on the inputs exactly as given. ``members`` / ``nonmembers``: the examples it was / was not trained on
    (``Split``s, or ``(x, y)`` tensors). ``recipe``: how it was trained, as settings (``configure``): the
    defense and its clip, ``privacy.noise_multiplier`` (or a target ε) and δ, the accountant, and the training
    recipe (``train.epochs``, ``batch_size``, ``optimizer``, ``lr``, ``sampling``…) — the privacy ledger and ε
    come from it, and the shadow models (LiRA, RMIA) train under it with dpeval's trainer, each on a pool as
    large as ``members``; or with ``train_shadow(model, x, y, seed)``, your own training function (it trains the
    fresh model it is given in place, or returns the trained one), so shadows can match a victim dpeval did not
    train. ``architecture()``: builds a fresh, untrained model of the victim's architecture for each shadow
    (default: a copy of ``model`` with its parameters reset; give it when ``model`` carries a training library's
    state, e.g. a model Opacus has wrapped). Attack settings go in ``recipe``'s ``attack`` section
    (``{"attack": {"shadows": 16}}``).
    """
    from dpeval.core.runtime import resolve_device
    from dpeval.core.streams import Streams
    from dpeval.defenses import DEFENSES
    from dpeval.engine.training import BatchSampler
    from dpeval.runner import Prepared, attacker_view, check_attacks, plan_privacy, play_attacks

    spec = configure(recipe, attacks=list(attacks))
    model = without_hooks(model)
    member_split, nonmember_split = as_split(members), as_split(nonmembers)
    task = outside_task(member_split, nonmember_split, num_classes)
    device = resolve_device(spec.device)
    defense_cls = DEFENSES.get(spec.defense_name, field="defense")
    privacy = plan_privacy(spec, defense_cls, len(member_split))
    check_attacks(spec, model, task)
    streams = Streams(spec.seed)
    build = architecture if architecture is not None else fresh_copy(model)
    shapes = {name: p.shape for name, p in model.named_parameters() if p.requires_grad}
    sampler = BatchSampler(len(member_split), spec.train.batch_size, spec.train.sampling,
                           streams.scope("victim").generator("sampler"))

    def make_defense(defense_streams: Streams, bound_to: nn.Module | None = None,
                     steps_per_epoch: int = sampler.steps_per_epoch) -> Any:
        defense = defense_cls(spec.defense, shapes, privacy.noise_multiplier, defense_streams, device,
                              steps_per_epoch=steps_per_epoch)
        defense.bind(bound_to if bound_to is not None else model, task)
        return defense

    prep = Prepared(spec, task, type(model).__name__, model, sampler, privacy, make_defense, build, streams, device)
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="dpeval-membership-"))
    states = {"final": {n: t.detach().clone() for n, t in model.state_dict().items()}}

    def view_of(out_dir: Path) -> Any:
        view = attacker_view(prep, states, {}, out_dir)
        return dataclasses.replace(view, train_shadow=train_shadow)

    outcomes, seconds = play_attacks(prep, states, {}, folder, view_of=view_of, progress=progress)
    row: dict[str, Any] = {"run_id": "", "status": "failed" if any(o.error for o in outcomes.values()) else "done",
                           "dataset": "outside", "model": prep.model_name, "defense": spec.defense_name,
                           "seed": spec.seed, **privacy.metrics(), "time.attack_s": sum(seconds.values())}
    result = RunResult.from_flat(row)
    return dataclasses.replace(result, attacks=outcomes, folder=folder)


# ---------------------------------------------------------------------------------------------------
# a defense as a function

ReleaseFunction = Callable[[dict[str, torch.Tensor], torch.Generator], Any]


def function_defense(release: ReleaseFunction, noise_std: float = 0.0) -> type:
    """A defense class around a release function (``attack_release``): the training loop's and the attacks' release
    path hands it a batch's per-sample gradients (name -> B × shape) and a generator of the run's ``noise`` stream;
    it returns the released (averaged) gradient, name -> shape, or a ``SharedGradient`` carrying its own public
    metadata (``mask``: the released coordinates; ``noise_std``: per coordinate). Not a DP defense to the
    accountant (ε = inf): what it protects is what the attacks measure."""
    from dpeval.defenses.base import Defense, SharedGradient

    class FunctionDefense(Defense):
        dp = False

        def reset(self) -> None:
            super().reset()
            self._rows: dict[str, list[torch.Tensor]] = {n: [] for n in self.param_shapes}

        def clip_and_accumulate(self, grads: dict[str, torch.Tensor]) -> None:
            for name, g in grads.items():
                self._rows[name].append(g.detach())
            self.samples_seen += next(iter(grads.values())).shape[0]

        def release(self, batch_size: int) -> SharedGradient:
            per_sample = {n: torch.cat(rows) for n, rows in self._rows.items()}
            count = max(self.samples_seen, 1)
            out = release(per_sample, self.generator)
            self.reset()
            if isinstance(out, SharedGradient):
                return out
            missing = set(self.param_shapes) - set(out)
            if missing or any(tuple(out[n].shape) != tuple(s) for n, s in self.param_shapes.items()):
                raise ValueError(f"the release function must return one gradient per parameter of its shape "
                                 f"({', '.join(f'{n}: {tuple(s)}' for n, s in self.param_shapes.items())})")
            return SharedGradient(dict(out), batch_size=count, noise_std=noise_std)

    FunctionDefense.name = getattr(release, "__name__", "release")
    return FunctionDefense


def attack_release(release: ReleaseFunction, recipe: Settings | None = None,
                   attacks: tuple[str, ...] | list[str] = ("ig",), *, noise_std: float = 0.0,
                   weights: dict[str, torch.Tensor] | None = None, out: str | Path | None = None) -> RunResult:
    """Attack a defense written as a function (``function_defense``) with the gradient attacks (``ig``, ``rgap``,
    ``grad-mia``), their games and verdicts, without a plug-in file or training: the model of ``recipe`` (its
    ``data``, ``model`` and ``attack`` settings) at its initialisation, or with ``weights`` (a state dict: the
    attacked state is then ``final``; ``attack.at`` defaults to that state). ``noise_std``: the public noise std
    per released coordinate, for a function
    that returns a plain gradient dict (mask-aware and noise-aware attacks read it)."""
    from dpeval.runner import play_attacks, prepare

    raw = recipe.canonical() if isinstance(recipe, RunSpec) else copy.deepcopy(dict(recipe or {}))
    raw.setdefault("attack", {}).setdefault("at", "final" if weights is not None else "init")  # no training here
    spec = configure(raw, defense={"name": "none"}, attacks=list(attacks))
    prep = prepare(spec, defense_cls=function_defense(release, noise_std))
    prep.model.to(prep.device).eval()
    init = copy.deepcopy(prep.model.state_dict())
    final = {n: t.detach().clone() for n, t in weights.items()} if weights is not None else init
    defense = prep.make_defense(prep.streams.scope("victim"))
    defense.begin_epoch(0, spec.train.epochs)
    public = copy.deepcopy(defense.state_dict())
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="dpeval-release-"))
    outcomes, seconds = play_attacks(prep, {"init": init, "final": final}, {"init": public, "final": public}, folder)
    result = RunResult.from_flat({"run_id": "", "status": "failed" if any(o.error for o in outcomes.values())
                                  else "done", "dataset": spec.data.name, "model": prep.model_name,
                                  "defense": getattr(release, "__name__", "release"), "seed": spec.seed,
                                  **prep.privacy.metrics(), "time.attack_s": sum(seconds.values())})
    return dataclasses.replace(result, attacks=outcomes, folder=folder)
