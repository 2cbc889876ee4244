"""bench/benchmark.sh, the benchmark's runner, with a stand-in for dpeval that records its calls: per defense, its
attack sweep, then its utility at seeds 1 and 2 with no attack; then the one-run audit of every private row at
every ε — every sweep with the workers asked for, nothing rerun that a finished audit already holds, and one
phase alone when asked (the audits beside the sweeps)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = ["dpsgd", "rs", "random-freeze", "adaclip", "groupwise-all", "groupwise-layer", "gep"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the runner is a bash script")

FAKE = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
if [ "$1" = audit ]; then echo '{"audit": "stand-in"}'; fi
"""


def run_benchmark(tmp_path: Path, workers: str | None, *phases: str) -> tuple[list[str], Path]:
    fake = tmp_path / "dpeval"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = os.environ | {"DPEVAL": str(fake), "CALLS": str(tmp_path / "calls")}
    env.pop("WORKERS", None)
    if workers is not None:
        env["WORKERS"] = workers
    results = tmp_path / "results"
    subprocess.run(["bash", str(ROOT / "bench" / "benchmark.sh"), str(results), *phases], env=env, check=True,
                   capture_output=True, text=True)
    calls = tmp_path / "calls"
    return (calls.read_text().splitlines() if calls.exists() else []), results


def test_each_rows_attacks_then_its_utility_seeds_then_the_audits_with_the_workers_asked_for(tmp_path):
    calls, results = run_benchmark(tmp_path, "2")
    sweeps = [c for c in calls if c.startswith("sweep ")]
    audits = [c for c in calls if c.startswith("audit ")]
    assert len(sweeps) == 2 * (len(PRIVATE) + 1) and len(audits) == 3 * len(PRIVATE)
    assert calls == sweeps + audits  # every attack and utility sweep before the first audit
    files = [c.split()[1] for c in sweeps]  # a defense's attacks, then its utility, then the next defense
    assert all(c.endswith(f"--results {results} --workers 2 --quiet") for c in sweeps)
    assert files[:4] == ["configs/benchmark/fashionmnist/none.yaml", f"{results}/utility-recipes/none.yaml",
                         "configs/benchmark/fashionmnist/dpsgd.yaml", f"{results}/utility-recipes/dpsgd.yaml"]
    assert files[-1] == f"{results}/utility-recipes/gep.yaml"
    utility = yaml.safe_load((results / "utility-recipes" / "gep.yaml").read_text())
    assert utility["seeds"] == [1, 2] and utility["attacks"] == [] and "attack" not in utility
    audit_recipe = yaml.safe_load((results / "audits" / "rs-eps8.0.yaml").read_text())
    assert audit_recipe["privacy"]["epsilon"] == 8.0 and "attacks" not in audit_recipe
    assert any(c.startswith("audit --defense groupwise --scope run") for c in audits)
    assert json.loads((results / "audits" / "gep-eps1.0.json").read_text()) == {"audit": "stand-in"}


def test_one_worker_by_default_and_a_finished_audit_is_not_rerun(tmp_path):
    calls, _ = run_benchmark(tmp_path, None)
    assert all("--workers 1 " in c for c in calls if c.startswith("sweep "))
    (tmp_path / "calls").unlink()
    calls, _ = run_benchmark(tmp_path, None)
    assert not [c for c in calls if c.startswith("audit ")]  # every audit's JSON is there: none run again


def test_one_phase_runs_alone_and_an_unknown_phase_is_refused(tmp_path):
    calls, _ = run_benchmark(tmp_path, None, "audits")
    assert len(calls) == 3 * len(PRIVATE) and all(c.startswith("audit ") for c in calls)
    (tmp_path / "calls").unlink()
    calls, _ = run_benchmark(tmp_path, None, "utility attacks")
    assert [c.split()[1].split("/")[-2] for c in calls] == ["fashionmnist", "utility-recipes"] * 8  # in that order
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_benchmark(tmp_path, None, "shadows")
    assert failed.value.returncode == 2 and "unknown phase 'shadows'" in failed.value.stderr


def test_the_informed_phase_sweeps_every_private_row_with_that_attack_alone(tmp_path):
    calls, results = run_benchmark(tmp_path, None, "informed")
    assert [c.split()[1] for c in calls] == [f"{results}/informed-recipes/{d}.yaml" for d in PRIVATE]
    recipe = yaml.safe_load((results / "informed-recipes" / "gep.yaml").read_text())
    source = yaml.safe_load((ROOT / "configs" / "benchmark" / "fashionmnist" / "gep.yaml").read_text())
    assert recipe["attacks"] == ["informed-recon"] and "attack" not in recipe and recipe["seeds"] == [0]
    assert {k: v for k, v in recipe.items() if k not in ("attacks", "seeds")} == \
        {k: v for k, v in source.items() if k not in ("attacks", "attack", "seeds")}  # the same victim's recipe



def test_the_audits_save_their_scores_and_the_input_phase_audits_dpsgd_with_input_canaries(tmp_path):
    calls, results = run_benchmark(tmp_path, None, "audits")
    assert all(f"--save-scores {results}/audits/" in c for c in calls)  # every score kept for one_run_bounds
    (tmp_path / "calls").unlink()
    calls, results = run_benchmark(tmp_path, None, "audits-input")
    assert len(calls) == 3 and all("--canary-kind input" in c and "--defense dpsgd" in c for c in calls)
    recipe = yaml.safe_load((results / "audits-input" / "dpsgd-eps8.0.yaml").read_text())
    assert recipe["privacy"]["epsilon"] == 8.0 and "attacks" not in recipe
    assert json.loads((results / "audits-input" / "dpsgd-eps1.0.json").read_text()) == {"audit": "stand-in"}
