"""Group-wise clipping (``groupwise``): groupings, the clipping bound, noise, accounting, an end-to-end run.

The lean engine that runs it (``train.engine=lean``) is tested in tests/engine/test_lean.py."""

import json

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dpeval.cli import main
from dpeval.core.errors import ConfigError
from dpeval.core.models import build_model
from dpeval.core.per_sample import PerSampleGradients
from dpeval.core.streams import Streams
from dpeval.defenses.base import DefenseContext
from dpeval.defenses.clipping import GroupClipping
from dpeval.defenses.dpsgd import DPSGD, ClipParams
from dpeval.defenses.groupwise import Groupwise, GroupwiseParams, resolve_groups
from dpeval.runner import prepare
from dpeval.sweep.grid import expand
from tests.helpers import spec_for

NAMES = ["1.0.weight", "1.2.weight", "1.4.weight", "1.7.weight", "1.7.bias"]  # cnn3's parameters


# -- groupings ------------------------------------------------------------------------------------------
def test_groupings_partition_the_parameters():
    assert resolve_groups("all", NAMES) == [NAMES]
    assert resolve_groups("param", NAMES) == [[n] for n in NAMES]
    assert resolve_groups("layer", NAMES) == [["1.0.weight"], ["1.2.weight"], ["1.4.weight"],
                                              ["1.7.weight", "1.7.bias"]]
    assert resolve_groups("uniform:2", NAMES) == [["1.0.weight", "1.2.weight"],
                                                  ["1.4.weight", "1.7.weight", "1.7.bias"]]
    # 4 layers in 3 groups: sizes 2, 1, 1 (the larger groups first)
    assert resolve_groups("uniform:3", NAMES) == [["1.0.weight", "1.2.weight"], ["1.4.weight"],
                                                  ["1.7.weight", "1.7.bias"]]
    assert resolve_groups(["1.4"], NAMES) == [["1.0.weight", "1.2.weight"], ["1.4.weight", "1.7.weight", "1.7.bias"]]
    assert resolve_groups(["1.0", "1.7"], NAMES) == [NAMES[:3], NAMES[3:]]


@pytest.mark.parametrize("groups,match", [
    ("uniform:0", "M >= 1"), ("uniform:x", "M >= 1"), ("uniform:5", "more groups than the model has layers"),
    ("blocks", "must be one of"), (["1.9"], "unknown layer"), (["1.4", "1.2"], "forward order"),
    (["1.4", "1.4"], "forward order"),
])
def test_bad_groupings_are_refused(groups, match):
    with pytest.raises(ConfigError, match=match):
        GroupwiseParams(groups=groups).validate()
        resolve_groups(groups, NAMES)


# device:N and boundary:X on a transformer's layer names
VIT = build_model("vit", (1, 8, 8), 10, (0.5,), (0.25,))  # 2 blocks
VIT_SIZES = {n: p.numel() for n, p in VIT.named_parameters()}
VIT_NAMES = list(VIT_SIZES)


def test_device_stages_are_contiguous_and_balanced_by_parameter_count():
    sizes = {"a.weight": 10, "b.weight": 10, "c.weight": 70, "d.weight": 5, "d.bias": 5}
    names = list(sizes)
    # P = 100, cumulative counts at the boundaries 10, 20, 90: the cut nearest 50 is after b (|20 − 50| = 30)
    assert resolve_groups("device:2", names, sizes) == [["a.weight", "b.weight"], ["c.weight", "d.weight", "d.bias"]]
    assert resolve_groups("device:1", names, sizes) == [names]
    # 3 stages: targets 33.3 and 66.7; cumulative 10, 20, 90, 100 → cuts at 20 (|13.3|) then 90 (|23.3|)
    assert resolve_groups("device:3", names, sizes) == [["a.weight", "b.weight"], ["c.weight"], ["d.weight", "d.bias"]]
    # 4 stages over 4 layers: one each, whatever the counts
    assert len(resolve_groups("device:4", names, sizes)) == 4
    for n in range(1, 6):  # on the ViT: a partition in forward order, stage sizes near P/N
        groups = resolve_groups(f"device:{n}", VIT_NAMES, VIT_SIZES)
        assert [p for g in groups for p in g] == VIT_NAMES and len(groups) == n
        counts = [sum(VIT_SIZES[p] for p in g) for g in groups]
        largest_layer = max(VIT_SIZES[p] + VIT_SIZES.get(p[:-6] + "bias", 0) for p in VIT_NAMES if p.endswith("weight"))
        assert max(counts) - min(counts) <= 2 * largest_layer, (n, counts)


def test_boundary_splits_after_x_blocks():
    for x in range(3):
        first, second = resolve_groups(f"boundary:{x}", VIT_NAMES)
        assert first + second == VIT_NAMES
        assert {n.split(".")[2] for n in first if ".blocks." in n} == {str(i) for i in range(x)}
        assert {n.split(".")[2] for n in second if ".blocks." in n} == {str(i) for i in range(x, 2)}
        assert "1.patch.weight" in first and "1.pos.weight" in first and "1.head.weight" in second


@pytest.mark.parametrize("groups,names,match", [
    ("boundary:1", NAMES, "transformer blocks"), ("boundary:3", VIT_NAMES, "out of range"),
    ("boundary:-1", VIT_NAMES, "X >= 0"), ("device:0", VIT_NAMES, "N >= 1"), ("device:x", VIT_NAMES, "N >= 1"),
    ("device:99", VIT_NAMES, "more stages than the model has layers"),
])
def test_bad_device_and_boundary_groupings_are_refused(groups, names, match):
    with pytest.raises(ConfigError, match=match):
        GroupwiseParams(groups=groups).validate()
        resolve_groups(groups, names, {n: 1 for n in names})


def test_boundary_on_a_model_without_blocks_fails_before_training(tmp_path):
    result = CliRunner().invoke(main, ["run", "--defense", "groupwise", "--attack", "none", "--set",
                                       "defense.groups=boundary:1", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "transformer blocks" in result.output


@pytest.mark.parametrize("groups", ["device:3", "boundary:1"])
def test_vit_trains_on_the_lean_engine_with_the_block_styles(tmp_path, groups):
    result = CliRunner().invoke(main, ["run", "--model", "vit", "--defense", "groupwise", "--attack", "none",
                                       "--set", f"defense.groups={groups}", "--set", "model.width=16",
                                       "--set", "data.max_train=256", "--epochs", "1",
                                       "--results", str(tmp_path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["train.engine_used"] == "lean"


def test_bad_groupings_fail_before_training_with_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["run", "--defense", "groupwise", "--attack", "none", "--set",
                                       "defense.groups=[nope]", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "defense.groups: unknown layer" in result.output
    result = CliRunner().invoke(main, ["run", "--defense", "groupwise", "--attack", "none", "--set",
                                       "defense.clip_fn=psac", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "defense.clip_fn" in result.output
    # numeric-looking layer names must be quoted: the error names the list item, not "str or list"
    result = CliRunner().invoke(main, ["run", "--defense", "groupwise", "--attack", "none", "--set",
                                       "defense.groups=[1.0, 1.4]", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "defense.groups[0]: must be a string, got 1.0" in result.output


def test_a_sweep_over_groupings_is_an_axis_and_lists_are_head_lists():
    points = expand({"defense": {"name": "groupwise", "groups": ["all", "layer", ["1.0", "1.4"]]}})
    assert [p["defense"]["groups"] for p in points] == ["all", "layer", ["1.0", "1.4"]]


# -- the clipping bound -----------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(scale=st.floats(1e-4, 1e4), clip=st.floats(0.1, 10.0), fn=st.sampled_from(["auto", "abadi"]),
       spec=st.sampled_from(["all", "layer", "param", "uniform:2"]), seed=st.integers(0, 1000))
def test_each_group_stays_within_r_over_root_m_and_the_sample_within_r(scale, clip, fn, spec, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = {"1.0.weight": (4, 3), "1.2.weight": (5,), "1.4.weight": (2, 2), "1.7.weight": (3, 4), "1.7.bias": (3,)}
    grads = {n: torch.randn(1, *s, generator=gen) * scale * torch.rand(1, generator=gen) for n, s in shapes.items()}
    clipping = GroupClipping.of(resolve_groups(spec, list(shapes)), clip, fn)
    clipped = clipping.clip_sum(grads)
    per_group = [torch.cat([clipped[n].reshape(-1) for n in g]).norm() for g in clipping.groups]
    slack = 1 + 1e-6  # float32 rounding of n·R/(n + 1e-6) when n ≫ 1e-6
    assert all(float(n) <= clipping.threshold * slack for n in per_group)
    total = torch.cat([c.reshape(-1) for c in clipped.values()]).norm()
    assert float(total) <= clip * slack
    assert clipping.threshold == pytest.approx(clip / len(clipping.groups) ** 0.5)


def test_auto_clipping_is_r_m_over_norm_plus_gamma():
    clipping = GroupClipping.of([["a"], ["b"]], 2.0, "auto")
    g = {"a": torch.tensor([[3.0, 4.0]]), "b": torch.tensor([[0.0, 0.5]])}
    out = clipping.clip_sum(g)
    r_m = 2.0 / 2 ** 0.5
    torch.testing.assert_close(out["a"], torch.tensor([3.0, 4.0]) * r_m / (5.0 + 0.01))
    torch.testing.assert_close(out["b"], torch.tensor([0.0, 0.5]) * r_m / (0.5 + 0.01))  # small groups grow


def test_all_with_abadi_is_dpsgd_bit_for_bit():
    model = build_model("cnn3", (1, 8, 8), 10, (0.3,), (0.4,))
    shapes = {n: p.shape for n, p in model.named_parameters()}
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    grads = PerSampleGradients(model)(x, y)
    dp = DPSGD(ClipParams(clip=0.7), DefenseContext(shapes, 1.3, Streams(3)))
    gw = Groupwise(GroupwiseParams(clip=0.7, groups="all", clip_fn="abadi"), DefenseContext(shapes, 1.3, Streams(3)))
    for d in (dp, gw):
        d.clip_and_accumulate(grads)
    a, b = dp.release(16), gw.release(16)
    assert a.noise_std == b.noise_std
    for n in a.grads:
        assert torch.equal(a.grads[n], b.grads[n])


@pytest.mark.parametrize("spec", ["all", "layer", "param"])
def test_noise_is_sigma_r_on_every_coordinate_whatever_the_grouping(spec):
    shapes = {"1.0.weight": (200, 50), "1.7.weight": (100, 30), "1.7.bias": (100,)}
    defense = Groupwise(GroupwiseParams(clip=0.8, groups=spec), DefenseContext(shapes, 1.5, Streams(0)))
    defense.clip_and_accumulate({n: torch.zeros(1, *s) for n, s in shapes.items()})
    shared = defense.release(batch_size=4)
    noise = torch.cat([g.reshape(-1) for g in shared.grads.values()]) * 4
    assert shared.noise_std == pytest.approx(1.5 * 0.8 / 4)
    # 13,100 coordinates: the sample std is within 2% of σR with overwhelming probability
    assert float(noise.std()) == pytest.approx(1.5 * 0.8, rel=0.02)


def test_accounting_is_dpsgd_accounting():
    a = prepare(spec_for("groupwise", defense__groups="param", privacy__epsilon=2.0)).privacy
    b = prepare(spec_for("dpsgd", privacy__epsilon=2.0)).privacy
    assert a == b


# -- end to end ---------------------------------------------------------------------------------------------
def test_groupwise_run_and_leaderboard_show_grouping_and_clipping(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["run", "--defense", "groupwise", "--set", "defense.groups=layer", "--attack", "none",
                                  "--epochs", "3", "--results", str(tmp_path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert row["defense.groups"] == "layer" and row["defense.clip_fn"] == "auto"
    assert row["train.engine_used"] == "lean" and row["utility.test_accuracy"] > 0.5
    board = runner.invoke(main, ["leaderboard", "--results", str(tmp_path), "--out", str(tmp_path / "b.csv")])
    assert board.exit_code == 0
    header = (tmp_path / "b.csv").read_text().splitlines()[0].split(",")
    assert "defense.groups" in header and "defense.clip_fn" in header
