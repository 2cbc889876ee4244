"""A run's result, typed: what ``dpeval.run`` returns and what every stored row reads back as.

``RunResult`` holds the utility, the privacy ledger (σ, q, T, δ, accountant, ε), the communication, the times and
one ``AttackOutcome`` per attack (its metrics, the per-state ones apart, its verdict and artefacts, or the error
that stopped it). The flat result keys of the store, ``--json`` and the leaderboard CSV
(``leakage.<attack>.<metric>``, ``leakage.<attack>.<state>.<metric>``, ``artefacts.<attack>.<name>``; docs/results.md)
are this object's view: ``RunResult.flat()`` builds them (the only code that writes a per-state key) and
``RunResult.from_flat()`` reads them back (its ``attack_outcomes``: the only reader of a run's per-state keys), both
through ``dpeval.core.result_keys.AttackKey`` — the one place that spells an attack's key. A result read back keeps
the keys it was read from (``recorded``): its ``flat()`` gives them as recorded, so that a row of an older version
is printed and exported as it was stored. The store returns its runs as ``RunResult``s (``ResultStore.results``),
and that is what the leaderboard, the report, the reference deltas and the bench scripts read; they flatten a run
only where they print or write a row. The leaderboard's seed-grouped records (means, spreads, mixed verdicts: no
run's result) are rows of that kind.
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
_LEDGER_KEYS = tuple(f"privacy.{k}" for k in ("noise_multiplier", "accounted_noise_multiplier", "sample_rate", "steps",
                                                "delta", "accountant", "sampling", "pca_noise_multiplier"))
# every key a ledger's ``metrics()`` writes (the derived ones read back as recorded)
_LEDGER_READ = (*_LEDGER_KEYS, "privacy.epsilon", "privacy.accounted_sampling", "privacy.pca_epsilon")


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
    # Where the run is kept; not result keys. ``folder``: its files (model.pt, log.txt, artefacts); ``run_key``: what
    # identifies its configuration and seed (a run again under the same key is the same observation); ``config``: its
    # canonical configuration as stored (what the leaderboard's settings columns and seed groups are read from).
    folder: Path | None = None
    run_key: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    # The keys a result read back (``from_flat``) was read from: ``flat()`` gives them as recorded, so that a row of
    # an older version keeps its keys. None: built from the typed fields (a new run's result).
    recorded: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def epsilon(self) -> float | None:
        return None if self.privacy is None else self.privacy.epsilon

    def flat(self) -> dict[str, Any]:
        """The result keys (docs/results.md), as stored: those it was read from (``recorded``), else built from the
        typed fields; a new dict each call."""
        if self.recorded is not None:
            return dict(self.recorded)
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
    def from_flat(cls, row: dict[str, Any], **kept: Any) -> RunResult:
        """A stored row (or ``--json`` output) read back; ``kept``: where it is kept (``folder``, ``run_key``,
        ``config``)."""
        keys = _attack_keys(row)
        outcomes = _outcomes(row, keys)
        ran = [a for a in str(row.get("attack", "")).split("+") if a in outcomes]  # in the order the run named them
        outcomes = {a: outcomes[a] for a in dict.fromkeys([*ran, *outcomes])}
        used = {"run_id", "status", "dataset", "model", "defense", "attack", "seed"}  # besides the attacks' ``keys``

        def take(keys: set[str], prefix: str, needed: set[str]) -> dict[str, Any] | None:
            """The keys' values without ``prefix`` when the row has every ``needed`` one (then the keys are read
            into a typed field), else None (then they stay in ``extra``, as a hand-written row may hold them)."""
            found = {k.removeprefix(prefix): row[k] for k in keys if k in row}
            if not needed <= set(found):
                return None
            used.update(k for k in keys if k in row)
            return found

        utility = take(_UTILITY, "utility.", {"test_accuracy", "train_accuracy"})
        comm = take(_COMM, "comm.", {k.removeprefix("comm.") for k in _COMM})
        timing = take(_TIME, "time.", {"train_s", "attack_s"})
        ledger = None
        if all(k in row for k in _LEDGER_KEYS[:-1]):
            ledger = PrivacyLedger(*(row.get(k, 0.0) or 0.0 for k in _LEDGER_KEYS),
                                   recorded_epsilon=row.get("privacy.epsilon"),
                                   recorded_pca_epsilon=row.get("privacy.pca_epsilon"))
            used.update(k for k in _LEDGER_READ if k in row)
        return cls(
            run_id=str(row.get("run_id", "")), status=str(row.get("status", "")), dataset=str(row.get("dataset", "")),
            model=str(row.get("model", "")), defense=str(row.get("defense", "")), seed=int(row.get("seed", 0) or 0),
            utility=None if utility is None else Utility(**utility),
            privacy=ledger,
            comm=None if comm is None else Communication(**comm),
            time=None if timing is None else Timing(**timing),
            attacks=outcomes,
            extra={k: v for k, v in row.items() if k not in used and k not in keys},
            recorded=dict(row),
            **kept,
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


def _attack_keys(row: dict[str, Any]) -> dict[str, tuple[str, str, str | None, str]]:
    """The row's attack keys, each with its parts (``_attack_key``); not to be changed (shared by rows with the same
    keys)."""
    return _attack_keys_among(tuple(row))


@functools.lru_cache(maxsize=1 << 10)
def _attack_keys_among(keys: tuple[str, ...]) -> dict[str, tuple[str, str, str | None, str]]:
    """Remembered per key list: the runs of a sweep's configuration store the same keys."""
    return {key: parsed for key in keys if key.startswith(SECTION_STARTS) and (parsed := _attack_key(key)) is not None}


def attack_outcomes(row: dict[str, Any]) -> dict[str, AttackOutcome]:
    """The attacks of a flat row (stored metrics, ``--json`` output), typed: the one reader that takes the
    ``leakage.<attack>.<state>.<metric>`` keys apart (``RunResult.from_flat`` reads its attacks here)."""
    return _outcomes(row, _attack_keys(row))


def _outcomes(row: dict[str, Any], keys: dict[str, tuple[str, str, str | None, str]]) -> dict[str, AttackOutcome]:
    metrics: dict[str, dict[str, Any]] = {}
    states: dict[str, dict[str, dict[str, Any]]] = {}
    artefacts: dict[str, dict[str, str]] = {}
    for key, (section, attack, state, metric) in keys.items():
        value = row[key]
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
