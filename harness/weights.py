"""A victim trained elsewhere (``model.weights``, ``dpeval run --weights``): reading its state dict from the
common checkpoint layouts, and checking it fits the run's model before anything is written."""

import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpeval.attacks import ATTACKS
from dpeval.core.errors import ConfigError
from dpeval.core.registry import default_model
from dpeval.core.spec import RunSpec
from dpeval.core.states import resolve


def load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a model state saved by a run (tensors only: ``weights_only=True`` refuses pickled code)."""
    return torch.load(path, weights_only=True, map_location="cpu")


def torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding the model's ``code/``), read without loading it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/code/" in name or name.startswith("code/") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


WRAPPED = ("state_dict", "model")  # where a training checkpoint commonly keeps the model's state dict


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in a ``model.weights`` file: the file's dict itself, or the one a checkpoint keeps under
    ``state_dict`` or ``model`` (``{"model": model.state_dict(), "epoch": 20}``). Never unpickles anything; a
    ConfigError in one line otherwise."""
    if torchscript(path):
        raise ConfigError(f"model.weights: {path} is a TorchScript archive (torch.jit.save), not a state dict; save "
                          f"model.state_dict() with torch.save")
    try:
        with warnings.catch_warnings():  # torch's own warnings about the file: the refusal below says it all
            warnings.simplefilter("ignore")
            loaded = load_checkpoint(path)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise ConfigError(f"model.weights: {path} is not a tensors-only state dict ({type(exc).__name__}); save "
                          f"model.state_dict() with torch.save") from None

    def is_state(d: Any) -> bool:
        return isinstance(d, dict) and bool(d) and all(isinstance(t, torch.Tensor) for t in d.values())

    if is_state(loaded):
        return loaded
    for key in WRAPPED:
        if isinstance(loaded, dict) and is_state(loaded.get(key)):
            return loaded[key]
    held = f"a dict of {', '.join(map(repr, list(loaded)[:5]))}" if isinstance(loaded, dict) else type(loaded).__name__
    raise ConfigError(f"model.weights: {path} holds {held}, not a state dict; pass the file of "
                      f"torch.save(model.state_dict()), or a checkpoint dict holding it under 'state_dict' or 'model'")


def check_weights(spec: RunSpec, model: nn.Module) -> None:
    """A ``model.weights`` file must hold this model's state dict (names and shapes); only the states ``init``
    and ``final`` exist without training. ConfigError naming the field otherwise (before anything is written)."""
    path = Path(str(spec.model.weights))
    if not path.is_file():
        raise ConfigError(f"model.weights: {path} is not a file")
    state = read_weights(path)
    expected = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    given = {n: tuple(t.shape) for n, t in state.items()}
    if given != expected:
        name = spec.model.name or default_model(spec.data.name)
        net = {n[2:]: shape for n, shape in expected.items() if n.startswith("1.")}  # Sequential(Normalize, net)
        if given and given in (net, {f"1.{n}": shape for n, shape in net.items()}):
            raise ConfigError(f"model.weights: {path} holds the network {name} without dpeval's input normalisation "
                              f"(a run's model is Sequential(Normalize, net): keys 0.mean, 0.std, 1.*); save the "
                              f"state_dict() of the model dpeval.build_model(...) builds with the run's settings "
                              f"(docs/api.md)")
        differ = sorted(set(expected) ^ set(given)) or [n for n in expected if expected[n] != given[n]]
        raise ConfigError(f"model.weights: {path} is not a state dict of {name} "
                          f"({len(given)} tensors, {len(expected)} expected; first difference: {differ[0]})")
    if not all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point()):
        raise ConfigError(f"model.weights: {path} holds NaN or infinite values (a diverged model cannot be attacked)")
    for name in spec.attacks:
        attack = ATTACKS.get(name, field="attack")(spec.attack[name])
        for state_name in resolve(type(attack).wanted_states(attack.params), spec.train.epochs):
            if str(state_name) not in ("init", "final"):
                raise ConfigError(f"attack.{name}.at: {state_name} was not recorded: a run from model.weights has "
                                  f"only the states init and final (the given weights); set attack.{name}.at=final")
