"""Exact resume: a run interrupted at a random step and run again with the same command on the same results
folder goes on from its last epoch checkpoint (or, with ``train.checkpoint_every``, its last within-epoch one)
and ends bit-identical (metrics and model.pt) to a run never interrupted — for every registered defense; a
real ``kill -9`` too. A damaged checkpoint is refused in one line saying how to start over."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.defenses import DEFENSES
from dpeval.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, BATCH = 3, 256  # digits: 1258 private examples, 4 steps per epoch


def command(defense, results, *extra):
    return ["run", "--defense", defense, "--attack", "none", "--epochs", str(EPOCHS), "--set",
            f"train.batch_size={BATCH}", "--quiet", "--json", "--results", str(results), *extra]


def comparable(metrics):
    """The metrics without timings, the run id written as RUN (in artefact paths too)."""
    return {k: str(v).replace(metrics["run_id"], "RUN") if k.startswith("artefacts.") else v
            for k, v in metrics.items() if not k.startswith("time.") and k != "run_id"}


def interrupt_at(monkeypatch, step):
    """The ``step``-th release of training raises KeyboardInterrupt (what Ctrl-C does), once."""
    from dpeval.engine import training

    real, calls = training.apply_release, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            monkeypatch.setattr(training, "apply_release", real)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "apply_release", interrupted)


def model_of(results, run_id):
    return torch.load(ResultStore(results).run_dir(run_id) / "model.pt", weights_only=True)


def same_model(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def check_resumes_bit_identical(tmp_path, monkeypatch, defense, *extra):
    reference = CliRunner().invoke(main, command(defense, tmp_path / "ref", *extra))
    assert reference.exit_code == 0, reference.output
    expected = json.loads(reference.stdout)

    steps_per_epoch = 1258 // BATCH
    stop_at = random.Random(defense).randrange(steps_per_epoch + 1, EPOCHS * steps_per_epoch + 1)
    interrupt_at(monkeypatch, stop_at)
    first = CliRunner().invoke(main, command(defense, tmp_path / "r", *extra))
    assert first.exit_code == 130, first.output
    (row,) = ResultStore(tmp_path / "r").rows()
    assert row["status"] == "failed"

    resumed = CliRunner().invoke(main, command(defense, tmp_path / "r", *extra))
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming run {row['run_id']} after epoch {(stop_at - 1) // steps_per_epoch}" in resumed.stderr
    got = json.loads(resumed.stdout)
    assert got["run_id"] == row["run_id"] and ResultStore(tmp_path / "r").get(row["run_id"])["status"] == "done"
    assert comparable(got) == comparable(expected)
    assert same_model(model_of(tmp_path / "r", got["run_id"]), model_of(tmp_path / "ref", expected["run_id"]))
    assert not (ResultStore(tmp_path / "r").run_dir(got["run_id"]) / "checkpoint.pt").exists()


@pytest.mark.parametrize("defense", DEFENSES.names())
def test_an_interrupted_run_resumes_bit_identical(defense, tmp_path, monkeypatch):
    check_resumes_bit_identical(tmp_path, monkeypatch, defense)


def test_a_resumed_run_reports_its_whole_training_time(tmp_path, monkeypatch):
    """time.train_s of a resumed run counts the interrupted process's part too (its checkpoint carries it)."""
    from dpeval import checkpoint

    interrupt_at(monkeypatch, 2 * (1258 // BATCH) + 1)  # the first step of the third epoch
    assert CliRunner().invoke(main, command("dpsgd", tmp_path)).exit_code == 130
    (row,) = ResultStore(tmp_path).rows()
    saved = checkpoint.load(ResultStore(tmp_path).run_dir(row["run_id"]) / "checkpoint.pt", row["run_key"])
    before = saved["loop"]["train_s"]
    assert before > 0 and saved["loop"]["epochs_done"] == 2
    resumed = CliRunner().invoke(main, command("dpsgd", tmp_path))
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["time.train_s"] > before


def test_resume_keeps_optimizer_schedule_and_attacked_states(tmp_path, monkeypatch):
    """Adam's moments, a cosine schedule, and the epoch snapshots an attack over the trajectory reads (R-GAP on
    one target at each of its three states: a snapshot that differed would change that state's reconstruction)."""
    check_resumes_bit_identical(tmp_path, monkeypatch, "rs", "--attack", "rgap", "--set", "attack.targets=1",
                                "--set", "train.optimizer=adam", "--set", "train.lr_schedule=cosine",
                                "--set", "train.lr=0.01")


def test_kill_9_then_the_same_command_resumes(tmp_path):
    """A real process killed with SIGKILL after its first checkpoint: the same command resumes it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    args = ["run", "--defense", "dpsgd", "--attack", "none", "--epochs", "6", "--set", "train.batch_size=32",
            "--quiet", "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "dpeval.cli", *args, "--results", str(tmp_path / "r")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "r").glob("runs/*/checkpoint.pt")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    (row,) = ResultStore(tmp_path / "r").rows()
    assert row["status"] == "running"

    resumed = CliRunner().invoke(main, [*args, "--results", str(tmp_path / "r")])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming run {row['run_id']}" in resumed.stderr
    reference = CliRunner().invoke(main, [*args, "--results", str(tmp_path / "ref")])
    got, expected = json.loads(resumed.stdout), json.loads(reference.stdout)
    assert comparable(got) == comparable(expected)
    assert same_model(model_of(tmp_path / "r", got["run_id"]), model_of(tmp_path / "ref", expected["run_id"]))


@pytest.mark.parametrize("damage", ["truncate", "flip", "other-key"])
def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path, monkeypatch, damage):
    interrupt_at(monkeypatch, 6)
    assert CliRunner().invoke(main, command("dpsgd", tmp_path)).exit_code == 130
    (row,) = ResultStore(tmp_path).rows()
    path = ResultStore(tmp_path).run_dir(row["run_id"]) / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        from dpeval import checkpoint

        checkpoint.save(path, "0" * 16, checkpoint.load(path, row["run_key"]))
    result = CliRunner().invoke(main, command("dpsgd", tmp_path))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert f"checkpoint {path} cannot be used" in line and f"rm {path}" in line
    assert ResultStore(tmp_path).get(row["run_id"])["status"] == "failed"  # untouched
    path.unlink()  # the way out the message names: the same command then starts over
    again = CliRunner().invoke(main, command("dpsgd", tmp_path))
    assert again.exit_code == 0 and "resuming" not in again.stderr


def test_a_sweep_point_with_shadow_models_resumes_bit_identical(tmp_path, monkeypatch):
    """A sweep interrupted while its point (a membership attack with shadow models) trains: the same sweep
    command resumes the point from its checkpoint and records what an uninterrupted sweep records."""
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"defense": {"name": "dpsgd"}, "attacks": ["lira"],
                                     "attack": {"shadows": 4, "mia_target": "shadows"},
                                     "train": {"epochs": EPOCHS, "batch_size": BATCH}}))

    def run_sweep(results):
        return CliRunner().invoke(main, ["sweep", str(sweep), "--quiet", "--results", str(results)])

    assert run_sweep(tmp_path / "ref").exit_code == 0
    steps_per_epoch = 1258 // BATCH
    interrupt_at(monkeypatch, random.Random("sweep").randrange(steps_per_epoch + 1, EPOCHS * steps_per_epoch + 1))
    assert run_sweep(tmp_path / "r").exit_code == 130
    (row,) = ResultStore(tmp_path / "r").rows()
    assert row["status"] == "failed"
    resumed = run_sweep(tmp_path / "r")
    assert resumed.exit_code == 0, resumed.output
    assert f"resume  {row['run_id']}" in resumed.stderr
    (got,), (expected,) = ResultStore(tmp_path / "r").rows(), ResultStore(tmp_path / "ref").rows()
    assert got["run_id"] == row["run_id"] and got["status"] == "done"
    assert comparable(got["metrics"]) == comparable(expected["metrics"])
    assert got["metrics"]["leakage.lira.auc"] == expected["metrics"]["leakage.lira.auc"]
    assert same_model(model_of(tmp_path / "r", got["run_id"]), model_of(tmp_path / "ref", expected["run_id"]))
    assert not (ResultStore(tmp_path / "r").run_dir(got["run_id"]) / "checkpoint.pt").exists()


def check_resumes_within_an_epoch(tmp_path, monkeypatch, defense, *extra):
    """Checkpoints after every step (``train.checkpoint_every=1``); interrupted at a random step inside an
    epoch, the same command resumes from the step before and ends bit-identical to a run never interrupted
    and never checkpointed within its epochs (so the checkpoints disturb nothing either)."""
    reference = CliRunner().invoke(main, command(defense, tmp_path / "ref", *extra))
    assert reference.exit_code == 0, reference.output
    expected = json.loads(reference.stdout)

    steps_per_epoch = 1258 // BATCH
    done = random.Random(f"within {defense} {extra}").choice(
        [s for s in range(1, EPOCHS * steps_per_epoch) if s % steps_per_epoch])
    interrupt_at(monkeypatch, done + 1)
    every = ("--set", "train.checkpoint_every=1")
    first = CliRunner().invoke(main, command(defense, tmp_path / "r", *extra, *every))
    assert first.exit_code == 130, first.output
    (row,) = ResultStore(tmp_path / "r").rows()

    resumed = CliRunner().invoke(main, command(defense, tmp_path / "r", *extra, *every))
    assert resumed.exit_code == 0, resumed.output
    epoch = done // steps_per_epoch
    assert (f"resuming run {row['run_id']} after epoch {epoch} of {EPOCHS} and step {done % steps_per_epoch} "
            f"of epoch {epoch + 1}") in resumed.stderr
    got = json.loads(resumed.stdout)
    assert got["run_id"] == row["run_id"] and got["run_key"] == expected["run_key"]  # the interval is not keyed
    assert comparable(got) == comparable(expected)
    assert same_model(model_of(tmp_path / "r", got["run_id"]), model_of(tmp_path / "ref", expected["run_id"]))
    assert not (ResultStore(tmp_path / "r").run_dir(got["run_id"]) / "checkpoint.pt").exists()


@pytest.mark.parametrize("defense", DEFENSES.names())
def test_a_run_interrupted_within_an_epoch_resumes_bit_identical(defense, tmp_path, monkeypatch):
    check_resumes_within_an_epoch(tmp_path, monkeypatch, defense)


@pytest.mark.parametrize("defense", ["dpsgd", "rs"])
def test_shuffled_batches_resume_within_an_epoch(defense, tmp_path, monkeypatch):
    """Fixed-size shuffled batches: the epoch's permutation comes back from the checkpoint."""
    check_resumes_within_an_epoch(tmp_path, monkeypatch, defense, "--set", "train.sampling=shuffle")


def test_within_epoch_checkpoints_keep_attacked_states(tmp_path, monkeypatch):
    """Adam, a cosine schedule and the epoch snapshots an attack over the trajectory reads, resumed mid-epoch."""
    check_resumes_within_an_epoch(tmp_path, monkeypatch, "rs", "--attack", "rgap", "--set", "attack.targets=1",
                                  "--set", "train.optimizer=adam", "--set", "train.lr_schedule=cosine",
                                  "--set", "train.lr=0.01")


def test_checkpoint_every_n_steps_within_each_epoch(tmp_path, monkeypatch):
    """``train.checkpoint_every=3`` with 4 steps per epoch: after step 3 of each epoch and at each epoch's end,
    nothing else; the default writes at epoch ends only."""
    from dpeval import checkpoint

    real, written = checkpoint.save, []

    def recording(path, run_key, payload):
        written.append(checkpoint.position(payload["loop"], EPOCHS))
        real(path, run_key, payload)

    monkeypatch.setattr(checkpoint, "save", recording)
    every = ("--set", "train.checkpoint_every=3")
    assert CliRunner().invoke(main, command("dpsgd", tmp_path / "a", *every)).exit_code == 0
    assert written == [text for e in range(EPOCHS) for text in
                       (f"epoch {e} of {EPOCHS} and step 3 of epoch {e + 1}", f"epoch {e + 1} of {EPOCHS}")]
    written.clear()
    assert CliRunner().invoke(main, command("dpsgd", tmp_path / "b")).exit_code == 0
    assert written == [f"epoch {e} of {EPOCHS}" for e in range(1, EPOCHS + 1)]


def test_a_run_interrupted_while_it_trains_shadows_keeps_the_finished_ones(tmp_path, monkeypatch):
    """Ctrl-C after the first group of shadows: the same command trains only the shadows left, ends with the
    metrics of an uninterrupted run, and clears the saved shadows once done."""
    from dpeval import checkpoint
    from dpeval.attacks import membership_game

    monkeypatch.setattr(membership_game, "SHADOW_GROUP", 2)
    args = ["run", "--defense", "dpsgd", "--attack", "lira", "--epochs", str(EPOCHS), "--set",
            f"train.batch_size={BATCH}", "--set", "attack.shadows=6", "--set", "attack.mia_target=shadows",
            "--quiet", "--json"]
    expected = json.loads(CliRunner().invoke(main, [*args, "--results", str(tmp_path / "ref")]).stdout)

    real, saved = checkpoint.ShadowStore.save, []

    def save(self, i, state):
        if len(saved) == 2:  # the second group has finished training: stop before it is saved
            monkeypatch.setattr(checkpoint.ShadowStore, "save", counting)
            raise KeyboardInterrupt
        saved.append(i)
        real(self, i, state)

    def counting(self, i, state):
        saved.append(i)
        real(self, i, state)

    monkeypatch.setattr(checkpoint.ShadowStore, "save", save)
    membership_game._POOLS.clear()  # the reference run's shadows, kept in memory for this process
    assert CliRunner().invoke(main, [*args, "--results", str(tmp_path / "r")]).exit_code == 130
    (row,) = ResultStore(tmp_path / "r").rows()
    assert len(list((ResultStore(tmp_path / "r").run_dir(row["run_id"]) / "shadows").rglob("shadow-*.pt"))) == 2
    resumed = CliRunner().invoke(main, [*args, "--results", str(tmp_path / "r")])
    assert resumed.exit_code == 0, resumed.output
    assert sorted(saved[2:]) == [2, 3, 4, 5]  # shadows 0 and 1 were loaded, not trained again
    got = json.loads(resumed.stdout)
    assert got["run_id"] == row["run_id"] and comparable(got) == comparable(expected)
    assert got["leakage.lira.auc"] == expected["leakage.lira.auc"]
    assert not (ResultStore(tmp_path / "r").run_dir(got["run_id"]) / "shadows").exists()
