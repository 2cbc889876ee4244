"""The ScatterNet+CNN models (hcnn, hcnn-small): architecture, the fixed scattering front, per-sample gradients
of the trainable part from both engines against a materialised reference, every defense, shadow training,
the gradient attacks, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from dpeval.attacks.ig import GradientMatcher
from dpeval.attacks.rgap import RGAP
from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.models import Normalize, build_model
from dpeval.core.per_sample import PerSampleGradients, fixed_front, front_features
from dpeval.core.runtime import single_cpu_thread
from dpeval.core.scatternet import Scattering, coefficients_per_channel
from dpeval.core.verdicts import Verdict
from dpeval.defenses import DEFENSES
from dpeval.defenses.clipping import GroupClipping
from dpeval.defenses.groupwise import resolve_groups
from dpeval.engine.lean import LeanEngine
from dpeval.engine.shadow_training import train_shadows, train_shadows_sequential
from dpeval.runner import perform, prepare
from tests.helpers import num_params


def hcnn(shape: tuple[int, int, int] = (3, 32, 32), name: str = "hcnn") -> nn.Sequential:
    torch.manual_seed(0)
    return build_model(name, shape, 10, (0.5,) * shape[0], (0.25,) * shape[0]).eval()


def reference_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Materialised per-sample gradients: one backward pass of the whole model per example."""
    rows = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append({n: p.grad.clone() for n, p in model.named_parameters()})
    model.zero_grad()
    return {n: torch.stack([r[n] for r in rows]) for n in rows[0]}


# -- architecture -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,shape,features,params", [
    ("hcnn", (3, 32, 32), (243, 8, 8), 187_210),
    ("hcnn-small", (1, 28, 28), (81, 7, 7), 33_066),
])
def test_paper_architecture(name, shape, features, params):
    model = hcnn(shape, name)
    assert num_params(model) == params
    scattering, norm = model[1][0], model[1][1]
    assert isinstance(scattering, Scattering) and scattering.out_shape == features
    assert scattering(torch.rand(2, *shape)).shape == (2, *features)
    assert isinstance(norm, nn.GroupNorm) and norm.num_groups == 27 and not norm.affine
    assert coefficients_per_channel() == 81
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert first.in_channels == features[0]


def test_the_front_is_fixed_and_outside_the_state():
    model = hcnn()
    split = fixed_front(model)
    assert [type(m) for m in split.front] == [Normalize, Scattering, nn.GroupNorm]
    assert not any(p.requires_grad for p in split.front.parameters())
    assert isinstance(split.head[0], nn.Conv2d) and split.head[0].in_channels == 243
    # the head shares the model's parameters; its names map back to the model's
    params = dict(model.named_parameters())
    assert all(params[split.names[n]] is p for n, p in split.head.named_parameters())
    x = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(split.head(split.front(x)), model(x))
    # the wavelet filters are non-persistent buffers: rebuilt, never saved, trained or clipped
    assert any(True for _ in model[1][0].buffers())
    assert set(model.state_dict()) == {"0.mean", "0.std"} | {n for n, _ in model.named_parameters()}
    assert torch.equal(hcnn()[1][0](x), model[1][0](x))  # a fresh build computes the same transform


def test_models_without_a_fixed_front_keep_their_head():
    model = build_model("cnn3", (1, 8, 8), 10, (0.5,), (0.25,))
    split = fixed_front(model)
    assert [type(m) for m in split.front] == [Normalize]
    assert fixed_front(nn.Linear(3, 2)).head is not None and len(fixed_front(nn.Linear(3, 2)).front) == 0


def test_too_small_images_are_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.name: 'hcnn' .* >= 8"):
        build_model("hcnn", (3, 7, 32), 10, (0.5,) * 3, (0.25,) * 3)


# -- per-sample gradients of the trainable part -----------------------------------------------------------
def test_func_engine_matches_the_materialised_reference():
    model = hcnn()
    x, y = torch.rand(4, 3, 32, 32), torch.tensor([0, 3, 3, 9])
    got, ref = PerSampleGradients(model)(x, y), reference_grads(model, x, y)
    assert list(got) == [n for n, _ in model.named_parameters()]
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-4, atol=1e-6, msg=n)
    assert not torch.allclose(got["1.8.weight"][1], got["1.8.weight"][2])  # same label, other image


@pytest.mark.parametrize("groups", ["all", "layer", "param"])
def test_lean_engine_matches_the_materialised_reference(groups):
    model = hcnn((3, 16, 16))
    x, y = torch.rand(5, 3, 16, 16), torch.randint(0, 10, (5,))
    names = [n for n, _ in model.named_parameters()]
    clipping = GroupClipping.of(resolve_groups(groups, names), 0.05, "abadi")  # small C: every sample clipped
    ref = clipping.clip_sum(reference_grads(model, x, y))
    got = LeanEngine(model)(x, y, clipping.plan()).sums
    for n in names:
        scale = ref[n].abs().max()
        assert float((got[n] - ref[n]).abs().max() / scale) < 1e-4, (groups, n)


def test_lean_engine_runs_the_front_without_autograd():
    model = hcnn((3, 16, 16))
    seen = []
    model[1][0].register_forward_hook(lambda m, inputs, out: seen.append((torch.is_grad_enabled(), out.requires_grad)))
    x, y = torch.rand(3, 3, 16, 16), torch.randint(0, 10, (3,))
    names = [n for n, _ in model.named_parameters()]
    LeanEngine(model)(x, y, GroupClipping.of([names], 1.0, "abadi").plan())
    assert seen == [(False, False)] and not x.requires_grad


# -- defenses, shadow models, attacks, CLI ----------------------------------------------------------------
def tiny_spec(defense: str, **extra) -> object:
    raw = {"data": {"name": "synthetic", "synthetic": {"shape": [3, 8, 8], "size": 60}, "public_fraction": 0.2},
           "model": {"name": "hcnn"}, "defense": {"name": defense}, "privacy": {"noise_multiplier": 1.0},
           "train": {"epochs": 1, "batch_size": 12, "optimizer": "sgd", "lr": 0.5}}
    if defense == "gep":
        raw["defense"].update(num_bases=4, num_anchors=8)
    for key, value in extra.items():
        raw[key].update(value)
    return build_spec(raw)


@pytest.mark.parametrize("defense", DEFENSES.names())
def test_every_defense_trains_hcnn(defense, tmp_path):
    prep = prepare(tiny_spec(defense))
    before = {n: p.detach().clone() for n, p in prep.model.named_parameters()}
    metrics = perform(prep, "t", tmp_path, progress=False).flat()
    assert metrics["status"] == "done" and metrics["privacy.steps"] == 3
    assert metrics["train.engine_used"] == "lean"  # every defense, the fixed front outside the engine
    assert all(torch.isfinite(p).all() for p in prep.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in prep.model.named_parameters())


def test_vectorised_shadow_models_equal_sequential_on_hcnn():
    spec = tiny_spec("dpsgd", train={"engine": "func"})
    prep = prepare(spec)
    x, y = prep.task.train.x, prep.task.train.y
    gen = torch.Generator().manual_seed(0)
    pools = [torch.sort(torch.randperm(len(y), generator=gen)[:len(y) // 2]).values for _ in range(2)]
    scopes = [prep.streams.scope("shadow", i) for i in range(2)]
    vec = train_shadows(prep.build_model, x, y, pools, lambda i, m, s: prep.make_defense(scopes[i], m, s), spec.train,
                        scopes, torch.device("cpu"), progress=False)
    seq = train_shadows_sequential(prep.build_model, x, y, pools, lambda i, m, s: prep.make_defense(scopes[i], m, s),
                                   spec.train, scopes, torch.device("cpu"), progress=False)
    assert set(vec[0]) == set(prep.model.state_dict())  # loadable: no scattering filters, Normalize's stats
    for a, b in zip(vec, seq):
        for n in a:
            torch.testing.assert_close(a[n], b[n], rtol=1e-4, atol=1e-5)
    assert not torch.equal(vec[0]["1.8.weight"], vec[1]["1.8.weight"])


def test_rgap_refuses_the_scattering_front_in_one_line():
    with pytest.raises(ConfigError) as err:
        RGAP.check_model(RGAP.Params(), hcnn((3, 16, 16)), (3, 16, 16))
    message = str(err.value)
    assert message.startswith("model.name: rgap") and "scattering" in message and "\n" not in message


def test_ig_optimises_pixels_through_the_scattering():
    model = hcnn((1, 8, 8))
    x, y = torch.rand(1, 1, 8, 8), torch.tensor([4])
    target = {n: g[0] for n, g in PerSampleGradients(model)(x, y).items()}
    matcher = GradientMatcher(model, [target], [None], y[None], "cosine")  # one problem of one image
    z = torch.rand(1, 1, 1, 8, 8, requires_grad=True)
    opt = torch.optim.Adam([z], lr=0.05)
    with single_cpu_thread("cpu"):  # as the attack runs
        start = float(matcher(z)[0].detach())
        for _ in range(15):
            (z.grad,) = torch.autograd.grad(matcher(z).sum(), [z])
            opt.step()
        end = float(matcher(z)[0].detach())
    assert end < start - 0.05  # the matching loss falls: gradients reach the pixels through the scattering


@pytest.mark.parametrize("defense,engine", [("dpsgd", "lean"), ("rs", "lean")])
def test_cli_trains_hcnn_on_cifar_shaped_data(defense, engine, tmp_path):
    out = CliRunner().invoke(main, [
        "run", "--defense", defense, "--attack", "none", "--dataset", "synthetic", "--model", "hcnn",
        "--epochs", "1", "--set", "data.synthetic.shape=[3,32,32]", "--set", "data.synthetic.size=40",
        "--set", "train.batch_size=14", "--results", str(tmp_path), "--json", "--quiet"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    metrics = json.loads(out.stdout)
    assert metrics["model"] == "hcnn" and metrics["train.engine_used"] == engine
    assert metrics["privacy.steps"] == 2 and 0 <= metrics["utility.test_accuracy"] <= 1


def test_lean_on_hcnn_releases_what_func_releases():
    """A masking defense on the lean engine, through the fixed front, releases the materialised path's sum."""
    spec = tiny_spec("rs")
    spec.defense.final_rate, spec.defense.schedule = 0.6, "constant"
    prep = prepare(spec)
    x, y = prep.task.train.x[:6], prep.task.train.y[:6]
    out = []
    for lean in (False, True):
        defense = prep.make_defense(prep.streams.scope("victim"))
        defense.noise_multiplier = 0.0
        defense.begin_epoch(0, 1)
        if lean:
            defense.accumulate_lean(LeanEngine(prep.model)(x, y, defense.lean_plan()))
        else:
            defense.clip_and_accumulate(PerSampleGradients(prep.model)(x, y))
        out.append(torch.cat([g.reshape(-1) for g in defense.release(12).grads.values()]))
    assert float((out[0] - out[1]).abs().max() / out[0].abs().max()) < 1e-4


def test_cli_ig_attacks_hcnn_through_the_scattering(tmp_path):
    """The trajectory IG (several target problems at once) runs on a model whose front torch.func cannot
    trace: the matcher falls back to autograd, one problem at a time."""
    out = CliRunner().invoke(main, [
        "run", "--defense", "dpsgd", "--attack", "ig", "--dataset", "synthetic", "--model", "hcnn-small",
        "--epochs", "1", "--set", "data.synthetic.shape=[1,28,28]", "--set", "data.synthetic.size=40",
        "--set", "train.batch_size=14", "--set", "attack.ig.ig_iterations=3", "--set", "attack.ig.targets=2",
        "--results", str(tmp_path), "--json", "--quiet"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    metrics = json.loads(out.stdout)
    assert Verdict.parse(metrics["leakage.ig.verdict"]) in Verdict
    assert 0 < metrics["leakage.ig.psnr"] < 60 and metrics["leakage.ig.state"]


@pytest.mark.parametrize("name,shape", [("hcnn-small", (1, 28, 28)), ("dpcnn-small", (1, 28, 28)), ("cnn3", (1, 8, 8))])
def test_front_features_computed_once_equal_recomputation(name, shape):
    """Training, shadow models and attacks compute the fixed front once per data set (``front_features``);
    the head on those features must give what the whole model gives on the raw images, chunk size aside."""
    torch.manual_seed(0)
    model = build_model(name, shape, 10, (0.3,) * shape[0], (0.3,) * shape[0])
    x = torch.rand(37, *shape)
    cut = fixed_front(model)
    once = front_features(cut.front, x, chunk=16)
    per_micro_batch = torch.cat([cut.front(x[i:i + 5]) for i in range(0, len(x), 5)])
    torch.testing.assert_close(once, per_micro_batch, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(cut.head(once), model(x), rtol=1e-5, atol=1e-6)
    assert front_features(cut.front, x[:0]).shape == (0, *once.shape[1:])
