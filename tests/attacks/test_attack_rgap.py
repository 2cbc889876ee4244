"""``rgap``: the closed-form recursive attack, and the threat model shared with ``ig``."""

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from dpeval.attacking import write_artefacts
from dpeval.attacks import ATTACKS, image_metrics
from dpeval.attacks import gradient_game as gc
from dpeval.attacks.rgap import RGAPParams, check_model, reconstruct_one
from dpeval.cli import main
from dpeval.config import build_spec
from dpeval.core.errors import ConfigError
from dpeval.core.models import build_model
from dpeval.core.params import from_dict
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.streams import Streams
from dpeval.core.verdicts import Verdict
from dpeval.defenses.base import Capabilities, Defense, DefenseContext, SharedGradient
from tests.helpers import untrained_view


def context(tmp_path, defense="none", epsilon=None, model=None, **attack):
    """An untrained run's (attacker's view, task) (states ``init`` and ``final``); one target unless ``targets``
    is given."""
    attack = {"at": "init", "targets": 1, **attack}
    raw = {"defense": defense, "attacks": ["rgap"], "attack": attack, "device": "cpu"}
    if epsilon is not None:
        raw["privacy"] = {"epsilon": epsilon}
    if model is not None:
        raw["model"] = {"name": model}
    spec = build_spec(raw)
    return untrained_view(spec, tmp_path), spec


def run_rgap(ctx, spec, **override):
    params = dataclasses.replace(spec.attack["rgap"], **override)
    return ATTACKS.get("rgap")(params).play(*ctx)


class MaskingDefense(Defense):
    """Test-local: the mean gradient with a fixed random ``rate`` of coordinates withheld (value ``fill``)."""

    capabilities = Capabilities(accounted=False, auditable=False)
    fill = "zeros"
    rate = 0.5
    withhold_head_bias = False

    def clip_and_accumulate(self, grads):
        for name, g in grads.items():
            self._sum[name] += g.sum(dim=0)
        self.samples_seen += next(iter(grads.values())).shape[0]

    def release(self, batch_size):
        gen, garbage = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(99)
        grads, mask = {}, {}
        for name, s in self._sum.items():
            keep = torch.rand(s.shape, generator=gen) >= self.rate
            if self.withhold_head_bias and name.endswith("bias"):
                keep[:] = False
            other = torch.zeros_like(s) if self.fill == "zeros" else 10 * torch.randn(s.shape, generator=garbage)
            grads[name] = torch.where(keep, s / self.samples_seen, other)
            mask[name] = keep
        self.reset()
        return SharedGradient(grads, batch_size=batch_size, noise_std=0.0, mask=mask)


def with_defense(ctx, **attrs):
    view, task = ctx
    shapes = {n: p.shape for n, p in view.architecture.named_parameters()}
    cls = type("Masking", (MaskingDefense,), attrs)
    oracle = dataclasses.replace(
        view.release, make_defense=lambda streams, bound_to=None: cls(None, DefenseContext(shapes, 0.0, streams)))
    return dataclasses.replace(view, release=oracle), task


# ------------------------------------------------------------------------------------------------------------
# parameters and supported models


@pytest.mark.parametrize("key,value", [("batch_size", 2), ("rgap_tikhonov", -0.1), ("rgap_tikhonov", float("inf")),
                                       ("labels", "soft"), ("at", "last")])
def test_parameters_are_validated_naming_their_key(key, value):
    with pytest.raises(ConfigError, match=f"attack.{key}: "):
        from_dict(RGAPParams, {key: value}, "attack")


def test_batch_of_two_rejected_at_config_time():
    with pytest.raises(ConfigError, match="attack.batch_size: rgap"):
        build_spec({"attacks": ["ig", "rgap"], "attack": {"batch_size": 2}})


@pytest.mark.parametrize("name,layer,kind", [("dpcnn", "'1.4'", "MaxPool2d"), ("dpcnn-small", "'1.2'", "MaxPool2d"),
                                             ("resnet20-gn", "'1'", "ResNetGN")])
def test_unsupported_models_name_the_layer_and_the_models_that_work(name, layer, kind):
    shape = (3, 32, 32) if name != "dpcnn-small" else (1, 28, 28)
    model = build_model(name, shape, 10, (0.5,) * shape[0], (0.2,) * shape[0])
    with pytest.raises(ConfigError) as err:
        check_model(model, shape)
    msg = str(err.value)
    assert msg.startswith("model.name:") and layer in msg and kind in msg
    for works in ("cnn3", "cnn6", "fcn3"):
        assert works in msg


def test_non_invertible_activation_is_named():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 10))
    with pytest.raises(ConfigError, match=r"'2' \(ReLU\).*not invertible"):
        check_model(model, (1, 8, 8))


def test_unsupported_model_fails_the_attack_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="MaxPool2d"):  # raised while preparing the run, before training
        ctx, spec = context(tmp_path, model="dpcnn")
        run_rgap(ctx, spec)
    from click.testing import CliRunner

    from dpeval.cli import main

    results = tmp_path / "results"
    cli = CliRunner().invoke(main, ["run", "--attack", "rgap", "--model", "dpcnn", "--dataset", "synthetic",
                                    "--set", "data.synthetic.shape=[3, 32, 32]", "--results", str(results)])
    assert cli.exit_code == 2 and "MaxPool2d" in cli.stderr and not results.exists()


# ------------------------------------------------------------------------------------------------------------
# bars


def test_no_defense_digits_default_model_is_exact(tmp_path):
    ctx, spec = context(tmp_path)
    result = run_rgap(ctx, spec)
    m = result.metrics
    print(f"rgap none: PSNR {m['psnr']:.2f} dB, MSE {m['mse']:.2e}, max cond {m['max_cond']:.1f}")
    assert m["psnr"] >= 60.0  # the bar is 40 dB; measured 100 dB (the cap, MSE < 1e-10)
    assert m["ssim"] >= 0.999 and m["label_accuracy"] == 1.0
    # rank analysis: cnn3 on 8x8 has full rank at every conv layer (64, 1024, 512 unknowns)
    assert [m[f"layer{k}_unknowns"] for k in (1, 2, 3)] == [64, 1024, 512]
    assert all(m[f"layer{k}_rank"] == m[f"layer{k}_unknowns"] for k in (1, 2, 3))
    assert m["rank_deficit"] == 0 and 1.0 <= m["max_cond"] < 1e4
    written = write_artefacts(result.artefacts, tmp_path)  # the runner writes them so
    scores = json.loads((tmp_path / "rgap-scores.json").read_text())
    (layers,) = scores["states"][0]["layers"]  # one state, one target
    assert [r["layer"] for r in layers] == [1, 2, 3, 4]
    assert layers[1]["gradient_constraints"] == 32 * 16 * 9 and layers[1]["forward_constraints"] == 32 * 4 * 4
    assert written["scores"].name == "rgap-scores.json"
    assert (tmp_path / "rgap-reconstruction.png").is_file()


@pytest.mark.parametrize("model", ["cnn6", "fcn3", "mlp"])
def test_other_supported_models(tmp_path, model):
    ctx, spec = context(tmp_path, model=model)
    m = run_rgap(ctx, spec).metrics
    assert m["psnr"] >= 40.0, m


def test_verdicts_undefended_leaks_and_dpsgd_at_epsilon_one_does_not(tmp_path):
    ctx, spec = context(tmp_path / "none", targets=6)
    plain_result = run_rgap(ctx, spec)
    plain = plain_result.metrics
    ctx, spec = context(tmp_path / "dp", defense="dpsgd", epsilon=1.0, targets=6)
    dp_result = run_rgap(ctx, spec)
    dp = dp_result.metrics
    print(f"rgap none: {plain_result.verdict} ({plain['psnr']:.1f} dB); dpsgd eps=1: {dp_result.verdict} "
          f"(PSNR {dp['psnr']:.2f} dB vs best guess {dp['baseline_psnr']:.2f}: noise {dp['baseline_psnr_noise']:.2f}, "
          f"mean image {dp['baseline_psnr_mean']:.2f}, public mean {dp['baseline_psnr_public']:.2f})")
    assert plain_result.verdict is Verdict.LEAKS and plain["psnr"] >= 60.0
    assert dp_result.verdict is Verdict.NO_LEAK and dp_result.states["init"]["wins"] == 0
    # measured 3.9 dB vs 12.1 (public mean image), 8.5 (constant mean), 6.5 (uniform noise)
    assert dp["psnr"] < dp["baseline_psnr"]


# ------------------------------------------------------------------------------------------------------------
# mask-aware


def test_mask_aware_drops_withheld_constraints(tmp_path):
    ctx, spec = context(tmp_path)
    zeros = run_rgap(with_defense(ctx, fill="zeros"), spec).metrics
    garbage = run_rgap(with_defense(ctx, fill="garbage"), spec).metrics
    naive = run_rgap(with_defense(ctx, fill="garbage"), spec, mask_aware=False).metrics
    print(f"rgap 50% withheld: aware {garbage['psnr']:.1f} dB, naive {naive['psnr']:.1f} dB")
    assert garbage["density"] == pytest.approx(0.5, abs=0.02)
    assert garbage["psnr"] >= 40.0 and zeros["psnr"] >= 40.0
    assert garbage["psnr"] == pytest.approx(zeros["psnr"], abs=0.5)
    assert naive["psnr"] < 20.0


def test_head_without_any_released_bias_uses_the_scale_search(tmp_path):
    ctx, spec = context(tmp_path)
    m = run_rgap(with_defense(ctx, rate=0.3, withhold_head_bias=True), spec).metrics
    assert m["psnr"] >= 40.0, m


def test_tikhonov_is_applied_and_harmless_when_small():
    torch.manual_seed(0)
    model = build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,)).eval()
    x, y = torch.rand(1, 1, 8, 8), torch.tensor([4])
    clean = {k: v[0] for k, v in PerSampleGradients(model)(x, y).items()}
    gen = torch.Generator().manual_seed(3)
    noisy = {k: v + 1e-3 * torch.randn(v.shape, generator=gen) for k, v in clean.items()}
    runs = {"exact": (clean, 0.0), "plain": (noisy, 0.0), "ridge": (noisy, 1e-3), "heavy": (noisy, 1e-1)}
    psnr, reports = {}, {}
    for key, (grads, t) in runs.items():
        rec, reports[key] = reconstruct_one(model, grads, None, 4, (1, 8, 8), tikhonov=t)
        psnr[key] = image_metrics.score(x, rec.float())[0]["psnr"]
    print(psnr)  # measured: exact 100, plain 30.0, ridge 30.05, heavy 14.1
    assert psnr["exact"] >= 60
    assert psnr["plain"] < psnr["exact"] - 20
    assert psnr["ridge"] >= psnr["plain"] - 1.0  # a small ridge costs nothing on this well-posed system
    assert psnr["heavy"] < psnr["plain"] - 5.0   # and the knob is live
    assert all(r["tikhonov_lambda"] > 0 for r in reports["ridge"] if "rank" in r)
    assert all(r["tikhonov_lambda"] == 0 for r in reports["plain"] if "rank" in r)


# ------------------------------------------------------------------------------------------------------------
# the threat model (shared with ig): the defense's own release path at the attacked state


class RecordingDefense(Defense):
    capabilities = Capabilities(accounted=False, auditable=False)
    calls: list = []

    def begin_epoch(self, epoch, epochs):
        self.calls.append(("begin_epoch", epoch, epochs))

    def load_state_dict(self, state):
        self.calls.append(("load_state_dict", state["marker"]))

    def clip_and_accumulate(self, grads):
        self.calls.append(("clip_and_accumulate", next(iter(grads.values())).shape[0]))
        for name, g in grads.items():
            self._sum[name] += g.sum(dim=0)
        self.samples_seen += next(iter(grads.values())).shape[0]

    def release(self, batch_size):
        self.calls.append(("release", batch_size))
        shared = SharedGradient({n: s / self.samples_seen for n, s in self._sum.items()}, batch_size=batch_size,
                                noise_std=0.0, rate=0.25)
        self.reset()
        return shared


@pytest.mark.parametrize("at,epoch,marker", [("init", 0, "i"), ("final", 19, "f"), ("epoch:7", 7, "e7")])
def test_release_goes_through_the_defense_at_the_attacked_state(tmp_path, at, epoch, marker):
    (view, task), spec = context(tmp_path)
    init = view.states["init"]
    shapes = {n: p.shape for n, p in view.architecture.named_parameters()}
    RecordingDefense.calls = []
    given = []

    def make_defense(streams, bound_to=None):
        given.append(streams)
        return RecordingDefense(None, DefenseContext(shapes, 0.0, streams))

    public = {"init": {"marker": "i"}, "final": {"marker": "f"}, "epoch:7": {"marker": "e7"}}
    view = dataclasses.replace(
        view, states={"init": init, "final": init, "epoch:7": init}, defense_states=public,
        release=dataclasses.replace(view.release, defense_states=public, make_defense=make_defense))
    m = run_rgap((view, task), spec, at=at).metrics
    assert RecordingDefense.calls == [("begin_epoch", epoch, spec.train.epochs), ("load_state_dict", marker),
                                      ("clip_and_accumulate", 1), ("release", 1)]
    # one fresh defense, drawing its noise from the attack's own streams (not the victim's)
    assert given == [view.streams.scope("attack", "rgap").scope(at, "release", 0)]
    assert m["state"] == at and m["epoch"] == epoch and m["defense_rate"] == 0.25
    assert m["psnr"] >= 40.0


def test_targets_follow_the_run_seed(tmp_path):
    (view, task), spec = context(tmp_path)

    def targets(seed):
        gen = Streams(seed).scope("attack", "gradient").generator("targets")
        return gc.select_targets(task, 4, gen)[2]

    a = gc.select_targets(task, 4, gc.target_streams(view).generator("targets"))[2]
    assert spec.seed == 0 and torch.equal(a, targets(0))  # the run's targets stream, shared by ig and rgap
    assert torch.equal(targets(0), targets(0))
    assert not torch.equal(a, targets(1))
    assert len(set(a.tolist())) == 4


def test_recovered_single_label_matches_under_masking(tmp_path):
    ctx, spec = context(tmp_path, labels="recovered")
    m = run_rgap(with_defense(ctx, rate=0.5), spec).metrics
    assert m["label_accuracy"] == 1.0


# ------------------------------------------------------------------------------------------------------------
# end to end through the CLI (trained model, final state)


def test_cli_run_reports_leakage_and_show_names_the_png(tmp_path):
    runner = CliRunner()
    args = ["run", "--defense", "none", "--attack", "rgap", "--epochs", "1", "--set", "attack.at=final",
            "--set", "attack.targets=1", "--results", str(tmp_path), "--json", "--quiet"]
    result = runner.invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    for key in ("mse", "psnr", "ssim", "label_accuracy"):
        assert f"leakage.rgap.{key}" in row
    assert row["leakage.rgap.state"] == "final"
    assert row["leakage.rgap.psnr"] >= 40.0
    png = row["artefacts.rgap.png"]
    assert png == f"runs/{row['run_id']}/rgap/rgap-reconstruction.png"  # relative to the results folder
    assert (tmp_path / png).is_file()
    shown = runner.invoke(main, ["show", row["run_id"], "--results", str(tmp_path)], catch_exceptions=False)
    assert shown.exit_code == 0 and png in shown.output
