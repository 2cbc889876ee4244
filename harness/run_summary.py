"""The text ``dpeval run`` prints for a run: accuracy, privacy, communication and time, then each attack's
headline, picture, per-state table and other metrics (``--json`` prints the stored keys instead)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def format_delta(delta: float) -> str:
    """δ with three significant digits, or as many more as it takes not to print 0 or 1 for a δ strictly
    between them (0.999999 is not 1)."""
    for digits in range(3, 18):
        text = format(delta, f".{digits}g")
        if not 0 < delta < 1 or 0 < float(text) < 1:
            return text
    return repr(delta)


def format_run(m: dict[str, Any], results: str | Path | None = None) -> str:
    """The run's summary: accuracy, privacy, communication, time, then one headline line per attack
    (``format_attack``); artefact paths are shown under ``results`` (the results folder)."""
    def num(v: Any, fmt: str = ".4f") -> str:
        return "inf" if v == math.inf else format(v, fmt)

    lines = [
        f"run {m['run_id']}  ({m['dataset']} / {m['model']} / defense {m['defense']} / attack {m['attack']}, "
        f"seed {m['seed']})",
        f"  test accuracy   {num(m['utility.test_accuracy'])}   train accuracy {num(m['utility.train_accuracy'])}",
        f"  privacy         ε = {num(m['privacy.epsilon'], '.3f')}  δ = {format_delta(m['privacy.delta'])}  "
        f"σ = {num(m['privacy.noise_multiplier'], '.4f')}  q = {m['privacy.sample_rate']:.4g}  "
        f"steps = {m['privacy.steps']}  ({m['privacy.accountant']}, {m['privacy.sampling']} sampling)",
        f"  communication   density {m['comm.density']:.3f} (mean fraction of the model's trainable coordinates "
        f"a training step releases)  {m['comm.bytes_sparse']:.0f} B sparse / "
        f"{m['comm.bytes_dense']:.0f} B dense per step" if m.get("comm.density") is not None else
        f"  weights         {m.get('model.weights_sha256', '')[:16]}… trained elsewhere (model.weights): nothing "
        f"trained or released here; ε is the recipe's as given",
        f"  time            train {m['time.train_s']:.1f} s  attacks {m['time.attack_s']:.1f} s",
    ]
    if m.get("defaults", "none") != "none":
        lines.append(f"  defaults        {m['dataset']}'s recipe for what the run did not set: {m['defaults']}")
    from dpeval.headlines import attacks_in

    for attack in attacks_in(m):
        lines += format_attack(m, attack, results)
    return "\n".join(lines)


def format_attack(m: dict[str, Any], attack: str, results: str | Path | None) -> list[str]:
    """One attack: its headline (metric, baseline or chance, verdict, worst state), its picture, the
    per-state table of an attack over several model states, and its other metrics. Configuration
    echoes (``attack.<name>.<param>``) and artefacts stay in the JSON and the store."""
    from dpeval.headlines import fmt, read, smallest_p, states_of
    from dpeval.results import AttackOutcome, attack_outcomes

    outcome = attack_outcomes(m).get(attack) or AttackOutcome(attack)
    head = read(outcome)
    lines = [f"  {attack:<15} {head.sentence() if head else 'no headline declared'}"]
    floor = smallest_p(m, attack)
    if floor:
        lines.append(f"  {'':<15} {floor}")
    pictures = sorted(v for v in outcome.artefacts.values() if str(v).endswith(".png"))
    for picture in pictures[:1]:
        lines.append(f"  {'':<15} picture: {Path(results) / picture if results else picture}")
    mine = outcome.metrics if outcome.error is None else {"error": outcome.error}
    states = states_of(outcome)
    shown = {"state", "p_value", "defense_rate"} | ({head.metric} if head else set())  # metric names
    if states:
        metric = head.metric if head else "psnr"
        columns = [c for c in ("defense_rate", metric, "ssim", "wins", "p_value")
                   if any(c in outcome.states[s] for s in states)]
        names = {"defense_rate": "rate", "wins": "targets beating guess", "p_value": "p (state)"}
        table = [["state", *(names.get(c, c) for c in columns)]]
        table += [[s, *(fmt(outcome.states[s].get(c), 4) for c in columns)] for s in states]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines += [f"  {'':<15} " + "  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in table]
        shown |= {*columns, "epoch"}  # the worst state's row says them
    empty = {metric for metric, v in mine.items() if v is None or v == ""}
    shown |= empty | {f"{k}_note" for k in empty}  # a null metric and the note saying why
    rest = [f"{NAMES.get(metric, metric)} {fmt(v)}" for metric, v in sorted(mine.items())
            if metric not in shown and not isinstance(v, (list, dict))]
    for start in range(0, len(rest), 4):
        lines.append(f"  {'':<15} " + "   ".join(rest[start:start + 4]))
    return lines


NAMES = {  # an attack's metrics whose bare name says too little
    "density": "density of the attacked release (fraction of coordinates sent)",
    "noise_std": "noise std of the attacked release",
}
