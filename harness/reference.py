"""Deltas against a reference run: how much better or worse than no defense (``none``) or plain DP-SGD
(``dpsgd``) a run is, on accuracy and on each attack's headline.

A reference *matches* a run when it is a ``done`` run of the reference defense with the same data, model,
training settings and seed (and, for a private reference, the same privacy settings: a non-private run
ignores them). An attack's delta is printed only when the reference ran that attack with the same
parameters. ``dpeval run --reference NAME`` runs the reference when no matching one is stored;
without the option, ``run`` prints deltas against whichever references are already in the results folder.
"""

from __future__ import annotations

from typing import Any

import click

from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.spec import RunSpec
from dpeval.headlines import attacks_in, fmt, read, unit_of
from dpeval.results import RunResult

REFERENCES = ("none", "dpsgd")
SAME = ("data", "model", "train", "seed")


def reference_spec(spec: RunSpec, defense: str) -> RunSpec:
    """``spec`` with the reference defense at its default parameters (the same attacks and settings)."""
    raw = {k: v for k, v in spec.canonical().items() if k != "defense"}
    raw["defense"] = {"name": defense}
    return build_spec(raw)


def _matches(config: dict[str, Any], wanted: dict[str, Any], private: bool) -> bool:
    keys = SAME + (("privacy",) if private else ())
    return all(config.get(k) == wanted.get(k) for k in keys)


def find_reference(runs: list[RunResult], spec: RunSpec, defense: str) -> RunResult | None:
    """The latest ``done`` run of ``defense`` matching ``spec``; among them, one that ran every attack of
    ``spec`` with the same parameters when there is one."""
    wanted = reference_spec(spec, defense).canonical()
    private = defense != "none"
    found = [r for r in runs if r.status == "done" and (r.config.get("defense") or {}).get("name") == defense
             and _matches(r.config, wanted, private)]
    complete = [r for r in found if covers(r, wanted)]
    return (complete or found or [None])[-1]


def covers(run: RunResult, wanted: dict[str, Any]) -> bool:
    """Whether ``run`` ran every attack of the canonical configuration ``wanted`` with its parameters."""
    return all(run.config.get("attack", {}).get(a) == p for a, p in wanted["attack"].items())


def deltas(metrics: dict[str, Any], reference: RunResult) -> dict[str, Any]:
    """This run (its result keys) minus the reference run: test accuracy and each attack headline both measured
    (the reference's attack parameters are the run's own)."""
    ref = reference.flat()
    out: dict[str, Any] = {"run_id": reference.run_id, "defense": reference.defense}
    mine, theirs = metrics.get("utility.test_accuracy"), ref.get("utility.test_accuracy")
    if mine is not None and theirs is not None:
        out["utility.test_accuracy"] = mine - theirs
    for attack in attacks_in(metrics):
        same = all(ref.get(k) == v for k, v in metrics.items() if k.startswith(f"attack.{attack}."))
        a, b = read(metrics, attack), read(ref, attack)
        if same and a is not None and b is not None and a.value is not None and b.value is not None:
            out[a.column] = a.value - b.value
    return out


def format_deltas(metrics: dict[str, Any], reference: RunResult) -> list[str]:
    """Printout lines: the reference, then each delta beside both values."""
    ref = reference.flat()
    delta = deltas(metrics, reference)
    lines = [f"  vs {reference.defense:<12} run {reference.run_id} (same data, model, training and seed)"]
    if "utility.test_accuracy" in delta:
        lines.append(f"  {'':<15} test accuracy {metrics['utility.test_accuracy']:.4f} vs "
                     f"{ref['utility.test_accuracy']:.4f}: Δ {delta['utility.test_accuracy']:+.4f}")
    for attack in attacks_in(metrics):
        head, other = read(metrics, attack), read(ref, attack)
        if head is None or head.column not in delta:
            continue
        unit = unit_of(head.label)
        name = head.label[: head.label.rfind("(")].strip() if unit else head.label
        change = delta[head.column]
        direction = "same" if change == 0 else "more" if (change > 0) == head.higher_leaks else "less"
        lines.append(f"  {'':<15} {name} {fmt(head.value)} vs {fmt(other.value)}{f' {unit}' if unit else ''}: "
                     f"Δ {delta[head.column]:+.4g}{f' {unit}' if unit else ''} ({direction} leakage; verdicts "
                     f"{head.verdict or 'none'} vs "
                     f"{other.verdict or 'none'})")
    return lines


def reference_to_run(spec: Any, store: Any, asked: str | None) -> Any:
    """The configuration of the reference ``--reference`` asks for when ``store`` holds no matching run of it with
    the same attacks, else None. Called before the main run: what only the reference needs (an ε that its
    defense must reach, its defense's rules) is checked here, so that exit 2 still means nothing was written."""
    from dpeval.runner import prepare, resumable

    if asked is None or asked == spec.defense_name:
        return None
    wanted = reference_spec(spec, asked)
    found = find_reference(store.results("done"), spec, asked)
    if found is not None and covers(found, wanted.canonical()):
        return None
    try:
        prepare(wanted)  # every check `run` makes before training
        resumable(wanted, store)  # an interrupted reference's checkpoint must load
    except ConfigError as exc:
        raise ConfigError(f"--reference {asked}: {exc}") from None
    return wanted


def reference_runs(spec: Any, store: Any, to_run: Any, progress: bool) -> list[RunResult]:
    """The stored reference runs (``none``, ``dpsgd``) that match ``spec``, after running ``to_run``
    (``reference_to_run``) when given."""
    from dpeval.runner import execute

    if to_run is not None:
        click.echo(f"dpeval: running the reference: --defense {to_run.defense_name} with the same settings", err=True)
        execute(to_run, store, progress=progress)
    runs = store.results("done")
    found = (find_reference(runs, spec, defense) for defense in REFERENCES if defense != spec.defense_name)
    return [run for run in found if run is not None]
