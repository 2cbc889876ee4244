"""The declared defense contract, checked over every registered defense with its default parameters."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dpeval.audit.driver import AuditOptions, prepare_audit
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.splits import Task
from dpeval.core.streams import Streams
from dpeval.defenses import DEFENSES
from dpeval.defenses.auditing import CanaryDesign
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, SharedGradient
from dpeval.runner import prepare

NAMES = DEFENSES.names()


@pytest.fixture(scope="module")
def prepared():
    out = {}
    for name in NAMES:
        spec = build_spec({"defense": {"name": name}, "train": {"epochs": 2, "batch_size": 64},
                           "privacy": {"noise_multiplier": 1.0}})
        out[name] = prepare(spec)
    return out


def release_of(prep, streams: Streams, batch: int = 16) -> tuple[Defense, SharedGradient]:
    defense = prep.make_defense(streams)
    defense.begin_epoch(1, prep.spec.train.epochs)
    x, y = prep.task.train.x[:batch], prep.task.train.y[:batch]
    defense.clip_and_accumulate(PerSampleGradients(prep.model)(x, y))
    return defense, defense.release(prep.spec.train.batch_size)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_is_declared(name):
    cls = DEFENSES.get(name)
    assert cls.name == name
    for f in dataclasses.fields(cls.Params):
        assert f.metadata.get("help"), f"defense {name}: parameter {f.name} has no help text"


@pytest.mark.parametrize("name", NAMES)
def test_release_shape_and_metadata(prepared, name):
    prep = prepared[name]
    defense, shared = release_of(prep, Streams(0).scope("victim"))
    shapes = {n: p.shape for n, p in prep.model.named_parameters() if p.requires_grad}
    assert {n: g.shape for n, g in shared.grads.items()} == shapes
    assert all(torch.isfinite(g).all() for g in shared.grads.values())
    assert 0 < shared.density <= 1
    assert shared.rate is None or 0 <= shared.rate < 1
    if type(defense).is_dp(prep.spec.defense):
        assert shared.noise_std > 0  # σ = 1: a DP release carries noise
        assert shared.batch_size == prep.spec.train.batch_size  # divides by the expected batch size
    else:
        assert shared.batch_size == 16  # the non-private mean is over the examples seen
    assert defense.samples_seen == 0  # release resets the running sum


@pytest.mark.parametrize("name", NAMES)
def test_noise_comes_from_the_streams_given(prepared, name):
    """Same streams → the same release bit for bit; other streams → other noise (DP defenses)."""
    prep = prepared[name]
    _, a = release_of(prep, Streams(3).scope("victim"))
    _, b = release_of(prep, Streams(3).scope("victim"))
    _, c = release_of(prep, Streams(4).scope("victim"))
    assert all(torch.equal(a.grads[n], b.grads[n]) for n in a.grads)
    if type(prepared[name].make_defense(Streams(0))).is_dp(prep.spec.defense):
        assert any(not torch.equal(a.grads[n], c.grads[n]) for n in a.grads)


@pytest.mark.parametrize("name", NAMES)
def test_public_state_round_trip(prepared, name):
    """A fresh defense loaded with another's public state releases the same thing from the same streams:
    the state is all an attacker needs to replay a step."""
    prep = prepared[name]
    trained, _ = release_of(prep, Streams(5).scope("victim"))
    state = trained.state_dict()
    for value in state.values():
        assert isinstance(value, (torch.Tensor, int, float, str, bool, list, dict, tuple, type(None)))
    replay = [prep.make_defense(Streams(6).scope("replay")) for _ in range(2)]
    releases = []
    for d in replay:
        d.begin_epoch(1, prep.spec.train.epochs)
        d.load_state_dict(state)
        x, y = prep.task.train.x[16:32], prep.task.train.y[16:32]
        d.clip_and_accumulate(PerSampleGradients(prep.model)(x, y))
        releases.append(d.release(prep.spec.train.batch_size))
    assert all(torch.equal(releases[0].grads[n], releases[1].grads[n]) for n in releases[0].grads)


@pytest.mark.parametrize("name", NAMES)
def test_declarations(prepared, name):
    cls = DEFENSES.get(name)
    capabilities = cls.capabilities
    assert all(isinstance(getattr(capabilities, f.name), bool) for f in dataclasses.fields(capabilities))
    assert capabilities.lean_capable == (cls.lean_plan is not Defense.lean_plan)  # the engines read the declaration
    if capabilities.auditable:
        assert isinstance(cls.audit_design(), CanaryDesign)
    params = prepared[name].spec.defense
    sigma = cls.noise_for_accounted(1.0)
    assert math.isfinite(sigma) and sigma >= 1.0  # a defense never adds less noise than it is accounted for
    if capabilities.needs_model:
        assert cls.bind is not Defense.bind  # it says it keeps the model, so it must take it
    if not capabilities.accounted:
        assert not cls.is_dp(params)
    if not cls.is_dp(params):
        assert prepared[name].privacy.epsilon == math.inf
    defense = prepared[name].make_defense(Streams(0).scope("victim"))
    defense.begin_epoch(1, 2)
    assert capabilities.stateful == bool(defense.state_dict())  # a stateless defense has no state to replay


@pytest.mark.parametrize("name", NAMES)
def test_bind_is_handed_the_public_split_never_the_private_pool(prepared, name, monkeypatch):
    """Public state may come from public data only: the runner and the audit hand ``bind`` the model, the public
    split and the number of classes, never the task (whose private pool a defense could otherwise read)."""
    cls = DEFENSES.get(name)
    handed = []
    bind = cls.bind

    def spy(self, model, *args):
        handed.append(args)
        return bind(self, model, *args)

    monkeypatch.setattr(cls, "bind", spy)
    prep = prepared[name]
    prep.make_defense(Streams(0).scope("victim"))
    makers = [prep]
    if cls.is_dp(prep.spec.defense) and cls.capabilities.auditable:
        makers.append(prepare_audit(prep.spec, AuditOptions(steps=1)))
        makers[-1].make_defense(Streams(0).scope("audit"))
    assert len(handed) == len(makers)
    for args, maker in zip(handed, makers):
        assert args == (maker.task.public, maker.task.num_classes) and args[0] is maker.task.public
        assert not any(isinstance(a, Task) or hasattr(a, "train") for a in args)


def test_the_template_release_names_the_hook_a_defense_without_clip_must_write():
    """The template scales noise to ``params.clip``; a defense whose parameters have none gets told which hook to
    override (and one that overrides it releases)."""

    class Unclipped(Defense):
        def clip_and_accumulate(self, grads):
            for name, g in grads.items():
                self._sum[name] += g.sum(dim=0)

    shapes = {"w": torch.Size([3])}
    defense = Unclipped(Defense.Params(), DefenseContext(shapes, noise_multiplier=1.0, streams=Streams(0)))
    defense.clip_and_accumulate({"w": torch.ones(2, 3)})
    with pytest.raises(NotImplementedError, match="Unclipped.*sum_noise_std"):
        defense.release(2)

    class Scaled(Unclipped):
        def sum_noise_std(self, batch_size):
            return 0.0

    defense = Scaled(Defense.Params(), DefenseContext(shapes, noise_multiplier=1.0, streams=Streams(0)))
    defense.clip_and_accumulate({"w": torch.ones(2, 3)})
    assert torch.equal(defense.release(2).grads["w"], torch.ones(3))


def test_capabilities_are_declared_not_probed():
    """The lean engine is chosen from ``capabilities.lean_capable``, so a class whose declaration and ``lean_plan``
    disagree is refused when it is made; ``dpeval audit`` refuses a DP defense that declares no canary design."""
    dpsgd = DEFENSES.get("dpsgd")
    with pytest.raises(TypeError, match="declare it"):
        type("Undeclared", (Defense,), {"lean_plan": dpsgd.lean_plan, "clip_and_accumulate": dpsgd.clip_and_accumulate})
    with pytest.raises(TypeError, match="not implemented"):
        type("Unimplemented", (Defense,), {"capabilities": Capabilities(lean_capable=True)})
    with pytest.raises(ValueError, match="implies stateful"):
        Capabilities(needs_model=True)
    opaque = type("Opaque", (dpsgd,), {"capabilities": dataclasses.replace(dpsgd.capabilities, auditable=False)})
    spec = build_spec({"defense": {"name": "dpsgd"}, "privacy": {"noise_multiplier": 1.0}})
    with pytest.raises(ConfigError, match="capabilities.auditable"):
        prepare_audit(spec, AuditOptions(), defense_cls=opaque)
