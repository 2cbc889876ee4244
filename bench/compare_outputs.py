"""Four CLI runs with ``--json`` whose outputs should not change under a refactoring: run it before and after
and diff the two (what varies between identical runs is left out: run ids, times, paths, dates, versions).
LiRA plays the victim game with 5 shadows, the fewest the digits pool (1258 members, 359 held out) takes.

    .venv/bin/python bench/compare_outputs.py > /tmp/before.json   # … change the code …
    .venv/bin/python bench/compare_outputs.py > /tmp/after.json && diff /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUNS = [
    ["--defense", "dpsgd", "--attack", "loss", "--set", "train.epochs=2"],
    ["--defense", "rs", "--attack", "ig", "--set", "train.epochs=2", "--set", "attack.ig.iterations=20"],
    ["--defense", "gep", "--set", "train.epochs=1"],
    ["--defense", "adaclip", "--attack", "lira", "--set", "attack.lira.shadows=5", "--set", "train.epochs=1"],
]
VARYING = re.compile(r"run_id|time|_s$|path|folder|date|started|finished|version|threads|artefact|log")


def stable(value: Any) -> Any:
    """``value`` without the keys that differ between two identical runs."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if not VARYING.search(k)}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def main() -> None:
    dpeval = Path(sys.executable).with_name("dpeval")
    outputs = []
    with tempfile.TemporaryDirectory() as results:
        for args in RUNS:
            command = [str(dpeval), "run", *args, "--results", results, "--quiet", "--json"]
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if done.returncode != 0:
                sys.exit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr}")
            outputs.append({"args": args, "output": stable(json.loads(done.stdout))})
    print(json.dumps(outputs, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
