"""The real Fashion-MNIST files where Debian's package ``dataset-fashion-mnist`` installs them (``make test``
installs it where it can, root with apt): read as shipped, gzip-compressed idx, with no data flag at all.
Skipped, and said so, on a machine without the package."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpeval.core.datasets import load_task
from dpeval.core.settings import DataConfig
from tests.helpers import needs_fashionmnist

pytestmark = needs_fashionmnist


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    # data.root names an empty folder: the files are found in the system location, never copied.
    root = tmp_path_factory.mktemp("data")
    return load_task(dataclasses.replace(DataConfig(), name="fashionmnist", root=str(root), public_fraction=0.0)), root


def test_real_fashionmnist_has_its_published_sizes_and_balance(task) -> None:
    task, root = task
    assert not any(root.iterdir())
    assert len(task.train) == 60_000 and len(task.test) == 10_000 and len(task.public) == 0
    assert task.shape == (1, 28, 28) and task.num_classes == 10
    # Zalando's splits are exactly balanced: 6,000 training and 1,000 test images per class.
    assert torch.bincount(task.train.y, minlength=10).tolist() == [6_000] * 10
    assert torch.bincount(task.test.y, minlength=10).tolist() == [1_000] * 10
    x = task.train.x
    assert x.dtype == torch.float32 and float(x.min()) == 0.0 and float(x.max()) == 1.0
    # The mean intensity of Fashion-MNIST's training images is 0.2860 (72.94 / 255): real data, not noise.
    assert abs(float(x.mean()) - 0.2860) < 1e-3


def test_real_fashionmnist_trains_a_step_with_no_data_flags(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from dpeval.cli import main

    result = CliRunner().invoke(main, ["run", "--dataset", "fashionmnist", "--model", "dpcnn-small", "--defense",
                                       "rs", "--epochs", "1", "--set", "data.max_train=512", "--set",
                                       "train.batch_size=256", "--results", str(tmp_path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["dataset"] == "fashionmnist" and metrics["privacy.steps"] == 2
    assert metrics["utility.test_accuracy"] > 0.1  # one epoch of DP training on real images beats chance


def test_real_fashionmnist_victim_game_resolves_tpr_at_a_tenth_of_a_percent(tmp_path) -> None:
    """The membership game on real data: with 1,000 private examples the test split supplies as many
    non-members, so the population is twice the pool (every example IN for half the shadows) and TPR at
    0.1 % FPR rests on a real false positive instead of being unresolvable (digits: 359 non-members)."""
    import json

    from click.testing import CliRunner

    from dpeval.cli import main

    result = CliRunner().invoke(main, ["run", "--dataset", "fashionmnist", "--model", "dpcnn-small", "--defense",
                                       "none", "--attack", "lira", "--epochs", "1", "--set", "data.max_train=1000",
                                       "--set", "attack.shadows=4", "--results", str(tmp_path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert m["leakage.lira.n_members"] == 1000 and m["leakage.lira.n_nonmembers"] == 1000
    assert m["leakage.lira.game_in_fraction"] == 0.5
    assert m["leakage.lira.tpr_at_0.1pct_fpr"] is not None and "leakage.lira.tpr_at_0.1pct_fpr_note" not in m
    assert 0.0 <= m["leakage.lira.tpr_at_0.1pct_fpr"] <= m["leakage.lira.tpr_at_1pct_fpr"] <= 1.0
