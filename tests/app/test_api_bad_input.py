"""The Python API answers bad input like the CLI: a ``ConfigError`` (a ``ValueError``) naming the argument or field,
before anything is trained or written, for wrong types, empty or overlapping member sets, float labels, batch
sizes larger than the pool, models the per-sample engines cannot take, user functions that return something
else, and non-finite weights, releases or noise; and a run of the API leaves no temporary folder behind."""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import dpeval
from dpeval.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
RECIPE = {"defense": "none", "train": {"epochs": 1, "batch_size": 32, "optimizer": "sgd", "lr": 0.5}}
SHADOW_RECIPE = {**RECIPE, "attack": {"shadows": 4}}


def mlp(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


@pytest.fixture(scope="module")
def digits():
    task = dpeval.load_data()
    return task.train.x, task.train.y


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 20) -> nn.Module:
    """An over-fitted victim (its members leak to LiRA)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(epochs):
        for i in range(0, len(y), 32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
    return model


def train_for(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int) -> nn.Module:
    return fit(model, x, y, epochs)


def sets(x, y, start: int, n: int = 100):
    """(members, non-members): n examples from ``start`` and the n after them."""
    return (x[start:start + n], y[start:start + n]), (x[start + n:start + 2 * n], y[start + n:start + 2 * n])


# --------------------------------------------------------------------------------------------------------
# shadow models are reused only when everything that determines them is the same


def lira_auc(result) -> float:
    assert result.status == "done", result.attacks
    return result.attacks["lira"].metrics["auc"]


@pytest.mark.slow
def test_a_model_scored_after_another_gets_its_own_shadows(digits, tmp_path):
    """Model B scored alone and right after model A (other data, the same recipe) gets the same LiRA result:
    A's shadows, trained on A's data, are not reused for B — not from memory, nor from an ``out`` folder both
    calls share."""
    from dpeval.attacks import membership_game

    x, y = digits
    members_a, nonmembers_a = sets(x, y, 0)
    members_b, nonmembers_b = sets(x, y, 400)
    torch.manual_seed(1)
    model_a, model_b = fit(mlp(), *members_a), fit(mlp(), *members_b)
    membership_game._POOLS.clear()
    alone = lira_auc(dpeval.score_membership(model_b, members_b, nonmembers_b, SHADOW_RECIPE, ["lira"],
                                             out=tmp_path / "alone"))
    lira_auc(dpeval.score_membership(model_a, members_a, nonmembers_a, SHADOW_RECIPE, ["lira"],
                                     out=tmp_path / "shared"))
    after = lira_auc(dpeval.score_membership(model_b, members_b, nonmembers_b, SHADOW_RECIPE, ["lira"],
                                             out=tmp_path / "shared"))
    assert after == alone
    # the same call again reuses its shadows (the cache still works), with the same result
    again = dpeval.score_membership(model_b, members_b, nonmembers_b, SHADOW_RECIPE, ["lira"])
    assert lira_auc(again) == alone
    # model B scored on A's data into the folder where it was scored on its own: its signals there are not reused
    membership_game._POOLS.clear()
    other = lira_auc(dpeval.score_membership(model_b, members_a, nonmembers_a, SHADOW_RECIPE, ["lira"],
                                             out=tmp_path / "other"))
    assert lira_auc(dpeval.score_membership(model_b, members_a, nonmembers_a, SHADOW_RECIPE, ["lira"],
                                            out=tmp_path / "alone")) == other


@pytest.mark.slow
def test_two_training_functions_never_share_shadows(digits):
    """Two lambdas (or partials) as ``train_shadow`` are two functions: the second's shadows are its own. A
    function that trains nothing gives shadows that are their initialisations; one that trains gives others."""
    x, y = digits
    members, nonmembers = sets(x, y, 0)
    torch.manual_seed(1)
    model = fit(mlp(), *members)
    untrained = dpeval.score_membership(model, members, nonmembers, SHADOW_RECIPE, ["lira"],
                                        train_shadow=lambda m, xs, ys, seed: None)
    trained = dpeval.score_membership(model, members, nonmembers, SHADOW_RECIPE, ["lira"],
                                      train_shadow=lambda m, xs, ys, seed: fit(m, xs, ys, epochs=5))
    partial = dpeval.score_membership(model, members, nonmembers, SHADOW_RECIPE, ["lira"],
                                      train_shadow=functools.partial(train_for, epochs=5))
    assert lira_auc(untrained) != lira_auc(trained)
    assert lira_auc(partial) == lira_auc(trained)  # the same training, by a partial: no __qualname__ needed


# --------------------------------------------------------------------------------------------------------
# score_membership's input


def with_batch_norm() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))


def nan_model() -> nn.Module:
    model = mlp()
    with torch.no_grad():
        model[1].weight[0, 0] = math.nan
    return model


def call(digits, **change):
    x, y = digits
    members, nonmembers = sets(x, y, 0)
    args = {"model": mlp(), "members": members, "nonmembers": nonmembers, "recipe": RECIPE, "attacks": ["loss"]}
    args.update(change)
    return dpeval.score_membership(args.pop("model"), args.pop("members"), args.pop("nonmembers"),
                                   args.pop("recipe"), args.pop("attacks"), **args)


@pytest.mark.parametrize(("change", "message"), [
    (lambda x, y: {"model": "a model"}, "model: must be a torch.nn.Module"),
    (lambda x, y: {"model": with_batch_norm()}, "model: 2 is a BatchNorm1d"),
    (lambda x, y: {"model": nan_model()}, "model: its weights hold NaN"),
    (lambda x, y: {"members": (x[:100], y[:100].float())}, "members: labels must be integers"),
    (lambda x, y: {"members": (x[:0], y[:0])}, "members: needs at least one example"),
    (lambda x, y: {"members": [x[:100]]}, "members: must be a Split or an (x, y) pair"),
    (lambda x, y: {"members": (x[:100], y[:99])}, "members: y must hold one label per row"),
    (lambda x, y: {"members": (x[:100] * math.nan, y[:100])}, "members: x holds NaN"),
    (lambda x, y: {"nonmembers": (x[:100], y[:100])}, "nonmembers: 100 example(s) are also in members"),
    (lambda x, y: {"nonmembers": (x[50:150], y[50:150])}, "nonmembers: 50 example(s) are also in members"),
    (lambda x, y: {"nonmembers": (x[100:200, :, :4], y[100:200])}, "nonmembers: examples of shape"),
    (lambda x, y: {"recipe": 42}, "recipe: must be settings"),
    (lambda x, y: {"recipe": {**RECIPE, "train": {**RECIPE["train"], "batch_size": 500}}},
     "train.batch_size: must be <= the private pool size (100)"),
    (lambda x, y: {"attacks": 5}, "attacks: must be an attack name"),
    (lambda x, y: {"attacks": "nope"}, "attack"),
    (lambda x, y: {"num_classes": 1}, "num_classes: must be an integer of at least 10"),
    (lambda x, y: {"progress": "no"}, "progress: must be True or False"),
    (lambda x, y: {"train_shadow": 3}, "train_shadow: must be a function"),
    (lambda x, y: {"architecture": lambda: mlp(8)}, "architecture: builds another architecture"),
    (lambda x, y: {"architecture": lambda: "model"}, "architecture: must build a torch.nn.Module"),
])
def test_score_membership_refuses_bad_input_naming_it(digits, change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(digits, **change(*digits))


def test_one_attack_name_is_one_attack(digits):
    result = call(digits, attacks="loss")
    assert list(result.attacks) == ["loss"] and result.attacks["loss"].verdict is not None


@pytest.mark.parametrize(("returns", "message"), [
    (lambda m: {"not": "a model"}, "train_shadow: must train the model it is given in place"),
    (lambda m: mlp(8), "train_shadow: returned a model of another architecture"),
])
def test_a_training_function_that_returns_something_else_is_refused(digits, returns, message):
    """The shadows' training function is checked on what it returns: the call raises, naming it, instead of
    reporting a failed attack."""
    with pytest.raises(ConfigError, match=message):
        call(digits, recipe=SHADOW_RECIPE, attacks=["lira"], train_shadow=lambda m, xs, ys, seed: returns(m))


# --------------------------------------------------------------------------------------------------------
# configure, load_result


def test_configure_takes_a_defense_by_name_with_its_settings():
    """``defense="dpsgd", defense__clip=0.5`` is ``--defense dpsgd --set defense.clip=0.5``, in either order."""
    for spec in (dpeval.configure(defense="dpsgd", defense__clip=0.5),
                 dpeval.configure(defense__clip=0.5, defense="dpsgd"),
                 dpeval.configure({"defense": "dpsgd"}, defense__clip=0.5)):
        assert spec.defense_name == "dpsgd" and spec.defense.clip == 0.5
    assert dpeval.configure(attacks="loss").attacks == ["loss"]
    with pytest.raises(ConfigError, match="settings: must be settings as a dict"):
        dpeval.configure(["defense"])


def test_load_result_says_the_run_does_not_exist(tmp_path):
    stored = dpeval.run(dpeval.configure(defense="none", train__epochs=1, data__max_train=128),
                        results=tmp_path / "results")
    assert dpeval.load_result(tmp_path / "results", stored.run_id).run_id == stored.run_id
    with pytest.raises(ConfigError, match="run_id: no run id contains 'nope'"):
        dpeval.load_result(tmp_path / "results", "nope")
    with pytest.raises(ConfigError, match="results: no results folder"):
        dpeval.load_result(tmp_path / "elsewhere", stored.run_id)
    with pytest.raises(ConfigError, match="run_id: must be a run id"):
        dpeval.load_result(tmp_path / "results", 7)


# --------------------------------------------------------------------------------------------------------
# attack_release


def mean_release(grads, generator):
    return {name: g.mean(0) for name, g in grads.items()}


@pytest.mark.parametrize(("args", "message"), [
    ({"release": lambda grads, generator: {n: g.mean(0) * math.nan for n, g in grads.items()}},
     "release: the release function returned NaN"),
    ({"release": lambda grads, generator: {n: g.mean(0)[..., :1] for n, g in grads.items()}},
     "release: the release function must return one gradient per parameter"),
    ({"release": lambda grads, generator: [1, 2]}, "release: the release function must return one gradient"),
    ({"release": 3}, "release: must be a function"),
    ({"noise_std": -1.0}, "noise_std: must be a finite number >= 0"),
    ({"noise_std": math.nan}, "noise_std: must be a finite number >= 0"),
    ({"noise_std": "0.1"}, "noise_std: must be a finite number >= 0"),
    ({"weights": {"0.weight": torch.zeros(3)}}, "weights: not a state dict of the recipe's model"),
    ({"weights": "model.pt"}, "weights: must be a state dict"),
    ({"attacks": 5}, "attacks: must be an attack name"),
    ({"recipe": 42}, "recipe: must be settings"),
])
def test_attack_release_refuses_bad_input_naming_it(args, message):
    """A release function returning NaN is an error, never a ``no-leak-detected`` verdict."""
    release = args.pop("release", mean_release)
    with pytest.raises(ConfigError, match=message):
        dpeval.attack_release(release, **{"recipe": {"attack": {"rgap": {"targets": 1}}}, "attacks": ["rgap"],
                                          **args})


def test_attack_release_refuses_weights_holding_nan():
    spec = dpeval.configure(attacks=["rgap"], attack__rgap__targets=1)
    from dpeval.runner import prepare

    weights = {n: t.clone() for n, t in prepare(spec).model.state_dict().items()}
    plain = dpeval.attack_release(mean_release, {"attack": {"rgap": {"targets": 1}}}, "rgap", weights=weights)
    assert plain.status == "done" and plain.attacks["rgap"].metrics["psnr"] > 40  # positive control: attacked
    name = next(n for n, t in weights.items() if t.is_floating_point() and t.dim() > 1)
    weights[name][0] = math.nan
    with pytest.raises(ConfigError, match="weights: hold NaN"):
        dpeval.attack_release(mean_release, {"attack": {"rgap": {"targets": 1}}}, "rgap", weights=weights)


def test_a_run_from_weights_holding_nan_is_refused(tmp_path):
    """``model.weights`` (``--weights``) with a NaN is refused before anything runs, not judged
    ``no-leak-detected``."""
    from dpeval.runner import prepare

    settings = {"attacks": ["loss"], "data": {"max_train": 128}}
    state = prepare(dpeval.configure(settings)).model.state_dict()
    name = next(n for n, t in state.items() if t.is_floating_point() and t.dim() > 1)
    state[name][0] = math.nan
    torch.save(state, tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="model.weights: .* holds NaN"):
        dpeval.run(dpeval.configure(settings, model__weights=str(tmp_path / "w.pt")), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------------
# progress and temporary folders


def test_progress_false_silences_the_shadow_models_bar(digits, capfd):
    from dpeval.attacks import membership_game

    x, y = digits
    members, nonmembers = sets(x, y, 0)
    for progress in (False, True):
        membership_game._POOLS.clear()  # the shadows train in both calls
        call(digits, model=fit(mlp(), *members, epochs=1), recipe=SHADOW_RECIPE, attacks=["lira"],
             progress=progress)
        err = capfd.readouterr().err
        assert ("shadow models" in err) is progress


SCRIPT = """
import dpeval, torch
task = dpeval.load_data()
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
x, y = task.train.x, task.train.y
kept = dpeval.score_membership(model, (x[:50], y[:50]), (x[50:100], y[50:100]), {"train": {"batch_size": 16}},
                               "loss", out="kept")
scored = dpeval.score_membership(model, (x[:50], y[:50]), (x[50:100], y[50:100]), {"train": {"batch_size": 16}},
                                 "loss")
ran = dpeval.run(dpeval.configure(defense="none", attacks="loss", train__epochs=1, data__max_train=128))
released = dpeval.attack_release(lambda g, gen: {n: t.mean(0) for n, t in g.items()},
                                 {"attack": {"rgap": {"targets": 1}}}, "rgap")
for result in (scored, ran, released):
    assert result.folder.is_dir() and result.attacks  # readable until the process exits
print(kept.folder)
"""


def test_the_api_leaves_no_temporary_folder_behind(tmp_path):
    """Calls given no ``out`` folder write into temporary folders removed when the process exits; ``out`` is
    kept."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "kept" and (tmp_path / "kept" / "loss").is_dir()
    assert [p.name for p in scratch.iterdir() if p.name.startswith("dpeval-")] == []


@pytest.mark.parametrize("settings,dotted", [({"defaults": ["train.lr=99"]}, {}), (None, {"defaults": ["train.lr=99"]}),
                                             ({"train": {"epochs": 1}, "defaults": []}, {})],
                         ids=["in-settings", "as-keyword", "empty-list"])
def test_configure_refuses_a_defaults_record_it_did_not_write(settings, dotted):
    """``defaults`` records which data-set defaults dpeval filled in; given by the caller it would be a lie."""
    with pytest.raises(ConfigError, match="^defaults: recorded by dpeval"):
        dpeval.configure(settings, **dotted)


def test_configure_from_a_runspec_keeps_its_record():
    spec = dpeval.configure(data__name="digits", model__weights=None)
    spec.defaults = ["train.lr=0.5"]  # a stored run's record, read back
    assert dpeval.configure(spec).defaults == ["train.lr=0.5"]
