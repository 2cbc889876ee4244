"""dpeval from Python: build an experiment from settings, train, attack and read a typed result — no store, CLI
or YAML involved (docs/api.md). Everything here is also reachable as ``dpeval.<name>``.

* ``configure(settings, **dotted)``: a validated ``RunSpec`` (the same settings as a YAML file or ``--set``).
* ``run(spec)``: train the victim with its defense, play its attacks, return a ``RunResult``; with ``results=``
  also recorded in a results folder, exactly as ``dpeval run`` records it; ``model=factory``: your own network.
* ``per_sample_norms(model, inputs, targets, engine)``: each example's gradient norm, as dpeval's per-sample
  engines compute it for clipping.
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

import atexit
import copy
import dataclasses
import hashlib
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpeval.config import build_spec, refuse_recorded, set_dotted
from dpeval.core.errors import ConfigError, brief, printable
from dpeval.core.runtime import in_known_torch_state
from dpeval.core.spec import RunSpec
from dpeval.core.splits import Split, Task
from dpeval.own_model import (
    ModelFactory,
    TrainShadow,
    UserFunctionCheck,
    check_model,
    checked_architecture,
    checked_trainer,
    factory_name,
    first_difference,
    registered_model,
    shapes_of,
    without_hooks,
)
from dpeval.results import RunResult

Settings = Mapping[str, Any] | RunSpec


def configure(settings: Settings | None = None, /, **dotted: Any) -> RunSpec:
    """A validated run specification: ``settings`` nested as in a YAML file (``{"defense": {"name": "dpsgd",
    "clip": 1.0}, "train": {"epochs": 5}}``; a defense may be given by name alone), then ``dotted`` settings with
    ``__`` for the dots (``train__epochs=5``, ``attacks=["lira"]``; ``defense="dpsgd", defense__clip=0.5`` as
    ``--defense dpsgd --set defense.clip=0.5``), which win. Bad input raises ``ConfigError`` naming the field, as
    the CLI's exit 2 does."""
    raw = settings_tree(settings, "settings")
    refuse_recorded(dotted)
    for key, value in dotted.items():
        field = key.replace("__", ".")
        if field == "defense" and isinstance(value, str):  # a name alone, as --defense gives it
            field = "defense.name"
        set_dotted(raw, field, value)
    return build_spec(raw)


def settings_tree(settings: Settings | None, argument: str) -> dict[str, Any]:
    """``settings`` as a nested dict of its own (a RunSpec's canonical settings), a defense given by name alone as
    ``{"name": …}``; ConfigError naming ``argument`` for anything else."""
    if isinstance(settings, RunSpec):
        raw: dict[str, Any] = settings.canonical()
    elif settings is None or isinstance(settings, Mapping):
        raw = copy.deepcopy(dict(settings or {}))
        refuse_recorded(raw)  # a RunSpec's own record stays; one the caller writes is refused
    else:
        raise ConfigError(f"{argument}: must be settings as a dict (as in a YAML file) or a RunSpec "
                          f"(dpeval.configure), got {type(settings).__name__}")
    if isinstance(raw.get("defense"), str):
        raw["defense"] = {"name": raw["defense"]}
    return raw


@in_known_torch_state
def load_data(settings: Settings | None = None, /, **dotted: Any) -> Task:
    """The data a run with these settings uses: ``task.train`` (the private pool), ``task.test``, ``task.public``
    (images in [0, 1], N × C × H × W), ``task.num_classes``. Train your own model on ``task.train`` and score it
    with ``score_membership(model, task.train, task.test, recipe)``."""
    from dpeval.core.datasets import load_task

    return load_task(configure(settings, **dotted).data)


# Files of calls given no ``out`` folder: each in a temporary folder of its own, removed when the process exits.
_TEMPORARY: list[Path] = []


def run_folder(out: str | Path | None, prefix: str) -> Path:
    """``out`` (kept), or a new temporary folder removed when the Python process exits (``RunResult.folder``
    names it; its artefacts can be read until then)."""
    if out is not None:
        if not isinstance(out, str | Path):
            raise ConfigError(f"out: must be a folder path, got {type(out).__name__}")
        return Path(out)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    if not _TEMPORARY:
        atexit.register(remove_temporary)
    _TEMPORARY.append(folder)
    return folder


def remove_temporary() -> None:
    """Remove the temporary folders of this process's calls given no ``out`` folder."""
    while _TEMPORARY:
        shutil.rmtree(_TEMPORARY.pop(), ignore_errors=True)


def check_flag(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{argument}: must be True or False, got {value!r:.60}")
    return value


@in_known_torch_state
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


@in_known_torch_state
def run(spec: Settings, *, model: ModelFactory | None = None, results: str | Path | None = None,
        out: str | Path | None = None, progress: bool = False) -> RunResult:
    """Train and attack one run; its typed result. ``model``: your own network, as a factory ``model(in_shape,
    num_classes) -> nn.Module`` (``in_shape`` = (C, H, W) of the data; it returns one logit per class): the run
    builds and trains it exactly as a registered model (behind the data's ``Normalize``, in the run's seeded
    initialisation, fresh ones for shadow models) and records it as ``model.name: python:<its name>``
    (``model_run``). ``results``: also record it in that results folder (resuming an interrupted run of the same
    configuration there, as ``dpeval run`` does). Otherwise nothing is recorded and the run's files (``model.pt``,
    ``log.txt``, attack artefacts) go to ``out``, or to a new temporary folder (``RunResult.folder``) removed when
    the Python process exits. ``progress``: progress bars (training and shadow models) on stderr. An attack that
    fails after training is reported in its ``AttackOutcome.error`` (status ``failed``); any other failure
    raises."""
    if model is not None:
        with registered_model(model) as name:
            return run_spec(with_model(spec, name, model), results, out, progress)
    return run_spec(spec if isinstance(spec, RunSpec) else configure(settings_tree(spec, "spec")), results, out,
                    progress)


def run_spec(spec: RunSpec, results: str | Path | None, out: str | Path | None, progress: bool) -> RunResult:
    from dpeval.core.runtime import apply_thread_default
    from dpeval.runner import AttacksFailed, execute, perform, prepare

    progress = check_flag(progress, "progress")
    if results is not None:
        from dpeval.store import ResultStore

        if not isinstance(results, str | Path):
            raise ConfigError(f"results: must be a folder path, got {type(results).__name__}")
        store = ResultStore(results)
        store.check(create=True)
        return execute(spec, store, progress=progress)
    prep = prepare(spec)
    if prep.device.type == "cpu":
        apply_thread_default()
    folder = run_folder(out, "dpeval-run-")
    try:
        result = perform(prep, "", folder, progress=progress)
    except AttacksFailed as exc:
        result = exc.result
    return dataclasses.replace(result, folder=folder)


# ---------------------------------------------------------------------------------------------------
# the researcher's own model, trained by dpeval
#
# One way in: a factory passed to ``run(model=)`` and registered in the model registry under ``python:<its name>``
# for the call. A factory rather than a built module, because a run builds its victim in its own seeded
# initialisation stream (the same seed, the same initial weights) and fresh copies for shadow models; registered,
# because then the run takes the very path of a built-in model (``Normalize`` front, DP-PCA, every check before
# training, the run key) and the stored configuration names the model it trained.


def with_model(spec: Settings, name: str, factory: Any) -> RunSpec:
    """``spec`` with ``model.name`` set to the registered factory's ``name``. A RunSpec's settings are taken without
    the data set's defaults it took (``spec.defaults``: the recipe of the data set's default model, not of
    yours); a ``model.name`` naming another model is refused: the run's model is given once."""
    raw = settings_tree(spec, "spec")
    for entry in raw.pop("defaults", []) if isinstance(spec, RunSpec) else ():
        *parents, leaf = entry.split("=", 1)[0].split(".")
        node = raw
        for part in parents:
            node = node.get(part, {})
        node.pop(leaf, None)
    section = raw.setdefault("model", {})
    if not isinstance(section, dict):
        raise ConfigError("model: settings must be a mapping of model settings")
    if section.get("name") not in (None, name):
        raise ConfigError(f"model.name: {brief(section['name'], 60)} and model={factory_name(factory)} both "
                          f"name the run's model; leave model.name unset (the run records {name})")
    section["name"] = name
    return build_spec(raw)


def load_result(results: str | Path, run_id: str) -> RunResult:
    """A stored run (any unique part of its id) as a ``RunResult``; ConfigError when the folder holds no results or
    no single run matches ``run_id``."""
    from dpeval.store import ResultStore

    if not isinstance(results, str | Path):
        raise ConfigError(f"results: must be a folder path, got {type(results).__name__}")
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"run_id: must be a run id or a unique part of one, got {run_id!r:.60}")
    store = ResultStore(results)
    store.check(create=False)
    matches = store.matching(run_id)
    if len(matches) != 1:
        raise ConfigError(f"run_id: no run id contains {run_id!r:.60} in {results}" if not matches else
                          f"run_id: {run_id!r:.60} is part of {len(matches)} run ids; give more of it")
    return store.result(matches[0])


def attack_names(attacks: Any) -> list[str]:
    """``attacks`` as a list of names: one name, or a list / tuple of them."""
    if isinstance(attacks, str):
        return [attacks]
    if not isinstance(attacks, list | tuple) or not all(isinstance(a, str) for a in attacks):
        raise ConfigError(f"attacks: must be an attack name or a list of them, got {attacks!r:.80}")
    return list(attacks)


# ---------------------------------------------------------------------------------------------------
# the researcher's own victim


def as_split(data: Any, argument: str) -> Split:
    """``data`` (a ``Split`` or ``(x, y)``) checked as examples: finite inputs, integer labels ≥ 0, at least one
    example; ConfigError naming ``argument`` otherwise."""
    if isinstance(data, Split):
        x, y = data.x, data.y
    elif isinstance(data, tuple | list) and len(data) == 2:
        x, y = data
    else:
        raise ConfigError(f"{argument}: must be a Split or an (x, y) pair of tensors, got {type(data).__name__}")
    try:
        x, y = torch.as_tensor(x), torch.as_tensor(y)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{argument}: x and y must be tensors ({exc})") from None
    if x.dim() < 2 or len(x) == 0:
        raise ConfigError(f"{argument}: needs at least one example (x: N × features…), got x of shape "
                          f"{tuple(x.shape)}")
    if y.shape != (len(x),):
        raise ConfigError(f"{argument}: y must hold one label per row of x ({len(x)}), got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ConfigError(f"{argument}: labels must be integers (class indices), got {y.dtype}")
    if x.is_complex() or x.dtype == torch.bool:
        raise ConfigError(f"{argument}: x must hold real numbers, got {x.dtype}")
    x = x.float()
    if not bool(torch.isfinite(x).all()):
        raise ConfigError(f"{argument}: x holds NaN or infinite values")
    if int(y.min()) < 0:
        raise ConfigError(f"{argument}: labels must be class indices >= 0, got {int(y.min())}")
    source = data.source_index if isinstance(data, Split) else torch.arange(len(y))
    return Split(x, y.long(), source)


def row_digests(split: Split) -> set[bytes]:
    """One digest per example (its input and label), to find examples two splits share."""
    x = split.x.reshape(len(split.x), -1).contiguous()
    return {hashlib.sha256(row.numpy().tobytes() + int(label).to_bytes(8, "little", signed=True)).digest()
            for row, label in zip(x, split.y)}


def check_disjoint(members: Split, nonmembers: Split) -> None:
    """Members and non-members must be different examples: an example in both is a member the game would also
    score as a non-member (with the same sets, any verdict is meaningless)."""
    shared = len(row_digests(members) & row_digests(nonmembers))
    if shared:
        raise ConfigError(f"nonmembers: {shared} example(s) are also in members; members and non-members must be "
                          f"different examples")


def outside_task(members: Split, nonmembers: Split, num_classes: Any) -> Task:
    """A task whose private pool is the model's members and whose held-out split its non-members (no public
    split; the model's own normalisation stays inside it)."""
    if members.x.shape[1:] != nonmembers.x.shape[1:]:
        raise ConfigError(f"nonmembers: examples of shape {tuple(nonmembers.x.shape[1:])}, members' are "
                          f"{tuple(members.x.shape[1:])}")
    labels = int(max(members.y.max(), nonmembers.y.max())) + 1
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                    or num_classes < max(labels, 2)):
        raise ConfigError(f"num_classes: must be an integer of at least {max(labels, 2)} (the labels go to "
                          f"{labels - 1}), got {num_classes!r:.40}")
    shape = tuple(int(s) for s in members.x.shape[1:])
    empty = Split(members.x[:0], members.y[:0], members.source_index[:0])
    channels = shape[0] if len(shape) == 3 else 1
    return Task("outside", members, nonmembers, empty, num_classes or labels, shape,  # type: ignore[arg-type]
                (0.0,) * channels, (1.0,) * channels)


@in_known_torch_state
def score_membership(model: nn.Module, members: Split | tuple[torch.Tensor, torch.Tensor],
                     nonmembers: Split | tuple[torch.Tensor, torch.Tensor], recipe: Settings,
                     attacks: str | tuple[str, ...] | list[str] = ("loss", "lira", "rmia"), *,
                     train_shadow: TrainShadow | None = None, architecture: Callable[[], nn.Module] | None = None,
                     num_classes: int | None = None, out: str | Path | None = None,
                     progress: bool = False) -> RunResult:
    """Membership inference against a model trained elsewhere, with dpeval's games, metrics and verdicts.

    ``model``: the trained network (any ``nn.Module`` that dpeval's per-sample engines support: no BatchNorm),
    called on the inputs exactly as given. ``members`` / ``nonmembers``: the examples it was / was not trained on
    (``Split``s, or ``(x, y)`` tensors; integer labels; no example in both). ``recipe``: how it was trained, as
    settings (``configure``): the defense and its clip, ``privacy.noise_multiplier`` (or a target ε) and δ, the
    accountant, and the training recipe (``train.epochs``, ``batch_size``, ``optimizer``, ``lr``, ``sampling``…)
    — the privacy ledger and ε come from it, and the shadow models (LiRA, RMIA) train under it with dpeval's
    trainer, each on a pool as large as ``members``; or with ``train_shadow(model, x, y, seed)``, your own
    training function (it trains the fresh model it is given in place, or returns the trained one), so shadows
    can match a victim dpeval did not train. ``architecture()``: builds a fresh, untrained model of the victim's
    architecture for each shadow (default: a copy of ``model`` with its parameters reset; give it when ``model``
    carries a training library's state, e.g. a model Opacus has wrapped). Attack settings go in ``recipe``'s
    ``attack`` section (``{"attack": {"shadows": 16}}``). Files go to ``out`` or a temporary folder removed when the
    process exits. Shadow models are reused across calls only when everything that determines them is the same
    (the data's contents, the architecture and its initial state, the recipe; never with a ``train_shadow``).
    Bad input raises ``ConfigError`` naming the argument.
    """
    from dpeval.attacking import play_attacks
    from dpeval.runner import prepare, run_result
    from dpeval.victims import OutsideModel

    spec = configure(settings_tree(recipe, "recipe"), attacks=attack_names(attacks))
    progress = check_flag(progress, "progress")
    model = without_hooks(check_model(model))
    member_split, nonmember_split = as_split(members, "members"), as_split(nonmembers, "nonmembers")
    check_disjoint(member_split, nonmember_split)
    task = outside_task(member_split, nonmember_split, num_classes)
    build = checked_architecture(architecture, model)
    check = UserFunctionCheck()
    trainer = checked_trainer(train_shadow, shapes_of(model), check)
    prep = prepare(spec, task, OutsideModel(model, build))
    folder = run_folder(out, "dpeval-membership-")
    states = {"final": {n: t.detach().clone() for n, t in model.state_dict().items()}}
    outcomes, seconds = play_attacks(prep, states, {}, folder, progress=progress, train_shadow=trainer)
    check.raise_any()
    return dataclasses.replace(run_result(prep, "", outcomes, sum(seconds.values()), dataset="outside"),
                               folder=folder)


# ---------------------------------------------------------------------------------------------------
# a defense as a function

ReleaseFunction = Callable[[dict[str, torch.Tensor], torch.Generator], Any]


def function_defense(release: ReleaseFunction, noise_std: float = 0.0, check: UserFunctionCheck | None = None,
                     ) -> type:
    """A defense class around a release function (``attack_release``): the training loop's and the attacks' release
    path hands it a batch's per-sample gradients (name -> B × shape) and a generator of the run's ``noise`` stream;
    it returns the released (averaged) gradient, name -> shape, or a ``SharedGradient`` carrying its own public
    metadata (``mask``: the released coordinates; ``noise_std``: per coordinate). Not a DP defense to the
    accountant (ε = inf): what it protects is what the attacks measure. A release that is not a gradient per
    parameter of its shape, or holds NaN or infinite values, is refused (``check`` keeps the first refusal)."""
    from dpeval.defenses.base import Capabilities, Defense, SharedGradient

    check = check or UserFunctionCheck()

    class FunctionDefense(Defense):
        capabilities = Capabilities(accounted=False, auditable=False)

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
            shared = out if isinstance(out, SharedGradient) else None
            values = shared.grads if shared is not None else out
            if not isinstance(values, Mapping) or set(self.param_shapes) - set(values) or any(
                    not isinstance(values[n], torch.Tensor) or tuple(values[n].shape) != tuple(s)
                    for n, s in self.param_shapes.items()):
                raise check.refuse(f"release: the release function must return one gradient per parameter of its "
                                   f"shape ({', '.join(f'{n}: {tuple(s)}' for n, s in self.param_shapes.items())})")
            if not all(bool(torch.isfinite(values[n]).all()) for n in self.param_shapes):
                raise check.refuse("release: the release function returned NaN or infinite values; a release must "
                                   "be a finite gradient")
            return shared if shared is not None else SharedGradient(dict(out), batch_size=count, noise_std=noise_std)

    FunctionDefense.name = getattr(release, "__name__", "release")
    return FunctionDefense


def check_weights(weights: Any, model: nn.Module) -> dict[str, torch.Tensor]:
    """``weights`` as a state dict of ``model`` with finite values; ConfigError naming ``weights`` otherwise."""
    if not isinstance(weights, Mapping) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise ConfigError(f"weights: must be a state dict (name -> tensor) of the recipe's model, got "
                          f"{type(weights).__name__}")
    given = {str(n): tuple(t.shape) for n, t in weights.items()}
    if given != shapes_of(model):
        raise ConfigError(f"weights: not a state dict of the recipe's model (first difference: "
                          f"{first_difference(shapes_of(model), given)})")
    if not all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point()):
        raise ConfigError("weights: hold NaN or infinite values")
    return {str(n): t.detach().clone() for n, t in weights.items()}


@in_known_torch_state
def attack_release(release: ReleaseFunction, recipe: Settings | None = None,
                   attacks: str | tuple[str, ...] | list[str] = ("ig",), *, noise_std: float = 0.0,
                   weights: dict[str, torch.Tensor] | None = None, out: str | Path | None = None) -> RunResult:
    """Attack a defense written as a function (``function_defense``) with the gradient attacks (``ig``, ``rgap``,
    ``grad-mia``), their games and verdicts, without a plug-in file or training: the model of ``recipe`` (its
    ``data``, ``model`` and ``attack`` settings) at its initialisation, or with ``weights`` (a state dict: the
    attacked state is then ``final``; ``attack.at`` defaults to that state). ``noise_std``: the public noise std
    per released coordinate (finite, >= 0), for a function that returns a plain gradient dict (mask-aware and
    noise-aware attacks read it). A release that is not a finite gradient of the model's shapes raises
    ``ConfigError`` naming ``release``; files go to ``out`` or a temporary folder removed when the process exits."""
    from dpeval.attacking import play_attacks
    from dpeval.runner import prepare, run_result
    from dpeval.victims import DefenseTrained

    if not callable(release):
        raise ConfigError(f"release: must be a function release(grads, generator), got {type(release).__name__}")
    if isinstance(noise_std, bool) or not isinstance(noise_std, int | float) or not math.isfinite(noise_std) \
            or noise_std < 0:
        raise ConfigError(f"noise_std: must be a finite number >= 0 (the public noise std per released "
                          f"coordinate), got {noise_std!r:.40}")
    raw = settings_tree(recipe, "recipe")
    raw.setdefault("attack", {}).setdefault("at", "final" if weights is not None else "init")  # no training here
    spec = configure(raw, defense={"name": "none"}, attacks=attack_names(attacks))
    check = UserFunctionCheck()
    prep = prepare(spec, source=DefenseTrained(function_defense(release, float(noise_std), check)))
    prep.model.to(prep.device).eval()
    init = copy.deepcopy(prep.model.state_dict())
    final = check_weights(weights, prep.model) if weights is not None else init
    defense = prep.make_defense(prep.streams.scope("victim"))
    defense.begin_epoch(0, spec.train.epochs)
    public = copy.deepcopy(defense.state_dict())
    folder = run_folder(out, "dpeval-release-")
    outcomes, seconds = play_attacks(prep, {"init": init, "final": final}, {"init": public, "final": public}, folder)
    check.raise_any()
    result = run_result(prep, "", outcomes, sum(seconds.values()), defense=getattr(release, "__name__", "release"))
    return dataclasses.replace(result, folder=folder)


# ---------------------------------------------------------------------------------------------------
# per-sample gradient norms

ENGINES = ("func", "lean")


@in_known_torch_state
def per_sample_norms(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, engine: str = "func",
                     ) -> torch.Tensor:
    """Each example's gradient norm ‖∇θ CE(model(x_i), y_i)‖ over the model's trainable parameters, float32 [B]:
    the numbers DP-SGD clips, as dpeval's per-sample engines compute them — ``func`` from materialised per-sample
    gradients (torch.func), ``lean`` by book-keeping during one backward pass (the layers it has kernels for;
    otherwise a ConfigError counting the layer classes it lacks). The model is evaluated in eval mode (dropout off,
    so both engines compute one function; training itself runs in ``train.module_mode``) with its modes given back,
    on its own device; ``model`` as ``score_membership`` takes it (no BatchNorm,
    float32 trainable parameters)."""
    from dpeval.core.per_sample import PerSampleGradients, check_per_sample, check_trainable
    from dpeval.defenses.lean_plan import LeanPlan
    from dpeval.engine.lean import LeanEngine, trainable_layers

    if engine not in ENGINES:
        raise ConfigError(f"engine: must be one of {', '.join(ENGINES)}, got {printable(repr(engine), 40)}")
    check_per_sample(check_model(model), "model")
    check_trainable(model, "model")
    examples = as_split((inputs, targets), "inputs, targets")
    device = next(p.device for p in model.parameters() if p.requires_grad)
    x, y = examples.x.to(device), examples.y.to(device)
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        if engine == "func":
            grads = PerSampleGradients(model)(x, y)
            squares = torch.stack([g.flatten(1).pow(2).sum(1, dtype=torch.float64) for g in grads.values()]).sum(0)
        else:
            trainable_layers(model, field="engine", instead='engine="func"')
            names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
            found: list[torch.Tensor] = []

            def keep(group: int, group_squares: torch.Tensor, probes: torch.Tensor | None) -> torch.Tensor:
                found.append(group_squares)
                return torch.ones_like(group_squares)

            LeanEngine(model)(x, y, LeanPlan((names,), keep, sums=False))  # one group: no clipping, no sums
            squares = found[0]
    finally:
        for module, training in modes.items():
            module.train(training)
    return squares.sqrt().float()
