"""Model-state names: one parser for every place that reads them."""

import pytest

from dpeval.core.errors import ConfigError
from dpeval.core.states import AttackState, in_order, resolve


@pytest.mark.parametrize("text", ["init", "final", "epoch:0", "epoch:12", "trajectory", "trajectory:1", "trajectory:5"])
def test_valid_names_are_states_and_stay_strings(text):
    state = AttackState(text)
    assert state == text and isinstance(state, str) and {state: 1}[text] == 1


@pytest.mark.parametrize("text", ["", "middle", "epoch:", "epoch:-1", "epoch:1.5", "trajectory:0", "Init", 3, None])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        AttackState(text)
    with pytest.raises(ConfigError, match=r"^attack\.at: must be"):
        AttackState.parse(text)


def test_recorded_only_refuses_a_trajectory_request():
    assert AttackState.parse("epoch:3", recorded_only=True) == "epoch:3"
    with pytest.raises(ConfigError, match="init, final or epoch:N"):
        AttackState.parse("trajectory", recorded_only=True)


def test_training_order_and_defense_epoch():
    assert in_order(["final", "epoch:10", "init", "epoch:2", "not-a-state", "trajectory"]) == \
        ["init", "epoch:2", "epoch:10", "final"]
    assert [AttackState(s).defense_epoch(20) for s in ("init", "epoch:7", "final")] == [0, 7, 19]
    with pytest.raises(ConfigError, match="epoch:20 does not exist in a run of 20 epoch"):
        AttackState("epoch:20").defense_epoch(20)
    assert resolve(["final", "trajectory:2", "init"], 20) == ["init", "epoch:10", "final"]
