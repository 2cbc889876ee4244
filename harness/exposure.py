"""Which records leak: per-record exposure from a membership game's per-example scores (``scores.csv``).

A member's **exposure** is the false-positive rate at which the attack flags it: the share of the game's
non-members that score at least as high. 0.001 means the attacker who accepts one false alarm in a thousand
non-members still names this record; scores of different attacks, runs and defenses are not comparable, these
rates are. From them:

- the records exposed at an FPR (their count is TPR × members at that FPR, the ROC's own point);
- the most exposed records of a run (lowest rate first), each with its source index, so the same image can be
  looked up in every run on that data;
- what a defense does to the records the undefended model exposes most: of ``none``'s k most exposed, how many
  the defended model still exposes at the FPR, and their median rate there.

Ties are counted pessimistically for the defender (a non-member scoring exactly a member's score counts as a
false alarm at that member's threshold), as the ROC curve's points are.
"""

from __future__ import annotations

import csv
import errno
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpeval.core.files import open_regular

# The largest scores file read (bytes): a game scores a few hundred thousand examples per target, ~40 bytes a line;
# a file far larger (a sparse file, a mistake) is refused by its size before anything is read.
MAX_SCORES_BYTES = 1 << 30


@dataclass(frozen=True)
class Exposure:
    """One member of the victim's game: where it comes from, its score and the FPR at which it is flagged."""

    index: int    # row in its data source (``source_index``)
    split: str    # ``train``: the victim's private pool
    label: int
    score: float
    fpr: float    # share of non-members scoring >= score


def exposures(scores_csv: str | Path, target: int = -1) -> list[Exposure]:
    """The members of ``target``'s game (-1: the victim), most exposed first. Raises ValueError on a file that
    is not a scores file or holds no member or no non-member of that target, OSError on one that is not a regular
    file (a FIFO would block, a device never end) or is larger than ``MAX_SCORES_BYTES``."""
    members, nonmember_scores = [], []
    with open_regular(scores_csv) as raw:
        size = os.fstat(raw.fileno()).st_size
        if size > MAX_SCORES_BYTES:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {MAX_SCORES_BYTES} a scores file may hold",
                          str(scores_csv))
        f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        reader = csv.DictReader(f)
        missing = {"target", "split", "index", "label", "member", "score"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{scores_csv}: not a scores file (no {', '.join(sorted(missing))} column)")
        for row in reader:
            if int(row["target"]) != target:
                continue
            if int(row["member"]):
                members.append(row)
            else:
                nonmember_scores.append(float(row["score"]))
    if not members or not nonmember_scores:
        raise ValueError(f"{scores_csv}: target {target} has {len(members)} members and {len(nonmember_scores)} "
                         f"non-members; exposure needs both")
    ordered = np.sort(np.asarray(nonmember_scores, dtype=float))
    n = len(ordered)
    out = []
    for row in members:
        score = float(row["score"])
        at_least = n - int(np.searchsorted(ordered, score, side="left")) if not math.isnan(score) else n
        out.append(Exposure(int(row["index"]), row["split"], int(row["label"]), score, at_least / n))
    return sorted(out, key=lambda e: (e.fpr, -e.score if not math.isnan(e.score) else math.inf, e.index))


def exposed(records: list[Exposure], fpr: float) -> list[Exposure]:
    """The records flagged at false-positive rate ``fpr`` (exposure ≤ fpr)."""
    return [e for e in records if e.fpr <= fpr]


@dataclass(frozen=True)
class Shrink:
    """Of a reference run's k most exposed records, what another run (same data, same members) does to them."""

    k: int
    fpr: float
    still_exposed: int     # of the k, how many the other run flags at ``fpr``
    median_fpr: float      # their median exposure in the other run (1.0: never ahead of a non-member)
    missing: int           # of the k, how many the other run did not score (another pool): then not comparable


def shrink(reference: list[Exposure], other: list[Exposure], k: int = 50, fpr: float = 0.01) -> Shrink:
    """``reference``'s k most exposed records looked up by source index in ``other``."""
    top = reference[:k]
    by_index = {(e.split, e.index): e for e in other}
    found = [by_index[(e.split, e.index)] for e in top if (e.split, e.index) in by_index]
    rates = sorted(e.fpr for e in found)
    median = float(np.median(rates)) if rates else float("nan")
    return Shrink(len(top), fpr, sum(r <= fpr for r in rates), median, len(top) - len(found))
