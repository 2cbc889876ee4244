"""A run with a DP-PCA in front of its model (model.pca): the ledger composes the PCA's release with training's,
the projection is made with the ledger's noise from the run's own stream, and every model the run builds carries
it."""

from __future__ import annotations

import math

import pytest
import torch

from dpeval.core.accounting import epsilon_for, epsilon_of
from dpeval.core.errors import ConfigError
from dpeval.core.pca import Projection
from dpeval.runner import prepare
from dpeval.victims import input_pca
from tests.helpers import spec_for


def test_a_run_composes_the_pca_with_training_and_projects_with_the_ledgers_noise():
    """digits (64 pixels) projected to 10: the PCA's σ_p makes it alone (0.1·ε, δ)-DP, training's σ makes both
    (ε, δ)-DP; the victim's projection is the DP-PCA of the normalised pool at the ledger's σ_p from the run's
    `pca` stream, and every model the run builds (shadows too) carries the same one."""
    spec = spec_for("dpsgd", privacy__epsilon=2.0, model__name="mlp", model__pca__dims=10, train__epochs=2)
    prepared = prepare(spec)
    ledger = prepared.privacy
    assert ledger.pca_noise_multiplier > 0
    assert epsilon_for(ledger.pca_noise_multiplier, 1.0, 1, ledger.delta) == pytest.approx(0.2, rel=0.006)
    both = epsilon_of([(ledger.pca_noise_multiplier, 1.0, 1),
                       (ledger.accounted_noise_multiplier, ledger.sample_rate, ledger.steps)], ledger.delta)
    assert ledger.epsilon == pytest.approx(both) and 0.995 * 2.0 <= ledger.epsilon <= 2.0
    assert epsilon_for(ledger.accounted_noise_multiplier, ledger.sample_rate, ledger.steps, ledger.delta) < 2.0
    assert ledger.metrics()["privacy.pca_epsilon"] == pytest.approx(0.2, rel=0.006)
    expected = input_pca(spec, prepared.task, ledger.pca_noise_multiplier,
                         prepared.streams.scope("victim").generator("pca"))
    for model in (prepared.model, prepared.build_model()):
        (front,) = [m for m in model.modules() if isinstance(m, Projection)]
        assert torch.equal(front.projection, expected)
    exact = input_pca(spec, prepared.task, 0.0, torch.Generator())
    assert not torch.allclose(expected, exact)  # the noise is there (a planted noiseless PCA fails here)


def test_a_non_private_run_projects_exactly_and_reports_no_pca_cost():
    prepared = prepare(spec_for("none", model__name="mlp", model__pca__dims=10))
    (front,) = [m for m in prepared.model.modules() if isinstance(m, Projection)]
    assert torch.allclose(front.projection, input_pca(prepared.spec, prepared.task, 0.0, torch.Generator()))
    assert "privacy.pca_epsilon" not in prepared.privacy.metrics() and math.isinf(prepared.privacy.epsilon)


@pytest.mark.parametrize("sets,field", [
    ({"model__pca__dims": 65}, "model.pca.dims"),
    ({"model__pca__dims": 10, "privacy__noise_multiplier": 1.0, "privacy__epsilon": None},
     "model.pca.noise_multiplier"),
])
def test_a_pca_that_cannot_be_made_is_refused_before_training(sets, field):
    with pytest.raises(ConfigError, match=field):
        prepare(spec_for("dpsgd", model__name="mlp", **sets))


def test_a_given_pca_noise_is_composed_with_a_given_training_noise():
    prepared = prepare(spec_for("dpsgd", model__name="mlp", model__pca__dims=10, model__pca__noise_multiplier=5.0,
                                privacy__noise_multiplier=1.0, privacy__epsilon=None))
    ledger = prepared.privacy
    assert ledger.pca_noise_multiplier == 5.0 and ledger.noise_multiplier == 1.0
    assert ledger.epsilon == pytest.approx(epsilon_of([(5.0, 1.0, 1), (1.0, ledger.sample_rate, ledger.steps)],
                                                      ledger.delta))
