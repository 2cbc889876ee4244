"""Shadow training: the vectorised path trains the same models as the sequential (normal training loop) path."""

import pytest
import torch

from dpeval.config import build_spec
from dpeval.engine.shadow_training import fresh_models, train_shadows, train_shadows_sequential
from dpeval.runner import prepare


def halves(k: int, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    """k pools of example indices, each a random half of n (the shape of a shadow attack's pools)."""
    return [torch.sort(torch.randperm(n, generator=gen)[: n // 2]).values for _ in range(k)]


DEFENSES = {"dpsgd": {}, "rs": {"final_rate": 0.5}, "adaclip": {},
            "gep": {"num_bases": 10, "num_anchors": 50},  # GEP keeps its model: anchors follow each shadow's weights
            # no per-sample statistic: the vectorised path sums each model's gradient in one backward pass
            "none": {}, "rs-unclipped": {"name": "rs", "final_rate": 0.5, "clip": None, "noise_std": 0.01}}


@pytest.mark.parametrize("defense", list(DEFENSES))
def test_vectorised_shadows_equal_sequential(defense):
    """Same random streams ⇒ the vectorised path trains the same models as the normal training loop, for
    every kind of defense, including one that keeps its model (GEP)."""
    plain = defense in ("none", "rs-unclipped")
    spec = build_spec({"defense": {"name": defense, **DEFENSES[defense]},
                       # the same gradients as the vectorised path: per-sample (func), or the plain sum (lean's,
                       # for a defense without a per-sample statistic)
                       "train": {"epochs": 2, "batch_size": 64, "engine": "lean" if plain else "func"},
                       "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    x, y = prep.task.train.x[:512], prep.task.train.y[:512]  # 4 steps per epoch on each half
    pools = halves(4, len(y), torch.Generator().manual_seed(0))
    scopes = [prep.streams.scope("shadow", i) for i in range(4)]
    cpu = torch.device("cpu")

    per_sample_calls = []

    def make_watched(i, m, s):
        defense = prep.make_defense(scopes[i], m, s)
        accumulate = defense.clip_and_accumulate
        defense.clip_and_accumulate = lambda grads: (per_sample_calls.append(i), accumulate(grads))
        return defense

    vec = train_shadows(prep.build_model, x, y, pools, make_watched, spec.train, scopes, cpu, progress=False)
    # per-sample gradients only where the defense has a per-sample statistic
    assert bool(per_sample_calls) == (not plain)
    seq = train_shadows_sequential(prep.build_model, x, y, pools, lambda i, m, s: prep.make_defense(scopes[i], m, s),
                                   spec.train, scopes, cpu, progress=False)
    assert len(vec) == len(seq) == 4
    for a, b in zip(vec, seq):
        assert set(a) == set(b)
        for name in a:
            # unclipped training carries rounding further: there the training loop's own two engines (summed
            # per-sample gradients, the plain sum) differ by up to 6e-5 after these 8 steps
            torch.testing.assert_close(a[name], b[name], rtol=1e-3 if plain else 1e-4, atol=1e-4 if plain else 1e-5)
    weight = next(n for n in vec[0] if n.endswith("weight"))
    assert not torch.equal(vec[0][weight], vec[1][weight])  # independent models
    initial = fresh_models(prep.build_model, scopes)[0].state_dict()
    assert not torch.equal(vec[0][weight], initial[weight])  # and they did train


def test_each_defense_is_built_for_the_epochs_of_its_own_pool():
    """A defense is constructed with the steps per epoch of the pool its model trains on (what rs and
    random-freeze place their mask refreshes by): the victim's ⌊n/B⌋, each shadow's ⌊|pool|/B⌋."""
    spec = build_spec({"train": {"epochs": 1, "batch_size": 64, "engine": "func"},
                       "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    assert prep.make_defense(prep.streams.scope("victim")).steps_per_epoch == len(prep.task.train) // 64
    x, y = prep.task.train.x[:512], prep.task.train.y[:512]
    pools = [torch.arange(256), torch.arange(448)]  # 4 and 7 steps per epoch
    scopes = [prep.streams.scope("shadow", i) for i in range(2)]
    built: dict[int, int] = {}

    def make_defense(i, model, steps):
        defense = prep.make_defense(scopes[i], model, steps)
        built[i] = defense.steps_per_epoch
        return defense

    for path in (train_shadows, train_shadows_sequential):
        built.clear()
        path(prep.build_model, x, y, pools, make_defense, spec.train, scopes, torch.device("cpu"), progress=False)
        assert built == {0: 4, 1: 7}


def test_fresh_models_follow_their_scopes():
    """Each model is initialised from its own scope's ``init`` stream: the same scope gives the same weights,
    another scope other weights, and the build leaves torch's global generator untouched."""
    spec = build_spec({"train": {"epochs": 1}})
    prep = prepare(spec)
    scopes = [prep.streams.scope("shadow", i) for i in range(3)]
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first = fresh_models(prep.build_model, scopes)
    assert torch.equal(torch.rand(3), before)
    again = fresh_models(prep.build_model, scopes[:1])[0]
    names = list(first[0].state_dict())
    assert all(torch.equal(first[0].state_dict()[n], again.state_dict()[n]) for n in names)
    assert not all(torch.equal(first[0].state_dict()[n], first[1].state_dict()[n]) for n in names)
    victim = prep.model.state_dict()  # the victim's own scope: not a shadow's weights
    assert not all(torch.equal(first[0].state_dict()[n], victim[n]) for n in names)


class Stop(Exception):
    """The interruption of a shadow training (what Ctrl-C or a kill does to the process)."""


@pytest.mark.parametrize("defense", ["dpsgd", "rs", "gep"])
def test_interrupted_shadows_resume_from_the_saved_ones(defense, tmp_path):
    """Interrupted after the first group of 2 of 6 shadows, a call with the same store loads those two,
    trains only the 4 others, and returns exactly the states of an uninterrupted run."""
    from dpeval.checkpoint import ShadowStore

    spec = build_spec({"defense": {"name": defense, **DEFENSES[defense]},
                       "train": {"epochs": 2, "batch_size": 64}, "privacy": {"noise_multiplier": 1.0}})
    prep = prepare(spec)
    x, y = prep.task.train.x[:512], prep.task.train.y[:512]
    pools = halves(6, len(y), torch.Generator().manual_seed(1))
    scopes = [prep.streams.scope("shadow", i) for i in range(6)]
    cpu = torch.device("cpu")
    built: list[int] = []

    def make_defense(i, model, steps):
        if i == 2 and stop:
            raise Stop
        built.append(i)
        return prep.make_defense(scopes[i], model, steps)

    def run(store, group):
        return train_shadows(prep.build_model, x, y, pools, make_defense, spec.train, scopes, cpu, progress=False,
                             store=store, group=group)

    stop = False
    expected = run(None, 0)
    assert built == list(range(6))
    store = ShadowStore(tmp_path / "shadows", "game-key")
    built.clear()
    stop = True
    with pytest.raises(Stop):
        run(store, 2)
    assert built == [0, 1] and sorted(p.name for p in store.folder.iterdir()) == ["shadow-0.pt", "shadow-1.pt"]
    built.clear()
    stop = False
    got = run(store, 2)
    assert built == [2, 3, 4, 5]  # the finished two were loaded, not trained again
    assert len(got) == 6
    for a, b in zip(got, expected):
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    built.clear()
    again = run(store, 0)  # everything saved: nothing left to train
    assert built == [] and all(torch.equal(a[n], b[n]) for a, b in zip(again, expected) for n in a)


@pytest.mark.parametrize("damage", ["flip", "other-key"])
def test_a_damaged_saved_shadow_is_discarded(damage, tmp_path):
    from dpeval.checkpoint import ShadowStore

    store = ShadowStore(tmp_path, "game-key")
    store.save(0, {"w": torch.arange(1000.0)})
    assert torch.equal(store.finished(3)[0]["w"], torch.arange(1000.0)) and set(store.finished(3)) == {0}
    if damage == "flip":
        data = bytearray(store.path(0).read_bytes())
        data[len(data) // 2] ^= 0xFF
        store.path(0).write_bytes(bytes(data))
    else:
        store = ShadowStore(tmp_path, "another-game")
    assert store.finished(3) == {} and not store.path(0).exists()  # removed: that shadow trains again
