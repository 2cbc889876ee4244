"""A run's result, typed: what ``dpeval.run`` returns and what every stored row reads back as.

``RunResult`` holds the utility, the privacy ledger (σ, q, T, δ, accountant, ε), the communication, the times and
one ``AttackOutcome`` per attack (its metrics, the per-state ones apart, its verdict and artefacts, or the error
that stopped it). The flat result keys of the store, ``--json`` and the leaderboard CSV
(``leakage.<attack>.<metric>``, ``leakage.<attack>.<state>.<metric>``, ``artefacts.<attack>.<name>``; docs/results.md)
are this object's view: ``RunResult.flat()`` builds them (the only code that writes a per-state key) and
``RunResult.from_flat()`` reads them back (its ``attack_outcomes``: the only reader of a run's per-state keys), both
through ``dpeval.core.result_keys.AttackKey`` — the one place that spells an attack's key. The leaderboard's
seed-grouped records (means, spreads, mixed verdicts: no run's result) stay flat and are read by key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpeval.core.ledger import PrivacyLedger
from dpeval.core.result_keys import SECTIONS, AttackKey
from dpeval.core.verdicts import Mixed, Verdict


@dataclass(frozen=True)
class AttackOutcome:
    """One attack of a run: ``metrics`` as the attack reported them (a gradient attack over several model states:
    the worst case over them, with ``state`` naming it), ``states`` the per-state metrics (state -> metric ->
    value), ``verdict`` by the attack's rule (None: it has none), ``artefacts`` name -> path, ``error`` when it
    failed after training (then nothing else)."""

    name: str
    metrics: dict[str, Any] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdict: Verdict | Mixed | None = None  # Mixed: seeds grouped together that disagree
    artefacts: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def of(cls, name: str, metrics: dict[str, Any], states: dict[str, dict[str, Any]] | None = None,
           verdict: Verdict | Mixed | None = None, artefacts: dict[str, str] | None = None) -> AttackOutcome:
        """From what an attack returns (``AttackResult``: its metrics, per-state metrics, verdict, artefacts),
        copied so that the attack's own dicts stay its own."""
        return cls(name, dict(metrics), {state: dict(values) for state, values in (states or {}).items()}, verdict,
                   dict(artefacts or {}))

    @property
    def leaks(self) -> bool | None:
        return None if self.verdict is None else self.verdict.leaks

    def flat(self) -> dict[str, Any]:
        """This attack's result keys."""
        if self.error is not None:
            return {str(AttackKey(self.name, "error")): self.error}
        out: dict[str, Any] = {str(AttackKey(self.name, m)): v for m, v in self.metrics.items()}
        out |= {str(AttackKey.at_state(self.name, state, m)): v
                for state, values in self.states.items() for m, v in values.items()}
        if self.verdict is not None:
            out[str(AttackKey.verdict(self.name))] = str(self.verdict)  # the stored text
        out |= {str(AttackKey(self.name, k, "artefacts")): v for k, v in self.artefacts.items()}
        return out


@dataclass(frozen=True)
class Utility:
    test_accuracy: float
    train_accuracy: float
    test_accuracy_by_epoch: list[float] | None = None  # None: nothing was trained (given weights)
    train_loss_by_epoch: list[float] | None = None


@dataclass(frozen=True)
class Communication:
    density: float | None       # mean fraction of the trainable coordinates a training step releases
    bytes_sparse: int | None    # per step, as released (None: nothing was released, e.g. given weights)
    bytes_dense: int | None     # per step, the whole gradient


@dataclass(frozen=True)
class Timing:
    train_s: float
    attack_s: float
    threads: int | None = None


# keys RunResult reads into typed fields (the rest stay in ``extra``)
_UTILITY = {"utility.test_accuracy", "utility.train_accuracy", "utility.test_accuracy_by_epoch",
            "utility.train_loss_by_epoch"}
_COMM = {"comm.density", "comm.bytes_sparse", "comm.bytes_dense"}
_TIME = {"time.train_s", "time.attack_s", "time.threads"}
_LEDGER = ("noise_multiplier", "accounted_noise_multiplier", "sample_rate", "steps", "delta", "accountant",
           "sampling", "pca_noise_multiplier")


@dataclass(frozen=True)
class RunResult:
    """One run (module docstring). ``run_id`` is empty for a run kept in no store; ``extra`` holds every other key
    the run reported (its configuration's columns, data sizes, times of single attacks…)."""

    run_id: str
    status: str
    dataset: str
    model: str
    defense: str
    seed: int
    utility: Utility | None
    privacy: PrivacyLedger | None
    comm: Communication | None
    time: Timing | None
    attacks: dict[str, AttackOutcome] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None  # where the run's files are (model.pt, log.txt, artefacts); not a result key

    @property
    def epsilon(self) -> float | None:
        return None if self.privacy is None else self.privacy.epsilon

    def flat(self) -> dict[str, Any]:
        """The result keys (docs/results.md), as stored."""
        out: dict[str, Any] = {"run_id": self.run_id, "status": self.status, "dataset": self.dataset,
                               "model": self.model, "defense": self.defense,
                               "attack": "+".join(self.attacks) or "none", "seed": self.seed}
        out |= {k: v for k, v in self.extra.items() if k not in out}
        if self.utility is not None:
            out |= {f"utility.{k}": v for k, v in vars(self.utility).items() if v is not None or "_by_" not in k}
        if self.privacy is not None:
            out |= self.privacy.metrics()
        if self.comm is not None:
            out |= {f"comm.{k}": v for k, v in vars(self.comm).items()}
        if self.time is not None:
            out |= {f"time.{k}": v for k, v in vars(self.time).items() if v is not None}
        for outcome in self.attacks.values():
            out |= outcome.flat()
        return out

    @classmethod
    def from_flat(cls, row: dict[str, Any]) -> RunResult:
        """A stored row (or ``--json`` output) read back."""
        outcomes = attack_outcomes(row)
        used = {"run_id", "status", "dataset", "model", "defense", "attack", "seed"}
        used.update(key for key in row if key.startswith(SECTION_STARTS) and _attack_key(key))

        def take(keys: set[str], prefix: str) -> dict[str, Any]:
            used.update(k for k in keys if k in row)
            return {k.removeprefix(prefix): row[k] for k in keys if k in row}

        utility = take(_UTILITY, "utility.")
        comm, timing = take(_COMM, "comm."), take(_TIME, "time.")
        ledger = None
        if all(f"privacy.{k}" in row for k in _LEDGER[:-1]):
            ledger = PrivacyLedger(*(row.get(f"privacy.{k}", 0.0) or 0.0 for k in _LEDGER))
            used.update(f"privacy.{k}" for k in _LEDGER)
            used.update(k for k in ledger.metrics() if k in row)
        return cls(
            run_id=str(row.get("run_id", "")), status=str(row.get("status", "")), dataset=str(row.get("dataset", "")),
            model=str(row.get("model", "")), defense=str(row.get("defense", "")), seed=int(row.get("seed", 0) or 0),
            utility=Utility(**utility) if {"test_accuracy", "train_accuracy"} <= set(utility) else None,
            privacy=ledger,
            comm=Communication(**comm) if len(comm) == len(_COMM) else None,
            time=Timing(**timing) if {"train_s", "attack_s"} <= set(timing) else None,
            attacks=outcomes,
            extra={k: v for k, v in row.items() if k not in used},
        )


SECTION_STARTS = tuple(f"{section}." for section in SECTIONS)


@functools.lru_cache(maxsize=1 << 16)
def _attack_key(key: str) -> tuple[str, str, str | None, str] | None:
    """(section, attack, recorded state or None, metric or artefact name) of an attack's key, else None; remembered:
    a store repeats the same few hundred keys in each of thousands of rows."""
    for section in SECTIONS:
        parsed = AttackKey.parse(key, section)
        if parsed is not None:
            if section == "leakage":
                return section, parsed.attack, parsed.state, parsed.state_metric
            return section, parsed.attack, None, parsed.metric
    return None


def attack_outcomes(row: dict[str, Any]) -> dict[str, AttackOutcome]:
    """The attacks of a flat row (stored metrics, ``--json`` output), typed: the one reader that takes the
    ``leakage.<attack>.<state>.<metric>`` keys apart (``RunResult.from_flat`` reads its attacks here)."""
    metrics: dict[str, dict[str, Any]] = {}
    states: dict[str, dict[str, dict[str, Any]]] = {}
    artefacts: dict[str, dict[str, str]] = {}
    for key, value in row.items():
        parsed = _attack_key(key) if key.startswith(SECTION_STARTS) else None
        if parsed is None:
            continue
        section, attack, state, metric = parsed
        if section == "artefacts":
            artefacts.setdefault(attack, {})[metric] = value
        elif state is not None:
            metrics.setdefault(attack, {})
            states.setdefault(attack, {}).setdefault(state, {})[metric] = value
        else:
            metrics.setdefault(attack, {})[metric] = value
    outcomes = {}
    for name in dict.fromkeys([*metrics, *artefacts]):
        plain = metrics.get(name, {})
        error = plain.pop("error", None)
        verdict = Verdict.parse(plain.pop("verdict", None))
        outcome = AttackOutcome(name, plain, states.get(name, {}), verdict, artefacts.get(name, {}))
        outcomes[name] = outcome if error is None else AttackOutcome(name, error=str(error))
    return outcomes
