"""The transformers end to end: the synthetic token dataset, the GPT-style model under every kind of defense,
and the attacks on them (IG runs on the ViT; R-GAP refuses both with one line)."""

import json

import pytest
import torch
from click.testing import CliRunner

from dpeval.cli import main
from dpeval.core.datasets import load_task
from dpeval.core.settings import DataConfig, TokensConfig


def _run(tmp_path, *args):
    result = CliRunner().invoke(main, ["run", *args, "--results", str(tmp_path), "--json", "--quiet"])
    return result


def test_token_dataset_is_deterministic_and_holds_token_ids():
    cfg = DataConfig(name="tokens", tokens=TokensConfig(length=12, vocab=9, classes=3, size=300))
    a, b = load_task(cfg), load_task(cfg)
    other = load_task(DataConfig(name="tokens", split_seed=1, tokens=cfg.tokens))
    assert torch.equal(a.train.x, b.train.x) and not torch.equal(a.train.x, other.train.x[: len(a.train.x)])
    assert a.shape == (1, 1, 12) and a.vocab == 9 and a.mean == (0.0,) and a.std == (1.0,)
    x = a.train.x
    assert torch.equal(x, x.round()) and x.min() >= 0 and x.max() <= 8 and x.max() > 4
    assert set(a.train.y.tolist()) == {0, 1, 2}


def test_too_few_token_sequences_are_refused(tmp_path):
    result = _run(tmp_path, "--dataset", "tokens", "--set", "data.tokens.size=2", "--attack", "none")
    assert result.exit_code == 2 and "data.tokens.size" in result.output


@pytest.mark.parametrize("defense,engine", [("none", "auto"), ("dpsgd", "auto"), ("groupwise", "auto"),
                                            ("dpsgd", "func")])
def test_gpt_trains_on_token_sequences_with_every_kind_of_defense(tmp_path, defense, engine):
    args = ["--dataset", "tokens", "--defense", defense, "--attack", "none", "--epochs", "3",
            "--set", "data.tokens.size=600", "--set", "model.width=32", "--set", f"train.engine={engine}"]
    if defense == "groupwise":
        args += ["--set", "defense.groups=boundary:1"]
    result = _run(tmp_path, *args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model"] == "gpt" and out["train.engine_used"] == ("lean" if engine == "auto" else "func")
    if defense == "none":
        assert out["utility.test_accuracy"] > 0.6  # 4 classes: chance is 0.25
    else:
        assert out["utility.test_accuracy"] > 0.3


@pytest.mark.parametrize("args", [["--model", "vit", "--dataset", "digits"], ["--dataset", "tokens"]])
def test_rgap_refuses_the_transformers_in_one_line(tmp_path, args):
    result = CliRunner().invoke(main, ["run", *args, "--attack", "rgap", "--results", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "rgap cannot invert" in lines[0]


def test_ig_attacks_the_vit(tmp_path):
    result = _run(tmp_path, "--model", "vit", "--dataset", "digits", "--defense", "dpsgd", "--attack", "ig",
                  "--epochs", "1", "--set", "model.width=16", "--set", "data.max_train=128",
                  "--set", "attack.ig.iterations=5")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["train.engine_used"] == "lean" and out["leakage.ig.mse"] == out["leakage.ig.mse"]  # not NaN


def test_a_text_file_trains_the_gpt_on_next_byte_classes(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 60)
    task = load_task(DataConfig(name="textfile", root=str(text), tokens=TokensConfig(length=8)))
    assert task.vocab == 256 and task.shape == (1, 1, 8) and task.num_classes == 256
    first = task.train.source_index[0].item() * 9
    assert task.train.x[0].flatten().tolist() == list(text.read_bytes()[first:first + 8])
    assert task.train.y[0].item() == text.read_bytes()[first + 8]
    result = _run(tmp_path, "--dataset", "textfile", "--set", f"data.root={text}", "--set", "data.tokens.length=8",
                  "--defense", "groupwise", "--attack", "none", "--epochs", "1", "--set", "model.width=16")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["train.engine_used"] == "lean"
    missing = _run(tmp_path, "--dataset", "textfile", "--set", f"data.root={tmp_path / 'nope.txt'}", "--attack", "none")
    assert missing.exit_code == 2 and "data.root" in missing.output


def test_lira_finds_an_overfit_vits_members(tmp_path):
    """LiRA on the ViT (shadows trained vectorised, like the victim). Overfit setting: 200 digits, 60 epochs of
    Adam, train accuracy 1.0. Measured AUC (8 shadows) at seeds 0/1/2: 0.708 / 0.731 / 0.753; the bound 0.62
    sits 5 spreads below their mean, well above chance."""
    result = _run(tmp_path, "--model", "vit", "--dataset", "digits", "--defense", "none", "--attack", "lira",
                  "--epochs", "60", "--set", "model.width=32", "--set", "data.max_train=200",
                  "--set", "attack.shadows=8", "--set", "train.optimizer=adam", "--set", "train.lr=0.003")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model"] == "vit" and out["leakage.lira.game_in_fraction"] == 0.5
    assert out["leakage.lira.auc"] > 0.62 and out["leakage.lira.verdict"] == "leaks"
