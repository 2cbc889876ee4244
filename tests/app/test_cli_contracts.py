"""Contracts of the commands under hostile input: what is refused is refused before any work (exit 2, nothing
written), and what is accepted runs to the end.

- ``audit --scope run``: every accepted ``--canaries`` is split into guesses that fit (k+ + k− ≤ m, = m for the
  rule that guesses on every canary); an unusable one is refused before training.
- ``run``: exit 2 means nothing was written, also for what only the reference run (``--reference``) or an attack
  on given weights (``--weights``) needs: it is checked before the main run trains.
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpeval.audit import run as run_audit
from dpeval.audit.run import GUESS_RULES, guess_counts
from dpeval.cli import main
from dpeval.store import ResultStore

# ---------------------------------------------------------------------------------------------------
# audit --scope run: the canaries' guessing rules


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 10, 11, 15, 19, 99, 101, 1001, 1003])
def test_every_guessing_rule_fits_the_canaries(m):
    """Each rule guesses on at least one and at most m canaries, close to its fractions of m; the rule that
    guesses on every canary (half in, half out) makes exactly m guesses, also for m ≡ 3 (mod 4) where rounding
    each half on its own made m + 1."""
    for (f_in, f_out), (k_in, k_out) in zip(GUESS_RULES, guess_counts(m)):
        assert 1 <= k_in + k_out <= m and k_in >= 0 and k_out >= 0, (m, f_in, f_out, k_in, k_out)
        assert abs(k_in - f_in * m) <= 1 and abs(k_out - f_out * m) <= 1, (m, f_in, f_out, k_in, k_out)
        if f_in + f_out == 1:
            assert k_in + k_out == m


def test_every_canary_count_up_to_a_thousand_splits():
    for m in range(2, 1001):
        assert all(k_in + k_out <= m for k_in, k_out in guess_counts(m)), m


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.timeout(300)
def test_a_run_audit_with_three_canaries_finishes():
    """End to end at the smallest settings: m = 3 trained to the end and then crashed on 2 + 2 guesses."""
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--canaries", "3", "--quiet", "--json",
                    "--set", "train.epochs=1")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["audit.canaries"] == 3 and data["audit.guesses"] <= 3
    assert all(t["guesses"] <= 3 for t in data["audit.tests"])


@pytest.mark.parametrize("args", [["--canaries", "1"], ["--canaries", "0"], ["--canaries", "-4"],
                                  ["--canaries", "100000"], ["--canaries", "1", "--canary-kind", "input"],
                                  ["--canaries", "100000000", "--canary-kind", "input"]])
def test_unusable_canaries_are_refused_before_training(args, monkeypatch):
    """Fewer than two, more gradient canaries than trainable parameters, more input canaries than private
    examples (10⁸ noise images: a memory error with a traceback before)."""
    def no_training(*a, **k):
        raise AssertionError("trained before refusing --canaries")

    monkeypatch.setattr(run_audit, "train", no_training)
    result = invoke("audit", "--defense", "dpsgd", "--scope", "run", "--quiet", *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: --canaries: ") and "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------------
# run: exit 2, nothing written


def refused(results: Path, *args: str) -> str:
    """``dpeval run ARGS`` exits 2 with one line on stderr, which it returns, and writes nothing in ``results``."""
    result = invoke("run", *args, "--quiet", "--results", str(results))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: ") and "Traceback" not in result.output
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))
    return line


def test_a_reference_that_cannot_reach_its_epsilon_is_refused_before_the_main_run(tmp_path):
    """The non-private main run has no ε to reach; the DP-SGD reference does. It used to be trained and recorded
    first, then exit 2 without a word about it."""
    line = refused(tmp_path / "r", "--defense", "none", "--reference", "dpsgd", "--epsilon", "1e9", "--epochs", "1",
                   "--attack", "none")
    assert "--reference dpsgd: privacy.epsilon" in line


def test_an_interrupted_reference_with_a_damaged_checkpoint_is_refused_before_the_main_run(tmp_path):
    """The reference would resume from its checkpoint, which cannot be loaded: refused before the main run, the
    folder left as it was."""
    from dpeval.config import build_spec
    from dpeval.reference import reference_spec

    store = ResultStore(tmp_path)
    wanted = reference_spec(build_spec({"defense": {"name": "none"}, "train": {"epochs": 1}}), "dpsgd")
    run_id = store.begin(wanted.run_key, wanted.canonical())
    store.fail(run_id, "interrupted")
    (store.run_dir(run_id) / "checkpoint.pt").write_bytes(b"half a checkpoint")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = invoke("run", "--defense", "none", "--reference", "dpsgd", "--epochs", "1", "--quiet",
                    "--results", str(tmp_path))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("dpeval: error: --reference dpsgd: checkpoint ") and "cannot be used" in line
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_reference_that_can_run_still_runs_after_the_main_run(tmp_path):
    result = invoke("run", "--defense", "none", "--reference", "dpsgd", "--epochs", "1", "--attack", "none", "--quiet",
                    "--set", "data.name=synthetic", "--set", "data.synthetic.size=200", "--set", "train.batch_size=64",
                    "--results", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert "dpsgd" in json.loads(result.stdout)["reference"]
    rows = ResultStore(tmp_path).rows("done")
    assert [r["metrics"]["defense"] for r in rows] == ["none", "dpsgd"]  # the main run first


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A state dict of the default digits model (untrained: only its names and shapes matter here)."""
    import torch

    from dpeval.config import build_spec
    from dpeval.runner import prepare

    path = tmp_path_factory.mktemp("weights") / "model.pt"
    torch.save(prepare(build_spec({"defense": {"name": "none"}})).model.state_dict(), path)
    return path


@pytest.mark.parametrize("args,field", [
    (["--attack", "loss", "--set", "data.test_fraction=0"], "data.test_fraction"),
    (["--attack", "ig", "--set", "attack.at=final", "--set", "attack.targets=1000000"], "attack.targets"),
], ids=["game-without-held-out-data", "more-targets-than-examples"])
def test_an_attack_on_given_weights_is_checked_before_anything_is_written(tmp_path, weights, args, field):
    """With --weights the attacks' data and model checks were skipped: the run was recorded and its attack failed
    (exit 1) instead of being refused."""
    line = refused(tmp_path / "r", "--defense", "none", "--weights", str(weights), *args)
    assert f"error: {field}" in line
