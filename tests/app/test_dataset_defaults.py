"""Per-data-set training defaults (``dpeval.core.dataset_defaults``): a real data set's recipe fills the keys a run
leaves out, never one it sets, only where it was measured, and is recorded outside the run key."""

import pytest

from dpeval.cli import format_run
from dpeval.config import build_spec
from dpeval.core.dataset_defaults import RECIPES
from dpeval.core.registry import default_model
from dpeval.defenses import DEFENSES

MNIST = {"data": {"name": "mnist"}, "privacy": {"epsilon": 3.0}}
# Everything the MNIST recipe sets, given explicitly.
EXPLICIT = {"data": {"name": "mnist", "normalize": "none"}, "privacy": {"epsilon": 3.0},
            "defense": {"name": "dpsgd", "clip": 0.1},
            "train": {"epochs": 20, "batch_size": 2048, "physical_batch_size": 512, "optimizer": "sgd", "lr": 4.0,
                      "momentum": 0.9}}


def test_a_bare_mnist_run_takes_the_recipe_and_records_it():
    spec = build_spec(MNIST)
    assert (spec.train.optimizer, spec.train.lr, spec.train.batch_size, spec.train.epochs) == ("sgd", 4.0, 2048, 20)
    assert spec.defense.clip == 0.1 and spec.data.normalize == "none"
    assert "train.lr=4.0" in spec.defaults and "defense.clip=0.1" in spec.defaults
    assert spec.canonical()["defaults"] == spec.defaults


def test_the_run_key_is_that_of_the_same_settings_given_explicitly():
    defaulted, explicit = build_spec(MNIST), build_spec(EXPLICIT)
    assert explicit.defaults == [] and defaulted.run_key == explicit.run_key
    again = build_spec(defaulted.canonical())  # a stored config read back (a sweep worker) keeps the record
    assert again.defaults == defaulted.defaults and again.run_key == defaulted.run_key


@pytest.mark.parametrize("section,given,field", [("train", {"lr": 0.5}, "lr"),
                                                 ("defense", {"name": "dpsgd", "clip": 1.0}, "clip"),
                                                 ("data", {"name": "mnist", "normalize": "auto"}, "normalize")])
def test_a_key_the_run_sets_always_wins(section, given, field):
    spec = build_spec({**MNIST, section: given})
    assert getattr(getattr(spec, section), field) == given[field]
    assert f"{section}.{field}" not in [d.split("=")[0] for d in spec.defaults] and spec.defaults  # the rest apply


@pytest.mark.parametrize("extra", [
    {"model": {"name": "mlp"}},                                 # another model than the recipe's
    {"defense": {"name": "none"}},                              # non-private: no clipping to keep lr 4 safe
    {"model": {"weights": "/nonexistent/weights.pt"}},          # nothing trained here
    {"data": {"name": "digits"}},                               # no recipe
])
def test_no_recipe_applies_outside_where_it_was_measured(extra):
    spec = build_spec({**MNIST, **extra})
    assert spec.defaults == [] and spec.train.optimizer == "adam" and spec.train.lr == 0.01


def test_the_callers_settings_are_not_changed():
    raw = {"data": {"name": "fashionmnist"}, "train": {"epochs": 3}}
    spec = build_spec(raw)
    assert raw == {"data": {"name": "fashionmnist"}, "train": {"epochs": 3}}
    assert spec.train.epochs == 3 and spec.train.lr == 4.0


@pytest.mark.parametrize("dataset", sorted(RECIPES))
def test_every_recipe_is_valid_for_each_defense_it_lists(dataset):
    recipe = RECIPES[dataset]
    assert recipe.model == default_model(dataset)
    for defense, params in recipe.defenses.items():
        spec = build_spec({"data": {"name": dataset}, "defense": {"name": defense}})
        assert DEFENSES.get(defense).is_dp(spec.defense)  # the recipe's steps rely on clipping and noise
        assert all(getattr(spec.defense, k) == v for k, v in params.items())
        assert len(spec.defaults) == len(recipe.settings) + len(params)


def test_the_printed_summary_names_the_defaults_that_applied():
    m = {"run_id": "r1", "dataset": "mnist", "model": "dpcnn-small", "defense": "dpsgd", "attack": "none", "seed": 0,
         "utility.test_accuracy": 0.97, "utility.train_accuracy": 0.97, "privacy.epsilon": 3.0, "privacy.delta": 1e-5,
         "privacy.noise_multiplier": 1.0, "privacy.sample_rate": 0.03, "privacy.steps": 520,
         "privacy.accountant": "rdp", "privacy.sampling": "poisson", "comm.density": 1.0, "comm.bytes_sparse": 1.0,
         "comm.bytes_dense": 1.0, "time.train_s": 1.0, "time.attack_s": 0.0}
    assert "defaults" not in format_run({**m, "defaults": "none"})
    text = format_run({**m, "defaults": "train.lr=4.0, train.epochs=20"})
    assert "mnist's recipe for what the run did not set: train.lr=4.0, train.epochs=20" in text


def test_a_subset_takes_the_size_free_part_and_says_in_one_line_what_it_leaves(caplog):
    """With ``data.max_train`` the recipe's batch, optimizer, step size and epochs (sized for the whole set) are left
    for the generic defaults; its pixel range and the defense's clip bound still apply."""
    from dpeval import config

    raw = {**MNIST, "data": {"name": "mnist", "max_train": 3000}, "defense": {"name": "adaclip"},
           "train": {"epochs": 3}}
    config._SAID.clear()
    with caplog.at_level("WARNING", logger="dpeval"):
        spec = build_spec(raw)
        build_spec(raw)  # said once per process
    assert spec.data.normalize == "none" and spec.defense.h2 == 1.2e-6
    assert (spec.train.optimizer, spec.train.lr, spec.train.batch_size, spec.train.epochs) == ("adam", 0.01, 128, 3)
    assert spec.defaults == ["data.normalize=none", "defense.h2=1.2e-06"]
    (line,) = [r.getMessage() for r in caplog.records if "max_train" in r.getMessage()]
    assert "train.lr=4.0" in line and "train.batch_size=2048" in line and "train.epochs" not in line  # given
    assert "\n" not in line
