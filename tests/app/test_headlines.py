"""A verdict's headline cites the statistic that decided it (``dpeval.headlines``)."""

from dpeval.headlines import read


def membership(verdict, auc, low, high, bound):
    return {"leakage.loss.auc": auc, "leakage.loss.auc_ci_low": low, "leakage.loss.auc_ci_high": high,
            "leakage.loss.epsilon_lower_bound": bound, "leakage.loss.verdict": verdict}


def test_a_leak_found_by_the_epsilon_bound_alone_cites_the_bound_first():
    text = read(membership("leaks", 0.4931, 0.458, 0.528, 0.78), "loss").sentence()
    assert text.startswith("leaks: ε lower bound 0.78 > 0 (LOSS AUC 0.4931"), text
    assert "vs chance 0.5)" in text


def test_a_leak_the_auc_shows_cites_the_auc():
    for bound in (0.0, 0.78):  # the AUC's interval above chance decides, whatever the bound says
        text = read(membership("leaks", 0.61, 0.57, 0.65, bound), "loss").sentence()
        assert text.startswith("leaks: LOSS AUC 0.61") and "ε lower bound" not in text, text


def test_no_leak_cites_the_headline():
    text = read(membership("no-leak-detected", 0.50, 0.46, 0.54, 0.0), "loss").sentence()
    assert text.startswith("no-leak-detected: LOSS AUC 0.5") and "ε lower bound" not in text, text
