"""Leaderboard rows from the results store: one row per ``done`` run with the DESIGN.md result keys.

``group_seeds`` aggregates runs that differ only in their seed: numeric columns become the mean, with
``<column>.sem`` (standard error of the mean, sample std / √n) and ``n`` beside them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any, TextIO

LEADING = [
    "run_id", "run_key", "status", "dataset", "model", "defense", "attack", "seed",
    "privacy.epsilon", "privacy.delta", "privacy.noise_multiplier", "privacy.sample_rate", "privacy.steps",
    "privacy.accountant", "utility.test_accuracy", "utility.train_accuracy",
    "comm.density", "comm.bytes_sparse", "comm.bytes_dense", "time.train_s", "time.attack_s",
]
TERMINAL = ["run_id", "dataset", "model", "defense", "attack", "seed", "privacy.epsilon", "utility.test_accuracy"]


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A store row as one flat record of scalar result keys (lists such as per-epoch curves are left out)."""
    flat = {"run_id": row["run_id"], "run_key": row["run_key"], "status": row["status"]}
    flat.update({k: v for k, v in row["metrics"].items() if not isinstance(v, (list, dict))})
    return flat


def group_key(row: dict[str, Any]) -> str:
    config = {k: v for k, v in row["config"].items() if k not in ("seed", "device")}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def group_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(group_key(row), []).append(flat_row(row))
    out = []
    for key, members in groups.items():
        agg: dict[str, Any] = {"group_key": key, "n": len(members),
                               "seeds": " ".join(str(m.get("seed")) for m in members)}
        columns = {c for m in members for c in m}
        for col in sorted(columns - {"run_id", "run_key", "seed"}):
            values = [m.get(col) for m in members]
            if all(_is_number(v) for v in values):
                agg[col] = statistics.fmean(values) if all(math.isfinite(v) for v in values) else values[0]
                finite = [v for v in values if math.isfinite(v)]
                agg[f"{col}.sem"] = statistics.stdev(finite) / math.sqrt(len(finite)) if len(finite) > 1 else 0.0
            else:
                distinct = {str(v) for v in values}
                agg[col] = values[0] if len(distinct) == 1 else "|".join(sorted(distinct))
        out.append(agg)
    return out


def ordered_columns(records: list[dict[str, Any]]) -> list[str]:
    present = {c for r in records for c in r}
    lead = [c for c in ["group_key", "n", "seeds", *LEADING] if c in present or c in LEADING]
    rest = sorted(present - set(lead))
    return lead + rest


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "inf" if value == math.inf else repr(value)
    return str(value)


def write_csv(records: list[dict[str, Any]], handle: TextIO) -> None:
    columns = ordered_columns(records)
    writer = csv.writer(handle)
    writer.writerow(columns)
    for record in records:
        writer.writerow([_cell(record.get(c)) for c in columns])


def format_table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "(no finished runs)"
    leak = sorted({c for r in records for c in r if c.startswith("leakage.") and not c.endswith(".sem")})
    columns = [c for c in (["n", *TERMINAL] if "n" in records[0] else TERMINAL) if c in ordered_columns(records)] + leak

    def show(v: Any) -> str:
        if isinstance(v, float):
            return "inf" if v == math.inf else f"{v:.4g}"
        return "" if v is None else str(v)

    cells = [[show(r.get(c)) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def leaderboard(rows: list[dict[str, Any]], seeds_grouped: bool = False) -> list[dict[str, Any]]:
    done = [r for r in rows if r["status"] == "done"]
    return group_seeds(done) if seeds_grouped else [flat_row(r) for r in done]


def write_leaderboard(rows: list[dict[str, Any]], out: Path, seeds_grouped: bool = False) -> int:
    records = leaderboard(rows, seeds_grouped)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        write_csv(records, handle)
    return len(records)
