"""The run's attack stage: each attack of the run plays its game on what training released, seen through the
attacker's view (``attacks/view.py``: the recorded states, the release oracle, the public split; never the private
task, which the games keep); its artefacts are written into the run's folder here, not inside the games, and its
outcome is typed (``results.AttackOutcome``). ``check_attacks`` is the same attacks' check before training.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dpeval import checkpoint
from dpeval.attacks import ATTACKS
from dpeval.attacks.base import Artefact
from dpeval.attacks.view import AttackerView
from dpeval.core.files import inside
from dpeval.core.ledger import PrivacyLedger
from dpeval.core.spec import RunSpec
from dpeval.core.states import resolve
from dpeval.engine.release import ReleaseOracle
from dpeval.logs import LOG_ONLY
from dpeval.results import AttackOutcome
from dpeval.store import ResultStore

if TYPE_CHECKING:
    from dpeval.runner import Prepared

log = logging.getLogger("dpeval")
SHADOWS = "shadows"  # a run folder's finished shadow models, kept until the run is done (resume)


def attacks_of(spec: RunSpec) -> list:
    return [(name, ATTACKS.get(name, field="attack")(spec.attack[name])) for name in spec.attacks]


def write_artefacts(artefacts: Mapping[str, Artefact], folder: Path) -> dict[str, Path]:
    """Write an attack's artefacts (``AttackResult.artefacts``) into its folder, each under its file name: name ->
    path written."""
    paths = {name: inside(folder, artefact.file, "artefact") for name, artefact in artefacts.items()}
    folder.mkdir(parents=True, exist_ok=True)
    for name, artefact in artefacts.items():
        artefact.write(paths[name])
    return paths


def artefact_path(path: str | Path, run_id: str, run_dir: Path) -> str:
    """An artefact's path as stored: relative to the results folder (``runs/<run_id>/…``, the store's
    layout), so that a moved or copied results folder still finds it; a file written outside the run's
    folder keeps the path it was given."""
    try:
        inside = Path(path).resolve().relative_to(run_dir.resolve())
    except ValueError:
        return str(path)
    return (ResultStore(".").run_dir(run_id) / inside).as_posix()


def check_attacks(spec: RunSpec, model: nn.Module, task: Any, privacy: PrivacyLedger | None = None) -> None:
    """Fail before training when an attack cannot work on this run: data its game cannot be played on
    (``Attack.check_task``), a model it does not support (``Attack.check_model``) or a model state that
    training will never record. Also for a run from ``model.weights``, which is attacked on the same data."""
    for _name, attack in attacks_of(spec):
        type(attack).check_task(attack.params, task)
        type(attack).check_model(attack.params, model, task.shape)
        if privacy is not None:
            type(attack).check_privacy(attack.params, privacy)
        for state in resolve(type(attack).wanted_states(attack.params), spec.train.epochs):
            state.check_exists(spec.train.epochs)


def attacker_view(prep: Prepared, states: dict[str, dict[str, torch.Tensor]], defense_states: dict[str, Any],
                  out_dir: Path, run_id: str = "", progress: bool = True,
                  train_shadow: Callable[..., nn.Module | None] | None = None) -> AttackerView:
    """What an attack of this run sees (``attacks/view.py``): never ``prep.task``, which the games keep. Its
    finished shadow models are kept under the run's folder, for the run ``run_id`` only. ``progress``: False
    hides the shadow models' progress bar; ``train_shadow``: the researcher's own shadow training function."""
    spec, task = prep.spec, prep.task
    oracle = ReleaseOracle(prep.make_defense, defense_states, int(spec.train.epochs),
                           int(spec.train.physical_batch_size), spec.train.precision, spec.train.module_mode)
    return AttackerView(
        architecture=prep.model, states=states, defense_states=defense_states, release=oracle, public=task.public,
        shape=tuple(task.shape), num_classes=task.num_classes, mean=tuple(task.mean), std=tuple(task.std),
        privacy=prep.privacy, spec=spec, build_model=prep.build_model, make_defense=prep.make_defense,
        streams=prep.streams, out_dir=out_dir, device=prep.device, shadow_progress=lambda key: checkpoint.ShadowStore(
            out_dir.parent / SHADOWS / hashlib.sha256(key.encode()).hexdigest()[:16], f"{run_id}:{spec.run_key}:{key}"),
        train_shadow=train_shadow, progress=None if progress else False)


def play_attacks(prep: Prepared, states: dict[str, dict[str, torch.Tensor]], defense_states: dict[str, Any],
                 out_dir: Path, run_id: str = "", progress: bool = True,
                 train_shadow: Callable[..., nn.Module | None] | None = None,
                 ) -> tuple[dict[str, AttackOutcome], dict[str, float]]:
    """Play every attack of the run: its outcome (artefact paths as stored: ``artefact_path``, given the run's id)
    and its wall-clock seconds. An attack that raises does not stop the others: its outcome holds the error (the
    traceback goes to the log). ``progress`` and ``train_shadow``: ``attacker_view``'s."""
    outcomes: dict[str, AttackOutcome] = {}
    seconds: dict[str, float] = {}
    for name, attack in attacks_of(prep.spec):
        # the registry refused every name that is not plain (``core.files.inside``): never a folder elsewhere
        view = attacker_view(prep, states, defense_states, out_dir / name, run_id, progress, train_shadow)
        view.out_dir.mkdir(parents=True, exist_ok=True)
        log.info("attack %s", name)
        start = time.perf_counter()
        try:
            result = attack.play(view, prep.task)
            check_headline(attack, result.metrics)  # before its files are written: a failed attack leaves none
            written = write_artefacts(result.artefacts, view.out_dir)
        except Exception as exc:
            log.error("attack %s failed", name, exc_info=True, extra=LOG_ONLY)
            outcomes[name] = AttackOutcome(name, error=f"{type(exc).__name__}: {exc}")
            continue
        finally:
            seconds[name] = time.perf_counter() - start
        artefacts = {k: artefact_path(v, run_id, out_dir) if run_id else str(v) for k, v in written.items()}
        outcomes[name] = AttackOutcome.of(name, result.metrics, result.states, result.verdict, artefacts)
    return outcomes, seconds


class NonFiniteResult(RuntimeError):
    """An attack's headline metric came out NaN or infinite: an error of the attack, never a verdict."""


def check_headline(attack: Any, metrics: dict[str, Any]) -> None:
    """``NonFiniteResult`` when the attack's headline metric (the one its verdict and the rankings read) is NaN or
    infinite; a headline it does not report (None: not resolvable) is left as it is."""
    name = type(attack).headline
    value = metrics.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isfinite(value):
        raise NonFiniteResult(f"its headline metric {name} is {value}; NaN or infinite values are an error, never a "
                              f"verdict")
