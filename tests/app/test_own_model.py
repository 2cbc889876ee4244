"""``dpeval.run(settings, model=factory)``: a user's own network trained and attacked in-process, recorded as
``python:<its name>`` (a stored configuration naming it answers in one line without the function), every failure
of the function one ConfigError line naming it, and the engine used and why in the result and in the API run's
``log.txt`` — without handing the run's INFO lines to the caller's own logging."""

from __future__ import annotations

import logging

import pytest
import torch
import yaml
from torch import nn

import dpeval
from dpeval.core.errors import ConfigError
from dpeval.core.registry import MODELS

SETTINGS = {"data": {"name": "digits", "max_train": 100}, "defense": "dpsgd",
            "train": {"epochs": 1, "batch_size": 25}}


def tiny_cnn(in_shape, num_classes):
    c, h, w = in_shape
    return nn.Sequential(nn.Conv2d(c, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * (h - 2) * (w - 2), num_classes))


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_factory_is_trained_attacked_and_recorded_by_name(tmp_path):
    caller = Recorder()  # a caller's own logging on the root logger: it gets no more than it did before
    logging.getLogger().addHandler(caller)
    try:
        result = dpeval.run({**SETTINGS, "attacks": ["loss"]}, model=tiny_cnn, results=tmp_path / "runs")
    finally:
        logging.getLogger().removeHandler(caller)
    assert result.status == "done" and result.model == "python:tiny_cnn" and result.attacks["loss"].verdict
    assert result.extra["train.engine_used"] == "lean" and "book-keeping" in result.extra["train.engine_reason"]
    assert not [r for r in caller.records if r.name == "dpeval" and r.levelno < logging.WARNING]
    assert "per-sample engine: lean" in (result.folder / "log.txt").read_text()
    assert "python:tiny_cnn" not in MODELS  # registered for the call only
    stored = dpeval.load_result(tmp_path / "runs", result.run_id)
    assert stored.model == "python:tiny_cnn" and stored.extra["train.engine_reason"] == result.extra[
        "train.engine_reason"]
    config = yaml.safe_load((result.folder / "config.yaml").read_text())
    assert config["model"]["name"] == "python:tiny_cnn"
    config.pop("defaults")
    with pytest.raises(ConfigError, match=r"^model\.name: 'python:tiny_cnn' is a model a Python caller passed .*"
                                          r"model=tiny_cnn"):
        dpeval.configure(config)
    again = dpeval.run(config, model=tiny_cnn, results=tmp_path / "runs")  # the stored settings, the same function
    assert again.extra["run_key"] == result.extra["run_key"]


def test_a_run_spec_takes_a_factory_and_the_logs_of_a_plain_run_say_why():
    spec = dpeval.configure(SETTINGS, train__engine="func")
    result = dpeval.run(spec, model=tiny_cnn)
    assert result.model == "python:tiny_cnn" and result.extra["train.engine_reason"] == "as configured"
    log = (result.folder / "log.txt").read_text()
    assert "per-sample engine: func (train.engine=func" in log and "epoch 1/1 test accuracy" in log


def raises(in_shape, num_classes):
    raise ValueError("no\nnetwork today")


def returns_a_tensor(in_shape, num_classes):
    return torch.zeros(1)


def wrong_width(in_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(10, num_classes))


def too_few_logits(in_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))


def with_batch_norm(in_shape, num_classes):
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(72, num_classes))


@pytest.mark.parametrize("factory, message", [
    (raises, r"^model: raises\(in_shape=\(1, 8, 8\), num_classes=10\) raised ValueError: no network today$"),
    (returns_a_tensor, r"^model: returns_a_tensor\(.*\) must return a torch\.nn\.Module, returned Tensor$"),
    (wrong_width, r"^model: the network wrong_width\(.*\) built fails on 2 inputs of shape \(1, 8, 8\) \(RuntimeError"),
    (too_few_logits, r"^model: the network too_few_logits\(.*\) built returns \(2, 3\) for 2 inputs; .*\(2, 10\)"),
    (with_batch_norm, r"^model\.name: 1\.1 is a BatchNorm2d"),
    (lambda shape, n: nn.Linear(64, n), r"^model: give a named function or class .*'<lambda>' names none$"),
    (nn.Linear(64, 10), r"^model: must be a function .* \(a built module: pass the function that builds it\)$"),
])
def test_what_is_wrong_with_a_factory_is_one_line_naming_it(factory, message):
    with pytest.raises(ConfigError, match=message) as err:
        dpeval.run(SETTINGS, model=factory)
    assert "\n" not in str(err.value)
    assert not [name for name in MODELS.names() if name.startswith("python:")]


def test_the_model_is_named_once():
    with pytest.raises(ConfigError, match=r"^model\.name: 'mlp' and model=tiny_cnn both name the run's model"):
        dpeval.run({**SETTINGS, "model": {"name": "mlp"}}, model=tiny_cnn)
