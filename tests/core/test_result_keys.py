"""Attack result keys: built and parsed at their first two dots, whatever dots and dashes the names hold."""

import pytest

from dpeval.core.result_keys import AttackKey

TRICKY = {  # stored keys (docs/results.md, tests) -> (attack, metric, state, metric without the state)
    "leakage.lira.tpr_at_0.1pct_fpr": ("lira", "tpr_at_0.1pct_fpr", None, "tpr_at_0.1pct_fpr"),
    "leakage.lira.tpr_at_0.1pct_fpr_note": ("lira", "tpr_at_0.1pct_fpr_note", None, "tpr_at_0.1pct_fpr_note"),
    "leakage.grad-mia.auc": ("grad-mia", "auc", None, "auc"),
    "leakage.grad-mia.verdict": ("grad-mia", "verdict", None, "verdict"),
    "leakage.ig.epoch:7.psnr": ("ig", "epoch:7.psnr", "epoch:7", "psnr"),
    "leakage.ig.final.defense_rate": ("ig", "final.defense_rate", "final", "defense_rate"),
    "leakage.ig.init.wins": ("ig", "init.wins", "init", "wins"),
    "leakage.ig.epoch:7.psnr.sem": ("ig", "epoch:7.psnr.sem", "epoch:7", "psnr.sem"),
    "leakage.ig.psnr.sem": ("ig", "psnr.sem", None, "psnr.sem"),
}


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_keys_parse_and_build_back(text):
    key = AttackKey.parse(text)
    assert (key.attack, key.metric, key.state, key.state_metric) == TRICKY[text]
    assert str(key) == text and AttackKey(key.attack, key.metric) == key


def test_per_state_keys_are_built_from_a_recorded_state():
    assert str(AttackKey.at_state("ig", "epoch:3", "psnr")) == "leakage.ig.epoch:3.psnr"
    for state in ("middle", "trajectory:3", "epoch:-1"):
        with pytest.raises(ValueError):
            AttackKey.at_state("ig", state, "psnr")
    # a metric whose first part looks like a state only when it is one
    assert AttackKey("ig", "finale.psnr").state is None and AttackKey("ig", "trajectory.psnr").state is None


def test_artefact_keys_are_their_own_section():
    key = AttackKey.parse("artefacts.ig.png", "artefacts")
    assert (key.attack, key.metric, str(key)) == ("ig", "png", "artefacts.ig.png")
    assert AttackKey.parse("artefacts.ig.png") is None and AttackKey.parse("leakage.ig.psnr", "artefacts") is None


@pytest.mark.parametrize("text", ["leakage.ig", "leakage.", "leakage..psnr", "utility.test_accuracy",
                                  "attack.ig.targets", "time.ig_s", "leakages.ig.psnr", "pareto.ig"])
def test_other_keys_are_not_attack_keys(text):
    assert AttackKey.parse(text) is None


def test_an_attack_name_with_a_dot_cannot_make_a_key():
    for attack, metric, section in (("my.attack", "auc", "leakage"), ("", "auc", "leakage"), ("ig", "", "leakage"),
                                    ("ig", "psnr", "utility")):
        with pytest.raises(ValueError, match="not an attack's result key"):
            AttackKey(attack, metric, section)


def test_the_verdict_key():
    assert str(AttackKey.verdict("grad-mia")) == "leakage.grad-mia.verdict"
    assert AttackKey.parse("leakage.grad-mia.verdict").is_verdict
    assert not AttackKey.parse("leakage.ig.final.verdict").is_verdict  # not a key any attack reports
    assert not AttackKey("ig", "verdict", "artefacts").is_verdict
