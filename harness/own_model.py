"""A researcher's own network and functions, checked before anything runs (each failure one ConfigError line naming
them): the factory given to ``dpeval.run(settings, model=factory)``, registered in the model registry as
``python:<its name>`` for the call so that the run builds it exactly as a registered model; and the trained model,
architecture and shadow-training function ``score_membership`` takes."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from dpeval.core.errors import ConfigError, brief, printable
from dpeval.core.runtime import known_torch_state
from dpeval.engine.training import evaluating

ModelFactory = Callable[[tuple[int, int, int], int], nn.Module]
TrainShadow = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], nn.Module | None]


def factory_name(factory: Any) -> str:
    """The name a factory is recorded under (its ``__name__``: a function's or a class's); ConfigError for anything
    that is not a named callable (a lambda or a ``functools.partial`` names no model)."""
    if not callable(factory) or isinstance(factory, nn.Module):
        raise ConfigError(f"model: must be a function (or class) model(in_shape, num_classes) -> nn.Module that "
                          f"builds a fresh network, got {type(factory).__name__}"
                          + (" (a built module: pass the function that builds it)"
                             if isinstance(factory, nn.Module) else ""))
    name = getattr(factory, "__name__", "")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"model: give a named function or class (def make_net(in_shape, num_classes): …): its name "
                          f"is recorded as the run's model, and {brief(name or type(factory).__name__, 40)} names "
                          f"none")
    return name


def checked_factory(factory: ModelFactory, name: str) -> ModelFactory:
    """``factory`` as the registry calls it, each failure one ConfigError line naming the function: what it raises,
    anything but an ``nn.Module``, or a network that fails on (or does not classify) a batch of two inputs of
    the data's shape — a shape mistake found before training, not as a traceback in the middle of it."""
    def build(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        call = f"{name}(in_shape={tuple(in_shape)}, num_classes={num_classes})"
        try:
            net = factory(in_shape, num_classes)
        except Exception as exc:
            raise ConfigError(f"model: {call} raised {type(exc).__name__}: {one_line(exc)}") from None
        if not isinstance(net, nn.Module):
            raise ConfigError(f"model: {call} must return a torch.nn.Module, returned {type(net).__name__}")
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]), evaluating(net):
                logits = net(torch.zeros(2, *in_shape))
        except Exception as exc:
            raise ConfigError(f"model: the network {call} built fails on 2 inputs of shape {tuple(in_shape)} "
                              f"({type(exc).__name__}: {one_line(exc)})") from None
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (2, num_classes):
            got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ConfigError(f"model: the network {call} built returns {got} for 2 inputs; dpeval needs logits of "
                              f"shape (2, {num_classes}), one per class")
        return net
    return build


def one_line(exc: BaseException) -> str:
    return printable(" ".join(str(exc).split()), 300)


@contextlib.contextmanager
def registered_model(factory: Any) -> Iterator[str]:
    """``factory`` registered in the model registry as ``python:<its name>`` for the block (the run's
    ``model.name``); ConfigError when another call of this process holds that name now."""
    from dpeval.core.registry import MODELS, PYTHON_MODEL

    label = factory_name(factory)
    name = PYTHON_MODEL + label
    try:
        MODELS.register(name, f"{label}, passed to dpeval.run from Python")(checked_factory(factory, label))
    except ValueError:
        raise ConfigError(f"model: {name} is registered already (another call of this process is running a "
                          f"function named {label}); give this one another name") from None
    try:
        yield name
    finally:
        MODELS.unregister(name)


def check_model(model: Any, argument: str = "model") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{argument}: must be a torch.nn.Module, got {type(model).__name__}")
    if any(t.is_meta for t in model.state_dict().values()):
        raise ConfigError(f"{argument}: its weights are on the meta device (shapes without values); give a model "
                          f"with real weights")
    if not all(bool(torch.isfinite(t).all()) for t in model.state_dict().values() if t.is_floating_point()):
        raise ConfigError(f"{argument}: its weights hold NaN or infinite values; a diverged model cannot be scored")
    return model


HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
         "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def without_hooks(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every module's hooks removed: a model trained with Opacus keeps the hooks its
    ``GradSampleModule`` put on it, and dpeval's per-sample engines need the plain module."""
    try:
        plain = copy.deepcopy(model)
    except Exception as exc:  # an attribute that cannot be copied (a lock, a file, a process handle)
        raise ConfigError(f"model: cannot be copied ({type(exc).__name__}: {exc}); dpeval attacks a copy of the model "
                          f"and trains its shadows from copies: move what cannot be copied out of the module") from None
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


def shapes_of(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def first_difference(expected: dict[str, tuple[int, ...]], given: dict[str, tuple[int, ...]]) -> str:
    differ = sorted(set(expected) ^ set(given)) or [n for n in expected if expected[n] != given[n]]
    return differ[0]


def checked_architecture(architecture: Any, model: nn.Module) -> Callable[[], nn.Module]:
    """``architecture`` (None: ``fresh_copy(model)``), checked once: it builds an ``nn.Module`` of ``model``'s
    architecture (the same state-dict names and shapes)."""
    if architecture is None:
        return fresh_copy(model)
    if not callable(architecture):
        raise ConfigError(f"architecture: must be a function building a fresh model, got {type(architecture).__name__}")
    with torch.random.fork_rng(devices=[]):
        built = architecture()
    if not isinstance(built, nn.Module):
        raise ConfigError(f"architecture: must build a torch.nn.Module, built {type(built).__name__}")
    if shapes_of(built) != shapes_of(model):
        raise ConfigError(f"architecture: builds another architecture than model's (first difference: "
                          f"{first_difference(shapes_of(model), shapes_of(built))})")
    return architecture


class UserFunctionCheck:
    """The first problem found with what a user's function (``train_shadow``, a release function) returned while
    the attacks ran: the attack fails on it, and the API call then raises it as a ConfigError naming the
    argument, instead of reporting a failed (or a meaningless) attack."""

    def __init__(self) -> None:
        self.problem: ConfigError | None = None

    def refuse(self, message: str) -> ConfigError:
        error = ConfigError(message)
        self.problem = self.problem or error
        return error

    def raise_any(self) -> None:
        if self.problem is not None:
            raise self.problem


def checked_trainer(train_shadow: Any, expected: dict[str, tuple[int, ...]], check: UserFunctionCheck,
                    ) -> TrainShadow | None:
    """``train_shadow`` wrapped to check what it gives back: the trained model (in place or returned) of the
    victim's architecture, with finite weights. One wrapper per call: shadow models are never reused across calls
    given a training function."""
    if train_shadow is None:
        return None
    if not callable(train_shadow):
        raise ConfigError(f"train_shadow: must be a function train_shadow(model, x, y, seed), got "
                          f"{type(train_shadow).__name__}")

    def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> nn.Module:
        with known_torch_state(generators=False):  # what the user's function sets globally stays inside it
            returned = train_shadow(model, x, y, seed)
        trained = model if returned is None else returned
        if not isinstance(trained, nn.Module):
            raise check.refuse(f"train_shadow: must train the model it is given in place (returning None) or return "
                               f"the trained nn.Module, returned {type(returned).__name__}")
        if shapes_of(trained) != expected:
            raise check.refuse(f"train_shadow: returned a model of another architecture than the victim's (first "
                               f"difference: {first_difference(expected, shapes_of(trained))})")
        if not all(bool(torch.isfinite(t).all()) for t in trained.state_dict().values() if t.is_floating_point()):
            raise check.refuse("train_shadow: the trained model's weights hold NaN or infinite values")
        return trained
    return train
