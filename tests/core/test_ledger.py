"""Every ε a result reports derives from the run's privacy ledger: recomputed here by Opacus' accountants
called directly (and, for RDP, from first principles) on the σ, q and T the result records."""

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from dpeval.attacks.membership_game import target_privacy
from dpeval.config import build_spec
from dpeval.core.ledger import PrivacyLedger
from dpeval.runner import execute
from dpeval.store import ResultStore
from tests.core.test_accounting import independent_rdp_epsilon

ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant}
EPOCHS, BATCH = 2, 32


def independent(accountant: str, sigma: float, q: float, steps: int, delta: float) -> float:
    acc = ACCOUNTANTS[accountant]()
    acc.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PRV at q = 1 takes log 0 on the way
        return float(acc.get_epsilon(delta=delta))


_RUNS: dict = {}


def run(tmp_path_factory, sigma: float, accountant: str) -> dict:
    """A small DP-SGD run at σ with grad-MIA attacking it (cached per σ and accountant)."""
    key = (sigma, accountant)
    if key not in _RUNS:
        spec = build_spec({"defense": "dpsgd", "attacks": ["grad-mia"], "device": "cpu",
                           "privacy": {"noise_multiplier": sigma, "accountant": accountant},
                           "train": {"epochs": EPOCHS, "batch_size": BATCH}, "data": {"max_train": 300},
                           "attack": {"batches": 2, "batch_size": 2, "at": "final"}})
        _RUNS[key] = execute(spec, ResultStore(tmp_path_factory.mktemp("results")), progress=False).flat()
    return _RUNS[key]


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_results_epsilons_are_the_accountants_on_what_training_released(tmp_path_factory, accountant):
    row = run(tmp_path_factory, 1.0, accountant)
    n = row["data.train_size"]
    q, steps, delta = BATCH / n, EPOCHS * (n // BATCH), row["privacy.delta"]
    assert (row["privacy.sample_rate"], row["privacy.steps"], row["privacy.accountant"]) == (q, steps, accountant)
    assert row["privacy.accounted_noise_multiplier"] == 1.0
    assert row["privacy.epsilon"] == pytest.approx(independent(accountant, 1.0, q, steps, delta), rel=1e-9)
    # grad-MIA: one release of a whole batch, by the run's accountant (not RDP whatever was configured)
    assert row["leakage.grad-mia.accounted_epsilon"] == pytest.approx(independent(accountant, 1.0, 1.0, 1, delta),
                                                                     rel=1e-9)
    if accountant == "rdp":
        assert row["privacy.epsilon"] == pytest.approx(independent_rdp_epsilon(1.0, q, steps, delta), rel=0.03)


def test_a_changed_sigma_changes_every_epsilon(tmp_path_factory):
    low, high = run(tmp_path_factory, 1.0, "rdp"), run(tmp_path_factory, 2.0, "rdp")
    assert high["privacy.epsilon"] < low["privacy.epsilon"]
    assert high["leakage.grad-mia.accounted_epsilon"] < low["leakage.grad-mia.accounted_epsilon"]
    n, delta = high["data.train_size"], high["privacy.delta"]
    assert high["privacy.epsilon"] == pytest.approx(independent("rdp", 2.0, BATCH / n, EPOCHS * (n // BATCH), delta),
                                                    rel=1e-9)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_the_shadow_games_target_epsilon_is_the_ledger_at_the_shadows_rate(accountant):
    ledger = PrivacyLedger(1.3, 1.3, 32 / 1000, 62, 1e-5, accountant, "poisson")
    game = SimpleNamespace(train=SimpleNamespace(batch_size=20, epochs=2), index=torch.arange(800))
    out = target_privacy(ledger, game)
    assert (out["target_sample_rate"], out["target_steps"]) == (20 / 400, 2 * 20)
    assert out["target_epsilon"] == pytest.approx(independent(accountant, 1.3, 20 / 400, 40, 1e-5), rel=1e-9)
    louder = PrivacyLedger(2.6, 2.6, 32 / 1000, 62, 1e-5, accountant, "poisson")
    assert target_privacy(louder, game)["target_epsilon"] < out["target_epsilon"]


def test_no_dp_mechanism_is_infinite_epsilon_everywhere():
    ledger = PrivacyLedger(0.0, 0.0, 0.03, 100, 1e-5, "rdp", "poisson")
    assert ledger.epsilon == math.inf and ledger.at(1.0, 1).epsilon == math.inf


def test_the_runs_ledger_counts_the_releases_training_made(tmp_path, monkeypatch):
    """T is training's own count of releases, not the plan's: a training that released 5 steps fewer is
    accounted for 5 steps fewer."""
    from dpeval import runner

    real = runner.train

    def fewer(*args, **kwargs):
        result = real(*args, **kwargs)
        result.steps -= 5
        return result

    monkeypatch.setattr(runner, "train", fewer)
    spec = build_spec({"defense": "dpsgd", "device": "cpu", "privacy": {"noise_multiplier": 1.0},
                       "train": {"epochs": 1, "batch_size": BATCH}, "data": {"max_train": 300}})
    row = execute(spec, ResultStore(tmp_path), progress=False).flat()
    n = row["data.train_size"]
    steps = n // BATCH - 5
    assert row["privacy.steps"] == steps
    assert row["privacy.epsilon"] == pytest.approx(independent("rdp", 1.0, BATCH / n, steps, row["privacy.delta"]),
                                                   rel=1e-9)
