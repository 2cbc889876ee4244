"""A run's checkpoint: ``runs/<run_id>/checkpoint.pt``, written atomically at the end of every epoch (and every
``train.checkpoint_every`` steps within one), so an interrupted run (Ctrl-C, SIGTERM, ``kill -9``, a crash)
resumes from its last checkpoint.

One file, checked before use: an outer record (format version, run key, SHA-256 of the payload, the
payload's bytes) and the payload itself (``dpeval.engine.training.Loop.state()``, plain data of the shape
``LOOP_STATE``, plus the model states and public defense states attacks asked for). Both are read with
``weights_only=True``: a checkpoint can hold tensors and plain data only, never code.
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path
from typing import Any

import torch

from dpeval.core.errors import ConfigError, brief
from dpeval.core.files import write_atomic
from dpeval.store import CHECKPOINT_FILE

NUMBER = (int, float)
# What ``dpeval.engine.training.Loop.state`` writes: field → type(s), or the shape of a mapping. A checkpoint's loop
# state is checked against it before use (``loop_state_problem``); changing it makes a new checkpoint format (FORMAT).
LOOP_STATE: dict[str, Any] = {
    "epochs_done": int, "model": dict, "optimizer": dict, "schedule": (dict, type(None)), "sampler": torch.Tensor,
    "defense": {"state": dict, "generators": dict}, "globals": {"python": tuple, "torch": torch.Tensor, "numpy": list},
    "history": list, "steps": int, "bytes_dense": NUMBER, "densities": list, "sparse_bytes": list,
    "train_s": NUMBER,
}
EPOCH_RECORD = {"epoch": int, "test_accuracy": NUMBER, "train_loss": NUMBER, "density": NUMBER}  # each of history
WITHIN_STATE = {"order": torch.Tensor, "sizes": list, "step": int, "loss_sum": torch.Tensor, "seen": int}


def shape_problem(value: Any, shape: dict[str, Any], where: str) -> str | None:
    """What keeps ``value`` from having ``shape`` (field → type(s), or a nested shape), in a few words; None when
    it has it. Fields beyond the shape are allowed."""
    if not isinstance(value, dict):
        return f"{where} is not a mapping"
    for name, kind in shape.items():
        if name not in value:
            return f"{where} has no {name}"
        problem = (shape_problem(value[name], kind, f"{where}.{name}") if isinstance(kind, dict) else
                   None if isinstance(value[name], kind) else f"{where}.{name} is a {type(value[name]).__name__}")
        if problem:
            return problem
    return None


def loop_state_problem(state: Any) -> str | None:
    """What keeps ``state`` from being a loop state as ``Loop.state`` writes it (``LOOP_STATE``), or None."""
    problem = shape_problem(state, LOOP_STATE, "loop")
    if problem is None and state.get("within") is not None:
        problem = shape_problem(state["within"], WITHIN_STATE, "loop.within")
    if problem is None and len(state["history"]) != state["epochs_done"]:
        problem = f"loop.history holds {len(state['history'])} epochs, not {state['epochs_done']}"
    for i, record in enumerate(state["history"] if problem is None else []):
        problem = problem or shape_problem(record, EPOCH_RECORD, f"loop.history[{i}]")
    return problem



# Bumped whenever the payload changes (PAYLOAD, LOOP_STATE): a checkpoint of an earlier dpeval is
# refused, not misread. 2: the payload is checked for its shape. 3: the loop state holds the training time so far.
FORMAT = 3
FILE = CHECKPOINT_FILE
# A run's payload: training's loop state, and the model and defense states recorded for attacks (name → state).
PAYLOAD = {"loop": dict, "states": dict, "defense_states": dict}
log = logging.getLogger("dpeval")


def save(path: Path, run_key: str, payload: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    record = {"format": FORMAT, "run_key": run_key, "sha256": hashlib.sha256(data).hexdigest(),
              "payload": torch.frombuffer(bytearray(data), dtype=torch.uint8)}
    write_atomic(path, lambda f: torch.save(record, f))


def position(loop: dict[str, Any], epochs: int) -> str:
    """Where a checkpoint's loop state stands, for a log line: ``epoch 2 of 5`` (after that epoch), or
    ``epoch 2 of 5 and step 7 of epoch 3`` for one written within an epoch."""
    text = f"epoch {loop['epochs_done']} of {epochs}"
    within = loop.get("within")
    return text if within is None else f"{text} and step {within['step']} of epoch {loop['epochs_done'] + 1}"


def payload_problem(payload: Any) -> str | None:
    """What keeps ``payload`` from being a run's checkpoint as this version writes it, or None."""
    problem = shape_problem(payload, PAYLOAD, "payload") or loop_state_problem(payload["loop"])
    if problem:
        return problem
    for name, state in payload["states"].items():
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            return f"states.{name} is not a model state (names → tensors)"
    missing = [part for part in ("states", "defense_states") if "init" not in payload[part]]
    return f"{missing[0]} has no init" if missing else None


class Unusable(Exception):
    """A file ``save`` wrote that cannot be used: damaged, of another format or key, or off in its content."""


def load(path: Path, run_key: str) -> dict[str, Any]:
    """The payload of a checkpoint written for ``run_key``; ConfigError (one line, with the way to start
    over) when it is damaged, of another format or run, or its content is not what this version writes."""
    try:
        payload = read(path, run_key)
        problem = payload_problem(payload)
        if problem:
            raise Unusable(f"its content is not what this dpeval writes: {problem}")
    except Unusable as exc:
        raise ConfigError(f"checkpoint {path} cannot be used ({exc}); to start the run over, remove it (rm {path}) "
                          "and run the same command again") from None
    return payload


def read(path: Path, key: str) -> Any:
    """The payload of a file ``save`` wrote for ``key``, its content unchecked; Unusable when the file is damaged,
    of another format or written for another key."""
    try:
        record = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many types for a file that is not its format
        raise Unusable(f"unreadable: {type(exc).__name__}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise Unusable(f"format {record.get('format') if isinstance(record, dict) else '?'}, expected {FORMAT}")
    if record.get("run_key") != key:
        # a shadow's key is the whole game's settings as JSON: quoted short, the line stays readable
        raise Unusable(f"written for run key {brief(record.get('run_key'))}, not {brief(key)}")
    payload = record.get("payload")
    data = payload.numpy().tobytes() if isinstance(payload, torch.Tensor) else b""
    if hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise Unusable("its content does not match its hash")
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise Unusable(f"unreadable payload: {type(exc).__name__}") from None


class ShadowStore:
    """The finished shadow models of one membership game, so that a run interrupted while it trains them goes
    on with the ones left: ``<folder>/shadow-<i>.pt`` holds shadow i's state dict and its index i, written
    atomically as it finishes and checked like a checkpoint (format, ``key``, SHA-256, ``weights_only``).
    ``key`` names the run and the game (the run id and key, and what determines its shadows).

    A file that cannot be used (damaged, written by another run or game, or holding another shadow than its name
    says: files swapped) is removed with a warning and that shadow trains again: the run's checkpoint and the
    other shadows are kept."""

    def __init__(self, folder: Path, key: str) -> None:
        self.folder, self.key = Path(folder), key

    def path(self, i: int) -> Path:
        return self.folder / f"shadow-{i}.pt"

    def save(self, i: int, state: dict[str, torch.Tensor]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        save(self.path(i), self.key, {"index": i, "state": {n: t.detach().cpu() for n, t in state.items()}})

    def finished(self, k: int) -> dict[int, dict[str, torch.Tensor]]:
        """Shadow index → state dict of those of the K shadows already saved and usable."""
        states = {}
        for i in range(k):
            path = self.path(i)
            if not path.is_file():
                continue
            try:
                payload = read(path, self.key)
                problem = shape_problem(payload, {"index": int, "state": dict}, "payload")
                if problem or payload["index"] != i:
                    raise Unusable(problem or f"it holds shadow {payload['index']}")
            except Unusable as exc:
                log.warning("saved shadow model %s cannot be used (%s): removed, it trains again", path, exc)
                path.unlink()
                continue
            states[i] = payload["state"]
        return states
